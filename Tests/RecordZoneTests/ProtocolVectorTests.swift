import ChatSchema
import Foundation
import Testing
@testable import RecordZone

/// The test vectors of `docs/PROTOCOL.md` (`docs/test-vectors.json`): records signed with fixed
/// keys, their canonical bytes and signatures; signed requests, their signed text and header.
/// An independent client checks itself against the file; this test checks the file against the
/// code. Regenerate it after a format change with `CONVKIT_WRITE_VECTORS=1 swift test --filter ProtocolVectorTests`.
@Suite struct ProtocolVectorTests {
    struct Vectors: Codable, Equatable {
        struct RecordVector: Codable, Equatable {
            var description: String
            var seedHex: String
            var publicKeyHex: String
            var json: String
            var canonicalHex: String
            var signatureHex: String
        }
        struct RequestVector: Codable, Equatable {
            var description: String
            var seedHex: String
            var identity: String
            var method: String
            var path: String
            var query: [[String]]
            var bodyHex: String
            var timestampMilliseconds: Int64
            var nonceHex: String
            var signedText: String
            var authorization: String
        }
        /// An introduction (§4.6): who vouches for whose key, and its text.
        struct IntroductionVector: Codable, Equatable {
            var description: String
            var introducerSeedHex: String
            var introducer: String
            var introduced: String
            var keyHex: String
            var signedHex: String
            var text: String
        }
        /// A group's changes (§3.1) in the order they arrived, and what every reader decides.
        struct GroupVector: Codable, Equatable {
            struct Change: Codable, Equatable {
                var name: String
                /// The record's clock, the unsigned 64-bit integer in decimal.
                var clock: String
                var actor: String
                var action: String
                var targets: [String]
                var groupName: String?
                /// A `create`'s history setting, when it sets one.
                var history: String?
                /// A `describe`'s description, when it sets one.
                var groupDescription: String?
            }
            struct MemberAt: Codable, Equatable {
                var speaker: String
                var clock: String
                var member: Bool
            }
            /// Whether a reader reads a version of the group's (not a change) at a clock.
            struct ReadAt: Codable, Equatable {
                var reader: String
                var clock: String
                var reads: Bool
            }
            var description: String
            var zone: String
            var arrived: [Change]
            /// Names in the order decided, with the decision.
            var decided: [String]
            var accepted: [Bool]
            var roles: [String: String]
            var groupName: String?
            var memberAt: [MemberAt]
            var readAt: [ReadAt]
        }
        /// A sealed message and a key share (§3.2), from fixed keys: a client that derives the
        /// same box keys, opens `shareBoxHex` to `shareTextHex` and `sealedHex` to
        /// `plaintextHex` reads what we write.
        struct EncryptionVector: Codable, Equatable {
            var description: String
            /// The sending device (alice, also her identity key) and the recipient device (bob).
            var senderSeedHex: String
            var recipientSeedHex: String
            /// Each device's X25519 pair, derived from its Ed25519 seed.
            var senderBoxPublicKeyHex: String
            var recipientBoxPublicKeyHex: String
            var recipientBoxSecretKeyHex: String
            /// Alice's EncryptionKey record, signed by her device.
            var encryptionKeyRecordHex: String
            var zone: String
            var epochHex: String
            var senderKeyHex: String
            var nonceHex: String
            /// The canonical encoding of the unsigned record of the sealed fields, before padding.
            var plaintextHex: String
            var additionalDataHex: String
            var sealedHex: String
            /// The message record with `sealed` in place of `content`, signed by alice.
            var messageRecordHex: String
            /// What the share seals, and a box of it sealed to bob's device (random: a writer
            /// makes a new one each time; this one opens to `shareTextHex`).
            var shareTextHex: String
            var shareBoxHex: String
            /// Alice's KeyShare record for bob carrying that box, signed by her device.
            var keyShareRecordHex: String
        }
        /// A file (§3.4): its bytes by a rule (byte i is i mod 251), its key, each chunk's nonce,
        /// the SHA-256 and size of each encrypted chunk (its asset), and the last (short) chunk
        /// encrypted in full; then the manifest's fields as the message seals them.
        struct AttachmentVector: Codable, Equatable {
            struct Chunk: Codable, Equatable {
                var nonceHex: String
                var sha256Hex: String
                var size: Int
            }
            var description: String
            var fileSize: Int
            var chunkSize: Int
            var fileKeyHex: String
            var additionalDataHex: String
            var chunks: [Chunk]
            var lastChunkSealedHex: String
            /// The canonical encoding of an unsigned Message record holding just the manifest's
            /// fields (what a message with this file seals besides its content).
            var manifestFieldsRecordHex: String
        }
        /// Bytes every reader refuses, and why (the decoder's words).
        /// A recovery record (§3.3): the code, what Argon2id makes of it, and the box.
        struct RecoveryVector: Codable, Equatable {
            var description: String
            var identity: String
            var identitySeedHex: String
            var codeText: String
            var codeHex: String
            var saltHex: String
            var opsLimit: Int64
            var memLimit: Int64
            var derivedKeyHex: String
            var nonceHex: String
            var plaintextHex: String
            var boxHex: String
            var recordHex: String
        }
        /// A frame of the stream (§2.4), as it travels: its length, then its JSON.
        struct StreamFrameVector: Codable, Equatable {
            var description: String
            var json: String
            var hex: String
        }
        struct RefusedVector: Codable, Equatable {
            var description: String
            var hex: String
            var reason: String
        }
        var records: [RecordVector]
        var requests: [RequestVector]
        var introductions: [IntroductionVector]
        var groups: [GroupVector]
        var encryption: [EncryptionVector]
        var recovery: [RecoveryVector]
        var attachments: [AttachmentVector]
        var refused: [RefusedVector]
        var stream: [StreamFrameVector]
    }

