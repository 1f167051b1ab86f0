import Foundation
import PostgresKit
import RecordZone
import Synchronization
import ZoneServer

/// The zone server on PostgreSQL storage beside the same server on SQLite, in one run: batch
/// saves and small fetches through one server on each; the same load through two servers on
/// one database against one; and saves and fetches in a zone holding 10,000 and 1,000,000
/// records. Servers run in this process (each with its own storage, pool and listener, as
/// separate processes would), clients over loopback HTTP.
@MainActor func postgresBench(_ reporter: Reporter, seconds: Double, conninfo: String, largeZone: Int) async throws {
    reporter.header("Zone server storage: PostgreSQL beside SQLite (servers in-process, clients over loopback)")
    let root = FileManager.default.temporaryDirectory.path + "/convkit-pg-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    let database = try await freshBenchDatabase(conninfo)
    let sqlite = try startBenchServer(try SQLiteZoneStorage(directory: root, policy: RecordPolicy()), access: OpenZoneAccess())
    let postgres = try startBenchServer(try await PostgresZoneStorage(conninfo: database, poolSize: 8, policy: RecordPolicy()), access: OpenZoneAccess())
    let postgresTwo = try startBenchServer(try await PostgresZoneStorage(conninfo: database, poolSize: 8, policy: RecordPolicy()), access: OpenZoneAccess())
    let clock = HybridLogicalClock()

    // One client, one server: SQLite, then PostgreSQL.
    var single = [String: (saves: Double, ones: Double, fetches: Double)]()
    for (name, server) in [("sqlite", sqlite), ("postgres", postgres)] {
        let load = try await BenchLoad(url: server.url, zone: "single", clients: 1, clock: clock)
        single[name] = (try await load.saveRate(seconds: seconds, urls: [server.url]), try await load.oneRecordSaveRate(seconds: seconds, urls: [server.url]),
                        try await load.fetchRate(seconds: seconds, urls: [server.url]))
    }
    reporter.report(Row(name: "PG batch save (400/request)", perSecond: single["postgres"]?.saves ?? 0, rawName: "SQLite batch save, same server", rawPerSecond: single["sqlite"]?.saves ?? 1))
    reporter.report(Row(name: "PG 1-record save (a message sent)", perSecond: single["postgres"]?.ones ?? 0, rawName: "SQLite 1-record save, same server", rawPerSecond: single["sqlite"]?.ones ?? 1))
    reporter.report(Row(name: "PG small fetch (1 record)", perSecond: single["postgres"]?.fetches ?? 0, rawName: "SQLite small fetch, same server", rawPerSecond: single["sqlite"]?.fetches ?? 1))

    // Four clients, each in its own zone: through one server, then spread over two.
    let load = try await BenchLoad(url: postgres.url, zone: "spread", clients: 4, clock: clock)
    // Where the CPU goes while saving: PostgreSQL's processes against this one (clients and servers).
    let cpuBefore = (database: try databaseCPUSeconds(database), here: processCPUSeconds())
    let saveStart = ContinuousClock.now
    let oneSaves = try await load.saveRate(seconds: seconds, urls: [postgres.url])
    let saved = oneSaves * secondsIn(ContinuousClock.now - saveStart)
    let cpuAfter = (database: try databaseCPUSeconds(database), here: processCPUSeconds())
    let twoSaves = try await load.saveRate(seconds: seconds, urls: [postgres.url, postgresTwo.url])
    let oneSingles = try await load.oneRecordSaveRate(seconds: seconds, urls: [postgres.url])
    let twoSingles = try await load.oneRecordSaveRate(seconds: seconds, urls: [postgres.url, postgresTwo.url])
    let oneFetches = try await load.fetchRate(seconds: seconds, urls: [postgres.url])
    let twoFetches = try await load.fetchRate(seconds: seconds, urls: [postgres.url, postgresTwo.url])
    if let before = cpuBefore.database, let after = cpuAfter.database {
        reporter.note(String(format: "CPU per 1,000 records saved (4 clients, 1 server): PostgreSQL %.1f ms, this process (clients and server) %.1f ms",
                             (after - before) / saved * 1e6, (cpuAfter.here - cpuBefore.here) / saved * 1e6))
    }
    reporter.report(Row(name: "PG 4 clients, batch save, 2 servers", perSecond: twoSaves, rawName: "the same through 1 server", rawPerSecond: oneSaves))
    reporter.report(Row(name: "PG 4 clients, 1-record save, 2 servers", perSecond: twoSingles, rawName: "the same through 1 server", rawPerSecond: oneSingles))
    reporter.report(Row(name: "PG 4 clients, small fetch, 2 servers", perSecond: twoFetches, rawName: "the same through 1 server", rawPerSecond: oneFetches))

    // A zone holding 10,000 records, then one holding `largeZone`.
    var bySize = [Int: (saves: Double, fetches: Double, pages: Double)]()
    for size in [10_000, largeZone] {
        let zone = "size-\(size)"
        let sized = try await BenchLoad(url: postgres.url, zone: zone, clients: 1, clock: clock)
        let start = ContinuousClock.now
        try await (postgres.server.storage as? PostgresZoneStorage)?.fillForBenchmark(try ZoneName("\(zone)-0"), count: size)
        reporter.note(String(format: "filled a zone with %d records in %.1f s", size, secondsIn(ContinuousClock.now - start)))
        bySize[size] = (try await sized.saveRate(seconds: seconds, urls: [postgres.url]), try await sized.fetchRate(seconds: seconds, urls: [postgres.url]),
                        try await sized.changesRate(seconds: seconds, url: postgres.url))
    }
    let small = bySize[10_000], large = bySize[largeZone]
    reporter.report(Row(name: "PG batch save, zone of \(largeZone)", perSecond: large?.saves ?? 0, rawName: "the same, zone of 10000", rawPerSecond: small?.saves ?? 1))
    reporter.report(Row(name: "PG small fetch, zone of \(largeZone)", perSecond: large?.fetches ?? 0, rawName: "the same, zone of 10000", rawPerSecond: small?.fetches ?? 1))
    reporter.report(Row(name: "PG changes page (50 new), zone of \(largeZone)", perSecond: large?.pages ?? 0, rawName: "the same, zone of 10000", rawPerSecond: small?.pages ?? 1))

    for server in [sqlite.server, postgres.server, postgresTwo.server] { await server.stop() }
    for server in [postgres.server, postgresTwo.server] { (server.storage as? PostgresZoneStorage)?.close() }
}

