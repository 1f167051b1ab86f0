import ConversationKit
import Foundation
import Synchronization
@testable import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// The store's continuous mode, `run()`: local changes pushed as they are committed, remote
/// ones pulled as the backend announces them, an unreachable backend caught up with.
@Suite struct ContinuousSyncTests {
    /// Waits for an event matching `matches` on `events`, up to `seconds`. - Returns: the time it took.
    static func time(_ events: AsyncStream<StoreEvent>, seconds: Double = 5, _ matches: @escaping @Sendable (StoreEvent) -> Bool) async -> Duration? {
        let start = ContinuousClock.now
        return await firstElement(of: events, seconds: seconds, where: matches).map { _ in ContinuousClock.now - start }
    }

    /// A message sent by one running store reaches the other running store with no sync() call:
    /// through a zone server on SQLite or PostgreSQL (its stream), memory (its stream of moved
    /// zones), and a folder (inotify, and its feed looked at every second).
    @Test(arguments: ChatBackend.allCases)
    func aMessageReachesARunningPeer(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        _ = try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob])
        let running = [Task { try await alice.run() }, Task { try await bob.run() }]
        defer { running.forEach { $0.cancel() } }
        if let server = fixture.zoneServer {
            // Both stores' streams are open.
            try #require(await until(seconds: 10) { server.api.streamCounters.open >= 2 }, "both streams open within 10 s")
        }
        // How fast is the bench's to measure (convkit-bench --only server: the median through
        // convkitd serve); here each must simply arrive, with nobody calling sync().
        for n in 0..<5 {
            let events = bob.events()
            let sent = try await alice.send("live \(n)", to: "bob")
            let took = await Self.time(events, seconds: 15) { $0 == .messageAdded(sent.id) }
            _ = try #require(took, "message \(n) arrived")
            #expect(try bob.message(sent.id)?.content == "live \(n)")
        }
        // And the other way, shown synced on the sender's side.
        let events = alice.events()
        let reply = try await bob.send("hi back", to: "alice")
        #expect(await Self.time(events) { $0 == .messageAdded(reply.id) } != nil)
        let synced = await Self.time(bob.events(), seconds: 2) { _ in (try? bob.message(reply.id)?.syncState) == .synced }
        #expect(try bob.message(reply.id)?.syncState == .synced || synced != nil)
    }

    /// On the in-memory backend a running store is told which zones moved (`LiveChange.moved`)
    /// and pulls them: with the feed looked at only every ten minutes, each message arrives, and
    /// no long poll waits meanwhile.
    @Test func aRunningStoreOnMemoryIsToldWhichZonesMovedAndHoldsNoLongPoll() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        _ = try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob])
        let running = Task { try await bob.run(pollInterval: .seconds(600)) }
        defer { running.cancel() }
        for n in 0..<3 {
            let events = bob.events()
            let sent = try await alice.send("live \(n)", to: "bob")
            try await alice.sync()
            #expect(await Self.time(events, seconds: 10) { $0 == .messageAdded(sent.id) } != nil, "message \(n) arrived")
            #expect(fixture.server.waiters.count == 0, "no long poll waits")
        }
    }

    /// Two running stores on a zone server hold one stream each: a live message is the
    /// sender's save and a push down the receiver's stream (and the same again for the
    /// receiver's Delivery record) — nothing fetched, nothing polled,
    /// the sender's own version not fetched back — and the answer comes the same way.
    @Test(arguments: ChatBackend.allCases.filter(\.isServer))
    func aLiveMessageIsOneSaveAndOnePush(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let server = try #require(fixture.zoneServer)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        _ = try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob, alice])
        let running = [Task { try await alice.run(pollInterval: .seconds(600)) }, Task { try await bob.run(pollInterval: .seconds(600)) }]
        defer { running.forEach { $0.cancel() } }
        try #require(await until(seconds: 10) { server.api.streamCounters.open >= 2 }, "both streams open within 10 s")
        // The first message: the first rounds' pulls and each side's follows are behind it.
        let first = try await alice.send("first", to: "bob")
        try #require(await until(seconds: 15) { (try? alice.message(first.id)?.isDelivered) == true }, "the first message delivered")
        let before = Dictionary(uniqueKeysWithValues: Route.allCases.map { ($0, server.api.metrics.answered($0)) })
        let pushesBefore = server.api.streamCounters.pushes.load(ordering: .relaxed)
        // Each message, then its receiver's Delivery record (the double tick) back to its sender.
        for n in 0..<3 {
            let events = bob.events()
            let sent = try await alice.send("live \(n)", to: "bob")
            #expect(await Self.time(events, seconds: 15) { $0 == .messageAdded(sent.id) } != nil, "message \(n) pushed to bob")
            #expect(await until(seconds: 15) { (try? alice.message(sent.id)?.isDelivered) == true }, "message \(n) shown delivered")
        }
        let reply = try await bob.send("yours", to: "alice")
        #expect(await until(seconds: 15) { (try? bob.message(reply.id)?.isDelivered) == true }, "the answer pushed to alice, and shown delivered")
        let asked = Route.allCases.filter { server.api.metrics.answered($0) != before[$0] }
        #expect(asked == [.modify], "only saves: \(asked)")
        let saves = server.api.metrics.answered(.modify) - (before[.modify] ?? 0)
        #expect(saves == 8, "one save per message, and one of the receiver's Delivery record")
        // Each message and each Delivery record reached the other side down its stream.
        #expect(server.api.streamCounters.pushes.load(ordering: .relaxed) - pushesBefore >= 8)
    }

    /// On a folder, inotify brings a change at once: with the feed looked at only every minute,
    /// messages still arrive (in seconds at most, on a loaded machine).
    @Test func aFolderChangeArrivesThroughInotify() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        _ = try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob])
        let running = [Task { try await alice.run(pollInterval: .seconds(60)) }, Task { try await bob.run(pollInterval: .seconds(60)) }]
        defer { running.forEach { $0.cancel() } }
        try await Task.sleep(for: .milliseconds(500))  // past the first look at the feed
        for n in 0..<3 {
            let events = bob.events()
            let sent = try await alice.send("through inotify \(n)", to: "bob")
            #expect(await Self.time(events, seconds: 20) { $0 == .messageAdded(sent.id) } != nil, "message \(n)")
        }
    }

    /// Another process (here, another instance on the same directory, with a connection of its
    /// own) writes a message into a running store: the running store notices and pushes it.
    @Test func aChangeWrittenByAnotherInstanceIsPushed() async throws {
        let fixture = try await ChatFixture(.http)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        _ = try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob])
        let running = [Task { try await alice.run() }, Task { try await bob.run() }]
        defer { running.forEach { $0.cancel() } }
        let other = try ConversationStore(directory: fixture.storePath("alice"), backend: fixture.factory(device: "alice"))
        let events = bob.events()
        let sent = try await other.send("from the other instance", to: "bob")
        #expect(await Self.time(events, seconds: 30) { $0 == .messageAdded(sent.id) } != nil)
    }

    /// The server goes away while both stores run: the sender's store reports it unreachable,
    /// the message stays pending; the server comes back on the same port and data, and the
    /// message arrives with no help.
    @Test func anUnreachableServerIsCaughtUpWith() async throws {
        let directory = try TemporaryDirectory("continuous")
        let storage = try SQLiteZoneStorage(directory: directory.path + "/server", policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
        var server: ZoneServer? = ZoneServer(storage: storage, access: ChatZoneAccess())
        let port = try #require(server).start(host: "127.0.0.1", port: 0)
        let url = try #require(URL(string: "http://127.0.0.1:\(port)"))
        let alice = try ConversationStore(directory: directory.path + "/alice", backend: .server(url))
        let bob = try ConversationStore(directory: directory.path + "/bob", backend: .server(url))
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
        _ = try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob])
        let aliceEvents = alice.events()
        let running = [Task { try await alice.run() }, Task { try await bob.run() }]
        defer { running.forEach { $0.cancel() } }
        await server?.stop(timeout: .seconds(1))
        server = nil
        let sent = try await alice.send("while the server is away", to: "bob")
        #expect(await Self.time(aliceEvents) { if case .syncActivity(.unreachable) = $0 { true } else { false } } != nil)
        #expect(try alice.message(sent.id)?.syncState == .pending)
        let bobEvents = bob.events()
        let again = ZoneServer(storage: try SQLiteZoneStorage(directory: directory.path + "/server", policy: ConversationStore.recordPolicy(),
                                                          indexedFields: ConversationStore.queryIndexes), access: ChatZoneAccess())
        _ = try again.start(host: "127.0.0.1", port: port)
        #expect(await Self.time(bobEvents, seconds: 40) { $0 == .messageAdded(sent.id) } != nil, "caught up once the server answers")
        // The server pushes the message to bob as it commits it, which may be before alice's
        // store has read the save's answer: shown synced once it has.
        #expect(await until(seconds: 15) { (try? alice.message(sent.id)?.syncState) == .synced })
        await again.stop(timeout: .seconds(1))
    }

    /// The link to the server fails under a pushed batch, and new connections get nowhere for a
    /// while: the receiver's stream opens again by itself (its feed is looked at only every ten
    /// minutes here) from the tokens it kept, and every message arrives exactly once — none lost
    /// with what the link swallowed, none added twice. `cut`: the link dies 4 kB into the batch
    /// coming back (a reset). `blackhole`: it falls silent before the batch, which the server
    /// pushes into it whole (each side's kernel still takes the bytes; nothing arrives), until
    /// the link comes back and resets the connection (as a NAT that lost its state does) — the
    /// server then stood past the batch on a stream the receiver never read. (That a silent
    /// link ends a stream by itself: `StreamTests`.)
    @Test(arguments: [true, false]) func aStreamCutMidBatchResumesWithNothingLostOrTwice(_ blackholed: Bool) async throws {
        let directory = try TemporaryDirectory("stream-cut")
        let storage = try SQLiteZoneStorage(directory: directory.path + "/server", policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
        let server = ZoneServer(storage: storage, access: ChatZoneAccess())
        let port = try server.start(host: "127.0.0.1", port: 0)
        defer { Task { await server.stop(timeout: .seconds(1)) } }
        let proxy = try FaultProxy(tcpPort: port)
        defer { proxy.stop() }
        let alice = try ConversationStore(directory: directory.path + "/alice", backend: .server(try #require(URL(string: "http://127.0.0.1:\(port)"))))
        let bob = try ConversationStore(directory: directory.path + "/bob", backend: .server(try #require(URL(string: "http://127.0.0.1:\(proxy.port)"))))
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
        let hello = try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob])
        let added = Mutex<[MessageID]>([])
        let events = bob.events()
        let counting = Task { for await event in events { if case .messageAdded(let id) = event { added.withLock { $0.append(id) } } } }
        defer { counting.cancel() }
        let running = Task { try await bob.run(pollInterval: .seconds(600)) }
        defer { running.cancel() }
        try #require(await until { server.api.streamCounters.open == 1 }, "bob's stream open")
        try await Task.sleep(for: .milliseconds(200))  // its follows sent (nothing to push: it is up to date)

        // Forty messages in one save, pushed into the failing link.
        let received = proxy.forwarded.received
        let pushes = server.api.streamCounters.pushes.load(ordering: .relaxed)
        if blackholed { proxy.blackhole(true) } else { proxy.cut(after: 4096, sent: false) }
        var sent = [MessageID]()
        for n in 0..<40 { sent.append(try await alice.send("batch \(n) " + String(repeating: "x", count: 200), to: "bob").id) }
        try await alice.sync()
        if blackholed {
            try #require(await until { server.api.streamCounters.pushes.load(ordering: .relaxed) > pushes }, "the batch was pushed into the silent link")
        } else {
            try #require(await until { proxy.forwarded.received >= received + 4096 }, "the push began")
        }
        let partial = sent.filter { (try? bob.message($0)) != nil }.count
        #expect(partial < sent.count, "the failure came before the whole batch was applied (\(partial))")
        if blackholed {
            try await Task.sleep(for: .milliseconds(700))  // nothing comes through meanwhile
            #expect(sent.allSatisfy { (try? bob.message($0)) == nil }, "nothing came through the silent link")
            proxy.blackhole(false)
            #expect(await until(seconds: 10) { server.api.streamCounters.opened.load(ordering: .relaxed) >= 2 }, "bob opened a new stream")
        } else {
            #expect(await until(seconds: 10) { server.api.streamCounters.open == 0 }, "the cut ended the stream")
            try await Task.sleep(for: .milliseconds(700))  // a reconnection or two refused
            proxy.restore()
        }

        #expect(await until(seconds: 30) { sent.allSatisfy { (try? bob.message($0)) != nil } }, "every message arrived after the cut")
        #expect(server.api.streamCounters.opened.load(ordering: .relaxed) >= 2, "through a new stream")
        let page = try bob.messages(in: hello.id.conversation, limit: 100)
        #expect(page.messages.count == 41 && Set(page.messages.map(\.id)).count == 41)
        try await Task.sleep(for: .milliseconds(200))
        let counts = Dictionary(added.withLock { $0 }.map { ($0, 1) }, uniquingKeysWith: +)
        #expect(sent.allSatisfy { counts[$0] == 1 }, "each message added once: \(counts.values.filter { $0 != 1 })")
    }
}
