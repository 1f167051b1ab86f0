import Foundation
import PostgresKit
import RecordZone
import Synchronization

/// What the zone server needs of its storage, beyond the record-zone contract every backend
/// keeps: the stored bytes served as they are, the database feed filtered by access, key pins
/// and replay nonces kept where every server sharing the storage sees them, long-poll waiters,
/// and its health for `/healthz` and `/metrics`.
///
/// Two implementations: ``SQLiteZoneStorage`` (one server, one file: the default) and
/// ``PostgresZoneStorage`` (any number of servers on one PostgreSQL database).
public protocol ZoneStorage: RecordZoneBackend {
    /// The checks every save passes; its pins are the storage's (kept with the records).
    var policy: RecordPolicy { get }

    /// The database change feed, limited to the zones `isVisible` lets through.
    func fetchDatabaseChanges(since token: ChangeToken?, visibleTo isVisible: @escaping @Sendable (ZoneName) -> Bool) async throws(RecordZoneError) -> DatabaseChanges
    /// Saves a batch (``RecordZoneBackend/save(_:policy:)``) and reads, in the same transaction,
    /// how its zones moved and — given a database token — the feed since it, limited to the
    /// zones `isVisible` lets through (``SaveCatchUp``). A token that is no longer valid leaves
    /// the feed out; it never fails the save.
    /// With a `gate`, versions of the zones it governs pass its rule too, decided inside the
    /// transaction against the zone's governing records as stored (``SaveGate``).
    func save(_ records: [Record], policy: SavePolicy, feedSince token: ChangeToken?, visibleTo isVisible: @escaping @Sendable (ZoneName) -> Bool,
              gate: SaveGate?) async throws(RecordZoneError) -> SaveAnswer
    /// One page of a zone's changes as stored: the records' bytes, not decoded or verified again.
    /// - Parameter readable: which versions the reader may read (nil: all); the others are left
    ///   out of the page, and the token passes them.
    func changes(in zone: ZoneName, since token: ChangeToken?, limit: Int, readable: ReadableVersions?) async throws(RecordZoneError) -> Wire.Changes
    /// What the governing records of each of `zones` that `governance` governs decide, as
    /// stored now (zones that do not exist are left out). Where servers share the storage,
    /// each decides from the records, so all decide alike.
    func governed(_ zones: [ZoneName], by governance: any ZoneGovernance) async throws(RecordZoneError) -> [ZoneName: any GovernedZone]
    /// The stored bytes of each record.
    func stored(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Wire.SignedRecord, RecordZoneError>]

    /// Makes the pins an authenticated request made (its identity bound on first use, a device
    /// enrolled) durable before the request is handled, and — where servers share the storage —
    /// agreed: when another server bound `identity` first, its chain replaces this one's, and
    /// the caller checks the request's key again.
    func persistPins(for identity: String) async throws(RecordZoneError)
    /// Records a request's nonce (its key and nonce) as used. - Returns: false when it was used
    /// before, through any server sharing this storage (a replay). Nonces older than `horizon`
    /// can no longer pass the freshness check and may be forgotten.
    func claimNonce(_ nonce: Data, at time: Date, horizon: TimeInterval) async throws(RecordZoneError) -> Bool

    /// How many records the storage holds.
    func recordCount() async throws(RecordZoneError) -> Int
    /// Who types where (docs/PROTOCOL.md §2, "Typing"): in this server's memory only.
    var typing: TypingBoard { get }
    /// Sets a typist's state here and, where servers share the storage, on every one of them.
    /// - Returns: false when refused for the rate (``TypingBoard/minimumInterval``).
    func setTyping(_ typing: Bool, identity: String, in zone: ZoneName) async -> Bool
    /// Who is online (docs/PROTOCOL.md §2, "Presence"): in this server's memory only.
    var presence: PresenceBoard { get }
    /// Sets an identity's presence here and, where servers share the storage, on every one of them.
    /// - Returns: false when refused for the rate (``PresenceBoard/minimumInterval``).
    func setPresence(_ online: Bool, identity: String) async -> Bool
    /// Who waits for or observes a zone's changes: woken by every commit to it (on any server
    /// sharing the storage).
    var waiters: ChangeWaiters { get }
    /// How many callers wait in ``RecordZoneBackend/waitForChanges(in:since:timeout:)`` now.
    var waitingCount: Int { get }
    /// Releases every waiting caller, and answers later ones at once (the server is stopping).
    func releaseWaiters()
    /// Nil while the storage answers; otherwise why it does not (`/healthz` answers 503).
    func healthProblem() async -> String?
    /// Storage gauges and counters for `/metrics`, in the Prometheus text format (may be empty).
    func metricsText() -> String
    /// The storage's background work (listening to other servers sharing it), until the calling
    /// task is cancelled; returns at once where there is none. ``ZoneServer`` runs it while it serves.
    func run() async

