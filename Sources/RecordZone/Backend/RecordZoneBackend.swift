import Foundation

/// A place records live and sync through: a folder, a server, or memory.
///
/// Every backend follows the same contract, checked by one conformance suite:
/// - zones are created idempotently; deleting one expires every token issued for it;
/// - ``fetchChanges(in:since:limit:)`` returns each change exactly once across pages, with a
///   new token per page; records that fail the ``RecordPolicy`` are reported in
///   ``ZoneChanges/rejected`` and never returned;
/// - ``save(_:policy:)`` answers per record: the version now winning in the zone, or an error;
/// - deletes are signed tombstones, saved like any other version.
public protocol RecordZoneBackend: Sendable {
    /// Creates a zone; creating one that exists does nothing.
    func createZone(_ zone: ZoneName) async throws(RecordZoneError)
    /// The zones that exist now.
    func zones() async throws(RecordZoneError) -> [ZoneName]
    /// Deletes a zone and its records. Tokens issued for it expire.
    func deleteZone(_ zone: ZoneName) async throws(RecordZoneError)

    /// Which zones changed or were deleted since a database token (nil: all zones).
    func fetchDatabaseChanges(since token: ChangeToken?) async throws(RecordZoneError) -> DatabaseChanges
    /// One page of a zone's changes since a token (nil: from the start), at most `limit` records.
    /// - Throws: ``RecordZoneError/Code/changeTokenExpired`` for a token of an earlier
    ///   incarnation of the zone; ``RecordZoneError/Code/zoneNotFound``.
    func fetchChanges(in zone: ZoneName, since token: ChangeToken?, limit: Int) async throws(RecordZoneError) -> ZoneChanges