/// CPU seconds (user and system) this process has used.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// CPU seconds used so far by the PostgreSQL processes serving `conninfo` (its backends and
/// background workers, from `pg_stat_activity` and `/proc`), or nil when they are not on this
/// machine. Backends that ended are not counted: measure while the pools are open.
func databaseCPUSeconds(_ conninfo: String) throws -> Double? {
    let rows = try PostgresConnection(conninfo).execute("SELECT pid FROM pg_stat_activity")
    let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
    var total = 0.0, found = false
    for row in 0..<rows.count {
        guard let pid = rows.int(row, 0), let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { continue }
        // After the command's closing parenthesis: state is field 3; utime and stime are 14 and 15.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { continue }
        total += (user + system) / ticks
        found = true
    }
    return found ? total : nil
}

/// A new database in the cluster `conninfo` names (whose role must be able to create databases).
func freshBenchDatabase(_ conninfo: String) async throws -> String {
    let name = "convkit_bench_\(UUID().uuidString.prefix(8).lowercased())"
    try PostgresConnection(conninfo).execute("CREATE DATABASE \(name)")
    return conninfo.contains("dbname=") ? conninfo.replacingOccurrences(of: #"dbname=\S+"#, with: "dbname=\(name)", options: .regularExpression)
        : conninfo + " dbname=\(name)"
}

/// Clients, each with its key and zone (`<zone>-<n>`), and batches signed ahead of time.
final class BenchLoad: Sendable {
    let keys: [SigningKey]
    let zones: [ZoneName]
    let batches: [[[Record]]]
    let probes: [Record]
    let clock: HybridLogicalClock
    private let next = Mutex([Int]())

    init(url: URL, zone: String, clients: Int, clock: HybridLogicalClock) async throws {
        self.clock = clock
        let keys = (0..<clients).map { _ in SigningKey.generate() }
        let zones = try (0..<clients).map { try ZoneName("\(zone)-\($0)") }
        self.keys = keys
        self.zones = zones
        var batches = [[[Record]]](), probes = [Record]()
        for client in 0..<clients {
            let backend = HTTPBackend(url: url, identity: "\(zone)-\(client)", key: keys[client], policy: RecordPolicy())
            try await backend.createZone(zones[client])
            var index = 0
            batches.append(try (0..<40).map { _ in
                try (0..<Record.maximumBatchSize).map { _ in
                    defer { index += 1 }
                    return try sampleRecord(index, key: keys[client], clock: clock, zone: zones[client])
                }
            })
            let probe = try sampleRecord(999_999_999, key: keys[client], clock: clock, zone: zones[client])
            for result in try await backend.save([probe]) { _ = try result.get() }
            probes.append(probe)
        }
        self.batches = batches
        self.probes = probes
        next.withLock { $0 = Array(repeating: 0, count: clients) }
    }

    /// Records saved per second by every client at once, client n through `urls[n % count]`.
    func saveRate(seconds: Double, urls: [URL]) async throws -> Double {
        try await together(seconds: seconds, urls: urls) { client, backend in
            let index = self.next.withLock { next in
                defer { next[client] += 1 }
                return next[client]
            }
            guard index < self.batches[client].count else { return 0 }
            for result in try await backend.save(self.batches[client][index]) { _ = try result.get() }
            return Record.maximumBatchSize
        }
    }

    /// One-record saves per second (each a transaction, as a message sent), by every client at once.
    func oneRecordSaveRate(seconds: Double, urls: [URL]) async throws -> Double {
        let serial = Atomic<Int>(0)
        return try await together(seconds: seconds, urls: urls) { client, backend in
            let index = 3_000_000_000 + serial.add(1, ordering: .relaxed).newValue
            for result in try await backend.save([try sampleRecord(index, key: self.keys[client], clock: self.clock, zone: self.zones[client])]) { _ = try result.get() }
            return 1
        }
    }

    /// One-record fetches per second (another identity reads, so it verifies), by every client at once.
    func fetchRate(seconds: Double, urls: [URL]) async throws -> Double {
        try await together(seconds: seconds, urls: urls, reader: true) { client, backend in
            guard case .success = try await backend.fetch([self.probes[client].id])[0] else { throw RawError("fetch failed") }
            return 1
        }
    }

    /// Pages of changes fetched per second: the 50 newest records of the first client's zone,
    /// from a token 50 records back (the zone's size must not matter).
    func changesRate(seconds: Double, url: URL) async throws -> Double {
        let backend = HTTPBackend(url: url, identity: "reader-\(UUID().uuidString.prefix(8))", key: SigningKey.generate(), policy: RecordPolicy())
        var token: ChangeToken?
        var page: ZoneChanges
        repeat {
            page = try await backend.fetchChanges(in: zones[0], since: token, limit: 1000)
            token = page.token
        } while page.moreComing
        let pageStart = token
        let writer = HTTPBackend(url: url, identity: zones[0].rawValue, key: keys[0], policy: RecordPolicy())
        let fresh = try (0..<50).map { try sampleRecord(2_000_000_000 + $0, key: keys[0], clock: clock, zone: zones[0]) }
        for result in try await writer.save(fresh) { _ = try result.get() }
        let start = ContinuousClock.now
        var pages = 0
        while ContinuousClock.now - start < .seconds(seconds) {
            let page = try await backend.fetchChanges(in: zones[0], since: pageStart, limit: 1000)
            guard page.records.count == 50, page.rejected.isEmpty else { throw RawError("a changes page held \(page.records.count) records") }
            pages += 1
        }
        return Double(pages) / secondsIn(ContinuousClock.now - start)
    }

    private func together(seconds: Double, urls: [URL], reader: Bool = false,
                          _ body: @escaping @Sendable (Int, HTTPBackend) async throws -> Int) async throws -> Double {
        let start = ContinuousClock.now
        let total = try await withThrowingTaskGroup(of: Int.self) { group in
            for client in keys.indices {
                let url = urls[client % urls.count]
                let backend = HTTPBackend(url: url, identity: reader ? "reader-\(UUID().uuidString.prefix(8))" : zones[client].rawValue, key: reader ? SigningKey.generate() : keys[client],
                                          policy: RecordPolicy())
                group.addTask {
                    var done = 0
                    while ContinuousClock.now - start < .seconds(seconds) {
                        let count = try await body(client, backend)
                        if count == 0 { break }
                        done += count
                    }
                    return done
                }
            }
            return try await group.reduce(0, +)
        }
        return Double(total) / secondsIn(ContinuousClock.now - start)
    }
}
