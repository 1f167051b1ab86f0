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
    /// When the newest message shown (not deleted) was said; nil without one.
    public let lastMessageAt: Date?
    /// A group's name (nil for a pair).
    public var groupName: String? = nil
    /// A group's description (nil: none, or a pair).
    public var groupDescription: String? = nil
    /// A group's avatar's size, when it has one (``ConversationStore/avatarImage(ofGroup:)``).
    public var groupAvatarSize: PixelSize? = nil
    /// This device's own settings (``ConversationStore/archive(_:_:)`` and the rest): kept here,
    /// never synced.
    public var isArchived = false
    /// Muted until then (``Date/distantFuture``: until unmuted); nil when not muted.
    public var mutedUntil: Date? = nil
    /// Pinned then: pinned conversations come first, in the order they were pinned.
    public var pinnedAt: Date? = nil
    /// Marked unread by its person ("mark as unread"): cleared when its messages are marked read.
    public var isMarkedUnread = false
    /// What was typed and not sent: cleared by a send.
    public var draft: String? = nil
    /// Whether the local speaker blocks the other speaker of this pair (``ConversationStore/block(_:)``).
    public var isBlocked = false

    /// Whether it is muted at `date`.
    public func isMuted(at date: Date = Date()) -> Bool { mutedUntil.map { $0 > date } ?? false }

    /// The order of ``ConversationStore/conversations(includeArchived:)``: pinned first (as
    /// pinned), then by last activity, newest first, then by ID.
    public static func listOrder(_ a: Conversation, _ b: Conversation) -> Bool {
        switch (a.pinnedAt, b.pinnedAt) {
        case (let x?, let y?) where x != y: return x < y
        case (.some, nil): return true
        case (nil, .some): return false
        default: break
        }
        let (x, y) = (a.lastMessageAt ?? Date(timeIntervalSince1970: 0), b.lastMessageAt ?? Date(timeIntervalSince1970: 0))
        return x != y ? x > y : a.id < b.id
    }

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
