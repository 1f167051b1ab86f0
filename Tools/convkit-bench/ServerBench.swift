import ConversationKit
import CRawLimits
import Foundation
import RecordZone
import ZoneServer
#if canImport(Glibc)
import Glibc
#endif

/// The zone server over loopback: small fetches and batch saves through the HTTP backend
/// (signed requests, records as bytes, server checks, client verification), beside raw limits
/// measured in the same run: a bare libmicrohttpd responder in C (the zone server's thread
/// model and options, a fixed answer) and a raw TCP echo round trip.
@MainActor func serverBench(_ reporter: Reporter, seconds: Double) async throws {
    reporter.header("Zone server over loopback (libmicrohttpd, SQLite)")
    let rawHTTP = try KeepAliveConnection(port: try rawResponderPort())
    let rawRoundTrip = try rate(seconds: seconds) { try rawHTTP.roundTrip("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") }
    let echoPort = raw_echo_start()
    guard echoPort != 0 else { throw RawError("cannot start the raw TCP echo") }
    let echo = try KeepAliveConnection(port: Int(echoPort))
    let ping = [UInt8](repeating: 0x2A, count: 64)
    let rawTCP = try rate(seconds: seconds) { try echo.echo(ping) }
    reporter.report(Row(name: "raw libmicrohttpd round trip (C)", perSecond: rawRoundTrip, rawName: "raw TCP round trip (C echo)", rawPerSecond: rawTCP))

    let root = FileManager.default.temporaryDirectory.path + "/convkit-server-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    let (server, url, port) = try startBenchServer(try SQLiteZoneStorage(directory: root, policy: RecordPolicy()), access: OpenZoneAccess())
    let key = SigningKey.generate()
    let client = HTTPBackend(url: url, identity: "bench", key: key, policy: RecordPolicy())
    let zone = try ZoneName("bench")
    try await client.createZone(zone)
    let clock = HybridLogicalClock()

    // The HTTP client alone (libcurl), for a round trip to our server: the client's own share.
    let clientRoundTrip = try await rateAsync(seconds: seconds, batch: 1) {
        guard await client.isHealthy() else { throw RawError("GET /healthz failed") }
        return true
    }
    reporter.report(Row(name: "libcurl client GET /healthz", perSecond: clientRoundTrip, rawName: "raw libmicrohttpd round trip", rawPerSecond: rawRoundTrip))

    // A fetch cannot avoid one round trip and one signature verification (the client's).
    let sample = Data(repeating: 7, count: 240), signature = key.sign(sample), publicKey = key.publicKey
    let verifyOne = rate(seconds: seconds) { precondition(Sodium.verify(signature: signature, message: sample, publicKey: publicKey)) }
    // A reader that did not write the record, so its verification is not skipped.
    let reader = HTTPBackend(url: url, identity: "reader", key: SigningKey.generate(), policy: RecordPolicy())
    let one = try sampleRecord(0, key: key, clock: clock, zone: zone)
    _ = try await client.save([one])
    let fetches = try await rateAsync(seconds: seconds, batch: 1) {
        guard case .success = try await reader.fetch([one.id])[0] else { throw RawError("fetch failed") }
        return true
    }
    reporter.report(Row(name: "small fetch (1 record, signed, verified)", perSecond: fetches,
                        rawName: "raw libmicrohttpd trip + 1 verify", rawPerSecond: 1 / (1 / rawRoundTrip + 1 / verifyOne)))

    var next = 1
    let batches = try (0..<max(4, Int(20 * seconds))).map { _ in
        try (0..<Record.maximumBatchSize).map { _ in
            defer { next += 1 }
            return try sampleRecord(next, key: key, clock: clock, zone: zone)
        }
    }
    // Raw for a batch: the same body bytes posted to the raw responder, plus verifying 400
    // signatures on all cores, which the server must do.
    let body = try Wire.encode(try Wire.Modify(records: batches[0], policy: .merge), binary: true)
    let post = Data("POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \(Wire.recordsType)\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body
    let rawPosts = try rate(seconds: seconds) { try rawHTTP.roundTrip(post) }
    let verifyAll = parallelRate(seconds: seconds) {
        precondition(Sodium.verify(signature: signature, message: sample, publicKey: publicKey))
    }
    var index = 0
    let saves = try await rateAsync(seconds: seconds, batch: Record.maximumBatchSize) {
        guard index < batches.count else { return false }
        for result in try await client.save(batches[index]) { _ = try result.get() }
        index += 1
        return true
    }
    let rawBatchLimit = 1 / (1 / (rawPosts * Double(Record.maximumBatchSize)) + 1 / verifyAll)
    reporter.report(Row(name: "batch save (400 records per request)", perSecond: saves,
                        rawName: "raw POST same bytes + verify", rawPerSecond: rawBatchLimit))

    // The server's own verifications per record, counted over raw signed requests (the one
    // verification of each request's signature is not a record's).
    let fresh = try (0..<Record.maximumBatchSize).map { try sampleRecord(1_000_000 + $0, key: key, clock: clock, zone: zone) }
    let ourServer = try KeepAliveConnection(port: port)
    func signedPost(_ path: String, _ body: Data, contentType: String) throws -> Int {
        let before = Sodium.verificationCount
        let authorization = RequestSignature.authorization(method: "POST", path: path, query: [], body: body, identity: "bench", key: key, now: Date())
        try ourServer.roundTrip(Data("POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \(contentType)\r\nAuthorization: \(authorization)\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body)
        return Sodium.verificationCount - before - 1
    }
    let perSaved = Double(try signedPost("/v1/records/modify", try Wire.encode(try Wire.Modify(records: fresh, policy: .merge), binary: true), contentType: Wire.recordsType)) / Double(fresh.count)
    let perFetched = Double(try signedPost("/v1/records/fetch", try JSONEncoder().encode(Wire.Fetch(ids: fresh.map { Wire.ID($0.id) })), contentType: Wire.jsonType)) / Double(fresh.count)
    reporter.note(String(format: "server signature verifications per record: saved %.2f, fetched %.2f (400 per request, beyond the request's own)", perSaved, perFetched))
    await server.stop()
}

/// The bare libmicrohttpd responder (C, the zone server's options), started once per run.
@MainActor private var rawResponder: Int?
@MainActor func rawResponderPort() throws -> Int {
    if let rawResponder { return rawResponder }
    let limits = HTTPLimits()
    let port = Int(raw_http_start(limits.maximumConnections, limits.connectionTimeoutSeconds, limits.connectionMemoryBytes))
    guard port != 0 else { throw RawError("cannot start the raw libmicrohttpd responder") }
    rawResponder = port
    return port
}

/// Keep-alive round trips per second to the raw responder.
@MainActor func rawLibmicrohttpdRoundTrips(seconds: Double) throws -> Double {
    let connection = try KeepAliveConnection(port: try rawResponderPort())
    return try rate(seconds: seconds) { try connection.roundTrip("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") }
}

/// A keep-alive HTTP/1.1 connection that reads answers by their Content-Length.
final class KeepAliveConnection {
    private let fd: Int32
    private var buffer = [UInt8](repeating: 0, count: 65536)

    init(port: Int) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard fd >= 0, connected == 0 else { throw RawError("cannot connect to 127.0.0.1:\(port)") }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    deinit { close(fd) }

    @discardableResult
    func roundTrip(_ request: String) throws -> [UInt8] { try roundTrip(Data(request.utf8)) }

    /// Sends bytes and reads the same number back (a TCP echo).
    func echo(_ bytes: [UInt8]) throws {
        guard send(fd, bytes, bytes.count, Int32(MSG_NOSIGNAL)) == bytes.count else { throw RawError("send failed") }
        var received = 0
        while received < bytes.count {
            let n = recv(fd, &buffer, buffer.count, 0)
            guard n > 0 else { throw RawError("connection closed") }
            received += n
        }
    }

    /// Sends a request and reads its answer (head and body) by its Content-Length.
    @discardableResult
    func roundTrip(_ request: Data) throws -> [UInt8] {
        let bytes = [UInt8](request)
        guard send(fd, bytes, bytes.count, Int32(MSG_NOSIGNAL)) == bytes.count else { throw RawError("send failed") }
        var received = [UInt8]()
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            guard n > 0 else { throw RawError("connection closed") }
            received += buffer[0..<n]
            if let end = received.firstRange(of: Array("\r\n\r\n".utf8)) {
                let head = String(decoding: received[..<end.lowerBound], as: UTF8.self).lowercased()
                guard let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }),
                      let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
                else { throw RawError("no Content-Length") }
                if received.count - end.upperBound >= length { return received }
            }
        }
    }
}

