import CSQLite
import Foundation
import Synchronization

/// One SQLite connection (`sqlite3*`): not `Sendable`; its owner serializes access
/// (``DatabaseQueue``). Statements are prepared once and cached by their SQL.
/// See <https://www.sqlite.org/c3ref/sqlite3.html>.
public final class Database {
    let handle: OpaquePointer
    public let path: String
    private var statements: [String: Statement] = [:]
    /// Set while the job using the connection is cancelled (``DatabaseQueue``): every statement
    /// then stops within a thousand virtual-machine steps (SQLite's progress handler) with
    /// ``ResultCode/interrupted`` — one that starts after the cancellation too, which
    /// `sqlite3_interrupt` alone does not reach (it is lost between two statements of a job).
    let stopRequested = StopFlag()

    final class StopFlag: Sendable {
        let value = Atomic(false)
    }

    /// Whether the transaction open now is the one of grouped writes
    /// (``DatabaseQueue/writeGrouped(_:afterCommit:commitsAlone:)``), alone or several: work a
    /// write leaves to ``beforeCommit`` then overlaps with the rest of it and the writes after it.
    public internal(set) var isGrouped = false

    /// Work to finish in a grouped transaction before it commits, in order (a failure rolls the
    /// whole transaction back); run and emptied by the group's commit. Work left by a write whose
    /// savepoint was undone runs too, so it must find nothing to do then.
    public var beforeCommit: [(Database) throws -> Void] = []

    /// What ``changeCount(watching:)`` counts, once asked (its hooks hold it unretained: the
    /// connection keeps it as long as the handle lives).
    private var watch: ChangeWatch?

    final class ChangeWatch {
        var tables: Set<String>
        var count: UInt64 = 0
        var dataVersion: Int64?

        init(_ tables: Set<String>) { self.tables = tables }
    }

    /// Opens (or creates) the database at `path`.
    /// - Parameter readOnly: open without write access (the reader connection).
    /// - Throws: ``SQLiteError``.
    public init(path: String, readOnly: Bool = false) throws(SQLiteError) {
        var db: OpaquePointer?
        let flags = (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX
        let code = sqlite3_open_v2(path, &db, flags, nil)
        guard code == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            if let db { sqlite3_close_v2(db) }
            throw SQLiteError(code: code, message: "cannot open \(path): \(message)")
        }
        handle = db
        self.path = path
        sqlite3_extended_result_codes(db, 1)
        sqlite3_busy_timeout(db, 5000)
        sqlite3_progress_handler(db, 1000, { context in
            guard let context else { return 0 }
            return Unmanaged<StopFlag>.fromOpaque(context).takeUnretainedValue().value.load(ordering: .relaxed) ? 1 : 0
        }, Unmanaged.passUnretained(stopRequested).toOpaque())
    }

    deinit {
        statements.removeAll()
        sqlite3_close_v2(handle)
    }

    func error(_ code: Int32, sql: String?) -> SQLiteError {
        SQLiteError(code: sqlite3_extended_errcode(handle), message: String(cString: sqlite3_errmsg(handle)), sql: sql)
    }

    /// Runs one or more SQL statements with no parameters and no results.
    public func execute(_ sql: String) throws(SQLiteError) {
        // What every transaction runs is prepared once (sqlite3_exec would parse it each time).
        if Self.transactionControl.contains(sql) { return try statement(sql).execute() }
        var message: UnsafeMutablePointer<CChar>?
        let code = sqlite3_exec(handle, sql, nil, nil, &message)
        guard code == SQLITE_OK else {
            let text = message.map { String(cString: $0) } ?? String(cString: sqlite3_errstr(code))
            sqlite3_free(message)
            throw SQLiteError(code: sqlite3_extended_errcode(handle), message: text, sql: sql)
        }
    }

    /// The statements that begin and end transactions and savepoints (``transaction(_:)``,
    /// ``savepoint(_:)``, the queue's grouped writes and snapshots).
    private static let transactionControl: Set<String> = [
        "BEGIN IMMEDIATE", "BEGIN DEFERRED", "COMMIT", "ROLLBACK", "SAVEPOINT grouped", "RELEASE grouped", "ROLLBACK TO grouped",
    ]