    static func key(_ byte: UInt8) throws -> SigningKey { try SigningKey(seed: Data(repeating: byte, count: 32)) }

    /// Carol's group: two admins who remove each other, a change dated before the creation, a
    /// creation by someone the zone does not name, a removal of the creator, a change by a
    /// demoted admin, a rename, a leave, a description by carol and one by bob before he was an
    /// admin — arriving newest first.
    /// - Parameter history: the creation's history setting (nil: none set, the default).
    static func groupVector(history: GroupMembership.History? = nil) throws -> Vectors.GroupVector {
        let zone = try #require(GroupMembership.zone(creator: "carol", random: "00112233aabbccdd"))
        var salt = 0
        func change(_ actor: String, _ ms: UInt64, _ action: GroupChange.Action, _ targets: [String] = [], name: String? = nil) -> GroupChange {
            salt += 1
            let clock = RecordClock(milliseconds: 1_700_000_000_000 + ms, counter: 0)
            return GroupChange(name: GroupChange.recordName(actor: actor, clock: clock, random: String(format: "%016x", salt)), actor: actor, clock: clock,
                               action: action, targets: targets, groupName: name, history: action == .create ? history : nil)
        }
        func describe(_ actor: String, _ ms: UInt64, _ text: String) -> GroupChange {
            salt += 1
            let clock = RecordClock(milliseconds: 1_700_000_000_000 + ms, counter: 0)
            return GroupChange(name: GroupChange.recordName(actor: actor, clock: clock, random: String(format: "%016x", salt)), actor: actor, clock: clock,
                               action: .describe, groupDescription: text)
        }
        let changes = [
            change("carol", 100, .create, ["alice", "bob"], name: "Trip"), change("carol", 110, .promote, ["alice"]), change("carol", 111, .promote, ["bob"]),
            change("alice", 200, .remove, ["bob"]), change("bob", 201, .remove, ["alice"]), change("mallory", 90, .create, ["mallory"], name: "Mine"),
            change("carol", 95, .add, ["dave"]), change("dave", 210, .add, ["erin"]), change("carol", 220, .demote, ["alice"]),
            change("alice", 221, .add, ["frank"]), change("alice", 150, .remove, ["carol"]), change("alice", 160, .add, ["dave"]),
            change("dave", 230, .leave), change("alice", 170, .rename, name: "Trip 2027"),
            describe("carol", 105, "Hiking in May"), describe("bob", 106, "Bob's group"),
        ]
        let arrived = Array(changes.reversed())
        let group = try #require(GroupMembership(zone: zone, changes: arrived))
        let at = { (ms: UInt64) in String(RecordClock(milliseconds: 1_700_000_000_000 + ms, counter: 0).rawValue) }
        let memberAt = [("bob", 150, true), ("bob", 200, false), ("dave", 160, false), ("dave", 161, true), ("dave", 230, false), ("alice", 300, true), ("erin", 300, false)]
        let readAt = [("dave", 50, false), ("dave", 161, true), ("dave", 229, true), ("dave", 231, false), ("alice", 99, false), ("alice", 300, true),
                      ("bob", 150, true), ("bob", 250, false), ("erin", 150, false), ("frank", 150, false)]
        let clock = { (ms: Int) in RecordClock(milliseconds: 1_700_000_000_000 + UInt64(ms), counter: 0) }
        return .init(description: "carol's group g-<h(carol)>-00112233aabbccdd\(history.map { " (history: \($0.rawValue))" } ?? ""), its changes arriving newest first",
                     zone: zone.rawValue,
                     arrived: arrived.map { .init(name: $0.name, clock: String($0.clock.rawValue), actor: $0.actor, action: $0.action.rawValue, targets: $0.targets,
                                                  groupName: $0.groupName, history: $0.history?.rawValue, groupDescription: $0.groupDescription) },
                     decided: group.decisions.map(\.change.name), accepted: group.decisions.map { $0.decision == .accepted },
                     roles: group.roles.mapValues(\.rawValue), groupName: group.name,
                     memberAt: memberAt.map { .init(speaker: $0.0, clock: at(UInt64($0.1)), member: group.isMember($0.0, at: RecordClock(milliseconds: 1_700_000_000_000 + UInt64($0.1), counter: 0))) },
                     readAt: readAt.map { .init(reader: $0.0, clock: String(clock($0.1).rawValue), reads: group.mayRead($0.0, at: clock($0.1))) })
    }

