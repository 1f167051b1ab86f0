import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// The trust model as a hostile participant tries it: owners come from record IDs.
@Suite struct TrustTests {
    /// Bob, a participant, signs versions of alice's message, member and receipt records with
    /// his own key — rewritten to name himself, or tombstones with the largest clock. The backend
    /// refuses them; planted past it anyway, every store refuses them and the originals stay.
    @Test(arguments: ChatBackend.allCases)
    func aParticipantCannotRewriteOrEraseTheOthersRecords(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let sent = try await alice.send("the original", to: "bob")
        try await syncAll([alice, bob])
        let reply = try await bob.send("a reply", to: "alice")
        try await syncAll([alice, bob])
        try await alice.markAsRead(reply.id)
        try await syncAll([alice, bob])
        #expect(try bob.message(reply.id)?.readAt != nil)

        let bobKey = try fixture.key(of: "bob")
        let zone = try ZoneName(sent.id.conversation)
        let top = RecordClock(rawValue: .max - 1)
        func hostile(_ name: String, _ type: String, _ fields: [String: FieldValue], deleted: Bool = false) throws -> Record {
            var record = Record(id: try RecordID(zone: zone, name: name), type: type, fields: fields)
            record.isDeleted = deleted
            try record.sign(with: bobKey, clock: top)
            return record
        }
        let spokenAt = FieldValue.date(milliseconds: 1_800_000_000_000)
        let receiptName = "r.\(OwnershipRule.identityHash("alice")).\(reply.id.name)"
        let forged = [
            try hostile(sent.id.name, "Message", ["speaker": .string("bob"), "listener": .string("alice"), "content": .string("bob was here"), "spokenAt": spokenAt]),
            try hostile(sent.id.name, "Message", ["speaker": .string("alice")], deleted: true),
            try hostile(sent.id.name, "Message", ["speaker": .string("bob")], deleted: true),
            try hostile("member-alice", "ConversationMember", ["speaker": .string("alice"), "participants": .list([.string("alice"), .string("bob")])], deleted: true),
            try hostile(receiptName, "Receipt", ["reader": .string("alice"), "message": .string(reply.id.name), "readAt": .date(milliseconds: 0)]),
            try hostile(receiptName, "Receipt", ["reader": .string("alice")], deleted: true),
        ]
        let results = try await fixture.rawBackend("bob", key: bobKey).save(forged)
        for (record, result) in zip(forged, results) {
            guard case .failure(let error) = result else {
                Issue.record("the backend accepted bob's version of \(record.id)")
                continue
            }
            #expect(error.code == .notAuthorized, "\(record.id): \(error)")
        }

        for record in forged { try await fixture.plant(try record.encoded(), in: zone) }
        try await syncAll([alice, bob])
        for store in [alice, bob] {
            #expect(try store.message(sent.id)?.content == "the original")
            #expect(try store.message(reply.id)?.readAt != nil)
            let conversation = try #require(try store.conversations().first)
            #expect(conversation.startedBy == "alice")
            #expect(try store.quarantine().count == forged.count)
        }
    }

    /// A hostile device in a shared folder publishes a forged `alice` profile with its own key,
    /// under a device name that sorts before hers or after it. A fresh reader never takes it for
    /// alice: without a pin it sees a conflict and holds her records back until the app trusts a
    /// fingerprint; with a ref carrying her key it pins that key and refuses the forgery.
    @Test(arguments: ["aaa-forger", "zzz-forger"])
    func aForgedProfileNeverBecomesTheSpeakerForAFreshReader(_ forgerDevice: String) async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice")
        try await alice.send("really me", to: "bob")
        try await alice.sync()
        let mallory = SigningKey.generate()
        // The profile and its directory copy, both forged.
        let forged = try [try ChatFixture.speakerZone("alice"), try ZoneName("speakers")].map { zone in
            var forged = Record(id: try RecordID(zone: zone, name: "alice"), type: "Speaker", fields: ["name": .string("Mallory as Alice"), "tags": .list([])])
            try forged.sign(with: mallory, clock: HybridLogicalClock().now())
            return forged
        }
        let forger = try FileSystemBackend(root: fixture.folder, device: forgerDevice, policy: RecordPolicy())
        _ = try await forger.save(forged).map { try $0.get() }

