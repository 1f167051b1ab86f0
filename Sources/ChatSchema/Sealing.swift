import Foundation
import RecordZone

/// The encrypted forms of docs/PROTOCOL.md §3.2: a message's sealed envelope and a sender key
/// sealed to one device.
public enum Sealing {
    /// Why a sealed form does not open.
    public enum Failure: Error, Sendable, Equatable {
        /// Not the layout of the form (too short, an unknown version).
        case malformed(String)
        /// The key of this epoch is not held (yet).
        case keyMissing(epoch: Data)
        /// It does not open with the key and context it names: another record, conversation or
        /// sender, another key, a changed byte.
        case notAuthentic
    }

    public static let envelopeVersion: UInt8 = 1
    public static let epochLength = 16
    /// Plaintext is padded to a multiple of this many bytes before it is encrypted.
    public static let paddingBlock = 256

    /// The additional data a message's envelope is bound to: its record, conversation and sender.
    public static func messageContext(zone: ZoneName, name: String, type: String, sender: String, device: Data) -> Data {
        // Written into one buffer of its length: interpolating a string first cost a
        // microsecond a message (the bench's seal row).
        let parts = [contextLabel, zone.rawValue, name, type, sender]
        var context = Data(count: parts.reduce(0) { $0 + $1.utf8.count + 1 } + device.count)
        context.withUnsafeMutableBytes { raw in
            var at = 0
            for var part in parts {
                at += part.withUTF8 { utf8 in
                    UnsafeMutableRawBufferPointer(rebasing: raw[at...]).copyBytes(from: utf8)
                    return utf8.count
                }
                raw[at] = 0x0A
                at += 1
            }
            device.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: raw[at...]).copyMemory(from: $0) }
        }
        return context
    }

    private static let contextLabel = "convkit-message-v1"

    /// Whether a sender key read back from storage has the lengths sealing requires (the
    /// sealing functions trap on others): a damaged row is skipped or replaced, never used.
    public static func isUsable(epoch: Data, key: Data, device: Data? = nil) -> Bool {
        epoch.count == epochLength && key.count == Sodium.aeadKeyLength && (device.map { $0.count == Sodium.publicKeyLength } ?? true)
    }

    /// `0x01 ‖ epoch (16) ‖ nonce (24) ‖ XChaCha20-Poly1305(padded plaintext, context)`.
    /// - Parameter nonce: random unless given (test vectors give one).
    public static func sealMessage(_ plaintext: some ContiguousBytes, epoch: Data, key: Data, context: Data, nonce: Data? = nil) -> Data {
        precondition(epoch.count == epochLength)
        var header = Data(count: 1 + epochLength)
        header[0] = envelopeVersion
        header.replaceSubrange(1..., with: epoch)
        return Sodium.aeadEncryptPadded(plaintext, block: paddingBlock, header: header, additionalData: context, key: key, nonce: nonce)
    }

    /// The epoch an envelope names (to find its key).
    public static func epoch(of sealed: Data) throws(Failure) -> Data {
        let bytes = [UInt8](sealed)
        guard bytes.count >= 1 + epochLength + Sodium.aeadNonceLength + Sodium.aeadTagLength else { throw .malformed("an envelope is at least \(1 + epochLength + Sodium.aeadNonceLength + Sodium.aeadTagLength) bytes") }
        guard bytes[0] == envelopeVersion else { throw .malformed("envelope version \(bytes[0]) is not known") }
        return Data(bytes[1...epochLength])
    }

    /// Opens an envelope with the key its epoch names. - Throws: ``Failure``.
    public static func openMessage(_ sealed: Data, context: Data, key: (Data) -> Data?) throws(Failure) -> Data {
        let epoch = try epoch(of: sealed)
        guard let epochKey = key(epoch) else { throw .keyMissing(epoch: epoch) }
        let bytes = [UInt8](sealed)
        let nonce = Data(bytes[(1 + epochLength)..<(1 + epochLength + Sodium.aeadNonceLength)])
        let ciphertext = Data(bytes[(1 + epochLength + Sodium.aeadNonceLength)...])
        guard let padded = Sodium.aeadDecrypt(ciphertext, additionalData: context, nonce: nonce, key: epochKey),
              let plaintext = Sodium.unpad(padded, block: paddingBlock) else { throw .notAuthentic }
        return plaintext
    }

    /// The record field that carries the sealed fields.
    public static let sealedField = "sealed"

    /// `record` with `fields` moved into one sealed field (`sealed`): their plaintext is the
    /// canonical encoding (PROTOCOL.md §1.1) of an unsigned record with the same ID and type
    /// holding just them (no author, clock 0, no signature), bound to the record, its
    /// conversation and its sender (`device`: the key that will sign it).
    public static func seal(_ fields: [String], of record: Record, sender: String, device: Data, epoch: Data, key: Data,
                            nonce: Data? = nil) throws(RecordZoneError) -> Record {
        let plaintext: [UInt8]
        if fields.count == 1 {
            // One field (a message's content): encoded straight from the record.
            plaintext = try record.unsignedEncoding(of: fields[0])
        } else {
            var inner = Record(id: record.id, type: record.recordType)
            for field in fields { inner[field] = record[field] }
            plaintext = try inner.encodedByteArray()
        }
        var outer = record
        for field in fields { outer[field] = nil }
        let context = messageContext(zone: record.id.zone, name: record.id.name, type: record.recordType, sender: sender, device: device)
        outer[sealedField] = .bytes(sealMessage(plaintext, epoch: epoch, key: key, context: context, nonce: nonce))
        return outer
    }

    /// `record` with its sealed fields opened back in place (the record as its sender wrote it).
    /// - Parameter key: the sender key of an epoch, if held.
    /// - Throws: ``Failure``; `malformed` too when the plaintext is not an unsigned record of
    ///   the same ID and type.
    public static func open(_ record: Record, sender: String, key: (Data) -> Data?) throws(Failure) -> Record {
        guard let sealed = record[sealedField]?.bytesValue else { throw .malformed("the record has no sealed field") }
        let context = messageContext(zone: record.id.zone, name: record.id.name, type: record.recordType, sender: sender, device: record.authorKey)
        let plaintext = try openMessage(sealed, context: context, key: key)
        guard let inner = try? Record(canonical: plaintext), inner.id == record.id, inner.recordType == record.recordType, inner.authorKey.isEmpty else {
            throw .malformed("the sealed fields are not a record of the same ID and type")
        }
        var opened = record
        opened[sealedField] = nil
        for (field, value) in inner.fields { opened[field] = value }
        return opened
    }

    /// What a key share seals: `"convkit-share-v1\n" ‖ zone ‖ "\n" ‖ sender ‖ "\n" ‖ sender
    /// device (32) ‖ epoch (16) ‖ key (32)`.
    package static func shareText(zone: ZoneName, sender: String, device: Data, epoch: Data, key: Data) -> Data {
        Data("convkit-share-v1\n\(zone.rawValue)\n\(sender)\n".utf8) + device + epoch + key
    }

    /// A sender key sealed to one device's X25519 key, bound to its conversation, sender and epoch.
    public static func sealShare(zone: ZoneName, sender: String, device: Data, epoch: Data, key: Data, to recipient: Data) -> Data {
        precondition(device.count == Sodium.publicKeyLength && epoch.count == epochLength && key.count == Sodium.aeadKeyLength)
        return Sodium.seal(shareText(zone: zone, sender: sender, device: device, epoch: epoch, key: key), to: recipient)
    }

    /// Opens a share with the recipient device's key pair, and returns the sender key — only
    /// if it was sealed for this conversation, sender, device and epoch (what the record
    /// carrying it claims). - Throws: ``Failure/notAuthentic`` otherwise.
    public static func openShare(_ box: Data, zone: ZoneName, sender: String, device: Data, epoch: Data,
                                 publicKey: Data, secretKey: Data) throws(Failure) -> Data {
        guard let text = Sodium.openSealed(box, publicKey: publicKey, secretKey: secretKey) else { throw .notAuthentic }
        let prefix = shareText(zone: zone, sender: sender, device: device, epoch: epoch, key: Data())
        guard text.count == prefix.count + Sodium.aeadKeyLength, text.prefix(prefix.count) == prefix else { throw .notAuthentic }
        return Data(text.suffix(Sodium.aeadKeyLength))
    }
}
