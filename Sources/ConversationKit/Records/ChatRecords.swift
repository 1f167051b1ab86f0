import Foundation
import RecordZone
import SQLiteKit

/// How the chat model maps onto records: zone names, record types, fields and who owns what.
///
/// Every record's ID names its owner, so no version can hand a record to someone else:
/// - A speaker's own zone `s-<h(identifier)>` holds its profile (`Speaker`, named by the
///   identifier: `name`, `tags`) and its key records (``KeyRotation``, ``DeviceCertificate``,
///   ``DeviceRevocation``). A store follows the zones of the speakers it knows, and no others.
/// - The `speakers` directory zone holds a copy of every profile, for discovery by query.
/// - `ConversationMember` in a conversation zone, named `member-<identifier>`: `speaker` (the
///   same identifier), `participants` (both identifiers, sorted). Each side writes its own, so
///   two people starting the same conversation offline never conflict.
/// - `Message` in a conversation zone, named `m.<h(speaker)>.<time-ordered id>`: `speaker`,
///   `listener`, `content`, `spokenAt`, optional `editedAt`.
/// - `Receipt` in a conversation zone, named `r.<h(reader)>.<message name>`: `reader`,
///   `message`, `readAt`.
///
/// A conversation's zone is `c-<h(a)>-<h(b)>`, where h is the first 8 bytes of the SHA-256
/// of an identifier in hex and the two are sorted: both sides derive the same zone, and anyone
/// (a server, a store) can tell from the name alone whether an identifier takes part.
enum ChatRecords {
    static let speakersZone = constantZone("speakers")
    static let speakerZonePrefix = "s-"

    static let speakerType = "Speaker"
    static let memberType = "ConversationMember"
    static let messageType = "Message"
    static let receiptType = "Receipt"

    static let messagePrefix = "m."
    static let receiptPrefix = "r."
    static let memberPrefix = "member-"

    static let rules: [OwnershipRule] = [
        OwnershipRule(recordType: speakerType, zones: .named(speakersZone.rawValue), owner: .name(prefix: "")),
        OwnershipRule(recordType: speakerType, zones: .ownersZone(prefix: speakerZonePrefix), owner: .name(prefix: "")),
        OwnershipRule(recordType: memberType, zones: .prefixed("c-"), owner: .name(prefix: memberPrefix, field: "speaker")),
        OwnershipRule(recordType: messageType, zones: .prefixed("c-"), owner: .hashedName(prefix: messagePrefix, field: "speaker")),
        OwnershipRule(recordType: receiptType, zones: .prefixed("c-"), owner: .hashedName(prefix: receiptPrefix, field: "reader")),
    ]

    /// The chat's policy: the rules above, and every record must have an owner.
    static func policy(pinnedKeys: [String: KeyChain] = [:]) -> RecordPolicy {
        RecordPolicy(rules: rules, requiresOwner: true, pinnedKeys: pinnedKeys)
    }

    static let maximumIdentifierBytes = 64

    static func constantZone(_ name: String) -> ZoneName {
        guard let zone = try? ZoneName(name) else { preconditionFailure("invalid constant zone name \(name)") }
        return zone
    }

    /// Prefixes of the key records' names, which no identifier may start with.
    static let reservedPrefixes = [KeyRotation.namePrefix, DeviceCertificate.namePrefix, DeviceRevocation.namePrefix]

