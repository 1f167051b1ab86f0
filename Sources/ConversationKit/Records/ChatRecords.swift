import Foundation
import RecordZone
import SQLiteKit

/// How the chat model maps onto records: zone names, record types, fields and who owns what.
///
/// - `Speaker` in the `speakers` zone, named by the speaker's identifier: `name`, `tags`.
///   Owned by that speaker (the record name).
/// - `ConversationMember` in a conversation zone, named `member-<identifier>`: `speaker`,
///   `participants` (both identifiers, sorted). Owned by `speaker`, who must be a participant.
///   Each side writes its own, so two people starting the same conversation offline never conflict.
/// - `Message` in a conversation zone, named by a UUID: `speaker`, `listener`, `content`,
///   `spokenAt`, optional `editedAt`. Owned by `speaker`.
/// - `Receipt` in a conversation zone, named `read-<message name>`: `reader`, `message`,
///   `readAt`. Owned by `reader`.
///
/// A conversation's zone is `c-<h(a)>-<h(b)>`, where h is the first 8 bytes of the SHA-256
/// of an identifier in hex and the two are sorted: both sides derive the same zone, and anyone
/// (a server, a store) can tell from the name alone whether an identifier takes part.
enum ChatRecords {
    static let speakersZone = constantZone("speakers")

    static let speakerType = "Speaker"
    static let memberType = "ConversationMember"
    static let messageType = "Message"
    static let receiptType = "Receipt"

    static let rules: [OwnershipRule] = [
        OwnershipRule(recordType: speakerType, owner: .recordName),
        OwnershipRule(recordType: memberType, owner: .field("speaker", memberOf: "participants")),
        OwnershipRule(recordType: messageType, owner: .field("speaker")),
        OwnershipRule(recordType: receiptType, owner: .field("reader")),
    ]

    static let maximumIdentifierBytes = 128

    static func constantZone(_ name: String) -> ZoneName {
        guard let zone = try? ZoneName(name) else { preconditionFailure("invalid constant zone name \(name)") }
        return zone
    }

    /// Checks a speaker identifier: 1–128 bytes, no control characters, no leading `_`.
    static func validate(identifier: String) throws(ConversationError) {
        let count = identifier.utf8.count
        guard count > 0 else { throw ConversationError(.invalidIdentifier, "a speaker identifier may not be empty") }
        guard count <= maximumIdentifierBytes else {
            throw ConversationError(.invalidIdentifier, "speaker identifier is \(count) bytes; the limit is \(maximumIdentifierBytes)")
        }
        guard (try? RecordID(zone: speakersZone, name: identifier)) != nil else {
            throw ConversationError(.invalidIdentifier, "speaker identifier '\(identifier)' holds a control character or starts with '_'")
        }
    }

    static func identityHash(_ identifier: String) -> String {
        Sodium.sha256(Data(identifier.utf8)).prefix(8).hexString
    }

    /// The zone of the conversation between two speakers.
    static func conversationZone(_ a: String, _ b: String) -> ZoneName {
        let hashes = [identityHash(a), identityHash(b)].sorted()
        return constantZone("c-\(hashes[0])-\(hashes[1])")
    }

    /// Whether `identifier` takes part in the conversation zone `zone`.
    static func isParticipant(_ identifier: String, in zone: ZoneName) -> Bool {
        let parts = zone.rawValue.split(separator: "-")
        guard parts.count == 3, parts[0] == "c" else { return false }
        let hash = identityHash(identifier)
        return parts[1] == hash || parts[2] == hash
    }

    // MARK: Building records

    static func speaker(identifier: String, name: String, tags: [String]) throws(RecordZoneError) -> Record {
        Record(id: try RecordID(zone: speakersZone, name: identifier), type: speakerType, fields: [
            "name": .string(name), "tags": .list(tags.map { .string($0) }),
        ])
    }

    static func member(_ speaker: String, with other: String) throws(RecordZoneError) -> Record {
        let zone = conversationZone(speaker, other)
        return Record(id: try RecordID(zone: zone, name: "member-\(speaker)"), type: memberType, fields: [
            "speaker": .string(speaker), "participants": .list([speaker, other].sorted().map { .string($0) }),
        ])
    }

    static func message(name: String, speaker: String, listener: String, content: String, spokenAt: Int64, editedAt: Int64?) throws(RecordZoneError) -> Record {
        var fields: [String: FieldValue] = [
            "speaker": .string(speaker), "listener": .string(listener), "content": .string(content),
            "spokenAt": .date(milliseconds: spokenAt),
        ]
        if let editedAt { fields["editedAt"] = .date(milliseconds: editedAt) }
        return Record(id: try RecordID(zone: conversationZone(speaker, listener), name: name), type: messageType, fields: fields)
    }

    static func receiptName(for message: String) -> String { "read-\(message)" }

    static func receipt(zone: ZoneName, message: String, reader: String, readAt: Int64) throws(RecordZoneError) -> Record {
        Record(id: try RecordID(zone: zone, name: receiptName(for: message)), type: receiptType, fields: [
            "reader": .string(reader), "message": .string(message), "readAt": .date(milliseconds: readAt),
        ])
    }
}

extension Record {
    func string(_ field: String) -> String? { self[field]?.stringValue }
    func milliseconds(_ field: String) -> Int64? {
        self[field]?.dateValue.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) }
    }
}
