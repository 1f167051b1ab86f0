import Foundation
import RecordZone

/// Reactions (docs/PROTOCOL.md §3): one `Reaction` record per reactor per message, its emoji
/// sealed as a message's content is, so two people reacting offline never write the same
/// record, and reacting again replaces one's own (the newest wins, as for any record).
extension ConversationStore {
    /// Reacts to a message with an emoji (any short text: one emoji or a sequence), replacing
    /// the local speaker's earlier reaction to it. Committed with its outbox entry.
    /// - Throws: ``ConversationError/Code/emptyContent`` or ``ConversationError/Code/contentTooLarge``
    ///   (over ``MessageReaction/maximumEmojiBytes``), ``ConversationError/Code/unknownMessage``,
    ///   ``ConversationError/Code/notAllowedInGroup`` for a group the local speaker is not in.
    public func react(to id: MessageID, with emoji: String) async throws(ConversationError) {
        let local = try requireIdentity()
        guard !emoji.isEmpty, !emoji.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
            throw ConversationError(.emptyContent, "a reaction is an emoji or a short text, without control characters")
        }
        guard emoji.utf8.count <= MessageReaction.maximumEmojiBytes else {
            throw ConversationError(.contentTooLarge, "a reaction is at most \(MessageReaction.maximumEmojiBytes) bytes; this one is \(emoji.utf8.count)")
        }
        let clock = clock.now()
        let reactedAt = Self.milliseconds(configuration.now())
        try await write { applier in
            try self.requireReactable(id, local: local.identifier, at: clock, in: &applier)
            let record = try ChatRecords.reaction(zone: try ZoneName(id.conversation), message: id.name, reactor: local.identifier,
                                                  emoji: emoji, reactedAt: reactedAt)
            try self.commitLocal(try applier.seal(record, at: clock), as: local, in: &applier)
        }
    }

    /// Takes back the local speaker's reaction to a message (a signed tombstone); none held,
    /// nothing is done.
    public func removeReaction(from id: MessageID) async throws(ConversationError) {
        let local = try requireIdentity()
        let clock = clock.now()
        try await write { applier in
            try self.requireReactable(id, local: local.identifier, at: clock, in: &applier)
            let name = ChatRecords.reactionName(for: id.name, reactor: local.identifier)
            let held = try applier.db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ? AND is_deleted = 0", [id.conversation, name]) { $0.blob(0) }
            guard let held, let current = try? Record(canonical: held) else { return }
            try self.applyLocal(try self.policy.tombstone(for: current, signedWith: local.key, clock: clock), in: &applier)
        }
    }

    /// A message's reactions, oldest first: one per reactor but those the local speaker blocks (in a group, only from those who
    /// were members at the reaction's clock, as for a message — decided from the group as it
    /// stands, so whatever order its changes came in). One whose key has not arrived yet has an empty emoji and
    /// ``MessageReaction/isWaitingForKey`` (it resolves by itself, as a message does).
    public func reactions(to id: MessageID) throws(ConversationError) -> [MessageReaction] {
        try read { db in
            _ = try Self.message(db, id)
            return try db.rows("""
                SELECT x.reactor, x.emoji, x.reacted_at, x.waiting_epoch IS NOT NULL FROM reactions x WHERE x.zone = ? AND x.message = ?
                    AND x.reactor NOT IN (SELECT identity FROM blocked_speakers)
                    AND (x.zone NOT LIKE 'g-%' OR EXISTS (SELECT 1 FROM group_runs g WHERE g.zone = x.zone AND g.speaker = x.reactor
                        AND g.from_clock < x.clock AND (g.until_clock IS NULL OR x.clock < g.until_clock)))
                ORDER BY x.reacted_at, x.reactor
                """, [id.conversation, id.name]) {
                MessageReaction(reactor: $0.text(0), emoji: $0.text(1), reactedAt: Self.date($0.int(2)), isWaitingForKey: $0.int(3) != 0)
            }
        }
    }

    /// The message exists here, and the local speaker may react to it: a participant of its
    /// pair, a member of its group at `clock`.
    private func requireReactable(_ id: MessageID, local: String, at clock: RecordClock, in applier: inout RecordApplier) throws {
        _ = try Self.message(applier.db, id)
        if id.conversation.hasPrefix(GroupMembership.zonePrefix), try !applier.isGroupMember(local, zone: id.conversation, at: clock) {
            throw ConversationError(.notAllowedInGroup, "\(local) is not in the group \(id.conversation)")
        }
    }
}
