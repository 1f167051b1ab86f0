import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// `convkitd sync` as a process: two stores kept by two daemons through one `convkitd serve`
/// (and through a folder) exchange messages written into them by other processes; a daemon
/// whose server is killed and started again catches up; SIGTERM stops it cleanly.
@Suite struct ConvkitdSyncTests {
    /// Stores for alice and bob with one conversation, set up and synced once, then closed.
    func setUp(_ directory: TemporaryDirectory, backend: BackendFactory) async throws {
        var alice: ConversationStore? = try ConversationStore(directory: directory.path + "/alice", backend: backend)
        var bob: ConversationStore? = try ConversationStore(directory: directory.path + "/bob", backend: backend)
        try await alice?.setupLocalSpeaker(identifier: "alice", name: "Alice")
        try await bob?.setupLocalSpeaker(identifier: "bob", name: "Bob")
        _ = try await alice?.send("hello", to: "bob")
        for _ in 0..<2 { try await alice?.sync(); try await bob?.sync() }
        alice = nil
        bob = nil
    }

    func daemon(_ store: String, _ backend: [String], pollInterval: Int = 1) throws -> ChildProcess {
        try ChildProcess(try builtProduct("convkitd"), ["sync", "--store", store, "--poll-interval", "\(pollInterval)"] + backend)
    }

