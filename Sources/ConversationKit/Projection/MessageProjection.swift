import Foundation
import RecordZone
import SQLiteKit

/// `Message` records: the timeline row, its mentions, earlier versions and file.
extension RecordApplier {
    /// - Parameter gated: whether a group's message is first decided by membership (false: it
    ///   was, and is shown as it is).
    mutating func projectMessage(_ record: Record, origin: Origin, gated: Bool = true) throws {
        let zone = record.id.zone.rawValue, name = record.id.name
        // Someone the local speaker blocks: not shown, anywhere (shown again on unblocking).
        if let speaker = record.string("speaker"), speaker != localSpeaker, try blocked().contains(speaker) {
            try removeMessageRow(zone: zone, name: name)
            return
        }
        if gated, ChatRecords.isGroupZone(record.id.zone) {
            // A group's message shows only if its speaker was a member at its clock; with the
            // group's changes moving in this transaction, that is decided in finish().
            if groups.changed.contains(zone) { return }
            guard try isGroupMember(record.string("speaker") ?? "", zone: zone, at: record.clock) else {
                try holdBack(record, origin: origin, speakerWasMember: false)
                return
            }
            guard try localMayRead(zone: zone, at: record.clock) else {
                try holdBack(record, origin: origin, speakerWasMember: true)
                return
            }
        }
        let state = origin == .local ? SyncStateColumn.pending : .synced
        let exists = try db.first("SELECT 1 FROM messages WHERE zone = ? AND name = ?", [zone, name]) { _ in true } ?? false
        if record.isDeleted {
            try projectDeletion(record, exists: exists, state: state)
            return
        }
        let isGroup = ChatRecords.isGroupZone(record.id.zone)
        // Sealed content is opened here: the key held, it shows; not yet, it waits for its key.
        var opened = record, waiting: Data?
        if let sealed = record[Sealing.sealedField]?.bytesValue, let here = keys.sealedHere[record.id], here.sealed == sealed {
            opened = here.plain  // sealed in this transaction: the plaintext is at hand
        } else if record[Sealing.sealedField] != nil {
            switch try unseal(record) {
            case .opened(let plain): opened = plain
            case .waiting(let epoch): waiting = epoch
            case .refused(let why):
                try quarantine(RejectedRecord(recordID: record.id, reason: .schemaViolation(why), source: origin == .local ? "local" : "pull", data: try? record.encoded()))
                try removeMessageRow(zone: zone, name: name)
                return
            }
        }
        guard let speaker = record.string("speaker"), let listener = isGroup ? "" : record.string("listener"),
            let content = waiting == nil ? opened.string("content") : "", let spokenAt = record.milliseconds("spokenAt")
        else { return }
        // The message it answers: another message's name (anything else is not a reply).
        let replyTo = opened.string("replyTo").flatMap { $0.hasPrefix(ChatRecords.messagePrefix) && $0 != name ? $0 : nil }
        let custom = ChatRecords.custom(of: opened)
        let file = waiting == nil ? AttachmentManifest(record: opened) : nil
        // The mentions a reader can place in the text, one per start (the first), in the order
        // written: kept in the message's row for every read of it, and one row each in
        // `message_mentions` for "mentions of me".
        var starts = Set<Int>()
        let mentions = (opened["mentions"]?.listValue ?? []).compactMap { $0.stringValue.flatMap { Mention(field: $0, content: content) } }
            .filter { starts.insert($0.utf8Range.lowerBound).inserted }
        try db.execute("""
            INSERT INTO messages (zone, name, speaker, listener, content, spoken_at, edited_at, read_at, is_deleted, sync_state, waiting_epoch, reply_to,
                custom_type, custom_data, file_name, file_type, file_size, mentions, is_own)
            VALUES (?, ?, ?, ?, ?, ?, ?, (SELECT read_at FROM receipts WHERE zone = ? AND message = ? AND reader = ?), 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (zone, name) DO UPDATE SET content = excluded.content, edited_at = excluded.edited_at,
                spoken_at = excluded.spoken_at, is_deleted = 0, sync_state = excluded.sync_state, sync_error = NULL, sync_error_code = NULL,
                waiting_epoch = excluded.waiting_epoch, reply_to = excluded.reply_to, custom_type = excluded.custom_type, custom_data = excluded.custom_data,
                file_name = excluded.file_name, file_type = excluded.file_type, file_size = excluded.file_size, mentions = excluded.mentions
            """, [zone, name, speaker, listener, content, spokenAt, record.milliseconds("editedAt"), zone, name, isGroup ? localSpeaker ?? "" : listener,
                  state.rawValue, waiting, replyTo, custom?.type, custom?.data, file?.name, file?.mediaType, file?.size,
                  mentions.isEmpty ? nil : mentions.map(\.field).joined(separator: " "), speaker == localSpeaker])
        if file != nil || exists { try projectFile(file, zone: zone, name: name, ownUpload: origin == .local && speaker == localSpeaker) }
        // A new row has no versions or mentions yet (every removal of a row takes its own).
        if exists {
            try db.execute("DELETE FROM message_versions WHERE zone = ? AND name = ?", [zone, name])
            try db.execute("DELETE FROM message_mentions WHERE zone = ? AND name = ?", [zone, name])
        }
        for (version, earlier) in (ChatRecords.history(of: opened) ?? []).enumerated() {
            try db.execute("INSERT INTO message_versions (zone, name, version, content, at) VALUES (?, ?, ?, ?, ?)",
                           [zone, name, version, earlier.content, Int64((earlier.at.timeIntervalSince1970 * 1000).rounded())])
        }
        for mention in mentions {
            try db.execute("INSERT OR IGNORE INTO message_mentions (zone, name, start, length, speaker) VALUES (?, ?, ?, ?, ?)",
                           [zone, name, mention.utf8Range.lowerBound, mention.utf8Range.count, mention.speaker])
        }
        if !isGroup { try ensureConversation(zone: zone, other: speaker == localSpeaker ? listener : speaker) }
        note(exists ? .messageChanged(MessageID(conversation: zone, name: name)) : .messageAdded(MessageID(conversation: zone, name: name)))
    }

