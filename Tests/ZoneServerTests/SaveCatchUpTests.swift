import ConversationKit
import Foundation
@testable import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// A save's catch-up as each storage tells it (``SaveCatchUp``): how its zone moved, and the
/// database feed since the writer's token, read in the save's own transaction.
@Suite struct SaveCatchUpTests {
    @Test(arguments: QueryIndexTests.storages)
    func theStorageTellsHowTheZonesMovedAndWhatElseChanged(_ kind: String) async throws {
        let (opened, directory) = try await PinAdmissionTests.open(kind)
        _ = directory
        let storage = opened.storage
        let mine = try conversationZone("alice", "bob"), other = try conversationZone("carol", "dave")
        for zone in [mine, other] { try await storage.createZone(zone) }
        _ = try await storage.save([try message(mine, "first", from: "alice", to: "bob", key: Keys.alice)], policy: .merge)
        let feed = try await storage.fetchDatabaseChanges(since: nil)
        let zoneToken = try await storage.fetchChanges(in: mine, since: nil, limit: 100).token
        _ = try await storage.save([try message(other, "elsewhere", from: "carol", to: "dave", key: Keys.carol)], policy: .merge)

        let answer = try await storage.save([try message(mine, "second", from: "alice", to: "bob", key: Keys.alice),
                                             try message(mine, "third", from: "alice", to: "bob", key: Keys.alice)],
                                            policy: .merge, feedSince: feed.token, visibleTo: { $0 != other })
        #expect(answer.results.allSatisfy { (try? $0.get()) != nil })
        let advance = try #require(answer.catchUp.zones.first)
        #expect(answer.catchUp.zones.count == 1 && advance.zone == mine && advance.from == zoneToken)
        // Between the two tokens lie exactly the save's versions.
        let fetched = try await storage.fetchChanges(in: mine, since: advance.from, limit: 100)
        #expect(fetched.records.map(\.id.name).map { $0.split(separator: ".").last.map(String.init) } == ["second", "third"])
        #expect(fetched.token == advance.to)
        // The feed is the one the writer would fetch: its own zone, not the one it may not see.
        let database = try #require(answer.catchUp.database)
        #expect(database.changedZones == [mine])
        #expect(try await storage.fetchDatabaseChanges(since: feed.token) { $0 != other }.changedZones == [mine])
        // Nothing after the catch-up's token is missed. (SQLite's feed is exact: nothing more
        // is named; PostgreSQL's may name again what changed around the token's horizon.)
        if kind == "sqlite" { #expect(try await storage.fetchDatabaseChanges(since: database.token).changedZones.isEmpty) }
        _ = try await storage.save([try message(other, "later", from: "carol", to: "dave", key: Keys.carol)], policy: .merge)
        #expect(try await storage.fetchDatabaseChanges(since: database.token).changedZones.contains(other))

        // A zone's first save starts from nil; a token of another database leaves the feed out
        // and the save stands.
        let fresh = try conversationZone("alice", "erin")
        try await storage.createZone(fresh)
        let foreign = TokenContents.databaseToken(backend: "server", instance: "another-database", position: 1)
        let first = try await storage.save([try message(fresh, "only", from: "alice", to: "erin", key: Keys.alice)],
                                           policy: .merge, feedSince: foreign, visibleTo: { _ in true })
        #expect((try? first.results[0].get()) != nil)
        #expect(first.catchUp.database == nil)
        #expect(first.catchUp.zones.map(\.zone) == [fresh] && first.catchUp.zones.map(\.from) == [nil])
        // A save that stores nothing (its version lost the merge) moves no zone.
        let again = try await storage.save([try message(fresh, "only", from: "alice", to: "erin", key: Keys.alice, text: "older")].map { record in
            var older = record
            try older.sign(with: Keys.alice, clock: RecordClock(milliseconds: 1, counter: 0))
            return older
        }, policy: .merge, feedSince: nil, visibleTo: { _ in true })
        #expect(again.catchUp.zones.isEmpty)
    }
}
