import Foundation
import RecordZone
import SQLiteKit

/// Groups: a conversation of any number of speakers, whose membership is a set of signed
/// `GroupChange` records that every reader decides alike (docs/PROTOCOL.md §3.1).
///
/// ```swift
/// let trip = try await store.createGroup(name: "Trip", members: ["bob", "carol"])
/// try await store.send("Who brings the tent?", toGroup: trip.id)
/// try await store.setRole(.admin, of: "bob", in: trip.id)
/// try await store.sync()
/// ```
/// Each change is checked against the rule as this store holds the group, committed with its
/// outbox entry, and returned at once, offline or not; the group as others decide it follows
/// from the changes they hold.
extension ConversationStore {
    /// Creates a group named `name`, with the local speaker as its creator and `members` in it.
    /// - Parameter history: what members added later read of what was said before they were
    ///   added: nothing (``GroupMembership/History/sinceAdded``, the default, as Signal and
    ///   WhatsApp groups) or everything (``GroupMembership/History/all``, as a Matrix room's
    ///   shared history). Set once, for the group's life.
    /// - Throws: ``ConversationError/Code/invalidIdentifier`` for a member's identifier, or an
    ///   empty or over-long name (256 bytes).
    @discardableResult
    public func createGroup(name: String, members: [String], history: GroupMembership.History = .sinceAdded) async throws(ConversationError) -> Conversation {
        let local = try requireIdentity()
        for member in members { try ChatRecords.validate(identifier: member) }
        guard let zone = GroupMembership.zone(creator: local.identifier, random: Sodium.randomBytes(8).hexString) else {
            throw ConversationError(.database, "cannot name a group zone")
        }
        try await change(.create, targets: Array(Set(members).subtracting([local.identifier])).sorted(), groupName: name,
                         history: history == .sinceAdded ? nil : history, in: zone.rawValue)
        return try read { db in try Self.group(db, zone.rawValue, local: local.identifier) }
    }

    /// Adds speakers to a group (an admin's change).
    public func addMembers(_ members: [String], to group: String) async throws(ConversationError) {
        for member in members { try ChatRecords.validate(identifier: member) }
        try await change(.add, targets: members, in: group)
    }

    /// Removes a member or an admin, never the creator (an admin's change).
    public func removeMember(_ member: String, from group: String) async throws(ConversationError) {
        try await change(.remove, targets: [member], in: group)
    }

    /// Leaves a group: the local speaker's later messages there are refused by everyone.
    public func leave(_ group: String) async throws(ConversationError) {
        try await change(.leave, in: group)
    }

    /// Makes a member an admin (`.admin`) or an admin a member again (`.member`).
    public func setRole(_ role: GroupMembership.Role, of member: String, in group: String) async throws(ConversationError) {
        switch role {
        case .admin: try await change(.promote, targets: [member], in: group)
        case .member: try await change(.demote, targets: [member], in: group)
        case .creator: throw ConversationError(.notAllowedInGroup, "a group has one creator, the one who created it")
        }
    }

    /// Names a group anew (an admin's change).
    public func rename(_ group: String, to name: String) async throws(ConversationError) {
        try await change(.rename, groupName: name, in: group)
    }

    /// Everyone in a group now, with their role, creator and admins first.
    public func members(of group: String) throws(ConversationError) -> [GroupMember] {
        try read { db in
            try Self.requireConversation(db, group)
            return try db.rows("SELECT speaker, role FROM group_members WHERE zone = ?", [group]) { row in
                GroupMember(speaker: row.text(0), role: GroupMembership.Role(rawValue: row.text(1)) ?? .member)
            }.sorted { ($0.role, $1.speaker) > ($1.role, $0.speaker) }
        }
    }

