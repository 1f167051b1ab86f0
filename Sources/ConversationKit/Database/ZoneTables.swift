import SQLiteKit

/// Every table of the store that holds rows of one zone (a `zone` column), in one list:
/// what removing a conversation deletes, and what it keeps and why. A table added to the
/// schema with a `zone` column and not named here fails `ZoneTablesTests`, which walks the
/// schema.
enum ZoneTables {
    /// Deleted, every row of the zone, when the conversation is removed from the store.
    static let removed = [
        // Records, tokens, refusals and the outbox (``Outbox`` owns it).
        "ck_records", "ck_zone_state", "ck_quarantine", "ck_outbox",
        // What the records project.
        "conversations", "conversation_members", "messages", "message_mentions", "message_versions", "held_messages",
        "deliveries", "receipts", "reactions", "attachments",
        "group_members", "group_runs", "group_state",
        // The conversation's keys: the senders' keys read, this device's epochs and whom they
        // were shared with.
        "sender_keys", "own_epochs", "epoch_recipients",
        // This device's own settings (archive, pin, mute, draft).
        "conversation_settings",
    ]

    /// Kept when the conversation is removed, with why.
    static let kept = [
        // A block is of a speaker, not of a conversation: removing the chat with someone blocked
        // does not unblock them (their messages stay out of every group). The row names the
        // zone its `Block` record lives in.
        "blocked_speakers": "a block outlives the conversation it was recorded in",
    ]

    /// What a cache reset does with a table's rows of a zone (``reset``).
    enum ResetRule: Sendable {
        /// Deleted but for the rows `keeping` names (an SQL condition over the table; a `?` in
        /// it is the local speaker); nil: every row.
        case deleted(keeping: String?)
        /// Kept, with why.
        case kept(String)
        /// Worked out by ``CacheReset`` itself, with how.
        case own(String)
    }

    /// What a cache reset (`clearAllCachedData()`, `refetch(zone:)`, a zone its backend made
    /// anew) does with each table above, in the order it runs: what the backend gives again
    /// goes and is fetched again; what it cannot give stays. `ZoneTablesTests` checks that it
    /// names every table of ``removed`` and ``kept``.
    static let reset: [(table: String, rule: ResetRule)] = [
        ("ck_records", .own("deleted but for the unsent versions (the outbox references them) and the local speaker's profile and key records")),
        ("ck_outbox", .kept("unsent changes: the backend does not hold them")),
        ("ck_zone_state", .own("the token forgotten, so the next pull reads the zone from its start")),
        ("ck_quarantine", .own("kept for one zone's refetch (its pull meets the same records again); emptied by a whole reset")),
        ("held_messages", .own("counted again from the records kept")),
        ("messages", .deleted(keeping: "sync_state != \(SyncStateColumn.synced.rawValue)")),
        ("message_mentions", .deleted(keeping: "EXISTS (SELECT 1 FROM messages m WHERE m.zone = message_mentions.zone AND m.name = message_mentions.name)")),
        ("message_versions", .deleted(keeping: "EXISTS (SELECT 1 FROM messages m WHERE m.zone = message_versions.zone AND m.name = message_versions.name)")),
        ("deliveries", .deleted(keeping: nil)),
        ("receipts", .deleted(keeping: nil)),
        // The local speaker's own reactions may be unsent; the others' come back with their records.
        ("reactions", .deleted(keeping: "reactor = ?")),
        ("conversation_members", .deleted(keeping: "speaker = ?")),
        ("conversations", .deleted(keeping: "zone IN (SELECT zone FROM messages) OR zone IN (SELECT zone FROM conversation_members)")),
        // The group's next change decides it again whole, from the changes then held.
        ("group_state", .deleted(keeping: nil)),
        ("group_members", .kept("who is in the group until its changes are read again: what is kept stays shown to whom it was")),
        ("group_runs", .kept("the same, for the runs of membership that decide what each member reads")),
        ("attachments", .kept("the files held in the cache and their keys: the messages fetched again find them")),
        ("sender_keys", .kept("the keys that open the messages fetched again")),
        ("own_epochs", .kept("this device's own epochs: nowhere else")),
        ("epoch_recipients", .kept("whom this device's epochs were shared with: not shared again")),
        ("conversation_settings", .kept("this device's own settings")),
        ("blocked_speakers", .kept("the local speaker's own choice, stated again by nobody")),
    ]

    /// Deletes every row of `zone` from the tables of ``removed``.
    static func remove(_ zone: String, in db: Database) throws {
        for table in removed where table != "ck_outbox" {
            try db.execute("DELETE FROM \(table) WHERE zone = ?", [zone])
        }
        try Outbox.remove(zone: zone, in: db)
    }
}
