@testable import ConversationKit
import Foundation
import RecordZone
import SQLiteKit
import Testing
import TestSupport
@testable import ZoneServer

/// A sync that pushes learns from its save what else changed (the modify's catch-up): one
/// request per message sent, nothing fetched back — and nothing missed when others wrote.
@Suite struct CatchUpTests {
    static let servers = ChatBackend.allCases.filter(\.isServer)

    @Test(arguments: servers)
    func aSyncThatPushesIsOneRequestAndFetchesNothingBack(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let server = try #require(fixture.zoneServer)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob, alice])
        for text in ["one", "two", "three"] {
            let sent = try await alice.send(text, to: "bob")
            let before = server.api.metrics.answered(), feeds = server.api.metrics.answered(.databaseChanges)
            let fetches = server.api.metrics.answered(.zoneChanges)
            let report = try await alice.sync()
            if kind == .http {
                #expect(server.api.metrics.answered() - before == 1, "a sync that pushes one message is its modify alone")
            } else {
                // PostgreSQL's feed may name again a zone that changed around its token's
                // horizon (another test's transaction in the cluster holds it back): such a
                // zone is fetched (found unchanged), but never the feed nor the message.
                #expect(server.api.metrics.answered() - before == 1 + server.api.metrics.answered(.zoneChanges) - fetches)
                #expect(server.api.metrics.answered(.databaseChanges) == feeds)
            }
            #expect(report.pushed == 1 && report.pulled == 0, "\(report)")
            #expect(try alice.message(sent.id)?.syncState == .synced)
        }
        // Nothing was skipped: a sync that pushes nothing finds nothing new, and bob gets all.
        #expect(try await alice.sync().pulled == 0)
        try await bob.sync()
        let zone = try #require(try bob.conversations().first?.id)
        #expect(try history(bob, zone).map(\.content) == ["hello", "one", "two", "three"])
    }

    /// A power loss may take back the sync's last commits (they are not synced on their own):
    /// here the settled push itself, with the tokens it moved — the message was on the server
    /// already. The next sync pushes the same version again: shown synced, stored once, and what
    /// bob wrote meanwhile still arrives.
    @Test(arguments: servers)
    func aSettledPushThatAPowerLossTookBackIsPushedAgainOnce(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        var alice = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob, alice])
        let sent = try await alice.send("again", to: "bob")
        // The store as the power loss leaves it: the send (synced) kept, the sync's commits not.
        let path = fixture.storePath("alice"), snapshot = fixture.directory.path + "/alice-before-sync"
        alice.close()
        try FileManager.default.copyItem(atPath: path, toPath: snapshot)
        alice = try ConversationStore(directory: path, backend: fixture.factory(device: "alice"))
        try await alice.sync()
        #expect(try alice.message(sent.id)?.syncState == .synced)
        alice.close()
        try FileManager.default.removeItem(atPath: path)
        try FileManager.default.moveItem(atPath: snapshot, toPath: path)
        alice = try ConversationStore(directory: path, backend: fixture.factory(device: "alice"))
        #expect(try alice.message(sent.id)?.syncState == .pending)

        try await bob.send("meanwhile", to: "alice")
        try await bob.sync()
        let report = try await alice.sync()
        #expect(report.pushed == 2, "the message, and alice's Delivery record for bob's (pulled in between)")
        #expect(try alice.message(sent.id)?.syncState == .synced)
        let zone = sent.id.conversation
        #expect(try history(alice, zone).map(\.content) == ["hello", "again", "meanwhile"])
        try await bob.sync()
        #expect(try history(bob, zone).map(\.content) == ["hello", "again", "meanwhile"], "stored once")
    }

    /// An outsider's save asks for the feed too: it names only zones the outsider may read,
    /// never the conversation of two others that changed meanwhile.
    @Test(arguments: servers)
    func theCatchUpsFeedNamesOnlyWhatTheWriterMayRead(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let carol = try await fixture.store("carol")
        try await carol.sync()
        let carolKey = try fixture.key(of: "carol")
        let backend = try fixture.rawBackend("carol", key: carolKey)
        let token = try await backend.fetchDatabaseChanges(since: nil).token
        let sent = try await alice.send("private", to: "bob")
        try await syncAll([alice, bob])
        // Carol's profile again, signed by her: a save she may make.
        let clock = HybridLogicalClock()
        let profile = try ChatRecords.speaker(identifier: "carol", name: "Carol C.", tags: []).map { record in
            var signed = record
            try signed.sign(with: carolKey, clock: clock.now())
            return signed
        }
        let answer = try await backend.save(profile, policy: .merge, catchingUpFrom: token)
        #expect(answer.results.allSatisfy { (try? $0.get()) != nil })
        let feed = try #require(answer.catchUp.database)
        #expect(!feed.changedZones.map(\.rawValue).contains(sent.id.conversation))
        #expect(feed.changedZones.allSatisfy { !$0.rawValue.hasPrefix("c-") }, "\(feed.changedZones)")
    }

    /// The first speaker on a server writes its profile into an empty directory zone: the
    /// catch-up could move the store's token there too, but a store only queries the directory
    /// and must never start pulling it (everyone's profile, at every registration).
    @Test(arguments: servers)
    func theDirectoryIsNeverFollowedThroughACatchUp(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob, alice])
        let db = try Database(path: fixture.storePath("alice") + "/store.sqlite", readOnly: true)
        let directory = try db.first("SELECT token IS NOT NULL FROM ck_zone_state WHERE zone = 'speakers'") { $0.int(0) != 0 }
        #expect(directory != true, "alice holds no token for the directory")
        let followed = try db.rows("SELECT zone FROM ck_zone_state WHERE token IS NOT NULL ORDER BY zone") { $0.text(0) }
        #expect(followed.allSatisfy { $0.hasPrefix("s-") || $0.hasPrefix("c-") }, "\(followed)")
    }

    @Test(arguments: servers)
    func whatOthersWroteBetweenTwoPushesIsStillPulled(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob, alice])
        let zone = try #require(try alice.conversations().first?.id)
        // Bob writes into the conversation and into his own zone (his profile) while alice is
        // not pulling; alice's next push lands after both.
        try await bob.send("from bob", to: "alice")
        _ = try await bob.updateLocalSpeaker(name: "Bob B.", tags: [])
        try await bob.sync()
        try await alice.send("from alice", to: "bob")
        let report = try await alice.sync()
        #expect(report.pushed == 2, "the message, and alice's Delivery record for bob's (pulled in between)")
        #expect(try history(alice, zone).map(\.content) == ["hello", "from bob", "from alice"])
        #expect(try alice.speaker(fromRef: SpeakerRef(identifier: "bob"))?.name == "Bob B.")
        // And her own message, which she did not fetch back, is on the server for bob.
        try await bob.sync()
        #expect(try history(bob, zone).map(\.content) == ["hello", "from bob", "from alice"])
    }
}
