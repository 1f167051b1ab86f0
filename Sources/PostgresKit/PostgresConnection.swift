import CPostgres
import Foundation

/// An error from PostgreSQL or libpq: the SQLSTATE when the server sent one
/// (<https://www.postgresql.org/docs/current/errcodes-appendix.html>), and its message.
public struct PostgresError: Error, Sendable, CustomStringConvertible {
    /// The five-character SQLSTATE (`23505` unique violation, `40001` serialization failure…);
    /// empty for a client-side failure (no connection, a server that went away).
    public let sqlState: String
    public let message: String

    public init(sqlState: String, message: String) {
        self.sqlState = sqlState
        self.message = message
    }

    /// The SQLSTATE by name.
    public var code: SQLState { SQLState(rawValue: sqlState) }

    /// Whether the connection itself failed (the server unreachable or gone), so a new one may
    /// succeed: class 08 (connection exception), 57P01–57P03 (shutdown), or no SQLSTATE at all.
    public var isConnectionFailure: Bool {
        sqlState.isEmpty || code.errorClass == SQLState.connectionException.errorClass
            || [.adminShutdown, .crashShutdown, .cannotConnectNow].contains(code)
    }

    public var description: String { sqlState.isEmpty ? message : "\(sqlState): \(message)" }
}

/// A SQLSTATE with a name, for the ones this code decides on (PostgreSQL's appendix A, as
/// PostgresNIO names them): compare `error.code == .deadlockDetected`, not `"40P01"`.
public struct SQLState: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// The class: the first two characters (`08` connection exception, `40` transaction rollback…).
    public var errorClass: Substring { rawValue.prefix(2) }
    public var description: String { rawValue }

    public static let connectionException = SQLState(rawValue: "08000")
    public static let uniqueViolation = SQLState(rawValue: "23505")
    public static let serializationFailure = SQLState(rawValue: "40001")
    public static let deadlockDetected = SQLState(rawValue: "40P01")
    public static let syntaxError = SQLState(rawValue: "42601")
    public static let diskFull = SQLState(rawValue: "53100")
    public static let tooManyConnections = SQLState(rawValue: "53300")
    public static let queryCanceled = SQLState(rawValue: "57014")
    public static let adminShutdown = SQLState(rawValue: "57P01")
    public static let crashShutdown = SQLState(rawValue: "57P02")
    public static let cannotConnectNow = SQLState(rawValue: "57P03")
}

/// A value bound to a statement parameter, sent in binary (no escaping, no parsing): text,
/// a 64-bit integer, bytes, or an array of one of those (for `= ANY($1)` and `unnest($1)`).
public enum PostgresValue: Sendable, Hashable {
    case null
    case text(String)
    case int(Int64)
    case bytes(Data)
    case textArray([String])
    case intArray([Int64])
    case bytesArray([Data])

    /// The parameter's type OID (0: the server infers it) and its binary form.
    var wire: (type: UInt32, bytes: [UInt8]?) {
        switch self {
        case .null: (0, nil)
        case .text(let text): (0, Array(text.utf8))
        case .int(let number): (20, Self.bigEndian(number))
        case .bytes(let data): (0, Array(data))
        case .textArray(let items): (1009, Self.array(of: 25, items.map { Array($0.utf8) }))
        case .intArray(let items): (1016, Self.array(of: 20, items.map(Self.bigEndian)))
        case .bytesArray(let items): (1001, Self.array(of: 17, items.map { Array($0) }))
        }
    }

    private static func bigEndian<T: FixedWidthInteger>(_ value: T) -> [UInt8] { withUnsafeBytes(of: value.bigEndian) { Array($0) } }

    /// PostgreSQL's binary array form: dimensions, flags, element type, then each dimension's
    /// size and lower bound, then each element's length and bytes.
    private static func array(of element: UInt32, _ items: [[UInt8]]) -> [UInt8] {
        var out = bigEndian(Int32(items.isEmpty ? 0 : 1)) + bigEndian(Int32(0)) + bigEndian(element)
        if !items.isEmpty { out += bigEndian(Int32(items.count)) + bigEndian(Int32(1)) }
        for item in items { out += bigEndian(Int32(item.count)) + item }
        return out
    }
}

/// The rows of a result, in PostgreSQL's binary form (no text to parse): a `text` column's
/// UTF-8, an integer's big-endian bytes, a `bytea`'s bytes as they are.
public struct PostgresRows: Sendable {
    public let columns: [String]
    /// Each row's values; nil for NULL.
    public let rows: [[Data?]]
    /// How many rows an INSERT, UPDATE or DELETE touched.
    public let affected: Int

