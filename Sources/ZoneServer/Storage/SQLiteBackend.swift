import Foundation
import RecordZone
import SQLiteKit
import Synchronization

/// The zone server's storage: a record-zone backend on one SQLite database (WAL,
/// `synchronous=FULL`: a save is on disk before it is acknowledged), one sequence per zone, and
/// assets as files named by their hash. Tokens carry the server's instance ID and the zone's
/// incarnation, both kept in the database, so tokens survive a restart and expire when a zone
/// is recreated.
///
/// Every record is verified once, on write (signature, ownership, pins), and stored as its
/// canonical bytes; reads serve those bytes as they are (readers verify what they receive).
public final class SQLiteBackend: RecordZoneBackend, Sendable {
    static let kind = "server"

    public let policy: RecordPolicy
    /// The fields queries find through an index, per record type (a chat server: Speaker `tags`):
    /// an `equals` or `contains` on one of them costs the matches, not the zone.
    public let indexedFields: [String: Set<String>]
    let queue: DatabaseQueue
    let assets: AssetFolder
    let instance: String
    let waiters = ChangeWaiters()

    static let migrations = [
        Migration(version: 1, sql: """
            CREATE TABLE meta (key TEXT PRIMARY KEY, value ANY) STRICT;
            CREATE TABLE zones (
                name TEXT PRIMARY KEY, incarnation TEXT NOT NULL, sequence INTEGER NOT NULL DEFAULT 0,
                changed_at INTEGER NOT NULL) STRICT;
            CREATE TABLE deleted_zones (name TEXT PRIMARY KEY, deleted_at INTEGER NOT NULL) STRICT;
            CREATE TABLE records (
                zone TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, sequence INTEGER NOT NULL,
                clock INTEGER NOT NULL, author BLOB NOT NULL, signature BLOB NOT NULL, record BLOB NOT NULL,
                received_at INTEGER NOT NULL,
                PRIMARY KEY (zone, name)) STRICT;
            CREATE INDEX records_by_sequence ON records (zone, sequence);
            CREATE INDEX records_by_type ON records (zone, type);
            """),
        // Version 2: key chains in the table the stores use too, written with the saves that make them.
        Migration(version: 2, sql: PinTable.schema),
        // Version 3: the values of indexed fields (list items one by one), for queries.
        Migration(version: 3, sql: """
            CREATE TABLE record_index (
                zone TEXT NOT NULL, type TEXT NOT NULL, field TEXT NOT NULL, value BLOB NOT NULL, name TEXT NOT NULL,
                PRIMARY KEY (zone, type, field, value, name)) STRICT, WITHOUT ROWID;
            CREATE INDEX record_index_by_record ON record_index (zone, name);
            """),
    ]

