import Foundation
import PostgresKit
import RecordZone
import Synchronization

/// Zones, the database feed and each zone's changes, with long polls.
extension PostgresZoneStorage {
    // MARK: Zones

    public func createZone(_ zone: ZoneName) async throws(RecordZoneError) {
        try await run { db in
            try db.transaction { () throws(PostgresError) in
                let created = try db.execute("""
                    INSERT INTO ck_zones (name, incarnation, changed_xid) VALUES ($1, $2, pg_current_xact_id()::text::bigint) ON CONFLICT (name) DO NOTHING
                    """, [.text(zone.rawValue), .text(UUID().uuidString)])
                if created.affected == 1 { try db.execute("DELETE FROM ck_deleted_zones WHERE name = $1", [.text(zone.rawValue)]) }
            }
        }
    }

    public func zones() async throws(RecordZoneError) -> [ZoneName] {
        let rows = try await run { db in try db.execute("SELECT name FROM ck_zones ORDER BY name") }
        return (0..<rows.count).compactMap { rows.text($0, 0).flatMap { try? ZoneName($0) } }
    }

    public func deleteZone(_ zone: ZoneName) async throws(RecordZoneError) {
        try await run { db in
            try db.transaction { () throws in
                guard try db.execute("DELETE FROM ck_zones WHERE name = $1", [.text(zone.rawValue)]).affected == 1 else {
                    throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
                }
                try db.execute("DELETE FROM ck_records WHERE zone = $1", [.text(zone.rawValue)])
                try db.execute("DELETE FROM ck_record_index WHERE zone = $1", [.text(zone.rawValue)])
                try db.execute("""
                    INSERT INTO ck_deleted_zones (name, deleted_xid) VALUES ($1, pg_current_xact_id()::text::bigint)
                    ON CONFLICT (name) DO UPDATE SET deleted_xid = excluded.deleted_xid
                    """, [.text(zone.rawValue)])
                try db.execute("SELECT pg_notify('ck_changes', $1)", [.text(zone.rawValue)])
            }
        }
        waiters.wake(zone)
    }

    public func fetchDatabaseChanges(since token: ChangeToken?, visibleTo isVisible: @escaping @Sendable (ZoneName) -> Bool) async throws(RecordZoneError) -> DatabaseChanges {
        let position = try TokenContents.databasePosition(token, backend: Self.kind, instance: instance)
        let rows = try await run { db in try db.execute(Self.feedStatement, [.int(position)]) }
        return try feed(rows, since: position, isInitial: token == nil).filtered(isVisible)
    }

    /// One statement, one snapshot: the zones it shows, the oldest transaction it could not see
    /// (the next token) and the next transaction to come (a token past it is from before a
    /// restore). Its parameter is the position of the token given.
    static let feedStatement = """
        SELECT 'c', name, NULL::bigint, NULL::bigint FROM ck_zones WHERE changed_xid >= $1
        UNION ALL SELECT 'd', name, NULL, NULL FROM ck_deleted_zones WHERE deleted_xid >= $1
        UNION ALL SELECT 'h', '', pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_snapshot_xmax(pg_current_snapshot())::text::bigint
        """

    /// The feed ``feedStatement`` read (no zone deleted for a first feed).
    func feed(_ rows: PostgresRows, since position: Int64, isInitial: Bool) throws(RecordZoneError) -> DatabaseChanges {
        var changed = [ZoneName](), deleted = [ZoneName](), horizon: Int64 = position
        for row in 0..<rows.count {
            switch rows.text(row, 0) {
            case "h":
                horizon = rows.int(row, 2) ?? position
                try TokenContents.refuseAhead(position, of: rows.int(row, 3) ?? position, "the database")
            case "c": if let zone = rows.text(row, 1).flatMap({ try? ZoneName($0) }) { changed.append(zone) }
            default: if !isInitial, let zone = rows.text(row, 1).flatMap({ try? ZoneName($0) }) { deleted.append(zone) }
            }
        }
        return DatabaseChanges(changedZones: changed.sorted { $0.rawValue < $1.rawValue }, deletedZones: deleted.sorted { $0.rawValue < $1.rawValue },
                               token: TokenContents.databaseToken(backend: Self.kind, instance: instance, position: horizon))
    }