    // What the operator's console shows (docs/SERVER.md, "Console"): pages by key, one seek each.
    /// Zones in name order after `after`, at most `limit`, each with its change sequence.
    func zoneListing(after: String?, limit: Int) async throws(RecordZoneError) -> [ZoneListing]
    /// A zone's records (the version each holds) in name order after `after`, at most `limit`.
    func recordPage(in zone: ZoneName, after: String?, limit: Int) async throws(RecordZoneError) -> [Wire.SignedRecord]
    /// How many records a zone holds (tombstones too), and how many bytes they take.
    func zoneSize(_ zone: ZoneName) async throws(RecordZoneError) -> (records: Int, bytes: Int)
}

/// A zone as the console lists it.
public struct ZoneListing: Sendable, Hashable {
    public let name: String
    /// The zone's change counter: how many versions it has taken.
    public let sequence: Int64
}

/// The nonces a single server has seen, in memory (``SQLiteZoneStorage``: one server per file),
/// in one set per minute of the requests' signed times. A replay carries the request's own
/// time (the signature covers both), so a claim looks in one set; sets whose minute is past the
/// horizon by the server's clock are dropped whole. Claiming and forgetting cost the same at a
/// hundred requests a second or ten thousand (a map pruned by a scan of every entry, every
/// 1,024 requests, held a million entries at 4,000 requests a second and copied them four times
/// a second).
final class NonceMemory: Sendable {
    private struct State {
        var minutes: [Int64: Set<Data>] = [:]
        var prunedAt: Int64 = .min
    }
    private let state = Mutex(State())

    func claim(_ nonce: Data, at time: Date, horizon: TimeInterval, now: Date = Date()) -> Bool {
        let minute = Int64((time.timeIntervalSince1970 / 60).rounded(.down))
        let current = Int64((now.timeIntervalSince1970 / 60).rounded(.down))
        return state.withLock { state in
            guard state.minutes[minute, default: []].insert(nonce).inserted else { return false }
            if current > state.prunedAt {
                state.prunedAt = current
                let oldest = current - Int64((horizon / 60).rounded(.up)) - 1
                state.minutes = state.minutes.filter { $0.key >= oldest }
            }
            return true
        }
    }

    /// How many nonces are kept (for tests).
    var count: Int { state.withLock { $0.minutes.values.reduce(0) { $0 + $1.count } } }
}

extension ZoneStorage {
    /// One server alone: its own memory.
    public func setTyping(_ typing: Bool, identity: String, in zone: ZoneName) async -> Bool {
        self.typing.set(typing, identity: identity, in: zone)
    }

    public func setPresence(_ online: Bool, identity: String) async -> Bool {
        presence.set(online, identity: identity)
    }

    public func run() async {}

    /// A save no zone's own records govern (``save(_:policy:feedSince:visibleTo:gate:)`` without a gate).
    public func save(_ records: [Record], policy: SavePolicy, feedSince token: ChangeToken?,
                     visibleTo isVisible: @escaping @Sendable (ZoneName) -> Bool) async throws(RecordZoneError) -> SaveAnswer {
        try await save(records, policy: policy, feedSince: token, visibleTo: isVisible, gate: nil)
    }

