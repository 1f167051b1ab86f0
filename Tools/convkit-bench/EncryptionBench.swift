import CSodium
import ConversationKit
import Foundation
import RecordZone

/// The encrypted forms of docs/ENCRYPTION.md (not used by the store yet), each beside raw
/// libsodium on the same bytes: a message sealed (padded XChaCha20-Poly1305 with its context) and
/// its record signed, against `crypto_aead_xchacha20poly1305_ietf_encrypt` + `crypto_sign_detached`;
/// a record verified and opened, against the raw verify + decrypt; a key share sealed to a
/// device, against `crypto_box_seal` of the same bytes.
@MainActor func encryptionBench(_ reporter: Reporter, seconds: Double) throws {
    reporter.header("Encryption (the sealed forms, ahead of the store's use of them)")
    let signing = SigningKey.generate()
    let zone = try ZoneName("g-2bd806c97f0e00af-00112233aabbccdd")
    let text = Data("Hello there! This is a message about as long as a chat line usually is.".utf8)
    let epoch = Sodium.randomBytes(Sealing.epochLength), key = Sodium.randomBytes(Sodium.aeadKeyLength)
    let context = Sealing.messageContext(zone: zone, name: "m.2bd806c97f0e00af.0000000000000001-0000000000000001", type: "Message",
                                         sender: "alice", device: signing.publicKey)

    // Raw: the same padded plaintext, additional data and key; a signature over the ciphertext.
    let padded = Array(Sodium.pad(text, block: Sealing.paddingBlock)), ad = Array(context), rawKey = Array(key)
    let nonce = Array(Sodium.randomBytes(Sodium.aeadNonceLength))
    var pk = [UInt8](repeating: 0, count: 32), sk = [UInt8](repeating: 0, count: 64)
    crypto_sign_seed_keypair(&pk, &sk, Array(signing.seed))
    var ciphertext = [UInt8](repeating: 0, count: padded.count + Sodium.aeadTagLength), written: UInt64 = 0
    var signature = [UInt8](repeating: 0, count: 64)
    let rawSeal = rate(seconds: seconds) {
        crypto_aead_xchacha20poly1305_ietf_encrypt(&ciphertext, &written, padded, UInt64(padded.count), ad, UInt64(ad.count), nil, nonce, rawKey)
        crypto_sign_detached(&signature, nil, ciphertext, UInt64(ciphertext.count), sk)
    }
    var opened = [UInt8](repeating: 0, count: padded.count)
    let rawOpen = rate(seconds: seconds) {
        precondition(crypto_sign_verify_detached(signature, ciphertext, UInt64(ciphertext.count), pk) == 0)
        precondition(crypto_aead_xchacha20poly1305_ietf_decrypt(&opened, &written, nil, ciphertext, UInt64(ciphertext.count), ad, UInt64(ad.count), nonce, rawKey) == 0)
    }

    var record = Record(id: try RecordID(zone: zone, name: "m.2bd806c97f0e00af.0000000000000001-0000000000000001"), type: "Message")
    record["speaker"] = .string("alice")
    let seal = try rate(seconds: seconds) {
        record["sealed"] = .bytes(Sealing.sealMessage(text, epoch: epoch, key: key, context: context))
        try record.sign(with: signing, clock: RecordClock(rawValue: 1))
    }
    reporter.report(Row(name: "seal a message + sign its record", perSecond: seal, rawName: "aead encrypt + crypto_sign", rawPerSecond: rawSeal))

    let encoded = try record.encoded()
    let keys = [epoch: key]
    let open = try rate(seconds: seconds) {
        let read = try Record(canonical: encoded)
        precondition(read.hasValidSignature())
        guard case .bytes(let sealed)? = read["sealed"] else { preconditionFailure("no sealed field") }
        _ = try Sealing.openMessage(sealed, context: context) { keys[$0] }
    }
    reporter.report(Row(name: "verify a record + open its message", perSecond: open, rawName: "crypto_sign_verify + aead decrypt", rawPerSecond: rawOpen))

    let device = Sodium.boxKeyPair(seed: Sodium.randomBytes(Sodium.boxSeedLength))
    let shareText = Array(Data("convkit-share-v1\n\(zone.rawValue)\nalice\n".utf8) + signing.publicKey + epoch + key), recipient = Array(device.publicKey)
    var box = [UInt8](repeating: 0, count: shareText.count + Sodium.sealOverhead)
    let rawShare = rate(seconds: seconds) { crypto_box_seal(&box, shareText, UInt64(shareText.count), recipient) }
    let share = rate(seconds: seconds) {
        _ = Sealing.sealShare(zone: zone, sender: "alice", device: signing.publicKey, epoch: epoch, key: key, to: device.publicKey)
    }
    reporter.report(Row(name: "seal a sender key to a device", perSecond: share, rawName: "crypto_box_seal", rawPerSecond: rawShare))
}
