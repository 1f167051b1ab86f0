import ConversationKit
import Foundation
@testable import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// End-to-end encryption in the store (docs/ENCRYPTION.md), over every backend: what a backend
/// holds of a conversation is sealed, member devices read it once synced, a message whose key
/// has not arrived waits for it and resolves by itself, and a member removed or a device
/// revoked reads nothing said after.
@Suite struct EncryptionTests {
    static let backends = ChatBackend.allCases

    /// Every message record a backend holds in `zone`, as a raw reader fetches it.
    static func messageRecords(in zone: String, _ fixture: ChatFixture) async throws -> [Record] {
        try await fixture.backendRecords(of: "Message", in: zone)
    }

    /// The places the backend keeps (``ChatFixture/keptBytes()``) that hold `text`, as UTF-8 or
    /// as the hex a database dump shows bytes in.
    static func places(_ kept: [(place: String, bytes: Data)], holding text: String) -> [String] {
        let needles = [Data(text.utf8), Data(Data(text.utf8).hexString.utf8)]
        return kept.filter { item in needles.contains { item.bytes.range(of: $0) != nil } }.map(\.place)
    }

    @Test(arguments: backends)
    func aPairConversationIsSealedOnTheBackendAndReadOnBothSides(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let sent = try await alice.send("the plan: meet at the old mill 🌵", to: "bob")
        try await syncAll([alice, bob])
        try await bob.send("see you there", to: "alice")
        let group = try await alice.createGroup(name: "Mill", members: ["bob"])
        try await alice.send("bring the lantern", toGroup: group.id)
        try await syncAll([alice, bob])
        #expect(try history(bob, group.id).map(\.content) == ["bring the lantern"])
        for store in [alice, bob] {
            #expect(try history(store, sent.id.conversation).map(\.content) == ["the plan: meet at the old mill 🌵", "see you there"])
            #expect(try history(store, sent.id.conversation).allSatisfy { !$0.isWaitingForKey })
        }
        let records = try await Self.messageRecords(in: sent.id.conversation, fixture)
        #expect(records.count == 2)
        for record in records {
            #expect(record["content"] == nil && record["sealed"]?.bytesValue != nil, "the backend holds no content in the clear")
        }
        // Byte by byte, in every file the backend keeps (the folder; the server's SQLite files; a
        // dump of its PostgreSQL database).
        if let kept = try await fixture.keptBytes() {
            #expect(!Self.places(kept, holding: "alice").isEmpty, "the search finds what is in the clear (identifiers)")
            #expect(!Self.places(kept, holding: "Mill").isEmpty, "the search finds what is in the clear (a group's name)")
            for text in ["old mill", "see you there", "lantern"] { #expect(Self.places(kept, holding: text).isEmpty, "\(text) is in \(Self.places(kept, holding: text))") }
        }
        // An edit is sealed again.
        try await alice.edit(sent.id, content: "the plan: the new mill")
        try await syncAll([alice, bob])
        #expect(try bob.message(sent.id)?.content == "the plan: the new mill")
        #expect(try await Self.messageRecords(in: sent.id.conversation, fixture).allSatisfy { $0["content"] == nil })
    }

    @Test func aMessageWhoseKeyIsNotHeldYetWaitsAndResolvesByItself() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        // Alice writes before she has ever seen bob's device: nothing is shared with it yet.
        let sent = try await alice.send("before we met", to: "bob")
        try await alice.sync()
        try await bob.sync()
        let waiting = try #require(try bob.message(sent.id))
        #expect(waiting.isWaitingForKey && waiting.content.isEmpty)
        // Alice learns of bob's device at her next sync and shares the key in the same sync.
        let events = bob.events()
        try await alice.sync()
        try await bob.sync()
        #expect(await awaitEvents(events, seconds: 5) { $0 == .messageChanged(sent.id) })
        let resolved = try #require(try bob.message(sent.id))
        #expect(!resolved.isWaitingForKey && resolved.content == "before we met")
        // Read again from scratch, it opens at once.
        try await bob.refetch(zone: sent.id.conversation)
        try await bob.sync()
        #expect(try bob.message(sent.id)?.content == "before we met")
    }

