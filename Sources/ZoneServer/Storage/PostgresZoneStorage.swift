import Foundation
import PostgresKit
import RecordZone
import Synchronization

/// The zone server's storage on PostgreSQL, shared by any number of `convkitd serve` processes
/// that then behave as one server: the same contract as ``SQLiteZoneStorage`` (one conformance
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
/// - **Wake-ups.** A commit notifies `ck_changes` with its zone (and `+<zone>` for a zone whose
///   governing records it moved: who may read it); every server's listener (``run()``) wakes its
///   long polls and streams. A lost listener connection wakes every poll when it is
///   back; each looks at its zone again and answers only if it moved.
/// - **Assets** are rows of 1 MiB chunks: backing up the database backs up everything.
///
/// Connection failures answer 503 with `Retry-After` (clients keep their changes and retry);
/// the pool and the listener reconnect by themselves when the database is back.
public final class PostgresZoneStorage: ZoneStorage, Sendable {
    static let kind = "server"
    static let chunkSize = 1 << 20

    public let policy: RecordPolicy
    public let queryIndex: QueryIndex
    let pool: PostgresPool
    /// The database's identity in database tokens: its instance (made at its first migration)
    /// and its cluster's system identifier, so a restore into another cluster expires them.
    let instance: String
    public let waiters = ChangeWaiters()
    public let typing = TypingBoard()
    public let presence = PresenceBoard()
    /// This server's name in its typing and presence notifications, so it skips its own.
    let typingSource = Sodium.randomBytes(8).hexString
    let listener: Listener

