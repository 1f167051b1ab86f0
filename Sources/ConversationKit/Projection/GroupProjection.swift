import Foundation
import RecordZone
import SQLiteKit

/// `GroupChange` records: a group's membership decided from its changes, and its messages decided
/// by it.
extension RecordApplier {

    /// Whether `speaker` was in the group at `clock` (its runs of membership, as last decided).
    func isGroupMember(_ speaker: String, zone: String, at clock: RecordClock) throws -> Bool {
        let at = Int64(bitPattern: clock.rawValue)
        return try db.first("""
            SELECT 1 FROM group_runs WHERE zone = ? AND speaker = ? AND from_clock < ? AND (until_clock IS NULL OR ? < until_clock)
            """, [zone, speaker, at, at]) { _ in true } ?? false
    }

    /// Whether the local speaker reads a group's version at `clock` (``GroupMembership/mayRead(_:at:)``):
    /// inside one of its runs, or — when the group keeps its whole history — before its last
    /// run ended.
    func localMayRead(zone: String, at clock: RecordClock) throws -> Bool {
        guard let local = localSpeaker else { return false }
        let history = try db.first("SELECT history FROM group_state WHERE zone = ?", [zone]) { GroupMembership.History(rawValue: $0.text(0)) } ?? nil
        guard history == .all else { return try isGroupMember(local, zone: zone, at: clock) }
        let at = Int64(bitPattern: clock.rawValue)
        guard let last = try db.first("SELECT until_clock FROM group_runs WHERE zone = ? AND speaker = ? ORDER BY from_clock DESC LIMIT 1", [zone, local],
                                      { $0.optionalInt(0) }) else { return false }
        return last.map { at < $0 } ?? true
    }

    /// A group message not shown: kept (a change that decides otherwise may still come). When
    /// its speaker was not a member at its clock, it is in the quarantine to say why; when only
    /// the local speaker was not (a message from before they joined or after they left), it is
    /// simply not theirs to see.
    mutating func holdBack(_ record: Record, origin: Origin, speakerWasMember: Bool) throws {
        let zone = record.id.zone.rawValue, name = record.id.name
        let held = try db.first("SELECT 1 FROM ck_quarantine WHERE zone = ? AND name = ? AND code = 'notAMember'", [zone, name]) { _ in true } ?? false
        if speakerWasMember, held {
            try release(zone: zone, name: name, quarantinedAs: .notAMember)
        } else if !speakerWasMember, !held {
            try quarantine(RejectedRecord(recordID: record.id, reason: .notAMember(identity: record.string("speaker") ?? ""),
                                          source: origin == .local ? "local" : "pull", data: try? record.encoded()))
        }
        // The local speaker's own: shown to them as failed (why nobody else sees it), not gone.
        if !speakerWasMember, !record.isDeleted, let local = localSpeaker, record.string("speaker") == local {
            try projectMessage(record, origin: origin, gated: false)
            try fail(MessageID(conversation: zone, name: name),
                     SyncFailure(.notInGroup, message: "\(local) was not in the group at this message's clock: nobody else sees it"))
            return
        }
        try removeMessageRow(zone: zone, name: name)
    }

