import Foundation
import PostgresKit
import RecordZone
import Synchronization

/// Assets as 1 MiB chunks, health, metrics, and what tests and the bench seed.
extension PostgresZoneStorage {
    // MARK: Assets

    public func putAsset(_ data: Data, expected: AssetReference?) async throws(RecordZoneError) -> AssetReference {
        let reference = try AssetChecks.reference(for: data, expected: expected)
        let chunks = stride(from: 0, to: max(data.count, 1), by: Self.chunkSize).map { data.subdata(in: $0..<min($0 + Self.chunkSize, data.count)) }
        try await run { db in
            try db.transaction { () throws(PostgresError) in
                // Chunks first, then the row that says the asset is whole.
                try db.execute("""
                    INSERT INTO ck_asset_chunks (hash, index, data) SELECT $1, i - 1, d FROM unnest($2::bytea[]) WITH ORDINALITY AS t(d, i)
                    ON CONFLICT (hash, index) DO UPDATE SET data = excluded.data
                    """, [.bytes(reference.hash), .bytesArray(chunks)])
                try db.execute("INSERT INTO ck_assets (hash, size, chunks) VALUES ($1, $2, $3) ON CONFLICT (hash) DO UPDATE SET size = excluded.size, chunks = excluded.chunks",
                               [.bytes(reference.hash), .int(Int64(data.count)), .int(Int64(chunks.count))])
            }
        }
        return reference
    }

    public func asset(_ reference: AssetReference) async throws(RecordZoneError) -> Data {
        let rows = try await run { db in
            try db.execute("""
                SELECT a.size, c.data FROM ck_assets a JOIN ck_asset_chunks c ON c.hash = a.hash AND c.index < a.chunks WHERE a.hash = $1 ORDER BY c.index
                """, [.bytes(reference.hash)])
        }
        guard rows.count > 0, let size = rows.int(0, 0) else { throw RecordZoneError(.unknownItem, "no asset \(reference)") }
        guard size == Int64(reference.size) else { throw RecordZoneError(.unknownItem, "no asset \(reference) (the stored one has another size)") }
        var data = Data(capacity: Int(size))
        for row in 0..<rows.count { data.append(rows.bytes(row, 1) ?? Data()) }
        try AssetChecks.verify(data, against: reference)
        return data
    }

    // MARK: Operations

    public func recordCount() async throws(RecordZoneError) -> Int {
        Int(try await run { db in try db.execute("SELECT count(*) FROM ck_records").int(0, 0) } ?? 0)
    }

    public func zoneListing(after: String?, limit: Int) async throws(RecordZoneError) -> [ZoneListing] {
        let rows = try await run { db in
            try db.execute("SELECT name, sequence FROM ck_zones WHERE name > $1 ORDER BY name LIMIT $2", [.text(after ?? ""), .int(Int64(limit))])
        }
        return (0..<rows.count).compactMap { row in rows.text(row, 0).map { ZoneListing(name: $0, sequence: rows.int(row, 1) ?? 0) } }
    }

