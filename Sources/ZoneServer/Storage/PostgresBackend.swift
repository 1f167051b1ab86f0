import Foundation
import PostgresKit
import RecordZone
import Synchronization

/// The zone server's storage on PostgreSQL, shared by any number of `convkitd serve` processes
/// that then behave as one server: the same contract as ``SQLiteBackend`` (one conformance
/// suite), with everything a server must agree on kept in the database.
///
/// - **Sequences.** A save locks its zones' rows (`FOR UPDATE`, in name order) and assigns each
///   zone's sequence inside the transaction that stores the batch, so a zone's changes commit
///   in sequence order on every server. Zone tokens carry the zone's incarnation and sequence.
/// - **Database feed.** A zone row records the transaction that last changed it
///   (`pg_current_xact_id()`); a database token holds the oldest transaction still running when
///   it was issued (`pg_snapshot_xmin`), so a change committing later, through any server, is
///   never behind a token already handed out.
/// - **Pins.** Chains are rows with versions. Each server holds them in memory (refreshed on
///   `NOTIFY ck_pins`) and a save compares, under the rows' locks, the versions its admission
///   used with the database's: a chain changed through another server sends the save round
///   again with the new chain. Binding on first use inserts a row; the first server wins.
/// - **Nonces** are rows (`ck_nonces`): a request replayed on another server is refused.
/// - **Wake-ups.** A commit notifies `ck_changes` with its zone; every server's listener wakes
///   its long polls. A lost listener connection wakes every poll when it is back.
/// - **Assets** are rows of 1 MiB chunks: backing up the database backs up everything.
///
/// Connection failures answer 503 with `Retry-After` (clients keep their changes and retry);
/// the pool and the listener reconnect by themselves when the database is back.
public final class PostgresBackend: ZoneStorage, Sendable {
    static let kind = "server"
    static let chunkSize = 1 << 20

    public let policy: RecordPolicy
    public let queryIndex: QueryIndex
    let pool: PostgresPool
    /// The database's identity in database tokens: its instance (made at its first migration)
    /// and its cluster's system identifier, so a restore into another cluster expires them.
    let instance: String
    let waiters = ChangeWaiters()
    private let listener: Listener

    /// The pin versions this server's chains came from, and where its next look at the table
    /// starts (a transaction horizon, as the database feed's: a chain committed later is never
    /// behind it).
    private struct PinVersions {
        var known = [String: Int64]()
        var horizon: Int64 = 0
    }
    private let pinVersions = Mutex(PinVersions())
    private let nonceClaims = Atomic<Int>(0)

    static let migrations: [(version: Int, sql: String)] = [
        (1, """
            CREATE TABLE ck_meta (key text PRIMARY KEY, value text NOT NULL);
            CREATE TABLE ck_zones (
                name text PRIMARY KEY, incarnation text NOT NULL, sequence bigint NOT NULL DEFAULT 0, changed_xid bigint NOT NULL);
            CREATE INDEX ck_zones_by_change ON ck_zones (changed_xid);
            CREATE TABLE ck_deleted_zones (name text PRIMARY KEY, deleted_xid bigint NOT NULL);
            CREATE TABLE ck_records (
                zone text NOT NULL, name text NOT NULL, type text NOT NULL, sequence bigint NOT NULL,
                clock bigint NOT NULL, author bytea NOT NULL, signature bytea NOT NULL, record bytea NOT NULL,
                received_at bigint NOT NULL, PRIMARY KEY (zone, name));
            CREATE INDEX ck_records_by_sequence ON ck_records (zone, sequence);
            CREATE INDEX ck_records_by_type ON ck_records (zone, type);
            CREATE TABLE ck_record_index (
                zone text NOT NULL, type text NOT NULL, field text NOT NULL, value bytea NOT NULL, name text NOT NULL,
                PRIMARY KEY (zone, type, field, value, name));
            CREATE INDEX ck_record_index_by_record ON ck_record_index (zone, name);
            CREATE SEQUENCE ck_pin_versions;
            CREATE TABLE ck_pins (
                identity text PRIMARY KEY, chain bytea NOT NULL, version bigint NOT NULL,
                changed_xid bigint NOT NULL DEFAULT pg_current_xact_id()::text::bigint);
            CREATE INDEX ck_pins_by_change ON ck_pins (changed_xid);
            CREATE TABLE ck_nonces (nonce bytea PRIMARY KEY, seen_at bigint NOT NULL);
            CREATE INDEX ck_nonces_by_time ON ck_nonces (seen_at);
            CREATE TABLE ck_assets (hash bytea PRIMARY KEY, size bigint NOT NULL, chunks integer NOT NULL);
            CREATE TABLE ck_asset_chunks (hash bytea NOT NULL, index integer NOT NULL, data bytea NOT NULL, PRIMARY KEY (hash, index));
            -- A request's nonce, claimed in one round trip. Visible to every server at once, on
            -- disk within a fraction of a second rather than before the answer (no fsync per
            -- request): a database crash may forget the last moment's nonces, whose requests
            -- expire with the clock skew anyway.
            CREATE FUNCTION ck_claim_nonce(claimed bytea, now bigint) RETURNS boolean LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM set_config('synchronous_commit', 'off', true);
                INSERT INTO ck_nonces (nonce, seen_at) VALUES (claimed, now) ON CONFLICT (nonce) DO NOTHING;
                RETURN FOUND;
            END $$;
            """),
    ]

