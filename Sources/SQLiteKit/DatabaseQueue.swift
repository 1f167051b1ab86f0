import CSQLite
import Foundation
import Synchronization

/// The serial owner of a store's SQLite file: one writer connection and one reader
/// connection, each with its own serial dispatch queue. In WAL mode a read never waits for a
/// write in progress (a sync applying pages), and writes are serialized.
///
/// The `async` variants run the closure on the connection's queue and resume the caller when it
/// is done (as GRDB's `SerializedDatabase` does): a slow disk, an fsync or another process's
/// lock holds that queue's thread, never Swift's cooperative pool; cancelling the caller's task
/// interrupts its statement (or drops a job not started yet). The synchronous variants
/// block the caller until the queue has run the closure, for the few callers that cannot wait
/// (opening, tests).
public final class DatabaseQueue: Sendable {
    /// A connection and the queue that serializes it. The connection never leaves the queue
    /// except as the parameter of a closure that runs on it.
    private final class Serialized: @unchecked Sendable {
        private let queue: DispatchQueue
        private let database: Database
        init(_ database: Database, label: String) {
            self.database = database
            queue = DispatchQueue(label: label, qos: .userInitiated)
        }

        func sync<T>(_ body: (Database) throws -> T) rethrows -> T {
            try queue.sync { try body(database) }
        }

        /// Runs `body` on the queue. Cancelling the waiting task reaches SQLite, as GRDB's
        /// does: a job not started yet never runs (`CancellationError`); one running has its
        /// statement interrupted (`sqlite3_interrupt`: it fails with ``ResultCode/interrupted``
        /// and its transaction rolls back). The interrupt is made under the job's lock, while
        /// the job runs, so it never reaches the next job on the connection.
        func async<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
            let job = Mutex(JobState.waiting)
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { continuation in
                    queue.async {
                        let start = job.withLock { state -> Bool in
                            guard state == .waiting else { return false }
                            state = .running
                            return true
                        }
                        guard start else { return continuation.resume(throwing: CancellationError()) }
                        let result = Result { try body(self.database) }
                        job.withLock { $0 = .done }
                        continuation.resume(with: result)
                    }
                }
            } onCancel: {
                job.withLock { state in
                    switch state {
                    case .waiting: state = .cancelled
                    case .running: sqlite3_interrupt(self.database.handle)  // thread-safe, by design
                    case .done, .cancelled: break
                    }
                }
            }
        }
    }

    private enum JobState { case waiting, running, done, cancelled }

    private let writer: Serialized
    private let reader: Serialized
    public let path: String

    /// Opens the file, sets WAL mode and durable commits, and runs `migrations` on the writer.
    /// - Parameter readOnly: open an existing file without write access (both connections):
    ///   nothing is created or migrated, and every write fails (`SQLITE_READONLY`).
    /// - Throws: ``SQLiteError``; read-only, also for a file whose schema is not the newest.
    public init(path: String, migrations: [Migration], readOnly: Bool = false) throws(SQLiteError) {
        let writer = try Database(path: path, readOnly: readOnly)
        if readOnly {
            let current = try writer.userVersion
            if let newest = migrations.map(\.version).max(), current != newest {
                throw SQLiteError(code: 8, message: "the database has schema version \(current), not \(newest): open it once for writing to migrate it")
            }
        } else {
            try writer.execute("PRAGMA journal_mode = WAL")
            try writer.execute("PRAGMA synchronous = FULL")
            try writer.execute("PRAGMA foreign_keys = ON")
            try Migration.run(migrations, on: writer)
        }
        let reader = try Database(path: path, readOnly: true)
        self.writer = Serialized(writer, label: "convkit.sqlite.writer")
        self.reader = Serialized(reader, label: "convkit.sqlite.reader")
        self.path = path
    }

    /// Runs `body` in a write transaction on the writer's queue: all of it commits, or none of it.
    public func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await writer.async { db in try db.transaction { try body(db) } }
    }

    /// How a write transaction reaches the disk.
    public enum Durability: Sendable {
        /// On disk before the call returns (`synchronous=FULL`: the log is synced at the commit).
        case synced
        /// Committed without a sync of its own (`synchronous=NORMAL` for this commit; WAL mode):
        /// a crash of the process loses nothing, a power loss may lose it — only together with
        /// every commit after it, since the next synced commit or checkpoint syncs the log up to
        /// it. For what can be had again (what a server holds, and the token that says so).
        case deferred
    }

    /// ``write(_:)`` with a chosen durability.
    public func write<T: Sendable>(_ durability: Durability, _ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        guard durability == .deferred else { return try await write(body) }
        return try await writer.async { db in
            // The level cannot change inside a transaction: set around it.
            try db.execute("PRAGMA synchronous = NORMAL")
            defer { try? db.execute("PRAGMA synchronous = FULL") }
            return try db.transaction { try body(db) }
        }
    }

    /// Runs `body` in a write transaction, then, once it committed and before the next write
    /// begins, `afterCommit` with its result: shared state that must follow what is stored
    /// (key pins) changes only after the commit, and in commit order.
    public func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T, afterCommit: @escaping @Sendable (T) -> Void) async throws -> T {
        try await writer.async { db in
            let result = try db.transaction { try body(db) }
            afterCommit(result)
            return result
        }
    }

    /// Runs `body` in a read transaction on the reader's queue: one consistent snapshot.
    public func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await reader.async { db in try Self.snapshot(db, body) }
    }

    /// ``write(_:)``, blocking the caller until it is done.
    public func writeNow<T>(_ body: (Database) throws -> T) throws -> T {
        try writer.sync { db in try db.transaction { try body(db) } }
    }

    /// ``read(_:)``, blocking the caller until it is done (reads are short and never wait for
    /// a writer in WAL mode).
    public func readNow<T>(_ body: (Database) throws -> T) throws -> T {
        try reader.sync { db in try Self.snapshot(db, body) }
    }

    private static func snapshot<T>(_ db: Database, _ body: (Database) throws -> T) throws -> T {
        try db.execute("BEGIN DEFERRED")
        defer { try? db.execute("COMMIT") }
        return try body(db)
    }
}

/// One step of the schema, keyed by `PRAGMA user_version`: migration N moves the schema from
/// version N-1 to N, inside a transaction.
public struct Migration: Sendable {
    public let version: Int
    public let sql: String

    public init(version: Int, sql: String) {
        self.version = version
        self.sql = sql
    }

    static func run(_ migrations: [Migration], on db: Database) throws(SQLiteError) {
        let current = try db.userVersion
        if let newest = migrations.map(\.version).max(), current > newest {
            throw SQLiteError(code: 1, message: "the database has schema version \(current); this version of ConversationKit knows up to \(newest)")
        }
        for migration in migrations.sorted(by: { $0.version < $1.version }) where migration.version > current {
            do {
                try db.transaction {
                    try db.execute(migration.sql)
                    try db.execute("PRAGMA user_version = \(migration.version)")
                }
            } catch let error as SQLiteError {
                throw error
            } catch {
                throw SQLiteError(code: 1, message: "\(error)")
            }
        }
    }
}
