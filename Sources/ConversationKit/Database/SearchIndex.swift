import SQLiteKit

/// The full-text index of the messages (`message_search`, FTS5 over the messages table's own
/// text by rowid), fed in batches instead of by a trigger per row: every message whose rowid is
/// above the stored mark (`ck_meta`'s `search_indexed`) waits, and the write that leaves
/// ``batch`` or more waiting indexes them all with one statement, in that write's transaction
/// (a pulled page, every 64th send). Nothing is kept apart from the messages themselves, so a
/// crash loses nothing: what waits is whatever lies above the mark. A search reads the index
/// and matches the few messages still waiting on its own (``search(_:zone:speaker:limit:in:)``).
///
/// The triggers keep what is indexed in step: an edit, a removal or a deletion of a message at
/// or below the mark changes the index at once; one above it changes nothing (it is indexed as
/// it stands when its turn comes). A new row below the mark (SQLite reuses the highest rowid
/// after that row was removed) is indexed at once.
enum SearchIndex {
    /// Messages waiting before a write indexes them.
    static let batch: Int64 = 64

    static let mark = "(SELECT value FROM ck_meta WHERE key = 'search_indexed')"

    /// Migration 24: the per-row triggers replaced by the mark (everything there is indexed).
    static let schema = """
        DROP TRIGGER message_search_insert;
        DROP TRIGGER message_search_delete;
        DROP TRIGGER message_search_update;
        INSERT INTO ck_meta (key, value) VALUES ('search_indexed', (SELECT coalesce(max(rowid), 0) FROM messages))
            ON CONFLICT (key) DO UPDATE SET value = excluded.value;
        CREATE TRIGGER message_search_insert AFTER INSERT ON messages WHEN new.is_deleted = 0 AND new.rowid <= \(mark) BEGIN
            INSERT INTO message_search (rowid, content) VALUES (new.rowid, new.content);
        END;
        CREATE TRIGGER message_search_delete AFTER DELETE ON messages WHEN old.is_deleted = 0 AND old.rowid <= \(mark) BEGIN
            INSERT INTO message_search (message_search, rowid, content) VALUES ('delete', old.rowid, old.content);
        END;
        CREATE TRIGGER message_search_update AFTER UPDATE OF content, is_deleted ON messages WHEN old.rowid <= \(mark) BEGIN
            INSERT INTO message_search (message_search, rowid, content) SELECT 'delete', old.rowid, old.content WHERE old.is_deleted = 0;
            INSERT INTO message_search (rowid, content) SELECT new.rowid, new.content WHERE new.is_deleted = 0;
        END;
        """

    /// Indexes every waiting message when `batch` or more wait, in the caller's write
    /// transaction, with one statement (the mark moves in the same transaction).
    static func catchUp(in db: Database) throws {
        let (indexed, newest) = try db.first("SELECT coalesce(\(mark), 0), coalesce((SELECT max(rowid) FROM messages), 0)") { ($0.int(0), $0.int(1)) } ?? (0, 0)
        guard newest - indexed >= batch else { return }
        try db.execute("INSERT INTO message_search (rowid, content) SELECT rowid, content FROM messages WHERE rowid > ? AND is_deleted = 0 ORDER BY rowid", [indexed])
        try db.execute("INSERT INTO ck_meta (key, value) VALUES ('search_indexed', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", [newest])
    }

    /// The best `limit` messages matching `match` (FTS5 syntax), optionally in one zone and from
    /// one speaker: rowid and snippet, best first (bm25, then newest). The messages still
    /// waiting are matched in a temporary index of the reading connection (the same words),
    /// so a search is a read, finds a message the moment it is stored, and works on a store
    /// opened read-only.
    static func search(_ match: String, zone: String?, speaker: String?, limit: Int, in db: Database) throws -> [(rowid: Int64, snippet: String)] {
        let waiting = try db.first("SELECT coalesce((SELECT max(rowid) FROM messages), 0) > coalesce(\(mark), 0)") { $0.int(0) != 0 } ?? false
        if waiting {
            try db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.waiting_search USING fts5(content, tokenize = 'unicode61 remove_diacritics 2')")
            try db.execute("DELETE FROM temp.waiting_search")
            try db.execute("INSERT INTO temp.waiting_search (rowid, content) SELECT rowid, content FROM messages WHERE rowid > coalesce(\(mark), 0) AND is_deleted = 0")
        }
        func arm(_ table: String) -> String {
            """
            SELECT \(table).rowid AS found, snippet(\(table), 0, '[', ']', '…', 12) AS snippet, bm25(\(table)) AS rank, m.spoken_at AS spoken_at FROM \(table)
                JOIN messages m ON m.rowid = \(table).rowid
            WHERE \(table) MATCH ? AND m.is_deleted = 0 AND (? IS NULL OR m.zone = ?) AND (? IS NULL OR m.speaker = ?)
            """
        }
        let filters: [any DatabaseValueConvertible] = [match, zone, zone, speaker, speaker], limit = max(1, min(limit, 1000))
        // Nothing waiting (the usual case once a store is quiet): the index alone.
        let query = waiting ? "\(arm("message_search")) UNION ALL \(arm("waiting_search"))" : arm("message_search")
        return try db.rows("\(query) ORDER BY rank, spoken_at DESC LIMIT ?", (waiting ? filters + filters : filters) + [limit]) { (rowid: $0.int(0), snippet: $0.text(1)) }
    }
}
