import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A server on 127.0.0.1 that answers every request with one fixed answer (a status, headers
/// and a body) and closes the connection: what a proxy, a load balancer or a server of another
/// version may send, for testing how a client reads answers ours never gives.
public final class CannedHTTPServer: Sendable {
    public var port: Int { listener.port }
    private let listener: LoopbackListener

    public convenience init(status: Int, headers: [(String, String)] = [], body: String) throws {
        let head = (["HTTP/1.1 \(status) Canned", "Content-Length: \(body.utf8.count)", "Connection: close"] + headers.map { "\($0): \($1)" })
            .joined(separator: "\r\n") + "\r\n\r\n"
        try self.init(answer: Data((head + body).utf8))
    }

    /// A server that answers every request with `answer`, byte for byte (a head of one's own,
    /// bytes that are not text), then closes the connection.
    public init(answer: Data) throws {
        let listener = try LoopbackListener(backlog: 16)
        self.listener = listener
        // The thread closes the listener when it is done (``LoopbackListener/accept()``).
        Thread.detachNewThread {
            while let client = listener.accept() {
                Self.readRequest(client)
                answer.withUnsafeBytes { _ = send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                close(client)
            }
        }
    }

    /// Reads a request's head and as much body as its `Content-Length` says.
    private static func readRequest(_ fd: Int32) {
        var bytes = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 65_536)
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            guard n > 0 else { break }
            bytes += buffer[0..<n]
            guard let end = bytes.firstRange(of: Array("\r\n\r\n".utf8)) else { continue }
            let head = String(decoding: bytes[..<end.lowerBound], as: UTF8.self)
            let declared = head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
                .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) } ?? 0
            if bytes.count - end.upperBound >= declared { return }
        }
    }

    /// Stops accepting (the accepting thread then closes the listener).
    public func stop() { listener.shutDown() }

    deinit { stop() }
}