    /// The cached prepared statement for this SQL.
    public func statement(_ sql: String) throws(SQLiteError) -> Statement {
        if let cached = statements[sql] { return cached }
        let statement = try Statement(database: self, sql: sql)
        statements[sql] = statement
        return statement
    }

    /// Runs a statement with values.
    public func execute(_ sql: String, _ values: [any DatabaseValueConvertible]) throws(SQLiteError) {
        try statement(sql).execute(values)
    }

    @inlinable
    public func rows<T>(_ sql: String, _ values: [any DatabaseValueConvertible] = [], capacity: Int = 0, _ map: (Row) throws(SQLiteError) -> T) throws(SQLiteError) -> [T] {
        try statement(sql).rows(values, capacity: capacity, map)
    }

    public func first<T>(_ sql: String, _ values: [any DatabaseValueConvertible] = [], _ map: (Row) throws(SQLiteError) -> T) throws(SQLiteError) -> T? {
        try statement(sql).first(values, map)
    }

    /// The number of rows the last statement changed.
    public var changes: Int { Int(sqlite3_changes(handle)) }
    public var lastInsertedRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    /// Runs `body` in an immediate transaction: committed when it returns, rolled back when it throws.
    public func transaction<T>(_ body: () throws -> T) throws -> T {
        try execute("BEGIN IMMEDIATE")
        do {
            let result = try body()
            try execute("COMMIT")
            return result
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    /// Runs `body` in a savepoint inside the open transaction: what it wrote is undone if it
    /// throws (the rest of the transaction stands).
    public func savepoint<T>(_ body: () throws -> T) throws -> T {
        try execute("SAVEPOINT grouped")
        do {
            let result = try body()
            try execute("RELEASE grouped")
            return result
        } catch {
            if !isAutocommit {
                watch?.count &+= 1
                try? execute("ROLLBACK TO grouped")
                try? execute("RELEASE grouped")
            }
            throw error
        }
    }

    /// A number that moves whenever a row of one of `tables` may have changed for this
    /// connection since the last call: one written through it (SQLite's pre-update hook, which
    /// sees WITHOUT ROWID tables too; the truncation of a whole table included, which the hook
    /// turns into row deletions), a transaction or savepoint rolled back (what a cache took from
    /// it may be undone), or another connection's commit (`PRAGMA data_version`). What a cache
    /// read from those tables stays true while the number it was read at holds; nothing else
    /// is promised of its value. The first call starts the watch (the tables of later calls
    /// are added to it).
    public func changeCount(watching tables: Set<String>) throws(SQLiteError) -> UInt64 {
        let watch: ChangeWatch
        if let held = self.watch {
            watch = held
            if !tables.isSubset(of: watch.tables) {
                watch.tables.formUnion(tables)
                watch.count &+= 1
            }
        } else {
            watch = ChangeWatch(tables)
            self.watch = watch
            let context = Unmanaged.passUnretained(watch).toOpaque()
            sqlite3_preupdate_hook(handle, { context, _, _, _, table, _, _ in
                guard let context, let table else { return }
                let watch = Unmanaged<ChangeWatch>.fromOpaque(context).takeUnretainedValue()
                // Compared in place: no string is made for each row written.
                if watch.tables.contains(where: { strcmp($0, table) == 0 }) { watch.count &+= 1 }
            }, context)
            sqlite3_rollback_hook(handle, { context in
                guard let context else { return }
                Unmanaged<ChangeWatch>.fromOpaque(context).takeUnretainedValue().count &+= 1
            }, context)
        }
        let version = try first("PRAGMA data_version") { $0.int(0) }
        if version != watch.dataVersion {
            watch.dataVersion = version
            watch.count &+= 1
        }
        return watch.count
    }

    /// Whether no transaction is open (SQLite rolls one back by itself after some errors).
    public var isAutocommit: Bool { sqlite3_get_autocommit(handle) != 0 }

    /// `PRAGMA user_version`, the schema version migrations key on.
    public var userVersion: Int {
        get throws(SQLiteError) { Int(try first("PRAGMA user_version") { $0.int(0) } ?? 0) }
    }
}
