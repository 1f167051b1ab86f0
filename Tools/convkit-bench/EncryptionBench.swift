import CSodium
import ConversationKit
import Foundation
import RecordZone

/// The encrypted forms of PROTOCOL.md §3.2 as the store makes them, each beside raw libsodium
/// on the same bytes: a message's content sealed (padded XChaCha20-Poly1305 with its context)
/// and its record signed, against `crypto_aead_xchacha20poly1305_ietf_encrypt` +
/// `crypto_sign_detached`; a record verified and opened, against the raw verify + decrypt; a key
/// share sealed to a device, against `crypto_box_seal` of the same bytes; a new epoch shared with
/// a group of 100 and of 1,000 members (two devices each): time and bytes.
@MainActor func encryptionBench(_ reporter: Reporter, seconds: Double) throws {
    reporter.header("Encryption (the sealed forms as the store writes them)")
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

    var message = Record(id: try RecordID(zone: zone, name: "m.2bd806c97f0e00af.0000000000000001-0000000000000001"), type: "Message")
    message["speaker"] = .string("alice")
    message["content"] = .string(String(decoding: text, as: UTF8.self))
    var record = message
    // Each beside its raw limit in alternating turns (``interleavedRates``): on a shared VM the
    // two halves of a row measured a second apart differed by a third.
    let (seal, rawSeal) = try interleavedRates(seconds: seconds, ours: {
        record = try Sealing.seal(["content"], of: message, sender: "alice", device: signing.publicKey, epoch: epoch, key: key)
        try record.sign(with: signing, clock: RecordClock(rawValue: 1))
    }, raw: {
        crypto_aead_xchacha20poly1305_ietf_encrypt(&ciphertext, &written, padded, UInt64(padded.count), ad, UInt64(ad.count), nil, nonce, rawKey)
        crypto_sign_detached(&signature, nil, ciphertext, UInt64(ciphertext.count), sk)
    })
    reporter.report(Row(name: "seal a message + sign its record", perSecond: seal, rawName: "aead encrypt + crypto_sign", rawPerSecond: rawSeal))

    let encoded = try record.encoded()
    var opened = [UInt8](repeating: 0, count: padded.count)
    let (open, rawOpen) = try interleavedRates(seconds: seconds, ours: {
        let read = try Record(canonical: encoded)
        precondition(read.hasValidSignature())
        _ = try Sealing.open(read, sender: "alice") { $0 == epoch ? key : nil }
    }, raw: {
        precondition(crypto_sign_verify_detached(signature, ciphertext, UInt64(ciphertext.count), pk) == 0)
        precondition(crypto_aead_xchacha20poly1305_ietf_decrypt(&opened, &written, nil, ciphertext, UInt64(ciphertext.count), ad, UInt64(ad.count), nonce, rawKey) == 0)
    })
    reporter.report(Row(name: "verify a record + open its message", perSecond: open, rawName: "crypto_sign_verify + aead decrypt", rawPerSecond: rawOpen))

    let device = Sodium.boxKeyPair(seed: Sodium.randomBytes(Sodium.boxSeedLength))
    let shareText = Array(Data("convkit-share-v1\n\(zone.rawValue)\nalice\n".utf8) + signing.publicKey + epoch + key), recipient = Array(device.publicKey)
    var box = [UInt8](repeating: 0, count: shareText.count + Sodium.sealOverhead)
    let rawShare = rate(seconds: seconds) { crypto_box_seal(&box, shareText, UInt64(shareText.count), recipient) }
    let share = rate(seconds: seconds) {
        _ = Sealing.sealShare(zone: zone, sender: "alice", device: signing.publicKey, epoch: epoch, key: key, to: device.publicKey)
    }
    reporter.report(Row(name: "seal a sender key to a device", perSecond: share, rawName: "crypto_box_seal", rawPerSecond: rawShare))

    // A new epoch shared with a group: a KeyShare per member (two devices each), sealed and
    // signed — what a sender writes before its first message after a removal.
    var perDevice = [Int: (seconds: Double, bytes: Int)]()
    for members in [100, 1000] {
        let devices = (0..<members).map { _ in (0..<2).map { _ in (Sodium.randomBytes(32), Sodium.boxKeyPair(seed: Sodium.randomBytes(Sodium.boxSeedLength)).publicKey) } }
        var bytes = 0
        let epochs = try rate(seconds: seconds) {
            bytes = 0
            for (index, pair) in devices.enumerated() {
                let boxes = pair.map { (device: $0.0, box: Sealing.sealShare(zone: zone, sender: "alice", device: signing.publicKey, epoch: epoch, key: key, to: $0.1)) }
                var share = try KeyShare.record(zone: zone, sender: "alice", recipient: "member-\(index)", epoch: epoch, boxes: boxes)
                try share.sign(with: signing, clock: RecordClock(rawValue: 1))
                bytes += try share.encoded().count
            }
        }
        perDevice[members] = (1 / epochs / Double(2 * members), bytes)
        let rawEpochs = rate(seconds: seconds) {
            for _ in 0..<(2 * members) { crypto_box_seal(&box, shareText, UInt64(shareText.count), recipient) }
            for _ in 0..<members { crypto_sign_detached(&signature, nil, shareText, UInt64(shareText.count), sk) }
        }
        reporter.report(Row(name: "a new epoch for \(members) members (\(2 * members) devices)", perSecond: epochs,
                            rawName: "\(2 * members) crypto_box_seal + \(members) signs", rawPerSecond: rawEpochs))
    }
    if let small = perDevice[100], let large = perDevice[1000] {
        reporter.note(String(format: "  a new epoch: 100 members %.1f ms, %d bytes; 1,000 members %.1f ms, %d bytes (per device %.1f µs and %.1f µs)",
                             small.seconds * 200 * 1000, small.bytes, large.seconds * 2000 * 1000, large.bytes, small.seconds * 1e6, large.seconds * 1e6))
    }
}
