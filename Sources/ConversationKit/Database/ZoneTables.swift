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

    /// Deletes every row of `zone` from the tables of ``removed``.
    static func remove(_ zone: String, in db: Database) throws {
        for table in removed where table != "ck_outbox" {
            try db.execute("DELETE FROM \(table) WHERE zone = ?", [zone])
        }
        try Outbox.remove(zone: zone, in: db)
    }
}
