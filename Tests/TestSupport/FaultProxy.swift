import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A TCP proxy on 127.0.0.1 in front of a Unix socket (a test's PostgreSQL), that can fall
/// silent: while blackholed it reads what either side sends and forwards nothing, so each side's
/// kernel still acknowledges the other's bytes and answers its keepalives — a link that looks
/// alive and never answers (a stalled proxy or load balancer, a hung backend), which only an
/// application's own deadline notices. Restored, it drops the connections that lost bytes (their
/// streams are broken) and forwards new ones again.
public final class FaultProxy: @unchecked Sendable {
    public let port: Int
    private let listener: Int32
    private let target: String
    private struct State {
        var blackholed = false
        /// Connection pairs, each a client and a server descriptor.
        var pairs: [(Int32, Int32)] = []
        var stopped = false
    }
    private let state = Mutex(State())

    public init(unixSocket target: String) throws {
        self.target = target
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EIO) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && listen(fd, 64) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard bound else {
            close(fd)
            throw POSIXError(.EADDRNOTAVAIL)
        }
        listener = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        let thread = Thread { [self] in acceptLoop() }
        thread.start()
    }

    /// Falls silent (true) or forwards again (false; connections that lost bytes are closed).
    public func blackhole(_ on: Bool) {
        // Under the lock: a pump closes its descriptors only after leaving the list under it.
        state.withLock { state in
            state.blackholed = on
            guard !on else { return }
            for (a, b) in state.pairs {
                shutdown(a, Int32(SHUT_RDWR))
                shutdown(b, Int32(SHUT_RDWR))
            }
        }
    }

    /// Stops accepting and closes every connection.
    public func stop() {
        state.withLock { state in
            state.stopped = true
            for (a, b) in state.pairs {
                shutdown(a, Int32(SHUT_RDWR))
                shutdown(b, Int32(SHUT_RDWR))
            }
        }
        shutdown(listener, Int32(SHUT_RDWR))
    }

    deinit { stop() }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                break
            }
            let server = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                let bytes = Array(target.utf8.prefix(raw.count - 1)) + [0]
                raw.copyBytes(from: bytes)
            }
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            let admitted = state.withLock { state in
                guard connected == 0, !state.stopped else { return false }
                state.pairs.append((client, server))
                return true
            }
            guard admitted else {
                close(client)
                close(server)
                continue
            }
            Thread { [self] in pump(client, server) }.start()
        }
        close(listener)
    }

    /// Copies bytes both ways until either side closes (or, blackholed, reads and drops them).
    private func pump(_ client: Int32, _ server: Int32) {
        var fds = [pollfd(fd: client, events: Int16(POLLIN), revents: 0), pollfd(fd: server, events: Int16(POLLIN), revents: 0)]
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        loop: while true {
            guard poll(&fds, 2, 1000) >= 0 || errno == EINTR else { break }
            for index in 0..<2 where fds[index].revents != 0 {
                let n = buffer.withUnsafeMutableBytes { recv(fds[index].fd, $0.baseAddress, $0.count, 0) }
                if n <= 0 { break loop }
                guard !state.withLock({ $0.blackholed }) else { continue }
                let to = fds[1 - index].fd
                var sent = 0
                while sent < n {
                    let written = buffer[sent..<n].withUnsafeBytes { send(to, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    if written <= 0 { break loop }
                    sent += written
                }
            }
        }
        state.withLock { state in state.pairs.removeAll { $0.0 == client } }
        close(client)
        close(server)
    }
}
