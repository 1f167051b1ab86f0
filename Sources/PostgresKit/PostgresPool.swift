import Foundation
import Synchronization

/// A fixed-size pool of connections to one database. ``withConnection(_:)`` lends one
/// connection to a closure that runs on a thread of its own (libpq blocks; Swift's cooperative
/// pool never does), opening connections as they are needed up to `size`, and queueing callers
/// beyond it — each for at most `borrowTimeout`, then it fails (the server answers 503 rather
/// than hold a request while the database is stuck). A connection that failed (the server went
/// away) is closed instead of returned, so the pool heals by itself once the database is back.
public final class PostgresPool: Sendable {
    /// The pool's use, for `/metrics`.
    public struct Statistics: Sendable {
        public var size: Int
        public var open: Int
        public var inUse: Int
        public var waiting: Int
        /// Connections lent since start, and how many of those had to wait for one.
        public var acquired: Int
        public var waited: Int
        /// Connections closed because they failed, and connection attempts that failed.
        public var broken: Int
        public var connectFailures: Int
    }

    /// A connection handed between threads: only one closure uses it at a time.
    private final class Lent: @unchecked Sendable {
        let connection: PostgresConnection
        init(_ connection: PostgresConnection) { self.connection = connection }
    }

    private struct State {
        var idle = [Lent]()
        var open = 0
        var waiters = [(id: UUID, continuation: CheckedContinuation<Result<Lent?, PostgresError>, Never>)]()
        var statistics: Statistics
    }

    public let conninfo: String
    public let size: Int
    /// How long a caller waits for a connection while every one is lent.
    public let borrowTimeout: Duration
    /// How long one ``withConnection(_:)`` body may wait for the database before its connection
    /// is cut (``PostgresConnection/cut()``) and it fails; nil: no limit.
    public let workDeadline: Duration?
    private let setup: @Sendable (PostgresConnection) throws(PostgresError) -> Void
    private let state: Mutex<State>
    private let queue = DispatchQueue(label: "convkit.postgres", attributes: .concurrent)

    /// - Parameter setup: runs once on each new connection (session settings).
    public init(conninfo: String, size: Int, borrowTimeout: Duration = .seconds(5), workDeadline: Duration? = nil,
                setup: @escaping @Sendable (PostgresConnection) throws(PostgresError) -> Void = { _ in }) {
        self.conninfo = conninfo
        self.size = max(1, size)
        self.borrowTimeout = borrowTimeout
        self.workDeadline = workDeadline
        self.setup = setup
        state = Mutex(State(statistics: Statistics(size: max(1, size), open: 0, inUse: 0, waiting: 0, acquired: 0, waited: 0, broken: 0, connectFailures: 0)))
    }

    public var statistics: Statistics {
        state.withLock { state in
            var statistics = state.statistics
            statistics.open = state.open
            statistics.waiting = state.waiters.count
            return statistics
        }
    }

    /// Runs `body` with a connection on a pool thread. A connection failure closes that
    /// connection; the error is rethrown.
    /// - Throws: ``PostgresError`` (connecting, no connection free within ``borrowTimeout``, or
    ///   from `body`), or what `body` throws.
    public func withConnection<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) throws -> T) async throws -> T {
        let lent = try await acquire().get()
        return try await withCheckedThrowingContinuation { continuation in
            queue.async {
                let connection: PostgresConnection
                do {
                    // An idle connection the server closed meanwhile (a restart) is replaced
                    // before use, not failed on.
                    if let idle = lent?.connection, idle.isIdleAndOpen {
                        connection = idle
                    } else {
                        if lent != nil { self.countBroken() }
                        connection = try self.connect()
                    }
                } catch {
                    self.release(nil, broken: false)
                    continuation.resume(throwing: error)
                    return
                }
                let watch = self.watch(connection)
                var result = Result { try body(connection) }
                var broken = !connection.isOK
                if watch?.finish() == true {
                    broken = true
                    if case .failure = result { result = .failure(PostgresError(sqlState: "", message: "the database did not answer within \(Self.seconds(self.workDeadline)) s")) }
                }
                if case .failure(let error as PostgresError) = result, error.isConnectionFailure { broken = true }
                self.release(broken ? nil : Lent(connection), broken: broken)
                continuation.resume(with: result)
            }
        }
    }

    /// A body's deadline: cuts its connection if it is still running then.
    private final class Watch: Sendable {
        private let state = Mutex((done: false, cut: false))
        let connection: Lent
        init(_ connection: Lent) { self.connection = connection }

        func expire() {
            state.withLock { state in
                guard !state.done else { return }
                state.cut = true
                connection.connection.cut()
            }
        }

        /// Ends the watch. - Returns: whether the connection was cut.
        func finish() -> Bool {
            state.withLock { state in
                state.done = true
                return state.cut
            }
        }
    }

    private func watch(_ connection: PostgresConnection) -> Watch? {
        guard let workDeadline else { return nil }
        let watch = Watch(Lent(connection))
        queue.asyncAfter(deadline: .now() + Self.seconds(workDeadline)) { watch.expire() }
        return watch
    }

    private static func seconds(_ duration: Duration?) -> Double {
        guard let duration else { return .infinity }
        return Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    /// An idle connection, or nil when the caller may open a new one; waits while every
    /// connection is lent (the decision and the queueing under one lock, so no release is
    /// missed), for at most ``borrowTimeout``.
    private func acquire() async -> Result<Lent?, PostgresError> {
        let id = UUID()
        return await withCheckedContinuation { continuation in
            let granted: Lent?? = state.withLock { state in
                state.statistics.acquired += 1
                if let idle = state.idle.popLast() {
                    state.statistics.inUse += 1
                    return .some(idle)
                }
                if state.open < size {
                    state.open += 1
                    state.statistics.inUse += 1
                    return .some(nil)
                }
                state.statistics.waited += 1
                state.waiters.append((id, continuation))
                return .none
            }
            if let granted {
                continuation.resume(returning: .success(granted))
                return
            }
            let timeout = borrowTimeout
            Task { [weak self] in
                try? await Task.sleep(for: timeout)
                self?.giveUp(id)
            }
        }
    }

    /// Fails a waiter still queued after ``borrowTimeout`` (one handed a connection is gone from
    /// the queue already).
    private func giveUp(_ id: UUID) {
        let waiter = state.withLock { state in
            state.waiters.firstIndex { $0.id == id }.map { state.waiters.remove(at: $0).continuation }
        }
        waiter?.resume(returning: .failure(PostgresError(sqlState: "", message: "no connection to the database was free within \(Self.seconds(borrowTimeout)) s")))
    }

    /// Hands a connection to the next waiter or back to the pool; nil: the slot is free (the
    /// connection broke or never opened), and the next waiter opens a new one.
    private func release(_ lent: Lent?, broken: Bool) {
        let waiter: CheckedContinuation<Result<Lent?, PostgresError>, Never>? = state.withLock { state in
            if broken { state.statistics.broken += 1 }
            if !state.waiters.isEmpty {
                // The slot passes on as it is: with its connection, or free to open one.
                return state.waiters.removeFirst().continuation
            }
            state.statistics.inUse -= 1
            if let lent { state.idle.append(lent) } else { state.open -= 1 }
            return nil
        }
        waiter?.resume(returning: .success(lent))
    }

    private func countBroken() { state.withLock { $0.statistics.broken += 1 } }

    private func connect() throws(PostgresError) -> PostgresConnection {
        do {
            let connection = try PostgresConnection(conninfo)
            try setup(connection)
            return connection
        } catch {
            state.withLock { $0.statistics.connectFailures += 1 }
            throw error
        }
    }
}
