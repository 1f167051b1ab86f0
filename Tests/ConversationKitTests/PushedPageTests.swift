@testable import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// What the continuous sync does with a page a stream pushed (docs/PROTOCOL.md §2.4, "Applying
/// a page").
@Suite struct PushedPageTests {
    /// Bob's store, and what the server would push it after alice's two new messages, in two
    /// pages from the token bob holds (`start`): the first new record, then the rest.
    struct TwoPages {
        let fixture: ChatFixture
        let bob: ConversationStore
        let reader: any RecordZoneBackend
        let zone: ZoneName
        let start: ChangeToken?
        let head: ZoneChanges
        let rest: ZoneChanges
        let third: MessageID

        init() async throws {
            fixture = try await ChatFixture(.memory)
            let alice = try await fixture.store("alice")
            bob = try await fixture.store("bob")
            let first = try await alice.send("one", to: "bob")
            try await syncAll([alice, bob])
            zone = try ZoneName(first.id.conversation)
            start = try await Self.held(bob, zone)
            _ = try await alice.send("two", to: "bob")
            third = try await alice.send("three", to: "bob").id
            try await alice.sync()
            reader = fixture.server.connection(policy: ConversationStore.recordPolicy())
            head = try await reader.fetchChanges(in: zone, since: start, limit: 1)
            rest = try await reader.fetchChanges(in: zone, since: head.token, limit: 100)
        }

        /// The token bob's store holds for the zone.
        static func held(_ bob: ConversationStore, _ zone: ZoneName) async throws -> ChangeToken? {
            try await bob.engine.storedToken(of: zone)
        }
    }

    /// A pushed page is applied only where it reads on from the store's own token. One from
    /// elsewhere — a store restored from an older copy, a stream that ran ahead — would skip
    /// what lies between: it is left, and the zone named to be followed again from the store's
    /// token. One that ends where the store stands (its own versions, pushed back) is skipped
    /// quietly.
    @Test func aPushedPageIsAppliedOnlyFromTheStoresToken() async throws {
        let pages = try await TwoPages()
        let (bob, reader, zone, start, head, rest) = (pages.bob, pages.reader, pages.zone, pages.start, pages.head, pages.rest)
        let third = pages.third
        func held() async throws -> ChangeToken? { try await TwoPages.held(bob, zone) }
        #expect(rest.records.contains { $0.id.name == third.name })

        // The second page alone does not follow from bob's token: left, the zone to follow again.
        var outcome = try await bob.engine.applyPushed([PushedPage(zone: zone, since: head.token, changes: rest)], backend: reader)
        #expect(outcome.report.pulled == 0 && outcome.diverged == [zone: start])
        #expect(try bob.message(third) == nil, "a page from a token the store does not hold was applied")
        #expect(try await held() == start)

        // Both, in order: applied, and the token the last one ended with kept.
        outcome = try await bob.engine.applyPushed([PushedPage(zone: zone, since: start, changes: head), PushedPage(zone: zone, since: head.token, changes: rest)], backend: reader)
        #expect(outcome.diverged.isEmpty && outcome.report.pulled == head.records.count + rest.records.count)
        #expect(try bob.message(third)?.content == "three")
        #expect(try await held() == rest.token)

        // The same page again ends where the store stands: nothing to apply, nothing to follow again.
        outcome = try await bob.engine.applyPushed([PushedPage(zone: zone, since: head.token, changes: rest)], backend: reader)
        #expect(outcome.diverged.isEmpty && outcome.report.pulled == 0)
        #expect(try await held() == rest.token)
    }

    /// Pages a round took from the stream and could not apply (the round failed) are given
    /// back ahead of those pushed since: the next round applies them in the stream's order, and
    /// nothing is skipped or followed again.
    @Test func pagesAFailedRoundTookAreAppliedFirstByTheNext() async throws {
        let pages = try await TwoPages()
        let kicks = SyncKicks()
        _ = kicks.push(PushedPage(zone: pages.zone, since: pages.start, changes: pages.head))
        let taken = kicks.takePages()  // the round took it, then failed
        _ = kicks.push(PushedPage(zone: pages.zone, since: pages.head.token, changes: pages.rest))  // pushed meanwhile
        kicks.giveBack(taken)
        let next = kicks.takePages()
        #expect(next.map(\.since) == [pages.start, pages.head.token], "in the stream's order")
        let outcome = try await pages.bob.engine.applyPushed(next, backend: pages.reader)
        #expect(outcome.diverged.isEmpty && outcome.report.pulled == pages.head.records.count + pages.rest.records.count)
        #expect(try pages.bob.message(pages.third)?.content == "three")
        #expect(try await TwoPages.held(pages.bob, pages.zone) == pages.rest.token)
        #expect(kicks.takePages().isEmpty)
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
