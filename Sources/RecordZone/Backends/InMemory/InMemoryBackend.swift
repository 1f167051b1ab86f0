import Foundation

/// A backend that keeps everything in memory: fast tests of the layers above, and the
/// reference the conformance suite holds the other backends to.
///
/// It stores each version's canonical bytes and verifies them again on every read, as a
/// folder or server reader would.
public actor InMemoryBackend: RecordZoneBackend {
    static let kind = "memory"

    struct Entry {
        var sequence: UInt64
        var key: String
        var data: Data
    }

    struct Zone {
        var incarnation = UUID().uuidString
        var sequence: UInt64 = 0
        /// Every stored change in sequence order; an entry is stale once its key has a later one.
        var log: [Entry] = []
        var latest: [String: UInt64] = [:]
        var winners: [RecordID: Record] = [:]
        var databaseSequence: UInt64 = 0

        mutating func append(key: String, data: Data) -> UInt64 {
            sequence += 1
            log.append(Entry(sequence: sequence, key: key, data: data))
            latest[key] = sequence
            return sequence
        }
    }

    public nonisolated let policy: RecordPolicy
    private let instance = UUID().uuidString
    var zoneTable: [ZoneName: Zone] = [:]
    private var deletedAt: [ZoneName: UInt64] = [:]
    var databaseSequence: UInt64 = 0
    private var assets: [Data: Data] = [:]
    nonisolated let waiters = ChangeWaiters()
    var injected = 0

    /// - Parameter policy: the checks applied to every record saved and read.
    public init(policy: RecordPolicy = RecordPolicy()) {
        self.policy = policy
    }

    public func createZone(_ zone: ZoneName) throws(RecordZoneError) {
        guard zoneTable[zone] == nil else { return }
        databaseSequence += 1
        var fresh = Zone()
        fresh.databaseSequence = databaseSequence
        zoneTable[zone] = fresh
    }

    public func zones() -> [ZoneName] { zoneTable.keys.sorted() }

    public func deleteZone(_ zone: ZoneName) throws(RecordZoneError) {
        guard zoneTable.removeValue(forKey: zone) != nil else {
            throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist")
        }
        databaseSequence += 1
        deletedAt[zone] = databaseSequence
        wake(zone)
    }

    public func fetchDatabaseChanges(since token: ChangeToken?) throws(RecordZoneError) -> DatabaseChanges {
        var since: UInt64 = 0
        if let token {
            let contents = try TokenContents(token, expecting: .database, backend: Self.kind)
            guard contents.incarnation == instance else {
                throw RecordZoneError(.changeTokenExpired, "database token is from another store")
            }
            since = SequencePosition.decode(contents.position)
        }
        let changed = zoneTable.filter { $0.value.databaseSequence > since }.keys.sorted()
        let deleted = deletedAt.filter { $0.value > since && zoneTable[$0.key] == nil && token != nil }.keys.sorted()
        let next = TokenContents(kind: .database, backend: Self.kind, zone: "", incarnation: instance, position: SequencePosition.encode(databaseSequence))
        return DatabaseChanges(changedZones: changed, deletedZones: deleted, token: next.token)
    }

    public func fetchChanges(in zoneName: ZoneName, since token: ChangeToken?, limit: Int) throws(RecordZoneError) -> ZoneChanges {
        try fetchChanges(in: zoneName, since: token, limit: limit, reader: policy)
    }

    /// Fetches changes verified with a reader's own policy (see ``connection(policy:)``).
    func fetchChanges(in zoneName: ZoneName, since token: ChangeToken?, limit: Int, reader: RecordPolicy) throws(RecordZoneError) -> ZoneChanges {
        let zone = try existing(zoneName)
        let since = try TokenContents.zonePosition(token, backend: Self.kind, zone: zoneName, incarnation: zone.incarnation).map(SequencePosition.decode) ?? 0
        let limit = BackendLimits.clampPage(limit)
        var records = [Record](), rejected = [RejectedRecord]()
        var position = since
        var index = Self.firstIndex(in: zone.log, after: since)
        var page = [Entry]()
        while index < zone.log.count, page.count < limit {
            let entry = zone.log[index]
            index += 1
            position = entry.sequence
            if zone.latest[entry.key] == entry.sequence { page.append(entry) }
        }
        for (entry, outcome) in zip(page, reader.admit(batch: page.map(\.data), source: { "memory #\(page[$0].sequence)" })) {
            switch outcome {
            case .success(var record):
                record.serverMetadata = ServerMetadata(changeTag: String(entry.sequence))
                records.append(record)
            case .failure(let rejection):
                rejected.append(rejection)
            }
        }
        let moreComing = zone.log[index...].contains { zone.latest[$0.key] == $0.sequence }
        if !moreComing { position = zone.sequence }
        return ZoneChanges(records: records, rejected: rejected, token: makeToken(zoneName, zone, position), moreComing: moreComing)
    }

    public func save(_ records: [Record], policy savePolicy: SavePolicy) throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try BackendLimits.checkBatch(records.count)
        var results = [Result<Record, RecordZoneError>]()
        var touched = Set<ZoneName>()
        let plan = SaveChecks.plan(records, savePolicy: savePolicy, policy: policy) { record in
            guard let zone = zoneTable[record.id.zone] else {
                return .failure(RecordZoneError(.zoneNotFound, "zone '\(record.id.zone)' does not exist", recordID: record.id))
            }
            return .success(zone.winners[record.id])
        }
        for (record, decision) in zip(records, plan.decisions) {
            let zoneName = record.id.zone
            let data: Data
            switch decision {
            case .refused(let error): results.append(.failure(error)); continue
            case .superseded(let winner): results.append(.success(winner)); continue
            case .store(let encoded): data = encoded
            }
            databaseSequence += 1
            // Mutated in place (the default subscript), never copied out: zones can be large.
            var stored = record
            stored.serverMetadata = ServerMetadata(
                changeTag: String(zoneTable[zoneName, default: Zone()].append(key: record.id.name, data: data)), receivedAt: Date())
            zoneTable[zoneName, default: Zone()].winners[record.id] = stored
            zoneTable[zoneName, default: Zone()].databaseSequence = databaseSequence
            touched.insert(zoneName)
            results.append(.success(stored))
        }
        // Stored (this backend's memory is its storage): the chains they made are now the pins.
        policy.pins.publish(plan.pins)
        touched.forEach(wake)
        return results
    }

    public func fetch(_ ids: [RecordID]) throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try fetch(ids, reader: policy)
    }

    func fetch(_ ids: [RecordID], reader: RecordPolicy) throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try BackendLimits.checkBatch(ids.count)
        return ids.map { id in
            guard let zone = zoneTable[id.zone] else {
                return .failure(RecordZoneError(.zoneNotFound, "zone '\(id.zone)' does not exist", recordID: id))
            }
            guard let record = zone.winners[id] else {
                return .failure(RecordZoneError(.unknownItem, "no record \(id)", recordID: id))
            }
            if reader !== policy, let reason = reader.check(record) {
                return .failure(SaveChecks.error(for: reason, recordID: id))
            }
            return .success(record)
        }
    }

    public func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) throws(RecordZoneError) -> QueryResult {
        try self.query(query, cursor: cursor, limit: limit, reader: policy)
    }

    func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int, reader: RecordPolicy) throws(RecordZoneError) -> QueryResult {
        var result = try query.run(over: existing(query.zone).winners.values, cursor: cursor, limit: limit)
        if reader !== policy { result.records.removeAll { reader.check($0) != nil } }
        return result
    }

    /// A view of this backend for one client that verifies what it reads with its own policy
    /// (its own pinned keys), as a separate peer would. Saves are still checked by the
    /// backend's policy.
    public nonisolated func connection(policy reader: RecordPolicy) -> InMemoryConnection {
        InMemoryConnection(backend: self, reader: reader)
    }

    public func putAsset(_ data: Data, expected: AssetReference?) throws(RecordZoneError) -> AssetReference {
        let reference = try AssetChecks.reference(for: data, expected: expected)
        assets[reference.hash] = data
        return reference
    }

    public func asset(_ reference: AssetReference) throws(RecordZoneError) -> Data {
        guard let data = assets[reference.hash] else {
            throw RecordZoneError(.unknownItem, "no asset \(reference)")
        }
        try AssetChecks.verify(data, against: reference)
        return data
    }

    public func waitForChanges(in zoneName: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
        let generation = waiters.generation(of: zoneName)
        if try hasChanges(zoneName, since: token) { return true }
        return await waiters.wait(for: zoneName, after: generation, timeout: timeout)
    }

    /// Typing indicators, as a zone server keeps them: in memory, for anyone (memory has no access rules).
    nonisolated let typingBoard = TypingBoard()
    public nonisolated var carriesTyping: Bool { true }
    public func setTyping(_ typing: Bool, in zone: ZoneName, as identity: String) async throws(RecordZoneError) {
        guard typingBoard.set(typing, identity: identity, in: zone) else {
            throw RecordZoneError(.requestRateLimited, "typing said again within \(TypingBoard.minimumInterval)")
        }
    }
    public func typing(in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> TypingState {
        await typingBoard.wait(in: zone, since: version, timeout: timeout)
    }
    /// Presence, likewise: anyone's, to anyone.
    nonisolated let presenceBoard = PresenceBoard()
    public func setPresence(_ online: Bool, as identity: String) async throws(RecordZoneError) {
        guard presenceBoard.set(online, identity: identity) else {
            throw RecordZoneError(.requestRateLimited, "presence said again within \(PresenceBoard.minimumInterval)")
        }
    }
    public func presence(of identities: [String], in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> PresenceState {
        await presenceBoard.wait(of: identities, since: version, timeout: timeout)
    }

    // MARK: - Helpers (internal: the test support plants records through them)

    func existing(_ zone: ZoneName) throws(RecordZoneError) -> Zone {
        guard let found = zoneTable[zone] else { throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist") }
        return found
    }

    private func hasChanges(_ zoneName: ZoneName, since token: ChangeToken?) throws(RecordZoneError) -> Bool {
        let zone = try existing(zoneName)
        let since = try TokenContents.zonePosition(token, backend: Self.kind, zone: zoneName, incarnation: zone.incarnation).map(SequencePosition.decode) ?? 0
        return zone.sequence > since
    }

    private func makeToken(_ name: ZoneName, _ zone: Zone, _ position: UInt64) -> ChangeToken {
        TokenContents(kind: .zone, backend: Self.kind, zone: name.rawValue, incarnation: zone.incarnation, position: SequencePosition.encode(position)).token
    }

    func wake(_ zone: ZoneName) { waiters.wake(zone) }

    /// Which zones move, as they do (``LiveChanges``): each followed zone is watched, and one
    /// that moved past the token it was followed from is said at once.
    nonisolated func movedZones() -> MovedZones {
        let id = UUID()
        let waiters = self.waiters
        return MovedZones(followed: { [weak self] stream, zones in
            waiters.observe(zones.keys, as: id) { [weak stream] zone in stream?.moved(zone) }
            Task { [weak stream] in
                for (zone, token) in zones where (try? await self?.hasChanges(zone, since: token)) ?? true { stream?.moved(zone) }
            }
        }, closing: { waiters.stopObserving(id) })
    }

    private static func firstIndex(in log: [Entry], after sequence: UInt64) -> Int {
        var low = 0, high = log.count
        while low < high {
            let mid = (low + high) / 2
            if log[mid].sequence <= sequence { low = mid + 1 } else { high = mid }
        }
        return low
    }

}

/// Asset hashing and verification, the same for every backend.
package enum AssetChecks {
    package static func reference(for data: Data, expected: AssetReference?) throws(RecordZoneError) -> AssetReference {
        guard data.count <= BackendLimits.maximumAssetSize else {
            throw RecordZoneError(.limitExceeded, "asset is \(data.count) bytes; the limit is \(BackendLimits.maximumAssetSize)")
        }
        let reference = AssetReference(for: data)
        if let expected, expected != reference {
            throw RecordZoneError(.assetCorrupt, "asset bytes hash to \(reference.hexHash), not \(expected.hexHash)")
        }
        return reference
    }

    package static func verify(_ data: Data, against reference: AssetReference) throws(RecordZoneError) {
        guard AssetReference(for: data) == reference else {
            throw RecordZoneError(.assetCorrupt, "stored asset does not match its hash \(reference.hexHash)")
        }
    }
}

/// One client's view of an ``InMemoryBackend``: reads are verified with the client's policy.
public struct InMemoryConnection: LiveChanges {
    public let backend: InMemoryBackend
    public let reader: RecordPolicy

    public func createZone(_ zone: ZoneName) async throws(RecordZoneError) { try await backend.createZone(zone) }
    public func zones() async throws(RecordZoneError) -> [ZoneName] { await backend.zones() }
    public func deleteZone(_ zone: ZoneName) async throws(RecordZoneError) { try await backend.deleteZone(zone) }
    public func fetchDatabaseChanges(since token: ChangeToken?) async throws(RecordZoneError) -> DatabaseChanges {
        try await backend.fetchDatabaseChanges(since: token)
    }
    public func fetchChanges(in zone: ZoneName, since token: ChangeToken?, limit: Int) async throws(RecordZoneError) -> ZoneChanges {
        try await backend.fetchChanges(in: zone, since: token, limit: limit, reader: reader)
    }
    public func save(_ records: [Record], policy: SavePolicy) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try await backend.save(records, policy: policy)
    }
    public func fetch(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try await backend.fetch(ids, reader: reader)
    }
    public func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) async throws(RecordZoneError) -> QueryResult {
        try await backend.query(query, cursor: cursor, limit: limit, reader: reader)
    }
    public func putAsset(_ data: Data, expected: AssetReference?) async throws(RecordZoneError) -> AssetReference {
        try await backend.putAsset(data, expected: expected)
    }
    public func asset(_ reference: AssetReference) async throws(RecordZoneError) -> Data { try await backend.asset(reference) }
    public func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
        try await backend.waitForChanges(in: zone, since: token, timeout: timeout)
    }
    public func openChangeStream() async throws(RecordZoneError) -> any ChangeStream { backend.movedZones() }
    public var carriesTyping: Bool { true }
    public func setTyping(_ typing: Bool, in zone: ZoneName, as identity: String) async throws(RecordZoneError) {
        try await backend.setTyping(typing, in: zone, as: identity)
    }
    public func typing(in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> TypingState {
        try await backend.typing(in: zone, since: version, timeout: timeout)
    }
    public func setPresence(_ online: Bool, as identity: String) async throws(RecordZoneError) {
        try await backend.setPresence(online, as: identity)
    }
    public func presence(of identities: [String], in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> PresenceState {
        try await backend.presence(of: identities, in: zone, since: version, timeout: timeout)
    }
}