    /// Opens (creating if needed) the storage in `directory`.
    /// - Throws: ``RecordZoneError`` with ``RecordZoneError/Code/ioError`` when the directory or
    ///   database cannot be opened.
    public init(directory: String, policy: RecordPolicy, indexedFields: [String: Set<String>] = [:]) throws(RecordZoneError) {
        self.policy = policy
        self.indexedFields = indexedFields
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            queue = try DatabaseQueue(path: directory + "/zones.sqlite", migrations: Self.migrations)
            instance = try queue.writeNow { db in
                if let existing = try db.first("SELECT value FROM meta WHERE key = 'instance'", [], { $0.text(0) }) { return existing }
                let fresh = UUID().uuidString
                try db.execute("INSERT INTO meta (key, value) VALUES ('instance', ?)", [fresh])
                return fresh
            }
        } catch {
            throw RecordZoneError(.ioError, "cannot open the server storage in \(directory): \(error)")
        }
        assets = AssetFolder(root: directory + "/assets")
        // Chains bound before a restart stay bound, whole: nobody can claim an identity by being
        // first after it, and what a retired key signed before its rotation stays valid.
        do {
            policy.pins.install(try queue.readNow { db in try PinTable.load(from: db) })
        } catch {
            throw RecordZoneError(.ioError, "cannot read the key pins in \(directory): \(error)")
        }
        try rebuildIndexIfDeclarationChanged()
    }

    /// Writes the pins made outside a save (a request that bound its identity) before the
    /// request is answered.
    public func persistPins() async throws(RecordZoneError) {
        guard !policy.pins.changedIdentities.isEmpty else { return }
        try await write { db in try PinTable.saveChanges(of: self.policy.pins, in: db) }
    }

    // MARK: Zones

    public func createZone(_ zone: ZoneName) async throws(RecordZoneError) {
        try await write { db in
            guard try db.first("SELECT 1 FROM zones WHERE name = ?", [zone.rawValue], { _ in true }) == nil else { return }
            let sequence = try Self.nextDatabaseSequence(db)
            try db.execute("INSERT INTO zones (name, incarnation, changed_at) VALUES (?, ?, ?)", [zone.rawValue, UUID().uuidString, sequence])
            try db.execute("DELETE FROM deleted_zones WHERE name = ?", [zone.rawValue])
        }
    }

    public func zones() async throws(RecordZoneError) -> [ZoneName] {
        try await read { db in try db.rows("SELECT name FROM zones ORDER BY name") { $0.text(0) } }.compactMap { try? ZoneName($0) }
    }

    public func deleteZone(_ zone: ZoneName) async throws(RecordZoneError) {
        try await write { db in
            guard try db.first("SELECT 1 FROM zones WHERE name = ?", [zone.rawValue], { _ in true }) != nil else {
                throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
            }
            let sequence = try Self.nextDatabaseSequence(db)
            try db.execute("DELETE FROM records WHERE zone = ?", [zone.rawValue])
            try db.execute("DELETE FROM zones WHERE name = ?", [zone.rawValue])
            try db.execute("INSERT INTO deleted_zones (name, deleted_at) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET deleted_at = excluded.deleted_at",
                           [zone.rawValue, sequence])
        }
        waiters.wake(zone)
    }

    public func fetchDatabaseChanges(since token: ChangeToken?) async throws(RecordZoneError) -> DatabaseChanges {
        try await fetchDatabaseChanges(since: token, visibleTo: { _ in true })
    }

    /// The database change feed, limited to the zones `isVisible` lets through.
    public func fetchDatabaseChanges(since token: ChangeToken?, visibleTo isVisible: @escaping @Sendable (ZoneName) -> Bool) async throws(RecordZoneError) -> DatabaseChanges {
        var since: Int64 = 0
        if let token {
            let contents = try TokenContents(token, expecting: .database, backend: Self.kind)
            guard contents.incarnation == instance else { throw RecordZoneError(.changeTokenExpired, "database token is from another server") }
            since = Int64(bitPattern: SequencePosition.decode(contents.position))
        }
        let position = since
        let (changed, deleted, current) = try await read { db in
            (try db.rows("SELECT name FROM zones WHERE changed_at > ? ORDER BY name", [position]) { $0.text(0) },
             try db.rows("SELECT name FROM deleted_zones WHERE deleted_at > ? ORDER BY name", [position]) { $0.text(0) },
             try Self.databaseSequence(db))
        }
        let next = TokenContents(kind: .database, backend: Self.kind, zone: "", incarnation: instance, position: SequencePosition.encode(UInt64(current)))
        return DatabaseChanges(changedZones: changed.compactMap { try? ZoneName($0) }.filter(isVisible),
                               deletedZones: token == nil ? [] : deleted.compactMap { try? ZoneName($0) }.filter(isVisible), token: next.token)
    }

    // MARK: Changes

    public func fetchChanges(in zone: ZoneName, since token: ChangeToken?, limit: Int) async throws(RecordZoneError) -> ZoneChanges {
        let page = try await changes(in: zone, since: token, limit: limit)
        var records = [Record](), rejected = [RejectedRecord]()
        for signed in page.records {
            do { records.append(try signed.decoded()) } catch {
                rejected.append(RejectedRecord(recordID: nil, reason: .malformed(error.description), source: "server #\(signed.changeTag ?? "?")"))
            }
        }
        return ZoneChanges(records: records, rejected: rejected, token: page.token, moreComing: page.moreComing)
    }

    /// One page of a zone's changes as stored: the records' bytes, not decoded or verified again.
    public func changes(in zone: ZoneName, since token: ChangeToken?, limit: Int) async throws(RecordZoneError) -> Wire.Changes {
        let limit = BackendLimits.clampPage(limit)
        let (incarnation, zoneSequence, rows) = try await read { db in
            guard let (incarnation, sequence) = try db.first("SELECT incarnation, sequence FROM zones WHERE name = ?", [zone.rawValue], { ($0.text(0), $0.int(1)) }) else {
                throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
            }
            let since = try TokenContents.zonePosition(token, backend: Self.kind, zone: zone, incarnation: incarnation).map { Int64(bitPattern: SequencePosition.decode($0)) } ?? 0
            let rows = try db.rows("SELECT record, sequence, received_at FROM records WHERE zone = ? AND sequence > ? ORDER BY sequence LIMIT ?",
                                   [zone.rawValue, since, limit + 1]) { Wire.SignedRecord(bytes: $0.blob(0), changeTag: String($0.int(1)), receivedAt: $0.int(2)) }
            return (incarnation, sequence, rows)
        }
        let moreComing = rows.count > limit
        let page = Array(rows.prefix(limit))
        let position = moreComing ? (page.last?.changeTag.flatMap { Int64($0) } ?? 0) : zoneSequence
        let next = TokenContents(kind: .zone, backend: Self.kind, zone: zone.rawValue, incarnation: incarnation, position: SequencePosition.encode(UInt64(position)))
        return Wire.Changes(records: page, token: next.token, moreComing: moreComing)
    }

    public func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
        let generation = waiters.generation(of: zone)
        let moved = try await read { db in
            guard let (incarnation, sequence) = try db.first("SELECT incarnation, sequence FROM zones WHERE name = ?", [zone.rawValue], { ($0.text(0), $0.int(1)) }) else {
                throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
            }
            let since = try TokenContents.zonePosition(token, backend: Self.kind, zone: zone, incarnation: incarnation).map { Int64(bitPattern: SequencePosition.decode($0)) } ?? 0
            return sequence > since
        }
        if moved { return true }
        return await waiters.wait(for: zone, after: generation, timeout: timeout)
    }

    /// How many callers wait in ``waitForChanges(in:since:timeout:)`` now.
    public var waitingCount: Int { waiters.count }

    /// Releases every waiting caller, and answers later ones at once (the server is stopping).
    public func releaseWaiters() { waiters.releaseAll() }

    // MARK: Records

    public func save(_ records: [Record], policy savePolicy: SavePolicy) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try BackendLimits.checkBatch(records.count)
        let admitted = SaveChecks.admit(records, policy: policy)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let (results, touched) = try await write { db in
            var results = [Result<Record, RecordZoneError>]()
            // Each zone's sequence is read once and written back once, after the batch.
            var sequences = [ZoneName: Int64](), missing = Set<ZoneName>(), touched = Set<ZoneName>()
            for (record, outcome) in zip(records, admitted) {
                let zone = record.id.zone
                if sequences[zone] == nil, !missing.contains(zone) {
                    if let sequence = try db.first("SELECT sequence FROM zones WHERE name = ?", [zone.rawValue], { $0.int(0) }) {
                        sequences[zone] = sequence
                    } else {
                        missing.insert(zone)
                    }
                }
                guard let current = sequences[zone] else {
                    results.append(.failure(RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist", recordID: record.id)))
                    continue
                }
                let encoded: Data
                switch SaveChecks.decide(record, admitted: outcome, current: try Self.current(record.id, in: db), policy: savePolicy) {
                case .refused(let error): results.append(.failure(error)); continue
                case .superseded(let winner): results.append(.success(winner)); continue
                case .store(let bytes): encoded = bytes
                }
                let sequence = current + 1
                sequences[zone] = sequence
                touched.insert(zone)
                try db.execute("""
                    INSERT INTO records (zone, name, type, sequence, clock, author, signature, record, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT (zone, name) DO UPDATE SET type = excluded.type, sequence = excluded.sequence, clock = excluded.clock,
                        author = excluded.author, signature = excluded.signature, record = excluded.record, received_at = excluded.received_at
                    """, [zone.rawValue, record.id.name, record.recordType, sequence, record.clock.rawValue, record.authorKey, record.signature, encoded, now])
                try self.index(record, in: db)
                var stored = record
                stored.serverMetadata = ServerMetadata(changeTag: String(sequence), receivedAt: Date(timeIntervalSince1970: Double(now) / 1000))
                results.append(.success(stored))
            }
            // The pins this batch made commit with its records, or not at all.
            try PinTable.saveChanges(of: self.policy.pins, in: db)
            if !touched.isEmpty {
                let changedAt = try Self.nextDatabaseSequence(db)
                for zone in touched {
                    try db.execute("UPDATE zones SET sequence = ?, changed_at = ? WHERE name = ?", [sequences[zone] ?? 0, changedAt, zone.rawValue])
                }
            }
            return (results, touched)
        }
        touched.forEach(waiters.wake)
        return results
    }

    public func fetch(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try await stored(ids).map { result in
            result.flatMap { signed in
                Result { () throws(RecordDecodingError) in try signed.decoded() }.mapError { RecordZoneError(.malformed, "stored record: \($0)") }
            }
        }
    }

    /// The stored bytes of each record, in one read transaction.
    public func stored(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Wire.SignedRecord, RecordZoneError>] {
        try BackendLimits.checkBatch(ids.count)
        return try await read { db in
            var zones = [ZoneName: Bool]()
            return try ids.map { id in
                if zones[id.zone] == nil {
                    zones[id.zone] = try db.first("SELECT 1 FROM zones WHERE name = ?", [id.zone.rawValue], { _ in true }) != nil
                }
                guard zones[id.zone] == true else {
                    return .failure(RecordZoneError(.zoneNotFound, "zone '\(id.zone)' does not exist", recordID: id))
                }
                guard let signed = try db.first("SELECT record, sequence, received_at FROM records WHERE zone = ? AND name = ?", [id.zone.rawValue, id.name], {
                    Wire.SignedRecord(bytes: $0.blob(0), changeTag: String($0.int(1)), receivedAt: $0.int(2))
                }) else {
                    return .failure(RecordZoneError(.unknownItem, "no record \(id)", recordID: id))
                }
                return .success(signed)
            }
        }
    }

    public func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) async throws(RecordZoneError) -> QueryResult {
        let lookup = indexLookup(for: query)
        let rows = try await read { db in
            guard try db.first("SELECT 1 FROM zones WHERE name = ?", [query.zone.rawValue], { _ in true }) != nil else {
                throw RecordZoneError(.zoneNotFound, "zone '\(query.zone)' does not exist")
            }
            if let (field, value) = lookup {
                // The index narrows to candidates; the query's own predicates decide below.
                return try db.rows("""
                    SELECT r.record, r.sequence FROM record_index i JOIN records r ON r.zone = i.zone AND r.name = i.name
                    WHERE i.zone = ? AND i.type = ? AND i.field = ? AND i.value = ? AND r.type = ?
                    """, [query.zone.rawValue, query.recordType, field, value, query.recordType]) { ($0.blob(0), $0.int(1)) }
            }
            return try db.rows("SELECT record, sequence FROM records WHERE zone = ? AND type = ?", [query.zone.rawValue, query.recordType]) { ($0.blob(0), $0.int(1)) }
        }
        let records = rows.compactMap { row -> Record? in
            try? Wire.SignedRecord(bytes: row.0, changeTag: String(row.1)).decoded()
        }
        return try query.run(over: records, cursor: cursor, limit: limit)
    }

    public func putAsset(_ data: Data, expected: AssetReference?) async throws(RecordZoneError) -> AssetReference {
        try assets.put(data, expected: expected)
    }

    public func asset(_ reference: AssetReference) async throws(RecordZoneError) -> Data {
        try assets.get(reference)
    }

    /// How many records the server holds.
    public func recordCount() async throws(RecordZoneError) -> Int {
        try await read { db in Int(try db.first("SELECT count(*) FROM records") { $0.int(0) } ?? 0) }
    }

    // MARK: Query index

    /// The key an indexed value is stored under: its JSON form, keys sorted (exact and stable).
    private static func indexKey(_ value: FieldValue) -> Data? {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return try? encoder.encode(value)
    }

    /// An `equals` or `contains` predicate on an indexed field, as a lookup (nil: scan the type).
    private func indexLookup(for query: RecordQuery) -> (String, Data)? {
        guard let fields = indexedFields[query.recordType] else { return nil }
        for predicate in query.predicates {
            switch predicate {
            case .equals(let field, let value) where fields.contains(field) && value.listValue == nil,
                .contains(let field, let value) where fields.contains(field):
                if let key = Self.indexKey(value) { return (field, key) }
            default: continue
            }
        }
        return nil
    }

    /// Replaces a record's index rows with those of this version (none for a tombstone).
    private func index(_ record: Record, in db: Database) throws {
        guard !indexedFields.isEmpty else { return }
        try db.execute("DELETE FROM record_index WHERE zone = ? AND name = ?", [record.id.zone.rawValue, record.id.name])
        guard !record.isDeleted, let fields = indexedFields[record.recordType] else { return }
        for field in fields.sorted() {
            guard let value = record[field] else { continue }
            for item in Set((value.listValue ?? [value]).compactMap(Self.indexKey)) {
                try db.execute("INSERT OR IGNORE INTO record_index (zone, type, field, value, name) VALUES (?, ?, ?, ?, ?)",
                               [record.id.zone.rawValue, record.recordType, field, item, record.id.name])
            }
        }
    }

    /// Rebuilds the index when the declared fields differ from those it was built for.
    private func rebuildIndexIfDeclarationChanged() throws(RecordZoneError) {
        let declaration = indexedFields.keys.sorted().map { "\($0):\(indexedFields[$0, default: []].sorted().joined(separator: ","))" }.joined(separator: ";")
        do { try queue.writeNow { db in try rebuild(declaration, in: db) } } catch { throw Self.storageError(error) }
    }

    private func rebuild(_ declaration: String, in db: Database) throws {
        do {
            guard try db.first("SELECT value FROM meta WHERE key = 'indexed_fields'", [], { $0.text(0) }) != declaration else { return }
            try db.execute("DELETE FROM record_index")
            for type in indexedFields.keys.sorted() {
                let rows = try db.rows("SELECT record FROM records WHERE type = ?", [type]) { $0.blob(0) }
                for bytes in rows {
                    if let record = try? Record(canonical: bytes) { try index(record, in: db) }
                }
            }
            try db.execute("INSERT INTO meta (key, value) VALUES ('indexed_fields', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", [declaration])
        }
    }

    // MARK: Test support

    /// Creates many zones in one transaction (seeding a large server for a test).
    func createZones(_ zones: [ZoneName]) async throws(RecordZoneError) {
        try await write { db in
            let sequence = try Self.nextDatabaseSequence(db)
            for zone in zones {
                try db.execute("INSERT INTO zones (name, incarnation, changed_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING", [zone.rawValue, UUID().uuidString, sequence])
            }
        }
    }

    /// Stores raw bytes as a broken or hostile writer would, bypassing every check.
    func injectUnchecked(_ data: Data, into zone: ZoneName, name: String) async throws(RecordZoneError) {
        try await write { db in
            try db.execute("UPDATE zones SET sequence = sequence + 1, changed_at = ? WHERE name = ?", [try Self.nextDatabaseSequence(db), zone.rawValue])
            let sequence = try db.first("SELECT sequence FROM zones WHERE name = ?", [zone.rawValue]) { $0.int(0) } ?? 0
            try db.execute("INSERT OR REPLACE INTO records (zone, name, type, sequence, clock, author, signature, record, received_at) VALUES (?, ?, 'Injected', ?, 0, x'', x'', ?, 0)",
                           [zone.rawValue, name, sequence, data])
        }
        waiters.wake(zone)
    }

    // MARK: Helpers

    private static func current(_ id: RecordID, in db: Database) throws -> Record? {
        guard let (bytes, sequence) = try db.first("SELECT record, sequence FROM records WHERE zone = ? AND name = ?", [id.zone.rawValue, id.name], { ($0.blob(0), $0.int(1)) }),
            var record = try? Record(canonical: bytes)
        else { return nil }
        record.serverMetadata = ServerMetadata(changeTag: String(sequence))
        return record
    }

    private static func databaseSequence(_ db: Database) throws -> Int64 {
        try db.first("SELECT value FROM meta WHERE key = 'database_sequence'") { $0.int(0) } ?? 0
    }

    private static func nextDatabaseSequence(_ db: Database) throws -> Int64 {
        let next = try databaseSequence(db) + 1
        try db.execute("INSERT INTO meta (key, value) VALUES ('database_sequence', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", [next])
        return next
    }

    /// Runs on the reader's queue, off Swift's cooperative pool.
    private func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws(RecordZoneError) -> T {
        do { return try await queue.read(body) } catch { throw Self.storageError(error) }
    }

    /// Runs on the writer's queue, off Swift's cooperative pool.
    private func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws(RecordZoneError) -> T {
        do { return try await queue.write(body) } catch { throw Self.storageError(error) }
    }

    /// A full disk (`SQLITE_FULL`) is transient for clients: 503 with `Retry-After`, so they
    /// keep their changes and try again; anything else is the server's own fault.
    static func storageError(_ error: any Error) -> RecordZoneError {
        if let error = error as? RecordZoneError { return error }
        if let error = error as? SQLiteError, error.code & 0xFF == 13 {
            var full = RecordZoneError(.serviceUnavailable, "the server's disk is full; try again later")
            full.retryAfter = 60
            return full
        }
        return RecordZoneError(.internalError, "server storage: \(error)")
    }
}