    /// A message's tombstone: a placeholder in its place, with nothing of what it said (text,
    /// history, mentions, payload, what it answered), at its name's clock — so a reader that held
    /// the message and one that only ever saw the tombstone show the same placeholder at the same
    /// place. One the local speaker may not read at that clock (a group's, before they joined)
    /// is not shown.
    mutating func projectDeletion(_ record: Record, exists: Bool, state: SyncStateColumn) throws {
        let zone = record.id.zone.rawValue, name = record.id.name
        let clock = ChatRecords.messageClock(ofName: name) ?? record.clock
        let spokenAt = Int64(clock.milliseconds)
        let isGroup = ChatRecords.isGroupZone(record.id.zone)
        let mayRead = try exists || !isGroup || localMayRead(zone: zone, at: clock)
        guard let speaker = record.string("speaker"), mayRead else { return }
        // A pair's listener: the one of the two who is not its speaker.
        let other = try db.first("SELECT other FROM conversations WHERE zone = ?", [zone]) { $0.text(0) }
        guard let listener = isGroup ? "" : speaker == localSpeaker ? other : localSpeaker else { return }
        try db.execute("""
            INSERT INTO messages (zone, name, speaker, listener, content, spoken_at, is_deleted, sync_state, is_own) VALUES (?, ?, ?, ?, '', ?, 1, ?, ?)
            ON CONFLICT (zone, name) DO UPDATE SET is_deleted = 1, content = '', spoken_at = excluded.spoken_at, edited_at = NULL, reply_to = NULL,
                custom_type = NULL, custom_data = NULL, mentions = NULL, file_name = NULL, file_type = NULL, file_size = NULL, waiting_epoch = NULL, sync_state = excluded.sync_state, sync_error = NULL, sync_error_code = NULL
            """, [zone, name, speaker, listener, spokenAt, state.rawValue, speaker == localSpeaker])
        try db.execute("DELETE FROM message_mentions WHERE zone = ? AND name = ?", [zone, name])
        try db.execute("DELETE FROM message_versions WHERE zone = ? AND name = ?", [zone, name])
        try projectFile(nil, zone: zone, name: name, ownUpload: false)
        note(exists ? .messageChanged(MessageID(conversation: zone, name: name)) : .messageAdded(MessageID(conversation: zone, name: name)))
    }

