import Foundation
import RecordZone
import SQLiteKit
import ImageKit

/// The store's errors: a code, a message, and what caused it underneath.
public struct ConversationError: Error, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable, Hashable {
        case invalidIdentifier
        case contentTooLarge
        case emptyContent
        /// A mention that is not a span of the message's text naming a valid identifier.
        case invalidMention
        /// A custom payload whose type breaks the type rule or whose data is over 64 KiB.
        case invalidCustomPayload
        /// An edit past ``Message/maximumEdits`` (the history each version carries is bounded).
        case tooManyEdits
        case unknownSpeaker
        case unknownConversation
        case unknownMessage
        /// A message reference that is not 6 to 16 hex digits (``MessageID/reference``).
        case invalidReference
        case notYourMessage
        /// A ref's key, or a fingerprint, does not match the key the store holds for the speaker.
        case keyConflict
        case noLocalSpeaker
        /// A link code that is not one, or was altered (its signature does not verify).
        case invalidLinkCode
        /// A link code past its expiry.
        case linkCodeExpired
        /// Text that is not an introduction, or was altered (its signature does not verify).
        case invalidIntroduction
        /// Linking and revoking devices needs the identity key, which only the first device holds.
        case notIdentityDevice
        /// No certified device of the local speaker has this key.
        case unknownDevice
        /// The store belongs to another local speaker; open that speaker's own store.
        case storeBelongsToAnotherSpeaker
        /// Image bytes that cannot be an avatar: too large, too many pixels, not a PNG or JPEG,
        /// damaged or truncated (``ConversationError/imageError`` says which).
        case invalidImage
        case storeNotWritable
        /// The store's schema is not this version's: written by a later ConversationKit (update
        /// it), or older and opened only to look at (open it once for writing to migrate it).
        /// ``ConversationError/sqliteError``'s `schema` gives both versions.
        case storeVersionMismatch
        case databaseCorrupt
        case database
        case backend
        /// The backend (a server) does not accept this device's requests:
        /// ``RecordZoneError/authentication`` of ``backendError`` says why (a clock too far off,
        /// a key it does not hold). Nothing is lost: local changes wait in the outbox.
        case notAuthenticated
        /// This device was revoked by the speaker's first device: what it signs is refused, and
        /// its messages that cannot reach anyone are marked ``SyncFailure/Code/deviceRevoked``.
        case deviceRevoked
        /// The group's membership rule (docs/PROTOCOL.md §3.1) refuses the change as the store
        /// holds the group now: not an admin, not in the group, the creator as a target.
        case notAllowedInGroup
        /// A sealed record whose epoch's key this device does not hold (yet): it was not shared
        /// with this device, or its share has not been synced.
        case keyNotHeld
        /// A sealed record that does not open with its epoch's key: altered, malformed, or moved
        /// from another record, conversation or sender.
        case notAuthentic
        /// Text that is not a recovery code (52 base32 characters).
        case invalidRecoveryCode
        /// A recovery code that does not open the speaker's recovery record (a typo, or a code
        /// replaced since by a newer one). Nothing was restored.
        case wrongRecoveryCode
        /// The backend holds no recovery record for the speaker (none was made, or it was not
        /// pushed).
        case noRecoveryRecord
        /// A file to send that cannot be read (missing, a directory, no permission), or empty.
        case fileUnreadable
        /// A file to send over ``Attachment/maximumSize``.
        case fileTooLarge
        /// A message without a file, asked for its file.
        case noFile
        /// A file's chunk that the backend does not hold (its sender's device has not uploaded it,
        /// or the backend lost it).
        case fileMissing
        /// A file's chunk whose bytes are not what its message names (changed on the backend or
        /// on the way): nothing of it is kept as the file.
        case fileCorrupt
    }

    public var code: Code
    public var message: String
    /// The SQLite error underneath, for ``Code/database``, ``Code/databaseCorrupt`` and ``Code/storeNotWritable``.
    public var sqliteError: SQLiteError?
    /// The backend error underneath, for ``Code/backend``.
    public var backendError: RecordZoneError?
    /// The image error underneath, for ``Code/invalidImage``.
    public var imageError: ImageError?

    public init(_ code: Code, _ message: String, sqliteError: SQLiteError? = nil, backendError: RecordZoneError? = nil) {
        self.code = code
        self.message = message
        self.sqliteError = sqliteError
        self.backendError = backendError
    }

    public var description: String { "\(code.rawValue): \(message)" }

    /// A backend's error, with what the store was doing: ``Code/backend``, or
    /// ``Code/notAuthenticated`` / ``Code/deviceRevoked`` when a server refused who signed.
    static func backend(_ error: RecordZoneError, _ doing: String) -> ConversationError {
        guard error.code == .notAuthenticated else { return ConversationError(.backend, "\(doing): \(error)", backendError: error) }
        if error.authentication == .deviceRevoked {
            return ConversationError(.deviceRevoked, "\(doing): this device was revoked; its messages cannot reach anyone (link it again as a new device)", backendError: error)
        }
        let why = error.authentication.map { "\($0)" } ?? error.message
        return ConversationError(.notAuthenticated, "\(doing): the server does not accept this device's requests: \(why)", backendError: error)
    }

    /// Wraps any error thrown inside the store into a ``ConversationError``.
    static func wrap(_ error: any Error) -> ConversationError {
        switch error {
        case let error as ConversationError: return error
        case let error as SQLiteError:
            if let schema = error.schema {
                return ConversationError(.storeVersionMismatch, schema.isNewer ? "the store was written by a later version: \(error.message)" : error.message, sqliteError: error)
            }
            if error.isCorruption { return ConversationError(.databaseCorrupt, "the store's database is damaged: \(error.message)", sqliteError: error) }
            if error.isAccessProblem { return ConversationError(.storeNotWritable, "the store's database cannot be written: \(error.message)", sqliteError: error) }
            return ConversationError(.database, error.description, sqliteError: error)
        case let error as RecordZoneError: return ConversationError(.backend, error.description, backendError: error)
        case let error as ImageError:
            var wrapped = ConversationError(.invalidImage, error.description)
            wrapped.imageError = error
            return wrapped
        default: return ConversationError(.database, "\(error)")
        }
    }
}
