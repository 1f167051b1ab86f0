import CSQLite

/// An error from SQLite, with its result code, message and the SQL that caused it.
/// See <https://www.sqlite.org/rescode.html>.
public struct SQLiteError: Error, Sendable, CustomStringConvertible {
    /// The extended result code.
    public var code: Int32
    public var message: String
    public var sql: String?

    public init(code: Int32, message: String, sql: String? = nil) {
        self.code = code
        self.message = message
        self.sql = sql
    }

    /// The primary result code (the low byte of the extended code).
    public var primaryCode: Int32 { code & 0xFF }

    /// Whether the file is not a database or is damaged.
    public var isCorruption: Bool { primaryCode == SQLITE_CORRUPT || primaryCode == SQLITE_NOTADB }
    /// Whether the database or its folder cannot be written or opened.
    public var isAccessProblem: Bool {
        primaryCode == SQLITE_CANTOPEN || primaryCode == SQLITE_READONLY || primaryCode == SQLITE_PERM
            || primaryCode == SQLITE_AUTH || primaryCode == SQLITE_IOERR
    }
    public var isConstraintViolation: Bool { primaryCode == SQLITE_CONSTRAINT }

    public var description: String {
        var text = "SQLite error \(code): \(message)"
        if let sql { text += " — while executing: \(sql)" }
        return text
    }
}
