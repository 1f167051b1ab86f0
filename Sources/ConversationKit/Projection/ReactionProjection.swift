import Foundation
import RecordZone
import SQLiteKit

/// `Reaction` records: one row per reactor per message.
extension RecordApplier {
    /// Projects a reaction: one row per reactor per message (its emoji opened, or waiting for
    /// its epoch's key); a tombstone takes it back. A sealed one that does not open is
    /// quarantined, as a message is.
    mutating func projectReaction(_ record: Record, origin: Origin) throws {
        guard let reactor = record.string("reactor"), let message = ChatRecords.reactionMessage(ofName: record.id.name) else { return }
        let zone = record.id.zone.rawValue
        defer { note(.messageChanged(MessageID(conversation: zone, name: message))) }
        if record.isDeleted {
            try db.execute("DELETE FROM reactions WHERE zone = ? AND message = ? AND reactor = ?", [zone, message, reactor])
            return
        }
        var emoji = record.string("emoji") ?? "", waiting: Data?
        if record[Sealing.sealedField] != nil {
            switch try unseal(record) {
            case .opened(let plain): emoji = plain.string("emoji") ?? ""
            case .waiting(let epoch): (emoji, waiting) = ("", epoch)
            case .refused(let why):
                try quarantine(RejectedRecord(recordID: record.id, reason: .schemaViolation(why), source: origin == .local ? "local" : "pull", data: try? record.encoded()))
                try db.execute("DELETE FROM reactions WHERE zone = ? AND message = ? AND reactor = ?", [zone, message, reactor])
                return
            }
        }
        guard let reactedAt = record.milliseconds("reactedAt"), waiting != nil || !emoji.isEmpty else { return }
        try db.execute("""
            INSERT INTO reactions (zone, message, reactor, emoji, reacted_at, waiting_epoch, clock) VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (zone, message, reactor) DO UPDATE SET emoji = excluded.emoji, reacted_at = excluded.reacted_at,
                waiting_epoch = excluded.waiting_epoch, clock = excluded.clock
            """, [zone, message, reactor, emoji, reactedAt, waiting, Int64(bitPattern: record.clock.rawValue)])
    }
}
