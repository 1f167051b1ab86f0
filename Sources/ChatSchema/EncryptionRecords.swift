import Foundation
import RecordZone

/// A device's X25519 key, published in its speaker's zone so that others can share keys with
/// it (docs/PROTOCOL.md §3.2): `ek.<h(identity)>.<hex of the device's Ed25519 key>`, fields
/// `identity`, `device` (that Ed25519 key) and `key` (the X25519 public key), signed by that
/// device's own key — so nobody, not even another device of the same person, can slip in a key
/// for it. The identity's chain decides whether the device may sign at the record's clock, as
/// for any of the identity's records.
public enum EncryptionKey {
    public static let recordType = "EncryptionKey"
    public static let namePrefix = "ek."
    public static let identityField = "identity"
    public static let deviceField = "device"
    public static let keyField = "key"

    /// The key a device publishes (unsigned: the device signs it).
    public static func record(identity: String, device: Data, key: Data) throws(RecordZoneError) -> Record {
        Record(id: try RecordID(zone: ChatRecords.speakerZone(identity), name: namePrefix + ChatRecords.identityHash(identity) + "." + device.hexString),
               type: recordType, fields: [identityField: .string(identity), deviceField: .bytes(device), keyField: .bytes(key)])
    }

    /// A device's X25519 key pair: `crypto_box_seed_keypair` of the subkey 1 of context
    /// `convkbox` of its Ed25519 seed (`crypto_kdf_derive_from_key`) — so a store rebuilt from its
    /// key, or an identity recovered, opens what was shared with it.
    public static func boxKeys(forDeviceSeed seed: Data) -> (publicKey: Data, secretKey: Data) {
        Sodium.boxKeyPair(seed: Sodium.deriveKey(from: seed, id: 1, context: "convkbox"))
    }

    public struct Parts: Sendable, Hashable {
        public var identity: String
        public var device: Data
        public var key: Data
    }

    /// The record's parts, or why it is not a device's own key record.
    public static func parts(_ record: Record) throws(KeyRecordError) -> Parts {
        guard !record.isDeleted else { throw .shape("an encryption key cannot be deleted (a device replaces it, or is revoked)") }
        guard let identity = record.string(identityField), let device = record[deviceField]?.bytesValue, device.count == Sodium.publicKeyLength,
              let key = record[keyField]?.bytesValue, key.count == Sodium.boxPublicKeyLength
        else { throw .shape("an encryption key needs identity, a 32-byte device and a 32-byte key") }
        guard record.id.name == namePrefix + ChatRecords.identityHash(identity) + "." + device.hexString else {
            throw .shape("an encryption key's name does not name its device")
        }
        guard record.authorKey == device else { throw .shape("an encryption key is not signed by the device it is for") }
        return Parts(identity: identity, device: device, key: key)
    }
}

/// A sender key shared with one member's devices (docs/PROTOCOL.md §3.2): in the conversation's
/// zone, `ks.<h(sender)>.<epoch hex>.<h(recipient)>`, fields `sender`, `recipient`, `epoch` and
/// `boxes` — for each of the recipient's devices its Ed25519 key (32 bytes) followed by the
/// share sealed to its X25519 key (``Sealing/sealShare(zone:sender:device:epoch:key:to:)``).
/// Signed by a device of the sender: the epoch's own device, whose key the sealed share names,
/// or another device of the same person passing it on — then `device` names the epoch's device.
/// A later version (a device of the recipient's seen since) carries every box again.
public enum KeyShare {
    public static let recordType = "KeyShare"
    public static let namePrefix = "ks."
    public static let senderField = "sender"
    public static let recipientField = "recipient"
    public static let epochField = "epoch"
    public static let boxesField = "boxes"
    public static let deviceField = "device"

    public static func name(sender: String, epoch: Data, recipient: String) -> String {
        namePrefix + ChatRecords.identityHash(sender) + "." + epoch.hexString + "." + ChatRecords.identityHash(recipient)
    }

    /// A share record (unsigned: the sending device signs it).
    /// - Parameter device: the epoch's device, when another device of the sender signs the record.
    public static func record(zone: ZoneName, sender: String, recipient: String, epoch: Data, boxes: [(device: Data, box: Data)],
                              device: Data? = nil) throws(RecordZoneError) -> Record {
        var record = Record(id: try RecordID(zone: zone, name: name(sender: sender, epoch: epoch, recipient: recipient)), type: recordType, fields: [
            senderField: .string(sender), recipientField: .string(recipient), epochField: .bytes(epoch),
            boxesField: boxList(boxes),
        ])
        if let device { record[deviceField] = .bytes(device) }
        return record
    }

    public struct Parts: Sendable, Hashable {
        public var sender: String
        public var recipient: String
        public var epoch: Data
        /// Each device's sealed share, by the device's Ed25519 key.
        public var boxes: [Data: Data]
        /// The epoch's device: `device`, or the record's author.
        public var device: Data
    }

