import ConversationKit
import Foundation
@testable import RecordZone
import Testing
import TestSupport

/// Groups in the store, over a shared in-memory backend and a folder: created, messages from
/// everyone, a member added (who sees what is said from then on), an admin promoted, a member
/// removed (whose later message nobody else shows — everyone holds it in the quarantine — and
/// their own store shows failed), a member
/// who leaves — and every store ending with the same members and the same messages.
@Suite struct GroupStoreTests {
    static let backends: [ChatBackend] = [.memory, .filesystem]

    static func view(_ store: ConversationStore, _ group: String) throws -> [String] {
        try history(store, group).map { "\($0.speaker): \($0.content)" }
    }

    @Test(arguments: backends)
    func aGroupOfFiveFromCreationToARemoval(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let names = ["carol", "alice", "bob", "dave", "erin"]
        var stores: [String: ConversationStore] = [:]
        for name in names { stores[name] = try await fixture.store(name) }
        let carol = try #require(stores["carol"]), alice = try #require(stores["alice"]), bob = try #require(stores["bob"])
        let dave = try #require(stores["dave"]), erin = try #require(stores["erin"])
        let all = names.compactMap { stores[$0] }

        let trip = try await carol.createGroup(name: "Trip", members: ["alice", "bob", "dave"])
        #expect(trip.isGroup && trip.groupName == "Trip" && trip.id.hasPrefix("g-"))
        try await carol.send("Who brings the tent?", toGroup: trip.id)
        try await syncAll(all)
        for store in [alice, bob, dave] {
            let group = try #require(try store.conversations().first { $0.id == trip.id })
            #expect(group.groupName == "Trip" && group.unreadCount == 1)
            #expect(try store.members(of: trip.id).map(\.speaker) == ["carol", "alice", "bob", "dave"])
        }
        #expect(try erin.conversations().isEmpty)
        try await alice.send("I do", toGroup: trip.id)
        try await bob.send("I bring food", toGroup: trip.id)
        try await dave.send("Count me in", toGroup: trip.id)
        try await syncAll(all)
        let four = ["carol: Who brings the tent?", "alice: I do", "bob: I bring food", "dave: Count me in"]
        for store in [carol, alice, bob, dave] { #expect(Set(try Self.view(store, trip.id)) == Set(four)) }

        // A plain member cannot add; once promoted, alice adds erin, who sees from then on.
        await #expect(throws: ConversationError.self) { try await alice.addMembers(["erin"], to: trip.id) }
        try await carol.setRole(.admin, of: "alice", in: trip.id)
        try await syncAll(all)
        try await alice.addMembers(["erin"], to: trip.id)
        try await syncAll(all)
        try await erin.send("Hello all", toGroup: trip.id)
        try await syncAll(all)
        #expect(try Self.view(erin, trip.id) == ["erin: Hello all"])
        #expect(try carol.members(of: trip.id).map(\.role) == [.creator, .admin, .member, .member, .member])

        // Carol removes dave; dave, not yet knowing, says something: nobody shows it.
        try await carol.removeMember("dave", from: trip.id)
        try await carol.sync()
        try await dave.send("Am I still here?", toGroup: trip.id)
        try await bob.leave(trip.id)
        try await syncAll(all)
        await #expect(throws: ConversationError.self) { try await bob.send("Back?", toGroup: trip.id) }
        let members = ["carol", "alice", "erin"]
        for store in all { #expect(Set(try store.members(of: trip.id).map(\.speaker)) == Set(members)) }
        let shown = four + ["erin: Hello all"]
        for store in [carol, alice] {
            #expect(Set(try Self.view(store, trip.id)) == Set(shown))
            #expect(try store.quarantine().contains { $0.code == .notAMember && $0.zone == trip.id })
        }
        #expect(!(try dave.conversations().isEmpty))
        // Dave's own sees it failed, and why: nobody else shows it.
        let late = try #require(try history(dave, trip.id).first { $0.content == "Am I still here?" })
        guard case .failed(let failure) = late.syncState else {
            Issue.record("dave's message after his removal is \(late.syncState)")
            return
        }
        #expect(failure.code == .notInGroup)
    }

    /// A change in the creator's name signed by someone else's key (planted past every save
    /// check, as a hostile folder writer would): every store quarantines it and nobody's
    /// membership moves; the same change signed again with another clock than its name says is
    /// refused too.
    @Test(arguments: backends)
    func aForgedChangeInTheCreatorsNameMovesNobody(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let carol = try await fixture.store("carol"), alice = try await fixture.store("alice")
        let trip = try await carol.createGroup(name: "Trip", members: ["alice"])
        try await syncAll([carol, alice])
        let zone = try ZoneName(trip.id)
        let clock = RecordClock(milliseconds: UInt64(Date().timeIntervalSince1970 * 1000) + 1_000, counter: 0)
        let forged = GroupChange(name: GroupChange.recordName(actor: "carol", clock: clock, random: "00000000000000aa"), actor: "carol",
                                 clock: clock, action: .add, targets: ["mallory"])
        var record = Record(id: try RecordID(zone: zone, name: forged.name), type: GroupChange.recordType, fields: forged.fields)
        try record.sign(with: SigningKey.generate(), clock: clock)
        try await fixture.plant(try record.encoded(), in: zone)
        var rewritten = Record(id: try RecordID(zone: zone, name: GroupChange.recordName(actor: "carol", clock: clock, random: "00000000000000bb")),
                               type: GroupChange.recordType, fields: forged.fields)
        try rewritten.sign(with: try fixture.key(of: "carol"), clock: RecordClock(rawValue: clock.rawValue + 1))
        try await fixture.plant(try rewritten.encoded(), in: zone)
        try await syncAll([carol, alice])
        for store in [carol, alice] {
            #expect(try store.members(of: trip.id).map(\.speaker) == ["carol", "alice"])
            let held = Set(try store.quarantine().compactMap { $0.zone == trip.id ? $0.name : nil })
            #expect(held.isSuperset(of: [record.id.name, rewritten.id.name]), "\(held)")
        }
    }
}
