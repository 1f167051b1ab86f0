import Foundation
import RecordZone
import SQLiteKit

/// A message's identity: its conversation and its name, chosen by the sender: its version
/// clock in hex, then random bits, so one sender's messages sort in the order sent.
public struct MessageID: Sendable, Hashable, Codable, CustomStringConvertible {
    public let conversation: String
    public let name: String
    public init(conversation: String, name: String) {
        self.conversation = conversation
        self.name = name
    }
    public var description: String { "\(conversation)/\(name)" }

    /// A short reference for people to type, as git's short hashes are: the first
    /// ``referenceLength`` hex digits of the random part that ends a message's name
    /// (`m.<speaker>.<clock>-<random>`); ``ConversationStore/messages(referencedBy:)`` finds the
    /// message again by it or any longer prefix. The whole description for a name not of that form.
    public var reference: String {
        guard let dash = name.lastIndex(of: "-"), name.hasPrefix("m.") else { return description }
        let random = name[name.index(after: dash)...]
        guard random.count > Self.referenceLength else { return description }
        return String(random.prefix(Self.referenceLength))
    }

    /// Hex digits in a ``reference``: 40 bits, so two messages of a store of a million share one
    /// with a probability of about 0.4 — then a longer prefix, or the full ID, tells them apart.
    public static let referenceLength = 10
    /// The fewest hex digits a reference may be given with.
    public static let shortestReference = 6
}

/// One message, as a value snapshot.
public struct Message: Sendable, Hashable, Identifiable {
    public static let maximumContentBytes = ChatRecords.maximumContentBytes
    /// How many times a message may be edited: each version carries the texts before it
    /// (``ConversationStore/editHistory(of:)``), so a message stays within a record's size
    /// (as Signal bounds edits).
    public static let maximumEdits = 10

    public let id: MessageID
    public let content: String
    /// The speaker who said it.
    public let speaker: String
    /// The speaker it was said to.
    public let listener: String
    public let spokenAt: Date
    public let editedAt: Date?
    /// When the listener read it (from their signed receipt).
    public let readAt: Date?
    public let syncState: SyncState
    /// Sealed with a key this device does not hold yet (its share has not been synced): the
    /// content is empty until it arrives, and the message then changes by itself
    /// (``StoreEvent/messageChanged(_:)``). Never a permanent state for a device that may
    /// read the message (docs/ENCRYPTION.md).
    public let isWaitingForKey: Bool
    /// The message this one answers (``ConversationStore/parent(of:)`` says whether it is still
    /// there), or nil.
    public let replyTo: MessageID?
    /// The speakers it mentions, each at a span of ``content``, in order.
    public let mentions: [Mention]
    /// An app's own kind of message (a poll, a location): its type and data, with ``content``
    /// as the text shown where the type is not understood.
    public let custom: CustomPayload?
    /// Deleted by its speaker: a placeholder ("a deleted message") in its place, with no
    /// content, only from ``ConversationStore/messages(in:limit:before:includeDeleted:)``
    /// asked with `includeDeleted`.
    public let isDeleted: Bool
    /// One of the local speaker's messages in a pair that the listener's store holds (one of
    /// their devices said so, or they read it) — beyond ``SyncState/synced``, which only says
    /// the backend has it. False for a message someone else said, and in a group (see
    /// ``ConversationStore/deliveredTo(_:)``).
    public internal(set) var isDelivered: Bool
    /// The file it carries (``ConversationStore/downloadFile(of:progress:)``), if any.
    public let attachment: Attachment?
    /// Said by the local speaker (its row's `is_own`).
    let isOwn: Bool

    /// The only messages a delivered tick is shown on: the local speaker's, in a pair.
    var takesTicks: Bool { isOwn && !listener.isEmpty }
}

/// A file a message carries (``ConversationStore/sendFile(_:to:caption:mediaType:replyingTo:)``):
/// what a view shows before it is downloaded. Its bytes travel encrypted, in chunks
/// (docs/PROTOCOL.md §3.4).
public struct Attachment: Sendable, Hashable {
    /// The largest file: 1 GiB.
    public static let maximumSize = AttachmentManifest.maximumSize
    /// The file's name as its sender had it: shown through the sanitizer like any text, and a
    /// single path component (no `/`, no control characters).
    public let name: String
    /// As its sender said or guessed (`image/jpeg`, `application/octet-stream`).
    public let mediaType: String
    /// In bytes.
    public let size: Int64

    public init(name: String, mediaType: String, size: Int64) {
        self.name = name
        self.mediaType = mediaType
        self.size = size
    }
}

