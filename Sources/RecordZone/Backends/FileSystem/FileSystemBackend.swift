import Foundation

/// A record zone store in a plain folder, which may be shared over NFS or kept in step between
/// machines by a file-sync tool.
///
/// The actor runs on its own serial dispatch queue (its executor), so file reads, writes and
/// fsyncs never hold a thread of Swift's cooperative pool.
///
/// Each device writes only its own files: immutable segments under its own folder, written to
/// a temporary name, fsynced, then linked into place, then the folder fsynced. Nobody edits or
/// deletes another device's file. A change token is a version vector: per device, how far its
/// gap-free run of segments has been read. See ``FolderLayout`` for the on-disk format.
///
/// ```swift
/// let backend = try FileSystemBackend(root: "/srv/shared/chat", device: "laptop", policy: policy)
/// ```
public actor FileSystemBackend: RecordZoneBackend {
    static let kind = "filesystem"

    private nonisolated let executor = QueueExecutor(label: "convkit.folder")
    public nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    public nonisolated let policy: RecordPolicy
    public nonisolated let layout: FolderLayout
    /// The device this backend writes as; nil for a read-only reader.
    public nonisolated let device: String?
    private let lock: DeviceLock?
    private let pollInterval: Duration

    /// What has been read of one zone generation: the winners and how far each device was read.
    private struct Materialized {
        var generation: UInt64
        var position = VersionVector()
        var winners: [RecordID: Record] = [:]
    }
    private var materialized: [ZoneName: Materialized] = [:]

    /// Every key that claims an identity in one zone generation, over all devices' readable
    /// segments: read once, then only what is new.
    private struct ZoneClaims {
        var generation: UInt64
        var read: [String: UInt64] = [:]
        var claims = KeyClaims()
    }
    private var zoneClaims: [ZoneName: ZoneClaims] = [:]
    private var nextSequence: [String: UInt64] = [:]

    /// Opens (creating if needed) a zone folder.
    /// - Parameters:
    ///   - root: the shared folder.
    ///   - device: the name this process writes as (`A–Z a–z 0–9 . _ -`); nil opens read-only.
    ///   - policy: the checks applied to every record read or written.
    ///   - pollInterval: how often ``waitForChanges(in:since:timeout:)`` looks at the folder.
    /// - Throws: ``RecordZoneError/Code/deviceInUse`` when another process writes as `device`.
    public init(root: String, device: String?, policy: RecordPolicy = RecordPolicy(), pollInterval: Duration = .milliseconds(20)) throws(RecordZoneError) {
        let layout = FolderLayout(root: root)
        self.layout = layout
        self.policy = policy
        self.pollInterval = pollInterval
        self.device = device
        if let device {
            _ = try ZoneName(device)  // same portable character set as zone names
            try layout.prepare(device: device)
            lock = try DeviceLock(path: layout.lockFile(device: device), device: device)
        } else {
            try layout.checkFormat()
            lock = nil
        }
    }

    // MARK: Zones

    public func createZone(_ zone: ZoneName) throws(RecordZoneError) {
        let state = try layout.zoneState(zone)
        guard !state.exists else { return }
        try FileIO.makeDirectory(layout.generationFolder(zone, state.generation + 1))
    }

    public func zones() throws(RecordZoneError) -> [ZoneName] {
        try layout.zoneNames().filter { (try? layout.zoneState($0).exists) == true }
    }

    public func deleteZone(_ zone: ZoneName) throws(RecordZoneError) {
        let device = try writingDevice()
        let generation = try currentGeneration(zone)
        let marker = layout.generationFolder(zone, generation) + "/" + FolderLayout.deletedMarkerPrefix + device
        try FileIO.writeAtomically(Data("deleted by \(device)\n".utf8), to: marker)
        materialized[zone] = nil
    }

    public func fetchDatabaseChanges(since token: ChangeToken?) throws(RecordZoneError) -> DatabaseChanges {
        var previous = [String: Data]()
        if let token {
            let contents = try TokenContents(token, expecting: .database, backend: Self.kind)
            guard let parsed = Self.decodeDigests(contents.position) else {
                throw RecordZoneError(.invalidArguments, "malformed database change token")
            }
            previous = parsed
        }
        var current = [String: Data]()
        var changed = [ZoneName]()
        for zone in try layout.zoneNames() {
            let state = try layout.zoneState(zone)
            guard state.exists else { continue }
            let digest = try layout.digest(zone, generation: state.generation)
            current[zone.rawValue] = digest
            if previous[zone.rawValue] != digest { changed.append(zone) }
        }
        let deleted = token == nil ? [] : previous.keys.filter { current[$0] == nil }.compactMap { try? ZoneName($0) }.sorted()
        let next = TokenContents(kind: .database, backend: Self.kind, zone: "", incarnation: "", position: Self.encodeDigests(current))
        return DatabaseChanges(changedZones: changed, deletedZones: deleted, token: next.token)
    }

    // MARK: Changes

    public func fetchChanges(in zone: ZoneName, since token: ChangeToken?, limit: Int) throws(RecordZoneError) -> ZoneChanges {
        let generation = try currentGeneration(zone)
        let start = try position(from: token, zone: zone, generation: generation)
        let page = try read(zone, generation: generation, from: start, limit: BackendLimits.clampPage(limit))
        let next = makeToken(zone, generation, page.position)
        return ZoneChanges(records: page.records, rejected: page.rejected, token: next, moreComing: page.moreComing)
    }

    public func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: timeout)
        while true {
            let generation = try currentGeneration(zone)
            let start = try position(from: token, zone: zone, generation: generation)
            if try layout.hasReadableSegment(zone, generation: generation, after: start) { return true }
            if clock.now >= deadline || Task.isCancelled { return false }
            do { try await Task.sleep(for: min(pollInterval, deadline - clock.now)) } catch { return false }
        }
    }

    // MARK: Records

    public func save(_ records: [Record], policy savePolicy: SavePolicy) throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try BackendLimits.checkBatch(records.count)
        let device = try writingDevice()
        var results = [Result<Record, RecordZoneError>?](repeating: nil, count: records.count)
        let byZone = Dictionary(grouping: records.indices, by: { records[$0].id.zone })
        for zone in byZone.keys.sorted() {
            guard let indices = byZone[zone] else { continue }
            let generation: UInt64
            do { generation = try currentGeneration(zone) } catch {
                for i in indices { results[i] = .failure(RecordZoneError(error.code, error.message, recordID: records[i].id)) }
                continue
            }
            var state = try refreshed(zone, generation: generation)
            var accepted = [(index: Int, record: Record, bytes: Data)]()
            var pendingIndex = [RecordID: Int]()
            let admitted = SaveChecks.admit(indices.map { records[$0] }, policy: policy)
            for (i, outcome) in zip(indices, admitted) {
                let record = records[i]
                // A version earlier in this batch counts as held.
                let current = pendingIndex[record.id].map { accepted[$0].record } ?? state.winners[record.id]
                switch SaveChecks.decide(record, admitted: outcome, current: current, policy: savePolicy) {
                case .refused(let error): results[i] = .failure(error)
                case .superseded(let winner): results[i] = .success(winner)
                case .store(let encoded):
                    pendingIndex[record.id] = accepted.count
                    accepted.append((i, record, encoded))
                }
            }
            guard !accepted.isEmpty else { continue }
            let sequence = try allocateSequence(zone, generation: generation, device: device)
            try layout.writeSegment(Segment.encode(accepted.map(\.bytes)), zone: zone, generation: generation, device: device, sequence: sequence)
            // Our own segment is applied directly when everything before it was read already.
            if state.position[device] == DevicePosition(segment: sequence - 1, offset: 0) {
                for (offset, item) in accepted.enumerated() {
                    var stored = item.record
                    stored.serverMetadata = ServerMetadata(changeTag: Self.changeTag(device, sequence, offset), receivedAt: Date())
                    MergeRule.merge(stored, into: &state.winners)
                }
                state.position[device] = DevicePosition(segment: sequence, offset: 0)
                materialized[zone] = state
            } else {
                state = try refreshed(zone, generation: generation)
            }
            for item in accepted {
                results[item.index] = state.winners[item.record.id].map { .success($0) }
                    ?? .failure(RecordZoneError(.internalError, "saved record is not readable back", recordID: item.record.id))
            }
        }
        return results.map { $0 ?? .failure(RecordZoneError(.internalError, "no result")) }
    }

    public func fetch(_ ids: [RecordID]) throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try BackendLimits.checkBatch(ids.count)
        var results = [Result<Record, RecordZoneError>]()
        var states = [ZoneName: Materialized]()
        for id in ids {
            if states[id.zone] == nil {
                do { states[id.zone] = try refreshed(id.zone, generation: try currentGeneration(id.zone)) } catch {
                    results.append(.failure(RecordZoneError(error.code, error.message, recordID: id)))
                    continue
                }
            }
            if let record = states[id.zone]?.winners[id] {
                results.append(.success(record))
            } else {
                results.append(.failure(RecordZoneError(.unknownItem, "no record \(id)", recordID: id)))
            }
        }
        return results
    }

    public func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) throws(RecordZoneError) -> QueryResult {
        let state = try refreshed(query.zone, generation: try currentGeneration(query.zone))
        return try query.run(over: state.winners.values, cursor: cursor, limit: limit)
    }

    // MARK: Assets

    public func putAsset(_ data: Data, expected: AssetReference?) throws(RecordZoneError) -> AssetReference {
        _ = try writingDevice()
        return try layout.assets.put(data, expected: expected)
    }

    public func asset(_ reference: AssetReference) throws(RecordZoneError) -> Data {
        try layout.assets.get(reference)
    }

    // MARK: Reading

    private struct Page {
        var records: [Record] = []
        var rejected: [RejectedRecord] = []
        var position: VersionVector
        var moreComing = false
    }

    /// Reads forward from `start`, device by device (sorted by name), each device's gap-free
    /// run of valid segments, until `limit` records (valid or rejected) have been read. The page
    /// is admitted as one batch, so what it pins does not depend on the order devices are listed.
    private func read(_ zone: ZoneName, generation: UInt64, from start: VersionVector, limit: Int) throws(RecordZoneError) -> Page {
        var page = Page(position: start)
        var gathered = [(bytes: Data, source: String, changeTag: String)]()
        for device in try layout.devices(zone, generation: generation) {
            var at = start[device] ?? DevicePosition(segment: 0, offset: 0)
            let sequences = Set(try layout.segmentSequences(zone, generation: generation, device: device))
            var sequence = at.segment + 1
            deviceLoop: while sequences.contains(sequence) {
                let path = layout.segmentFile(zone, generation, device: device, sequence: sequence)
                let source = "\(zone)/\(generation)/\(device)/\(Segment.fileName(sequence))"
                let encoded: [Data]
                switch Segment.decode(try FileIO.read(path)) {
                case .success(let records): encoded = records
                case .failure(let reason):
                    page.rejected.append(RejectedRecord(recordID: nil, reason: reason, source: source))
                    break deviceLoop
                }
                let first = min(Int(at.offset), encoded.count)
                let room = limit - gathered.count - page.rejected.count
                let end = first + min(room, encoded.count - first)
                for index in first..<end {
                    gathered.append((encoded[index], "\(source) #\(index)", Self.changeTag(device, sequence, index)))
                }
                if end < encoded.count {
                    page.moreComing = true
                    at = DevicePosition(segment: sequence - 1, offset: UInt32(end))
                    break deviceLoop
                }
                at = DevicePosition(segment: sequence, offset: 0)
                sequence += 1
            }
            page.position[device] = at
            if page.moreComing { break }
        }
        let admitted = policy.admit(batch: gathered.map(\.bytes), source: { gathered[$0].source },
                                    claimsElsewhere: { self.claims(zone, generation: generation) })
        for (item, outcome) in zip(gathered, admitted) {
            switch outcome {
            case .success(var record):
                record.serverMetadata = ServerMetadata(changeTag: item.changeTag)
                page.records.append(record)
            case .failure(let rejection):
                page.rejected.append(rejection)
            }
        }
        return page
    }

    /// What every device's readable segments of a zone claim (see ``KeyClaims``), brought up to
    /// date with the folder. A file that cannot be read or decoded ends its device's run, as in
    /// ``read(_:generation:from:limit:)``.
    private func claims(_ zone: ZoneName, generation: UInt64) -> KeyClaims {
        var state = zoneClaims[zone].flatMap { $0.generation == generation ? $0 : nil } ?? ZoneClaims(generation: generation)
        for device in (try? layout.devices(zone, generation: generation)) ?? [] {
            let sequences = Set((try? layout.segmentSequences(zone, generation: generation, device: device)) ?? [])
            var last = state.read[device] ?? 0
            while sequences.contains(last + 1),
                let data = try? FileIO.read(layout.segmentFile(zone, generation, device: device, sequence: last + 1)),
                case .success(let encoded) = Segment.decode(data) {
                for bytes in encoded {
                    guard let record = try? Record(canonical: bytes), case .success(let identity)? = policy.rules.owner(of: record) else { continue }
                    // Any key can sign a claim of its own; a key record (rotation, device) relates
                    // keys only when it is genuine.
                    if OwnershipRules.keyRules.contains(where: { $0.recordType == record.recordType }), !record.hasValidSignature() { continue }
                    state.claims.add(record, owner: identity)
                }
                last += 1
            }
            state.read[device] = last
        }
        zoneClaims[zone] = state
        return state.claims
    }

    /// The zone's materialized winners, brought up to date with the folder.
    private func refreshed(_ zone: ZoneName, generation: UInt64) throws(RecordZoneError) -> Materialized {
        var state = materialized[zone].flatMap { $0.generation == generation ? $0 : nil } ?? Materialized(generation: generation)
        while true {
            let page = try read(zone, generation: generation, from: state.position, limit: Int.max)
            for record in page.records { MergeRule.merge(record, into: &state.winners) }
            state.position = page.position
            if !page.moreComing { break }
        }
        materialized[zone] = state
        return state
    }

    private func allocateSequence(_ zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) -> UInt64 {
        let key = "\(zone)/\(generation)"
        if let next = nextSequence[key] {
            nextSequence[key] = next + 1
            return next
        }
        try layout.removeTemporaryFiles(zone, generation: generation, device: device)
        let next = (try layout.segmentSequences(zone, generation: generation, device: device).max() ?? 0) + 1
        nextSequence[key] = next + 1
        return next
    }

    private func writingDevice() throws(RecordZoneError) -> String {
        guard let device else { throw RecordZoneError(.notAuthorized, "this filesystem backend was opened read-only") }
        return device
    }

    private func currentGeneration(_ zone: ZoneName) throws(RecordZoneError) -> UInt64 {
        let state = try layout.zoneState(zone)
        guard state.exists else { throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist in \(layout.root)") }
        return state.generation
    }

    private func position(from token: ChangeToken?, zone: ZoneName, generation: UInt64) throws(RecordZoneError) -> VersionVector {
        guard let data = try TokenContents.zonePosition(token, backend: Self.kind, zone: zone, incarnation: "g\(generation)") else {
            return VersionVector()
        }
        guard let vector = VersionVector(encoded: data) else { throw RecordZoneError(.invalidArguments, "malformed change token") }
        return vector
    }

    private func makeToken(_ zone: ZoneName, _ generation: UInt64, _ vector: VersionVector) -> ChangeToken {
        TokenContents(kind: .zone, backend: Self.kind, zone: zone.rawValue, incarnation: "g\(generation)", position: vector.encoded).token
    }

    private static func changeTag(_ device: String, _ sequence: UInt64, _ index: Int) -> String {
        "\(device):\(sequence):\(index)"
    }

    private static func encodeDigests(_ digests: [String: Data]) -> Data {
        var w = ByteWriter()
        w.u32(UInt32(digests.count))
        for (zone, digest) in digests.sorted(by: { $0.key < $1.key }) {
            w.string16(zone)
            w.append(digest)
        }
        return Data(w.bytes)
    }

    private static func decodeDigests(_ data: Data) -> [String: Data]? {
        data.withUnsafeBytes { raw in
            var r = ByteReader(raw)
            guard let count = try? r.u32(), Int(count) <= r.remaining / 10 else { return nil }
            var result = [String: Data]()
            for _ in 0..<count {
                guard let zone = try? r.string16(what: "zone"), let digest = try? r.data(FolderLayout.digestLength) else { return nil }
                result[zone] = digest
            }
            return r.remaining == 0 ? result : nil
        }
    }
}

