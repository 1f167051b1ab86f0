import Foundation
import RecordZone

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
///   `listener`, `content`, `spokenAt`, optional `editedAt`, optional `replyTo` (the name of the
///   message it answers, in the same zone) and `mentions` (`"<start>:<length>:<identifier>"`
///   spans of the content in UTF-8 bytes), an app's `customType` and `customData`, and the earlier
///   versions' `history` and `historyTimes`, and a file's manifest (``AttachmentManifest``), all
///   sealed with the content.
/// - `Receipt` in a conversation zone, named `r.<h(reader)>.<message name>`: `reader`,
///   `message`, `readAt`.
/// - `Reaction` in a conversation or group zone, named `x.<h(reactor)>.<message name>`:
///   `reactor`, `message`, `emoji` (sealed), `reactedAt` — one per reactor per message, so two
///   people reacting offline never write the same record; a tombstone takes it back.
/// - `Delivery` in a conversation or group zone, named `d.<h(member)>.<16 hex of the writing
///   device's key>`: `member`, `held` (per sender, `"<count>:<newest message name>"` of the
///   messages the device holds) — the delivered ticks, one record per device, not per message.
///
/// - `Block` in a conversation zone, named `block-<blocker>`: `blocker`, `blocked` (the other
///   participant) — the blocker's readers hide the blocked one's messages, and a zone server
///   refuses the blocked one's records into the zone (``PairBlocks``); a tombstone unblocks.
///
/// - `Recovery` in a speaker's zone (``Recovery``): the identity key, wrapped with a recovery code.
/// - `EncryptionKey` and `HistoryShare` in a speaker's zone and `KeyShare` in a conversation's or group's zone
///   (``EncryptionKey``, ``KeyShare``); a message's content then travels in `sealed`.
/// - `GroupChange` in a group's zone `g-<h(creator)>-<16 hex random>`, named
///   `gc.<h(actor)>.<16 hex clock>-<16 hex random>` (``GroupChange``); messages and receipts
///   there as in a pair conversation, a message without `listener`.
///
/// A conversation's zone is `c-<h(a)>-<h(b)>`, where h is the first 8 bytes of the SHA-256
/// of an identifier in hex and the two are sorted: both sides derive the same zone, and anyone
/// (a server, a store) can tell from the name alone whether an identifier takes part.
package enum ChatRecords {
    package static let speakersZone = constantZone("speakers")
    package static let speakerZonePrefix = "s-"

    package static let speakerType = "Speaker"
    package static let memberType = "ConversationMember"
    package static let messageType = "Message"
    package static let receiptType = "Receipt"
    package static let reactionType = "Reaction"
    package static let deliveryType = "Delivery"
    package static let blockType = "Block"

    package static let messagePrefix = "m."
    package static let receiptPrefix = "r."
    package static let reactionPrefix = "x."
    package static let deliveryPrefix = "d."
    package static let memberPrefix = "member-"
    package static let blockPrefix = "block-"

    package static let rules: [OwnershipRule] = [
        // A device's encryption key (§3.2), before the profile's rule: its prefix is reserved.
        OwnershipRule(recordType: EncryptionKey.recordType, zones: .ownersZone(prefix: speakerZonePrefix), owner: .hashedName(prefix: EncryptionKey.namePrefix, field: EncryptionKey.identityField)),
        // The identity's recovery record (§3.3): the identity key alone signs it.
        OwnershipRule(recordType: Recovery.recordType, zones: .ownersZone(prefix: speakerZonePrefix), owner: .name(prefix: Recovery.namePrefix, field: Recovery.identityField),
                      identityKeyOnly: true),
        // Other senders' epochs passed between the owner's devices (§3.2).
        OwnershipRule(recordType: HistoryShare.recordType, zones: .ownersZone(prefix: speakerZonePrefix), owner: .hashedName(prefix: HistoryShare.namePrefix, field: HistoryShare.identityField)),
        OwnershipRule(recordType: speakerType, zones: .named(speakersZone.rawValue), owner: .name(prefix: "")),
        OwnershipRule(recordType: speakerType, zones: .ownersZone(prefix: speakerZonePrefix), owner: .name(prefix: "")),
        OwnershipRule(recordType: memberType, zones: .prefixed("c-"), owner: .name(prefix: memberPrefix, field: "speaker")),
        OwnershipRule(recordType: messageType, zones: .prefixed("c-"), owner: .hashedName(prefix: messagePrefix, field: "speaker")),
        OwnershipRule(recordType: receiptType, zones: .prefixed("c-"), owner: .hashedName(prefix: receiptPrefix, field: "reader")),
        OwnershipRule(recordType: reactionType, zones: .prefixed("c-"), owner: .hashedName(prefix: reactionPrefix, field: "reactor")),
        OwnershipRule(recordType: deliveryType, zones: .prefixed("c-"), owner: .hashedName(prefix: deliveryPrefix, field: "member")),
        OwnershipRule(recordType: blockType, zones: .prefixed("c-"), owner: .name(prefix: blockPrefix, field: "blocker")),
        // Groups (`g-<h(creator)>-<random>`): their changes, and messages and receipts as in a pair.
        OwnershipRule(recordType: GroupChange.recordType, zones: .prefixed(GroupMembership.zonePrefix), owner: .hashedName(prefix: GroupChange.namePrefix, field: "actor")),
        OwnershipRule(recordType: messageType, zones: .prefixed(GroupMembership.zonePrefix), owner: .hashedName(prefix: messagePrefix, field: "speaker")),
        OwnershipRule(recordType: receiptType, zones: .prefixed(GroupMembership.zonePrefix), owner: .hashedName(prefix: receiptPrefix, field: "reader")),
        OwnershipRule(recordType: reactionType, zones: .prefixed(GroupMembership.zonePrefix), owner: .hashedName(prefix: reactionPrefix, field: "reactor")),
        OwnershipRule(recordType: deliveryType, zones: .prefixed(GroupMembership.zonePrefix), owner: .hashedName(prefix: deliveryPrefix, field: "member")),
        // Sender keys shared in a conversation's zone (§3.2).
        OwnershipRule(recordType: KeyShare.recordType, zones: .prefixed("c-"), owner: .hashedName(prefix: KeyShare.namePrefix, field: KeyShare.senderField)),
        OwnershipRule(recordType: KeyShare.recordType, zones: .prefixed(GroupMembership.zonePrefix), owner: .hashedName(prefix: KeyShare.namePrefix, field: KeyShare.senderField)),
    ]

    /// What a record of `type` seals (docs/PROTOCOL.md §3.2), and the field naming its sender:
    /// a message's content, a reaction's emoji. Nil for a type that seals nothing.
    package static func sealing(_ type: String) -> (fields: [String], sender: String)? {
        switch type {
        case messageType: (["content", "replyTo", "mentions", "customType", "customData", "history", "historyTimes"] + AttachmentManifest.fields, "speaker")
        case reactionType: (["emoji"], "reactor")
        default: nil
        }
    }

    /// Whether a zone is a group's (`g-<h(creator)>-<16 hex random>`).
    package static func isGroupZone(_ zone: ZoneName) -> Bool { GroupMembership.isGroupZone(zone) }

    /// The chat's policy: the rules above, and every record must have an owner.
    package static func policy(pinnedKeys: [String: KeyChain] = [:]) -> RecordPolicy {
        RecordPolicy(rules: rules, requiresOwner: true, pinnedKeys: pinnedKeys)
    }

    package static let maximumIdentifierBytes = 64

    package static func constantZone(_ name: String) -> ZoneName {
        guard let zone = try? ZoneName(name) else { preconditionFailure("invalid constant zone name \(name)") }
        return zone
    }

    /// Prefixes of the key records' names, which no identifier may start with.
    package static let reservedPrefixes = [KeyRotation.namePrefix, DeviceCertificate.namePrefix, DeviceRevocation.namePrefix, EncryptionKey.namePrefix, HistoryShare.namePrefix, Recovery.namePrefix]

    /// Whether `identifier` follows the identifier rule: 1–64 characters of `a–z 0–9 . - _`,
    /// starting with a letter or a digit, and not with a key record's prefix (`rotation.`,
    /// `device.`, `revoke.`, `ek.`, `hs.`, `recovery.`). One spelling per person, as Matrix user IDs and Signal usernames:
    /// no capitals, no look-alike letters from other scripts (`Ａlice`, Cyrillic `аlice`), no
    /// spaces or invisible characters. Names shown to people stay free-form.
    package static func isValidIdentifier(_ identifier: String) -> Bool {
        let bytes = identifier.utf8
        guard let first = bytes.first, bytes.count <= maximumIdentifierBytes else { return false }
        let isLetterOrDigit = { (byte: UInt8) in (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) }
        guard isLetterOrDigit(first), bytes.allSatisfy({ isLetterOrDigit($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") }) else {
            return false
        }
        return !reservedPrefixes.contains(where: identifier.hasPrefix)
    }

    package static func identityHash(_ identifier: String) -> String {
        OwnershipRule.identityHash(identifier)
    }

    /// A speaker's own zone: its profile and key records.
    package static func speakerZone(_ identifier: String) -> ZoneName {
        constantZone(speakerZonePrefix + identityHash(identifier))
    }

    /// The own zones of a conversation zone's two participants (their hashes are in its name).
    package static func speakerZones(of conversation: ZoneName) -> [ZoneName] {
        let parts = conversation.rawValue.split(separator: "-")
        guard parts.count == 3, parts[0] == "c" else { return [] }
        return parts.dropFirst().compactMap { try? ZoneName(speakerZonePrefix + $0) }
    }

    package static func isSpeakerZone(_ zone: ZoneName) -> Bool { zone.rawValue.hasPrefix(speakerZonePrefix) }

    /// The zone of the conversation between two speakers.
    package static func conversationZone(_ a: String, _ b: String) -> ZoneName {
        let hashes = [identityHash(a), identityHash(b)].sorted()
        return constantZone("c-\(hashes[0])-\(hashes[1])")
    }

    /// Whether `zone` is the conversation of `a` and `b` (``conversationZone(_:_:)``), compared in
    /// place: every applied message asks.
    package static func isConversationZone(_ zone: ZoneName, of a: String, _ b: String) -> Bool {
        let (x, y) = (identityHash(a), identityHash(b))
        let (low, high) = x < y ? (x, y) : (y, x)
        let text = zone.rawValue.utf8
        return text.count == 35 && text.starts(with: "c-".utf8) && text.dropFirst(2).prefix(16).elementsEqual(low.utf8)
            && text.dropFirst(18).first == UInt8(ascii: "-") && text.dropFirst(19).elementsEqual(high.utf8)
    }

    /// Whether a zone is a pair conversation's (`c-<h(a)>-<h(b)>`).
    package static func isPairZone(_ zone: ZoneName) -> Bool { speakerZones(of: zone).count == 2 }

    /// Whether `identifier` takes part in the conversation zone `zone`.
    package static func isParticipant(_ identifier: String, in zone: ZoneName) -> Bool {
        // `c-<16>-<16>`, compared in place: every applied record of a pair asks.
        let text = zone.rawValue.utf8
        guard text.count == 35, text.first == UInt8(ascii: "c"), text.dropFirst().first == UInt8(ascii: "-"),
              text.dropFirst(18).first == UInt8(ascii: "-") else { return false }
        let hash = identityHash(identifier).utf8
        return text.dropFirst(2).prefix(16).elementsEqual(hash) || text.dropFirst(19).elementsEqual(hash)
    }
}
