import Foundation
import RecordZone
import SQLiteKit

/// A person who speaks in conversations: a snapshot of their profile.
public struct Speaker: Sendable, Hashable, Identifiable {
    /// The largest avatar edge, in pixels (avatars are scaled down to fit, aspect kept).
    public static let maxImageSize = 100

    /// The unique identifier, e.g. `alice@example.org`. 1–128 bytes, no control characters.
    public let identifier: String
    public var name: String
    public var tags: [String]
    /// Whether this is the store's own speaker.
    public let isLocalSpeaker: Bool

    public var id: String { identifier }

    /// A stable reference to this speaker, to keep in your own data (``ConversationStore/speaker(fromRef:)``).
    public var speakerRef: SpeakerRef { SpeakerRef(identifier: identifier) }

    public init(identifier: String, name: String, tags: [String], isLocalSpeaker: Bool) {
        self.identifier = identifier
        self.name = name
        self.tags = tags
        self.isLocalSpeaker = isLocalSpeaker
    }
}

/// A reference to a speaker that outlives snapshots (ConversationKit's `speakerRef`).
public struct SpeakerRef: Sendable, Hashable, Codable {
    public let identifier: String
    public init(identifier: String) { self.identifier = identifier }
}

/// Finds speakers by tag, in the `speakers` directory zone and in the local cache
/// (``ConversationStore/speakers(matching:)``).
public struct SpeakerQuery: Sendable, Hashable {
    public var tag: String
    public init(tag: String) { self.tag = tag }
}