    /// - Parameter shareBox: the sealed box of the stored file (a sealed box is random); a new
    ///   one when nil.
    static func encryptionVector(shareBox: Data?) throws -> Vectors.EncryptionVector {
        let alice = try key(1), bob = try key(2)
        let aliceBox = EncryptionKey.boxKeys(forDeviceSeed: alice.seed), bobBox = EncryptionKey.boxKeys(forDeviceSeed: bob.seed)
        let clock = RecordClock(milliseconds: 1_700_000_000_000, counter: 3)
        var encryptionKey = try EncryptionKey.record(identity: "alice", device: alice.publicKey, key: aliceBox.publicKey)
        try encryptionKey.sign(with: alice, clock: clock)
        let zone = try ZoneName("c-\(OwnershipRule.identityHash("alice"))-\(OwnershipRule.identityHash("bob"))")
        let epoch = Data((0x10..<0x20).map { UInt8($0) }), senderKey = Data((0x20..<0x40).map { UInt8($0) }), nonce = Data((0x40..<0x58).map { UInt8($0) })
        let name = "m.\(OwnershipRule.identityHash("alice")).0000018bcfe56800-0123456789abcdef"
        let message = Record(id: try RecordID(zone: zone, name: name), type: "Message", fields: [
            "speaker": .string("alice"), "listener": .string("bob"), "content": .string("Hi Bob! ☕"), "spokenAt": .date(milliseconds: 1_700_000_000_000),
        ])
        var sealed = try Sealing.seal(["content"], of: message, sender: "alice", device: alice.publicKey, epoch: epoch, key: senderKey, nonce: nonce)
        try sealed.sign(with: alice, clock: RecordClock(milliseconds: 1_700_000_000_000, counter: 4))
        let plaintext = try Record(id: message.id, type: "Message", fields: ["content": .string("Hi Bob! ☕")]).encoded()
        let shareText = Sealing.shareText(zone: zone, sender: "alice", device: alice.publicKey, epoch: epoch, key: senderKey)
        let box = shareBox ?? Sealing.sealShare(zone: zone, sender: "alice", device: alice.publicKey, epoch: epoch, key: senderKey, to: bobBox.publicKey)
        var share = try KeyShare.record(zone: zone, sender: "alice", recipient: "bob", epoch: epoch, boxes: [(bob.publicKey, box)])
        try share.sign(with: alice, clock: RecordClock(milliseconds: 1_700_000_000_000, counter: 2))
        return .init(description: "alice (seed 01…) seals 'Hi Bob! ☕' to bob (seed 02…) and shares her sender key with his device",
                     senderSeedHex: alice.seed.hexString, recipientSeedHex: bob.seed.hexString, senderBoxPublicKeyHex: aliceBox.publicKey.hexString,
                     recipientBoxPublicKeyHex: bobBox.publicKey.hexString, recipientBoxSecretKeyHex: bobBox.secretKey.hexString,
                     encryptionKeyRecordHex: try encryptionKey.encoded().hexString, zone: zone.rawValue, epochHex: epoch.hexString,
                     senderKeyHex: senderKey.hexString, nonceHex: nonce.hexString, plaintextHex: plaintext.hexString,
                     additionalDataHex: Sealing.messageContext(zone: zone, name: name, type: "Message", sender: "alice", device: alice.publicKey).hexString,
                     sealedHex: try #require(sealed[Sealing.sealedField]?.bytesValue).hexString, messageRecordHex: try sealed.encoded().hexString,
                     shareTextHex: shareText.hexString, shareBoxHex: box.hexString, keyShareRecordHex: try share.encoded().hexString)
    }

    /// The bytes of the attachment vector's file: byte i is i mod 251.
    static func attachmentFile(size: Int) -> Data { Data((0..<size).map { UInt8($0 % 251) }) }

