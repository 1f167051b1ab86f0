@testable import ConversationKit
import Foundation
import RecordZone
import Synchronization
import Testing
import TestSupport
@testable import ZoneServer

/// A pull fetches the next page of a zone while the writer applies one, and the first page of the
/// next conversation while it applies one's last (`SyncEngine.pullZones`): every page is fetched once,
/// from the token of the page before it (or the one the zone holds), and applied in order; a page
/// fetched from a token the zone no longer holds is dropped; a sync cancelled while pages are
/// being fetched ahead leaves nothing half-done for the next one.
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

    /// Bob's sync of nine new conversations of a message or two each, and their speakers' zones:
    /// one page a zone, each conversation's fetched while the one before was applied, and none
    /// fetched twice (counted by bob's own backend: what the server answers others is not his).
    @Test func eachZoneIsFetchedOnceWithItsFirstPageFetchedAhead() async throws {
        let fixture = try await ChatFixture(.http)
        let url = try #require(fixture.serverURL)
        let counted = Mutex<FollowTests.CountingBackend?>(nil)
        let bob = try ConversationStore(directory: fixture.storePath("bob"), backend: .custom { context in
            let backend = FollowTests.CountingBackend(HTTPBackend(url: url, identity: context.identity, key: context.key, policy: context.policy))
            counted.withLock { $0 = backend }
            return backend
        })
        try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
        try await bob.sync()
        var expected = [String]()
        for index in 0..<9 {
            let other = try await fixture.store("p\(index)")
            for text in ["hello from \(index)", "again from \(index)"].prefix(1 + index % 2) {
                try await other.send(text, to: "bob")
                expected.append(text)
            }
            try await other.sync()
        }
        let backend = try #require(counted.withLock { $0 })
        let before = backend.received.count
        try await bob.sync()
        let received = backend.received.dropFirst(before)
        // Nine conversations and their nine speakers' zones (bob's own was read before).
        let own = ChatRecords.speakerZone("bob").rawValue
        let zones = try await bob.engine.read { db in try db.first("SELECT count(*) FROM ck_zone_state WHERE token IS NOT NULL AND zone != ?", [own]) { $0.int(0) } ?? 0 }
        #expect(zones == 18)
        #expect(Set(received.map(\.zone)).count == 18)
        let twice = Dictionary(grouping: received, by: { $0 }).filter { $0.value.count > 1 }.keys
        #expect(twice.isEmpty, "fetched twice: \(twice.map(\.description))")
        var held = [String]()
        for conversation in try bob.conversations() { held += try history(bob, conversation.id).map(\.content) }
        #expect(held.sorted() == expected.sorted())
    }

    /// A zone's first page handed to it as fetched ahead, but from a token the zone no longer
    /// holds: applied, it would set the zone past a message it never read. It is dropped, and the
    /// zone read from its own token.
    @Test func aPageFetchedAheadFromATokenTheZoneNoLongerHoldsIsDropped() async throws {
        let pages = try await PushedPageTests.TwoPages()
        let handed = SyncEngine.PageAhead(zone: pages.zone, since: pages.head.token, page: Task { .success(pages.rest) })
        let report = try await pages.bob.engine.pull(pages.zone, handed: handed, backend: pages.reader)
        #expect(report.pulled == 2)
        let texts = try history(pages.bob, pages.zone.rawValue).map(\.content)
        #expect(texts == ["one", "two", "three"], "\(texts)")
        #expect(try await PushedPageTests.TwoPages.held(pages.bob, pages.zone) == pages.rest.token)
    }
}

extension SyncEngine {
    /// One zone pulled, given a first page as if fetched ahead.
    func pull(_ zone: ZoneName, handed: PageAhead, backend: any RecordZoneBackend) async throws(ConversationError) -> SyncReport {
        begin(backend)
        defer { end() }
        var report = SyncReport()
        try await pullZone(zone, report: &report, handed: handed)
        return report
    }
}
