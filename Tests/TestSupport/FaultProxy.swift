import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A TCP proxy on 127.0.0.1 in front of a Unix socket (a test's PostgreSQL) or a TCP port (a
/// zone server), that counts the bytes it forwards, can cut every connection once a number of
/// bytes went one way (a link lost halfway through an upload or a download), and can fall silent: while blackholed it reads what either side sends and forwards nothing, so each side's
/// kernel still acknowledges the other's bytes and answers its keepalives — a link that looks
/// alive and never answers (a stalled proxy or load balancer, a hung backend), which only an
/// application's own deadline notices. Restored, it drops the connections that lost bytes (their
/// streams are broken) and forwards new ones again.
public final class FaultProxy: @unchecked Sendable {
    public var port: Int { listener.port }
    private let listener: LoopbackListener
    private enum Target { case unixSocket(String), tcpPort(Int) }
    private let target: Target
    private struct State {
        var blackholed = false
        /// Bytes forwarded from clients to the target (0), and back (1).
        var forwarded = [0, 0]
        /// Cut every connection once `forwarded[direction]` reaches `at`, and refuse new ones
        /// until it is cleared.
        var cut: (direction: Int, at: Int)?
        /// Connection pairs, each a client and a server descriptor.
        var pairs: [(Int32, Int32)] = []
        var stopped = false
    }
    private let state = Mutex(State())

    public convenience init(unixSocket target: String) throws { try self.init(.unixSocket(target)) }
    /// In front of a server on 127.0.0.1.
    public convenience init(tcpPort: Int) throws { try self.init(.tcpPort(tcpPort)) }

    /// Bytes forwarded so far: from clients (`sent`) and back to them (`received`).
    public var forwarded: (sent: Int, received: Int) { state.withLock { ($0.forwarded[0], $0.forwarded[1]) } }

    /// Cuts every connection once clients have sent `bytes` more (or, `received`, once that many
    /// more went back to them), and refuses new ones until ``restore()``.
    public func cut(after bytes: Int, sent: Bool) {
        state.withLock { $0.cut = (sent ? 0 : 1, $0.forwarded[sent ? 0 : 1] + bytes) }
    }

    /// Forwards again after a cut.
    public func restore() { state.withLock { $0.cut = nil } }

    private init(_ target: Target) throws {
        self.target = target
        listener = try LoopbackListener(backlog: 64)
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
        listener.shutDown()
    }

    deinit { stop() }

    private func acceptLoop() {
        while let client = listener.accept() {
            let (server, connected) = connectToTarget()
            let admitted = state.withLock { state in
                guard connected, !state.stopped, state.cut.map({ state.forwarded[$0.direction] < $0.at }) ?? true else { return false }
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
    }

    private func connectToTarget() -> (Int32, Bool) {
        switch target {
        case .unixSocket(let path):
            let server = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                let bytes = Array(path.utf8.prefix(raw.count - 1)) + [0]
                raw.copyBytes(from: bytes)
            }
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            return (server, connected == 0)
        case .tcpPort(let port):
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = UInt16(port).bigEndian
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            return (server, connected == 0)
        }
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
                // From the client (index 0) is direction 0. Past a cut's mark, only what fits
                // before it goes through, and the connection ends.
                let (blackholed, allowed) = state.withLock { state -> (Bool, Int) in
                    guard !state.blackholed else { return (true, 0) }
                    let allowed = state.cut.map { $0.direction == index ? max(0, min(n, $0.at - state.forwarded[index])) : n } ?? n
                    state.forwarded[index] += allowed
                    return (false, allowed)
                }
                guard !blackholed else { continue }
                let to = fds[1 - index].fd
                var sent = 0
                while sent < allowed {
                    let written = buffer[sent..<allowed].withUnsafeBytes { send(to, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    if written <= 0 { break loop }
                    sent += written
                }
                if allowed < n { break loop }
            }
        }
        state.withLock { state in state.pairs.removeAll { $0.0 == client } }
        close(client)
        close(server)
    }
}
