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
public final class SQLiteZoneStorage: ZoneStorage, Sendable {
    static let kind = "server"

    public let policy: RecordPolicy
    /// The fields queries find through an index, per record type (a chat server: Speaker `tags`).
    public let queryIndex: QueryIndex
    let queue: DatabaseQueue
    /// The database file, for a connection of its own (``zoneSize(_:)``).
    let databasePath: String
    let assets: AssetFolder
    let instance: String
    public let waiters = ChangeWaiters()
    public let typing = TypingBoard()
    public let presence = PresenceBoard()
    let nonces = NonceMemory()
    let governed = GovernedZoneCache()

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
        // Version 4: the feed (and each save's catch-up) reads the zones changed since a token,
        // not every zone.
        Migration(version: 4, sql: """
            CREATE INDEX zones_by_change ON zones (changed_at);
            CREATE INDEX deleted_zones_by_time ON deleted_zones (deleted_at);
            """),
        // Version 5: a governed zone's mark (the highest sequence of its governing type) is one seek.
        Migration(version: 5, sql: """
            CREATE INDEX records_by_type_sequence ON records (zone, type, sequence);
            DROP INDEX records_by_type;
            """),
    ]

    /// Opens (creating if needed) the storage in `directory`.
    /// - Throws: ``RecordZoneError`` with ``RecordZoneError/Code/ioError`` when the directory or
    ///   database cannot be opened.
    public init(directory: String, policy: RecordPolicy, indexedFields: [String: Set<String>] = [:]) throws(RecordZoneError) {
        self.policy = policy
        queryIndex = QueryIndex(indexedFields)
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            databasePath = directory + "/zones.sqlite"
            queue = try DatabaseQueue(path: databasePath, migrations: Self.migrations)
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
    /// request is answered. One server holds the file: its pins in memory are the truth.
    public func persistPins(for identity: String) async throws(RecordZoneError) {
        guard !policy.pins.changedIdentities.isEmpty else { return }
        _ = try await write { db in try PinTable.saveChanges(of: self.policy.pins, in: db) }
    }

    /// Nonces live in memory: one server uses the file. A request captured before a restart
    /// could be replayed after it while still fresh (within the clock skew; see docs/LIMITS.md).
    public func claimNonce(_ nonce: Data, at time: Date, horizon: TimeInterval) async throws(RecordZoneError) -> Bool {
        nonces.claim(nonce, at: time, horizon: horizon)
    }

    public func healthProblem() async -> String? { nil }
    public func metricsText() -> String { "" }

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

    public func fetchDatabaseChanges(since token: ChangeToken?, visibleTo isVisible: @escaping @Sendable (ZoneName) -> Bool) async throws(RecordZoneError) -> DatabaseChanges {
        let position = try TokenContents.databasePosition(token, backend: Self.kind, instance: instance)
        let instance = self.instance
        let (changes, current) = try await read { db in
            (try Self.feed(since: position, isInitial: token == nil, instance: instance, in: db), try Self.databaseSequence(db))
        }
        try TokenContents.refuseAhead(position, of: current, "the server's database")
        return changes.filtered(isVisible)
    }

    /// The zones changed and deleted after `position` (none deleted for a first feed), and the
    /// token of where the database stands.
    private static func feed(since position: Int64, isInitial: Bool, instance: String, in db: Database) throws -> DatabaseChanges {
        // Sorted here, not by the query: an ORDER BY name would make SQLite walk every zone by
        // name instead of seeking the few changed ones by `changed_at`.
        let changed = try db.rows("SELECT name FROM zones WHERE changed_at > ?", [position]) { $0.text(0) }.sorted()
        let deleted = isInitial ? [] : try db.rows("SELECT name FROM deleted_zones WHERE deleted_at > ?", [position]) { $0.text(0) }.sorted()
        return DatabaseChanges(changedZones: changed.compactMap { try? ZoneName($0) }, deletedZones: deleted.compactMap { try? ZoneName($0) },
                               token: TokenContents.databaseToken(backend: kind, instance: instance, position: try databaseSequence(db)))
    }

    // MARK: Changes

    public func changes(in zone: ZoneName, since token: ChangeToken?, limit: Int, readable: ReadableVersions?) async throws(RecordZoneError) -> Wire.Changes {
        let limit = BackendLimits.clampPage(limit)
        let (incarnation, zoneSequence, rows) = try await read { db in
            guard let (incarnation, sequence) = try db.first("SELECT incarnation, sequence FROM zones WHERE name = ?", [zone.rawValue], { ($0.text(0), $0.int(1)) }) else {
                throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
            }
            let since = try TokenContents.zoneSequence(token, backend: Self.kind, zone: zone, incarnation: incarnation, current: sequence)
            let rows = try db.rows("SELECT record, sequence, received_at, type, clock FROM records WHERE zone = ? AND sequence > ? ORDER BY sequence LIMIT ?",
                                   [zone.rawValue, since, limit + 1]) { row in
                (signed: Wire.SignedRecord(bytes: row.blob(0), changeTag: String(row.int(1)), receivedAt: row.int(2)), sequence: row.int(1), type: row.text(3),
                 clock: RecordClock(rawValue: UInt64(bitPattern: row.int(4))))
            }
            return (incarnation, sequence, rows)
        }
        let moreComing = rows.count > limit
        let page = Array(rows.prefix(limit))
        let position = moreComing ? (page.last?.sequence ?? 0) : zoneSequence
        let next = TokenContents(kind: .zone, backend: Self.kind, zone: zone.rawValue, incarnation: incarnation, position: SequencePosition.encode(UInt64(position)))
        // Versions the reader may not read are left out; the token still passes them.
        let records = page.filter { readable?.allows($0.type, $0.clock) ?? true }.map(\.signed)
        return Wire.Changes(records: records, token: next.token, moreComing: moreComing)
    }

    public func governed(_ zones: [ZoneName], by governance: any ZoneGovernance) async throws(RecordZoneError) -> [ZoneName: any GovernedZone] {
        var types = [ZoneName: String]()
        for zone in zones { if let type = governance.governingType(of: zone) { types[zone] = type } }
        guard !types.isEmpty else { return [:] }
        let found = types
        return try await read { db in try self.governedStates(found, governance: governance, keep: true, in: db).states }
    }

    /// The states of governed zones (`zones`: each with its governing type) as stored in `db`,
    /// with their marks: from memory where the mark holds, otherwise decided from the records.
    /// A zone that does not exist has neither.
    /// - Parameters:
    ///   - keep: keep what was decided (only from a read: a write's own transaction may still
    ///     roll back).
    ///   - taking: zones whose kept state is taken out of memory (a save that may change it).
    private func governedStates(_ zones: [ZoneName: String], governance: any ZoneGovernance, keep: Bool, taking: Set<ZoneName> = [],
                                in db: Database) throws -> (states: [ZoneName: any GovernedZone], marks: [ZoneName: GoverningMark]) {
        var states = [ZoneName: any GovernedZone](), marks = [ZoneName: GoverningMark]()
        for (zone, type) in zones {
            guard let incarnation = try db.first("SELECT incarnation FROM zones WHERE name = ?", [zone.rawValue], { $0.text(0) }) else { continue }
            let sequence = try db.first("SELECT coalesce(max(sequence), 0) FROM records WHERE zone = ? AND type = ?", [zone.rawValue, type]) { $0.int(0) } ?? 0
            let mark = GoverningMark(incarnation: incarnation, sequence: sequence)
            marks[zone] = mark
            if let state = governed.state(of: zone, at: mark, taking: taking.contains(zone)) {
                states[zone] = state
            } else {
                let records = try db.rows("SELECT record FROM records WHERE zone = ? AND type = ?", [zone.rawValue, type]) { try? Record(canonical: $0.blob(0)) }
                let state = governance.decide(zone, governing: records.compactMap { $0 })
                if keep { governed.keep(state, of: zone, at: mark) }
                states[zone] = state
            }
        }
        return (states, marks)
    }

    public func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
        let generation = waiters.generation(of: zone)
        let moved = try await read { db in
            guard let (incarnation, sequence) = try db.first("SELECT incarnation, sequence FROM zones WHERE name = ?", [zone.rawValue], { ($0.text(0), $0.int(1)) }) else {
                throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
            }
            let since = try TokenContents.zoneSequence(token, backend: Self.kind, zone: zone, incarnation: incarnation, current: sequence)
            return sequence > since
        }
        if moved { return true }
        return await waiters.wait(for: zone, after: generation, timeout: timeout)
    }

    public var waitingCount: Int { waiters.count }

    public func releaseWaiters() {
        waiters.releaseAll()
        typing.releaseAll()
        presence.releaseAll()
    }

    // MARK: Records

    public func save(_ records: [Record], policy savePolicy: SavePolicy, feedSince token: ChangeToken?,
                     visibleTo isVisible: @escaping @Sendable (ZoneName) -> Bool, gate: SaveGate?) async throws(RecordZoneError) -> SaveAnswer {
        try BackendLimits.checkBatch(records.count)
        // Signatures before the transaction (in parallel); ownership inside it, where saves
        // take turns, so each decides against the pins the one before it stored.
        let verified = SaveChecks.verify(records, policy: policy)
        let policy = self.policy
        let instance = self.instance
        let feedPosition = token.flatMap { try? TokenContents.databasePosition($0, backend: Self.kind, instance: instance) }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let (answer, touched, _, _) = try await writeGrouped({ db in
            var results = [Result<Record, RecordZoneError>]()
            // Each zone's sequence is read once and written back once, after the batch.
            var zones = [ZoneName: (incarnation: String, before: Int64)](), sequences = [ZoneName: Int64]()
            var missing = Set<ZoneName>(), touched = Set<ZoneName>()
            // Governed zones: their states as stored, decided under the writer's lock.
            var governedStates = [ZoneName: any GovernedZone](), marks = [ZoneName: GoverningMark](), takenIn = [Int]()
            let gateOutcomes = { (outcomes: [Result<Data, RecordZoneError>]) throws -> [Result<Data, RecordZoneError>] in
                guard let gate else { return outcomes }
                let zones = gate.governedZones(of: records)
                guard !zones.isEmpty else { return outcomes }
                (governedStates, marks) = try self.governedStates(zones, governance: gate.governance, keep: false, taking: gate.zonesChangingGovernance(of: records), in: db)
                let gated = gate.apply(records, outcomes: outcomes, states: governedStates) { try? policy.rules.owner(of: $0)?.get() }
                (governedStates, takenIn) = (gated.states, gated.takenIn)
                return gated.outcomes
            }
            var storedSequences = [Int: Int64]()
            let plan = try SaveChecks.plan(records, verified: verified, savePolicy: savePolicy, policy: policy, gate: gateOutcomes) { record in
                let zone = record.id.zone
                if zones[zone] == nil, !missing.contains(zone) {
                    if let (incarnation, sequence) = try db.first("SELECT incarnation, sequence FROM zones WHERE name = ?", [zone.rawValue], { ($0.text(0), $0.int(1)) }) {
                        zones[zone] = (incarnation, sequence)
                        sequences[zone] = sequence
                    } else {
                        missing.insert(zone)
                    }
                }
                guard zones[zone] != nil else { return .failure(RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist", recordID: record.id)) }
                return .success(try Self.current(record.id, in: db))
            }
            for (index, (record, decision)) in zip(records, plan.decisions).enumerated() {
                let zone = record.id.zone
                let encoded: Data
                switch decision {
                case .refused(let error): results.append(.failure(error)); continue
                case .superseded(let winner): results.append(.success(winner)); continue
                case .store(let bytes): encoded = bytes
                }
                let sequence = (sequences[zone] ?? 0) + 1
                sequences[zone] = sequence
                storedSequences[index] = sequence
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
            // Exactly the chains of what this batch stores commit with it, or not at all; they
            // become the shared pins after the commit.
            try PinTable.save(plan.pins, in: db)
            if !touched.isEmpty {
                let changedAt = try Self.nextDatabaseSequence(db)
                for zone in touched {
                    try db.execute("UPDATE zones SET sequence = ?, changed_at = ? WHERE name = ?", [sequences[zone] ?? 0, changedAt, zone.rawValue])
                }
            }
            // The catch-up, read where the batch is written: nobody writes in between.
            var catchUp = SaveCatchUp(zones: touched.sorted().compactMap { zone in
                guard let (incarnation, before) = zones[zone], let after = sequences[zone] else { return nil }
                func token(_ position: Int64) -> ChangeToken {
                    TokenContents(kind: .zone, backend: Self.kind, zone: zone.rawValue, incarnation: incarnation, position: SequencePosition.encode(UInt64(position))).token
                }
                return ZoneAdvance(zone: zone, from: before == 0 ? nil : token(before), to: token(after))
            })
            if let feedPosition, feedPosition <= (try Self.databaseSequence(db)) {
                catchUp.database = try Self.feed(since: feedPosition, isInitial: false, instance: instance, in: db)
            }
            // Governed zones' states are kept once this commits (a transaction rolled back would
            // give its sequences to other records: a mark must never name what did not commit).
            let states = governedStates, settled = marks, taken = takenIn, storedAt = storedSequences
            let governed = self.governed
            let keepStates: @Sendable () -> Void = {
                if let gate, !states.isEmpty { governed.settle(records, gate: gate, states: states, marks: settled, takenIn: taken, stored: storedAt) }
            }
            return (SaveAnswer(results: results, catchUp: catchUp), touched, plan.pins, keepStates)
        }, afterCommit: { policy.pins.publish($0.2); $0.3() }, commitsAlone: { !$0.2.isEmpty })
        touched.forEach(waiters.wake)
        for zone in gate?.zonesChangingGovernance(of: records) ?? [] where touched.contains(zone) { waiters.wakeReaders(of: zone) }
        return SaveAnswer(results: answer.results, catchUp: answer.catchUp.filteringFeed(isVisible))
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
        let lookup = queryIndex.lookup(for: query)
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

    public func recordCount() async throws(RecordZoneError) -> Int {
        try await read { db in Int(try db.first("SELECT count(*) FROM records") { $0.int(0) } ?? 0) }
    }

    public func zoneListing(after: String?, limit: Int) async throws(RecordZoneError) -> [ZoneListing] {
        try await read { db in
            try db.rows("SELECT name, sequence FROM zones WHERE name > ? ORDER BY name LIMIT ?", [after ?? "", Int64(limit)]) {
                ZoneListing(name: $0.text(0), sequence: $0.int(1))
            }
        }
    }

    public func recordPage(in zone: ZoneName, after: String?, limit: Int) async throws(RecordZoneError) -> [Wire.SignedRecord] {
        let page = try await read { db -> [Wire.SignedRecord]? in
            guard try db.first("SELECT 1 FROM zones WHERE name = ?", [zone.rawValue], { _ in true }) != nil else { return nil }
            return try db.rows("SELECT record, sequence, received_at FROM records WHERE zone = ? AND name > ? ORDER BY name LIMIT ?",
                               [zone.rawValue, after ?? "", Int64(limit)]) {
                Wire.SignedRecord(bytes: $0.blob(0), changeTag: String($0.int(1)), receivedAt: $0.int(2))
            }
        }
        guard let page else { throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist") }
        return page
    }

    /// On a connection of its own, off the pool: the count reads every row of the zone (a
    /// third of a second for a million), and the one reader the API shares must not wait for it.
    public func zoneSize(_ zone: ZoneName) async throws(RecordZoneError) -> (records: Int, bytes: Int) {
        let path = databasePath
        let size: (Int, Int)?
        do {
            size = try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<(Int, Int)?, any Error>) in
                DispatchQueue.global(qos: .utility).async {
                    continuation.resume(with: Result {
                        let db = try Database(path: path, readOnly: true)
                        guard try db.first("SELECT 1 FROM zones WHERE name = ?", [zone.rawValue], { _ in true }) != nil else { return nil }
                        return try db.first("SELECT count(*), coalesce(sum(length(record)), 0) FROM records WHERE zone = ?", [zone.rawValue]) { (Int($0.int(0)), Int($0.int(1))) } ?? (0, 0)
                    })
                }
            }
        } catch {
            throw Self.storageError(error)
        }
        guard let size else { throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist") }
        return size
    }

    // MARK: Query index

    /// Replaces a record's index rows with those of this version (none for a tombstone).
    private func index(_ record: Record, in db: Database) throws {
        guard !queryIndex.isEmpty else { return }
        try db.execute("DELETE FROM record_index WHERE zone = ? AND name = ?", [record.id.zone.rawValue, record.id.name])
        for (field, value) in queryIndex.entries(of: record) {
            try db.execute("INSERT OR IGNORE INTO record_index (zone, type, field, value, name) VALUES (?, ?, ?, ?, ?)",
                           [record.id.zone.rawValue, record.recordType, field, value, record.id.name])
        }
    }

    /// Rebuilds the index when the declared fields differ from those it was built for.
    private func rebuildIndexIfDeclarationChanged() throws(RecordZoneError) {
        do { try queue.writeNow { db in try rebuild(queryIndex.declaration, in: db) } } catch { throw Self.storageError(error) }
    }

    private func rebuild(_ declaration: String, in db: Database) throws {
        do {
            guard try db.first("SELECT value FROM meta WHERE key = 'indexed_fields'", [], { $0.text(0) }) != declaration else { return }
            try db.execute("DELETE FROM record_index")
            for type in queryIndex.fields.keys.sorted() {
                let rows = try db.rows("SELECT record FROM records WHERE type = ?", [type]) { $0.blob(0) }
                for bytes in rows {
                    if let record = try? Record(canonical: bytes) { try index(record, in: db) }
                }
            }
            try db.execute("INSERT INTO meta (key, value) VALUES ('indexed_fields', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", [declaration])
        }
    }

    /// Fills a zone with `count` filler rows (not records: 200 bytes each, never served to a
    /// verifying reader), so the bench can measure saves and fetches in a zone of that size.
    /// With `record`: those bytes in every row (a real record's, to decode and verify).
    package func fillForBenchmark(_ zone: ZoneName, count: Int, record: Data? = nil) async throws(RecordZoneError) {
        try await write { db in
            let start = try db.first("SELECT sequence FROM zones WHERE name = ?", [zone.rawValue]) { $0.int(0) } ?? 0
            try db.execute("""
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
                INSERT INTO records (zone, name, type, sequence, clock, author, signature, record, received_at)
                SELECT ?, printf('filler-%09d', i), 'Filler', ? + i, i, x'00', x'00', coalesce(?, zeroblob(200)), 0 FROM n
                """, [Int64(count), zone.rawValue, start, record])
            try db.execute("UPDATE zones SET sequence = ?, changed_at = ? WHERE name = ?", [start + Int64(count), try Self.nextDatabaseSequence(db), zone.rawValue])
        }
    }

    // MARK: Helpers

    private static func current(_ id: RecordID, in db: Database) throws -> Record? {
        guard let (bytes, sequence, received) = try db.first("SELECT record, sequence, received_at FROM records WHERE zone = ? AND name = ?", [id.zone.rawValue, id.name],
                                                             { ($0.blob(0), $0.int(1), $0.int(2)) }),
            var record = try? Record(canonical: bytes)
        else { return nil }
        // With when it was received: a version saved again as it is answers with both.
        record.serverMetadata = ServerMetadata(changeTag: String(sequence), receivedAt: Date(timeIntervalSince1970: Double(received) / 1000))
        return record
    }

    private static func databaseSequence(_ db: Database) throws -> Int64 {
        try db.first("SELECT value FROM meta WHERE key = 'database_sequence'") { $0.int(0) } ?? 0
    }

    static func nextDatabaseSequence(_ db: Database) throws -> Int64 {
        let next = try databaseSequence(db) + 1
        try db.execute("INSERT INTO meta (key, value) VALUES ('database_sequence', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", [next])
        return next
    }

    /// Runs on the reader's queue, off Swift's cooperative pool.
    private func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws(RecordZoneError) -> T {
        do { return try await queue.read(body) } catch { throw Self.storageError(error) }
    }

    /// Runs on the writer's queue, off Swift's cooperative pool.
    private func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T, afterCommit: @escaping @Sendable (T) -> Void = { _ in }) async throws(RecordZoneError) -> T {
        do { return try await queue.write(body, afterCommit: afterCommit) } catch { throw Self.storageError(error) }
    }

    /// ``write(_:afterCommit:)`` in the writer's next group commit (saves from many clients at
    /// once share one sync); one that binds keys commits alone, so the next save sees them.
    private func writeGrouped<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T, afterCommit: @escaping @Sendable (T) -> Void,
                                           commitsAlone: @escaping @Sendable (T) -> Bool) async throws(RecordZoneError) -> T {
        do { return try await queue.writeGrouped(body, afterCommit: afterCommit, commitsAlone: commitsAlone) } catch { throw Self.storageError(error) }
    }

    /// A full disk (`SQLITE_FULL`) is transient for clients: 503 with `Retry-After`, so they
    /// keep their changes and try again; anything else is the server's own fault.
    static func storageError(_ error: any Error) -> RecordZoneError {
        if let error = error as? RecordZoneError { return error }
        if let error = error as? SQLiteError, error.resultCode == .full {
            var full = RecordZoneError(.serviceUnavailable, "the server's disk is full; try again later")
            full.retryAfter = 60
            return full
        }
        return RecordZoneError(.internalError, "server storage: \(error)")
    }
}
