import Foundation
import RecordZone
import SQLiteKit

/// A local change waiting to be pushed: one row of the outbox, as ``ConversationStore/outbox()``
/// lists it and as the sync pushes it.
public struct OutboxEntry: Sendable, Hashable {
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
    /// The queued version's clock: with `zone` and `name`, the key of the stored version
    /// (``ck_records``) the entry stands for, and the entry's place in the queue.
    let clock: UInt64
    /// That version's signed bytes, read from the records; nil when the store no longer holds
    /// it (a newer version, pulled, took its place: nothing of this entry is left to push).
    let record: Data?

    /// The version queued: another version of the same record queued later is another entry.
    var version: Version { Version(zone: zone, name: name, clock: clock) }

    struct Version: Hashable {
        var zone: String, name: String, clock: UInt64
    }
}

/// The store's outbox (`ck_outbox`, sqlite-data's `PendingRecordZoneChange` in spirit): the
/// local versions waiting to be pushed, one per record — a newer local version of a record
/// replaces the queued one and starts its attempts over — oldest first (by the version's clock,
/// which orders a device's own versions as it wrote them), each with its attempts,
/// when it is next due and why the last attempt failed. An entry references the version the
/// store holds (zone, name and clock in `ck_records`) instead of keeping a second copy of its
/// bytes, and settles by comparing that key. Every statement over the table is here; callers
/// run them inside their own transactions.
enum Outbox {
    /// The table as migration 25 made it (a row id and an index on zone and name).
    static let referencing = """
        CREATE TABLE ck_outbox_by_reference (
            id INTEGER PRIMARY KEY, zone TEXT NOT NULL, name TEXT NOT NULL, clock INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at INTEGER NOT NULL DEFAULT 0, last_error TEXT, last_error_code TEXT,
            UNIQUE (zone, name)) STRICT;
        -- A version queued that the records no longer hold (a pulled one replaced it) gets clock
        -- 0, which no stored version has: nothing is left to push.
        INSERT INTO ck_outbox_by_reference (id, zone, name, clock, attempts, next_attempt_at, last_error, last_error_code)
            SELECT o.id, o.zone, o.name, CASE WHEN r.record = o.record THEN r.clock ELSE 0 END, o.attempts, o.next_attempt_at, o.last_error, o.last_error_code
            FROM ck_outbox o LEFT JOIN ck_records r ON r.zone = o.zone AND r.name = o.name;
        DROP TABLE ck_outbox;
        ALTER TABLE ck_outbox_by_reference RENAME TO ck_outbox;
        """

    /// The table, as migration 27 makes it: one tree keyed by the record, so queueing a version
    /// writes one page where a row id and an index on zone and name wrote two (docs/PERFORMANCE.md);
    /// the queue's order is the versions' clocks.
    static let schema = """
        CREATE TABLE ck_outbox_keyed (
            zone TEXT NOT NULL, name TEXT NOT NULL, clock INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at INTEGER NOT NULL DEFAULT 0, last_error TEXT, last_error_code TEXT,
            PRIMARY KEY (zone, name)) STRICT, WITHOUT ROWID;
        INSERT INTO ck_outbox_keyed (zone, name, clock, attempts, next_attempt_at, last_error, last_error_code)
            SELECT zone, name, clock, attempts, next_attempt_at, last_error, last_error_code FROM ck_outbox;
        DROP TABLE ck_outbox;
        ALTER TABLE ck_outbox_keyed RENAME TO ck_outbox;
        """

    /// Queues the stored version of a record, by its clock (replacing one queued for the same
    /// record), due at once.
    static func enqueue(zone: String, name: String, clock: UInt64, in db: Database) throws {
        try db.execute("""
            INSERT INTO ck_outbox (zone, name, clock) VALUES (?, ?, ?)
            ON CONFLICT (zone, name) DO UPDATE SET clock = excluded.clock, attempts = 0, next_attempt_at = 0, last_error = NULL, last_error_code = NULL
            """, [zone, name, clock])
    }

    private static let columns = """
        o.zone, o.name, coalesce(r.type, ''), o.attempts, o.next_attempt_at, o.last_error, o.last_error_code, o.clock,
            CASE WHEN r.clock = o.clock THEN r.record END
        FROM ck_outbox o LEFT JOIN ck_records r ON r.zone = o.zone AND r.name = o.name
        """

    private static func entry(_ row: Row) -> OutboxEntry {
        OutboxEntry(zone: row.text(0), name: row.text(1), recordType: row.text(2), attempts: Int(row.int(3)),
                    nextAttemptAt: Date(timeIntervalSince1970: Double(row.int(4)) / 1000), lastError: row.optionalText(5),
                    lastErrorCode: row.optionalText(6).flatMap(RecordZoneError.Code.init(rawValue:)),
                    clock: UInt64(bitPattern: row.int(7)), record: row.optionalBlob(8))
    }

    /// Every entry, oldest first.
    static func entries(in db: Database) throws -> [OutboxEntry] {
        try db.rows("SELECT \(columns) ORDER BY o.clock, o.zone, o.name", [], entry)
    }

    /// Up to `limit` entries due at `now` (unix ms), oldest first.
    static func due(at now: Int64, limit: Int, in db: Database) throws -> [OutboxEntry] {
        try db.rows("SELECT \(columns) WHERE o.next_attempt_at <= ? ORDER BY o.clock, o.zone, o.name LIMIT ?", [now, limit], entry)
    }

    /// How many entries there are.
    static func count(in db: Database) throws -> Int {
        Int(try db.first("SELECT count(*) FROM ck_outbox") { $0.int(0) } ?? 0)
    }

    /// Whether any entry is due at `now` (unix ms): one indexed look, what an idle poll costs.
    static func hasDue(at now: Int64, in db: Database) throws -> Bool {
        try db.first("SELECT 1 FROM ck_outbox WHERE next_attempt_at <= ? LIMIT 1", [now]) { _ in true } ?? false
    }

    /// Takes `entry` out of the queue if the version queued is still the one it references
    /// (not replaced by a newer local change meanwhile). - Returns: whether it was.
    @discardableResult
    static func remove(_ entry: OutboxEntry, in db: Database) throws -> Bool {
        try db.execute("DELETE FROM ck_outbox WHERE zone = ? AND name = ? AND clock = ?", [entry.zone, entry.name, entry.clock])
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
            DELETE FROM ck_outbox AS o WHERE
                EXISTS (SELECT 1 FROM ck_records r WHERE r.zone = o.zone AND r.name = o.name AND r.clock = o.clock AND r.author = ? AND r.clock > ?)
            """, [key, clock])
    }

    /// Records a failed attempt: the entry is due again at `next` (unix ms), with why.
    static func reschedule(_ entry: OutboxEntry, next: Int64, error: RecordZoneError, in db: Database) throws {
        try db.execute("UPDATE ck_outbox SET attempts = ?, next_attempt_at = ?, last_error = ?, last_error_code = ? WHERE zone = ? AND name = ? AND clock = ?",
                       [entry.attempts + 1, next, error.description, error.code.rawValue, entry.zone, entry.name, entry.clock])
    }

    /// An SQL condition: the row of `table` (with `zone` and `name` columns) has a version
    /// waiting in the outbox (a cache reset keeps it).
    static func isQueued(_ table: String) -> String {
        "EXISTS (SELECT 1 FROM ck_outbox o WHERE o.zone = \(table).zone AND o.name = \(table).name)"
    }
}
