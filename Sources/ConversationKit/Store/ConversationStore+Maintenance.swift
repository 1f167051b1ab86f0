import Foundation
import RecordZone
import SQLiteKit

/// A zone the store holds records of, as ``ConversationStore/heldZones()`` lists it.
public struct HeldZone: Sendable, Hashable {
    public let zone: String
    public let records: Int
    /// The change token the next pull starts from (nil: from the start).
    public let token: Data?
}

/// What the store holds, in numbers (``ConversationStore/statistics()``).
public struct StoreStatistics: Sendable, Hashable, Codable {
    public var records = 0
    public var recordBytes = 0
    public var zones = 0
    public var speakers = 0
    public var conversations = 0
    public var messages = 0
    public var pendingMessages = 0
    public var failedMessages = 0
    public var outbox = 0
    public var quarantined = 0
    public var cachedImages = 0
    public var cachedImageBytes = 0
    /// When the database feed was last pulled (nil: never).
    public var lastSyncAt: Date?
    /// Speakers held back because they are claimed by unrelated keys (identity conflicts).
    public var conflictedSpeakers: [String] = []
}

extension ConversationStore {
    /// Puts every failed message back into the outbox (for the next sync), as pending.
    /// - Returns: how many.
    @discardableResult
    public func retryFailedMessages() async throws(ConversationError) -> Int {
        try await write { applier in
            let db = applier.db
            let failed = try db.rows("""
                SELECT m.zone, m.name, r.clock FROM messages m JOIN ck_records r ON r.zone = m.zone AND r.name = m.name
                WHERE m.sync_state = ?
                """, [SyncStateColumn.failed.rawValue]) { ($0.text(0), $0.text(1), UInt64(bitPattern: $0.int(2))) }
            for (zone, name, clock) in failed {
                try Outbox.enqueue(zone: zone, name: name, clock: clock, in: db)
                try db.execute("UPDATE messages SET sync_state = ?, sync_error = NULL, sync_error_code = NULL WHERE zone = ? AND name = ?", [SyncStateColumn.pending.rawValue, zone, name])
                applier.note(.syncStateChanged(MessageID(conversation: zone, name: name)))
            }
            if !failed.isEmpty { applier.queuedLocalChange = true }
            return failed.count
        }
    }

    /// Forgets one zone's synced records and token (unsent changes stay): the next sync pulls it
    /// again from the start.
    public func refetch(zone: String) async throws(ConversationError) {
        try await write { applier in
            try CacheReset.drop(zone: zone, keeping: applier.localSpeaker ?? "", in: applier.db)
        }
    }

    /// Removes one quarantine entry (by its ``QuarantinedRecord/id``). - Returns: whether it existed.
    @discardableResult
    public func clearQuarantine(id: Int64) async throws(ConversationError) -> Bool {
        try await write { applier in
            try applier.db.execute("DELETE FROM ck_quarantine WHERE id = ?", [id])
            return applier.db.changes > 0
        }
    }

    /// Gives every quarantined record another chance: the entries are removed and the zones they
    /// came from are pulled again from the start by the next sync (a record refused again is
    /// quarantined again). - Returns: the zones to be pulled again.
    @discardableResult
    public func retryQuarantine() async throws(ConversationError) -> [String] {
        try await write { applier in
            let zones = try applier.db.rows("SELECT DISTINCT zone FROM ck_quarantine WHERE zone IS NOT NULL ORDER BY zone") { $0.text(0) }
            try applier.db.execute("DELETE FROM ck_quarantine")
            for zone in zones { try CacheReset.drop(zone: zone, keeping: applier.localSpeaker ?? "", in: applier.db) }
            return zones
        }
    }

    /// The local changes waiting to be pushed, oldest first.
    public func outbox() throws(ConversationError) -> [OutboxEntry] {
        try read { db in try Outbox.entries(in: db) }
    }

    /// The zones the store holds records of or syncs, with their record counts and tokens.
    public func heldZones() throws(ConversationError) -> [HeldZone] {
        try read { db in
            try db.rows("""
                SELECT z.zone, (SELECT count(*) FROM ck_records r WHERE r.zone = z.zone), t.token
                FROM (SELECT zone FROM ck_records UNION SELECT zone FROM ck_zone_state) z
                LEFT JOIN ck_zone_state t ON t.zone = z.zone ORDER BY z.zone
                """) { HeldZone(zone: $0.text(0), records: Int($0.int(1)), token: $0.optionalBlob(2)) }
        }
    }

    /// The winning version the store holds of every record of a zone (optionally of one type),
    /// as the signed bytes it was received or written as.
    public func records(in zone: String, type: String? = nil) throws(ConversationError) -> [Record] {
        let rows = try read { db in
            try db.rows("SELECT record FROM ck_records WHERE zone = ? AND (? IS NULL OR type = ?) ORDER BY name", [zone, type, type]) { $0.blob(0) }
        }
        return rows.compactMap { try? Record(canonical: $0) }
    }

