import Foundation
import RecordZone
import ZoneServer

/// Runs `body` (which does `batch` operations) repeatedly for about `seconds`; returns ops/s.
func rate(seconds: Double, batch: Int = 1, _ body: () throws -> Void) rethrows -> Double {
    let clock = ContinuousClock()
    try body()  // warm up
    var operations = 0
    let start = clock.now
    var elapsed = Duration.zero
    repeat {
        try body()
        operations += batch
        elapsed = clock.now - start
    } while elapsed < .seconds(seconds)
    return Double(operations) / secondsIn(elapsed)
}

/// Runs `ours` and `raw` in turns of about 50 ms each for about `seconds` each in all, so both
/// see the same machine (another process's burst lands on both, not on one): their ops/s.
func interleavedRates(seconds: Double, ours: () throws -> Void, raw: () throws -> Void) rethrows -> (ours: Double, raw: Double) {
    let clock = ContinuousClock()
    try ours()  // warm up
    try raw()
    var counts = (ours: 0, raw: 0), spent = (ours: Duration.zero, raw: Duration.zero)
    let slice = Duration.milliseconds(50)
    while spent.ours < .seconds(seconds) || spent.raw < .seconds(seconds) {
        var start = clock.now
        repeat { try ours(); counts.ours += 1 } while clock.now - start < slice
        spent.ours += clock.now - start
        start = clock.now
        repeat { try raw(); counts.raw += 1 } while clock.now - start < slice
        spent.raw += clock.now - start
    }
    return (Double(counts.ours) / secondsIn(spent.ours), Double(counts.raw) / secondsIn(spent.raw))
}

/// Runs `body` on every core at once for about `seconds`; returns total ops/s.
func parallelRate(seconds: Double, _ body: @escaping @Sendable () -> Void) -> Double {
    let cores = ProcessInfo.processInfo.activeProcessorCount
    let counts = UnsafeMutableBufferPointer<Int>.allocate(capacity: cores)
    counts.initialize(repeating: 0)
    defer { counts.deallocate() }
    nonisolated(unsafe) let shared = counts
    let start = ContinuousClock.now
    DispatchQueue.concurrentPerform(iterations: cores) { core in
        var n = 0
        repeat {
            body()
            n += 1
        } while ContinuousClock.now - start < .seconds(seconds)
        shared[core] = n
    }
    let elapsed = ContinuousClock.now - start
    return Double(counts.reduce(0, +)) / secondsIn(elapsed)
}

/// Like ``rate(seconds:batch:_:)`` for async work; `body` returns false when it has no more to do.
@MainActor func rateAsync(seconds: Double, batch: Int, _ body: () async throws -> Bool) async throws -> Double {
    let clock = ContinuousClock()
    var operations = 0
    let start = clock.now
    var elapsed = Duration.zero
    repeat {
        guard try await body() else { break }
        operations += batch
        elapsed = clock.now - start
    } while elapsed < .seconds(seconds)
    return Double(operations) / secondsIn(elapsed)
}

struct Row: Encodable {
    var name: String
    var perSecond: Double
    var rawName: String
    var rawPerSecond: Double
    var ratio: Double { perSecond / rawPerSecond }

    enum CodingKeys: String, CodingKey { case name, perSecond, rawName, rawPerSecond, ratio }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(name, forKey: .name)
        try c.encode(perSecond, forKey: .perSecond)
        try c.encode(rawName, forKey: .rawName)
        try c.encode(rawPerSecond, forKey: .rawPerSecond)
        try c.encode(ratio, forKey: .ratio)
    }
}

/// Collects rows and prints them as a table (or JSON at the end).
@MainActor final class Reporter {
    let json: Bool
    private(set) var rows = [Row]()

    init(json: Bool) { self.json = json }

    func note(_ text: String) {
        if !json { print(text) }
    }

    func header(_ title: String) {
        note("")
        note(title)
        note(columns("operation", "rate", "raw limit (same bytes, same run)", "rate", "ratio"))
    }

    func report(_ row: Row) {
        rows.append(row)
        note(columns(row.name, String(format: "%.0f/s", row.perSecond), row.rawName, String(format: "%.0f/s", row.rawPerSecond), String(format: "%.2f", row.ratio)))
    }

    func finish() throws {
        guard json else { return }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        print(String(decoding: try encoder.encode(rows), as: UTF8.self))
    }

    private func columns(_ name: String, _ rate: String, _ rawName: String, _ rawRate: String, _ ratio: String) -> String {
        func pad(_ s: String, _ width: Int, left: Bool = false) -> String {
            let fill = String(repeating: " ", count: max(0, width - s.count))
            return left ? fill + s : s + fill
        }
        return pad(name, 40) + pad(rate, 12, left: true) + "   " + pad(rawName, 36) + pad(rawRate, 12, left: true) + pad(ratio, 8, left: true)
    }
}

/// Seconds in a duration, as a Double.
func secondsIn(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

/// A zone server on 127.0.0.1 (port 0) with no rate limit, for the bench.
@MainActor func startBenchServer(_ storage: any ZoneStorage, access: any ZoneAccessPolicy) throws -> (server: ZoneServer, url: URL, port: Int) {
    var configuration = ZoneServerConfiguration()
    configuration.requestsPerSecond = 1_000_000
    configuration.burst = 1_000_000
    let server = ZoneServer(storage: storage, access: access, configuration: configuration)
    let port = try server.start(host: "127.0.0.1", port: 0)
    guard let url = URL(string: "http://127.0.0.1:\(port)") else { throw RawError("bad URL") }
    return (server, url, port)
}

/// The conversation zone of two speakers, as ConversationKit names it.
func chatZone(_ a: String, _ b: String) throws -> ZoneName {
    let hashes = [a, b].map(OwnershipRule.identityHash).sorted()
    return try ZoneName("c-\(hashes[0])-\(hashes[1])")
}

/// Operations per second of `tasks` concurrent tasks each running `body` over and over for
/// about `seconds` (concurrent callers of one store).
func concurrentRate(seconds: Double, tasks: Int, _ body: @escaping @Sendable () async throws -> Void) async throws -> Double {
    try await body()  // warm up
    let start = ContinuousClock.now
    let total = try await withThrowingTaskGroup(of: Int.self) { group in
        for _ in 0..<tasks {
            group.addTask {
                var operations = 0
                repeat {
                    try await body()
                    operations += 1
                } while ContinuousClock.now - start < .seconds(seconds)
                return operations
            }
        }
        return try await group.reduce(0, +)
    }
    return Double(total) / secondsIn(ContinuousClock.now - start)
}

/// Every record `backend` holds, encoded, zone by zone, as a first sync reads them.
func encodedRecords(of backend: any RecordZoneBackend) async throws -> [[UInt8]] {
    var records = [[UInt8]]()
    for zone in try await backend.zones() {
        var token: ChangeToken? = nil
        repeat {
            let page = try await backend.fetchChanges(in: zone, since: token, limit: 1000)
            records += try page.records.map { Array(try $0.encoded()) }
            token = page.token
            if !page.moreComing { break }
        } while true
    }
    return records
}