/// An image file's thumbnail, carried in its message (``ConversationStore/thumbnail(of:)``).
public struct AttachmentThumbnail: Sendable, Hashable {
    /// A JPEG of at most 320 pixels a side.
    public let jpeg: Data
    /// The image's own size, when its sender said.
    public let imageSize: PixelSize?
}

/// An app's own message data (Amity's custom messages, Matrix's custom event types), sealed
/// with the message: a type naming its format, and the data.
public struct CustomPayload: Sendable, Hashable {
    public static let maximumDataBytes = 64 * 1024
    public static let maximumTypeBytes = 128

    /// Reverse-DNS style (`com.example.poll`): 1–128 characters of `a–z 0–9 . - _`, starting
    /// with a letter.
    public let type: String
    public let data: Data

    public init(type: String, data: Data) {
        self.type = type
        self.data = data
    }

    /// Whether it follows the rules above (a reader ignores a payload that does not).
    public var isValid: Bool {
        let bytes = Array(type.utf8)
        guard let first = bytes.first, bytes.count <= Self.maximumTypeBytes, (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(first) else { return false }
        return data.count <= Self.maximumDataBytes && bytes.allSatisfy {
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_")
        }
    }
}

/// One version of a message's text (``ConversationStore/editHistory(of:)``).
public struct MessageVersion: Sendable, Hashable {
    public let content: String
    /// When it was said (the first version) or edited to this.
    public let at: Date
}

/// A speaker mentioned at a span of a message's content ("@carol", or however the app shows
/// her): the span in UTF-8 bytes, as the record carries it (docs/PROTOCOL.md §3).
public struct Mention: Sendable, Hashable {
    public let speaker: String
    /// UTF-8 byte offsets into the content.
    public let utf8Range: Range<Int>

    public init(speaker: String, utf8Range: Range<Int>) {
        self.speaker = speaker
        self.utf8Range = utf8Range
    }

    /// A mention of `speaker` at `range` of `content`.
    public init(speaker: String, range: Range<String.Index>, in content: String) {
        let utf8 = content.utf8
        self.init(speaker: speaker, utf8Range: utf8.distance(from: utf8.startIndex, to: range.lowerBound)..<utf8.distance(from: utf8.startIndex, to: range.upperBound))
    }

    /// Every "@speaker" written in `content`, for each of `speakers` (a mention that is not
    /// written out is none).
    public static func written(_ speakers: [String], in content: String) -> [Mention] {
        speakers.flatMap { speaker in
            var found: [Mention] = [], from = content.startIndex
            while let range = content.range(of: "@" + speaker, range: from..<content.endIndex) {
                // Not the start of a longer identifier (@carol in @caroline).
                let next = range.upperBound < content.endIndex ? content[range.upperBound] : " "
                if !(next.isLetter || next.isNumber || "._-".contains(next)) { found.append(Mention(speaker: speaker, range: range, in: content)) }
                from = range.upperBound
            }
            return found
        }.sorted { $0.utf8Range.lowerBound < $1.utf8Range.lowerBound }
    }

    /// The record's form: `"<start>:<length>:<identifier>"`.
    var field: String { "\(utf8Range.lowerBound):\(utf8Range.count):\(speaker)" }

    /// From the record's form, when it is a span of `content` on Unicode scalar boundaries naming a
    /// valid identifier; nil otherwise (a reader ignores it).
    init?(field: String, content: String) {
        let parts = field.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, let start = Int(parts[0]), let length = Int(parts[1]), start >= 0, length > 0,
              start + length <= content.utf8.count, ChatRecords.isValidIdentifier(String(parts[2])) else { return nil }
        let utf8 = content.utf8
        let lower = utf8.index(utf8.startIndex, offsetBy: start), upper = utf8.index(lower, offsetBy: length)
        guard lower.samePosition(in: content.unicodeScalars) != nil, upper.samePosition(in: content.unicodeScalars) != nil else { return nil }
        self.init(speaker: String(parts[2]), utf8Range: start..<(start + length))
    }
}

/// What a reply answers (``ConversationStore/parent(of:)``).
public enum ReplyParent: Sendable, Hashable {
    case message(Message)
    /// Deleted by its speaker: shown as a placeholder ("a deleted message").
    case deleted(MessageID)
    /// Not in this store (not synced yet, or never readable here).
    case notHeld(MessageID)
}

/// Where a local change stands with the backend.
public enum SyncState: Sendable, Hashable {
    /// Committed locally, waiting in the outbox.
    case pending
    /// The backend has it.
    case synced
    /// It will not reach anyone as it is; the failure says why, as a code.
    case failed(SyncFailure)
}

/// Why a local change failed for good: a code to decide on, a message to show.
public struct SyncFailure: Sendable, Hashable, CustomStringConvertible {
    public enum Code: String, Sendable, Hashable {
        /// This device was revoked by the speaker's first device: nobody accepts what it signs
        /// (over a server, nothing at all; over a folder, what it signed after the revocation).
        case deviceRevoked
        /// The backend refused the version for good; ``SyncFailure/backendCode`` says why.
        case refused
        /// A group message signed when the local speaker was no longer in the group (removed, or
        /// left, before its clock): every reader holds it back, so nobody sees it.
        case notInGroup
        /// The message's file is gone from this device before all of it was uploaded (its cache
        /// was emptied by hand): nobody could download it, so the message is never sent.
        case fileMissing
        /// The conversation's other participant blocked the local speaker (``ConversationStore/block(_:)``):
        /// nothing more of theirs goes into the conversation until they unblock.
        case blocked
    }