    /// Whether `store` opens a record with every key its device holds.
    static func opens(_ store: ConversationStore, _ record: Record?) throws -> Bool {
        do { return try store.decrypted(try #require(record))["content"] != nil } catch let error as ConversationError where error.code == .keyNotHeld { return false }
    }

    @Test(arguments: [ChatBackend.memory, .filesystem])
    func aRemovedMemberWithEveryKeyItHeldReadsNothingSaidAfter(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        let all = [alice, bob, carol]
        try await syncAll(all)
        let group = try await alice.createGroup(name: "Plans", members: ["bob", "carol"])
        try await syncAll(all)
        let before = try await alice.send("before carol left", toGroup: group.id)
        try await syncAll(all)
        #expect(try carol.message(before.id)?.content == "before carol left")
        try await alice.removeMember("carol", from: group.id)
        try await syncAll(all)
        let after = try await alice.send("after carol left", toGroup: group.id)
        try await syncAll(all)
        #expect(try bob.message(after.id)?.content == "after carol left")
        // Carol's device, with every key it ever held, opens the message before and not the one
        // after: alice made a new epoch without her.
        #expect(try Self.opens(carol, try alice.record(zone: group.id, name: before.id.name)))
        #expect(try !Self.opens(carol, try alice.record(zone: group.id, name: after.id.name)))
        let epoch = { (id: MessageID) in try Sealing.epoch(of: try #require(try alice.record(zone: group.id, name: id.name)?["sealed"]?.bytesValue)) }
        #expect(try epoch(before.id) != epoch(after.id))
    }

    /// A device linked after a sender left a group (and can write there no more) reads what
    /// that sender said: the person's first device passes the sender's epoch on to it in a
    /// `HistoryShare` in its own zone. Through a server, which refuses the removed sender's writes.
    @Test(arguments: [ChatBackend.memory, .http])
    func aNewDeviceReadsWhatASenderWhoLeftSaidFromItsOwnDevices(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Plans", members: ["bob", "carol"], history: .all)
        try await syncAll([alice, bob, carol])
        let said = try await carol.send("carol's last word", toGroup: group.id)
        try await syncAll([carol, alice])
        #expect(try alice.message(said.id)?.content == "carol's last word")
        try await alice.removeMember("carol", from: group.id)
        try await syncAll([alice, bob])
        // Carol is gone for good; alice links a laptop.
        let laptop = try await DeviceTests().linkLaptop(fixture, from: alice)
        try await syncAll([laptop, alice, laptop, bob])
        let read = try #require(try laptop.message(said.id))
        #expect(read.content == "carol's last word" && !read.isWaitingForKey)
        let shares = try alice.records(in: try ChatFixture.speakerZone("alice").rawValue, type: HistoryShare.recordType)
        #expect(shares.count == 1)
        #expect(try shares.map { try HistoryShare.parts($0).sender } == ["carol"])
    }

    @Test func aRevokedDeviceReadsNothingSentAfterTheSenderLearnsOfIt() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let laptop = try await DeviceTests().linkLaptop(fixture, from: alice)
        try await syncAll([alice, laptop, bob])
        let before = try await bob.send("to both your devices", to: "alice")
        try await syncAll([bob, alice, laptop])
        #expect(try laptop.message(before.id)?.content == "to both your devices")
        let device = try #require(try alice.devices().first { $0.label == "laptop" })
        try await alice.revokeDevice(device)
        try await syncAll([alice, bob])
        let after = try await bob.send("to your phone only", to: "alice")
        try await syncAll([bob, alice])
        #expect(try alice.message(after.id)?.content == "to your phone only")
        #expect(try Self.opens(laptop, try bob.record(zone: before.id.conversation, name: before.id.name)))
        #expect(try !Self.opens(laptop, try bob.record(zone: after.id.conversation, name: after.id.name)))
    }

    /// A sealed field moved to another of the sender's messages (signed again: a broken or
    /// hostile client; a server cannot sign) opens to nothing: refused, never shown as the other.
    @Test func aCiphertextMovedToAnotherMessageIsRefusedNotShown() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let first = try await alice.send("the first", to: "bob"), second = try await alice.send("the second", to: "bob")
        try await syncAll([alice, bob])
        var moved = try #require(try alice.record(zone: second.id.conversation, name: second.id.name))
        moved["sealed"] = try #require(try alice.record(zone: first.id.conversation, name: first.id.name)?["sealed"])
        try moved.sign(with: try fixture.key(of: "alice"), clock: RecordClock(milliseconds: moved.clock.milliseconds + 1000, counter: 0))
        try await fixture.plant(try moved.encoded(), in: moved.id.zone)
        try await bob.sync()
        #expect(try bob.message(second.id) == nil, "not shown as 'the first'")
        #expect(try bob.quarantine().contains { $0.name == second.id.name && $0.reason.contains("does not open") })
        #expect(try bob.message(first.id)?.content == "the first")
    }

    /// A share for bob's device sealed to another key: refused, and its epoch's key not taken.
    @Test func aShareSealedToAnotherDeviceIsRefused() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let zone = try ZoneName(try await alice.conversation(with: "bob").id)
        try await syncAll([alice, bob])
        let aliceKey = try fixture.key(of: "alice"), epoch = Sodium.randomBytes(16), senderKey = Sodium.randomBytes(32)
        let elsewhere = EncryptionKey.boxKeys(forDeviceSeed: Sodium.randomBytes(32))
        let box = Sealing.sealShare(zone: zone, sender: "alice", device: aliceKey.publicKey, epoch: epoch, key: senderKey, to: elsewhere.publicKey)
        var share = try KeyShare.record(zone: zone, sender: "alice", recipient: "bob", epoch: epoch, boxes: [(try #require(bob.localPublicKey), box)])
        try share.sign(with: aliceKey, clock: HybridLogicalClock().now())
        try await fixture.plant(try share.encoded(), in: zone)
        // A message of that epoch: it stays waiting, never opened with a key from the bad share.
        var message = Record(id: try RecordID(zone: zone, name: "m.\(OwnershipRule.identityHash("alice")).ffff000000000000-0000000000000001"), type: "Message",
                             fields: ["speaker": .string("alice"), "listener": .string("bob"), "content": .string("planted"), "spokenAt": .date(milliseconds: 1_800_000_000_000)])
        message = try Sealing.seal(["content"], of: message, sender: "alice", device: aliceKey.publicKey, epoch: epoch, key: senderKey)
        try message.sign(with: aliceKey, clock: HybridLogicalClock().now())
        try await fixture.plant(try message.encoded(), in: zone)
        try await bob.sync()
        #expect(try bob.quarantine().contains { $0.name == share.id.name && $0.reason.contains("does not open") })
        let shown = try #require(try bob.message(MessageID(conversation: zone.rawValue, name: message.id.name)))
        #expect(shown.isWaitingForKey && shown.content.isEmpty)
    }

    /// A share in a group's zone signed by someone not in the group: a zone server refuses it.
    @Test func aZoneServerRefusesAShareFromOutsideTheGroup() async throws {
        let fixture = try await ChatFixture(.http)
        let alice = try await fixture.store("alice"), dave = try await fixture.store("dave")
        try await syncAll([alice, dave])
        let group = try await alice.createGroup(name: "Closed", members: [])
        try await alice.send("members only", toGroup: group.id)
        try await alice.sync()
        let daveKey = try fixture.key(of: "dave"), zone = try ZoneName(group.id)
        let box = Sealing.sealShare(zone: zone, sender: "dave", device: daveKey.publicKey, epoch: Sodium.randomBytes(16), key: Sodium.randomBytes(32),
                                    to: EncryptionKey.boxKeys(forDeviceSeed: try fixture.key(of: "alice").seed).publicKey)
        var share = try KeyShare.record(zone: zone, sender: "dave", recipient: "alice", epoch: Sodium.randomBytes(16), boxes: [(try #require(alice.localPublicKey), box)])
        try share.sign(with: daveKey, clock: HybridLogicalClock().now())
        var refusal: RecordZoneError?
        do {
            if case .failure(let error) = try await fixture.rawBackend("dave", key: daveKey).save([share])[0] { refusal = error }
        } catch let error as RecordZoneError { refusal = error }
        #expect(refusal?.code == .notAuthorized, "\(String(describing: refusal))")
    }
}
