import ConversationKit
import Crowd
import Foundation
import RecordZone
import Testing
import TestSupport
import ZoneServer

/// The real `convkitd` under a crowd of online clients, each holding a long poll from one of many
/// loopback addresses (`Crowd`, the client of `convkit-bench --only capacity`).
@Suite(.serialized) struct CrowdTests {
    /// A gauge from `/metrics`.
    static func gauge(_ name: String, port: Int) async throws -> Int {
        let text = try await RawConnection.exchange(port: port, method: "GET", path: "/metrics").text
        let line = try #require(text.split(separator: "\n").first { $0.hasPrefix(name + " ") }, "no \(name) in /metrics")
        return try #require(Int(line.split(separator: " ").last ?? ""))
    }

    static func descriptors(of pid: pid_t) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
    }

    /// Waits (up to `seconds`) until `condition` holds; how long it took, or nil.
    static func waitUntil(seconds: Double, _ condition: () async throws -> Bool) async throws -> Double? {
        let start = ContinuousClock.now
        while ContinuousClock.now - start < .seconds(seconds) {
            if try await condition() { return Double((ContinuousClock.now - start).components.attoseconds) / 1e18 + Double((ContinuousClock.now - start).components.seconds) }
            try await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }

    /// Bob's polls on his conversation with alice, `count` of them from 40 addresses.
    static func members(_ count: Int, zone: ZoneName, first: Int = 0) -> [Crowd.Member] {
        (first..<(first + count)).map { Crowd.Member(identity: "bob", key: Keys.bob, zone: zone, source: "127.0.\(10 + $0 % 40).\(2 + $0 / 40 % 200)") }
    }

    /// Two thousand polls whose clients vanish — half reset their connection, half close it —
    /// are ended at once, not at their 60-second timeout: the server's waiting count and
    /// descriptors go back to where they were before the crowd came.
    @Test func pollsOfClientsThatVanishEndAtOnce() async throws {
        let data = try TemporaryDirectory("convkitd-crowd")
        let (server, port) = try await startServe(["--data", data.path, "--rate-limit", "1000000"])
        defer { server.kill(SIGTERM) }
        let zone = try conversationZone("alice", "bob")
        let bob = HTTPBackend(url: try #require(URL(string: "http://127.0.0.1:\(port)")), identity: "bob", key: Keys.bob, policy: ConversationStore.recordPolicy())
        try await bob.createZone(zone)
        let baseline = Self.descriptors(of: server.pid)
        let openBefore = try await Self.gauge("convkitd_open_connections", port: port)

        let resetting = try Crowd(port: port, members: Self.members(1000, zone: zone), waitSeconds: 60)
        let closing = try Crowd(port: port, members: Self.members(1000, zone: zone, first: 1000), waitSeconds: 60)
        resetting.start()
        closing.start()
        let allWaiting = try await Self.waitUntil(seconds: 120) { try await Self.gauge("convkitd_long_polls_waiting", port: port) == 2000 }
        #expect(allWaiting != nil, "the crowd never had 2000 polls waiting: \(resetting.snapshot), \(closing.snapshot)")
        #expect(resetting.snapshot.errors == 0 && closing.snapshot.errors == 0, "\(resetting.snapshot.firstErrors + closing.snapshot.firstErrors)")
        // (Give or take the test's own keep-alive connection, closed when idle for 15 s.)
        #expect(Self.descriptors(of: server.pid) >= baseline + 1995, "the crowd's connections are not there")

        await resetting.vanish()
        await closing.stop()
        let emptied = try await Self.waitUntil(seconds: 20) {
            try await Self.gauge("convkitd_long_polls_waiting", port: port) == 0 && Self.descriptors(of: server.pid) <= baseline + 4
        }
        let stillWaiting = try await Self.gauge("convkitd_long_polls_waiting", port: port)
        #expect(emptied != nil, "still waiting: \(stillWaiting), descriptors \(Self.descriptors(of: server.pid)) (baseline \(baseline))")
        if let emptied { print("2000 vanished polls ended in \(String(format: "%.2f", emptied)) s") }
        #expect(try await Self.gauge("convkitd_requests_abandoned_total", port: port) == 2000)
        let open = try await Self.gauge("convkitd_open_connections", port: port)
        #expect(open <= openBefore, "\(open) connections still open (\(openBefore) before the crowd)")
        // What the crowd's connections used is given back to the system, at the server's next
        // 5-second look (how much comes back the capacity bench measures: it depends on what
        // else the process holds by then).
        let released = try await Self.waitUntil(seconds: 30) { try await Self.gauge("convkitd_memory_releases_total", port: port) >= 1 }
        #expect(released != nil, "the memory of 2,000 closed connections was not given back")
    }

    /// A thousand clients each hold a stream following the same zone: one save is pushed down
    /// every one of them (one page each, no request), and when they vanish — half reset their
    /// connection, half close it — the server's streams end at once.
    @Test func aSaveIsPushedDownAThousandStreamsAndVanishedOnesEnd() async throws {
        let data = try TemporaryDirectory("convkitd-crowd-streams")
        let (server, port) = try await startServe(["--data", data.path, "--rate-limit", "1000000"])
        defer { server.kill(SIGTERM) }
        let zone = try conversationZone("alice", "bob")
        let alice = HTTPBackend(url: try #require(URL(string: "http://127.0.0.1:\(port)")), identity: "alice", key: Keys.alice, policy: ConversationStore.recordPolicy())
        try await alice.createZone(zone)
        let resetting = try Crowd(port: port, members: Self.members(500, zone: zone), streams: true)
        let closing = try Crowd(port: port, members: Self.members(500, zone: zone, first: 500), streams: true)
        resetting.start()
        closing.start()
        let open = try await Self.waitUntil(seconds: 120) {
            try await Self.gauge("convkitd_streams_open", port: port) == 1000 && resetting.snapshot.waiting + closing.snapshot.waiting == 1000
        }
        #expect(open != nil, "the crowd never held 1000 streams: \(resetting.snapshot), \(closing.snapshot)")
        try await Task.sleep(for: .milliseconds(300))  // the follows read (nothing to push yet)
        let requestsBefore = try await RawConnection.exchange(port: port, method: "GET", path: "/metrics").text
        _ = try await alice.save([try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice, text: "to a thousand")]).map { try $0.get() }
        let delivered = try await Self.waitUntil(seconds: 30) { resetting.snapshot.fetched + closing.snapshot.fetched == 1000 }
        #expect(delivered != nil, "pushed to \(resetting.snapshot.fetched + closing.snapshot.fetched) of 1000")
        #expect(resetting.snapshot.errors == 0 && closing.snapshot.errors == 0, "\(resetting.snapshot.firstErrors + closing.snapshot.firstErrors)")
        let fetches = { (text: String) in text.split(separator: "\n").filter { $0.contains("route=\"zoneChanges\"") || $0.contains("route=\"waitForChanges\"") } }
        let requestsAfter = try await RawConnection.exchange(port: port, method: "GET", path: "/metrics").text
        #expect(fetches(requestsAfter) == fetches(requestsBefore), "no client fetched or polled")

        await resetting.vanish()
        await closing.stop()
        let ended = try await Self.waitUntil(seconds: 20) { try await Self.gauge("convkitd_streams_open", port: port) == 0 }
        let stillOpen = try await Self.gauge("convkitd_streams_open", port: port)
        #expect(ended != nil, "streams still open: \(stillOpen)")
    }

    /// A reconnect storm: a fifth of a thousand online clients close their connection and open a
    /// new one every half second to second, while messages flow to all of them. No honest
    /// client sees an error (a refused or reset connection, an answer other than 200), and
    /// every message reaches its client.
    @Test func aReconnectStormGivesHonestClientsNoError() async throws {
        let data = try TemporaryDirectory("convkitd-churn")
        let (server, port) = try await startServe(["--data", data.path, "--rate-limit", "1000000"])
        defer { server.kill(SIGTERM) }
        let url = try #require(URL(string: "http://127.0.0.1:\(port)"))
        let alice = HTTPBackend(url: url, identity: "alice", key: Keys.alice, policy: ConversationStore.recordPolicy())
        let members = try (0..<1000).map { index in
            Crowd.Member(identity: "c\(index)", key: SigningKey.generate(), zone: try conversationZone("alice", "c\(index)"),
                         source: "127.1.\(index % 50).\(2 + index / 50)")
        }
        for member in members { try await alice.createZone(member.zone) }
        let crowd = try Crowd(port: port, members: members, waitSeconds: 60, churn: Crowd.Churn(share: 0.2, every: 0.5...1))
        crowd.start()
        let online = try await Self.waitUntil(seconds: 120) { crowd.snapshot.waiting >= 990 }
        #expect(online != nil, "\(crowd.snapshot)")
        var sent = 0
        for round in 0..<8 {
            // 50 messages to 50 clients, then a pause: churn goes on meanwhile.
            let records = try (0..<50).map { index in
                let client = (round * 50 + index) * 7 % members.count
                return try message(members[client].zone, "r\(round)-\(index)", from: "alice", to: "c\(client)", key: Keys.alice)
            }
            for record in records { _ = try await alice.save([record])[0].get() }
            sent += records.count
            try await Task.sleep(for: .milliseconds(500))
        }
        let delivered = try await Self.waitUntil(seconds: 60) { crowd.snapshot.fetched >= sent }
        let stats = crowd.snapshot
        await crowd.stop()
        #expect(delivered != nil, "\(stats.fetched) of \(sent) messages reached their clients")
        #expect(stats.connections - members.count > 300, "the storm was too small to mean anything: \(stats.connections - members.count) reconnections")
        #expect(stats.errors == 0, "\(stats.errors) errors: \(stats.firstErrors)")
    }

    /// Every connection of the main listener held by clients in long polls: the operator's
    /// address (`--operator-listen`) still answers `/healthz` and `/metrics` — and only those.
    @Test func theOperatorsAddressAnswersWhenClientsHoldEveryConnection() async throws {
        let data = try TemporaryDirectory("convkitd-operator")
        let (server, port) = try await startServe(["--data", data.path, "--rate-limit", "1000000", "--max-connections", "16", "--operator-listen", "127.0.0.1:0"])
        defer { server.kill(SIGTERM) }
        let listening = await server.waitUntil(seconds: 30) { $0.standardError.components(separatedBy: "listening on 127.0.0.1:").count >= 3 }
        try #require(listening, "\(server.standardError)")
        let operatorPort = try #require(server.standardError.components(separatedBy: "listening on 127.0.0.1:").last.flatMap { Int($0.prefix { $0.isNumber }) })
        let zone = try conversationZone("alice", "bob")
        let bob = HTTPBackend(url: try #require(URL(string: "http://127.0.0.1:\(port)")), identity: "bob", key: Keys.bob, policy: ConversationStore.recordPolicy())
        try await bob.createZone(zone)
        let crowd = try Crowd(port: port, members: Self.members(40, zone: zone), waitSeconds: 60)
        crowd.start()
        let full = try await Self.waitUntil(seconds: 60) { try await Self.gauge("convkitd_long_polls_waiting", port: operatorPort) >= 15 }
        #expect(full != nil)
        #expect(try await Self.gauge("convkitd_open_connections", port: operatorPort) == 16, "the main listener is full")
        let health = try await RawConnection.exchange(port: operatorPort, method: "GET", path: "/healthz")
        #expect(health.status == 200)
        let other = try await RawConnection.exchange(port: operatorPort, method: "GET", path: "/v1/zones")
        #expect(other.status == 404 && other.text.contains("routeNotFound"), "\(other.status) \(other.text)")
        await crowd.vanish()
    }
}
