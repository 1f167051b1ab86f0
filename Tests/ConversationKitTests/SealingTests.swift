import ChatSchema
import Foundation
import RecordZone
import Testing
import TestSupport

/// The encrypted forms of docs/ENCRYPTION.md (built ahead of their use by the store): the
/// XChaCha20-Poly1305 wrapper against the published known answer, a message's envelope and a
/// key share — each opening only with its key, for its record, conversation and sender, and
/// failing on any changed byte.
@Suite struct SealingTests {
    static let zone = try! ZoneName("g-4c26d9074c27d89e-00112233aabbccdd")
    static let device = Data(repeating: 7, count: 32)
    static let epoch = Data(repeating: 0xE1, count: 16)
    static let key = Data((0..<32).map { UInt8($0) })

    static func context(name: String = "m.x.1", sender: String = "carol", zone: ZoneName = SealingTests.zone) -> Data {
        Sealing.messageContext(zone: zone, name: name, type: "Message", sender: sender, device: device)
    }

    /// draft-irtf-cfrg-xchacha-03, appendix A.3.1.
    @Test func theAEADGivesThePublishedAnswer() throws {
        let key = try #require(Data(hexString: "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f"))
        let nonce = try #require(Data(hexString: "404142434445464748494a4b4c4d4e4f5051525354555657"))
        let aad = try #require(Data(hexString: "50515253c0c1c2c3c4c5c6c7"))
        let plaintext = Data("Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.".utf8)
        let expected = "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452"
            + "2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff921f9664c97637da9768812f615c68b13b52e" + "c0875924c1c7987947deafd8780acf49"
        let sealed = Sodium.aeadEncrypt(plaintext, additionalData: aad, nonce: nonce, key: key)
        #expect(sealed.hexString == expected)
        #expect(Sodium.aeadDecrypt(sealed, additionalData: aad, nonce: nonce, key: key) == plaintext)
    }

    /// The envelope pads in its own buffer (one 0x80 after the text): byte for byte what
    /// `sodium_pad` gives, for every length around the block boundaries.
    @Test func anEnvelopePadsAsSodiumPadDoes() throws {
        let nonce = Data(repeating: 0x24, count: Sodium.aeadNonceLength)
        for length in Array(0...3) + Array(252...260) + Array(509...514) {
            let text = Data((0..<length).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 1) })
            let sealed = Sealing.sealMessage(text, epoch: Self.epoch, key: Self.key, context: Self.context(), nonce: nonce)
            let ciphertext = sealed.suffix(from: sealed.startIndex + 1 + Sealing.epochLength + Sodium.aeadNonceLength)
            let padded = try #require(Sodium.aeadDecrypt(Data(ciphertext), additionalData: Self.context(), nonce: nonce, key: Self.key), "length \(length)")
            #expect(padded == Sodium.pad(text, block: Sealing.paddingBlock), "length \(length)")
        }
    }

    @Test func anEnvelopeOpensOnlyForItsRecordConversationAndSender() throws {
        let text = Data("Who brings the tent?".utf8)
        let sealed = Sealing.sealMessage(text, epoch: Self.epoch, key: Self.key, context: Self.context())
        let keys = [Self.epoch: Self.key]
        #expect(try Sealing.openMessage(sealed, context: Self.context()) { keys[$0] } == text)
        // Padded: a short line and a longer one are the same size.
        let longer = Sealing.sealMessage(Data(String(repeating: "x", count: 200).utf8), epoch: Self.epoch, key: Self.key, context: Self.context())
        #expect(sealed.count == longer.count && sealed.count == 1 + 16 + 24 + 256 + 16)
        // Moved to another record, conversation or sender; another key; no key yet.
        let other = try ZoneName("g-4c26d9074c27d89e-ffffffffffffffff")
        for context in [Self.context(name: "m.x.2"), Self.context(sender: "mallory"), Self.context(zone: other)] {
            #expect(throws: Sealing.Failure.notAuthentic) { try Sealing.openMessage(sealed, context: context) { keys[$0] } }
        }
        #expect(throws: Sealing.Failure.notAuthentic) { try Sealing.openMessage(sealed, context: Self.context()) { _ in Data(repeating: 9, count: 32) } }
        #expect(throws: Sealing.Failure.keyMissing(epoch: Self.epoch)) { try Sealing.openMessage(sealed, context: Self.context()) { _ in nil } }
        // Every byte changed fails, and says how: the version, the epoch, or the rest.
        for index in sealed.indices {
            var changed = sealed
            changed[index] ^= 0x01
            do {
                _ = try Sealing.openMessage(changed, context: Self.context()) { keys[$0] }
                Issue.record("byte \(index) changed and it still opened")
            } catch {
                let expected: Sealing.Failure = index == 0 ? .malformed("envelope version 0 is not known")
                    : index <= 16 ? .keyMissing(epoch: Data(changed[1...16])) : .notAuthentic
                #expect(error == expected, "byte \(index)")
            }
        }
        #expect(throws: Sealing.Failure.self) { try Sealing.openMessage(Data([1, 2, 3]), context: Self.context()) { keys[$0] } }
    }

    @Test func aShareOpensOnlyForTheDeviceAndWhatItClaims() throws {
        let phone = Sodium.boxKeyPair(seed: Data(repeating: 1, count: 32)), laptop = Sodium.boxKeyPair(seed: Data(repeating: 2, count: 32))
        let box = Sealing.sealShare(zone: Self.zone, sender: "carol", device: Self.device, epoch: Self.epoch, key: Self.key, to: phone.publicKey)
        func open(_ box: Data, sender: String = "carol", epoch: Data = SealingTests.epoch, zone: ZoneName = SealingTests.zone,
                  device: (publicKey: Data, secretKey: Data)) throws(Sealing.Failure) -> Data {
            try Sealing.openShare(box, zone: zone, sender: sender, device: Self.device, epoch: epoch, publicKey: device.publicKey, secretKey: device.secretKey)
        }
        #expect(try open(box, device: phone) == Self.key)
        #expect(throws: Sealing.Failure.notAuthentic) { try open(box, device: laptop) }
        #expect(throws: Sealing.Failure.notAuthentic) { try open(box, sender: "mallory", device: phone) }
        #expect(throws: Sealing.Failure.notAuthentic) { try open(box, epoch: Data(repeating: 0, count: 16), device: phone) }
        #expect(throws: Sealing.Failure.notAuthentic) { try open(box, zone: try ZoneName("g-4c26d9074c27d89e-ffffffffffffffff"), device: phone) }
        for index in box.indices {
            var changed = box
            changed[index] ^= 0x80
            #expect(throws: Sealing.Failure.notAuthentic, "byte \(index)") { try open(changed, device: phone) }
        }
    }
}
