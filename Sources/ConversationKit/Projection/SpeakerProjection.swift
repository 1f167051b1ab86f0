import Foundation
import RecordZone
import SQLiteKit

/// `Speaker` records (docs/PROTOCOL.md §3): the profile, newest of its two copies, and who is
/// known.
extension RecordApplier {
    /// Projects a profile (from the speaker's zone or its directory copy): the newest wins.
    mutating func projectSpeaker(_ record: Record) throws {
        let identifier = record.id.name
        let name = record.isDeleted ? "" : record.string("name") ?? ""
        // The newer of the profile's two copies (its zone, the directory) by the merge rule's
        // order: clock, then author key — the same on every reader, whatever came first.
        let newer = try db.first("SELECT clock, public_key FROM speakers WHERE identifier = ?", [identifier]) { row in
            let clock = UInt64(bitPattern: row.int(0)), author = row.optionalBlob(1) ?? Data()
            return clock < record.clock.rawValue || (clock == record.clock.rawValue && !record.authorKey.lexicographicallyPrecedes(author))
        } ?? true
        guard newer else { return }
        let avatar = AvatarReference(record)
        // A new avatar clears the reason the old one could not be had.
        try db.execute("""
            INSERT INTO speakers (identifier, name, public_key, is_known, clock, avatar_hash, avatar_size, avatar_width, avatar_height)
                VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?)
            ON CONFLICT (identifier) DO UPDATE SET name = excluded.name, public_key = excluded.public_key, clock = excluded.clock,
                avatar_error = CASE WHEN avatar_hash IS excluded.avatar_hash THEN avatar_error END,
                avatar_hash = excluded.avatar_hash, avatar_size = excluded.avatar_size,
                avatar_width = excluded.avatar_width, avatar_height = excluded.avatar_height
            """, [identifier, name, record.authorKey, record.clock.rawValue, avatar?.asset.hash, avatar.map { Int64($0.asset.size) },
                  avatar.map { $0.size.width }, avatar.map { $0.size.height }])
        try db.execute("DELETE FROM speaker_tags WHERE identifier = ?", [identifier])
        if !record.isDeleted {
            for tag in Set(record["tags"]?.listValue?.compactMap(\.stringValue) ?? []) {
                try db.execute("INSERT INTO speaker_tags (tag, identifier) VALUES (?, ?)", [tag, identifier])
            }
        }
        note(.speakerUpdated(identifier))
    }

    /// Marks a speaker known (a conversation with them exists), creating its row if need be;
    /// a speaker known already is left as it is (every message runs this).
    func markKnown(_ identifier: String) throws {
        try db.execute("""
            INSERT INTO speakers (identifier, name, is_known) VALUES (?, '', 1)
            ON CONFLICT (identifier) DO UPDATE SET is_known = 1 WHERE is_known = 0
            """, [identifier])
    }
}
