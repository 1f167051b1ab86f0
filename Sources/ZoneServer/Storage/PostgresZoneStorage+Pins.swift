import Foundation
import PostgresKit
import RecordZone
import Synchronization

/// The chains and nonces every server of one database agrees on.
extension PostgresZoneStorage {
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
    func install(_ rows: PostgresRows) {
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
    struct PinsChanged: Error {
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
    func agreePins(_ identities: Set<String>, known: [String: Int64], changed: [String: KeyChain], locked rows: PostgresRows,
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
    func recordWritten(_ versions: [String: Int64]) {
        guard !versions.isEmpty else { return }
        pinVersions.withLock { state in
            for (identity, version) in versions where version > state.known[identity] ?? 0 { state.known[identity] = version }
        }
    }

    func knownVersions(_ identities: Set<String>) -> [String: Int64] {
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
}
