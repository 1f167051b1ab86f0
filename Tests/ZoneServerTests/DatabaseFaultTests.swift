import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport
import ZoneServer

/// `convkitd serve --storage` whose link to PostgreSQL falls silent: a proxy between them
/// (`FaultProxy`) keeps the connections open and answers nothing, as a stalled proxy or a hung
/// backend would — what neither TCP keepalives nor `tcp_user_timeout` notice.
@Suite(.enabled(if: SharedPostgres.isAvailable, "PostgreSQL is not installed (scripts/setup.sh installs it)"))
struct DatabaseFaultTests {
    /// The bound a request's database work is held to (5 s for the work, 5 s at most for a free
    /// connection), with room for a loaded machine: without deadlines, requests wait out the
    /// whole fault (here 60 s).
    static let bound: Duration = .seconds(15)

    @Test func aSilentDatabaseLinkIsAnswered503AndTheServerRecoversByItself() async throws {
        let conninfo = try await SharedPostgres.freshDatabase()
        let fields = Dictionary(conninfo.split(separator: " ").compactMap { part -> (String, String)? in
            let pair = part.split(separator: "=", maxSplits: 1).map(String.init)
            return pair.count == 2 ? (pair[0], pair[1]) : nil
        }, uniquingKeysWith: { $1 })
        let host = try #require(fields["host"], "\(conninfo)"), port = try #require(fields["port"]), database = try #require(fields["dbname"])
        try #require(host.hasPrefix("/"), "the test cluster listens on a Unix socket: \(conninfo)")
        let proxy = try FaultProxy(unixSocket: "\(host)/.s.PGSQL.\(port)")
        defer { proxy.stop() }
        let (server, serverPort) = try await startServe(["--storage", "host=127.0.0.1 port=\(proxy.port) user=\(fields["user"] ?? "convkit") dbname=\(database)",
                                                          "--pool-size", "2"])
        defer { server.kill(SIGTERM) }
        let url = try #require(URL(string: "http://127.0.0.1:\(serverPort)"))
        let zone = try conversationZone("alice", "bob")
        // No retries: the server's own answer is timed.
        let alice = HTTPBackend(url: url, identity: "alice", key: Keys.alice, policy: ConversationStore.recordPolicy(), maximumRetries: 0)
        try await alice.createZone(zone)
        _ = try await alice.save([try message(zone, "before", from: "alice", to: "bob", key: Keys.alice)])[0].get()
        // Healthy before the fault: the notification connection, which opens on a thread of its
        // own, may still be connecting through the proxy on a loaded machine (then 503, and why).
        let ready = try await waitForHealth(200, port: serverPort)
        #expect(ready == nil, "/healthz never answered 200 before the fault: \(ready ?? "")")

        proxy.blackhole(true)
        // A save: 503 with Retry-After, within the bound.
        let start = ContinuousClock.now
        do {
            _ = try await alice.save([try message(zone, "during", from: "alice", to: "bob", key: Keys.alice)])[0].get()
            Issue.record("a save was acknowledged while the database could not be reached")
        } catch {
            let failure = error as? RecordZoneError
            #expect(failure?.code == .serviceUnavailable && failure?.retryAfter != nil, "\(error)")
        }
        let took = ContinuousClock.now - start
        #expect(took < Self.bound, "the save was answered after \(took)")
        // /healthz says so too, within the bound.
        let healthStart = ContinuousClock.now
        let health = try await RawConnection.exchange(port: serverPort, method: "GET", path: "/healthz")
        #expect(health.status == 503 && health.headers["retry-after"] != nil, "\(health.status) \(health.text)")
        let healthTook = ContinuousClock.now - healthStart
        #expect(healthTook < Self.bound)
        print("silent database link: the save answered 503 after \(took), /healthz after \(healthTook)")

        // The link comes back: the server recovers by itself.
        proxy.blackhole(false)
        let recovered = try await waitForHealth(200, port: serverPort)
        #expect(recovered == nil, "/healthz never answered 200 again: \(recovered ?? "")")
        _ = try await alice.save([try message(zone, "after", from: "alice", to: "bob", key: Keys.alice)])[0].get()
        let names = try await alice.fetchChanges(in: zone, since: nil, limit: 10).records.map(\.id.name)
        #expect(names.contains { $0.hasSuffix("after") } && names.contains { $0.hasSuffix("before") } && !names.contains { $0.hasSuffix("during") }, "\(names)")
    }
}
