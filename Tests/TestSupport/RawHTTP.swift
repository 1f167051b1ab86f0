import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A raw TCP connection to 127.0.0.1, for sending exactly the bytes a test wants — garbage,
/// half a request, a request byte by byte — and reading what comes back.
public final class RawConnection {
    private let fd: Int32

    /// - Parameter source: the local address to connect from (any of 127.0.0.0/8 reaches the
    ///   server as another client address).
    public init(port: Int, source: String? = nil) throws {
        // Everything that can fail works on a local descriptor: a class whose init throws once
        // every property is set still runs its deinit, which would close the descriptor a second
        // time — by then, perhaps, another thread's (a server's connection in the same process).
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EIO) }
        if let source {
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            local.sin_addr.s_addr = inet_addr(source)
            let bound = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0 else {
                close(fd)
                throw POSIXError(.EADDRNOTAVAIL)
            }
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            close(fd)
            throw POSIXError(.ECONNREFUSED)
        }
        var timeout = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        self.fd = fd
    }

    deinit { close(fd) }

    public func write(_ data: Data) {
        data.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
                if n <= 0 { return }
                offset += n
            }
        }
    }

    public func write(_ text: String) { write(Data(text.utf8)) }

    /// Reads until the peer closes (or the 30 s receive timeout passes).
    public func readToEnd() -> Data { readUntilClosed().data }

    /// Reads until the peer closes: `closedByPeer` is false when the receive timed out instead.
    public func readUntilClosed() -> (data: Data, closedByPeer: Bool) {
        var result = Data()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n == 0 { return (result, true) }
            if n < 0 { return (result, errno != EAGAIN && errno != EWOULDBLOCK) }
            result.append(buffer, count: n)
        }
    }

    /// Sends a whole request with `Connection: close` and parses the answer. The blocking socket
    /// work runs on a Dispatch thread, never on Swift's cooperative pool, where an in-process
    /// server's handlers run.
    /// `source`: the local address to connect from (another of 127.0.0.0/8: another client).
    public static func exchange(port: Int, _ request: Data, source: String? = nil) async throws -> RawResponse {
        try await offPool {
            let connection = try RawConnection(port: port, source: source)
            connection.write(request)
            return RawResponse(connection.readToEnd())
        }
    }

    public static func exchange(port: Int, method: String, path: String, headers: [String: String] = [:], body: Data = Data(), source: String? = nil) async throws -> RawResponse {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: \(body.count)\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        return try await exchange(port: port, Data((head + "\r\n").utf8) + body, source: source)
    }

    /// Reads until the peer closes, on a Dispatch thread.
    public func readUntilClosedOffPool() async -> (data: Data, closedByPeer: Bool) {
        nonisolated(unsafe) let connection = self
        return (try? await offPool { connection.readUntilClosed() }) ?? (Data(), false)
    }
}

/// Asks a server's `/healthz` every 100 ms until it answers `status`, for at most `seconds`.
/// - Returns: nil once it did; otherwise its last answer (status and body), which says why.
public func waitForHealth(_ status: Int, port: Int, seconds: Double = 30) async throws -> String? {
    let deadline = ContinuousClock.now + .seconds(seconds)
    var last = "no answer"
    repeat {
        if let answer = try? await RawConnection.exchange(port: port, method: "GET", path: "/healthz") {
            if answer.status == status { return nil }
            last = "\(answer.status) \(answer.text)"
        }
        try await Task.sleep(for: .milliseconds(100))
    } while ContinuousClock.now < deadline
    return last
}

/// Runs blocking work on a Dispatch thread and awaits its result.
public func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async {
            continuation.resume(with: Result { try body() })
        }
    }
}

extension RawConnection {
}

/// A parsed HTTP answer.
public struct RawResponse: Sendable {
    public let status: Int
    public let headers: [String: String]
    public let body: Data

    public init(_ data: Data) {
        let separator = Data("\r\n\r\n".utf8)
        guard let split = data.range(of: separator) else {
            status = 0
            headers = [:]
            body = data
            return
        }
        let head = String(decoding: data[..<split.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
        status = head.first.flatMap { Int($0.split(separator: " ").dropFirst().first ?? "") } ?? 0
        var parsed = [String: String]()
        for line in head.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            parsed[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        headers = parsed
        body = data[split.upperBound...]
    }

    public var text: String { String(decoding: body, as: UTF8.self) }

    /// The `error.code` of a JSON error body.
    public var errorCode: String? {
        guard let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any],
              let error = object["error"] as? [String: Any] else { return nil }
        return error["code"] as? String
    }
}
