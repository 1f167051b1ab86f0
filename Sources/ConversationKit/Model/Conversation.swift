import Foundation
import ImageKit
import RecordZone

/// A conversation: the one between the local speaker and another speaker, or a group.
public struct Conversation: Sendable, Hashable, Identifiable {
    /// The conversation's zone name: derived from the pair of speakers (so both sides name the
    /// same conversation even when both start it offline), or a group's (`g-…`).
    public let id: String
    /// The other speaker's identifier; empty for a group.
    public let nonLocalSpeaker: String
    /// Who started it: the participant whose join came first (by clock, then identifier).
    public let startedBy: String?
    /// The other participant, once they have joined (sent or answered).
    public let joinedBy: String?
    public let unreadCount: Int
    public let lastMessageAt: Date?
    /// A group's name (nil for a pair).
    public var groupName: String? = nil
    /// A group's description (nil: none, or a pair).
    public var groupDescription: String? = nil
    /// A group's avatar's size, when it has one (``ConversationStore/avatarImage(ofGroup:)``).
    public var groupAvatarSize: PixelSize? = nil

    /// Whether this is a group (``ConversationStore/createGroup(name:members:)``).
    public var isGroup: Bool { groupName != nil }
}

/// Someone in a group, with their role.
public struct GroupMember: Sendable, Hashable {
    public let speaker: String
    public let role: GroupMembership.Role
}

/// A page of a conversation's messages, oldest first.
public struct MessagePage: Sendable {
    public let messages: [Message]
    /// Pass it as `before:` for the page of older messages; nil when there are none.
    public let olderCursor: MessageCursor?
}

/// A position in a conversation's history: just before this message.
public struct MessageCursor: Sendable, Hashable, Codable {
    public let spokenAt: Int64
    public let name: String
    public init(spokenAt: Int64, name: String) {
        self.spokenAt = spokenAt
        self.name = name
    }
}

/// A change to a group's membership that took effect, for a conversation's timeline: "alice
/// added carol", "bob left" (``ConversationStore/groupEvents(in:)``).
public struct GroupEvent: Sendable, Hashable {
    public let actor: String
    public let action: GroupChange.Action
    /// Who it was about (add: everyone it added; remove, promote, demote: one; else none).
    public let targets: [String]
    /// The group's name, for create and rename.
    public let groupName: String?
    public let at: Date
    /// Where it falls among the messages (their version clocks).
    public let clock: RecordClock

    /// In words, e.g. "alice added carol, dave" (``GroupChange/summary``).
    public var summary: String {
        GroupChange.summary(actor: actor, action: action, targets: targets, groupName: groupName)
    }
}
