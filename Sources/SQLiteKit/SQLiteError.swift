import CSQLite

/// An error from SQLite, with its result code, message and the SQL that caused it.
/// See <https://www.sqlite.org/rescode.html>.
public struct SQLiteError: Error, Sendable, CustomStringConvertible {
    /// The extended result code.
    public var code: Int32
    public var message: String
    public var sql: String?
    /// Set when the file's schema is not the one this program migrates to (``code`` is
    /// `SQLITE_ERROR`: SQLite has no code of its own for it).
    public var schema: SchemaMismatch?

    public init(code: Int32, message: String, sql: String? = nil, schema: SchemaMismatch? = nil) {
        self.code = code
        self.message = message
        self.sql = sql
        self.schema = schema
    }

    /// A database whose schema version (`PRAGMA user_version`) is not the newest this program
    /// knows: newer (written by a later version), or older and opened read-only (nothing can
    /// migrate it).
    public struct SchemaMismatch: Sendable, Hashable {
        public let found: Int
        public let known: Int
        public var isNewer: Bool { found > known }
    }

    /// The primary result code (the low byte of the extended code).
    public var primaryCode: Int32 { code & 0xFF }

    /// The primary result code by name: `error.resultCode == .full`, not `== 13`.
    public var resultCode: ResultCode { ResultCode(rawValue: primaryCode) }

    /// Whether the file is not a database or is damaged.
    /// (A read past the end of the file — `SQLITE_IOERR_SHORT_READ` — is a truncated file.)
    public var isCorruption: Bool { resultCode == .corrupt || resultCode == .notADatabase || code == SQLITE_IOERR | (2 << 8) }
    /// Whether the database or its folder cannot be written or opened.
    public var isAccessProblem: Bool { !isCorruption && [.cannotOpen, .readOnly, .permission, .authorization, .ioError].contains(resultCode) }
    public var isConstraintViolation: Bool { resultCode == .constraint }

    public var description: String {
        var text = "SQLite error \(code)\(resultCode.name.map { " (\($0))" } ?? ""): \(message)"
        if let sql { text += " — while executing: \(sql)" }
        return text
    }
}

/// A primary SQLite result code with a name (GRDB's `ResultCode`), for the ones this code
/// decides on or reports. See <https://www.sqlite.org/rescode.html>.
public struct ResultCode: RawRepresentable, Sendable, Hashable {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }

    public static let error = ResultCode(rawValue: SQLITE_ERROR)
    public static let permission = ResultCode(rawValue: SQLITE_PERM)
    public static let busy = ResultCode(rawValue: SQLITE_BUSY)
    /// A statement stopped by `sqlite3_interrupt`: its task was cancelled (``DatabaseQueue``).
    public static let interrupted = ResultCode(rawValue: SQLITE_INTERRUPT)
    public static let locked = ResultCode(rawValue: SQLITE_LOCKED)
    public static let readOnly = ResultCode(rawValue: SQLITE_READONLY)
    public static let ioError = ResultCode(rawValue: SQLITE_IOERR)
    public static let corrupt = ResultCode(rawValue: SQLITE_CORRUPT)
    public static let full = ResultCode(rawValue: SQLITE_FULL)
    public static let cannotOpen = ResultCode(rawValue: SQLITE_CANTOPEN)
    public static let constraint = ResultCode(rawValue: SQLITE_CONSTRAINT)
    public static let authorization = ResultCode(rawValue: SQLITE_AUTH)
    public static let notADatabase = ResultCode(rawValue: SQLITE_NOTADB)

    /// SQLite's name for the code (`SQLITE_FULL`), for the named ones.
    public var name: String? {
        let names: [ResultCode: String] = [.error: "SQLITE_ERROR", .permission: "SQLITE_PERM", .busy: "SQLITE_BUSY", .locked: "SQLITE_LOCKED",
                                           .readOnly: "SQLITE_READONLY", .ioError: "SQLITE_IOERR", .corrupt: "SQLITE_CORRUPT", .full: "SQLITE_FULL",
                                           .cannotOpen: "SQLITE_CANTOPEN", .constraint: "SQLITE_CONSTRAINT", .authorization: "SQLITE_AUTH",
                                           .notADatabase: "SQLITE_NOTADB"]
        return names[self]
    }
}