    /// The group's membership changes that took effect, oldest first: "alice added carol" and
    /// the like, for a timeline beside ``messages(in:limit:before:)`` (ordered by their clocks
    /// as the messages are by theirs). Refused changes are not in it.
    public func groupEvents(in group: String) throws(ConversationError) -> [GroupEvent] {
        let zone = try Self.groupZone(group)
        return try read { db in
            try Self.requireConversation(db, group)
            let changes = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ?", [group, GroupChange.recordType]) { row in
                (try? Record(canonical: row.blob(0))).flatMap { try? GroupChange(record: $0) }
            }.compactMap { $0 }
            let decided = GroupMembership(zone: zone, changes: changes)?.decisions ?? []
            return decided.filter { $0.decision == .accepted }.map { change, _ in
                GroupEvent(actor: change.actor, action: change.action, targets: change.targets, groupName: change.groupName,
                           at: Date(timeIntervalSince1970: Double(change.clock.milliseconds) / 1000), clock: change.clock)
            }
        }
    }

    /// Sends a message to a group: committed locally with its outbox entry and returned at once.
    /// - Throws: ``ConversationError/Code/notAllowedInGroup`` when the local speaker is not in
    ///   the group; the content errors of ``send(_:to:)``.
    @discardableResult
    public func send(_ content: String, toGroup group: String) async throws(ConversationError) -> Message {
        let local = try requireIdentity()
        try Self.validate(content: content)
        let zone = try Self.groupZone(group)
        let clock = clock.now()
        let name = ChatRecords.messageName(speaker: local.identifier, clock: clock)
        let now = Self.milliseconds(configuration.now())
        return try await write { applier in
            guard try applier.isGroupMember(local.identifier, zone: group, at: clock) else {
                throw ConversationError(.notAllowedInGroup, "\(local.identifier) is not in the group \(group)")
            }
            let latest = try applier.db.first("SELECT max(spoken_at) FROM messages WHERE zone = ?", [group]) { $0.optionalInt(0) } ?? nil
            var record = Record(id: try RecordID(zone: zone, name: name), type: ChatRecords.messageType, fields: [
                "speaker": .string(local.identifier), "content": .string(content), "spokenAt": .date(milliseconds: max(now, (latest ?? Int64.min) &+ 1)),
            ])
            try record.sign(with: local.key, clock: clock)
            try self.applyLocal(record, in: &applier)
            return try Self.message(applier.db, MessageID(conversation: group, name: name))
        }
    }

    // MARK: Helpers

    /// Signs one change at a clock of its own (the one its name carries), after checking it
    /// against the rule as the store holds the group, and commits it with its outbox entry.
    private func change(_ action: GroupChange.Action, targets: [String] = [], groupName: String? = nil, history: GroupMembership.History? = nil,
                        in group: String) async throws(ConversationError) {
        let local = try requireIdentity()
        if let groupName, groupName.isEmpty || groupName.utf8.count > GroupChange.maximumNameBytes {
            throw ConversationError(.invalidIdentifier, "a group's name is 1-\(GroupChange.maximumNameBytes) bytes")
        }
        let zone = try Self.groupZone(group)
        try await write { applier in
            let clock = self.clock.now()
            let change = GroupChange(name: GroupChange.recordName(actor: local.identifier, clock: clock, random: Sodium.randomBytes(8).hexString),
                                     actor: local.identifier, clock: clock, action: action, targets: targets, groupName: groupName, history: history)
            if case .refused(let why) = try applier.decision(of: change, in: zone) {
                throw ConversationError(.notAllowedInGroup, "\(why) (\(group))")
            }
            var record = Record(id: try RecordID(zone: zone, name: change.name), type: GroupChange.recordType, fields: change.fields)
            try record.sign(with: local.key, clock: clock)
            try self.applyLocal(record, in: &applier)
        }
    }

    static func groupZone(_ group: String) throws(ConversationError) -> ZoneName {
        guard let zone = try? ZoneName(group), ChatRecords.isGroupZone(zone) else {
            throw ConversationError(.unknownConversation, "\(group) is not a group")
        }
        return zone
    }

    static func group(_ db: Database, _ zone: String, local: String) throws -> Conversation {
        guard let group = try conversations(db, where: "c.zone = ?", [zone], local: local).first else {
            throw ConversationError(.unknownConversation, "no group \(zone)")
        }
        return group
    }
}
