import Foundation
import RecordZone
import SQLiteKit

/// `Block` records: whom the local speaker blocks, and the messages that hides or shows again.
extension RecordApplier {
    /// Whom the local speaker blocks (read once per transaction).
    mutating func blocked() throws -> Set<String> {
        if let blockedSpeakers { return blockedSpeakers }
        let found = Set(try db.rows("SELECT identity FROM blocked_speakers") { $0.text(0) })
        blockedSpeakers = found
        return found
    }

    /// A `Block` record: the local speaker's own (from this device or another of theirs) blocks
    /// or — a tombstone — unblocks the conversation's other participant, whose messages are then
    /// taken out of the view or put back from the records held. Another's block of the local
    /// speaker changes nothing shown: the push stops sending there (``SyncFailure/Code/blocked``).
    mutating func projectBlock(_ record: Record) throws {
        let zone = record.id.zone.rawValue
        guard let local = localSpeaker, record.string("blocker") == local else { return }
        let other: String
        if record.isDeleted {
            guard let held = try db.first("SELECT identity FROM blocked_speakers WHERE zone = ?", [zone], { $0.text(0) }) else { return }
            other = held
            try db.execute("DELETE FROM blocked_speakers WHERE identity = ?", [other])
        } else {
            guard let blocked = record.string("blocked") else { return }
            other = blocked
            try db.execute("INSERT INTO blocked_speakers (identity, zone, blocked_at) VALUES (?, ?, ?) ON CONFLICT (identity) DO UPDATE SET blocked_at = excluded.blocked_at",
                           [other, zone, Int64(record.clock.milliseconds)])
            guard db.changes > 0 else { return }
        }
        blockedSpeakers = nil
        try reproject(messagesOf: other)
        note(.speakerUpdated(other))
    }

    /// Shows again, or takes out of the view, every message `speaker` said in the conversations
    /// held, from their records (as a sync would have applied them).
    mutating func reproject(messagesOf speaker: String) throws {
        let prefix = ChatRecords.messagePrefix + ChatRecords.identityHash(speaker) + "."
        let zones = try db.rows("SELECT zone FROM conversations") { $0.text(0) }
        for zone in zones {
            let records = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND name > ? AND name < ? AND type = ?",
                                      [zone, prefix, prefix.dropLast() + "/", ChatRecords.messageType]) { try? Record(canonical: $0.blob(0)) }
            for case let record? in records where record.string("speaker") == speaker {
                try projectMessage(record, origin: .remote)
            }
            if !records.isEmpty { note(.conversationChanged(zone)) }
        }
    }
}
