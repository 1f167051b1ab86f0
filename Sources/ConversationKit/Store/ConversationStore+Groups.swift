import Foundation
import ImageKit
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
        return try await read { db in try Self.group(db, zone.rawValue, local: local.identifier) }
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

    /// Sets a group's description (nil or empty: none), keeping its avatar (an admin's change).
    /// - Throws: ``ConversationError/Code/invalidIdentifier`` for one over 1,024 bytes.
    public func setDescription(_ description: String?, ofGroup group: String) async throws(ConversationError) {
        let text = description.flatMap { $0.isEmpty ? nil : $0 }
        if let text, text.utf8.count > GroupChange.maximumDescriptionBytes {
            throw ConversationError(.invalidIdentifier, "a group's description is at most \(GroupChange.maximumDescriptionBytes) bytes")
        }
        try await change(.describe, profile: { _, avatar in (text, avatar, nil) }, in: group)
    }

    /// Sets a group's avatar from image bytes (PNG or JPEG), keeping its description (an admin's
    /// change): through the avatar pipeline as ``setAvatar(imageData:)`` — upright, capped to
    /// ``StoreConfiguration/maxImageSize``, a PNG in the image cache that the next sync uploads
    /// before the change that names it.
    /// - Throws: ``ConversationError/Code/invalidImage`` as ``setAvatar(imageData:)``.
    public func setAvatar(imageData: Data, ofGroup group: String) async throws(ConversationError) {
        let box = configuration.maxImageSize
        let capped: CappedImage
        do { capped = try Images.cap(imageData, maxWidth: box.width, maxHeight: box.height, limits: configuration.imageLimits) } catch {
            throw ConversationError.wrap(error)
        }
        let avatar = GroupChange.Avatar(asset: AssetReference(for: capped.png), width: capped.width, height: capped.height)
        try await change(.describe, profile: { text, _ in (text, avatar, capped.png) }, in: group)
    }

    /// Removes a group's avatar, keeping its description (an admin's change).
    public func removeAvatar(ofGroup group: String) async throws(ConversationError) {
        try await change(.describe, profile: { text, _ in (text, nil, nil) }, in: group)
    }

    /// A group's avatar: from the image cache, or downloaded from the backend (verified against
    /// its hash, and decoded to check it is the PNG the group's change names) and cached.
    /// - Returns: nil when the group has no avatar, or its asset is missing or not that PNG.
    /// - Throws: ``ConversationError/Code/backend`` when it must be downloaded and the backend
    ///   cannot be reached.
    public func avatarImage(ofGroup group: String) async throws(ConversationError) -> AvatarImage? {
        guard let avatar = try await read({ db in try Self.groupProfile(db, group).avatar }) else { return nil }
        let reference = AvatarReference(asset: avatar.asset, size: PixelSize(width: avatar.width, height: avatar.height))
        if let png = try? imageFiles.get(avatar.asset) { return AvatarImage(png: png, size: reference.size) }
        switch try await verifiedAvatar(reference, from: try backend()) {
        case .success(let image): return image
        case .failure: return nil
        }
    }

    /// A group's description and avatar as the store holds them.
    static func groupProfile(_ db: Database, _ group: String) throws -> (description: String?, avatar: GroupChange.Avatar?) {
        try db.first("SELECT description, avatar_hash, avatar_size, avatar_width, avatar_height FROM group_state WHERE zone = ?", [group]) { row in
            let avatar = row.optionalBlob(1).flatMap { hash in
                (try? AssetReference(hash: hash, size: UInt64(row.int(2)))).map { GroupChange.Avatar(asset: $0, width: Int(row.int(3)), height: Int(row.int(4))) }
            }
            return (row.optionalText(0), avatar)
        } ?? (nil, nil)
    }

    /// Everyone in a group now, with their role, creator and admins first.
    public func members(of group: String) throws(ConversationError) -> [GroupMember] {
        try read(Self.membersQuery(group))
    }

    /// ``members(of:)``, read without blocking the caller's thread.
    func loadMembers(of group: String) async throws(ConversationError) -> [GroupMember] {
        try await read(Self.membersQuery(group))
    }

    private static func membersQuery(_ group: String) -> @Sendable (Database) throws -> [GroupMember] {
        { db in
            try requireConversation(db, group)
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
    /// - Parameter replyingTo: the group message this one answers.
    @discardableResult
    public func send(_ content: String, toGroup group: String, replyingTo parent: MessageID? = nil, mentions: [Mention] = [],
                     custom: CustomPayload? = nil) async throws(ConversationError) -> Message {
        try await send(content, toGroup: group, replyingTo: parent, mentions: mentions, custom: custom, file: nil)
    }

    /// A send to a group, with a file staged in the cache (``sendFile(_:toGroup:caption:mediaType:replyingTo:)``).
    func send(_ content: String, toGroup group: String, replyingTo parent: MessageID?, mentions: [Mention] = [],
              custom: CustomPayload? = nil, file: StagedFile?) async throws(ConversationError) -> Message {
        let local = try requireIdentity()
        try Self.validate(content: content, mentions: mentions, custom: custom)
        let zone = try Self.groupZone(group)
        let clock = clock.now()
        let name = ChatRecords.messageName(speaker: local.identifier, clock: clock)
        let now = Self.milliseconds(configuration.now())
        defer { stopTypingAfterSend(in: group) }
        return try await write { applier in
            guard try applier.isGroupMember(local.identifier, zone: group, at: clock) else {
                throw ConversationError(.notAllowedInGroup, "\(local.identifier) is not in the group \(group)")
            }
            let latest = try applier.db.first("SELECT max(spoken_at) FROM messages WHERE zone = ?", [group]) { $0.optionalInt(0) } ?? nil
            var record = try ChatRecords.message(name: name, speaker: local.identifier, listener: nil, in: zone, content: content,
                                                 spokenAt: max(now, (latest ?? Int64.min) &+ 1), editedAt: nil,
                                                 replyTo: try Self.replyTarget(parent, in: group, db: applier.db), mentions: mentions, custom: custom,
                                                 file: file?.manifest)
            record = try applier.seal(record, at: clock)
            try record.sign(with: local.key, clock: clock)
            try self.applyLocal(record, in: &applier)
            if let file { try self.placeStagedFile(file, as: MessageID(conversation: group, name: name), now: now, in: &applier) }
            try Self.clearDraft(group, in: &applier)
            return try Self.message(applier.db, MessageID(conversation: group, name: name))
        }
    }

    // MARK: Helpers

    /// Signs one change at a clock of its own (the one its name carries), after checking it
    /// against the rule as the store holds the group, and commits it with its outbox entry.
    /// - Parameter profile: for `describe`, what to set given the description and avatar held
    ///   now (and the capped PNG of a new avatar, put in the image cache with the change).
    private func change(_ action: GroupChange.Action, targets: [String] = [], groupName: String? = nil, history: GroupMembership.History? = nil,
                        profile: (@Sendable (String?, GroupChange.Avatar?) -> (String?, GroupChange.Avatar?, png: Data?))? = nil,
                        in group: String) async throws(ConversationError) {
        let local = try requireIdentity()
        if let groupName, groupName.isEmpty || groupName.utf8.count > GroupChange.maximumNameBytes {
            throw ConversationError(.invalidIdentifier, "a group's name is 1-\(GroupChange.maximumNameBytes) bytes")
        }
        let zone = try Self.groupZone(group)
        let files = imageFiles, now = SyncEngine.milliseconds(configuration.now()), budget = configuration.imageCacheBytes
        try await write { applier in
            let clock = self.clock.now()
            var described: (String?, GroupChange.Avatar?)
            if let profile {
                let held = try Self.groupProfile(applier.db, group)
                let (text, avatar, png) = profile(held.description, held.avatar)
                if let avatar, let png { try ImageCacheIndex.keep(png, as: avatar.asset, in: files, now: now, budget: budget, db: applier.db) }
                described = (text, avatar)
            }
            let change = GroupChange(name: GroupChange.recordName(actor: local.identifier, clock: clock, random: Sodium.randomBytes(8).hexString),
                                     actor: local.identifier, clock: clock, action: action, targets: targets, groupName: groupName, history: history,
                                     groupDescription: described.0, avatar: described.1)
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
