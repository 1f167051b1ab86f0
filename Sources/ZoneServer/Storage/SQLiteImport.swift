import Foundation
import PostgresKit
import RecordZone
import SQLiteKit

/// What ``PostgresZoneStorage/importSQLite(from:progress:)`` copied.
public struct ImportReport: Sendable, Codable {
    public var zones = 0
    public var deletedZones = 0
    public var records = 0
    public var pins = 0
    public var assets = 0
    /// Records that failed verification (signature, ownership) and were left behind, with why.
    public var refused = [String]()
    /// Asset files that did not match their hash, left behind.
    public var corruptAssets = [String]()
}

extension PostgresZoneStorage {
    /// Copies a stopped SQLite server's data (`convkitd serve --data DIR`) into this database,
    /// which must hold no zone yet: key chains, zones with their incarnations and sequences,
    /// deleted zones, every record with its sequence and time of arrival, and every asset.
    /// Every record is verified again (signature, ownership against the copied chains) and every
    /// asset against its hash; what fails is reported and left behind.
    ///
    /// Zone tokens keep their meaning (same incarnations, same sequences): clients carry on
    /// where they were. Database tokens, whose positions the two storages count differently,
    /// expire cleanly: a client's next look at the feed starts over (`changeTokenExpired`).
    public func importSQLite(from directory: String, progress: @Sendable (String) -> Void = { _ in }) async throws(RecordZoneError) -> ImportReport {
        let path = directory + "/zones.sqlite"
        guard FileManager.default.fileExists(atPath: path) else { throw RecordZoneError(.invalidArguments, "no SQLite server data in \(directory) (no zones.sqlite)") }
        let source: DatabaseQueue
        do { source = try DatabaseQueue(path: path, migrations: SQLiteZoneStorage.migrations) } catch {
            throw RecordZoneError(.ioError, "cannot open \(path): \(error)")
        }
        guard try await zones().isEmpty else { throw RecordZoneError(.invalidArguments, "the PostgreSQL database already holds zones: import into an empty one") }
        var report = ImportReport()
        do {
            // Chains first: records are checked against them, as the source server checked them.
            let chains = try await source.read { db in try PinTable.load(from: db) }
            let checker = RecordPolicy(rules: policy.rules, pins: KeyPins(chains))
            try await insert(chains)
            report.pins = chains.count
            progress("\(chains.count) key chains")

            let zoneRows = try await source.read { db in try db.rows("SELECT name, incarnation, sequence FROM zones ORDER BY name") { ($0.text(0), $0.text(1), $0.int(2)) } }
            let deleted = try await source.read { db in try db.rows("SELECT name FROM deleted_zones ORDER BY name") { $0.text(0) } }
            try await run { db in
                try db.execute("""
                    INSERT INTO ck_zones (name, incarnation, sequence, changed_xid)
                    SELECT name, incarnation, sequence, pg_current_xact_id()::text::bigint FROM unnest($1::text[], $2::text[], $3::bigint[]) AS t(name, incarnation, sequence)
                    """, [.textArray(zoneRows.map(\.0)), .textArray(zoneRows.map(\.1)), .intArray(zoneRows.map(\.2))])
                try db.execute("""
                    INSERT INTO ck_deleted_zones (name, deleted_xid) SELECT name, pg_current_xact_id()::text::bigint FROM unnest($1::text[]) AS t(name)
                    """, [.textArray(deleted)])
            }
            report.zones = zoneRows.count
            report.deletedZones = deleted.count

            for (zone, _, _) in zoneRows {
                var after: Int64 = 0
                while true {
                    let page = try await source.read { [after] db in
                        try db.rows("SELECT name, sequence, received_at, record FROM records WHERE zone = ? AND sequence > ? ORDER BY sequence LIMIT 1000", [zone, after]) {
                            ($0.text(0), $0.int(1), $0.int(2), $0.blob(3))
                        }
                    }
                    guard let last = page.last else { break }
                    after = last.1
                    let admitted = checker.admit(batch: page.map(\.3), source: { "\(zone)/\(page[$0].0)" })
                    var kept = [(record: Record, sequence: Int64, receivedAt: Int64, bytes: Data)]()
                    for (row, result) in zip(page, admitted) {
                        switch result {
                        case .success(let record) where record.id.zone.rawValue == zone && record.id.name == row.0: kept.append((record, row.1, row.2, row.3))
                        case .success: report.refused.append("\(zone)/\(row.0): stored under another ID than it names")
                        case .failure(let rejected): report.refused.append("\(zone)/\(row.0): \(rejected.reason)")
                        }
                    }
                    let index = queryIndex
                    let parameters: [PostgresValue] = [
                        .text(zone), .textArray(kept.map(\.record.id.name)), .textArray(kept.map(\.record.recordType)), .intArray(kept.map(\.sequence)),
                        .intArray(kept.map { Int64(bitPattern: $0.record.clock.rawValue) }), .bytesArray(kept.map(\.record.authorKey)),
                        .bytesArray(kept.map(\.record.signature)), .bytesArray(kept.map(\.bytes)), .intArray(kept.map(\.receivedAt)),
                    ]
                    let records = kept.map(\.record)
                    try await run { db in
                        try db.transaction { () throws in
                            try db.execute("""
                                INSERT INTO ck_records (zone, name, type, sequence, clock, author, signature, record, received_at)
                                SELECT $1, name, type, sequence, clock, author, signature, record, received_at
                                FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bytea[], $7::bytea[], $8::bytea[], $9::bigint[])
                                    AS t(name, type, sequence, clock, author, signature, record, received_at)
                                """, parameters)
                            try Self.writeIndex(index, of: records, in: db)
                        }
                    }
                    report.records += kept.count
                }
            }
            // Identities the source had not pinned yet, pinned now by the verification.
            let fresh = checker.pins.takeChangedChains()
            try await insert(fresh)
            try await refreshPins()
            report.pins += fresh.count
            progress("\(report.records) records in \(report.zones) zones")
        } catch {
            throw Self.storageError(error)
        }

        // Assets: every file under assets/, checked against the hash it is named by.
        let assets = AssetFolder(root: directory + "/assets")
        let enumerator = FileManager.default.enumerator(atPath: assets.root)
        while let relative = enumerator?.nextObject() as? String {
            let name = (relative as NSString).lastPathComponent
            guard name.count == 64, let hash = Data(hexString: name), let data = FileManager.default.contents(atPath: assets.root + "/" + relative),
                let reference = try? AssetReference(hash: hash, size: UInt64(data.count))
            else { continue }
            do {
                _ = try await putAsset(data, expected: reference)
                report.assets += 1
            } catch where error.code == .assetCorrupt {
                report.corruptAssets.append(name)
            }
        }
        progress("\(report.assets) assets")
        return report
    }

    /// Writes key chains of identities the database does not hold yet.
    private func insert(_ chains: [String: KeyChain]) async throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let rows = try chains.sorted { $0.key < $1.key }.map { ($0.key, try encoder.encode($0.value)) }
        try await run { db in
            try db.execute("""
                INSERT INTO ck_pins (identity, chain, version) SELECT identity, chain, nextval('ck_pin_versions') FROM unnest($1::text[], $2::bytea[]) AS t(identity, chain)
                ON CONFLICT (identity) DO NOTHING
                """, [.textArray(rows.map(\.0)), .bytesArray(rows.map(\.1))])
        }
    }
}
