import ConversationKit
import Foundation
import RecordZone
import SQLiteKit
import Testing
import TestSupport

/// Delivered ticks (docs/PROTOCOL.md §3, "Delivery"): a message shows delivered once a device of
/// its listener holds it and every one before it — not when the backend has it (`synced`), and
/// not for an earlier message a device lacks while it holds a later one.
@Suite struct DeliveryTests {
    @Test(arguments: ChatBackend.allCases)
    func aMessageIsDeliveredWhenTheListenersStoreHoldsIt(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let first = try await alice.send("one", to: "bob"), second = try await alice.send("two", to: "bob")
        try await alice.sync()
        #expect(try alice.message(second.id)?.syncState == .synced)
        #expect(try alice.message(second.id)?.isDelivered == false, "on the backend, not yet with bob")
        try await bob.sync()   // pulls both, and pushes his Delivery record in the same sync
        try await alice.sync()
        for id in [first.id, second.id] {
            #expect(try alice.message(id)?.isDelivered == true)
            #expect(try alice.message(id)?.readAt == nil, "delivered, not read")
            #expect(try alice.deliveredTo(id) == ["bob"])
        }
        // Bob's own view of alice's messages says nothing of delivery; nor does his of his own yet.
        #expect(try bob.message(first.id)?.isDelivered == false)
        #expect(try bob.deliveredTo(first.id) == [])
        // Nor once he has read them and his own Delivery record has come back to him: a tick is
        // only ever on one's own message.
        try await bob.markAllAsRead(in: first.id.conversation)
        try await syncAll([bob, alice, bob])
        #expect(try bob.message(first.id)?.readAt != nil && alice.message(first.id)?.readAt != nil)
        #expect(try bob.message(first.id)?.isDelivered == false && bob.messages(in: first.id.conversation).messages.map(\.isDelivered) == [false, false])
        // One Delivery record per device and zone, replaced as messages arrive, never one per message.
        let third = try await alice.send("three", to: "bob")
        try await syncAll([alice, bob, alice])
        #expect(try alice.message(third.id)?.isDelivered == true)
        let deliveries = try await fixture.backendRecords(of: "Delivery", in: first.id.conversation)
        #expect(Set(deliveries.map(\.id)).count == 1 && deliveries.allSatisfy { $0.string("member") == "bob" }, "\(deliveries.map(\.id))")
    }