    public func recordPage(in zone: ZoneName, after: String?, limit: Int) async throws(RecordZoneError) -> [Wire.SignedRecord] {
        let rows = try await run { db in
            let zones = try db.execute("SELECT 1 FROM ck_zones WHERE name = $1", [.text(zone.rawValue)])
            guard zones.count == 1 else { throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist") }
            return try db.execute("SELECT record, sequence, received_at FROM ck_records WHERE zone = $1 AND name > $2 ORDER BY name LIMIT $3",
                                  [.text(zone.rawValue), .text(after ?? ""), .int(Int64(limit))])
        }
        return (0..<rows.count).compactMap { row in
            rows.bytes(row, 0).map { Wire.SignedRecord(bytes: $0, changeTag: rows.int(row, 1).map(String.init), receivedAt: rows.int(row, 2)) }
        }
    }

    public func zoneSize(_ zone: ZoneName) async throws(RecordZoneError) -> (records: Int, bytes: Int) {
        let rows = try await run { db in
            try db.execute("""
                SELECT (SELECT count(*) FROM ck_records WHERE zone = $1), (SELECT coalesce(sum(length(record)), 0)::bigint FROM ck_records WHERE zone = $1),
                       EXISTS (SELECT 1 FROM ck_zones WHERE name = $1)
                """, [.text(zone.rawValue)])
        }
        guard rows.bool(0, 2) == true else { throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist") }
        return (Int(rows.int(0, 0) ?? 0), Int(rows.int(0, 1) ?? 0))
    }

    public func healthProblem() async -> String? {
        do {
            _ = try await run { db in try db.execute("SELECT 1") }
            return listener.isConnected ? nil : "the notification connection to PostgreSQL is down"
        } catch {
            return "PostgreSQL: \(error.message)"
        }
    }

    public func metricsText() -> String {
        let pool = pool.statistics
        return """
            # HELP convkitd_db_pool_size Connections the server may open to PostgreSQL.
            # TYPE convkitd_db_pool_size gauge
            convkitd_db_pool_size \(pool.size)
            # HELP convkitd_db_pool_open Connections open now.
            # TYPE convkitd_db_pool_open gauge
            convkitd_db_pool_open \(pool.open)
            # HELP convkitd_db_pool_in_use Connections lent to requests now.
            # TYPE convkitd_db_pool_in_use gauge
            convkitd_db_pool_in_use \(pool.inUse)
            # HELP convkitd_db_pool_waiting Requests waiting for a connection now.
            # TYPE convkitd_db_pool_waiting gauge
            convkitd_db_pool_waiting \(pool.waiting)
            # HELP convkitd_db_pool_acquired_total Connections lent since start.
            # TYPE convkitd_db_pool_acquired_total counter
            convkitd_db_pool_acquired_total \(pool.acquired)
            # HELP convkitd_db_pool_waited_total Loans that had to wait for a free connection.
            # TYPE convkitd_db_pool_waited_total counter
            convkitd_db_pool_waited_total \(pool.waited)
            # HELP convkitd_db_connections_broken_total Connections closed because they failed.
            # TYPE convkitd_db_connections_broken_total counter
            convkitd_db_connections_broken_total \(pool.broken)
            # HELP convkitd_db_connect_failures_total Connection attempts that failed.
            # TYPE convkitd_db_connect_failures_total counter
            convkitd_db_connect_failures_total \(pool.connectFailures)
            # HELP convkitd_db_listener_up Whether the notification connection is up.
            # TYPE convkitd_db_listener_up gauge
            convkitd_db_listener_up \(listener.isConnected ? 1 : 0)
            # HELP convkitd_db_pin_read_failures_total Reads of the key chains after another server changed one that failed (each retried until one succeeds).
            # TYPE convkitd_db_pin_read_failures_total counter
            convkitd_db_pin_read_failures_total \(pinReadFailures.load(ordering: .relaxed))

            """
    }

    // MARK: Bench support

    /// Fills a zone with `count` filler rows (not records: 200 bytes each, never served to a
    /// verifying reader), so the bench can measure saves and fetches in a zone of that size.
    package func fillForBenchmark(_ zone: ZoneName, count: Int) async throws(RecordZoneError) {
        try await run { db in
            try db.transaction { () throws(PostgresError) in
                let start = try db.execute("SELECT sequence FROM ck_zones WHERE name = $1 FOR UPDATE", [.text(zone.rawValue)]).int(0, 0) ?? 0
                try db.execute("""
                    INSERT INTO ck_records (zone, name, type, sequence, clock, author, signature, record, received_at)
                    SELECT $1, 'filler-' || n, 'Filler', $2 + n, n, '\\x00', '\\x00', convert_to(repeat('x', 200), 'UTF8'), 0 FROM generate_series(1, $3::bigint) AS n
                    """, [.text(zone.rawValue), .int(start), .int(Int64(count))])
                try db.execute("UPDATE ck_zones SET sequence = $2, changed_xid = pg_current_xact_id()::text::bigint WHERE name = $1", [.text(zone.rawValue), .int(start + Int64(count))])
            }
            try db.execute("ANALYZE ck_records")
        }
    }
}