    // MARK: Changes

    public func changes(in zone: ZoneName, since token: ChangeToken?, limit: Int, readable: ReadableVersions?) async throws(RecordZoneError) -> Wire.Changes {
        let limit = BackendLimits.clampPage(limit)
        // The position is read from the token first; its zone and incarnation are checked
        // against the zone row read in the same statement.
        let claimed = try token.map { token throws(RecordZoneError) in Int64(bitPattern: SequencePosition.decode(try TokenContents(token, expecting: .zone, backend: Self.kind).position)) } ?? 0
        let rows = try await run { db in
            try db.execute("""
                SELECT z.incarnation, z.sequence, r.record, r.sequence, r.received_at, r.type, r.clock FROM ck_zones z
                LEFT JOIN LATERAL (SELECT record, sequence, received_at, type, clock FROM ck_records WHERE zone = z.name AND sequence > $2 ORDER BY sequence LIMIT $3) r ON true
                WHERE z.name = $1 ORDER BY r.sequence
                """, [.text(zone.rawValue), .int(claimed), .int(Int64(limit + 1))])
        }
        guard rows.count > 0, let incarnation = rows.text(0, 0), let zoneSequence = rows.int(0, 1) else {
            throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
        }
        _ = try TokenContents.zoneSequence(token, backend: Self.kind, zone: zone, incarnation: incarnation, current: zoneSequence)
        var records = [(signed: Wire.SignedRecord, type: String, clock: RecordClock)]()
        for row in 0..<rows.count {
            guard let bytes = rows.bytes(row, 2), let sequence = rows.int(row, 3), let type = rows.text(row, 5), let clock = rows.int(row, 6) else { continue }
            records.append((Wire.SignedRecord(bytes: bytes, changeTag: String(sequence), receivedAt: rows.int(row, 4)), type, RecordClock(rawValue: UInt64(bitPattern: clock))))
        }
        let moreComing = records.count > limit
        let page = Array(records.prefix(limit))
        // One statement, one snapshot: the zone's sequence covers every record it showed.
        let position = moreComing ? (page.last?.signed.changeTag.flatMap { Int64($0) } ?? zoneSequence) : zoneSequence
        let next = TokenContents(kind: .zone, backend: Self.kind, zone: zone.rawValue, incarnation: incarnation, position: SequencePosition.encode(UInt64(bitPattern: position)))
        // Versions the reader may not read are left out; the token still passes them.
        return Wire.Changes(records: page.filter { readable?.allows($0.type, $0.clock) ?? true }.map(\.signed), token: next.token, moreComing: moreComing)
    }

    /// Answers `true` only once the zone moved past `token` (or was deleted, or recreated): a wake
    /// that finds it where it was — every poll is woken when the listener connects again after a
    /// lost connection, since notifications may have been missed — goes back to waiting until
    /// the deadline.
    public func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
        let deadline = ContinuousClock.now + timeout
        var first = true
        while true {
            let generation = waiters.generation(of: zone)
            let rows = try await run { db in try db.execute("SELECT incarnation, sequence FROM ck_zones WHERE name = $1", [.text(zone.rawValue)]) }
            guard rows.count == 1, let incarnation = rows.text(0, 0), let sequence = rows.int(0, 1) else {
                if first { throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist") }
                return true  // deleted while waited for
            }
            let since: Int64
            do {
                since = try TokenContents.zoneSequence(token, backend: Self.kind, zone: zone, incarnation: incarnation, current: sequence)
            } catch where !first && error.code == .changeTokenExpired {
                return true  // recreated while waited for
            }
            if sequence > since { return true }
            first = false
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero, await waiters.wait(for: zone, after: generation, timeout: remaining) else { return false }
        }
    }

    public var waitingCount: Int { waiters.count }

    public func releaseWaiters() {
        waiters.releaseAll()
        typing.releaseAll()
        presence.releaseAll()
    }
}
