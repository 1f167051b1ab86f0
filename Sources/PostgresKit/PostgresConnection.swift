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

    /// Whether the connection itself failed (the server unreachable or gone), so a new one may
    /// succeed: class 08 (connection exception), 57P01–57P03 (shutdown), or no SQLSTATE at all.
    public var isConnectionFailure: Bool {
        sqlState.isEmpty || sqlState.hasPrefix("08") || ["57P01", "57P02", "57P03"].contains(sqlState)
    }

    public var description: String { sqlState.isEmpty ? message : "\(sqlState): \(message)" }
}

/// A value bound to a statement parameter: text, or bytes sent in binary (no escaping).
public enum PostgresValue: Sendable, Hashable {
    case null
    case text(String)
    case int(Int64)
    case bytes(Data)
}

/// The rows of a result, as libpq returns them in text form (a `bytea` column decoded from its
/// hex form).
public struct PostgresRows: Sendable {
    public let columns: [String]
    /// Each row's values; nil for NULL.
    public let rows: [[String?]]
    /// How many rows an INSERT, UPDATE or DELETE touched.
    public let affected: Int

    public func text(_ row: Int, _ column: Int) -> String? { rows[row][column] }
    public func int(_ row: Int, _ column: Int) -> Int64? { rows[row][column].flatMap { Int64($0) } }

    /// A `bytea` value: `\x` and hex digits in text form.
    public func bytes(_ row: Int, _ column: Int) -> Data? {
        guard let text = rows[row][column], text.hasPrefix("\\x") else { return nil }
        var data = Data(capacity: (text.utf8.count - 2) / 2)
        var high: UInt8? = nil
        for byte in text.utf8.dropFirst(2) {
            let nibble: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): nibble = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): nibble = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): nibble = byte - UInt8(ascii: "A") + 10
            default: return nil
            }
            if let first = high {
                data.append(first << 4 | nibble)
                high = nil
            } else {
                high = nibble
            }
        }
        return high == nil ? data : nil
    }
}

/// One connection to PostgreSQL through libpq (`PGconn`). Not `Sendable`: its owner serializes
/// access. Statements take parameters (`$1`, `$2`, …); bytes go in binary, never spliced into SQL.
public final class PostgresConnection {
    private let connection: OpaquePointer

    /// Connects (`conninfo`: `host=/run/postgresql dbname=chat user=convkitd`, or a
    /// `postgres://` URL). - Throws: ``PostgresError`` when the server cannot be reached or
    /// refuses.
    public init(_ conninfo: String) throws(PostgresError) {
        guard let connection = PQconnectdb(conninfo) else { throw PostgresError(sqlState: "", message: "libpq could not allocate a connection") }
        guard PQstatus(connection) == CONNECTION_OK else {
            let message = Self.text(PQerrorMessage(connection))
            PQfinish(connection)
            throw PostgresError(sqlState: "", message: "cannot connect: \(message)")
        }
        self.connection = connection
    }

    deinit { PQfinish(connection) }

    /// Whether the connection still works as far as libpq knows.
    public var isOK: Bool { PQstatus(connection) == CONNECTION_OK }

    /// Runs one statement with parameters. - Returns: its rows (empty for a command).
    @discardableResult
    public func execute(_ sql: String, _ parameters: [PostgresValue] = []) throws(PostgresError) -> PostgresRows {
        // Every parameter's bytes stay alive until PQexecParams returns.
        let buffers: [[UInt8]?] = parameters.map { value in
            switch value {
            case .null: nil
            case .text(let text): Array(text.utf8) + [0]
            case .int(let number): Array(String(number).utf8) + [0]
            case .bytes(let data): data.isEmpty ? [0] : Array(data)  // a pointer for empty bytes too (NULL is NULL)
            }
        }
        let formats: [Int32] = parameters.map { if case .bytes = $0 { 1 } else { 0 } }
        let lengths: [Int32] = zip(parameters, buffers).map { value, buffer in
            if case .bytes(let data) = value { return Int32(data.count) }
            return Int32(buffer?.count ?? 0)
        }
        let result: OpaquePointer? = Self.withPointers(buffers) { pointers in
            PQexecParams(connection, sql, Int32(parameters.count), nil, pointers, lengths, formats, 0)
        }
        guard let result else { throw PostgresError(sqlState: "", message: Self.text(PQerrorMessage(connection))) }
        defer { PQclear(result) }
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK:
            break
        default:
            let state = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) } ?? ""
            throw PostgresError(sqlState: state, message: Self.text(PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines))
        }
        let columnCount = Int(PQnfields(result)), rowCount = Int(PQntuples(result))
        let columns = (0..<columnCount).map { String(cString: PQfname(result, Int32($0))) }
        let rows = (0..<rowCount).map { row in
            (0..<columnCount).map { column -> String? in
                PQgetisnull(result, Int32(row), Int32(column)) == 1 ? nil : String(cString: PQgetvalue(result, Int32(row), Int32(column)))
            }
        }
        return PostgresRows(columns: columns, rows: rows, affected: Int(String(cString: PQcmdTuples(result))) ?? 0)
    }

    /// Runs `body` in a transaction: committed when it returns, rolled back when it throws.
    public func transaction<T>(_ body: () throws(PostgresError) -> T) throws(PostgresError) -> T {
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

    private static func text(_ pointer: UnsafePointer<CChar>?) -> String {
        pointer.map { String(cString: $0) } ?? "unknown error"
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
