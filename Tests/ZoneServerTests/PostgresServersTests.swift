import ConversationKit
import Foundation
import PostgresKit
import RecordZone
import Synchronization
import StorageTestSupport
import Testing
import TestSupport
@testable import ZoneServer

/// Several real `convkitd serve` processes on one PostgreSQL database behave as one server.
@Suite(.enabled(if: SharedPostgres.isAvailable, "PostgreSQL is not installed (scripts/setup.sh installs it)"))
struct PostgresServersTests {
    /// Starts `convkitd serve --storage` on port 0 and returns it with the port it printed.
    func start(_ conninfo: String) async throws -> (ChildProcess, Int) {
        try await startServe(["--storage", conninfo, "--pool-size", "4"])
    }

    func client(_ port: Int, _ identity: String, _ key: SigningKey) throws -> HTTPBackend {
        HTTPBackend(url: try #require(URL(string: "http://127.0.0.1:\(port)")), identity: identity, key: key, policy: ConversationStore.recordPolicy())
    }

    /// Two servers in this process on one fresh database, with the chat's rules: their storages
    /// (closed by the caller), the servers (held by the caller) and their ports.
    func twoServersInProcess() async throws -> (storages: [PostgresZoneStorage], servers: [ZoneServer], ports: [Int]) {
        let database = try await SharedPostgres.freshDatabase()
        let storages = [try await PostgresZoneStorage(conninfo: database, poolSize: 2, policy: ConversationStore.recordPolicy()),
                        try await PostgresZoneStorage(conninfo: database, poolSize: 2, policy: ConversationStore.recordPolicy())]
        let servers = storages.map { ZoneServer(storage: $0, access: ChatZoneAccess()) }
        do {
            return (storages, servers, try servers.map { try $0.start(host: "127.0.0.1", port: 0) })
        } catch {
            storages.forEach { $0.close() }
            throw error
        }
    }

    func item(_ zone: ZoneName, _ name: String) throws -> Record {
        try message(zone, name, from: "alice", to: "bob", key: Keys.alice, text: name)
    }

    func health(_ port: Int) async -> Int {
        (try? await RawConnection.exchange(port: port, method: "GET", path: "/healthz"))?.status ?? 0
    }

    /// Waits for each server's `/healthz` to answer `status` (``waitForHealth(_:port:seconds:)``),
    /// recording `what` with the last answer of one that never did.
    func expectBoth(_ status: Int, _ ports: [Int], seconds: Double, _ what: String) async throws {
        for port in ports {
            let problem = try await waitForHealth(status, port: port, seconds: seconds)
            #expect(problem == nil, "\(what): \(problem ?? "")")
        }
    }

    @Test func twoServersOnOneDatabaseServeAsOne() async throws {
        let database = try await SharedPostgres.freshDatabase()
        // Started together on an empty database: one makes the schema, the other waits its turn.
        async let starting = start(database)
        let (second, two) = try await start(database)
        let (first, one) = try await starting
        defer { first.kill(SIGTERM); second.kill(SIGTERM) }
        let zone = try conversationZone("alice", "bob")
        let aliceOnOne = try client(one, "alice", Keys.alice), bobOnTwo = try client(two, "bob", Keys.bob)

        // Writes through one are read through the other; a token from one is valid on the other.
        try await aliceOnOne.createZone(zone)
        _ = try await aliceOnOne.save(try (0..<3).map { try item(zone, "first-\($0)") }).map { try $0.get() }
        let firstPage = try await bobOnTwo.fetchChanges(in: zone, since: nil, limit: 100)
        #expect(Set(firstPage.records.map(\.id.name)) == Set(try (0..<3).map { try item(zone, "first-\($0)").id.name }))
        let feed = try await aliceOnOne.fetchDatabaseChanges(since: nil)
        #expect(feed.changedZones.contains(zone))
        _ = try await aliceOnOne.save([try item(zone, "second")]).map { try $0.get() }
        let resumed = try await bobOnTwo.fetchChanges(in: zone, since: firstPage.token, limit: 100)
        #expect(resumed.records.map(\.id.name) == [try item(zone, "second").id.name])
        #expect(try await bobOnTwo.fetchDatabaseChanges(since: feed.token).changedZones == [zone], "a database token from one server is valid on the other")

        // A long poll on one is woken by a write through the other (the notification), not by
        // its 20-second timeout. How fast is a benchmark's question, not this test's: on a
        // loaded CI machine it once took 1.05 s.
        let waiting = Task { try await bobOnTwo.waitForChanges(in: zone, since: resumed.token, timeout: .seconds(20)) }
        try await Task.sleep(for: .milliseconds(300))
        _ = try await aliceOnOne.save([try item(zone, "wake")]).map { try $0.get() }
        let saved = ContinuousClock.now
        #expect(try await waiting.value)
        let woke = ContinuousClock.now - saved
        #expect(woke < .seconds(10), "the long poll woke \(woke) after the write: by its timeout, not the write")

        // A request replayed on the other server is refused.
        let nonce = Sodium.randomBytes(16)
        let authorization = RequestSignature.authorization(method: "GET", path: "/v1/zones", query: [], body: Data(), identity: "alice", key: Keys.alice, now: Date(), nonce: nonce)
        let original = try await RawConnection.exchange(port: one, method: "GET", path: "/v1/zones", headers: ["Authorization": authorization])
        let replayed = try await RawConnection.exchange(port: two, method: "GET", path: "/v1/zones", headers: ["Authorization": authorization])
        #expect(original.status == 200)
        #expect(replayed.status == 401 && replayed.text.contains("replayed"))

        // A key bound through one is bound for all: alice's, and dave's bound first through two.
        let impostor = try client(two, "alice", Keys.mallory)
        await #expect { try await impostor.zones() } throws: { ($0 as? RecordZoneError)?.authentication == .unknownKey }
        _ = try await client(two, "dave", Keys.carol).zones()
        await #expect { try await client(one, "dave", Keys.mallory).zones() } throws: { ($0 as? RecordZoneError)?.authentication == .unknownKey }
        let forged = try await client(two, "bob", Keys.bob).save([try message(zone, "forged", from: "alice", to: "bob", key: Keys.mallory)])
        guard case .failure(let error) = forged[0] else { Issue.record("a forgery of alice was accepted through the other server"); return }
        #expect(error.code == .notAuthorized)

        // /metrics shows the pool.
        let metrics = try await RawConnection.exchange(port: one, method: "GET", path: "/metrics")
        #expect(metrics.text.contains("convkitd_db_pool_size 4") && metrics.text.contains("convkitd_db_listener_up 1"))
    }

    /// The listener lives only while its server serves: none for a storage not run, connected
    /// once the server starts, and its connection and thread gone when `stop()` returns.
    @Test func theListenerLivesFromStartToStop() async throws {
        let storage = try await PostgresZoneStorage(conninfo: try await SharedPostgres.freshDatabase(), poolSize: 2, policy: RecordPolicy())
        defer { storage.close() }
        #expect(storage.metricsText().contains("convkitd_db_listener_up 0"))
        let server = ZoneServer(storage: storage)
        try server.start(host: "127.0.0.1", port: 0)
        for _ in 0..<100 where !storage.metricsText().contains("convkitd_db_listener_up 1") { try await Task.sleep(for: .milliseconds(50)) }
        #expect(storage.metricsText().contains("convkitd_db_listener_up 1"))
        await server.stop()
        #expect(storage.metricsText().contains("convkitd_db_listener_up 0"), "stop() returns after the listener's thread ended")
    }

    /// When the listener connects again after a lost connection it wakes every poll
    /// (notifications may have been missed); a poll whose zone did not move goes on waiting and
    /// answers `changed` when it does — never a spurious `true`.
    @Test func aPollWokenByAReconnectAnswersChangedOnlyWhenItsZoneMoved() async throws {
        let storage = try await PostgresZoneStorage(conninfo: try await SharedPostgres.freshDatabase(), poolSize: 2, policy: ConversationStore.recordPolicy())
        defer { storage.close() }
        let zone = try conversationZone("alice", "bob")
        try await storage.createZone(zone)
        _ = try await storage.save([try message(zone, "one", from: "alice", to: "bob", key: Keys.alice)], policy: .merge)
        let token = try await storage.fetchChanges(in: zone, since: nil, limit: 10).token
        func pollsWaiting(_ count: Int) async throws {
            for _ in 0..<1000 where storage.waitingCount != count { try await Task.sleep(for: .milliseconds(10)) }
            try #require(storage.waitingCount == count)
        }

        let poll = Task { try await storage.waitForChanges(in: zone, since: token, timeout: .seconds(60)) }
        try await pollsWaiting(1)
        storage.waiters.wakeAll()  // what the listener does when it connects again
        // Woken, the poll finds its zone where it was and waits again instead of answering.
        try await pollsWaiting(1)
        _ = try await storage.save([try message(zone, "two", from: "alice", to: "bob", key: Keys.alice)], policy: .merge)
        #expect(try await poll.value == true, "answered once the zone moved")
    }

    @Test func aServerKilledMidBatchLosesNothingAcknowledgedAndTheOtherKeepsServing() async throws {
        let database = try await SharedPostgres.freshDatabase()
        let (first, one) = try await start(database)
        let (second, two) = try await start(database)
        defer { second.kill(SIGTERM) }
        let zone = try conversationZone("alice", "bob")
        let writer = try client(one, "alice", Keys.alice)
        try await writer.createZone(zone)
        let acknowledged = Mutex([String]())
        let writing = Task {
            for batch in 0..<1000 {
                let records = try (0..<40).map { try item(zone, "b\(batch)-\($0)") }
                guard let results = try? await writer.save(records) else { return }
                acknowledged.withLock { $0 += results.compactMap { try? $0.get().id.name } }
            }
        }
        // Kill it while batches are in flight.
        for _ in 0..<500 where acknowledged.withLock({ $0.count }) < 400 { try await Task.sleep(for: .milliseconds(10)) }
        first.kill(SIGKILL)
        _ = await first.wait()
        writing.cancel()
        _ = await writing.result
        let kept = acknowledged.withLock { $0 }
        #expect(kept.count >= 400)

        let reader = try client(two, "bob", Keys.bob)
        var names = [String](), token: ChangeToken? = nil
        while true {
            let page = try await reader.fetchChanges(in: zone, since: token, limit: 500)
            names += page.records.map(\.id.name)
            token = page.token
            if !page.moreComing { break }
        }
        #expect(Set(names).isSuperset(of: kept), "\(Set(kept).subtracting(names).count) acknowledged records are missing")
        #expect(Set(names).count == names.count, "a record came twice")
        // The other server keeps serving.
        _ = try await client(two, "alice", Keys.alice).save([try item(zone, "after")]).map { try $0.get() }
        #expect(await health(two) == 200)
    }

    @Test func bothServersRecoverByThemselvesWhenTheDatabaseRestartsUnderLoad() async throws {
        let cluster = try await PostgresCluster()
        let (first, one) = try await start(cluster.conninfo)
        let (second, two) = try await start(cluster.conninfo)
        defer { first.kill(SIGTERM); second.kill(SIGTERM) }
        let zone = try conversationZone("alice", "bob")
        try await client(one, "alice", Keys.alice).createZone(zone)
        // Ready once each has its notification connection: /healthz says 503 until then (a
        // loaded machine took longer than the first request here).
        try await expectBoth(200, [one, two], seconds: 10, "a server never became ready")

        // A writer on each server, saving one message at a time, keeping what was acknowledged.
        let load = Load()
        var writers = [Task<Void, any Error>]()
        for (index, port) in [one, two].enumerated() {
            writers.append(Task {
                let writer = try client(port, "alice", Keys.alice)
                var count = 0
                while !load.stop.load(ordering: .relaxed) {
                    count += 1
                    let record = try item(zone, "w\(index)-\(count)")
                    if let saved = try? await writer.save([record]).first, case .success = saved {
                        load.acknowledged.withLock { $0.append(record.id.name) }
                    }
                    try await Task.sleep(for: .milliseconds(20))
                }
            })
        }
        try await Task.sleep(for: .milliseconds(500))
        try await cluster.stop()
        try await expectBoth(503, [one, two], seconds: 10, "/healthz answers 503 on both while the database is down")
        try await Task.sleep(for: .seconds(1))
        try await cluster.start()
        try await expectBoth(200, [one, two], seconds: 20, "both servers answer again once the database is back")
        let before = load.acknowledged.withLock { $0.count }
        for _ in 0..<100 where load.acknowledged.withLock({ $0.count }) < before + 10 { try await Task.sleep(for: .milliseconds(50)) }
        load.stop.store(true, ordering: .relaxed)
        for writer in writers { _ = await writer.result }
        #expect(load.acknowledged.withLock { $0.count } >= before + 10, "writes go through again on both")

        // Nothing acknowledged is lost, and long polls wake across servers again.
        let reader = try client(two, "bob", Keys.bob)
        var names = Set<String>(), token: ChangeToken? = nil
        while true {
            let page = try await reader.fetchChanges(in: zone, since: token, limit: 500)
            names.formUnion(page.records.map(\.id.name))
            token = page.token
            if !page.moreComing { break }
        }
        #expect(names.isSuperset(of: load.acknowledged.withLock { $0 }))
        let waiting = Task { [token] in try await reader.waitForChanges(in: zone, since: token, timeout: .seconds(20)) }
        try await Task.sleep(for: .milliseconds(300))
        _ = try await client(one, "alice", Keys.alice).save([try item(zone, "after-restart")]).map { try $0.get() }
        let saved = ContinuousClock.now
        #expect(try await waiting.value)
        // Woken by the write's notification, not by the poll's 20-s timeout (how fast is the
        // benchmarks' business: a loaded run once took 1.16 s).
        #expect(ContinuousClock.now - saved < .seconds(10))
    }

    /// A community moves from one SQLite server to PostgreSQL: every record verified and copied,
    /// a planted one refused, assets copied, zone tokens still valid, database tokens expired.
    @Test func migrateCopiesASQLiteServerIntoPostgreSQLKeepingZoneTokens() async throws {
        let data = try TemporaryDirectory("migrate")
        let zone = try conversationZone("alice", "bob")
        let asset = Data((0..<3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        let (oldServer, oldPort) = try await startServe(["--data", data.path])
        let alice = try client(oldPort, "alice", Keys.alice)
        try await alice.createZone(zone)
        _ = try await alice.save(try (0..<30).map { try item(zone, "old-\($0)") }).map { try $0.get() }
        let reference = try await alice.putAsset(asset)
        let zoneToken = try await alice.fetchChanges(in: zone, since: nil, limit: 1000).token
        let databaseToken = try await alice.fetchDatabaseChanges(since: nil).token
        oldServer.kill(SIGTERM)
        _ = await oldServer.wait()
        // A record planted in the file past every check (a broken disk, a hostile admin).
        let planted = try SQLiteZoneStorage(directory: data.path, policy: ConversationStore.recordPolicy())
        var forged = try message(zone, "planted", from: "alice", to: "bob", key: Keys.mallory)
        forged.signature = Data(repeating: 7, count: 64)
        try await planted.injectUnchecked(try forged.encoded(), into: zone, name: forged.id.name)

        let database = try await SharedPostgres.freshDatabase()
        let migration = try ChildProcess(try builtProduct("convkitd"), ["migrate", "--from", data.path, "--storage", database, "--json"])
        #expect(await migration.wait() == 1, "a refused record makes the exit status 1: \(migration.standardError)")
        let report = try JSONDecoder().decode(ImportReport.self, from: Data(migration.standardOutput.utf8))
        #expect(report.zones == 1 && report.records == 30 && report.assets == 1 && report.pins >= 1)
        #expect(report.refused.count == 1 && report.refused[0].contains("planted"))
        // Into a database that holds zones already: refused.
        let again = try ChildProcess(try builtProduct("convkitd"), ["migrate", "--from", data.path, "--storage", database])
        #expect(await again.wait() == 1 && again.standardError.contains("already holds zones"))

        let (server, port) = try await start(database)
        defer { server.kill(SIGTERM) }
        let moved = try client(port, "alice", Keys.alice)
        _ = try await moved.save([try item(zone, "new")]).map { try $0.get() }
        let resumed = try await moved.fetchChanges(in: zone, since: zoneToken, limit: 1000)
        #expect(resumed.records.map(\.id.name) == [try item(zone, "new").id.name], "the zone token resumed where it was")
        await #expect { try await moved.fetchDatabaseChanges(since: databaseToken) } throws: { ($0 as? RecordZoneError)?.code == .changeTokenExpired }
        #expect(try await moved.asset(reference) == asset)
        await #expect { try await client(port, "alice", Keys.mallory).zones() } throws: { ($0 as? RecordZoneError)?.authentication == .unknownKey }
    }

    /// Two servers asked at the same moment to bind one new identity to two keys: exactly one
    /// key wins, on both; two saves pinning one new author with two keys: exactly one is stored,
    /// and both storages refuse the other key afterwards.
    /// Two servers on one database: a stream held on one pushes what is saved through the other
    /// (PostgreSQL's notifications wake it), every version once, in the zone's order — as a
    /// fetch from the start reads it.
    @Test func aStreamOnOneServerCarriesWhatTheOtherCommitsInOrder() async throws {
        let (storages, servers, ports) = try await twoServersInProcess()
        defer { storages.forEach { $0.close() } }
        defer { withExtendedLifetime(servers) {} }
        let zone = try conversationZone("alice", "bob")
        let (onA, onB) = (try client(ports[0], "alice", Keys.alice), try client(ports[1], "alice", Keys.alice))
        try await onA.createZone(zone)
        let stream = try await client(ports[1], "bob", Keys.bob).openStream()
        defer { stream.close() }
        try stream.follow([zone: nil])
        let events = Pushed(stream)
        var pushed = [String](), token: ChangeToken?
        // Thirty messages, most (the last among them) through the other server, saved one by one
        // while the stream reads.
        for n in 0..<30 {
            _ = try await (n % 3 == 1 ? onB : onA).save([try item(zone, "m\(n)")]).map { try $0.get() }
        }
        while pushed.count < 30, let event = await events.next(seconds: 15) {
            guard case .changes(let pushedZone, let since, let page) = event else { Issue.record("\(event)"); return }
            #expect(pushedZone == zone && since == token, "each page reads on from the one before")
            pushed += page.records.map(\.id.name)
            token = page.token
        }
        let read = try await onA.fetchChanges(in: zone, since: nil, limit: 100)
        #expect(pushed.count == 30 && pushed == read.records.map(\.id.name), "pushed \(pushed.count), in the zone's order, none twice")
        #expect(await events.next(seconds: 0.3) == nil, "nothing pushed again")
    }

    /// A group made through one server, with bob in it: bob's stream on the other server is
    /// told to read the feed (the commit's notification says the group's readers moved), as it
    /// is of a conversation started with him there.
    @Test func aMemberLetIntoAGroupThroughOneServerIsToldOnTheOther() async throws {
        let (storages, servers, ports) = try await twoServersInProcess()
        defer { storages.forEach { $0.close() } }
        defer { withExtendedLifetime(servers) {} }
        let directory = try TemporaryDirectory("pg-feed")
        let carol = try ConversationStore(directory: directory.path + "/carol", backend: .server(try #require(URL(string: "http://127.0.0.1:\(ports[0])"))))
        try await carol.setupLocalSpeaker(identifier: "carol", name: "Carol")
        try await carol.sync()
        let stream = try await client(ports[1], "bob", Keys.bob).openStream()
        defer { stream.close() }
        try stream.followFeed()
        let events = Pushed(stream)
        guard case .feed? = await events.next() else { Issue.record("the feed was not told at once"); return }

        try await carol.createGroup(name: "Trip", members: ["bob"])
        try await carol.sync()
        guard case .feed? = await events.next(seconds: 10) else { Issue.record("the group bob was let into was not told on the other server"); return }
        let onA = try client(ports[0], "alice", Keys.alice), zone = try conversationZone("alice", "bob")
        try await onA.createZone(zone)
        _ = try await onA.save([try item(zone, "m1")]).map { try $0.get() }
        guard case .feed? = await events.next(seconds: 10) else { Issue.record("a conversation started with bob on the other server was not told"); return }
    }

    @Test func racingFirstBindingsThroughTwoServersEndWithOneKeyForAll() async throws {
        let database = try await SharedPostgres.freshDatabase()
        let storages = [try await PostgresZoneStorage(conninfo: database, poolSize: 4, policy: ConversationStore.recordPolicy()),
                        try await PostgresZoneStorage(conninfo: database, poolSize: 4, policy: ConversationStore.recordPolicy())]
        defer { storages.forEach { $0.close() } }
        var configuration = ZoneServerConfiguration()
        configuration.requestsPerSecond = 100_000
        configuration.burst = 100_000
        let servers = storages.map { ZoneServer(storage: $0, access: ChatZoneAccess(), configuration: configuration) }
        let ports = try servers.map { try $0.start(host: "127.0.0.1", port: 0) }
        let (keyA, keyB) = (Keys.key(11), Keys.key(12))
        for round in 0..<10 {
            let identity = "racer-\(round)"
            let (one, two) = (try client(ports[0], identity, keyA), try client(ports[1], identity, keyB))
            async let first = try? one.zones()
            async let second = try? two.zones()
            let outcomes = await [first != nil, second != nil]
            #expect(outcomes.filter { $0 }.count == 1, "round \(round): \(outcomes)")
            let (winner, loser) = outcomes[0] ? (keyA, keyB) : (keyB, keyA)
            for port in ports {
                _ = try await client(port, identity, winner).zones()
                await #expect { try await client(port, identity, loser).zones() } throws: { ($0 as? RecordZoneError)?.authentication == .unknownKey }
            }
        }
        // Saves: a new author's message signed with two keys, saved at once through each storage.
        for round in 0..<10 {
            let author = "author-\(round)"
            let zone = try conversationZone(author, "bob")
            try await storages[0].createZone(zone)
            async let first = storages[0].save([try message(zone, "one", from: author, to: "bob", key: keyA)])
            async let second = storages[1].save([try message(zone, "two", from: author, to: "bob", key: keyB)])
            let results = try await first + second
            let stored = results.compactMap { try? $0.get() }
            #expect(stored.count == 1, "round \(round): \(results)")
            let kept = try #require(stored.first).authorKey
            let other = kept == keyA.publicKey ? keyB : keyA
            for storage in storages {
                guard case .failure(let error) = try await storage.save([try message(zone, "again", from: author, to: "bob", key: other)])[0] else {
                    Issue.record("round \(round): the other key was taken after the race")
                    continue
                }
                #expect(error.code == .notAuthorized)
            }
        }
        for server in servers { await server.stop() }
    }

    /// A read of the key chains after another server changed one is retried until it succeeds:
    /// here the database refuses the reading server's first reads (its role may not read the
    /// pins for a while), and the chain still reaches it once it may.
    @Test func aFailedReadOfTheChainsIsRetriedUntilItSucceeds() async throws {
        let database = try await SharedPostgres.freshDatabase()
        let writer = try await PostgresZoneStorage(conninfo: database, poolSize: 2, policy: ConversationStore.recordPolicy())
        defer { writer.close() }
        let role = "reader_" + Sodium.randomBytes(6).hexString
        let admin = try PostgresConnection(database)
        try admin.execute("CREATE ROLE \(role) LOGIN")
        try admin.execute("GRANT ALL ON SCHEMA public TO \(role)")
        try admin.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO \(role)")
        let reader = try await PostgresZoneStorage(conninfo: database + " user=\(role)", poolSize: 2, policy: ConversationStore.recordPolicy())
        defer { reader.close() }
        let running = Task { await reader.run() }
        func waitFor(_ what: String, _ condition: () -> Bool) async throws {
            for _ in 0..<500 where !condition() { try await Task.sleep(for: .milliseconds(20)) }
            try #require(condition(), "\(what) within 10 s")
        }
        try await waitFor("the listener up") { reader.metricsText().contains("convkitd_db_listener_up 1") }
        try admin.execute("REVOKE SELECT ON ck_pins FROM \(role)")

        let zone = try conversationZone("erin", "frank")
        try await writer.createZone(zone)
        _ = try await writer.save([try message(zone, "e1", from: "erin", to: "frank", key: Keys.key(0x41))], policy: .merge)[0].get()
        try await waitFor("a failed read") { reader.pinReadFailures.load(ordering: .relaxed) > 0 }
        #expect(reader.policy.pins.chain(for: "erin") == nil)
        try admin.execute("GRANT SELECT ON ck_pins TO \(role)")
        try await waitFor("erin's chain read by the other server") { reader.policy.pins.chain(for: "erin") != nil }
        #expect(reader.policy.pins.chain(for: "erin")?.current == Keys.key(0x41).publicKey)
        #expect(reader.metricsText().contains("convkitd_db_pin_read_failures_total"))
        running.cancel()
        await running.value
    }

    /// PostgreSQL's text cannot hold NUL: a record type holding one is refused alone, typed,
    /// and the rest of its batch is stored.
    @Test func aNULInARecordTypeIsRefusedAloneNotTheBatch() async throws {
        let storage = try await PostgresZoneStorage(conninfo: try await SharedPostgres.freshDatabase(), poolSize: 2, policy: RecordPolicy())
        defer { storage.close() }
        let zone = try ZoneName("nul")
        try await storage.createZone(zone)
        let clock = HybridLogicalClock()
        var good = Record(id: try RecordID(zone: zone, name: "good"), type: "Note", fields: ["text": .string("a\u{0}b")])
        var bad = Record(id: try RecordID(zone: zone, name: "bad"), type: "No\u{0}te")
        try good.sign(with: Keys.alice, clock: clock.now())
        try bad.sign(with: Keys.alice, clock: clock.now())
        let results = try await storage.save([good, bad])
        #expect((try? results[0].get())?.id == good.id)
        guard case .failure(let error) = results[1] else { Issue.record("a NUL type was stored"); return }
        #expect(error.code == .malformed)
        let page = try await storage.fetchChanges(in: zone, since: nil, limit: 10)
        #expect(page.records.map(\.id.name) == ["good"] && page.records.first?["text"] == .string("a\u{0}b"))
    }

    /// A database whose default commits without waiting for the disk: the storage's own
    /// connections still wait, so nothing acknowledged is lost in a crash.
    @Test func savesAreDurableWhateverTheDatabaseDefault() async throws {
        let database = try await SharedPostgres.freshDatabase()
        let admin = try PostgresConnection(database)
        let name = try #require(try admin.execute("SELECT current_database()").text(0, 0))
        try admin.execute("ALTER DATABASE \(name) SET synchronous_commit = off")
        #expect(try PostgresConnection(database).execute("SHOW synchronous_commit").text(0, 0) == "off")
        let storage = try await PostgresZoneStorage(conninfo: database, poolSize: 1, policy: RecordPolicy())
        defer { storage.close() }
        #expect(try await storage.run { db in try db.execute("SHOW synchronous_commit").text(0, 0) } == "on")
    }

    /// What the writers under load share: what was acknowledged, and when to stop.
    final class Load: Sendable {
        let acknowledged = Mutex([String]())
        let stop = Atomic<Bool>(false)
    }
}