/// How far one device's segments have been read: every segment up to `segment`, plus the
/// first `offset` records of the next.
struct DevicePosition: Hashable, Sendable {
    var segment: UInt64
    var offset: UInt32
}

/// The position of a reader in a filesystem zone: one ``DevicePosition`` per device.
struct VersionVector: Hashable, Sendable {
    var devices: [String: DevicePosition] = [:]

    subscript(device: String) -> DevicePosition? {
        get { devices[device] }
        set { devices[device] = newValue }
    }

    /// `u16 count`, then per device sorted by name: `u16 len, name, u64 segment, u32 offset`.
    var encoded: Data {
        var w = ByteWriter()
        w.u16(UInt16(devices.count))
        for (device, at) in devices.sorted(by: { $0.key < $1.key }) {
            w.string16(device)
            w.u64(at.segment)
            w.u32(at.offset)
        }
        return Data(w.bytes)
    }

    init() {}

    init?(encoded data: Data) {
        guard let parsed: [String: DevicePosition] = data.withUnsafeBytes({ raw in
            var r = ByteReader(raw)
            guard let count = try? r.u16() else { return nil }
            var devices = [String: DevicePosition]()
            for _ in 0..<count {
                guard let name = try? r.string16(what: "device"), let segment = try? r.u64(), let offset = try? r.u32() else { return nil }
                devices[name] = DevicePosition(segment: segment, offset: offset)
            }
            return r.remaining == 0 ? devices : nil
        }) else { return nil }
        devices = parsed
    }
}