    /// The record's parts, or why it is not a well-formed share.
    public static func parts(_ record: Record) throws(KeyRecordError) -> Parts {
        guard !record.isDeleted else { throw .shape("a key share cannot be deleted") }
        guard let sender = record.string(senderField), let recipient = record.string(recipientField),
              let epoch = record[epochField]?.bytesValue, epoch.count == Sealing.epochLength, let list = record[boxesField]?.listValue
        else { throw .shape("a key share needs sender, recipient, a 16-byte epoch and boxes") }
        guard record.id.name == name(sender: sender, epoch: epoch, recipient: recipient) else { throw .shape("a key share's name does not match its fields") }
        let boxes = try Self.boxes(list)
        let device = record[deviceField]?.bytesValue ?? record.authorKey
        guard device.count == Sodium.publicKeyLength else { throw .shape("a key share's device is not a 32-byte key") }
        return Parts(sender: sender, recipient: recipient, epoch: epoch, boxes: boxes, device: device)
    }

    /// `boxes` written: each device's key followed by its box, in the devices' byte order.
    static func boxList(_ boxes: [(device: Data, box: Data)]) -> FieldValue {
        .list(boxes.sorted { $0.device.lexicographicallyPrecedes($1.device) }.map { .bytes($0.device + $0.box) })
    }

    /// `boxes` read: each item a device's Ed25519 key followed by a sealed box, by device.
    static func boxes(_ list: [FieldValue]) throws(KeyRecordError) -> [Data: Data] {
        var boxes: [Data: Data] = [:]
        for item in list {
            guard let bytes = item.bytesValue, bytes.count > Sodium.publicKeyLength + Sodium.sealOverhead else { throw .shape("a share's box is malformed") }
            boxes[Data(bytes.prefix(Sodium.publicKeyLength))] = Data(bytes.dropFirst(Sodium.publicKeyLength))
        }
        return boxes
    }
}

/// Another sender's epoch passed between a person's own devices (docs/PROTOCOL.md §3.2), so a
/// new device reads the past without waiting for every sender to come back online: in the
/// person's own zone, `hs.<h(owner)>.<epoch hex>`, fields `identity` (the owner), `zone` (the
/// conversation's), `sender`, `device` (the epoch's device), `epoch` and `boxes` — for each of
/// the owner's devices its Ed25519 key followed by the same sealed share text a ``KeyShare``
/// box holds. Signed by any device of the owner; a later version carries every box again.
public enum HistoryShare {
    public static let recordType = "HistoryShare"
    public static let namePrefix = "hs."
    public static let identityField = "identity"
    public static let zoneField = "zone"

    public static func recordID(owner: String, epoch: Data) throws(RecordZoneError) -> RecordID {
        try RecordID(zone: ChatRecords.speakerZone(owner), name: namePrefix + ChatRecords.identityHash(owner) + "." + epoch.hexString)
    }

    /// A history share (unsigned: one of the owner's devices signs it).
    public static func record(owner: String, zone: ZoneName, sender: String, device: Data, epoch: Data,
                              boxes: [(device: Data, box: Data)]) throws(RecordZoneError) -> Record {
        Record(id: try recordID(owner: owner, epoch: epoch), type: recordType, fields: [
            identityField: .string(owner), zoneField: .string(zone.rawValue), KeyShare.senderField: .string(sender),
            KeyShare.deviceField: .bytes(device), KeyShare.epochField: .bytes(epoch),
            KeyShare.boxesField: KeyShare.boxList(boxes),
        ])
    }

    public struct Parts: Sendable, Hashable {
        public var owner: String
        public var zone: ZoneName
        public var sender: String
        public var device: Data
        public var epoch: Data
        /// Each of the owner's devices' sealed share, by the device's Ed25519 key.
        public var boxes: [Data: Data]
    }

    /// The record's parts, or why it is not a well-formed history share.
    public static func parts(_ record: Record) throws(KeyRecordError) -> Parts {
        guard !record.isDeleted else { throw .shape("a history share cannot be deleted") }
        guard let owner = record.string(identityField), let zoneText = record.string(zoneField), let zone = try? ZoneName(zoneText),
              let sender = record.string(KeyShare.senderField), let device = record[KeyShare.deviceField]?.bytesValue, device.count == Sodium.publicKeyLength,
              let epoch = record[KeyShare.epochField]?.bytesValue, epoch.count == Sealing.epochLength, let list = record[KeyShare.boxesField]?.listValue
        else { throw .shape("a history share needs identity, zone, sender, a 32-byte device, a 16-byte epoch and boxes") }
        guard record.id == (try? recordID(owner: owner, epoch: epoch)) else { throw .shape("a history share's name does not match its fields") }
        return Parts(owner: owner, zone: zone, sender: sender, device: device, epoch: epoch, boxes: try KeyShare.boxes(list))
    }
}

/// Why a record is not a well-formed encryption key or key share.
public enum KeyRecordError: Error, Sendable, Equatable, CustomStringConvertible {
    case shape(String)
    public var description: String {
        switch self { case .shape(let why): why }
    }
}

extension Record {
    package func string(_ field: String) -> String? { self[field]?.stringValue }
}