    /// The pin versions this server's chains came from, and where its next look at the table
    /// starts (a transaction horizon, as the database feed's: a chain committed later is never
    /// behind it).
    struct PinVersions {
        var known = [String: Int64]()
        var horizon: Int64 = 0
    }
    let pinVersions = Mutex(PinVersions())
    let nonceClaims = Atomic<Int>(0)
    /// Reads of the pins after another server's change that failed (each retried until one succeeds).
    let pinReadFailures = Atomic<Int>(0)
    let governed = GovernedZoneCache()

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
        // Version 2: a governed zone's mark (the highest sequence of its governing type) is one seek.
        (2, """
            CREATE INDEX ck_records_by_type_sequence ON ck_records (zone, type, sequence);
            DROP INDEX ck_records_by_type;
            """),
    ]

    /// Connects, migrates the schema (under an advisory lock: servers starting together take
    /// turns), reads the pins and starts listening for other servers' changes.
    /// - Parameters:
    ///   - conninfo: a libpq connection string or `postgres://` URL.
    ///   - poolSize: connections this server opens at most.
    ///   - deadline: how long one piece of a request's database work may wait for PostgreSQL
    ///     before its connection is cut and the request is answered 503 (a request also waits
    ///     at most 5 s for a free connection).
    /// - Throws: ``RecordZoneError/Code/ioError`` when the database cannot be reached or migrated.
    public init(conninfo: String, poolSize: Int = 8, deadline: Duration = .seconds(5), policy: RecordPolicy,
                indexedFields: [String: Set<String>] = [:]) async throws(RecordZoneError) {
        self.policy = policy
        queryIndex = QueryIndex(indexedFields)
        pool = PostgresPool(conninfo: conninfo, size: poolSize, workDeadline: deadline) { connection throws(PostgresError) in
            // A statement that runs away (a lock never released) fails instead of holding a
            // connection forever.
            try connection.execute("SET statement_timeout = '60s'")
            // A save is acknowledged once it is on disk, whatever the database's default says
            // (`off` would acknowledge what a crash then loses; stronger settings are kept).
            if try connection.execute("SELECT current_setting('synchronous_commit')").text(0, 0) == "off" {
                try connection.execute("SET synchronous_commit = on")
            }
        }
        listener = Listener(conninfo: conninfo)
        do {
            instance = try await pool.withConnection { db in try Self.migrate(db) }
        } catch {
            throw RecordZoneError(.ioError, "cannot open the PostgreSQL storage: \(error)")
        }
        // The pins now; a chain changed before ``run()`` listens is read again when it does.
        try await refreshPins()
        let index = queryIndex
        do {
            try await pool.withConnection { db in try Self.rebuildIndexIfDeclarationChanged(index, in: db) }
        } catch {
            throw RecordZoneError(.ioError, "cannot rebuild the query index: \(error)")
        }
    }

    /// Listens to the other servers sharing the database until the calling task is cancelled:
    /// wakes this server's long polls for their commits and reads the key chains they change
    /// (and all of them, with every poll woken, each time the listener connects — notifications
    /// may have been missed). The listener's connection and thread live only while this runs;
    /// ``ZoneServer`` runs it for as long as it serves. A storage not run serves as one server
    /// alone.
    public func run() async {
        // Pin reads are asked for here and made by a child of this run, which retries one that
        // fails until it succeeds: a chain changed on another server (a new key, a revoked
        // device) is never left unread here because the database failed once.
        let (pinReads, askPinRead) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        await withTaskGroup(of: Void.self) { children in
            children.addTask { await self.readPins(whenAsked: pinReads) }
            await listen { askPinRead.yield() }
            askPinRead.finish()
            children.cancelAll()
        }
    }

    /// Reads the pins each time it is asked (asks made while one read runs count as one more),
    /// retrying a read that fails after 50 ms, doubling to at most 5 s, until it succeeds or
    /// the run ends.
    private func readPins(whenAsked asks: AsyncStream<Void>) async {
        for await _ in asks {
            var delay = 0.05
            while !Task.isCancelled {
                do {
                    try await refreshPins()
                    break
                } catch {
                    pinReadFailures.add(1, ordering: .relaxed)
                    try? await Task.sleep(for: .milliseconds(Int(delay * 1000)))
                    delay = min(delay * 2, 5)
                }
            }
        }
    }

    /// Follows the listener's events; `readPins` asks for the pins to be read.
    private func listen(readPins: @escaping @Sendable () -> Void) async {
        let waiters = self.waiters, typing = self.typing, presence = self.presence, source = typingSource
        await listener.run { event in
            switch event {
            case .zone(let name):
                // `+<zone>`: a commit moved the zone's governing records (who may read it).
                if name.hasPrefix("+") {
                    if let zone = try? ZoneName(String(name.dropFirst())) { waiters.wakeReaders(of: zone) }
                } else if let zone = try? ZoneName(name) {
                    waiters.wake(zone)
                }
            case .typing(let payload):
                // Another server's typist: `"<1|0> <server> <zone> <identity>"` (this one's own are skipped).
                let parts = payload.split(separator: " ", maxSplits: 3)
                if parts.count == 4, parts[1] != source, let zone = try? ZoneName(String(parts[2])) {
                    typing.set(parts[0] == "1", identity: String(parts[3]), in: zone, rateLimited: false)
                }
            case .presence(let payload):
                // Another server's client: `"<1|0> <server> <milliseconds seen> <identity>"`.
                let parts = payload.split(separator: " ", maxSplits: 3)
                if parts.count == 4, parts[1] != source, let seen = Int64(parts[2]) {
                    presence.set(parts[0] == "1", identity: String(parts[3]), seen: Date(timeIntervalSince1970: Double(seen) / 1000), rateLimited: false)
                }
            case .pins: readPins()
            case .connected:
                waiters.wakeAll()
                readPins()
            }
        }
    }

    deinit { listener.stop() }

    /// Stops listening and closes the connections (the server is done with the storage).
    public func close() {
        listener.stop()
        waiters.releaseAll()
        typing.releaseAll()
        presence.releaseAll()
    }

    // MARK: Schema

    static func migrate(_ db: PostgresConnection) throws -> String {
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

    static func rebuildIndexIfDeclarationChanged(_ index: QueryIndex, in db: PostgresConnection) throws {
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

    /// Sets a typist's state here and tells the other servers (`ck_typing`); a database that
    /// does not answer leaves it on this server alone.
    public func setTyping(_ typing: Bool, identity: String, in zone: ZoneName) async -> Bool {
        guard self.typing.set(typing, identity: identity, in: zone) else { return false }
        let payload = "\(typing ? 1 : 0) \(typingSource) \(zone.rawValue) \(identity)"
        _ = try? await run { db in try db.execute("SELECT pg_notify('ck_typing', $1)", [.text(payload)]) }
        return true
    }

    /// Sets an identity's presence here and tells the other servers (`ck_presence`).
    public func setPresence(_ online: Bool, identity: String) async -> Bool {
        let seen = Date()
        guard presence.set(online, identity: identity, seen: seen) else { return false }
        let payload = "\(online ? 1 : 0) \(typingSource) \(Int64((seen.timeIntervalSince1970 * 1000).rounded())) \(identity)"
        _ = try? await run { db in try db.execute("SELECT pg_notify('ck_presence', $1)", [.text(payload)]) }
        return true
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

    static func busy(_ why: String) -> RecordZoneError {
        var error = RecordZoneError(.serviceUnavailable, why)
        error.retryAfter = 1
        return error
    }
}
