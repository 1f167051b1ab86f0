@testable import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// What the continuous sync does with a page a stream pushed (docs/PROTOCOL.md §2.4, "Applying
/// a page").
@Suite struct PushedPageTests {
    /// A pushed page is applied only where it reads on from the store's own token. One from
    /// elsewhere — a store restored from an older copy, a stream that ran ahead — would skip
    /// what lies between: it is left, and the zone named to be followed again from the store's
    /// token. One that ends where the store stands (its own versions, pushed back) is skipped
    /// quietly.
    @Test func aPushedPageIsAppliedOnlyFromTheStoresToken() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let first = try await alice.send("one", to: "bob")
        try await syncAll([alice, bob])
        let zone = try ZoneName(first.id.conversation)
        func held() async throws -> ChangeToken? {
            try await bob.engine.read { db in try db.first("SELECT token FROM ck_zone_state WHERE zone = ?", [zone.rawValue]) { $0.optionalBlob(0).map(ChangeToken.init(data:)) } ?? nil }
        }
        let start = try await held()
        _ = try await alice.send("two", to: "bob")
        let third = try await alice.send("three", to: "bob")
        try await alice.sync()
        // What the server would push, in two pages: the first new record, then the rest.
        let reader = fixture.server.connection(policy: ConversationStore.recordPolicy())
        let head = try await reader.fetchChanges(in: zone, since: start, limit: 1)
        let rest = try await reader.fetchChanges(in: zone, since: head.token, limit: 100)
        #expect(rest.records.contains { $0.id.name == third.id.name })

        // The second page alone does not follow from bob's token: left, the zone to follow again.
        var outcome = try await bob.engine.applyPushed([PushedPage(zone: zone, since: head.token, changes: rest)], backend: reader)
        #expect(outcome.report.pulled == 0 && outcome.diverged == [zone: start])
        #expect(try bob.message(third.id) == nil, "a page from a token the store does not hold was applied")
        #expect(try await held() == start)

        // Both, in order: applied, and the token the last one ended with kept.
        outcome = try await bob.engine.applyPushed([PushedPage(zone: zone, since: start, changes: head), PushedPage(zone: zone, since: head.token, changes: rest)], backend: reader)
        #expect(outcome.diverged.isEmpty && outcome.report.pulled == head.records.count + rest.records.count)
        #expect(try bob.message(third.id)?.content == "three")
        #expect(try await held() == rest.token)

        // The same page again ends where the store stands: nothing to apply, nothing to follow again.
        outcome = try await bob.engine.applyPushed([PushedPage(zone: zone, since: head.token, changes: rest)], backend: reader)
        #expect(outcome.diverged.isEmpty && outcome.report.pulled == 0)
        #expect(try await held() == rest.token)
    }

    /// A member removed from a group keeps its stream, and the server pushes down it nothing
    /// said in the group after the removal (the rule of a group's reads, §3.1): not the
    /// message, not even sealed — while what is said to it elsewhere still comes.
    @Test(arguments: ChatBackend.allCases.filter(\.isServer))
    func aRemovedMembersStreamCarriesNothingSaidAfter(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let server = try #require(fixture.zoneServer)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Plans", members: ["bob", "carol"])
        _ = try await alice.send("hello carol", to: "carol")
        try await syncAll([alice, bob, carol])
        let running = Task { try await carol.run(pollInterval: .seconds(600)) }
        defer { running.cancel() }
        try #require(await until { server.api.streamCounters.open == 1 }, "carol's stream open")
        let before = try await alice.send("before carol left", toGroup: group.id)
        try await alice.sync()
        #expect(await until(seconds: 15) { (try? carol.message(before.id)?.content) == "before carol left" }, "pushed while she is a member")

        try await alice.removeMember("carol", from: group.id)
        let after = try await alice.send("after carol left", toGroup: group.id)
        try await alice.sync()
        // Then something carol may read, in her pair with alice: once it came, the group's
        // page (had there been one with the message) had come too.
        let later = try await alice.send("still talking to you", to: "carol")
        try await alice.sync()
        #expect(await until(seconds: 15) { (try? carol.message(later.id)) != nil }, "the pair's message pushed")
        try await bob.sync()
        #expect(try bob.message(after.id)?.content == "after carol left")
        #expect(try carol.record(zone: group.id, name: after.id.name) == nil, "the server pushed the removed member a message said after")
        #expect(try carol.record(zone: group.id, name: before.id.name) != nil)
    }
}