    /// The server's `convkitd_requests_total`, by route (`/metrics` itself left out).
    func requests(_ port: Int) async throws -> [String: Int] {
        let text = try await RawConnection.exchange(port: port, method: "GET", path: "/metrics").text
        var counts = [String: Int]()
        for line in text.split(separator: "\n") where line.hasPrefix("convkitd_requests_total{") {
            guard let route = line.firstMatch(of: /route="([^"]*)"/)?.1, route != "metrics", let value = line.split(separator: " ").last.flatMap({ Int($0) }) else { continue }
            counts[String(route), default: 0] += value
        }
        return counts
    }

    func serve(_ data: String, port: Int = 0) async throws -> (ChildProcess, Int) {
        try await startServe(["--data", data], port: port)
    }

    /// Alice's store gets a message from another process (no sync there); both daemons carry it
    /// to Bob's store within 2 s.
    func exchange(_ directory: TemporaryDirectory, daemons: [ChildProcess], text: String, seconds: Double = 2) async throws {
        let writer = try ConversationStore(directory: directory.path + "/alice", backend: .memory(InMemoryBackend()))
        let sent = try await writer.send(text, to: "bob")
        let start = ContinuousClock.now
        let arrived = await daemons[1].waitUntil(seconds: seconds) { $0.standardError.contains("message added \(sent.id.conversation)/\(sent.id.name)") }
        #expect(arrived, "reached bob's daemon within \(seconds) s (took \(ContinuousClock.now - start)): \(daemons.map(\.standardError))")
        // Readable there too: the first message of a conversation may land before the key it
        // is sealed with (shown waiting for it), which the daemon brings within the same time.
        let reader = try ConversationStore(directory: directory.path + "/bob", backend: .memory(InMemoryBackend()))
        let deadline = ContinuousClock.now + .seconds(seconds)
        while try reader.message(sent.id)?.content != text, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        let got = try reader.message(sent.id)
        #expect(got?.content == text, "\(String(describing: got))")
    }

    func stop(_ daemons: [ChildProcess]) async {
        for daemon in daemons {
            daemon.kill(SIGTERM)
            #expect(await daemon.wait() == 0, "\(daemon.standardError)")
            #expect(daemon.standardError.contains("received SIGTERM, stopping") && daemon.standardError.contains("stopped"))
        }
    }

    @Test func twoDaemonsThroughOneServer() async throws {
        let directory = try TemporaryDirectory("ckd-sync")
        let (server, port) = try await serve(directory.path + "/server")
        let url = "http://127.0.0.1:\(port)"
        try await setUp(directory, backend: .server(try #require(URL(string: url))))
        // The database feed looked at every ten minutes: what arrives comes down the streams.
        let daemons = try ["alice", "bob"].map { try daemon(directory.path + "/" + $0, ["--server", url], pollInterval: 600) }
        for daemon in daemons { #expect(await daemon.waitUntil(seconds: 30) { $0.standardError.contains("syncing") }) }
        var streams = false
        for _ in 0..<250 where !streams {
            streams = try await RawConnection.exchange(port: port, method: "GET", path: "/metrics").text.contains("convkitd_streams_open 2")
            if !streams { try await Task.sleep(for: .milliseconds(20)) }
        }
        #expect(streams, "each daemon holds a stream")
        try await exchange(directory, daemons: daemons, text: "live through the server")

        // Counted from outside, by the server: a live message is its save, and the receiver's
        // Delivery record's (one per message at most: several may share one) — nothing fetched
        // or polled. (From once the first message's Delivery record went out.)
        #expect(await daemons[1].waitUntil(seconds: 10) { $0.standardError.contains("synced pushed=1") })
        let before = try await requests(port)
        for n in 0..<5 { try await exchange(directory, daemons: daemons, text: "counted \(n)") }
        try await Task.sleep(for: .milliseconds(500))  // the last Delivery record went out
        let after = try await requests(port)
        let asked = after.filter { $0.value != before[$0.key] ?? 0 }.mapValues { $0 }
        let saves = (after["modify"] ?? 0) - (before["modify"] ?? 0)
        #expect(Set(asked.keys) == ["modify"], "only saves: \(asked) (before: \(before))")
        #expect((5...10).contains(saves), "\(saves) saves for 5 messages")

        // The server is killed and started again on the same port and data: the daemons catch up.
        server.kill(SIGKILL)
        _ = await server.wait()
        let writer = try ConversationStore(directory: directory.path + "/alice", backend: .memory(InMemoryBackend()))
        let sent = try await writer.send("while the server was down", to: "bob")
        #expect(await daemons[0].waitUntil(seconds: 10) { $0.standardError.contains("backend unreachable") })
        let (again, _) = try await serve(directory.path + "/server", port: port)
        #expect(await daemons[1].waitUntil(seconds: 40) { $0.standardError.contains("message added \(sent.id.conversation)/\(sent.id.name)") },
                "caught up without help: \(daemons[1].standardError)")
        await stop(daemons)
        again.kill(SIGTERM)
        _ = await again.wait()
    }

    /// A running daemon asks nothing while nobody writes to it (the stream tells it when to
    /// read the database feed); a conversation someone else starts with it, and a group it is
    /// let into, reach it down the stream at once, not at the next look at the feed (once a
    /// minute).
    @Test func newConversationsReachARunningDaemonWithNoPollOfTheFeed() async throws {
        let directory = try TemporaryDirectory("ckd-sync-feed")
        let (server, port) = try await serve(directory.path + "/server")
        let backend = BackendFactory.server(try #require(URL(string: "http://127.0.0.1:\(port)")))
        try await setUp(directory, backend: backend)
        let carol = try ConversationStore(directory: directory.path + "/carol", backend: backend)
        try await carol.setupLocalSpeaker(identifier: "carol", name: "Carol")
        try await carol.sync()
        let bob = try daemon(directory.path + "/bob", ["--server", "http://127.0.0.1:\(port)"])
        #expect(await bob.waitUntil(seconds: 30) { $0.standardError.contains("syncing") })
        var streams = false
        for _ in 0..<250 where !streams {
            streams = try await RawConnection.exchange(port: port, method: "GET", path: "/metrics").text.contains("convkitd_stream_feeds_total 1")
            if !streams { try await Task.sleep(for: .milliseconds(20)) }
        }
        #expect(streams, "the stream told of the feed once, when asked")
        // Three of its 1-second ticks go by: not one request (an older store polled the feed at each).
        try await Task.sleep(for: .milliseconds(500))  // the first round's requests are counted
        let before = try await requests(port)
        try await Task.sleep(for: .milliseconds(3200))
        let idle = try await requests(port)
        #expect(idle == before, "an idle daemon asked: \(idle.filter { $0.value != before[$0.key] ?? 0 }) (before: \(before))")

        let sent = try await carol.send("a new conversation", to: "bob")
        try await carol.sync()
        let start = ContinuousClock.now
        #expect(await bob.waitUntil(seconds: 5) { $0.standardError.contains("message added \(sent.id.conversation)/\(sent.id.name)") },
                "reached bob within 5 s (took \(ContinuousClock.now - start)): \(bob.standardError)")
        let group = try await carol.createGroup(name: "Trip", members: ["bob"])
        let said = try await carol.send("a new group", toGroup: group.id)
        try await carol.sync()
        #expect(await bob.waitUntil(seconds: 5) { $0.standardError.contains("message added \(said.id.conversation)/\(said.id.name)") },
                "the group reached bob within 5 s: \(bob.standardError)")
        await stop([bob])
        server.kill(SIGTERM)
        _ = await server.wait()
    }

    @Test func twoDaemonsThroughAFolder() async throws {
        let directory = try TemporaryDirectory("ckd-sync-folder")
        let folder = directory.path + "/shared"
        try await setUp(directory, backend: .folder(folder, device: "setup"))
        let daemons = try [("alice", "laptop"), ("bob", "phone")].map { try daemon(directory.path + "/" + $0.0, ["--zone-dir", folder, "--device", $0.1]) }
        for daemon in daemons { #expect(await daemon.waitUntil(seconds: 30) { $0.standardError.contains("syncing") }) }
        try await exchange(directory, daemons: daemons, text: "live through a folder")
        await stop(daemons)
    }

    /// Stores that `convkit init` set up with a folder: `convkitd sync --store` alone syncs them
    /// through the folder and device labels saved in them.
    @Test func twoDaemonsWithOnlyTheirStores() async throws {
        let directory = try TemporaryDirectory("ckd-sync-saved")
        let folder = directory.path + "/shared", convkit = try builtProduct("convkit")
        func run(_ arguments: [String]) async throws {
            let child = try ChildProcess(convkit, arguments)
            #expect(await child.wait() == 0, "\(arguments): \(child.standardError)")
        }
        for (who, device) in [("alice", "laptop"), ("bob", "phone")] {
            try await run(["init", "--id", who, "--name", who, "--zone-dir", folder, "--device", device, "--store", directory.path + "/" + who])
        }
        for who in ["alice", "bob", "alice"] { try await run(["sync", "--store", directory.path + "/" + who]) }
        let daemons = try ["alice", "bob"].map { try daemon(directory.path + "/" + $0, []) }
        for daemon in daemons { #expect(await daemon.waitUntil(seconds: 30) { $0.standardError.contains("syncing") }, "\(daemon.standardError)") }
        try await exchange(directory, daemons: daemons, text: "through the saved folder")
        await stop(daemons)
        // Each wrote to the folder as the device its store saved, not as the host.
        let zones = try FileManager.default.contentsOfDirectory(atPath: folder + "/zones")
        let devices = try zones.flatMap { zone in
            try FileManager.default.contentsOfDirectory(atPath: "\(folder)/zones/\(zone)").flatMap { try FileManager.default.contentsOfDirectory(atPath: "\(folder)/zones/\(zone)/\($0)") }
        }
        #expect(!devices.isEmpty && devices.allSatisfy { $0.hasPrefix("laptop-") || $0.hasPrefix("phone-") }, "\(devices)")
    }

    @Test func usageErrorsAndFailures() async throws {
        let directory = try TemporaryDirectory("ckd-sync-usage")
        let tool = try builtProduct("convkitd")
        for arguments in [["sync"], ["sync", "--store", directory.path], ["sync", "--store", directory.path, "--server", "ftp://x", "--zone-dir", "/tmp"],
                          ["sync", "--store", directory.path, "--server", "not a url"], ["sync", "--store", directory.path, "--zone-dir", "/tmp", "--poll-interval", "0"],
                          ["sync", "--bogus"]] {
            let child = try ChildProcess(tool, arguments)
            #expect(await child.wait() == 64, "\(arguments): \(child.standardError)")
            #expect(child.standardError.hasPrefix("Error: "))
        }
        let help = try ChildProcess(tool, ["sync", "--help"])
        #expect(await help.wait() == 0)
        #expect(help.standardOutput.contains("USAGE: convkitd sync --store <dir> [--zone-dir <dir> | --server <url>]"))
        let empty = try ChildProcess(tool, ["sync", "--store", directory.path + "/new", "--zone-dir", directory.path + "/shared"])
        #expect(await empty.wait() == 1)
        #expect(empty.standardError.contains("has no local speaker"))
    }
}