/// Records saved (and fetched back) per run of the memory measurement.
let memoryRunRecords = 5200

/// `convkitd serve` as a process: its resident memory after each of three identical runs of
/// saves and fetches (5,200 messages saved in batches of 400, then fetched back page by page).
/// A server that keeps nothing per record stays flat after the first run.
@MainActor func serverMemoryBench(_ reporter: Reporter) async throws {
    let root = FileManager.default.temporaryDirectory.path + "/convkit-memory-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    guard let started = try startConvkitd(data: root, reporter: reporter, purpose: "convkitd memory") else { return }
    let (process, url) = started
    defer { process.terminate() }
    let key = SigningKey.generate()
    let client = HTTPBackend(url: url, identity: "bench", key: key, policy: ConversationStore.recordPolicy())
    let clock = HybridLogicalClock()
    var sizes = [Int]()
    for run in 0..<3 {
        // convkitd serves chat zones: a conversation of "bench" with another speaker per run.
        let other = "other-\(run)"
        let zone = try chatZone("bench", other)
        try await client.createZone(zone)
        for batch in 0..<(memoryRunRecords / Record.maximumBatchSize) {
            let records = try (0..<Record.maximumBatchSize).map { index in
                var message = Record(id: try RecordID(zone: zone, name: "m.\(OwnershipRule.identityHash("bench")).\(batch)-\(index)"), type: "Message", fields: [
                    "speaker": .string("bench"), "listener": .string(other), "content": .string("message \(batch)-\(index), about as long as a chat line"),
                    "spokenAt": .date(milliseconds: 1_800_000_000_000),
                ])
                try message.sign(with: key, clock: clock.now())
                return message
            }
            for result in try await client.save(records) { _ = try result.get() }
        }
        var token: ChangeToken? = nil
        repeat {
            let page = try await client.fetchChanges(in: zone, since: token, limit: 500)
            token = page.token
            if !page.moreComing { break }
        } while true
        sizes.append(try residentKilobytes(of: process.processIdentifier))
    }
    reporter.note("convkitd resident memory after each of 3 identical runs (\(memoryRunRecords) saved + fetched): " + sizes.map { "\($0 / 1024) MB" }.joined(separator: ", ")
                  + String(format: " (%+.1f MB from the first run to the third)", Double(sizes[2] - sizes[0]) / 1024))
}