        // Bob, with no pin: a conflict, nothing of alice's shown, until he trusts her fingerprint.
        let bob = try await fixture.store("bob")
        try await bob.sync()
        #expect(bob.trust(of: "alice") == .conflicted)
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "alice"))?.name != "Mallory as Alice")
        #expect(try bob.existingConversation(with: "alice").map { try bob.messages(in: $0.id).messages.isEmpty } ?? true)
        let real = KeyChain.fingerprint(identity: "alice", key: try #require(alice.localPublicKey))
        #expect(try Set(bob.candidateFingerprints(for: "alice")) == [real, KeyChain.fingerprint(identity: "alice", key: mallory.publicKey)])
        await #expect(throws: ConversationError.self) { try await bob.trust("alice", fingerprint: "00000 00000 00000 00000 00000 00000 00000 00000 00000 00000 00000 00000") }
        try await bob.trust("alice", fingerprint: real)
        #expect(bob.trust(of: "alice") == .verified)
        let seen = try #require(try bob.speaker(fromRef: SpeakerRef(identifier: "alice")))
        #expect(seen.name == "Alice" && seen.fingerprint == real && seen.trust == .verified)
        let conversation = try #require(try bob.existingConversation(with: "alice"))
        // Alice wrote before bob's device existed: her message waits for its key until she has
        // seen his device's key (her next sync) and he has synced after.
        #expect(try bob.messages(in: conversation.id).messages.map(\.isWaitingForKey) == [true])
        try await alice.sync()
        try await bob.sync()
        #expect(try bob.messages(in: conversation.id).messages.map(\.content) == ["really me"])
        try await bob.sync()
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "alice"))?.name == "Alice")

        // Carol starts from alice's ref (a contact card): the ref's key is pinned, the forgery refused.
        let carol = try await fixture.store("carol")
        let ref = try #require(try alice.localSpeaker?.speakerRef)
        #expect(ref.publicKey == alice.localPublicKey)
        try await carol.conversation(with: ref)
        try await carol.sync()
        #expect(carol.trust(of: "alice") == .verified)
        #expect(try carol.speaker(fromRef: ref)?.name == "Alice")
        #expect(try carol.quarantine().contains { $0.reason.contains("does not speak for 'alice'") })
        // A ref with another key than the pinned one is an error, not a silent switch.
        await #expect(throws: ConversationError.self) { try await carol.conversation(with: SpeakerRef(identifier: "alice", publicKey: mallory.publicKey)) }
    }

    /// The forger pads its device's folder so that its forged profile and alice's real one fall
    /// in different pages of a fresh reader's pull: still a conflict, never a first-use pin.
    @Test func aForgedProfileSplitFromTheRealOneByPaddingIsStillAConflict() async throws {
        let fixture = try await ChatFixture(.filesystem)
        // Bob has synced before and has nothing to push: his next sync only pulls, page by page.
        var small = StoreConfiguration()
        small.pageSize = 20
        let bob = try await fixture.store("bob", configuration: small)
        try await bob.conversation(with: "alice")
        try await bob.sync()
        let alice = try await fixture.store("alice")
        try await alice.sync()
        let forger = try FileSystemBackend(root: fixture.folder, device: "aaa-forger", policy: RecordPolicy())
        let clock = HybridLogicalClock()
        var forged = Record(id: try RecordID(zone: try ChatFixture.speakerZone("alice"), name: "alice"), type: "Speaker", fields: ["name": .string("Mallory as Alice"), "tags": .list([])])
        try forged.sign(with: SigningKey.generate(), clock: clock.now())
        let padding = try (0..<120).map { index in
            var pad = Record(id: try RecordID(zone: try ChatFixture.speakerZone("alice"), name: "pad-\(index)"), type: "Speaker", fields: ["name": .string("pad"), "tags": .list([])])
            try pad.sign(with: SigningKey.generate(), clock: clock.now())
            return pad
        }
        _ = try await forger.save([forged] + padding).map { try $0.get() }

        #expect(try bob.pendingChangeCount() == 0)
        try await bob.sync()
        #expect(bob.trust(of: "alice") == .conflicted)
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "alice"))?.name != "Mallory as Alice")
        #expect(try bob.candidateFingerprints(for: "alice").count == 2)
    }

    /// A zone server restored from a mixed backup holds two profiles of dave, never registered
    /// there, with two keys, and a message from him. Bob's store holds dave back as a conflict —
    /// with the records' bytes, over HTTP too — so once bob trusts dave's fingerprint the message
    /// shows, instead of being lost behind a token that moved past it.
    @Test func recordsHeldBackOverHTTPComeBackOnceTheKeyIsTrusted() async throws {
        let fixture = try await ChatFixture(.http)
        let bob = try await fixture.store("bob")
        let conversation = try await bob.conversation(with: "dave")
        try await bob.sync()
        let dave = SigningKey.generate(), impostor = SigningKey.generate()
        let clock = HybridLogicalClock()
        func profile(_ key: SigningKey, _ name: String) throws -> Record {
            var record = Record(id: try RecordID(zone: try ChatFixture.speakerZone("dave"), name: "dave"), type: "Speaker", fields: ["name": .string(name), "tags": .list([])])
            try record.sign(with: key, clock: clock.now())
            return record
        }
        var message = Record(id: try RecordID(zone: conversation.id, name: "m.\(OwnershipRule.identityHash("dave")).0001"), type: "Message", fields: [
            "speaker": .string("dave"), "listener": .string("bob"), "content": .string("hi bob, it's dave"), "spokenAt": .date(milliseconds: 1_800_000_000_000),
        ])
        try message.sign(with: dave, clock: clock.now())
        try await #require(fixture.zoneServer).storage.createZone(try ChatFixture.speakerZone("dave"))
        try await fixture.plant(try profile(dave, "Dave").encoded(), in: try ChatFixture.speakerZone("dave"))
        try await fixture.plant(try profile(impostor, "Not Dave").encoded(), in: try ChatFixture.speakerZone("dave"))
        try await fixture.plant(try message.encoded(), in: try ZoneName(conversation.id))

        try await bob.sync()
        #expect(bob.trust(of: "dave") == .conflicted)
        #expect(try bob.messages(in: conversation.id).messages.isEmpty)
        let real = KeyChain.fingerprint(identity: "dave", key: dave.publicKey)
        #expect(try bob.candidateFingerprints(for: "dave").contains(real))
        try await bob.trust("dave", fingerprint: real)
        #expect(try bob.messages(in: conversation.id).messages.map(\.content) == ["hi bob, it's dave"])
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "dave"))?.name == "Dave")
    }
}
