import CSQLite
import Foundation

/// A value SQLite stores.
public enum DatabaseValue: Sendable, Hashable {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob(Data)
}

/// Converts Swift values to ``DatabaseValue`` for binding.
public protocol DatabaseValueConvertible {
    var databaseValue: DatabaseValue { get }
}

extension Int64: DatabaseValueConvertible { public var databaseValue: DatabaseValue { .integer(self) } }
extension Int: DatabaseValueConvertible { public var databaseValue: DatabaseValue { .integer(Int64(self)) } }
extension UInt64: DatabaseValueConvertible { public var databaseValue: DatabaseValue { .integer(Int64(bitPattern: self)) } }
extension Bool: DatabaseValueConvertible { public var databaseValue: DatabaseValue { .integer(self ? 1 : 0) } }
extension Double: DatabaseValueConvertible { public var databaseValue: DatabaseValue { .real(self) } }
extension String: DatabaseValueConvertible { public var databaseValue: DatabaseValue { .text(self) } }
extension Data: DatabaseValueConvertible { public var databaseValue: DatabaseValue { .blob(self) } }
extension DatabaseValue: DatabaseValueConvertible { public var databaseValue: DatabaseValue { self } }
extension Optional: DatabaseValueConvertible where Wrapped: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue { self?.databaseValue ?? .null }
}

/// A prepared statement (`sqlite3_stmt`), owned by its ``Database`` and finalized in `deinit`.
/// See <https://www.sqlite.org/c3ref/stmt.html>.
public final class Statement {
    @usableFromInline let handle: OpaquePointer
    public let sql: String
    unowned let database: Database

    init(database: Database, sql: String) throws(SQLiteError) {
        var statement: OpaquePointer?
        let code = sqlite3_prepare_v3(database.handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard code == SQLITE_OK, let statement else {
            throw database.error(code, sql: sql)
        }
        self.handle = statement
        self.sql = sql
        self.database = database
        parameterCount = Int(sqlite3_bind_parameter_count(statement))
    }

    deinit { sqlite3_finalize(handle) }

    /// How many parameters the statement has.
    private let parameterCount: Int

    /// Binds the values to parameters 1…n (after resetting; earlier bindings of parameters past
    /// n are cleared). Text is bound by its UTF-8 length (SQLite copies it), not scanned for a NUL.
    public func bind(_ values: [any DatabaseValueConvertible]) throws(SQLiteError) {
        sqlite3_reset(handle)
        if values.count < parameterCount { sqlite3_clear_bindings(handle) }
        for (offset, value) in values.enumerated() {
            let index = Int32(offset + 1)
            let code: Int32
            switch value.databaseValue {
            case .null: code = sqlite3_bind_null(handle, index)
            case .integer(let v): code = sqlite3_bind_int64(handle, index, v)
            case .real(let v): code = sqlite3_bind_double(handle, index, v)
            case .text(var v):
                code = v.withUTF8 { bytes in
                    // An empty string's buffer may have no address; any non-NULL pointer with
                    // length 0 binds '' (NULL would bind NULL).
                    let start = UnsafeRawPointer(bytes.baseAddress ?? UnsafePointer(bitPattern: 1)).map { $0.assumingMemoryBound(to: CChar.self) }
                    return sqlite3_bind_text(handle, index, start, Int32(bytes.count), csqlite_transient())
                }
            case .blob(let v):
                code = v.withUnsafeBytes { raw in
                    sqlite3_bind_blob(handle, index, raw.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(raw.count), csqlite_transient())
                }
            }
            guard code == SQLITE_OK else { throw database.error(code, sql: sql) }
        }
    }

    /// Steps once: true when a row is ready, false when done.
    public func step() throws(SQLiteError) -> Bool {
        let code = sqlite3_step(handle)
        switch code {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default:
            let error = database.error(code, sql: sql)
            sqlite3_reset(handle)
            throw error
        }
    }

    /// Runs to completion with the values bound.
    public func execute(_ values: [any DatabaseValueConvertible] = []) throws(SQLiteError) {
        try bind(values)
        while try step() {}
        sqlite3_reset(handle)
    }

    /// Runs and maps every row; `capacity`: the rows expected, when known. Inlinable, so that a
    /// caller's `map` is specialized into the loop rather than called through a generic one.
    @inlinable
    public func rows<T>(_ values: [any DatabaseValueConvertible] = [], capacity: Int = 0, _ map: (Row) throws(SQLiteError) -> T) throws(SQLiteError) -> [T] {
        try bind(values)
        defer { sqlite3_reset(handle) }
        var result = [T]()
        result.reserveCapacity(capacity)
        let row = Row(statement: self)
        while try step() { result.append(try map(row)) }
        return result
    }

    /// Runs and maps the first row, if any.
    public func first<T>(_ values: [any DatabaseValueConvertible] = [], _ map: (Row) throws(SQLiteError) -> T) throws(SQLiteError) -> T? {
        try bind(values)
        defer { sqlite3_reset(handle) }
        return try step() ? try map(Row(statement: self)) : nil
    }
}

/// The current row of a stepping ``Statement``; columns are read by index.
public struct Row {
    @usableFromInline let statement: Statement
    @usableFromInline var handle: OpaquePointer { statement.handle }

    @usableFromInline init(statement: Statement) { self.statement = statement }

    @inlinable public func isNull(_ index: Int32) -> Bool { sqlite3_column_type(handle, index) == SQLITE_NULL }
    @inlinable public func int(_ index: Int32) -> Int64 { sqlite3_column_int64(handle, index) }
    public func double(_ index: Int32) -> Double { sqlite3_column_double(handle, index) }
    public func bool(_ index: Int32) -> Bool { int(index) != 0 }
    @inlinable public func optionalInt(_ index: Int32) -> Int64? { isNull(index) ? nil : int(index) }
    @inlinable public func text(_ index: Int32) -> String { optionalText(index) ?? "" }
    /// Nil for NULL, told by `sqlite3_column_text`'s NULL pointer alone: one call, not two.
    @inlinable public func optionalText(_ index: Int32) -> String? { withText(index) { $0.map { String(decoding: $0, as: UTF8.self) } } }
    /// The column's text as SQLite holds it (nil for NULL), valid only inside `body`: for a
    /// reader of many rows that keeps one string for a value they repeat instead of making one a row.
    @inlinable public func withText<T>(_ index: Int32, _ body: (UnsafeBufferPointer<UInt8>?) throws -> T) rethrows -> T {
        guard let pointer = sqlite3_column_text(handle, index) else { return try body(nil) }
        return try body(UnsafeBufferPointer(start: pointer, count: Int(sqlite3_column_bytes(handle, index))))
    }
    public func blob(_ index: Int32) -> Data {
        let count = Int(sqlite3_column_bytes(handle, index))
        guard count > 0, let pointer = sqlite3_column_blob(handle, index) else { return Data() }
        return Data(bytes: pointer, count: count)
    }
    public func optionalBlob(_ index: Int32) -> Data? { isNull(index) ? nil : blob(index) }
}
