import Foundation
import RecordZone
import SQLiteKit

/// A person who speaks in conversations: a snapshot of their profile.
public struct Speaker: Sendable, Hashable, Identifiable {
    /// The box avatars are scaled down to fit, aspect kept (ConversationKit's `maxImageSize`);
    /// a store can choose another (``StoreConfiguration/maxImageSize``).
    public static let maxImageSize = PixelSize(width: 100, height: 100)

    /// The unique identifier, e.g. `alice@example.org`. 1–128 bytes, no control characters.
    public let identifier: String
    public var name: String
    public var tags: [String]
    /// Whether this is the store's own speaker.
    public let isLocalSpeaker: Bool
    /// The identity key the store holds for this speaker, if one is pinned.
    public var publicKey: Data?
    /// How far the store trusts that key.
    public var trust: SpeakerTrust
    /// The pixel size of the speaker's avatar, when the profile has one (the image itself:
    /// ``ConversationStore/avatarImage(for:)``).
    public var avatarSize: PixelSize?
    /// Why the speaker's avatar cannot be shown (its asset is missing or damaged), until the
    /// speaker sets another one.
    public var avatarProblem: String?

    public var id: String { identifier }

    /// The identity key's safety number (12 groups of 5 digits), to compare out of band.
    public var fingerprint: String? { publicKey.map { KeyChain.fingerprint(identity: identifier, key: $0) } }

    /// A stable reference to this speaker, carrying its identity key, to keep in your own data
    /// or hand to someone else (a contact card, a QR code): a conversation started from it pins
    /// that key (``ConversationStore/conversation(with:)-(SpeakerRef)``).
    public var speakerRef: SpeakerRef { SpeakerRef(identifier: identifier, publicKey: publicKey) }

    public init(identifier: String, name: String, tags: [String], isLocalSpeaker: Bool, publicKey: Data? = nil, trust: SpeakerTrust = .unknown) {
        self.identifier = identifier
        self.name = name
        self.tags = tags
        self.isLocalSpeaker = isLocalSpeaker
        self.publicKey = publicKey
        self.trust = trust
    }
}

/// A size in pixels.
public struct PixelSize: Sendable, Hashable, Codable, CustomStringConvertible {
    public var width: Int
    public var height: Int
    public init(width: Int, height: Int) {
        self.width = width
        self.height = height
    }
    public var description: String { "\(width)×\(height)" }

    /// The largest side an avatar read from someone else's profile may claim.
    static let largestAvatarSide = 4096
}

/// How a store came to hold a speaker's key.
public enum SpeakerTrust: String, Sendable, Hashable, Codable {
    /// Pinned from a ``SpeakerRef`` carrying the key, by ``ConversationStore/trust(_:fingerprint:)``,
    /// or the local speaker's own.
    case verified
    /// Pinned on first use: the first key seen for the identity.
    case firstUse
    /// Claimed with unrelated keys and nothing pinned: its records are held back until a ref or
    /// ``ConversationStore/trust(_:fingerprint:)`` settles which key is the speaker's.
    case conflicted
    /// No key seen yet.
    case unknown
}

/// A reference to a speaker that outlives snapshots (ConversationKit's `speakerRef`). With a
/// `publicKey`, it also says which identity key is the speaker's.
public struct SpeakerRef: Sendable, Hashable, Codable {
    public let identifier: String
    public let publicKey: Data?
    public init(identifier: String, publicKey: Data? = nil) {
        self.identifier = identifier
        self.publicKey = publicKey
    }
}

/// Finds speakers by tag, in the `speakers` directory zone and in the local cache
/// (``ConversationStore/speakers(matching:)``).
public struct SpeakerQuery: Sendable, Hashable {
    public var tag: String
    public init(tag: String) { self.tag = tag }
}
