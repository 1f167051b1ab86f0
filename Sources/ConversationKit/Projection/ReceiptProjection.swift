import Foundation
import RecordZone
import SQLiteKit

/// `Receipt` records: who read what.
extension RecordApplier {
    mutating func projectReceipt(_ record: Record) throws {
        guard !record.isDeleted, let reader = record.string("reader"), let message = record.string("message"),
            let readAt = record.milliseconds("readAt")
        else { return }
        let zone = record.id.zone.rawValue
        try db.execute("""
            INSERT INTO receipts (zone, message, reader, read_at) VALUES (?, ?, ?, ?)
            ON CONFLICT (zone, message, reader) DO UPDATE SET read_at = excluded.read_at
            """, [zone, message, reader, readAt])
        // A message shows as read by the listener's receipt in a pair, by the local speaker's own
        // in a group (the others' are counted from the receipts table).
        if !ChatRecords.isGroupZone(record.id.zone) {
            try markRead(MessageID(conversation: zone, name: message), at: readAt, byListener: reader)
        } else if reader == localSpeaker {
            try markRead(MessageID(conversation: zone, name: message), at: readAt, byListener: nil)
        }
    }
}