    public func fetchDatabaseChanges(since token: ChangeToken?) async throws(RecordZoneError) -> DatabaseChanges {
        try await fetchDatabaseChanges(since: token, visibleTo: { _ in true })
    }

    public func save(_ records: [Record], policy: SavePolicy) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try await save(records, policy: policy, feedSince: nil, visibleTo: { _ in true }, gate: nil).results
    }

    public func save(_ records: [Record], policy: SavePolicy, catchingUpFrom databaseToken: ChangeToken?) async throws(RecordZoneError) -> SaveAnswer {
        try await save(records, policy: policy, feedSince: databaseToken, visibleTo: { _ in true }, gate: nil)
    }

    public func fetchChanges(in zone: ZoneName, since token: ChangeToken?, limit: Int) async throws(RecordZoneError) -> ZoneChanges {
        let page = try await changes(in: zone, since: token, limit: limit, readable: nil)
        var records = [Record](), rejected = [RejectedRecord]()
        for signed in page.records {
            do { records.append(try signed.decoded()) } catch {
                rejected.append(RejectedRecord(recordID: nil, reason: .malformed(error.description), source: "server #\(signed.changeTag ?? "?")"))
            }
        }
        return ZoneChanges(records: records, rejected: rejected, token: page.token, moreComing: page.moreComing)
    }

    public func fetch(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try await stored(ids).map { result in
            result.flatMap { signed in
                Result { () throws(RecordDecodingError) in try signed.decoded() }.mapError { RecordZoneError(.malformed, "stored record: \($0)") }
            }
        }
    }
}

/// The fields queries find through an index, per record type (a chat server: Speaker `tags`):
/// an `equals` or `contains` on one of them costs the matches, not the zone. Each storage keeps
/// a table of (zone, type, field, value, name) rows, written with the record.
public struct QueryIndex: Sendable {
    public let fields: [String: Set<String>]

    public init(_ fields: [String: Set<String>]) { self.fields = fields }

    var isEmpty: Bool { fields.isEmpty }

    /// The declaration as text: the index is rebuilt when it differs from the one it was built for.
    var declaration: String {
        fields.keys.sorted().map { "\($0):\(fields[$0, default: []].sorted().joined(separator: ","))" }.joined(separator: ";")
    }

    /// The key an indexed value is stored under: its JSON form, keys sorted (exact and stable).
    static func key(_ value: FieldValue) -> Data? {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return try? encoder.encode(value)
    }

    /// An `equals` or `contains` predicate on an indexed field, as a lookup (nil: scan the type).
    func lookup(for query: RecordQuery) -> (field: String, value: Data)? {
        guard let indexed = fields[query.recordType] else { return nil }
        for predicate in query.predicates {
            switch predicate {
            case .equals(let field, let value) where indexed.contains(field) && value.listValue == nil,
                .contains(let field, let value) where indexed.contains(field):
                if let key = Self.key(value) { return (field, key) }
            default: continue
            }
        }
        return nil
    }

    /// The index rows of one version: (field, value) per indexed field, list items one by one;
    /// none for a tombstone.
    func entries(of record: Record) -> [(field: String, value: Data)] {
        guard !record.isDeleted, let indexed = fields[record.recordType] else { return [] }
        var entries = [(field: String, value: Data)]()
        for field in indexed.sorted() {
            guard let value = record[field] else { continue }
            for item in Set((value.listValue ?? [value]).compactMap(Self.key)).sorted(by: { $0.lexicographicallyPrecedes($1) }) { entries.append((field, item)) }
        }
        return entries
    }
}

extension DatabaseChanges {
    /// The feed limited to the zones a reader may see.
    func filtered(_ isVisible: (ZoneName) -> Bool) -> DatabaseChanges {
        DatabaseChanges(changedZones: changedZones.filter(isVisible), deletedZones: deletedZones.filter(isVisible), token: token)
    }
}

extension SaveCatchUp {
    /// The catch-up's feed limited to the zones a reader may see (a writer sees its own zones).
    func filteringFeed(_ isVisible: (ZoneName) -> Bool) -> SaveCatchUp {
        SaveCatchUp(database: database?.filtered(isVisible), zones: zones)
    }
}
