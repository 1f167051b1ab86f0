@testable import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

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
        var outcome = try await bob.engine.applyPushed([PushedPage(zone: zone, since: head.token, changes: rest)])
        #expect(outcome.report.pulled == 0 && outcome.diverged == [zone: start])
        #expect(try bob.message(third.id) == nil, "a page from a token the store does not hold was applied")
        #expect(try await held() == start)

        // Both, in order: applied, and the token the last one ended with kept.
        outcome = try await bob.engine.applyPushed([PushedPage(zone: zone, since: start, changes: head), PushedPage(zone: zone, since: head.token, changes: rest)])
        #expect(outcome.diverged.isEmpty && outcome.report.pulled == head.records.count + rest.records.count)
        #expect(try bob.message(third.id)?.content == "three")
        #expect(try await held() == rest.token)

        // The same page again ends where the store stands: nothing to apply, nothing to follow again.
        outcome = try await bob.engine.applyPushed([PushedPage(zone: zone, since: head.token, changes: rest)])
        #expect(outcome.diverged.isEmpty && outcome.report.pulled == 0)
        #expect(try await held() == rest.token)
    }
}