    /// A message's file as its version names it: the manifest kept (what this device holds of it
    /// kept too while it is the same file), or — none, or another file — the one held before
    /// discarded (its cache directory goes after the transaction, ``ConversationStore/removeDiscardedFiles()``).
    /// - Parameter ownUpload: the local speaker's own new file, whose chunks this device uploads.
    mutating func projectFile(_ file: AttachmentManifest?, zone: String, name: String, ownUpload: Bool) throws {
        guard let file else {
            try db.execute("UPDATE attachments SET discarded = 1, held = NULL, uploaded = NULL WHERE zone = ? AND name = ?", [zone, name])
            return
        }
        let chunks = AttachmentManifest.hashes(of: file.chunks)
        try db.execute("""
            INSERT INTO attachments (zone, name, file_key, chunks, thumbnail, image_width, image_height, uploaded) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (zone, name) DO UPDATE SET thumbnail = excluded.thumbnail, image_width = excluded.image_width, image_height = excluded.image_height,
                held = CASE WHEN file_key = excluded.file_key AND chunks = excluded.chunks THEN held END,
                uploaded = CASE WHEN file_key = excluded.file_key AND chunks = excluded.chunks THEN uploaded END,
                problem = CASE WHEN file_key = excluded.file_key AND chunks = excluded.chunks THEN problem END,
                discarded = CASE WHEN file_key = excluded.file_key AND chunks = excluded.chunks THEN discarded ELSE 1 END,
                file_key = excluded.file_key, chunks = excluded.chunks
            """, [zone, name, file.key, chunks, file.thumbnail, file.pixelWidth.map(Int64.init), file.pixelHeight.map(Int64.init), ownUpload ? Int64(0) : nil])
    }

    /// Takes a message out of the view, with its mentions and versions.
    mutating func removeMessageRow(zone: String, name: String) throws {
        try db.execute("DELETE FROM messages WHERE zone = ? AND name = ?", [zone, name])
        let removed = db.changes > 0
        try db.execute("DELETE FROM message_mentions WHERE zone = ? AND name = ?", [zone, name])
        try db.execute("DELETE FROM message_versions WHERE zone = ? AND name = ?", [zone, name])
        try projectFile(nil, zone: zone, name: name, ownUpload: false)
        if removed { note(.messageChanged(MessageID(conversation: zone, name: name))) }
    }

    /// The messages held that the local speaker said, marked its own (`is_own`, which the
    /// unread index leaves out): once its identifier is set, for what the store held before.
    mutating func markOwnMessages() throws {
        guard let localSpeaker else { return }
        try db.execute("UPDATE messages SET is_own = 1 WHERE speaker = ? AND is_own = 0", [localSpeaker])
    }

    /// Marks a local message failed for good, with why.
    mutating func fail(_ message: MessageID, _ failure: SyncFailure) throws {
        try db.execute("UPDATE messages SET sync_state = ?, sync_error = ?, sync_error_code = ? WHERE zone = ? AND name = ?",
                       [SyncStateColumn.failed.rawValue, failure.message, failure.storedCode, message.conversation, message.name])
        note(.syncStateChanged(message))
    }

    /// Shows a message as read at `readAt`: in a pair, when `listener` is its listener; in a
    /// group (nil), by the local speaker.
    mutating func markRead(_ message: MessageID, at readAt: Int64, byListener listener: String?) throws {
        if let listener {
            try db.execute("UPDATE messages SET read_at = ? WHERE zone = ? AND name = ? AND listener = ?", [readAt, message.conversation, message.name, listener])
        } else {
            try db.execute("UPDATE messages SET read_at = ? WHERE zone = ? AND name = ?", [readAt, message.conversation, message.name])
        }
        if db.changes > 0 { note(.messageChanged(message)) }
    }
}