    /// A group's change: after every change decided so far (the usual case), decided alone
    /// against the group's tables, and only what it changed is written — the messages after its
    /// clock decided again; otherwise (the first change held, or one dated before the last
    /// decided) the group is decided again whole in ``finish()``. Both give the same tables.
    mutating func applyGroupChange(_ record: Record) throws {
        let zone = record.id.zone.rawValue
        guard !groups.changed.contains(zone), let zoneName = try? ZoneName(zone), let change = try? GroupChange(record: record),
              var group = try resumed(zoneName, before: change)
        else {
            groups.changed.insert(zone)
            return
        }
        let roles = group.roles
        group.insert(change)
        let clock = Int64(bitPattern: change.clock.rawValue)
        try db.execute("UPDATE group_state SET last_clock = ?, last_name = ?, is_created = ?, name = ? WHERE zone = ?",
                       [clock, change.name, group.isCreated, group.name, zone])
        guard group.decisions.last?.decision == .accepted else { return }
        if change.action == .describe {
            try writeProfile(of: zone, description: group.groupDescription, avatar: group.avatar)
            note(.conversationChanged(zone))
        }
        // What moved: roles, and runs begun or ended at this change's clock.
        let moved = Set(roles.keys).union(group.roles.keys).filter { roles[$0] != group.roles[$0] }
        if !moved.isEmpty { keys.zonesToShare.insert(zone) }
        if let local = localSpeaker, roles[local] == nil, group.roles[local] != nil,
           try db.first("SELECT 1 FROM group_runs WHERE zone = ? AND speaker = ?", [zone, local], { _ in true }) != nil {
            groups.reread.insert(zone)
        }
        for speaker in moved {
            if let role = group.roles[speaker] {
                try db.execute("INSERT INTO group_members (zone, speaker, role) VALUES (?, ?, ?) ON CONFLICT (zone, speaker) DO UPDATE SET role = excluded.role",
                               [zone, speaker, role.rawValue])
            } else {
                try db.execute("DELETE FROM group_members WHERE zone = ? AND speaker = ?", [zone, speaker])
            }
            if roles[speaker] == nil {
                try db.execute("INSERT INTO group_runs (zone, speaker, from_clock, until_clock) VALUES (?, ?, ?, NULL)", [zone, speaker, clock])
                try follow(speaker)
            } else if group.roles[speaker] == nil {
                try db.execute("UPDATE group_runs SET until_clock = ? WHERE zone = ? AND speaker = ? AND until_clock IS NULL", [clock, zone, speaker])
            }
        }
        if let local = localSpeaker, try db.first("SELECT 1 FROM group_runs WHERE zone = ? AND speaker = ?", [zone, local], { _ in true }) != nil {
            try ensureGroupConversation(zone: zone, name: group.name)
        }
        note(.conversationChanged(zone))
        // Messages after this clock were decided without it: those of the speakers whose
        // membership began or ended (all of them when it is the local speaker's).
        let joinedOrLeft = moved.filter { (roles[$0] == nil) != (group.roles[$0] == nil) }
        guard !joinedOrLeft.isEmpty else { return }
        let everyone = localSpeaker.map(joinedOrLeft.contains) ?? false
        // With the whole history kept, the local speaker's joining again shows what was said
        // before this clock too.
        let from = everyone && group.history == .all ? Int64.min : clock
        let later = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ? AND clock > ?", [zone, ChatRecords.messageType, from]) {
            try? Record(canonical: $0.blob(0))
        }
        for case let message? in later where everyone || joinedOrLeft.contains(message.string("speaker") ?? "") {
            try redecide(message, zone: zone)
        }
    }

    /// The roles of `speakers` in the group now (those not in it left out).
    func rolesOf(_ speakers: [String], in zone: String) throws -> [String: GroupMembership.Role] {
        var roles: [String: GroupMembership.Role] = [:]
        for speaker in Set(speakers) {
            if let role = try db.first("SELECT role FROM group_members WHERE zone = ? AND speaker = ?", [zone, speaker], { GroupMembership.Role(rawValue: $0.text(0)) }) ?? nil {
                roles[speaker] = role
            }
        }
        return roles
    }

    /// The group as its tables hold it, ready to decide `change` — when `change` comes after the
    /// last change decided (nil otherwise). The rule reads only the roles of the change's actor
    /// and targets, so only those are loaded.
    func resumed(_ zone: ZoneName, before change: GroupChange) throws -> GroupMembership? {
        guard let state = try db.first("SELECT last_clock, last_name, is_created, name, history FROM group_state WHERE zone = ?", [zone.rawValue], { row in
                  (clock: UInt64(bitPattern: row.int(0)), name: row.text(1), isCreated: row.int(2) != 0, groupName: row.optionalText(3),
                   history: GroupMembership.History(rawValue: row.text(4)) ?? .sinceAdded)
              }), (state.clock, state.name) < (change.clock.rawValue, change.name)
        else { return nil }
        return GroupMembership(zone: zone, resumingWith: try rolesOf([change.actor] + change.targets, in: zone.rawValue), isCreated: state.isCreated,
                               name: state.groupName, history: state.history)
    }

    /// How the rule decides `change` against the group as this store holds it: after the last
    /// change decided, from the group's tables; otherwise from every change held.
    func decision(of change: GroupChange, in zone: ZoneName) throws -> GroupMembership.Decision? {
        if var group = try resumed(zone, before: change) {
            group.insert(change)
            return group.decisions.last?.decision
        }
        let held = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ?", [zone.rawValue, GroupChange.recordType]) { row in
            (try? Record(canonical: row.blob(0))).flatMap { try? GroupChange(record: $0) }
        }.compactMap { $0 }
        return GroupMembership(zone: zone, changes: held + [change])?.decisions.first { $0.change.name == change.name }?.decision
    }

    /// Shows or holds back one group message by the runs as they stand.
    mutating func redecide(_ message: Record, zone: String) throws {
        let speakerWasMember = try isGroupMember(message.string("speaker") ?? "", zone: zone, at: message.clock)
        if speakerWasMember, try localMayRead(zone: zone, at: message.clock) {
            try release(zone: zone, name: message.id.name, quarantinedAs: .notAMember)
            // Shown, and not as failed for want of membership (which it no longer is).
            let shown = try db.first("SELECT 1 FROM messages WHERE zone = ? AND name = ? AND sync_error_code IS NOT ?",
                                     [zone, message.id.name, SyncFailure.Code.notInGroup.rawValue]) { _ in true } ?? false
            // Shown again: pending if it is still in the outbox (never "synced" before it is).
            let queued = try db.first("SELECT 1 FROM ck_outbox WHERE zone = ? AND name = ?", [zone, message.id.name]) { _ in true } ?? false
            if !shown || message.isDeleted { try projectMessage(message, origin: queued ? .local : .remote, gated: false) }
        } else {
            try holdBack(message, origin: .remote, speakerWasMember: speakerWasMember)
        }
    }

    /// Decides a group again from every change it holds (``GroupMembership``): its members and
    /// runs, its conversation (shown once the local speaker has been in it), and every message,
    /// shown or held back by its speaker's membership at its clock — so the view is the same
    /// whatever order the changes and messages came in.
    mutating func decideGroup(_ zone: String) throws {
        guard let zoneName = try? ZoneName(zone) else { return }
        let changes = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ? AND is_deleted = 0", [zone, GroupChange.recordType]) { row in
            (try? Record(canonical: row.blob(0))).flatMap { try? GroupChange(record: $0) }
        }.compactMap { $0 }
        guard let group = GroupMembership(zone: zoneName, changes: changes) else { return }
        if let local = localSpeaker {
            let before = try db.rows("SELECT from_clock, until_clock FROM group_runs WHERE zone = ? AND speaker = ?", [zone, local]) {
                GroupMembership.Run(from: RecordClock(rawValue: UInt64(bitPattern: $0.int(0))), until: $0.optionalInt(1).map { RecordClock(rawValue: UInt64(bitPattern: $0)) })
            }
            // A run now that no run before covered: what the local speaker may read grew.
            let grew = (group.runs[local] ?? []).contains { run in
                !before.contains { $0.from <= run.from && ($0.until.map { end in run.until.map { $0 <= end } ?? false } ?? true) }
            }
            if !before.isEmpty, grew { groups.reread.insert(zone) }
        }
        keys.zonesToShare.insert(zone)
        try db.execute("DELETE FROM group_members WHERE zone = ?", [zone])
        for (speaker, role) in group.roles {
            try db.execute("INSERT INTO group_members (zone, speaker, role) VALUES (?, ?, ?)", [zone, speaker, role.rawValue])
        }
        try db.execute("DELETE FROM group_runs WHERE zone = ?", [zone])
        for (speaker, runs) in group.runs {
            for run in runs {
                try db.execute("INSERT INTO group_runs (zone, speaker, from_clock, until_clock) VALUES (?, ?, ?, ?)",
                               [zone, speaker, Int64(bitPattern: run.from.rawValue), run.until.map { Int64(bitPattern: $0.rawValue) }])
            }
            try follow(speaker)
        }
        if let local = localSpeaker, group.runs[local] != nil {
            try ensureGroupConversation(zone: zone, name: group.name)
        }
        if let last = group.decisions.last?.change {
            try db.execute("""
                INSERT INTO group_state (zone, last_clock, last_name, is_created, name, history) VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT (zone) DO UPDATE SET last_clock = excluded.last_clock, last_name = excluded.last_name,
                    is_created = excluded.is_created, name = excluded.name, history = excluded.history
                """, [zone, Int64(bitPattern: last.clock.rawValue), last.name, group.isCreated, group.name, group.history.rawValue])
            try writeProfile(of: zone, description: group.groupDescription, avatar: group.avatar)
        }
        note(.conversationChanged(zone))
        // Every message again, by the runs just decided.
        let messages = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ?", [zone, ChatRecords.messageType]) { try? Record(canonical: $0.blob(0)) }
        for case let message? in messages { try redecide(message, zone: zone) }
    }

    /// A group's description and avatar, as the last `describe` that took effect set them.
    func writeProfile(of zone: String, description: String?, avatar: GroupChange.Avatar?) throws {
        try db.execute("""
            UPDATE group_state SET description = ?, avatar_hash = ?, avatar_size = ?, avatar_width = ?, avatar_height = ? WHERE zone = ?
            """, [description, avatar?.asset.hash, avatar.map { Int64($0.asset.size) }, avatar.map { Int64($0.width) }, avatar.map { Int64($0.height) }, zone])
    }
}

/// What the group projection gathers over a transaction (``RecordApplier/finish()``).
struct GroupWork {
    /// Groups whose changes moved: their membership, and their messages, are decided again.
    var changed = Set<String>()
    /// Groups the local speaker's membership grew in (added again, or its runs decided anew to
    /// cover more): their token is dropped, so the zone is read again from the start — a server
    /// shows each reader only what its membership then let it read.
    var reread = Set<String>()
}