    public var count: Int { rows.count }
    /// A cell, or nil for NULL or a row or column that is not there.
    public func cell(_ row: Int, _ column: Int) -> Data? {
        guard rows.indices.contains(row), rows[row].indices.contains(column) else { return nil }
        return rows[row][column]
    }
    public func text(_ row: Int, _ column: Int) -> String? { cell(row, column).map { String(decoding: $0, as: UTF8.self) } }
    /// A `smallint`, `integer`, `bigint` or `xid8` value.
    public func int(_ row: Int, _ column: Int) -> Int64? {
        guard let cell = cell(row, column), [2, 4, 8].contains(cell.count) else { return nil }
        let unsigned = cell.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        switch cell.count {
        case 2: return Int64(Int16(truncatingIfNeeded: unsigned))
        case 4: return Int64(Int32(truncatingIfNeeded: unsigned))
        default: return Int64(bitPattern: unsigned)
        }
    }
    public func bytes(_ row: Int, _ column: Int) -> Data? { cell(row, column) }
    public func bool(_ row: Int, _ column: Int) -> Bool? { cell(row, column).map { $0.first == 1 } }
}

/// One connection to PostgreSQL through libpq (`PGconn`). Not `Sendable`: its owner serializes
/// access. Statements take parameters (`$1`, `$2`, …); bytes go in binary, never spliced into SQL.
public final class PostgresConnection {
    private let connection: OpaquePointer
    /// A descriptor of our own for the connection's socket (a duplicate), for ``cut()`` from
    /// another thread: libpq may close its own descriptor at any moment (a failing link), and
    /// a number it closed may be another socket's by the time a shutdown reaches it. Ours stays
    /// the same socket until this connection is gone.
    private let cutHandle: Int32
    /// Statements prepared on this connection, by their SQL and parameter types.
    private var statements = [String: String]()

    /// Connects (`conninfo`: `host=/run/postgresql dbname=chat user=convkitd`, or a
    /// `postgres://` URL). - Throws: ``PostgresError`` when the server cannot be reached or
    /// refuses.
    public init(_ conninfo: String) throws(PostgresError) {
        // Deadlines on the link, unless the connection string says otherwise (its values come
        // after): a host that does not answer fails after 5 s (libpq's default waits for the
        // system's TCP timeout); a link that falls silent is found dead within about 5 s —
        // TCP keepalives after 2 s idle, every second, 3 unanswered, and sent data left
        // unacknowledged for 5 s — instead of the kernel's ~15 minutes.
        let keywords = ["connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout", "dbname"]
        let values = ["5", "1", "2", "1", "3", "5000", conninfo]
        let made: OpaquePointer? = Self.withCStrings(keywords) { keywords in Self.withCStrings(values) { values in PQconnectdbParams(keywords, values, 1) } }
        guard let connection = made else { throw PostgresError(sqlState: "", message: "libpq could not allocate a connection") }
        guard PQstatus(connection) == CONNECTION_OK else {
            let message = Self.text(PQerrorMessage(connection))
            PQfinish(connection)
            throw PostgresError(sqlState: "", message: "cannot connect: \(message)")
        }
        self.connection = connection
        cutHandle = fcntl(PQsocket(connection), F_DUPFD_CLOEXEC, 0)
        // Notices ("relation already exists, skipping") are not errors: libpq would print them.
        PQsetNoticeProcessor(connection, { _, _ in }, nil)
    }

    deinit {
        PQfinish(connection)
        if cutHandle >= 0 { close(cutHandle) }
    }

    /// The value a connection option (`keepalives_idle`, `dbname`…) has on this connection.
    public func option(_ keyword: String) -> String? {
        guard let options = PQconninfo(connection) else { return nil }
        defer { PQconninfoFree(options) }
        var option = options
        while let name = option.pointee.keyword {
            if String(cString: name) == keyword { return option.pointee.val.map { String(cString: $0) } }
            option += 1
        }
        return nil
    }

    /// Whether the connection still works as far as libpq knows.
    public var isOK: Bool { PQstatus(connection) == CONNECTION_OK }

    /// Cuts the link under a call that waits for the server (from another thread): the call
    /// fails at once as a connection failure, and the connection is done. For a server that
    /// stopped answering on a link the kernel still calls alive (a stalled proxy, a hung
    /// backend), which neither keepalives nor `tcp_user_timeout` notice.
    public func cut() {
        if cutHandle >= 0 { shutdown(cutHandle, Int32(SHUT_RDWR)) }
    }