    /// Saves signed versions (tombstones included), at most ``Record/maximumBatchSize``.
    /// - Returns: one result per input record, in order: the version now winning in the zone,
    ///   or why this one was refused.
    func save(_ records: [Record], policy: SavePolicy) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>]
    /// Saves as ``save(_:policy:)`` and tells, from the same step, how the zones moved and (given
    /// the caller's database token) what else changed since it: ``SaveCatchUp``. Backends that
    /// cannot tell answer ``SaveCatchUp/none`` (the default).
    func save(_ records: [Record], policy: SavePolicy, catchingUpFrom databaseToken: ChangeToken?) async throws(RecordZoneError) -> SaveAnswer
    /// The current version of each record (tombstones included), or ``RecordZoneError/Code/unknownItem``.
    func fetch(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>]
    /// A record anyone may read before holding any key (a zone server answers it without
    /// authentication when its access policy says the record is public, ``ZoneAccessPolicy/isPublic(_:)``),
    /// checked by the backend's policy as any record: nil when the backend does not hold it.
    func fetchPublic(_ id: RecordID) async throws(RecordZoneError) -> Record?
    /// Live (not deleted) records of one type matching the query, one page at a time.
    func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) async throws(RecordZoneError) -> QueryResult

    /// Stores an asset and returns its reference. When `expected` is given, the bytes must match it.
    /// - Throws: ``RecordZoneError/Code/assetCorrupt`` when they do not.
    func putAsset(_ data: Data, expected: AssetReference?) async throws(RecordZoneError) -> AssetReference
    /// The asset's bytes, checked against its hash.
    /// - Throws: ``RecordZoneError/Code/assetCorrupt``, ``RecordZoneError/Code/unknownItem``.
    func asset(_ reference: AssetReference) async throws(RecordZoneError) -> Data

    /// Returns as soon as the zone has moved past `token` (true), or after `timeout` (false).
    func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool

    /// Whether the backend carries typing indicators (a zone server, memory): a folder does not
    /// (nothing in it is live: docs/PROTOCOL.md §2, "Typing").
    var carriesTyping: Bool { get }
    /// Says that `identity` types in `zone` (for ``TypingBoard/lifetime`` unless said again) or
    /// stopped. A server takes the identity from the request's signature.
    /// - Throws: ``RecordZoneError/Code/requestRateLimited`` when said again too soon.
    func setTyping(_ typing: Bool, in zone: ZoneName, as identity: String) async throws(RecordZoneError)
    /// Who types in `zone`: at once when it differs from `version` (or `version` is nil), else
    /// at the next change or after `timeout`.
    func typing(in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> TypingState
    /// Says that `identity` is online (for ``PresenceBoard/lifetime`` unless said again) or went
    /// away; carried where typing is (``carriesTyping``). A server takes the identity from the
    /// request's signature.
    /// - Throws: ``RecordZoneError/Code/requestRateLimited`` when said again too soon.
    func setPresence(_ online: Bool, as identity: String) async throws(RecordZoneError)
    /// The presence of those of `identities` who take part in `zone` now (the others are left
    /// out; a server answers only to someone who takes part too): at once when it differs from
    /// `version` (or `version` is nil), else at the next change or after `timeout`.
    func presence(of identities: [String], in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> PresenceState
}

extension RecordZoneBackend {
    /// A backend without a live channel (a folder) carries no typing: nothing is sent, nobody types.
    public var carriesTyping: Bool { false }
    public func setTyping(_ typing: Bool, in zone: ZoneName, as identity: String) async throws(RecordZoneError) {}
    public func typing(in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> TypingState {
        if version != nil { try? await Task.sleep(for: timeout) }
        return TypingState(identities: [], version: 0)
    }
    public func setPresence(_ online: Bool, as identity: String) async throws(RecordZoneError) {}
    public func presence(of identities: [String], in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> PresenceState {
        if version != nil { try? await Task.sleep(for: timeout) }
        return PresenceState(presence: [], version: 0)
    }

    /// A backend anyone who reaches it may read (memory, a folder) fetches it as any record.
    public func fetchPublic(_ id: RecordID) async throws(RecordZoneError) -> Record? {
        switch try await fetch([id]).first {
        case .success(let record)?: return record
        case .failure(let error)? where error.code == .unknownItem || error.code == .zoneNotFound: return nil
        case .failure(let error)?: throw error
        case nil: return nil
        }
    }

    public func save(_ records: [Record], policy: SavePolicy, catchingUpFrom databaseToken: ChangeToken?) async throws(RecordZoneError) -> SaveAnswer {
        SaveAnswer(results: try await save(records, policy: policy))
    }

    /// Saves with the merge rule (``SavePolicy/merge``).
    public func save(_ records: [Record]) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try await save(records, policy: .merge)
    }

    /// Saves signed tombstones. Each must have ``Record/isDeleted`` set.
    public func delete(_ tombstones: [Record]) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        guard tombstones.allSatisfy(\.isDeleted) else {
            throw RecordZoneError(.invalidArguments, "delete takes signed tombstones (isDeleted set)")
        }
        return try await save(tombstones, policy: .merge)
    }

    public func putAsset(_ data: Data) async throws(RecordZoneError) -> AssetReference {
        try await putAsset(data, expected: nil)
    }
}

/// How a save treats the version already in the zone.
public enum SavePolicy: String, Sendable, Hashable, Codable {
    /// The merge rule decides: the highest (clock, author key) wins.
    case merge
    /// CloudKit's optimistic locking: the save fails with ``RecordZoneError/Code/serverRecordChanged``
    /// (carrying the server's record) unless the record's ``ServerMetadata/changeTag`` matches
    /// the stored version's, or no version is stored and the record has no change tag.
    case ifServerRecordUnchanged
}

/// One page of a zone's changes.
public struct ZoneChanges: Sendable {
    /// Changed records, tombstones included, in the order the backend logged them.
    public var records: [Record]
    /// Records that failed verification or ownership, with reasons. Never in ``records``.
    public var rejected: [RejectedRecord]
    /// Where the next page starts; store it with the records applied.
    public var token: ChangeToken
    /// Whether more changes wait beyond this page.
    public var moreComing: Bool

    public init(records: [Record], rejected: [RejectedRecord], token: ChangeToken, moreComing: Bool) {
        self.records = records
        self.rejected = rejected
        self.token = token
        self.moreComing = moreComing
    }

    /// The live records that changed.
    public var changedRecords: [Record] { records.filter { !$0.isDeleted } }
    /// The IDs of records deleted (their tombstones are in ``records``).
    public var deletedRecordIDs: [RecordID] { records.filter(\.isDeleted).map(\.id) }
}

/// The database-level change feed: which zones changed since a token.
public struct DatabaseChanges: Sendable, Hashable {
    public var changedZones: [ZoneName]
    public var deletedZones: [ZoneName]
    public var token: ChangeToken

    public init(changedZones: [ZoneName], deletedZones: [ZoneName], token: ChangeToken) {
        self.changedZones = changedZones
        self.deletedZones = deletedZones
        self.token = token
    }
}

/// Limits every backend enforces.
public enum BackendLimits {
    /// The largest asset: 32 MiB.
    public static let maximumAssetSize = 32 << 20
    /// The largest page of changes or query results.
    public static let maximumPageSize = 1000

    package static func checkBatch(_ count: Int) throws(RecordZoneError) {
        guard count <= Record.maximumBatchSize else {
            throw RecordZoneError(.limitExceeded, "a batch holds at most \(Record.maximumBatchSize) records, got \(count)")
        }
    }

    package static func clampPage(_ limit: Int) -> Int { min(max(limit, 1), maximumPageSize) }
}