    public let code: Code
    /// With ``Code/refused``: the backend's reason (`invalidSignature`, `notAuthorized`,
    /// `limitExceeded`, …), when it gave one.
    public let backendCode: RecordZoneError.Code?
    /// For people: the backend's words, or the store's.
    public let message: String

    public init(_ code: Code, backendCode: RecordZoneError.Code? = nil, message: String) {
        self.code = code
        self.backendCode = backendCode
        self.message = message
    }

    /// A refusal by the backend.
    init(refusal error: RecordZoneError) {
        self.init(.refused, backendCode: error.code, message: error.description)
    }

    /// As stored in `messages.sync_error_code`: the code, or the backend's code for a refusal.
    var storedCode: String { backendCode?.rawValue ?? code.rawValue }

    /// From `messages.sync_error_code` and `sync_error` (rows from before the code: `refused`).
    init(storedCode: String?, message: String?) {
        let message = message ?? "refused"
        if let code = storedCode.flatMap(Code.init(rawValue:)), code != .refused {
            self.init(code, message: message)
        } else {
            self.init(.refused, backendCode: storedCode.flatMap(RecordZoneError.Code.init(rawValue:)), message: message)
        }
    }

    public var description: String { message }
}

/// Something that changed in the store, for live views.
public enum StoreEvent: Sendable, Hashable {
    case messageAdded(MessageID)
    case messageChanged(MessageID)
    case speakerUpdated(String)
    /// A speaker joined ``ConversationStore/allKnownSpeakers()`` through a ``SpeakerQuery``.
    case speakerFound(String)
    case conversationChanged(String)
    case syncStateChanged(MessageID)
    /// What the continuous sync (``ConversationStore/run(pollInterval:longPolls:)``) is doing.
    case syncActivity(SyncActivity)
    /// This subscriber fell behind: more events came than its stream holds (10,000), and the
    /// oldest of them were dropped. Whatever it
    /// keeps from the store may be stale: read it again (a live collection reads its window
    /// again by itself). Comes after the last event dropped.
    case reset
}

/// The continuous sync's activity (ConversationKit's network activity and `cloudAvailable`).
public enum SyncActivity: Sendable, Hashable {
    /// A round finished: what it pushed and pulled.
    case synced(SyncReport)
    /// The backend could not be reached (with why); the sync backs off and tries again.
    case unreachable(String)
    /// The backend answers but does not accept this device's requests:
    /// ``ConversationError/Code/deviceRevoked``, or ``ConversationError/Code/notAuthenticated``
    /// (a clock too far off, a key it does not hold), with why. The sync backs off and tries
    /// again (a clock set right is accepted).
    case notAccepted(ConversationError.Code, String)
    /// The backend answers again after being unreachable.
    case reachable
}

/// A speaker who read a message, and when (``ConversationStore/readers(of:)``).
/// One speaker's reaction to a message (``ConversationStore/reactions(to:)``).
public struct MessageReaction: Sendable, Hashable {
    /// The longest reaction, in UTF-8 bytes: an emoji sequence (a family, a flag) fits many times.
    public static let maximumEmojiBytes = ChatRecords.maximumEmojiBytes

    public let reactor: String
    /// Empty while ``isWaitingForKey``.
    public let emoji: String
    public let reactedAt: Date
    public let isWaitingForKey: Bool
}

public struct MessageReader: Sendable, Hashable {
    public let speaker: String
    public let readAt: Date
}