    /// Whether `identifier` follows the identifier rule: 1–64 characters of `a–z 0–9 . - _`,
    /// starting with a letter or a digit, and not with a key record's prefix (`rotation.`,
    /// `device.`, `revoke.`). One spelling per person, as Matrix user IDs and Signal usernames:
    /// no capitals, no look-alike letters from other scripts (`Ａlice`, Cyrillic `аlice`), no
    /// spaces or invisible characters. Names shown to people stay free-form.
    public static func isValidIdentifier(_ identifier: String) -> Bool {
        let bytes = Array(identifier.utf8)
        guard let first = bytes.first, bytes.count <= maximumIdentifierBytes else { return false }
        let isLetterOrDigit = { (byte: UInt8) in (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) }
        guard isLetterOrDigit(first), bytes.allSatisfy({ isLetterOrDigit($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") }) else {
            return false
        }
        return !reservedPrefixes.contains(where: identifier.hasPrefix)
    }

    /// Checks a speaker identifier against ``isValidIdentifier(_:)``.
    static func validate(identifier: String) throws(ConversationError) {
        guard !identifier.isEmpty else { throw ConversationError(.invalidIdentifier, "a speaker identifier may not be empty") }
        guard isValidIdentifier(identifier) else {
            throw ConversationError(.invalidIdentifier, "speaker identifier '\(identifier)' breaks the identifier rule: 1–\(maximumIdentifierBytes) characters of a–z 0–9 . - _, "
                                    + "starting with a letter or digit, not with \(reservedPrefixes.joined(separator: ", ")) (no capitals, look-alike letters or spaces)")
        }
    }

    static func identityHash(_ identifier: String) -> String {
        OwnershipRule.identityHash(identifier)
    }

    /// A speaker's own zone: its profile and key records.
    static func speakerZone(_ identifier: String) -> ZoneName {
        constantZone(speakerZonePrefix + identityHash(identifier))
    }

    /// The own zones of a conversation zone's two participants (their hashes are in its name).
    static func speakerZones(of conversation: ZoneName) -> [ZoneName] {
        let parts = conversation.rawValue.split(separator: "-")
        guard parts.count == 3, parts[0] == "c" else { return [] }
        return parts.dropFirst().compactMap { try? ZoneName(speakerZonePrefix + $0) }
    }

    static func isSpeakerZone(_ zone: ZoneName) -> Bool { zone.rawValue.hasPrefix(speakerZonePrefix) }

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

    /// A profile: the version in the speaker's own zone, and its copy in the directory. The
    /// avatar is an asset (a capped PNG) with its pixel size: `avatar`, `avatarWidth`,
    /// `avatarHeight`.
    static func speaker(identifier: String, name: String, tags: [String], avatar: AvatarReference? = nil) throws(RecordZoneError) -> [Record] {
        var fields: [String: FieldValue] = ["name": .string(name), "tags": .list(tags.map { .string($0) })]
        if let avatar {
            fields["avatar"] = .asset(avatar.asset)
            fields["avatarWidth"] = .int(Int64(avatar.size.width))
            fields["avatarHeight"] = .int(Int64(avatar.size.height))
        }
        return [Record(id: try RecordID(zone: speakerZone(identifier), name: identifier), type: speakerType, fields: fields),
                Record(id: try RecordID(zone: speakersZone, name: identifier), type: speakerType, fields: fields)]
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

    /// A new message's name: the sender's hash, then the version clock (so one sender's
    /// messages in the same millisecond keep their order everywhere), then random bits.
    static func messageName(speaker: String, clock: RecordClock) -> String {
        messagePrefix + identityHash(speaker) + "." + String(clock.rawValue, radix: 16).leftPadded(to: 16) + "-" + Sodium.randomBytes(8).hexString
    }

    static func receiptName(for message: String, reader: String) -> String { receiptPrefix + identityHash(reader) + "." + message }

    static func receipt(zone: ZoneName, message: String, reader: String, readAt: Int64) throws(RecordZoneError) -> Record {
        Record(id: try RecordID(zone: zone, name: receiptName(for: message, reader: reader)), type: receiptType, fields: [
            "reader": .string(reader), "message": .string(message), "readAt": .date(milliseconds: readAt),
        ])
    }
}

/// A profile's avatar: the asset holding the PNG, and its pixel size.
struct AvatarReference: Sendable, Hashable {
    var asset: AssetReference
    var size: PixelSize

    /// The avatar a Speaker record names, if it names a well-formed one.
    init?(_ record: Record) {
        guard !record.isDeleted, let asset = record["avatar"]?.assetValue,
            let width = record["avatarWidth"]?.intValue, let height = record["avatarHeight"]?.intValue,
            (1...Int64(PixelSize.largestAvatarSide)).contains(width), (1...Int64(PixelSize.largestAvatarSide)).contains(height)
        else { return nil }
        self.init(asset: asset, size: PixelSize(width: Int(width), height: Int(height)))
    }

    init(asset: AssetReference, size: PixelSize) {
        self.asset = asset
        self.size = size
    }
}

extension Record {
    func string(_ field: String) -> String? { self[field]?.stringValue }
    func milliseconds(_ field: String) -> Int64? {
        self[field]?.dateValue.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) }
    }
}