    /// Ticks per member in a group of five: delivered to those whose stores hold it, read by those
    /// who read it.
    @Test(arguments: ChatBackend.allCases)
    func aGroupOfFiveShowsDeliveredAndReadPerMember(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let names = ["alice", "bob", "carol", "dave", "erin"]
        var stores: [String: ConversationStore] = [:]
        for name in names { stores[name] = try await fixture.store(name) }
        let all = names.compactMap { stores[$0] }
        try await syncAll(all)
        let alice = try #require(stores["alice"])
        let group = try await alice.createGroup(name: "Five", members: Array(names.dropFirst()))
        try await syncAll(all)
        let sent = try await alice.send("who has it?", toGroup: group.id)
        try await alice.sync()
        #expect(try alice.deliveredTo(sent.id) == [])
        for name in ["bob", "carol", "dave"] { try await #require(stores[name]).sync() }
        for name in ["bob", "carol"] { try await #require(stores[name]).markAllAsRead(in: group.id) }
        for name in ["bob", "carol"] { try await #require(stores[name]).sync() }
        try await alice.sync()
        #expect(try alice.deliveredTo(sent.id) == ["bob", "carol", "dave"])
        #expect(try alice.readers(of: sent.id).map(\.speaker).sorted() == ["bob", "carol"])
        #expect(try alice.message(sent.id)?.isDelivered == false, "a group's ticks are per member")
        #expect(try #require(stores["bob"]).message(sent.id)?.readAt != nil)
        #expect(try #require(stores["bob"]).message(sent.id)?.isDelivered == false, "read by bob, still not a tick of his")
        try await #require(stores["erin"]).sync()
        try await alice.sync()
        #expect(try alice.deliveredTo(sent.id) == ["bob", "carol", "dave", "erin"])
    }

    /// A device that holds a later message but not an earlier one says so by its count: the
    /// earlier one is not shown delivered, and neither is the later one (the count does not
    /// say which is missing) until the earlier one arrives.
    @Test func aMessageTheListenerLacksIsNotDeliveredThoughALaterOneIs() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let lost = try await alice.send("this one is held up", to: "bob")
        let later = try await alice.send("this one arrives", to: "bob")
        // Only the later one reaches the backend, as a sync tool or a retry might have it.
        let zone = try ZoneName(later.id.conversation)
        let db = try Database(path: fixture.storePath("alice") + "/store.sqlite", readOnly: true)
        let bytes = try #require(try db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ?", [zone.rawValue, later.id.name]) { $0.blob(0) })
        let signed = try Record(canonical: bytes)
        let raw = try fixture.rawBackend("alice", key: try fixture.key(of: "alice"))
        try await raw.createZone(zone)
        let results = try await raw.save([signed])
        #expect(results.allSatisfy { (try? $0.get()) != nil }, "\(results)")
        try await bob.sync()
        #expect(try bob.message(later.id) != nil && bob.message(lost.id) == nil)
        // Alice pushes both, then reads bob's count: one of two up to the later one.
        try await alice.sync()
        #expect(try alice.message(lost.id)?.syncState == .synced)
        #expect(try alice.message(later.id)?.isDelivered == false)
        #expect(try alice.message(lost.id)?.isDelivered == false)
        #expect(try alice.deliveredTo(lost.id) == [])
        try await syncAll([bob, alice])
        #expect(try alice.message(lost.id)?.isDelivered == true && alice.message(later.id)?.isDelivered == true)
    }

    /// The sender's count of its own messages, which a send does not write (it is counted by
    /// name when a Delivery record is weighed): a message from another of its devices whose
    /// clock runs behind, named before what was counted already, is counted too — so bob's
    /// count of all four matches alice's, and her next message shows delivered.
    @Test func anOwnMessageFromADeviceBehindIsCountedForTheTicks() async throws {
        let fixture = try await ChatFixture(.memory)
        let laptop = try await fixture.store("alice"), bob = try await fixture.store("bob")
        var slow = StoreConfiguration()
        slow.now = { Date().addingTimeInterval(-60) }
        let tablet = try ConversationStore(directory: fixture.storePath("alice-tablet"), backend: fixture.factory(device: "alice-tablet"), configuration: slow)
        try await tablet.setupLocalSpeaker(linking: try laptop.linkDevice(), label: "tablet")
        try await syncAll([laptop, tablet, bob, laptop, tablet])
        let one = try await laptop.send("one", to: "bob"), two = try await laptop.send("two", to: "bob")
        try await syncAll([laptop, bob, laptop])
        #expect(try laptop.message(one.id)?.isDelivered == true && laptop.message(two.id)?.isDelivered == true)
        let behind = try await tablet.send("from the tablet, its clock behind", to: "bob")
        #expect(behind.id.name < two.id.name, "named before what the laptop counted")
        try await syncAll([tablet, laptop, bob, laptop])
        let three = try await laptop.send("three", to: "bob")
        try await syncAll([laptop, bob, laptop])
        for id in [one.id, two.id, behind.id, three.id] { #expect(try laptop.message(id)?.isDelivered == true, "\(id)") }
        #expect(try laptop.deliveredTo(three.id) == ["bob"])
    }

    /// A member's Delivery record claiming alice's messages up to a name far in the future moves
    /// alice's own held count there; it stays exact — every one of her Message records named up
    /// to it counted once, the sends after it too — and her messages still tick once bob's own
    /// record says he holds them.
    @Test func aClaimFarAheadKeepsTheOwnCountExact() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let first = try await alice.send("one", to: "bob")
        try await syncAll([alice, bob, alice])
        let zone = first.id.conversation, prefix = "m.\(OwnershipRule.identityHash("alice")).", far = "m.\(OwnershipRule.identityHash("alice")).ffffffffffffffff-ffffffffffffffff"
        let bobKey = try fixture.key(of: "bob")
        var claim = Record(id: try RecordID(zone: try ZoneName(zone), name: "d.\(OwnershipRule.identityHash("bob")).claim"), type: "Delivery",
                           fields: ["member": .string("bob"), "held": .list([.string("7:\(far)")])])
        try claim.sign(with: bobKey, clock: HybridLogicalClock().now())
        let results = try await fixture.rawBackend("bob", key: bobKey).save([claim])
        #expect(results.allSatisfy { (try? $0.get()) != nil }, "\(results)")
        try await alice.sync()
        let later = [try await alice.send("two", to: "bob"), try await alice.send("three", to: "bob")]
        let db = try Database(path: fixture.storePath("alice") + "/store.sqlite", readOnly: true)
        let row = try #require(try db.first("SELECT count, newest FROM held_messages WHERE zone = ? AND sender = ?", [zone, prefix]) { ($0.int(0), $0.text(1)) })
        let held = try db.first("SELECT count(*) FROM ck_records WHERE zone = ? AND type = 'Message' AND name > ? AND name <= ?", [zone, prefix, row.1]) { $0.int(0) }
        #expect(row.1 == far && row.0 == held && held == 3, "\(row) \(String(describing: held))")
        try await syncAll([alice, bob, alice])
        for id in [first.id] + later.map(\.id) { #expect(try alice.message(id)?.isDelivered == true, "\(id)") }
    }

    /// A participant's own Delivery record claiming nonsense (a held list that is no count and
    /// no message name) is refused by the reader, and ticks nothing.
    @Test func aMalformedDeliveryIsRefusedAndTicksNothing() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let sent = try await alice.send("one", to: "bob")
        try await alice.sync()
        let bobKey = try fixture.key(of: "bob")
        var forged = Record(id: try RecordID(zone: try ZoneName(sent.id.conversation), name: "d.\(OwnershipRule.identityHash("bob")).forged"), type: "Delivery",
                            fields: ["member": .string("bob"), "held": .list([.string("1:not-a-message"), .string("x:\(sent.id.name)")])])
        try forged.sign(with: bobKey, clock: HybridLogicalClock().now())
        let results = try await fixture.rawBackend("bob", key: bobKey).save([forged])
        #expect(results.allSatisfy { (try? $0.get()) != nil }, "\(results)")
        try await alice.sync()
        let quarantined = try alice.quarantine()
        #expect(quarantined.contains { $0.name == forged.id.name && $0.code == .schemaViolation }, "\(quarantined)")
        #expect(try alice.message(sent.id)?.isDelivered == false && alice.deliveredTo(sent.id) == [])
    }

    /// A page, a thread, a search across conversations, the live view and a single read show
    /// every message with the same tick: the marks read once for many messages tick exactly
    /// the ones a read of each alone ticks.
    @Test func everyReadShowsTheSameTicks() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let held = try await alice.send("zebra one, bob has it", to: "bob")
        let reply = try await alice.send("zebra two, bob has it too", to: "bob", replyingTo: held.id)
        let toCarol = try await alice.send("zebra three, carol is away", to: "carol")
        try await syncAll([alice, bob, alice])
        let later = try await alice.send("zebra four, sent after bob's sync", to: "bob", replyingTo: held.id)
        try await alice.sync()
        let expected = [held.id: true, reply.id: true, later.id: false, toCarol.id: false]
        for (id, delivered) in expected { #expect(try alice.message(id)?.isDelivered == delivered, "\(id)") }
        let page = try alice.messages(in: held.id.conversation, limit: 10).messages
        #expect(page.map(\.id) == [held.id, reply.id, later.id] && page.map(\.isDelivered) == [true, true, false])
        #expect(try alice.replies(to: held.id).map(\.isDelivered) == [true, false])
        let hits = try alice.search("zebra", limit: 10)
        #expect(hits.count == 4)
        for hit in hits { #expect(hit.message.isDelivered == expected[hit.message.id], "\(hit.message.id)") }
        let live = try alice.liveMessages(in: held.id.conversation)
        let snapshots = LiveCollectionTests.Taken(live.snapshots)
        #expect(try await snapshots.next().messages.map(\.isDelivered) == [true, true, false])
        // Bob gets the later one: the live view re-reads that row alone, and ticks it.
        try await syncAll([bob, alice])
        var shown = try await snapshots.next()
        while shown.messages.last?.isDelivered != true { shown = try await snapshots.next() }
        #expect(shown.messages.map(\.isDelivered) == [true, true, true])
        #expect(try alice.message(toCarol.id)?.isDelivered == false)
    }
}