    /// Connects, migrates the schema (under an advisory lock: servers starting together take
    /// turns), reads the pins and starts listening for other servers' changes.
    /// - Parameters:
    ///   - conninfo: a libpq connection string or `postgres://` URL.
    ///   - poolSize: connections this server opens at most.
    /// - Throws: ``RecordZoneError/Code/ioError`` when the database cannot be reached or migrated.
    public init(conninfo: String, poolSize: Int = 8, policy: RecordPolicy, indexedFields: [String: Set<String>] = [:]) async throws(RecordZoneError) {
        self.policy = policy
        queryIndex = QueryIndex(indexedFields)
        pool = PostgresPool(conninfo: conninfo, size: poolSize) { connection throws(PostgresError) in
            // A statement that runs away (a lock never released) fails instead of holding a
            // connection forever.
            try connection.execute("SET statement_timeout = '60s'")
            // A save is acknowledged once it is on disk, whatever the database's default says
            // (`off` would acknowledge what a crash then loses; stronger settings are kept).
            if try connection.execute("SELECT current_setting('synchronous_commit')").text(0, 0) == "off" {
                try connection.execute("SET synchronous_commit = on")
            }
        }
        let waiters = self.waiters
        listener = Listener(conninfo: conninfo)
        do {
            instance = try await pool.withConnection { db in try Self.migrate(db) }
        } catch {
            throw RecordZoneError(.ioError, "cannot open the PostgreSQL storage: \(error)")
        }
        // Listening first, then reading the pins: a chain changed in between is read by both.
        listener.start { [weak self] event in
            switch event {
            case .zone(let name): if let zone = try? ZoneName(name) { waiters.wake(zone) }
            case .pins: Task { try? await self?.refreshPins() }
            case .connected:
                waiters.wakeAll()
                Task { try? await self?.refreshPins() }
            }
        }
        try await refreshPins()
        let index = queryIndex
        do {
            try await pool.withConnection { db in try Self.rebuildIndexIfDeclarationChanged(index, in: db) }
        } catch {
            throw RecordZoneError(.ioError, "cannot rebuild the query index: \(error)")
        }
    }

    deinit { listener.stop() }

    /// Stops listening and closes the connections (the server is done with the storage).
    public func close() {
        listener.stop()
        waiters.releaseAll()
    }

    // MARK: Schema