    static func attachmentVector() throws -> Vectors.AttachmentVector {
        let size = AttachmentManifest.chunkSize + 100, file = attachmentFile(size: size), key = Data((0x80..<0xA0).map { UInt8($0) })
        let count = AttachmentManifest.chunkCount(size: Int64(size))
        let sealed = (0..<count).map { index in
            AttachmentManifest.sealChunk(file.subdata(in: (index * AttachmentManifest.chunkSize)..<min(size, (index + 1) * AttachmentManifest.chunkSize)), index: index, key: key)
        }
        let nonce = { (index: Int) in Data(repeating: 0, count: 16) + withUnsafeBytes(of: UInt64(index).bigEndian) { Data($0) } }
        let manifest = AttachmentManifest(name: "report.pdf", mediaType: "application/pdf", size: Int64(size), key: key, chunks: sealed.map { AssetReference(for: $0) })
        let zone = try ZoneName("c-\(OwnershipRule.identityHash("alice"))-\(OwnershipRule.identityHash("bob"))")
        let fields = Record(id: try RecordID(zone: zone, name: "m.\(OwnershipRule.identityHash("alice")).0000018bcfe56800-0123456789abcdef"), type: "Message",
                            fields: manifest.recordFields)
        return .init(description: "a file of 1,048,676 bytes (byte i is i mod 251) in two chunks, with the key 80 81 … 9F",
                     fileSize: size, chunkSize: AttachmentManifest.chunkSize, fileKeyHex: key.hexString, additionalDataHex: Data("convkit-attachment-v1".utf8).hexString,
                     chunks: sealed.enumerated().map { .init(nonceHex: nonce($0.offset).hexString, sha256Hex: Sodium.sha256($0.element).hexString, size: $0.element.count) },
                     lastChunkSealedHex: try #require(sealed.last).hexString, manifestFieldsRecordHex: try fields.encoded().hexString)
    }

    static func recoveryVector() throws -> Vectors.RecoveryVector {
        let alice = try key(1)
        let code = Data((0xA0..<0xC0).map { UInt8($0) }), salt = Data((0x60..<0x70).map { UInt8($0) }), nonce = Data((0x70..<0x88).map { UInt8($0) })
        // Argon2id's "interactive" cost keeps the vector quick to check; a store writes "moderate" (3, 256 MiB).
        let ops: UInt64 = 2, mem: UInt64 = 67_108_864
        var record = try Recovery.record(identity: "alice", seed: alice.seed, code: code, opsLimit: ops, memLimit: mem, salt: salt, nonce: nonce)
        try record.sign(with: alice, clock: RecordClock(milliseconds: 1_700_000_000_000, counter: 5))
        let derived = try #require(Sodium.passwordKey(code, salt: salt, opsLimit: ops, memLimit: mem))
        return .init(description: "alice (seed 01…) wraps her identity key with the code A0 A1 … BF", identity: "alice", identitySeedHex: alice.seed.hexString,
                     codeText: Recovery.text(of: code), codeHex: code.hexString, saltHex: salt.hexString, opsLimit: Int64(ops), memLimit: Int64(mem),
                     derivedKeyHex: derived.hexString, nonceHex: nonce.hexString, plaintextHex: Recovery.plaintext(identity: "alice", seed: alice.seed).hexString,
                     boxHex: try #require(record[Recovery.boxField]?.bytesValue).hexString, recordHex: try record.encoded().hexString)
    }

    static func computed(shareBox: Data? = nil) throws -> Vectors {
        let alice = try key(1)
        let zone = try ZoneName("c-0123456789abcdef-fedcba9876543210")
        func vector(_ description: String, _ record: Record, seed: UInt8) throws -> Vectors.RecordVector {
            let encoded = try record.encoded()
            return .init(description: description, seedHex: Data(repeating: seed, count: 32).hexString, publicKeyHex: record.authorKey.hexString,
                         json: String(decoding: try record.json(), as: UTF8.self), canonicalHex: encoded.hexString, signatureHex: record.signature.hexString)
        }
        // Named as chat writers name messages: m.<h(speaker)>.<16 hex of the clock>-<16 hex random>.
        let messageClock = RecordClock(milliseconds: 1_700_000_000_000, counter: 1)
        let clockHex = String(messageClock.rawValue, radix: 16)
        let messageName = "m.\(OwnershipRule.identityHash("alice")).\(String(repeating: "0", count: 16 - clockHex.count) + clockHex)-0123456789abcdef"
        var message = Record(id: try RecordID(zone: zone, name: messageName), type: "Message", fields: [
            "speaker": .string("alice"), "listener": .string("bob"), "content": .string("Hi Bob! ☕"), "spokenAt": .date(milliseconds: 1_700_000_000_000),
        ])
        try message.sign(with: alice, clock: messageClock)
        var everyType = Record(id: try RecordID(zone: zone, name: "every-type"), type: "Sample", fields: [
            "string": .string("text"), "int": .int(-42), "double": .double(1.5), "bool": .bool(true), "date": .date(milliseconds: 1_700_000_000_123),
            "bytes": .bytes(Data([0, 1, 2, 255])), "reference": .reference(try RecordID(zone: zone, name: "other")),
            "asset": .asset(try AssetReference(hash: Sodium.sha256(Data("asset".utf8)), size: 5)),
            "list": .list([.string("a"), .int(1)]),
        ])
        try everyType.sign(with: alice, clock: RecordClock(milliseconds: 1_700_000_000_000, counter: 2))
        let tombstone = try message.tombstone(keeping: ["speaker"], signedWith: alice, clock: RecordClock(milliseconds: 1_700_000_000_500, counter: 0))
        // A reaction to that message, its emoji sealed with the encryption vector's epoch, sender
        // key and nonce (§3.2: AD with type "Reaction" and the reactor).
        let reaction = Record(id: try RecordID(zone: zone, name: "x.\(OwnershipRule.identityHash("alice")).\(messageName)"), type: "Reaction", fields: [
            "reactor": .string("alice"), "message": .string(messageName), "emoji": .string("👍"), "reactedAt": .date(milliseconds: 1_700_000_000_600),
        ])
        var sealedReaction = try Sealing.seal(["emoji"], of: reaction, sender: "alice", device: alice.publicKey, epoch: Data((0x10..<0x20).map { UInt8($0) }),
                                              key: Data((0x20..<0x40).map { UInt8($0) }), nonce: Data((0x40..<0x58).map { UInt8($0) }))
        try sealedReaction.sign(with: alice, clock: RecordClock(milliseconds: 1_700_000_000_600, counter: 0))
        // A reply to it: content and replyTo sealed together, as one inner record.
        let reply = Record(id: try RecordID(zone: zone, name: "m.\(OwnershipRule.identityHash("alice")).0000018bcfe56c4c-fedcba9876543210"), type: "Message", fields: [
            "speaker": .string("alice"), "listener": .string("bob"), "content": .string("and cake, @bob"), "replyTo": .string(messageName),
            "mentions": .list([.string("10:4:bob")]),
            "spokenAt": .date(milliseconds: 1_700_000_000_700),
        ])
        var sealedReply = try Sealing.seal(["content", "replyTo", "mentions"], of: reply, sender: "alice", device: alice.publicKey, epoch: Data((0x10..<0x20).map { UInt8($0) }),
                                           key: Data((0x20..<0x40).map { UInt8($0) }), nonce: Data((0x40..<0x58).map { UInt8($0) }))
        try sealedReply.sign(with: alice, clock: RecordClock(milliseconds: 1_700_000_000_700, counter: 0))
        // An app's poll, edited once: its fallback text, custom type and data, and the text before
        // the edit with its time, sealed together.
        let poll = Record(id: try RecordID(zone: zone, name: "m.\(OwnershipRule.identityHash("alice")).0000018bcfe56c4d-0123456789abcdef"), type: "Message", fields: [
            "speaker": .string("alice"), "listener": .string("bob"), "content": .string("Poll: cake or pie?"),
            "customType": .string("com.example.poll"), "customData": .bytes(Data(#"{"options":["cake","pie"]}"#.utf8)),
            "history": .list([.string("Poll: cake?")]), "historyTimes": .list([.date(milliseconds: 1_700_000_000_800)]),
            "spokenAt": .date(milliseconds: 1_700_000_000_800), "editedAt": .date(milliseconds: 1_700_000_000_900),
        ])
        var sealedPoll = try Sealing.seal(["content", "customType", "customData", "history", "historyTimes"], of: poll, sender: "alice", device: alice.publicKey,
                                          epoch: Data((0x10..<0x20).map { UInt8($0) }), key: Data((0x20..<0x40).map { UInt8($0) }), nonce: Data((0x40..<0x58).map { UInt8($0) }))
        try sealedPoll.sign(with: alice, clock: RecordClock(milliseconds: 1_700_000_000_900, counter: 0))
        // Bob's device says it holds three of alice's messages, the newest the poll above.
        let bobDevice = try key(2)
        var delivery = Record(id: try RecordID(zone: zone, name: "d.\(OwnershipRule.identityHash("bob")).\(bobDevice.publicKey.prefix(8).hexString)"), type: "Delivery", fields: [
            "member": .string("bob"), "held": .list([.string("3:\(poll.id.name)")]),
        ])
        try delivery.sign(with: bobDevice, clock: RecordClock(milliseconds: 1_700_000_001_000, counter: 0))
        // Alice blocks bob in their conversation.
        let pair = try ZoneName("c-\(OwnershipRule.identityHash("alice"))-\(OwnershipRule.identityHash("bob"))")
        var block = Record(id: try RecordID(zone: pair, name: "block-alice"), type: "Block", fields: ["blocker": .string("alice"), "blocked": .string("bob")])
        try block.sign(with: alice, clock: RecordClock(milliseconds: 1_700_000_002_000, counter: 0))
        func request(_ description: String, method: String, path: String, query: [(String, String)], body: Data) -> Vectors.RequestVector {
            let nonce = Data((0..<16).map { UInt8($0) })
            let timestamp: Int64 = 1_700_000_000_000
            let now = Date(timeIntervalSince1970: Double(timestamp) / 1000)
            let text = RequestSignature.message(identity: "alice", method: method, path: path, query: query, timestamp: timestamp, nonce: nonce, body: body)
            return .init(description: description, seedHex: Data(repeating: 1, count: 32).hexString, identity: "alice", method: method, path: path,
                         query: query.map { [$0.0, $0.1] }, bodyHex: body.hexString, timestampMilliseconds: timestamp, nonceHex: nonce.hexString,
                         signedText: String(decoding: text, as: UTF8.self),
                         authorization: RequestSignature.authorization(method: method, path: path, query: query, body: body, identity: "alice", key: alice, now: now, nonce: nonce))
        }
        let bob = try key(2)
        let introduction = Introduction.issue(of: "bob", key: bob.publicKey, by: "alice", signingKey: alice)
        // Canonical bytes written by hand: an unsigned record z/n of type T with these fields.
        func handmade(_ fields: [([UInt8], String)]) -> Data {
            var out: [UInt8] = Array("CKR".utf8) + [1, 0, 1] + Array("z".utf8) + [0, 1] + Array("n".utf8) + [0, 1] + Array("T".utf8)
            out += [0] + Array(repeating: 0, count: 8) + [0, 0, 0, 0, UInt8(fields.count)]
            for (key, value) in fields {
                out += [0, UInt8(key.count)] + key + [1, 0, 0, 0, UInt8(value.utf8.count)] + Array(value.utf8)
            }
            return Data(out + [0])
        }
        func refused(_ description: String, _ bytes: Data) -> Vectors.RefusedVector {
            let reason: String
            do { _ = try Record(canonical: bytes); reason = "accepted" } catch { reason = error.description }
            return .init(description: description, hex: bytes.hexString, reason: reason)
        }
        return Vectors(records: [
            try vector("a chat message (m.<h(alice)>.<id> in a conversation zone)", message, seed: 1),
            try vector("every field type, sorted by key", everyType, seed: 1),
            try vector("a tombstone keeping its owner field", tombstone, seed: 1),
            try vector("a reaction 👍 to that message (x.<h(alice)>.<message name>), its emoji sealed with epoch 10…1f, sender key 20…3f and nonce 40…57",
                       sealedReaction, seed: 1),
            try vector("a reply 'and cake, @bob' to that message mentioning bob (bytes 10–13), its content, replyTo and mentions sealed together (the same epoch, key and nonce: fixed for the vectors only; a writer draws a random nonce for every envelope)", sealedReply, seed: 1),
            try vector("an app's poll (customType com.example.poll, customData its JSON as bytes) edited once: 'Poll: cake?' became 'Poll: cake or pie?', the earlier text in history with its time in historyTimes; all sealed together (the same epoch, key and nonce)", sealedPoll, seed: 1),
            try vector("bob's device (seed 02…) holds 3 of alice's messages in the zone, the newest the poll above (d.<h(bob)>.<first 8 bytes of its key in hex>)", delivery, seed: 2),
            try vector("alice blocks bob in their conversation (c-<h(alice)>-<h(bob)>, block-alice): a zone server then refuses bob's records there but tombstones", block, seed: 1),
        ], requests: [
            request("a page of changes: query arguments sorted and percent-encoded", method: "GET", path: "/v1/zones/\(zone)/changes",
                    query: [("token", "AQID+/=="), ("limit", "200")], body: Data()),
            request("a JSON modify", method: "POST", path: "/v1/records/modify", query: [], body: Data(#"{"policy":"merge","records":[]}"#.utf8)),
            request("saying one types in a conversation (§2, Typing)", method: "PUT", path: "/v1/zones/c-0123456789abcdef-fedcba9876543210/typing", query: [],
                    body: Data(#"{"typing":true}"#.utf8)),
            request("who types there, waiting up to 25 s past version 17", method: "GET", path: "/v1/zones/c-0123456789abcdef-fedcba9876543210/typing",
                    query: [("since", "17"), ("timeout", "25")], body: Data()),
            request("saying one is online (§2, Presence)", method: "PUT", path: "/v1/presence", query: [], body: Data(#"{"online":true}"#.utf8)),
            request("whether bob and carol are online, in a zone, waiting up to 25 s past version 3", method: "GET",
                    path: "/v1/zones/c-0123456789abcdef-fedcba9876543210/presence", query: [("of", "bob,carol"), ("since", "3"), ("timeout", "25")], body: Data()),
            request("opening the stream (§2.4), sent with Connection: Upgrade and Upgrade: convkit-stream/1", method: "GET", path: "/v1/stream", query: [], body: Data()),
            request("a JSON modify asking for its catch-up (the client's database token in since)", method: "POST", path: "/v1/records/modify", query: [],
                    body: Data(#"{"policy":"merge","records":[],"since":"AQID+/=="}"#.utf8)),
        ], introductions: [
            .init(description: "alice (seed 01…) introduces bob's key (seed 02…)", introducerSeedHex: Data(repeating: 1, count: 32).hexString,
                  introducer: "alice", introduced: "bob", keyHex: bob.publicKey.hexString,
                  signedHex: Introduction.signed(introduced: "bob", key: bob.publicKey, introducer: "alice").hexString, text: introduction.text),
        ], groups: [try groupVector(), try groupVector(history: .all)], encryption: [try encryptionVector(shareBox: shareBox)], recovery: [try recoveryVector()], attachments: [try attachmentVector()], refused: [
            refused("a field key not in NFC: e + U+0301 (65 CC 81)", handmade([([0x65, 0xCC, 0x81], "a")])),
            refused("both spellings of é, in byte order: refused for the spelling, not as a repeat", handmade([([0x65, 0xCC, 0x81], "a"), ([0xC3, 0xA9], "b")])),
            refused("field keys out of byte order", handmade([(Array("b".utf8), "1"), (Array("a".utf8), "2")])),
            refused("a field key repeated", handmade([(Array("a".utf8), "1"), (Array("a".utf8), "2")])),
        ], stream: try streamVectors())
    }

    /// The stream's frames (§2.4), one of each kind.
    static func streamVectors() throws -> [Vectors.StreamFrameVector] {
        let zone = "c-0123456789abcdef-fedcba9876543210"
        let record = try #require(Data(hexString: "00"))
        let frames: [(String, Wire.StreamFrame)] = [
            ("follow the speakers directory from its beginning and a conversation from a token", .init(type: .follow, zones: ["speakers": nil, zone: ChangeToken(data: Data([1, 2, 3]))])),
            ("ask to be told of the database feed (following no more zones)", .init(type: .follow, zones: [:], feed: true)),
            ("a heartbeat (either side)", .init(type: .ping)),
            ("read the database feed: it may name a zone the stream does not follow", .init(type: .feed)),
            ("watch the conversation: who types there, and whether bob is online", .init(type: .watch, zone: zone, of: ["bob"])),
            ("the watched conversation now: bob types, and is online (last seen 2023-11-14T22:13:20Z)", .init(
                type: .live, zone: zone, typing: ["bob"], presence: [Wire.PresenceList.Entry(Presence(identity: "bob", isOnline: true, lastSeen: Date(timeIntervalSince1970: 1_700_000_000)))])),
            ("stop watching the conversation", .init(type: .unwatch, zone: zone)),
            ("a page of the conversation's changes after the token it was followed from: one record (its bytes here a placeholder: a real one is canonical and signed), then the token to keep", .init(
                type: .changes, zone: zone, since: ChangeToken(data: Data([1, 2, 3])), changes: Wire.Changes(records: [Wire.SignedRecord(bytes: record)], token: ChangeToken(data: Data([1, 2, 4])), moreComing: false))),
            ("the conversation is no longer followed: the identity may not read it", .init(
                type: .failed, zone: zone, error: Wire.Failure(RecordZoneError(.notAuthorized, "'carol' may not use zone '\(zone)'")))),
        ]
        return try frames.map { description, frame in
            let json = try frame.encoded()
            return .init(description: description, json: String(decoding: json, as: UTF8.self), hex: Wire.StreamFrame.framed(json).hexString)
        }
    }

    @Test func theVectorsInTheRepositoryAreWhatTheCodeProduces() throws {
        let file = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/test-vectors.json")
        let writing = ProcessInfo.processInfo.environment["CONVKIT_WRITE_VECTORS"] == "1"
        let held = writing ? nil : try JSONDecoder().decode(Vectors.self, from: Data(contentsOf: file))
        let computed = try Self.computed(shareBox: try held?.encryption.first.map { try #require(Data(hexString: $0.shareBoxHex)) })
        if writing {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            try encoder.encode(computed).write(to: file)
        }
        let stored = try JSONDecoder().decode(Vectors.self, from: Data(contentsOf: file))
        #expect(stored == computed)
        // The encryption vector opened from its bytes alone, as another client would: the box
        // with bob's derived key, the envelope with the key the box holds.
        for vector in stored.encryption {
            let hex = { (text: String) throws -> Data in try #require(Data(hexString: text)) }
            let shareText = try #require(Sodium.openSealed(try hex(vector.shareBoxHex), publicKey: try hex(vector.recipientBoxPublicKeyHex),
                                                           secretKey: try hex(vector.recipientBoxSecretKeyHex)))
            #expect(shareText.hexString == vector.shareTextHex)
            let senderKey = shareText.suffix(32), sealed = try hex(vector.sealedHex)
            #expect(senderKey.hexString == vector.senderKeyHex && sealed.prefix(17).dropFirst().hexString == vector.epochHex)
            let padded = try #require(Sodium.aeadDecrypt(sealed.dropFirst(41), additionalData: try hex(vector.additionalDataHex), nonce: sealed.dropFirst(17).prefix(24), key: senderKey))
            #expect(Sodium.unpad(padded, block: 256)?.hexString == vector.plaintextHex && padded.count % 256 == 0)
            let record = try Record(canonical: try hex(vector.messageRecordHex))
            #expect(record.hasValidSignature() && record["content"] == nil && record["sealed"]?.bytesValue == sealed)
        }
        // The attachment vector from its description alone: the file by its rule, each chunk
        // encrypted with the stated key, nonce and additional data, hashed; the last one opened.
        for vector in stored.attachments {
            let hex = { (text: String) throws -> Data in try #require(Data(hexString: text)) }
            let file = Self.attachmentFile(size: vector.fileSize), key = try hex(vector.fileKeyHex)
            for (index, chunk) in vector.chunks.enumerated() {
                let plain = file.subdata(in: (index * vector.chunkSize)..<min(vector.fileSize, (index + 1) * vector.chunkSize))
                let sealed = Sodium.aeadEncrypt(plain, additionalData: try hex(vector.additionalDataHex), nonce: try hex(chunk.nonceHex), key: key)
                #expect(Sodium.sha256(sealed).hexString == chunk.sha256Hex && sealed.count == chunk.size)
            }
            let last = try #require(vector.chunks.last)
            #expect(Sodium.aeadDecrypt(try hex(vector.lastChunkSealedHex), additionalData: try hex(vector.additionalDataHex), nonce: try hex(last.nonceHex), key: key)
                    == file.suffix(from: (vector.chunks.count - 1) * vector.chunkSize))
            let manifest = try #require(AttachmentManifest(record: try Record(canonical: try hex(vector.manifestFieldsRecordHex))))
            #expect(manifest.size == Int64(vector.fileSize) && manifest.chunks.map(\.hexHash) == vector.chunks.map(\.sha256Hex) && manifest.key == key)
        }
        // The recovery vector opened from its bytes alone: the code's text back to its bytes,
        // Argon2id, the secretbox, the identity key inside.
        for vector in stored.recovery {
            let hex = { (text: String) throws -> Data in try #require(Data(hexString: text)) }
            #expect(Recovery.code(from: vector.codeText)?.hexString == vector.codeHex)
            let derived = try #require(Sodium.passwordKey(try hex(vector.codeHex), salt: try hex(vector.saltHex), opsLimit: UInt64(vector.opsLimit), memLimit: UInt64(vector.memLimit)))
            #expect(derived.hexString == vector.derivedKeyHex)
            let opened = try #require(Sodium.secretboxOpen(try hex(vector.boxHex), nonce: try hex(vector.nonceHex), key: derived))
            #expect(opened.hexString == vector.plaintextHex && opened.suffix(32).hexString == vector.identitySeedHex)
            let record = try Record(canonical: try hex(vector.recordHex))
            let identityKey = try SigningKey(seed: opened.suffix(32))
            #expect(record.hasValidSignature() && record.authorKey == identityKey.publicKey)
            #expect(try Recovery.open(record, code: try hex(vector.codeHex)).publicKey == record.authorKey)
        }
        // And each stored record decodes and verifies from its bytes alone, as another client would.
        for vector in stored.records {
            let record = try Record(canonical: try #require(Data(hexString: vector.canonicalHex)))
            #expect(record.hasValidSignature() && record.signature.hexString == vector.signatureHex)
        }
        for vector in stored.introductions {
            let introduction = try Introduction(text: vector.text)
            #expect(introduction.introduced == vector.introduced && introduction.key.hexString == vector.keyHex)
        }
        // The group vector as the rule decides it by hand (§3.1): carol and alice remain, alice
        // demoted; bob's removal of alice, mallory's creation, the change before the creation,
        // dave's add, alice's add after her demotion and her removal of carol refused.
        for vector in stored.groups {
            #expect(vector.roles == ["carol": "creator", "alice": "member"] && vector.groupName == "Trip 2027")
            let refusedActions = zip(vector.decided, vector.accepted).filter { !$0.1 }.compactMap { name in vector.arrived.first { $0.name == name.0 } }
            #expect(refusedActions.map { "\($0.actor) \($0.action)" } == ["mallory create", "carol add", "bob describe", "alice remove", "bob remove", "dave add", "alice add"])
            #expect(vector.memberAt.map(\.member) == [true, false, false, true, false, true, false])
            // Runs: alice and carol from 100 on, bob 100–200, dave 160–230. Since added: inside a
            // run; all: before the reader's last run ended.
            let history = vector.arrived.compactMap(\.history).first
            #expect(vector.readAt.map(\.reads) == (history == "all" ? [true, true, true, false, true, true, true, false, false, false]
                                                                     : [false, true, true, false, false, true, true, false, false, false]))
            // Decoded from the readable values alone, as another client would.
            let changes = try vector.arrived.map { change in
                var record = Record(id: try RecordID(zone: try ZoneName(vector.zone), name: change.name), type: GroupChange.recordType, fields: [
                    "actor": .string(change.actor), "action": .string(change.action),
                ])
                if !change.targets.isEmpty { record.fields["targets"] = .list(change.targets.map { .string($0) }) }
                if let name = change.groupName { record.fields["name"] = .string(name) }
                if let history = change.history { record.fields["history"] = .string(history) }
                if let text = change.groupDescription { record.fields["description"] = .string(text) }
                record.clock = RecordClock(rawValue: try #require(UInt64(change.clock)))
                return try GroupChange(record: record)
            }
            let group = try #require(GroupMembership(zone: try ZoneName(vector.zone), changes: changes))
            #expect(group.decisions.map(\.change.name) == vector.decided && group.roles.mapValues(\.rawValue) == vector.roles)
            #expect(group.history.rawValue == (history ?? "since-added"))
            #expect(group.groupDescription == "Hiking in May")
            #expect(vector.readAt.allSatisfy { group.mayRead($0.reader, at: RecordClock(rawValue: UInt64($0.clock) ?? 0)) == $0.reads })
        }
        for vector in stored.refused {
            #expect(throws: RecordDecodingError.self, "\(vector.description)") { try Record(canonical: try #require(Data(hexString: vector.hex))) }
        }
    }
}
