import ChatSchema
import Foundation
import RecordZone
import ZoneServer

/// The operator's console (`convkitd serve --console`): its pages of a zone of 1,000,000 records
/// against the same pages of a zone of 10,000 — each page a seek by key, so the ratio stays
/// near 1 — and how long one takes, against the goal of 100 ms (docs/SERVER.md, "Console").
@MainActor func consoleBench(_ reporter: Reporter, seconds: Double) async throws {
    reporter.header("Console: pages of a zone of 1,000,000 records (each row a signed record, decoded and checked)")
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("convkit-bench-console-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let storage = try SQLiteZoneStorage(directory: directory, policy: ChatSchema.recordPolicy())
    var configuration = ZoneServerConfiguration()
    configuration.requestsPerSecond = 1_000_000
    configuration.burst = 1_000_000
    let token = String(repeating: "5", count: 64)
    configuration.console = ConsoleSettings(token: token)
    let server = ZoneServer(storage: storage, access: ChatZoneAccess(), configuration: configuration)
    let port = try server.start(host: "127.0.0.1", port: 0)
    defer { Task { await server.stop() } }

    // Every row holds one real message's bytes: each shown row is decoded and its signature checked.
    let key = SigningKey.generate()
    var message = Record(id: try RecordID(zone: ZoneName("size-bench"), name: "m.0000000000000000.0000000000000000-0000000000000000"), type: "Message",
                         fields: ["speaker": .string("alice"), "listener": .string("bob"), "content": .string(String(repeating: "x", count: 200)),
                                  "spokenAt": .date(Date())])
    try message.sign(with: key, clock: HybridLogicalClock().now())
    let bytes = try message.encoded()
    for size in [10_000, 1_000_000] {
        let zone = try ZoneName("size-\(size)")
        try await storage.createZone(zone)
        let start = ContinuousClock.now
        try await storage.fillForBenchmark(zone, count: size, record: bytes)
        reporter.note(String(format: "filled a zone with %d records in %.1f s", size, secondsIn(ContinuousClock.now - start)))
    }

    let connection = try KeepAliveConnection(port: port)
    let form = "token=\(token)"
    let answer = String(decoding: try connection.roundTrip("POST /console/sign-in HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: \(form.utf8.count)\r\n\r\n\(form)"), as: UTF8.self)
    guard let cookie = answer.split(separator: "\r\n").first(where: { $0.lowercased().hasPrefix("set-cookie:") })?
        .dropFirst("set-cookie:".count).split(separator: ";").first?.trimmingCharacters(in: .whitespaces) else { throw RawError("no session cookie: \(answer.prefix(200))") }
    func get(_ path: String) throws { try connection.roundTrip("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: \(cookie)\r\n\r\n") }

    let pages: [(String, (Int) -> String)] = [
        ("zone page (50 records, checked)", { "/console/zones/size-\($0)?after=filler-\(String(format: "%09d", $0 / 2))" }),
        ("record page", { "/console/zones/size-\($0)/records/filler-\(String(format: "%09d", $0 / 2))" }),
        ("changes page (50, from the start)", { "/console/zones/size-\($0)/changes" }),
    ]
    for (name, path) in pages {
        // The zone's size is counted once, in the background, before the measurement.
        try get(path(1_000_000))
        try get(path(10_000))
        try await Task.sleep(for: .seconds(2))
        let large = try rate(seconds: seconds) { try get(path(1_000_000)) }
        let small = try rate(seconds: seconds) { try get(path(10_000)) }
        reporter.report(Row(name: "console \(name), 1,000,000", perSecond: large, rawName: "the same, zone of 10,000", rawPerSecond: small))
        reporter.note(String(format: "  %.1f ms a page in the zone of 1,000,000 (goal: under 100 ms)", 1000 / large))
    }
}