    /// Whether an idle connection (one that is not listening) may be used again, looked at
    /// without a round trip: a server that ends a connection (a restart, an administrator)
    /// sends it a last error and closes it, so an idle connection with anything to read is done.
    public var isIdleAndOpen: Bool {
        guard isOK else { return false }
        var waiting = pollfd(fd: PQsocket(connection), events: Int16(POLLIN), revents: 0)
        return poll(&waiting, 1, 0) == 0
    }

    /// Runs one statement with parameters. - Returns: its rows (empty for a command).
    @discardableResult
    public func execute(_ sql: String, _ parameters: [PostgresValue] = []) throws(PostgresError) -> PostgresRows {
        let sent = try send(sql, parameters) { statement, count, types, pointers, lengths, formats in
            if let statement { return PQexecPrepared(connection, statement, count, pointers, lengths, formats, 1) }
            return PQexecParams(connection, sql, count, types, pointers, lengths, formats, 1)
        }
        guard let result = sent else { throw PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection))) }
        defer { PQclear(result) }
        return try Self.rows(of: result)
    }

    /// Runs statements in one round trip (libpq's pipeline mode): all are sent, then every
    /// result is read. The server runs them in order, each seeing what the ones before did
    /// (within a transaction: the locks they took). The first that fails stops the rest.
    /// - Returns: each statement's rows. - Throws: the first statement's error.
    @discardableResult
    public func pipeline(_ statements: [(sql: String, parameters: [PostgresValue])]) throws(PostgresError) -> [PostgresRows] {
        // Prepared first (once per connection), so the pipeline holds only executions.
        var names = [String?]()
        for statement in statements { names.append(try prepared(statement.sql, types: statement.parameters.map(\.wire.type))) }
        guard PQenterPipelineMode(connection) == 1 else { throw PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection))) }
        defer { PQexitPipelineMode(connection) }
        for (statement, name) in zip(statements, names) {
            let queued = try send(statement.sql, statement.parameters) { _, count, types, pointers, lengths, formats in
                if let name { return PQsendQueryPrepared(connection, name, count, pointers, lengths, formats, 1) }
                return PQsendQueryParams(connection, statement.sql, count, types, pointers, lengths, formats, 1)
            }
            guard queued == 1 else { throw PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection))) }
        }
        guard PQpipelineSync(connection) == 1 else { throw PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection))) }
        // Every result is read (up to the sync) whatever happened, so the connection ends idle.
        var results = [PostgresRows](), failure: PostgresError?
        for _ in statements {
            guard let result = PQgetResult(connection) else {
                failure = failure ?? PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection)))
                continue
            }
            do { results.append(try Self.rows(of: result)) } catch { failure = failure ?? error }
            PQclear(result)
            while let extra = PQgetResult(connection) { PQclear(extra) }  // the end of this statement's results
        }
        while let result = PQgetResult(connection) {
            let status = PQresultStatus(result)
            PQclear(result)
            if status == PGRES_PIPELINE_SYNC { break }
        }
        if !isOK { failure = failure ?? PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection))) }
        if let failure { throw failure }
        return results
    }

    /// Binds a statement's parameters (all binary) and hands them to `call` with its prepared
    /// name (nil: not prepared); the buffers live until `call` returns.
    private func send<R>(_ sql: String, _ parameters: [PostgresValue],
                         _ call: (String?, Int32, [UInt32], [UnsafePointer<CChar>?], [Int32], [Int32]) -> R) throws(PostgresError) -> R {
        let wire = parameters.map(\.wire)
        // Empty bytes still get a pointer (NULL is NULL).
        let buffers: [[UInt8]?] = wire.map { $0.bytes.map { $0.isEmpty ? [0] : $0 } }
        let types = wire.map(\.type)
        let lengths = wire.map { Int32($0.bytes?.count ?? 0) }
        let formats = [Int32](repeating: 1, count: parameters.count)
        let statement = try prepared(sql, types: types)
        return Self.withPointers(buffers) { pointers in call(statement, Int32(parameters.count), types, pointers, lengths, formats) }
    }

    /// A result's rows, or its error.
    private static func rows(of result: OpaquePointer) throws(PostgresError) -> PostgresRows {
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK:
            break
        case PGRES_PIPELINE_ABORTED:
            throw PostgresError(sqlState: "", message: "not run: an earlier statement of its pipeline failed")
        default:
            throw error(result)
        }
        let columnCount = Int(PQnfields(result)), rowCount = Int(PQntuples(result))
        let columns = (0..<columnCount).map { String(cString: PQfname(result, Int32($0))) }
        let rows = (0..<rowCount).map { row in
            (0..<columnCount).map { column -> Data? in
                guard PQgetisnull(result, Int32(row), Int32(column)) == 0, let value = PQgetvalue(result, Int32(row), Int32(column)) else { return nil }
                return Data(bytes: value, count: Int(PQgetlength(result, Int32(row), Int32(column))))
            }
        }
        return PostgresRows(columns: columns, rows: rows, affected: Int(String(cString: PQcmdTuples(result))) ?? 0)
    }

    /// Runs several statements separated by semicolons, without parameters (a migration).
    public func executeScript(_ sql: String) throws(PostgresError) {
        guard let result = PQexec(connection, sql) else { throw PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection))) }
        defer { PQclear(result) }
        guard [PGRES_COMMAND_OK, PGRES_TUPLES_OK].contains(PQresultStatus(result)) else { throw Self.error(result) }
    }

    /// Runs `body` in a transaction: committed when it returns, rolled back when it throws.
    /// - Throws: a ``PostgresError`` or what `body` throws.
    public func transaction<T, E: Error>(_ body: () throws(E) -> T) throws -> T {
        try execute("BEGIN")
        do {
            let value = try body()
            try execute("COMMIT")
            return value
        } catch {
            _ = try? execute("ROLLBACK")
            throw error
        }
    }

    /// Starts listening on a channel (`LISTEN`); notifications then come from
    /// ``waitForNotification(timeout:)``.
    public func listen(_ channel: String) throws(PostgresError) {
        try execute("LISTEN \"\(channel.replacingOccurrences(of: "\"", with: "\"\""))\"")
    }

    /// The next notification's channel and payload, or nil after `timeout` seconds.
    public func waitForNotification(timeout: Double) throws(PostgresError) -> (channel: String, payload: String)? {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if PQconsumeInput(connection) == 0 { throw PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection))) }
            if let notification = PQnotifies(connection) {
                defer { PQfreemem(notification) }
                return (String(cString: notification.pointee.relname), String(cString: notification.pointee.extra))
            }
            let left = deadline.timeIntervalSinceNow
            if left <= 0 { return nil }
            var waiting = pollfd(fd: PQsocket(connection), events: Int16(POLLIN), revents: 0)
            _ = poll(&waiting, 1, Int32(min(left, 1) * 1000))
        }
    }

    /// The name of `sql` prepared on this connection (parsed and planned once, run many times),
    /// or nil for a statement PostgreSQL does not prepare (BEGIN, LISTEN…), run as it is.
    private func prepared(_ sql: String, types: [UInt32]) throws(PostgresError) -> String? {
        let key = sql + "\u{0}" + types.map(String.init).joined(separator: ",")
        if let name = statements[key] { return name }
        let verb = sql.prefix(7).uppercased()
        guard ["SELECT", "INSERT", "UPDATE", "DELETE", "WITH"].contains(where: { verb.hasPrefix($0) }) else { return nil }
        let name = "ck\(statements.count)"
        guard let result = PQprepare(connection, name, sql, Int32(types.count), types) else {
            throw PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection)))
        }
        defer { PQclear(result) }
        guard PQresultStatus(result) == PGRES_COMMAND_OK else { throw Self.error(result) }
        statements[key] = name
        return name
    }

    private static func error(_ result: OpaquePointer) -> PostgresError {
        let state = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) } ?? ""
        return PostgresError(sqlState: state, message: text(PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines))
    }

    private static func text(_ pointer: UnsafePointer<CChar>?) -> String {
        pointer.map { String(cString: $0) } ?? "unknown error"
    }

    /// Calls `body` with a NULL-terminated array of C strings, alive for its duration.
    private static func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R) -> R {
        let copies = strings.map { strdup($0) }
        defer { copies.forEach { free($0) } }
        let pointers = copies.map { UnsafePointer($0) } + [nil]
        return pointers.withUnsafeBufferPointer { buffer in body(buffer.baseAddress!) }
    }

    /// Calls `body` with C pointers to each buffer (NULL for a nil one), alive for its duration.
    private static func withPointers<R>(_ buffers: [[UInt8]?], _ body: ([UnsafePointer<CChar>?]) -> R) -> R {
        var pointers = [UnsafePointer<CChar>?]()
        func next(_ index: Int) -> R {
            guard index < buffers.count else { return body(pointers) }
            guard let buffer = buffers[index] else {
                pointers.append(nil)
                return next(index + 1)
            }
            return buffer.withUnsafeBufferPointer { raw in
                pointers.append(raw.baseAddress.map { UnsafeRawPointer($0).assumingMemoryBound(to: CChar.self) })
                return next(index + 1)
            }
        }
        return next(0)
    }
}
