import CSQLite
import Foundation

/// The raw SQLite C API with nothing of ours on top: the baseline the store is measured against.
final class RawSQLite {
    let db: OpaquePointer

    init(path: String) throws {
        var handle: OpaquePointer?
        guard sqlite3_open(path, &handle) == SQLITE_OK, let handle else { throw RawError("cannot open \(path)") }
        db = handle
        try exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL")
    }

    deinit { sqlite3_close_v2(db) }

    func exec(_ sql: String) throws {
        guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else { throw RawError(String(cString: sqlite3_errmsg(db))) }
    }

    func prepare(_ sql: String) throws -> OpaquePointer {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            throw RawError(String(cString: sqlite3_errmsg(db)))
        }
        return statement
    }

    func bind(_ statement: OpaquePointer, _ index: Int32, _ text: String) {
        sqlite3_bind_text(statement, index, text, -1, csqlite_transient())
    }

    func bind(_ statement: OpaquePointer, _ index: Int32, _ data: [UInt8]) {
        sqlite3_bind_blob(statement, index, data, Int32(data.count), csqlite_transient())
    }

    /// The frames (pages) in the write-ahead log, after a passive checkpoint; `truncate` first
    /// empties it (what a count of pages written starts from).
    func walFrames(truncate: Bool = false) throws -> Int {
        var frames: Int32 = 0, done: Int32 = 0
        let mode = truncate ? SQLITE_CHECKPOINT_TRUNCATE : SQLITE_CHECKPOINT_PASSIVE
        guard sqlite3_wal_checkpoint_v2(db, nil, mode, &frames, &done) == SQLITE_OK else { throw RawError(String(cString: sqlite3_errmsg(db))) }
        return Int(frames)
    }

    /// The pages the write-ahead log holds now, by the table or index each belongs to (SQLite's
    /// `dbstat`), most first: where a count of `walFrames()` went. Frames of an earlier log
    /// (another salt) are not counted; a page no table holds any more is "?". The same reading
    /// as `scripts/wal-pages.py`.
    func walPagesByTable(path: String) throws -> [(table: String, pages: Int)] {
        guard let log = FileManager.default.contents(atPath: path + "-wal"), log.count >= 32 else { return [] }
        let bytes = [UInt8](log)
        func word(_ at: Int) -> UInt32 { bytes[at..<at + 4].reduce(0) { $0 << 8 | UInt32($1) } }
        let pageSize = Int(word(8)), salt = bytes[16..<24]
        guard pageSize > 0 else { return [] }
        var pages = [UInt32](), offset = 32
        while offset + 24 + pageSize <= bytes.count, bytes[offset + 8..<offset + 16] == salt {
            pages.append(word(offset))
            offset += 24 + pageSize
        }
        var owner = [UInt32: String]()
        let statement = try prepare("SELECT name, pageno FROM dbstat")
        defer { sqlite3_finalize(statement) }
        while sqlite3_step(statement) == SQLITE_ROW {
            owner[UInt32(sqlite3_column_int64(statement, 1))] = String(cString: sqlite3_column_text(statement, 0))
        }
        var counts = [String: Int]()
        for page in pages { counts[owner[page] ?? "?", default: 0] += 1 }
        return counts.map { (table: $0.key, pages: $0.value) }.sorted { ($0.pages, $1.table) > ($1.pages, $0.table) }
    }

    /// Inserts `records` into a new table `table`, 200 to a transaction (what a pull's pages do,
    /// raw). - Returns: records a second.
    func insertRate(_ records: [[UInt8]], table: String) throws -> Double {
        try exec("CREATE TABLE \(table) (zone TEXT NOT NULL, name TEXT NOT NULL, record BLOB NOT NULL, PRIMARY KEY (zone, name)) STRICT")
        let insert = try prepare("INSERT INTO \(table) (zone, name, record) VALUES (?, ?, ?)")
        defer { sqlite3_finalize(insert) }
        let start = ContinuousClock.now
        for pageStart in stride(from: 0, to: records.count, by: 200) {
            try exec("BEGIN IMMEDIATE")
            for index in pageStart..<min(records.count, pageStart + 200) {
                bind(insert, 1, "zone")
                bind(insert, 2, "r\(index)")
                bind(insert, 3, records[index])
                try run(insert)
            }
            try exec("COMMIT")
        }
        return Double(records.count) / secondsIn(ContinuousClock.now - start)
    }

    func run(_ statement: OpaquePointer) throws {
        guard sqlite3_step(statement) == SQLITE_DONE else { throw RawError(String(cString: sqlite3_errmsg(db))) }
        sqlite3_reset(statement)
    }
}

struct RawError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