/// Starts the release `convkitd serve` built beside the bench on a free port; nil (with a note)
/// when it was not built.
@MainActor func startConvkitd(data: String, reporter: Reporter, purpose: String, extra: [String] = []) throws -> (Process, URL)? {
    let convkitd = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("convkitd").path
    guard FileManager.default.isExecutableFile(atPath: convkitd) else {
        reporter.note("\(purpose): skipped (build it beside convkit-bench: swift build -c release --product convkitd)")
        return nil
    }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: convkitd)
    process.arguments = ["serve", "--data", data, "--listen", "127.0.0.1:0", "--rate-limit", "1000000"] + extra
    let errors = Pipe()
    process.standardError = errors
    try process.run()
    var log = ""
    while !log.contains("listening on") {
        let chunk = errors.fileHandleForReading.availableData
        guard !chunk.isEmpty else { throw RawError("convkitd exited: \(log)") }
        log += String(decoding: chunk, as: UTF8.self)
    }
    guard let portText = log.split(separator: "\n").first(where: { $0.contains("listening on") })?.split(separator: ":").last,
          let port = Int(portText.trimmingCharacters(in: .whitespaces)), let url = URL(string: "http://127.0.0.1:\(port)")
    else {
        process.terminate()
        throw RawError("no port in convkitd's log: \(log)")
    }
    return (process, url)
}

