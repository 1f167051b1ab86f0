import Foundation
import RecordZone
import SQLiteKit

/// A local change waiting to be pushed: one row of the outbox, as ``ConversationStore/outbox()``
/// lists it and as the sync pushes it.
public struct OutboxEntry: Sendable, Hashable {
    /// The row's place in the queue (oldest first).
    public let id: Int64
    public let zone: String
    public let name: String
    /// The record's type ("" when the store no longer holds the record it queued).
    public let recordType: String
    /// Failed attempts so far.
    public let attempts: Int
    /// When the next attempt may run.
    public let nextAttemptAt: Date
    /// Why the last attempt failed, and its code.
    public let lastError: String?
    public let lastErrorCode: RecordZoneError.Code?
    /// The signed version to push, as queued.
    let record: Data
}

/// The store's outbox (`ck_outbox`, sqlite-data's `PendingRecordZoneChange` in spirit): the signed
/// local versions waiting to be pushed, one per record — a newer local version of a record
/// replaces the queued one and starts its attempts over — oldest first, each with its attempts,
/// when it is next due and why the last attempt failed. Every statement over the table is here;
/// callers run them inside their own transactions.
enum Outbox {
    /// Queues `record`'s version (replacing one queued for the same record), due at once.
    static func enqueue(_ record: Data, zone: String, name: String, in db: Database) throws {
        try db.execute("""
            INSERT INTO ck_outbox (zone, name, record) VALUES (?, ?, ?)
            ON CONFLICT (zone, name) DO UPDATE SET record = excluded.record, attempts = 0, next_attempt_at = 0, last_error = NULL, last_error_code = NULL
            """, [zone, name, record])
    }

    private static let columns = """
        o.id, o.zone, o.name, coalesce(r.type, ''), o.attempts, o.next_attempt_at, o.last_error, o.last_error_code, o.record
        FROM ck_outbox o LEFT JOIN ck_records r ON r.zone = o.zone AND r.name = o.name
        """

    private static func entry(_ row: Row) -> OutboxEntry {
        OutboxEntry(id: row.int(0), zone: row.text(1), name: row.text(2), recordType: row.text(3), attempts: Int(row.int(4)),
                    nextAttemptAt: Date(timeIntervalSince1970: Double(row.int(5)) / 1000), lastError: row.optionalText(6),
                    lastErrorCode: row.optionalText(7).flatMap(RecordZoneError.Code.init(rawValue:)), record: row.blob(8))
    }

    /// Every entry, oldest first.
    static func entries(in db: Database) throws -> [OutboxEntry] {
        try db.rows("SELECT \(columns) ORDER BY o.id", [], entry)
    }

    /// Up to `limit` entries due at `now` (unix ms), oldest first.
    static func due(at now: Int64, limit: Int, in db: Database) throws -> [OutboxEntry] {
        try db.rows("SELECT \(columns) WHERE o.next_attempt_at <= ? ORDER BY o.id LIMIT ?", [now, limit], entry)
    }

    /// How many entries there are.
    static func count(in db: Database) throws -> Int {
        Int(try db.first("SELECT count(*) FROM ck_outbox") { $0.int(0) } ?? 0)
    }

    /// Whether any entry is due at `now` (unix ms): one indexed look, what an idle poll costs.
    static func hasDue(at now: Int64, in db: Database) throws -> Bool {
        try db.first("SELECT 1 FROM ck_outbox WHERE next_attempt_at <= ? LIMIT 1", [now]) { _ in true } ?? false
    }

    /// Takes `entry` out of the queue if the version queued is still the one it holds (not
    /// replaced by a newer local change meanwhile). - Returns: whether it was.
    @discardableResult
    static func remove(_ entry: OutboxEntry, in db: Database) throws -> Bool {
        try db.execute("DELETE FROM ck_outbox WHERE id = ? AND record = ?", [entry.id, entry.record])
        return db.changes > 0
    }

    /// Takes every entry of a zone out (the conversation is removed from this store).
    static func remove(zone: String, in db: Database) throws {
        try db.execute("DELETE FROM ck_outbox WHERE zone = ?", [zone])
    }

    /// Takes out every version `key` signed after `clock` (a revoked device's): no reader
    /// accepts them.
    static func removeSigned(by key: Data, after clock: Int64, in db: Database) throws {
        try db.execute("""
            DELETE FROM ck_outbox WHERE id IN
                (SELECT o.id FROM ck_outbox o JOIN ck_records r ON r.zone = o.zone AND r.name = o.name WHERE r.author = ? AND r.clock > ?)
            """, [key, clock])
    }

    /// Records a failed attempt: the entry is due again at `next` (unix ms), with why.
    static func reschedule(_ entry: OutboxEntry, next: Int64, error: RecordZoneError, in db: Database) throws {
        try db.execute("UPDATE ck_outbox SET attempts = ?, next_attempt_at = ?, last_error = ?, last_error_code = ? WHERE id = ?",
                       [entry.attempts + 1, next, error.description, error.code.rawValue, entry.id])
    }

    /// An SQL condition: the row of `table` (with `zone` and `name` columns) has a version
    /// waiting in the outbox (a cache reset keeps it).
    static func isQueued(_ table: String) -> String {
        "EXISTS (SELECT 1 FROM ck_outbox o WHERE o.zone = \(table).zone AND o.name = \(table).name)"
    }
}
