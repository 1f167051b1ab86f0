import Foundation
import PostgresKit
@testable import RecordZone
import SQLiteKit
@testable import ZoneServer

// Test hooks: what a broken or hostile writer, a restore from an earlier copy, or a large
// server's history does to a backend, past every check the backend's API makes. They reach
// into the backends' internals (testable imports), so none of it ships.

extension InMemoryBackend {
    /// Stores raw bytes as if another writer had put them there, bypassing every save check:
    /// how the conformance suite plants forged records for readers to catch.
    public func injectUnchecked(_ data: Data, into zoneName: ZoneName) throws(RecordZoneError) {
        _ = try existing(zoneName)
        injected += 1
        _ = zoneTable[zoneName, default: Zone()].append(key: "injected-\(injected)", data: data)
        databaseSequence += 1
        zoneTable[zoneName, default: Zone()].databaseSequence = databaseSequence
        wake(zoneName)
    }
}

extension ZoneStorage {
    /// Stores raw bytes as a broken or hostile writer would, bypassing every check.
    public func injectUnchecked(_ data: Data, into zone: ZoneName, name: String) async throws {
        switch self {
        case let sqlite as SQLiteZoneStorage:
            try await sqlite.queue.write { db in
                try db.execute("UPDATE zones SET sequence = sequence + 1, changed_at = ? WHERE name = ?", [try SQLiteZoneStorage.nextDatabaseSequence(db), zone.rawValue])
                let sequence = try db.first("SELECT sequence FROM zones WHERE name = ?", [zone.rawValue]) { $0.int(0) } ?? 0
                try db.execute("INSERT OR REPLACE INTO records (zone, name, type, sequence, clock, author, signature, record, received_at) VALUES (?, ?, 'Injected', ?, 0, x'', x'', ?, 0)",
                               [zone.rawValue, name, sequence, data])
            }
            sqlite.waiters.wake(zone)
        case let postgres as PostgresZoneStorage:
            try await postgres.run { db in
                try db.transaction { () throws(PostgresError) in
                    let sequence = try db.execute("""
                        UPDATE ck_zones SET sequence = sequence + 1, changed_xid = pg_current_xact_id()::text::bigint WHERE name = $1 RETURNING sequence
                        """, [.text(zone.rawValue)]).int(0, 0) ?? 0
                    try db.execute("""
                        INSERT INTO ck_records (zone, name, type, sequence, clock, author, signature, record, received_at) VALUES ($1, $2, 'Injected', $3, 0, '', '', $4, 0)
                        ON CONFLICT (zone, name) DO UPDATE SET sequence = excluded.sequence, record = excluded.record
                        """, [.text(zone.rawValue), .text(name), .int(sequence), .bytes(data)])
                    try db.execute("SELECT pg_notify('ck_changes', $1)", [.text(zone.rawValue)])
                }
            }
        default: throw RecordZoneError(.invalidArguments, "no way to plant records in \(type(of: self))")
        }
    }

    /// Puts a zone back as it stood at `sequence`, as a restore from an earlier copy would.
    public func rewind(_ zone: ZoneName, to sequence: Int64) async throws {
        switch self {
        case let sqlite as SQLiteZoneStorage:
            try await sqlite.queue.write { db in
                try db.execute("DELETE FROM records WHERE zone = ? AND sequence > ?", [zone.rawValue, sequence])
                try db.execute("UPDATE zones SET sequence = ? WHERE name = ?", [sequence, zone.rawValue])
            }
        case let postgres as PostgresZoneStorage:
            try await postgres.run { db in
                try db.execute("DELETE FROM ck_records WHERE zone = $1 AND sequence > $2", [.text(zone.rawValue), .int(sequence)])
                try db.execute("UPDATE ck_zones SET sequence = $2 WHERE name = $1", [.text(zone.rawValue), .int(sequence)])
            }
        default: throw RecordZoneError(.invalidArguments, "no way to rewind \(type(of: self))")
        }
    }

    /// Creates many zones in one transaction (seeding a large server).
    public func createZones(_ zones: [ZoneName]) async throws {
        switch self {
        case let sqlite as SQLiteZoneStorage:
            try await sqlite.queue.write { db in
                let sequence = try SQLiteZoneStorage.nextDatabaseSequence(db)
                for zone in zones {
                    try db.execute("INSERT INTO zones (name, incarnation, changed_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING", [zone.rawValue, UUID().uuidString, sequence])
                }
            }
        case let postgres as PostgresZoneStorage:
            _ = try await postgres.run { db in
                try db.execute("""
                    INSERT INTO ck_zones (name, incarnation, changed_xid) SELECT name, gen_random_uuid()::text, pg_current_xact_id()::text::bigint
                    FROM unnest($1::text[]) AS t(name) ON CONFLICT (name) DO NOTHING
                    """, [.textArray(zones.map(\.rawValue))])
            }
        default: for zone in zones { try await createZone(zone) }
        }
    }
}
