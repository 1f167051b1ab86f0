import Foundation
import RecordZone
import SQLiteKit

/// `ConversationMember` records: a pair conversation and its participants.
extension RecordApplier {
    mutating func projectMember(_ record: Record) throws {
        guard !record.isDeleted, let speaker = record.string("speaker") else { return }
        let zone = record.id.zone.rawValue
        let participants = record["participants"]?.listValue?.compactMap(\.stringValue) ?? []
        try db.execute("""
            INSERT INTO conversation_members (zone, speaker, clock) VALUES (?, ?, ?)
            ON CONFLICT (zone, speaker) DO UPDATE SET clock = min(clock, excluded.clock)
            """, [zone, speaker, record.clock.rawValue])
        if let other = participants.first(where: { $0 != localSpeaker }) {
            try ensureConversation(zone: zone, other: other)
        }
        let members = try db.rows("SELECT speaker FROM conversation_members WHERE zone = ? ORDER BY clock, speaker", [zone]) { $0.text(0) }
        try db.execute("UPDATE conversations SET started_by = ?, joined_by = ? WHERE zone = ?",
                       [members.first, members.count > 1 ? members[1] : nil, zone])
        note(.conversationChanged(zone))
    }

    mutating func ensureConversation(zone: String, other: String) throws {
        guard ensured.insert(zone).inserted else { return }
        try follow(other)
        try db.execute("INSERT INTO conversations (zone, other) VALUES (?, ?) ON CONFLICT (zone) DO NOTHING", [zone, other])
        if db.changes > 0 { note(.conversationChanged(zone)) }
        try markKnown(other)
    }

    /// A group the local speaker is in, with its name as last decided.
    func ensureGroupConversation(zone: String, name: String?) throws {
        try db.execute("INSERT INTO conversations (zone, other, group_name) VALUES (?, '', ?) ON CONFLICT (zone) DO UPDATE SET group_name = excluded.group_name",
                       [zone, name])
    }
}