    private static func migrate(_ db: PostgresConnection) throws -> String {
        return try db.transaction { () throws(PostgresError) -> String in
            // One server migrates at a time; the others wait here, then find nothing to do.
            try db.execute("SELECT pg_advisory_xact_lock(7316452001)")
            try db.execute("CREATE TABLE IF NOT EXISTS ck_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
            let rows = try db.execute("SELECT version FROM ck_schema")
            let applied = Set((0..<rows.count).compactMap { rows.int($0, 0) })
            for migration in migrations where !applied.contains(Int64(migration.version)) {
                try db.executeScript(migration.sql)
                try db.execute("INSERT INTO ck_schema (version) VALUES ($1)", [.int(Int64(migration.version))])
            }
            try db.execute("INSERT INTO ck_meta (key, value) VALUES ('instance', $1) ON CONFLICT (key) DO NOTHING", [.text(UUID().uuidString)])
            let instance = try db.execute("SELECT value FROM ck_meta WHERE key = 'instance'").text(0, 0) ?? ""
            // The cluster's identity, where the role may read it: a restore into another
            // cluster (other transaction IDs) expires database tokens.
            let cluster = (try? db.execute("SELECT system_identifier::text FROM pg_control_system()").text(0, 0)) ?? ""
            return "pg:\(instance):\(cluster)"
        }
    }

    /// The newest schema version this build knows.
    public static var schemaVersion: Int { migrations.map(\.version).max() ?? 0 }

    private static func rebuildIndexIfDeclarationChanged(_ index: QueryIndex, in db: PostgresConnection) throws {
        try db.transaction { () throws in
            try db.execute("SELECT pg_advisory_xact_lock(7316452002)")
            guard try db.execute("SELECT value FROM ck_meta WHERE key = 'indexed_fields'").text(0, 0) != index.declaration else { return }
            try db.execute("DELETE FROM ck_record_index")
            // A page of records at a time (zone, name order), whatever the table holds.
            for type in index.fields.keys.sorted() {
                var after = ("", "")
                while true {
                    let rows = try db.execute("""
                        SELECT zone, name, record FROM ck_records WHERE type = $1 AND (zone, name) > ($2, $3) ORDER BY zone, name LIMIT 1000
                        """, [.text(type), .text(after.0), .text(after.1)])
                    guard rows.count > 0 else { break }
                    after = (rows.text(rows.count - 1, 0) ?? "", rows.text(rows.count - 1, 1) ?? "")
                    try writeIndex(index, of: (0..<rows.count).compactMap { rows.bytes($0, 2).flatMap { try? Record(canonical: $0) } }, in: db)
                }
            }
            try db.execute("INSERT INTO ck_meta (key, value) VALUES ('indexed_fields', $1) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                           [.text(index.declaration)])
        }
    }

    // MARK: Pins

    /// Reads the chains changed since this server last looked, into its pins.
    func refreshPins() async throws(RecordZoneError) {
        let since = pinVersions.withLock { $0.horizon }
        let rows = try await run { db in
            try db.execute("""
                SELECT identity, chain, version, NULL::bigint FROM ck_pins WHERE changed_xid >= $1
                UNION ALL SELECT NULL, NULL, NULL, pg_snapshot_xmin(pg_current_snapshot())::text::bigint
                """, [.int(since)])
        }
        install(rows)
        if let horizon = rows.int(rows.count - 1, 3) { pinVersions.withLock { $0.horizon = max($0.horizon, horizon) } }
    }

    /// Installs the chains read from the database (identity, chain, version rows) that are newer
    /// than those held: a chain changed here and not yet written stays as it is, unless the
    /// database moved past the version it came from.
    private func install(_ rows: PostgresRows) {
        let decoder = JSONDecoder()
        pinVersions.withLock { state in
            var chains = [String: KeyChain]()
            for row in 0..<rows.count {
                guard let identity = rows.text(row, 0), let version = rows.int(row, 2), version > state.known[identity] ?? 0,
                    let blob = rows.bytes(row, 1), let chain = try? decoder.decode(KeyChain.self, from: blob)
                else { continue }
                chains[identity] = chain
                state.known[identity] = version
            }
            if !chains.isEmpty { policy.pins.install(chains) }
        }
    }

    /// Another server changed chains this transaction relied on: the identities whose rows
    /// moved, and the rows as the database holds them.
    private struct PinsChanged: Error {
        let moved: Set<String>
        let rows: PostgresRows
    }

    /// Locks the pin rows of some identities (`$1`, a text array), in a transaction. Shared
    /// locks: saves relying on one chain run side by side; writing a chain takes the row's
    /// exclusive lock (two writers of one chain may deadlock: PostgreSQL ends one, and its save
    /// goes round again).
    static let lockPins = "SELECT identity, chain, version FROM ck_pins WHERE identity = ANY($1) ORDER BY identity FOR SHARE"

    /// Inside a transaction, given the pin rows of `identities` it locked (``lockPins``):
    /// checks that the database holds the versions `known` says this server's chains came from,
    /// and writes the chains `changed` (plus any chain held here that the database lacks).
    /// - Returns: the versions written. - Throws: ``PinsChanged`` when a row moved on.
    private func agreePins(_ identities: Set<String>, known: [String: Int64], changed: [String: KeyChain], locked rows: PostgresRows,
                           in db: PostgresConnection) throws -> [String: Int64] {
        var stored = [String: Int64]()
        for row in 0..<rows.count { if let identity = rows.text(row, 0), let version = rows.int(row, 2) { stored[identity] = version } }
        let moved = identities.filter { stored[$0] != known[$0] }
        guard moved.isEmpty else { throw PinsChanged(moved: moved, rows: rows) }
        var toWrite = changed
        for identity in identities where stored[identity] == nil && toWrite[identity] == nil {
            if let chain = policy.pins.chain(for: identity) { toWrite[identity] = chain }
        }
        guard !toWrite.isEmpty else { return [:] }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        var written = [String: Int64]()
        for (identity, chain) in toWrite.sorted(by: { $0.key < $1.key }) {
            let blob = try encoder.encode(chain)
            let result = stored[identity] == nil
                ? try db.execute("INSERT INTO ck_pins (identity, chain, version) VALUES ($1, $2, nextval('ck_pin_versions')) ON CONFLICT (identity) DO NOTHING RETURNING version",
                                 [.text(identity), .bytes(blob)])
                : try db.execute("UPDATE ck_pins SET chain = $2, version = nextval('ck_pin_versions'), changed_xid = pg_current_xact_id()::text::bigint WHERE identity = $1 RETURNING version",
                                 [.text(identity), .bytes(blob)])
            // Inserted by another server since the lock was taken (no row to lock then).
            guard let version = result.count == 1 ? result.int(0, 0) : nil else {
                throw PinsChanged(moved: [identity], rows: try db.execute("SELECT identity, chain, version FROM ck_pins WHERE identity = $1", [.text(identity)]))
            }
            written[identity] = version
        }
        try db.execute("SELECT pg_notify('ck_pins', '')")
        return written
    }

    /// After a commit: this server's chains now come from these versions.
    private func recordWritten(_ versions: [String: Int64]) {
        guard !versions.isEmpty else { return }
        pinVersions.withLock { state in
            for (identity, version) in versions where version > state.known[identity] ?? 0 { state.known[identity] = version }
        }
    }

    private func knownVersions(_ identities: Set<String>) -> [String: Int64] {
        pinVersions.withLock { state in state.known.filter { identities.contains($0.key) } }
    }

    public func persistPins(for identity: String) async throws(RecordZoneError) {
        for _ in 0..<3 {
            // The chain came from the database and nothing changed here: nothing to agree on.
            if knownVersions([identity])[identity] != nil, policy.pins.changedIdentities.isEmpty { return }
            let changed = policy.pins.takeChangedChains()
            let identities = Set(changed.keys).union([identity])
            let known = knownVersions(identities)
            do {
                let written = try await pool.withConnection { db in
                    try db.transaction { () throws -> [String: Int64] in
                        try self.agreePins(identities, known: known, changed: changed, locked: try db.execute(Self.lockPins, [.textArray(identities.sorted())]), in: db)
                    }
                }
                recordWritten(written)
                return
            } catch let error as PinsChanged {
                // Another server bound or changed it first: its chain is the truth; the caller
                // checks the request's key against it.
                install(error.rows)
                policy.pins.restoreChangedChains(changed.filter { identity, _ in !error.moved.contains(identity) })
            } catch {
                policy.pins.restoreChangedChains(changed)
                throw Self.storageError(error)
            }
        }
        throw Self.busy("key pins keep changing through other servers")
    }

    // MARK: Nonces

    public func claimNonce(_ nonce: Data, at time: Date, horizon: TimeInterval) async throws(RecordZoneError) -> Bool {
        let now = Int64(time.timeIntervalSince1970 * 1000)
        let prune = nonceClaims.add(1, ordering: .relaxed).newValue % 1024 == 0
        return try await run { db in
            if prune { try db.execute("DELETE FROM ck_nonces WHERE seen_at < $1", [.int(now - Int64(horizon * 1000))]) }
            return try db.execute("SELECT ck_claim_nonce($1, $2)", [.bytes(nonce), .int(now)]).bool(0, 0) == true
        }
    }

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
    }

    public func fetchDatabaseChanges(since token: ChangeToken?, visibleTo isVisible: @escaping @Sendable (ZoneName) -> Bool) async throws(RecordZoneError) -> DatabaseChanges {
        let position = try TokenContents.databasePosition(token, backend: Self.kind, instance: instance)
        // One snapshot: the zones it shows, the oldest transaction it could not see (the next
        // token) and the next transaction to come (a token past it is from before a restore).
        let rows = try await run { db in
            try db.execute("""
                SELECT 'c', name, NULL::bigint, NULL::bigint FROM ck_zones WHERE changed_xid >= $1
                UNION ALL SELECT 'd', name, NULL, NULL FROM ck_deleted_zones WHERE deleted_xid >= $1
                UNION ALL SELECT 'h', '', pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_snapshot_xmax(pg_current_snapshot())::text::bigint
                """, [.int(position)])
        }
        var changed = [ZoneName](), deleted = [ZoneName](), horizon: Int64 = position
        for row in 0..<rows.count {
            switch rows.text(row, 0) {
            case "h":
                horizon = rows.int(row, 2) ?? position
                try TokenContents.refuseAhead(position, of: rows.int(row, 3) ?? position, "the database")
            case "c": if let zone = rows.text(row, 1).flatMap({ try? ZoneName($0) }), isVisible(zone) { changed.append(zone) }
            default: if token != nil, let zone = rows.text(row, 1).flatMap({ try? ZoneName($0) }), isVisible(zone) { deleted.append(zone) }
            }
        }
        return DatabaseChanges(changedZones: changed.sorted { $0.rawValue < $1.rawValue }, deletedZones: deleted.sorted { $0.rawValue < $1.rawValue },
                               token: TokenContents.databaseToken(backend: Self.kind, instance: instance, position: horizon))
    }

    // MARK: Changes

    public func changes(in zone: ZoneName, since token: ChangeToken?, limit: Int) async throws(RecordZoneError) -> Wire.Changes {
        let limit = BackendLimits.clampPage(limit)
        // The position is read from the token first; its zone and incarnation are checked
        // against the zone row read in the same statement.
        let claimed = try token.map { token throws(RecordZoneError) in Int64(bitPattern: SequencePosition.decode(try TokenContents(token, expecting: .zone, backend: Self.kind).position)) } ?? 0
        let rows = try await run { db in
            try db.execute("""
                SELECT z.incarnation, z.sequence, r.record, r.sequence, r.received_at FROM ck_zones z
                LEFT JOIN LATERAL (SELECT record, sequence, received_at FROM ck_records WHERE zone = z.name AND sequence > $2 ORDER BY sequence LIMIT $3) r ON true
                WHERE z.name = $1 ORDER BY r.sequence
                """, [.text(zone.rawValue), .int(claimed), .int(Int64(limit + 1))])
        }
        guard rows.count > 0, let incarnation = rows.text(0, 0), let zoneSequence = rows.int(0, 1) else {
            throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
        }
        _ = try TokenContents.zoneSequence(token, backend: Self.kind, zone: zone, incarnation: incarnation, current: zoneSequence)
        var records = [Wire.SignedRecord]()
        for row in 0..<rows.count {
            guard let bytes = rows.bytes(row, 2), let sequence = rows.int(row, 3) else { continue }
            records.append(Wire.SignedRecord(bytes: bytes, changeTag: String(sequence), receivedAt: rows.int(row, 4)))
        }
        let moreComing = records.count > limit
        let page = Array(records.prefix(limit))
        // One statement, one snapshot: the zone's sequence covers every record it showed.
        let position = moreComing ? (page.last?.changeTag.flatMap { Int64($0) } ?? zoneSequence) : zoneSequence
        let next = TokenContents(kind: .zone, backend: Self.kind, zone: zone.rawValue, incarnation: incarnation, position: SequencePosition.encode(UInt64(bitPattern: position)))
        return Wire.Changes(records: page, token: next.token, moreComing: moreComing)
    }

    public func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
        let generation = waiters.generation(of: zone)
        let rows = try await run { db in try db.execute("SELECT incarnation, sequence FROM ck_zones WHERE name = $1", [.text(zone.rawValue)]) }
        guard rows.count == 1, let incarnation = rows.text(0, 0), let sequence = rows.int(0, 1) else {
            throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
        }
        let since = try TokenContents.zoneSequence(token, backend: Self.kind, zone: zone, incarnation: incarnation, current: sequence)
        if sequence > since { return true }
        return await waiters.wait(for: zone, after: generation, timeout: timeout)
    }

