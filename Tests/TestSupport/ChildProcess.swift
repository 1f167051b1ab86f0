import CSpawn
import Foundation
import Synchronization
import Testing

/// A real child process with its output collected, for tests that run the built tools.
///
/// Started with `posix_spawn` (the CSpawn shim) rather than Foundation's `Process`: in Swift 6.3.1
/// `Process.run()` crashes now and then while it lists `/proc/self/fd` (an over-read fixed
/// upstream in swift-corelibs-foundation #5472), often enough to break a test run.
public final class ChildProcess: Sendable {
    public let pid: pid_t
    private struct State {
        var stdout = Data()
        var stderr = Data()
        /// The raw `waitpid` status, once the child has exited.
        var status: Int32?
    }
    private let state = Mutex(State())
    private let readersFinished = Atomic<Int>(0)

    public init(_ executable: String, _ arguments: [String]) throws {
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var child: pid_t = 0, outFD: Int32 = -1, errFD: Int32 = -1
        let spawned = cspawn(executable, argv, &child, &outFD, &errFD)
        guard spawned == 0 else { throw POSIXError(POSIXErrorCode(rawValue: spawned) ?? .EIO) }
        pid = child
        // A blocking reader thread per pipe, off Swift's cooperative pool.
        for (fd, field) in [(outFD, \State.stdout), (errFD, \State.stderr)] {
            Thread { [self] in
                var buffer = [UInt8](repeating: 0, count: 65536)
                while true {
                    let count = read(fd, &buffer, buffer.count)
                    if count < 0, errno == EINTR { continue }
                    if count <= 0 { break }
                    self.state.withLock { $0[keyPath: field].append(buffer, count: count) }
                }
                close(fd)
                self.readersFinished.add(1, ordering: .releasing)
            }.start()
        }
    }

    public var standardOutput: String { state.withLock { String(decoding: $0.stdout, as: UTF8.self) } }
    public var standardError: String { state.withLock { String(decoding: $0.stderr, as: UTF8.self) } }

    /// Complete lines written to stdout so far.
    public var lines: [String] {
        let text = standardOutput
        guard let lastNewline = text.lastIndex(of: "\n") else { return [] }
        return text[..<lastNewline].split(separator: "\n").map(String.init)
    }

    /// Whether the child is still running (reaps it when it has exited).
    public var isRunning: Bool { reap(blocking: false) == nil }

    /// True when the child was ended by a signal rather than exiting.
    public var wasKilledBySignal: Bool { (reap(blocking: false)).map { $0 & 0x7F != 0 } ?? false }

    private func reap(blocking: Bool) -> Int32? {
        state.withLock { state in
            if let status = state.status { return status }
            var status: Int32 = 0
            let result = waitpid(pid, &status, blocking ? 0 : WNOHANG)
            guard result == pid else { return nil }
            state.status = status
            return status
        }
    }

    /// Waits for the process to exit and for its output to be read; returns its exit status,
    /// or the signal that ended it.
    public func wait() async -> Int32 {
        var status = reap(blocking: false)
        while status == nil {
            try? await Task.sleep(for: .milliseconds(10))
            status = reap(blocking: false)
        }
        while readersFinished.load(ordering: .acquiring) < 2 { try? await Task.sleep(for: .milliseconds(5)) }
        let raw = status ?? 0
        return raw & 0x7F != 0 ? raw & 0x7F : (raw >> 8) & 0xFF
    }

    /// Polls until `condition` holds or the deadline passes.
    public func waitUntil(seconds: Double = 60, _ condition: (ChildProcess) -> Bool) async -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition(self) { return true }
            if !isRunning { return condition(self) }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return false
    }

    public func kill(_ signal: Int32) { Foundation.kill(pid, signal) }

    /// Runs a command to its end, blocking the calling thread (for setup steps such as making a
    /// certificate). - Returns: its exit status.
    @discardableResult
    public static func runToEnd(_ executable: String, _ arguments: [String]) throws -> Int32 {
        let child = try ChildProcess(executable, arguments)
        let raw = child.reap(blocking: true) ?? 0
        return raw & 0x7F != 0 ? raw & 0x7F : (raw >> 8) & 0xFF
    }
}