    /// The version the store holds of one record.
    public func record(zone: String, name: String) throws(ConversationError) -> Record? {
        try read { db in try db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ?", [zone, name]) { $0.blob(0) } }
            .flatMap { try? Record(canonical: $0) }
    }

    /// What the store holds, in numbers.
    public func statistics() throws(ConversationError) -> StoreStatistics {
        try read { db in
            func count(_ sql: String, _ values: [any DatabaseValueConvertible] = []) throws -> Int { Int(try db.first(sql, values) { $0.int(0) } ?? 0) }
            var stats = StoreStatistics()
            stats.records = try count("SELECT count(*) FROM ck_records")
            stats.recordBytes = try count("SELECT coalesce(sum(length(record)), 0) FROM ck_records")
            stats.zones = try count("SELECT count(*) FROM (SELECT zone FROM ck_records UNION SELECT zone FROM ck_zone_state)")
            stats.speakers = try count("SELECT count(*) FROM speakers")
            stats.conversations = try count("SELECT count(*) FROM conversations")
            stats.messages = try count("SELECT count(*) FROM messages WHERE is_deleted = 0")
            stats.pendingMessages = try count("SELECT count(*) FROM messages WHERE sync_state = ?", [SyncStateColumn.pending.rawValue])
            stats.failedMessages = try count("SELECT count(*) FROM messages WHERE sync_state = ?", [SyncStateColumn.failed.rawValue])
            stats.outbox = try Outbox.count(in: db)
            stats.quarantined = try count("SELECT count(*) FROM ck_quarantine")
            stats.cachedImages = try count("SELECT count(*) FROM image_cache")
            stats.cachedImageBytes = try count("SELECT coalesce(sum(size), 0) FROM image_cache")
            stats.lastSyncAt = try db.first("SELECT value FROM ck_meta WHERE key = 'last_sync_at'") { Date(timeIntervalSince1970: Double($0.int(0)) / 1000) }
            stats.conflictedSpeakers = try db.rows("SELECT DISTINCT identity FROM ck_quarantine WHERE code = 'identityConflict' AND identity IS NOT NULL ORDER BY identity") { $0.text(0) }
            return stats
        }
    }

    /// A record with its sealed fields opened by the keys this device holds (`convkit records
    /// show --decrypt`); a record with none, as it is.
    /// - Throws: ``ConversationError/Code/keyNotHeld`` when this device does not hold the key of
    ///   its epoch; ``ConversationError/Code/notAuthentic`` when it does not open with it.
    public func decrypted(_ record: Record) throws(ConversationError) -> Record {
        guard record[Sealing.sealedField] != nil else { return record }
        switch try read({ db in try RecordApplier.unseal(record, in: db) }) {
        case .opened(let opened): return opened
        case .waiting(let epoch): throw ConversationError(.keyNotHeld, "this device does not hold the key of epoch \(epoch.hexString) (not shared with it, or not synced yet)")
        case .refused(let why): throw ConversationError(.notAuthentic, why)
        }
    }

    /// The devices a conversation's messages are sealed for now: each member's devices (this
    /// one too) whose encryption key this store holds and that are not revoked, by member. A
    /// member with none has not published a device yet: nothing sent now reaches it until it
    /// has (a sender shares as soon as it learns of one).
    public func encryptionDevices(in conversation: String) throws(ConversationError) -> [EncryptionDevice] {
        let local = try requireIdentity()
        let policy = self.policy
        return try read { db in
            try Self.requireConversation(db, conversation)
            let members = conversation.hasPrefix(GroupMembership.zonePrefix)
                ? try db.rows("SELECT speaker FROM group_members WHERE zone = ? ORDER BY speaker", [conversation]) { $0.text(0) }
                : [local.identifier] + (try db.first("SELECT other FROM conversations WHERE zone = ?", [conversation]) { [$0.text(0)] } ?? [])
            return try members.flatMap { member in
                let chain = policy.pins.chain(for: member)
                return try db.rows("SELECT device FROM encryption_keys WHERE identity = ? ORDER BY device", [member]) { $0.blob(0) }
                    .filter { chain?.allowsNow($0) == true }
                    .map { EncryptionDevice(speaker: member, deviceKey: $0, fingerprint: KeyChain.fingerprint(identity: member, key: $0),
                                            isThisDevice: $0 == local.key.publicKey) }
            }
        }
    }
}

/// A device a conversation's messages are sealed for (``ConversationStore/encryptionDevices(in:)``).
public struct EncryptionDevice: Sendable, Hashable {
    public let speaker: String
    /// The key the device signs with (the identity key on a first device).
    public let deviceKey: Data
    /// Its safety number, to compare with the device's own screen.
    public let fingerprint: String
    public let isThisDevice: Bool
}