    public var waitingCount: Int { waiters.count }

    public func releaseWaiters() { waiters.releaseAll() }

    // MARK: Records

    public func save(_ records: [Record], policy savePolicy: SavePolicy) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try BackendLimits.checkBatch(records.count)
        for _ in 0..<4 {
            let owners = Set(records.compactMap { try? policy.rules.owner(of: $0)?.get() })
            let knownOwners = knownVersions(owners)
            // Decided into a value: nothing shared changes until the batch commits.
            let (admitted, admission) = SaveChecks.admit(records, policy: policy)
            let changed = Set(admission.chains.keys)
            // The owners' versions as they were before admission (a chain installed during it
            // sends the save round again); the others' as they are.
            let known = knownVersions(changed.subtracting(owners)).merging(knownOwners) { $1 }
            do {
                let (results, written, stored) = try await pool.withConnection { db in
                    try self.store(records, (admitted, admission), savePolicy, pins: owners.union(changed), known: known, in: db)
                }
                recordWritten(written)
                policy.pins.publish(stored)
                return results
            } catch let moved as PinsChanged {
                // Another server moved a chain this batch relied on: read it, decide again.
                install(moved.rows)
            } catch let error as PostgresError where [.deadlockDetected, .serializationFailure].contains(error.code) {
                // A deadlock or serialization failure between servers: go round again.
            } catch {
                throw Self.storageError(error)
            }
        }
        throw Self.busy("the batch kept meeting concurrent changes to its keys")
    }

    /// Stores a batch in one transaction of two round trips. The first begins, locks the pin
    /// rows of `pins`, locks the batch's zones (in name order) and reads the versions held —
    /// each statement after the lock before it, so it sees what the last holder committed. Each
    /// version is then decided against the one held and given its zone's next sequence; the
    /// chains of exactly the versions stored (``SaveChecks/settle(_:storing:admission:policy:)``) are
    /// checked against `known` and written (``agreePins``); the second round trip writes
    /// records, index rows and the zones' positions, notifies the other servers, and commits.
    /// - Returns: per record the outcome, the pin versions written, and the chains to publish.
    private func store(_ records: [Record], _ admission: (outcomes: [Result<Data, RecordZoneError>], pins: PinChanges), _ savePolicy: SavePolicy,
                       pins: Set<String>, known: [String: Int64], in db: PostgresConnection) throws -> ([Result<Record, RecordZoneError>], [String: Int64], PinChanges) {
        var reads: [(sql: String, parameters: [PostgresValue])] = [("BEGIN", [])]
        if !pins.isEmpty { reads.append((Self.lockPins, [.textArray(pins.sorted())])) }
        reads.append(("SELECT name, sequence FROM ck_zones WHERE name = ANY($1) ORDER BY name FOR UPDATE", [.textArray(Set(records.map(\.id.zone.rawValue)).sorted())]))
        reads.append(("""
            SELECT r.zone, r.name, r.record, r.sequence, r.received_at FROM ck_records r JOIN unnest($1::text[], $2::text[]) AS k(zone, name) ON r.zone = k.zone AND r.name = k.name
            """, [.textArray(records.map(\.id.zone.rawValue)), .textArray(records.map(\.id.name))]))
        do {
            let read = try db.pipeline(reads)
            var outcomes = admission.outcomes
            var (results, writes, storing) = decide(records, outcomes, savePolicy, zones: read[read.count - 2], current: read[read.count - 1])
            let (refused, settled) = SaveChecks.settle(records, storing: storing, admission: admission, policy: policy)
            if !refused.isEmpty {
                for (index, error) in refused { outcomes[index] = .failure(error) }
                (results, writes, _) = decide(records, outcomes, savePolicy, zones: read[read.count - 2], current: read[read.count - 1])
            }
            let written = pins.isEmpty ? [:] : try agreePins(pins, known: known, changed: settled.chains, locked: read[1], in: db)
            try db.pipeline(writes + [("COMMIT", [])])
            return (results, written, settled)
        } catch {
            _ = try? db.execute("ROLLBACK")
            throw error
        }
    }

    /// Decides each version of a batch against the zones' positions and the versions held
    /// (rows locked and read by ``store``). - Returns: per record the outcome, and the
    /// statements that write what was decided.
    private func decide(_ records: [Record], _ admitted: [Result<Data, RecordZoneError>], _ savePolicy: SavePolicy, zones zoneRows: PostgresRows,
                        current currentRows: PostgresRows) -> ([Result<Record, RecordZoneError>], [(sql: String, parameters: [PostgresValue])], [Int]) {
        var sequences = [String: Int64]()
        for row in 0..<zoneRows.count { if let name = zoneRows.text(row, 0), let sequence = zoneRows.int(row, 1) { sequences[name] = sequence } }
        var current = [RecordID: Record]()
        for row in 0..<currentRows.count {
            guard let bytes = currentRows.bytes(row, 2), var record = try? Record(canonical: bytes), let sequence = currentRows.int(row, 3) else { continue }
            record.serverMetadata = ServerMetadata(changeTag: String(sequence), receivedAt: currentRows.int(row, 4).map { Date(timeIntervalSince1970: Double($0) / 1000) })
            current[record.id] = record
        }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        var results = [Result<Record, RecordZoneError>]()
        // What to write, by record: a later version of one record in the batch replaces an earlier.
        var winners = [RecordID: (record: Record, bytes: Data, sequence: Int64)](), order = [RecordID]()
        var previouslyIndexed = Set<RecordID>(), storing = [Int]()
        for (index, (record, outcome)) in zip(records, admitted).enumerated() {
            let zone = record.id.zone.rawValue
            guard let sequence = sequences[zone] else {
                results.append(.failure(RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist", recordID: record.id)))
                continue
            }
            // PostgreSQL's text cannot hold NUL: such a type is refused alone, not the batch.
            let outcome = record.recordType.utf8.contains(0)
                ? .failure(RecordZoneError(.malformed, "the record type holds a NUL character", recordID: record.id)) : outcome
            switch SaveChecks.decide(record, admitted: outcome, current: current[record.id], policy: savePolicy, pins: policy) {
            case .refused(let error): results.append(.failure(error))
            case .superseded(let winner): results.append(.success(winner))
            case .store(let bytes):
                let next = sequence + 1
                sequences[zone] = next
                if let held = current[record.id], queryIndex.fields[held.recordType] != nil { previouslyIndexed.insert(record.id) }
                var saved = record
                saved.serverMetadata = ServerMetadata(changeTag: String(next), receivedAt: Date(timeIntervalSince1970: Double(now) / 1000))
                current[record.id] = saved
                if winners[record.id] == nil { order.append(record.id) }
                winners[record.id] = (record, bytes, next)
                storing.append(index)
                results.append(.success(saved))
            }
        }
        let rows = order.compactMap { winners[$0] }
        guard !rows.isEmpty else { return (results, [], storing) }
        var writes: [(sql: String, parameters: [PostgresValue])] = [("""
            INSERT INTO ck_records (zone, name, type, sequence, clock, author, signature, record, received_at)
            SELECT zone, name, type, sequence, clock, author, signature, record, $9
            FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bytea[], $7::bytea[], $8::bytea[])
                AS t(zone, name, type, sequence, clock, author, signature, record)
            ON CONFLICT (zone, name) DO UPDATE SET type = excluded.type, sequence = excluded.sequence, clock = excluded.clock,
                author = excluded.author, signature = excluded.signature, record = excluded.record, received_at = excluded.received_at
            """, [.textArray(rows.map(\.record.id.zone.rawValue)), .textArray(rows.map(\.record.id.name)), .textArray(rows.map(\.record.recordType)),
                  .intArray(rows.map(\.sequence)), .intArray(rows.map { Int64(bitPattern: $0.record.clock.rawValue) }), .bytesArray(rows.map(\.record.authorKey)),
                  .bytesArray(rows.map(\.record.signature)), .bytesArray(rows.map(\.bytes)), .int(now)])]
        writes += Self.indexStatements(queryIndex, of: rows.map(\.record), previouslyIndexed: previouslyIndexed)
        // The zones' new positions, and a notification to every server on commit.
        let touched = Set(rows.map(\.record.id.zone.rawValue)).sorted()
        writes.append(("""
            WITH moved AS (
                UPDATE ck_zones SET sequence = t.sequence, changed_xid = pg_current_xact_id()::text::bigint
                FROM unnest($1::text[], $2::bigint[]) AS t(name, sequence) WHERE ck_zones.name = t.name RETURNING ck_zones.name)
            SELECT pg_notify('ck_changes', name) FROM moved
            """, [.textArray(touched), .intArray(touched.map { sequences[$0] ?? 0 })]))
        return (results, writes, storing)
    }

    /// Replaces the index rows of these versions (none for a tombstone).
    static func writeIndex(_ index: QueryIndex, of versions: [Record], in db: PostgresConnection) throws {
        for statement in indexStatements(index, of: versions) { try db.execute(statement.sql, statement.parameters) }
    }

    /// The statements that replace the index rows of these versions.
    /// - Parameter previouslyIndexed: records whose version held before was of an indexed type.
    static func indexStatements(_ index: QueryIndex, of versions: [Record], previouslyIndexed: Set<RecordID> = []) -> [(sql: String, parameters: [PostgresValue])] {
        // Only records of an indexed type, now or before, have rows to replace.
        let records = versions.filter { index.fields[$0.recordType] != nil || previouslyIndexed.contains($0.id) }
        guard !records.isEmpty else { return [] }
        var statements: [(sql: String, parameters: [PostgresValue])] = [(
            "DELETE FROM ck_record_index i USING unnest($1::text[], $2::text[]) AS k(zone, name) WHERE i.zone = k.zone AND i.name = k.name",
            [.textArray(records.map(\.id.zone.rawValue)), .textArray(records.map(\.id.name))])]
        var zone = [String](), type = [String](), field = [String](), value = [Data](), name = [String]()
        for record in records {
            for entry in index.entries(of: record) {
                zone.append(record.id.zone.rawValue)
                type.append(record.recordType)
                field.append(entry.field)
                value.append(entry.value)
                name.append(record.id.name)
            }
        }
        if !zone.isEmpty {
            statements.append(("""
                INSERT INTO ck_record_index (zone, type, field, value, name)
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[]) ON CONFLICT DO NOTHING
                """, [.textArray(zone), .textArray(type), .textArray(field), .bytesArray(value), .textArray(name)]))
        }
        return statements
    }

    public func stored(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Wire.SignedRecord, RecordZoneError>] {
        try BackendLimits.checkBatch(ids.count)
        // One statement: each ID with its zone's existence and its record, if any.
        let rows = try await run { db in
            try db.execute("""
                SELECT k.zone, k.name, z.name IS NOT NULL, r.record, r.sequence, r.received_at
                FROM unnest($1::text[], $2::text[]) AS k(zone, name)
                LEFT JOIN ck_zones z ON z.name = k.zone LEFT JOIN ck_records r ON r.zone = k.zone AND r.name = k.name
                """, [.textArray(ids.map(\.zone.rawValue)), .textArray(ids.map(\.name))])
        }
        var existing = Set<String>(), found = [String: Wire.SignedRecord]()
        for row in 0..<rows.count {
            guard let zone = rows.text(row, 0), let name = rows.text(row, 1) else { continue }
            if rows.bool(row, 2) == true { existing.insert(zone) }
            guard let bytes = rows.bytes(row, 3), let sequence = rows.int(row, 4) else { continue }
            found[zone + "\u{0}" + name] = Wire.SignedRecord(bytes: bytes, changeTag: String(sequence), receivedAt: rows.int(row, 5))
        }
        return ids.map { id in
            guard existing.contains(id.zone.rawValue) else { return .failure(RecordZoneError(.zoneNotFound, "zone '\(id.zone)' does not exist", recordID: id)) }
            guard let signed = found[id.zone.rawValue + "\u{0}" + id.name] else { return .failure(RecordZoneError(.unknownItem, "no record \(id)", recordID: id)) }
            return .success(signed)
        }
    }

    public func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) async throws(RecordZoneError) -> QueryResult {
        let lookup = queryIndex.lookup(for: query)
        let (exists, rows) = try await run { db in
            try db.transaction { () throws(PostgresError) in
                let exists = try db.execute("SELECT 1 FROM ck_zones WHERE name = $1", [.text(query.zone.rawValue)]).count == 1
                guard exists else { return (false, PostgresRows?.none) }
                if let lookup {
                    // The index narrows to candidates; the query's own predicates decide below.
                    return (true, try db.execute("""
                        SELECT r.record, r.sequence FROM ck_record_index i JOIN ck_records r ON r.zone = i.zone AND r.name = i.name
                        WHERE i.zone = $1 AND i.type = $2 AND i.field = $3 AND i.value = $4 AND r.type = $2
                        """, [.text(query.zone.rawValue), .text(query.recordType), .text(lookup.field), .bytes(lookup.value)]))
                }
                return (true, try db.execute("SELECT record, sequence FROM ck_records WHERE zone = $1 AND type = $2", [.text(query.zone.rawValue), .text(query.recordType)]))
            }
        }
        guard exists, let rows else { throw RecordZoneError(.zoneNotFound, "zone '\(query.zone)' does not exist") }
        let records = (0..<rows.count).compactMap { row -> Record? in
            guard let bytes = rows.bytes(row, 0), let sequence = rows.int(row, 1) else { return nil }
            return try? Wire.SignedRecord(bytes: bytes, changeTag: String(sequence)).decoded()
        }
        return try query.run(over: records, cursor: cursor, limit: limit)
    }

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

            """
    }

    // MARK: Test support

    /// Creates many zones in one transaction (seeding a large server for a test or the bench).
    func createZones(_ zones: [ZoneName]) async throws(RecordZoneError) {
        _ = try await run { db in
            try db.execute("""
                INSERT INTO ck_zones (name, incarnation, changed_xid) SELECT name, gen_random_uuid()::text, pg_current_xact_id()::text::bigint
                FROM unnest($1::text[]) AS t(name) ON CONFLICT (name) DO NOTHING
                """, [.textArray(zones.map(\.rawValue))])
        }
    }

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

    /// Stores raw bytes as a broken or hostile writer would, bypassing every check.
    func injectUnchecked(_ data: Data, into zone: ZoneName, name: String) async throws(RecordZoneError) {
        try await run { db in
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
    }

    // MARK: Helpers

    /// Runs `body` with a pooled connection; errors become ``RecordZoneError``s.
    @discardableResult
    func run<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) throws -> T) async throws(RecordZoneError) -> T {
        do { return try await pool.withConnection(body) } catch { throw Self.storageError(error) }
    }

    /// An unreachable database is transient for clients: 503 with `Retry-After`, so they keep
    /// their changes and try again; anything else is the server's own fault.
    static func storageError(_ error: any Error) -> RecordZoneError {
        if let error = error as? RecordZoneError { return error }
        if let error = error as? PostgresError {
            if error.isConnectionFailure || error.code == .tooManyConnections || error.code == .queryCanceled {
                var unavailable = RecordZoneError(.serviceUnavailable, "the database is unavailable; try again later (\(error.message))")
                unavailable.retryAfter = 1
                return unavailable
            }
            if error.code == .diskFull {
                var full = RecordZoneError(.serviceUnavailable, "the database's disk is full; try again later")
                full.retryAfter = 60
                return full
            }
        }
        return RecordZoneError(.internalError, "server storage: \(error)")
    }

    private static func busy(_ why: String) -> RecordZoneError {
        var error = RecordZoneError(.serviceUnavailable, why)
        error.retryAfter = 1
        return error
    }
}

/// The connection that listens for other servers' notifications (`ck_changes` with a zone's
/// name, `ck_pins`), on a thread of its own, reconnecting with a short pause when it fails.
final class Listener: Sendable {
    enum Event {
        case zone(String)
        case pins
        /// Listening (at first, or again after a failure): notifications may have been missed.
        case connected
    }

    let conninfo: String
    private let state = Mutex((stopped: false, connected: false))

    init(conninfo: String) { self.conninfo = conninfo }

    var isConnected: Bool { state.withLock { $0.connected } }

    func start(_ handler: @escaping @Sendable (Event) -> Void) {
        let thread = Thread { [self] in
            while !state.withLock({ $0.stopped }) {
                do {
                    let connection = try PostgresConnection(conninfo)
                    try connection.listen("ck_changes")
                    try connection.listen("ck_pins")
                    state.withLock { $0.connected = true }
                    handler(.connected)
                    while !state.withLock({ $0.stopped }) {
                        guard let note = try connection.waitForNotification(timeout: 0.25) else { continue }
                        handler(note.channel == "ck_pins" ? .pins : .zone(note.payload))
                    }
                } catch {
                    state.withLock { $0.connected = false }
                    Thread.sleep(forTimeInterval: 0.25)
                }
            }
        }
        thread.name = "convkit.postgres.listen"
        thread.start()
    }

    func stop() { state.withLock { $0.stopped = true } }
}
