import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A listening TCP socket on 127.0.0.1 at a port the kernel chose, shared by the thread that
/// accepts on it and the owner that stops it. The descriptor is shut down (to end the accepting)
/// and closed under one lock, and never touched once closed: its number may by then be another
/// thread's socket — in a test process, another test's server connection — and a shutdown or
/// close that reached it would cut that connection ("Server returned nothing").
final class LoopbackListener: Sendable {
    let port: Int
    private let fd: Int32
    /// Whether the descriptor was closed.
    private let closed = Mutex(false)

    init(backlog: Int32) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EIO) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && listen(fd, backlog) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard bound else {
            Glibc.close(fd)
            throw POSIXError(.EADDRNOTAVAIL)
        }
        self.fd = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    /// The next connection (on the accepting thread); nil once the listener is shut down or
    /// failed, and then it is closed.
    func accept() -> Int32? {
        while true {
            let client = Glibc.accept(fd, nil, nil)
            if client >= 0 { return client }
            if errno == EINTR || errno == ECONNABORTED { continue }
            close()
            return nil
        }
    }

    /// Ends the accepting (the accepting thread then closes the listener); again, or once it is
    /// closed, nothing.
    func shutDown() {
        closed.withLock { closed in
            if !closed { _ = shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    private func close() {
        closed.withLock { closed in
            if !closed { Glibc.close(fd) }
            closed = true
        }
    }

    deinit { close() }
}
