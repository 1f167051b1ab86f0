import Foundation
import SQLiteKit
import RecordZone

/// Blocking a speaker (Signal's and WhatsApp's block): their messages and reactions are not
/// shown here, in their pair conversation or any group, and a zone server takes nothing more
/// of theirs into the pair conversation. The block is a signed `Block` record in that
/// conversation's zone (docs/PROTOCOL.md §3), so the local speaker's other devices block them
/// too and the server can enforce it; the blocked speaker can read it (their store then stops
/// sending there: ``SyncFailure/Code/blocked``). Unblocking puts their messages back.
extension ConversationStore {
    /// Blocks a speaker. Committed with its outbox entry; what they said is hidden at once.
    /// - Throws: ``ConversationError/Code/invalidIdentifier`` for a malformed identifier or the
    ///   local speaker.
    public func block(_ speaker: String) async throws(ConversationError) {
        try await setBlocked(speaker, true)
    }

    /// Unblocks a speaker (a tombstone of the block): their messages are shown again. Nothing
    /// is done for one not blocked.
    public func unblock(_ speaker: String) async throws(ConversationError) {
        try await setBlocked(speaker, false)
    }

    /// The speakers the local speaker blocks, sorted.
    public func blockedSpeakers() throws(ConversationError) -> [String] {
        try read(Self.blockedQuery)
    }

    /// ``blockedSpeakers()``, read without blocking the caller's thread.
    func loadBlockedSpeakers() async throws(ConversationError) -> [String] {
        try await read(Self.blockedQuery)
    }

    private static let blockedQuery: @Sendable (Database) throws -> [String] = { db in
        try db.rows("SELECT identity FROM blocked_speakers ORDER BY identity") { $0.text(0) }
    }

    private func setBlocked(_ speaker: String, _ blocking: Bool) async throws(ConversationError) {
        let local = try requireIdentity()
        try ChatRecords.validate(identifier: speaker)
        guard speaker != local.identifier else { throw ConversationError(.invalidIdentifier, "\(speaker) cannot block themselves") }
        var record = Record(id: try ChatRecords.blockID(blocker: local.identifier, blocked: speaker), type: ChatRecords.blockType,
                            fields: ["blocker": .string(local.identifier)])
        if blocking { record["blocked"] = .string(speaker) } else { record.isDeleted = true }
        let block = record
        try await write { applier in
            let held = try applier.db.first("SELECT is_deleted FROM ck_records WHERE zone = ? AND name = ?", [block.id.zone.rawValue, block.id.name]) { $0.int(0) == 0 }
            guard held != blocking, blocking || held != nil else { return }
            try self.commitLocal(block, as: local, in: &applier)
        }
    }
}
