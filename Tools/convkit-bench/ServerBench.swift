import ConversationKit
import Foundation
import RecordZone
import ZoneServer
#if canImport(Glibc)
import Glibc
#endif

/// The zone server over loopback: small fetches and batch saves through the HTTP backend
/// (signed requests, records as bytes, server checks, client verification), beside a raw keep-alive HTTP
/// round trip to the same server measured in the same run.
@MainActor func serverBench(_ reporter: Reporter, seconds: Double) async throws {
    reporter.header("Zone server over loopback (libmicrohttpd, SQLite)")
    let root = FileManager.default.temporaryDirectory.path + "/convkit-server-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    var configuration = ZoneServerConfiguration()
    configuration.requestsPerSecond = 1_000_000
    configuration.burst = 1_000_000
    let server = ZoneServer(storage: try SQLiteBackend(directory: root, policy: RecordPolicy()), access: OpenZoneAccess(), configuration: configuration)
    let port = try server.start(host: "127.0.0.1", port: 0)
    let key = SigningKey.generate()
    guard let url = URL(string: "http://127.0.0.1:\(port)") else { throw RawError("bad URL") }
    let client = HTTPBackend(url: url, identity: "bench", key: key, policy: RecordPolicy())
    let zone = try ZoneName("bench")
    try await client.createZone(zone)
    let clock = HybridLogicalClock()

    // Raw: one keep-alive connection, GET /healthz, parse the answer.
    let raw = try KeepAliveConnection(port: port)
    let rawRoundTrip = try rate(seconds: seconds) { try raw.roundTrip("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") }

    // The HTTP client alone (libcurl), for the same round trip: the client's own share.
    let clientRoundTrip = try await rateAsync(seconds: seconds, batch: 1) {
        guard await client.isHealthy() else { throw RawError("GET /healthz failed") }
        return true
    }
    reporter.report(Row(name: "libcurl client GET /healthz", perSecond: clientRoundTrip, rawName: "raw keep-alive HTTP round trip", rawPerSecond: rawRoundTrip))

    let one = try sampleRecord(0, key: key, clock: clock, zone: zone)
    _ = try await client.save([one])
    let fetches = try await rateAsync(seconds: seconds, batch: 1) {
        guard case .success = try await client.fetch([one.id])[0] else { throw RawError("fetch failed") }
        return true
    }
    reporter.report(Row(name: "small fetch (1 record, signed, verified)", perSecond: fetches, rawName: "raw keep-alive HTTP round trip", rawPerSecond: rawRoundTrip))

    var next = 1
    let batches = try (0..<max(4, Int(20 * seconds))).map { _ in
        try (0..<Record.maximumBatchSize).map { _ in
            defer { next += 1 }
            return try sampleRecord(next, key: key, clock: clock, zone: zone)
        }
    }
    // Raw for a batch: the same body bytes posted on the keep-alive connection (answered 405
    // once read), plus verifying 400 signatures on all cores, which the server must do.
    let body = try Wire.encode(try Wire.Modify(records: batches[0], policy: .merge), binary: true)
    let post = Data("POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \(Wire.recordsType)\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body
    let rawPosts = try rate(seconds: seconds) { try raw.roundTrip(post) }
    let sample = Data(repeating: 7, count: 240), signature = key.sign(sample), publicKey = key.publicKey
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
    await server.stop()
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

    func roundTrip(_ request: String) throws { try roundTrip(Data(request.utf8)) }

    func roundTrip(_ request: Data) throws {
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
                if received.count - end.upperBound >= length { return }
            }
        }
    }
}