/// A message from one store to another, both running continuously (`ConversationStore.run()`)
/// through `convkitd serve` on loopback: the time from `send` returning to the receiver's
/// `messageAdded` event, over 50 messages.
@MainActor func liveMessageBench(_ reporter: Reporter) async throws {
    let root = FileManager.default.temporaryDirectory.path + "/convkit-live-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    guard let started = try startConvkitd(data: root + "/server", reporter: reporter, purpose: "live message") else { return }
    let (process, url) = started
    defer { process.terminate() }
    let rawHTTP = try KeepAliveConnection(port: try rawResponderPort())
    let rawRoundTrip = try rate(seconds: 1) { try rawHTTP.roundTrip("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") }
    let alice = try ConversationStore(directory: root + "/alice", backend: .server(url))
    let bob = try ConversationStore(directory: root + "/bob", backend: .server(url))
    try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
    try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
    _ = try await alice.send("hello", to: "bob")
    for _ in 0..<2 { try await alice.sync(); try await bob.sync() }
    let running = [Task { try await alice.run() }, Task { try await bob.run() }]
    defer { running.forEach { $0.cancel() } }
    try await Task.sleep(for: .milliseconds(300))
    // Thread switches (voluntary context switches: a thread that waits and is woken — every
    // hand-off) while nothing is sent, then per message: this process (both stores) and
    // convkitd's.
    let idleStart = (clients: voluntarySwitches(), server: voluntarySwitches(of: process.processIdentifier))
    for _ in 0..<50 { try await Task.sleep(for: .milliseconds(20)) }
    let idle = (clients: voluntarySwitches() - idleStart.clients, server: voluntarySwitches(of: process.processIdentifier) - idleStart.server)
    let busyStart = (clients: voluntarySwitches(), server: voluntarySwitches(of: process.processIdentifier))
    var latencies = [Double]()
    for n in 0..<50 {
        let events = bob.events()
        let sent = try await alice.send("live \(n)", to: "bob")
        let start = ContinuousClock.now
        var arrived = false
        for await event in events where event == .messageAdded(sent.id) {
            arrived = true
            break
        }
        guard arrived else { throw RawError("message \(n) never arrived") }
        latencies.append(secondsIn(ContinuousClock.now - start))
        try await Task.sleep(for: .milliseconds(20))
    }
    let clients = Double(voluntarySwitches() - busyStart.clients - idle.clients) / 50
    let server = Double(voluntarySwitches(of: process.processIdentifier) - busyStart.server - idle.server) / 50
    latencies.sort()
    let median = latencies[latencies.count / 2], p90 = latencies[latencies.count * 9 / 10]
    reporter.report(Row(name: "message to a running peer (median)", perSecond: 1 / median, rawName: "raw libmicrohttpd round trip", rawPerSecond: rawRoundTrip))
    reporter.note(String(format: "a message to a continuously syncing peer through convkitd serve: median %.1f ms, 90th percentile %.1f ms, slowest %.1f ms (50 messages)",
                         median * 1000, p90 * 1000, (latencies.last ?? 0) * 1000))
    reporter.note(String(format: "thread hand-offs per message, send to the peer's event (voluntary context switches, the idle rate subtracted): %.1f in the two stores' process, %.1f in convkitd",
                         clients, server))
}

/// Voluntary context switches of every thread of a process so far: this one (`getrusage`,
/// threads that ended included) or another (its live threads, from `/proc`).
func voluntarySwitches(of pid: Int32? = nil) -> Int {
    guard let pid else {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return usage.ru_nvcsw
    }
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    return tasks.reduce(0) { total, task in
        let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("voluntary_ctxt_switches:") }
        return total + (line.flatMap { Int($0.split(separator: "\t").last ?? "") } ?? 0)
    }
}

func residentKilobytes(of pid: Int32) throws -> Int {
    let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
    guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
          let kilobytes = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    else { throw RawError("no VmRSS for \(pid)") }
    return kilobytes
}
