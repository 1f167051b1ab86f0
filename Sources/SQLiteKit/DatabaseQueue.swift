import Foundation

/// The serial owner of a store's SQLite file: one writer connection and one reader
/// connection. In WAL mode a read never waits for a write in progress (a sync applying pages),
/// and writes are serialized. Closures run synchronously on the caller's thread under a lock.
public final class DatabaseQueue: Sendable {
    /// A connection and the lock that serializes it. The connection never leaves the lock's
    /// scope except as the parameter of a closure that runs inside it.
    private final class Guarded: @unchecked Sendable {
        private let lock = NSLock()
        private let database: Database
        init(_ database: Database) { self.database = database }
        func with<T>(_ body: (Database) throws -> T) rethrows -> T {
            lock.lock()
            defer { lock.unlock() }
            return try body(database)
        }
    }

    private let writer: Guarded
    private let reader: Guarded
    public let path: String

    /// Opens the file, sets WAL mode and durable commits, and runs `migrations` on the writer.
    /// - Throws: ``SQLiteError``.
    public init(path: String, migrations: [Migration]) throws(SQLiteError) {
        let writer = try Database(path: path)
        try writer.execute("PRAGMA journal_mode = WAL")
        try writer.execute("PRAGMA synchronous = FULL")
        try writer.execute("PRAGMA foreign_keys = ON")
        try Migration.run(migrations, on: writer)
        let reader = try Database(path: path, readOnly: true)
        self.writer = Guarded(writer)
        self.reader = Guarded(reader)
        self.path = path
    }

    /// Runs `body` in a write transaction: all of it commits, or none of it.
    public func write<T: Sendable>(_ body: (Database) throws -> T) throws -> T {
        try writer.with { db in try db.transaction { try body(db) } }
    }

    /// Runs `body` in a read transaction on the reader connection: one consistent snapshot.
    public func read<T: Sendable>(_ body: (Database) throws -> T) throws -> T {
        try reader.with { db in
            try db.execute("BEGIN DEFERRED")
            defer { try? db.execute("COMMIT") }
            return try body(db)
        }
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
