@testable import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// A pull fetches the next page of a zone while the writer applies one (`SyncEngine.pullZone`): every
/// page is fetched once, from the token of the page before it, and applied in order; a sync
/// cancelled while pages are being fetched ahead leaves nothing half-done for the next one.
@Suite struct PagesAheadTests {
    static let count = 60

    /// Alice's sixty messages, and bob's store reading them in pages of two.
    static func conversation() async throws -> (ChatFixture, ConversationStore, ZoneServer, [String]) {
        let fixture = try await ChatFixture(.http)
        let server = try #require(fixture.zoneServer)
        var pages = StoreConfiguration()
        pages.pageSize = 2
        let bob = try await fixture.store("bob", configuration: pages)
        try await bob.sync()
        let alice = try await fixture.store("alice")
        // Alice knows bob's published device first: her epoch is shared with it as she sends.
        try await alice.conversation(with: "bob")
        try await alice.sync()
        let texts = (1...count).map { "message \($0)" }
        for text in texts { try await alice.send(text, to: "bob") }
        try await alice.sync()
        return (fixture, bob, server, texts)
    }

    static func texts(_ store: ConversationStore) throws -> [String] {
        let conversation = try #require(try store.conversations().first { $0.nonLocalSpeaker == "alice" })
        return try history(store, conversation.id).map(\.content)
    }

    @Test func everyPageIsFetchedOnceAndAppliedInOrder() async throws {
        let (_, bob, server, texts) = try await Self.conversation()
        let before = server.api.metrics.answered(.zoneChanges)
        let report = try await bob.sync()
        let fetches = server.api.metrics.answered(.zoneChanges) - before
        #expect(try Self.texts(bob) == texts)
        // Pages of two records: a page fetched again (a wrong token) would double the count;
        // each zone may end with one page that says nothing more is coming.
        #expect(report.pulled >= Self.count)
        #expect(fetches <= (report.pulled + 1) / 2 + 8, "\(fetches) fetches for \(report.pulled) records")
    }

    @Test func aSyncCancelledWhilePagesAreFetchedAheadLeavesTheNextOneWhole() async throws {
        let (_, bob, server, texts) = try await Self.conversation()
        let before = server.api.metrics.answered(.zoneChanges)
        let running = Task { try await bob.sync() }
        // Cancelled in the middle of the conversation's pages.
        let deadline = ContinuousClock.now + .seconds(30)
        while server.api.metrics.answered(.zoneChanges) - before < 10, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(2)) }
        running.cancel()
        let first = await running.result
        let held = try Self.texts(bob)
        // Whatever the cancelled sync applied is a prefix of the conversation, in order.
        #expect(Array(texts.prefix(held.count)) == held)
        if case .success = first { Issue.record("the sync finished before its cancellation: nothing was tested") }
        try await bob.sync()
        #expect(try Self.texts(bob) == texts)
    }
}
