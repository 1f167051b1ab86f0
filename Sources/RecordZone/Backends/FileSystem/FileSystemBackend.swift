import Foundation

/// A record zone store in a plain folder, which may be shared over NFS or kept in step between
/// machines by a file-sync tool.
///
/// The actor runs on its own serial dispatch queue (its executor), so file reads, writes and
/// fsyncs never hold a thread of Swift's cooperative pool.
///
/// Each device writes only its own files: immutable segments under its own folder (named by its
/// label and a generated ID), each named by its sequence and a digest of its content, written to
/// a temporary name, fsynced, then linked into place, then the folder fsynced. Nobody edits or
/// deletes another device's file. A reader reads every segment it has not read yet whose content
/// is what its name says; a damaged or incomplete file blocks only itself and is read again once
/// whole. A change token records, per device, which sequences have been read. See
/// ``FolderLayout`` for the on-disk format and ``FolderState`` for a writer's local state.
///
/// ```swift
/// let backend = try FileSystemBackend(root: "/srv/shared/chat", device: "laptop", policy: policy,
///                                     stateDirectory: "/var/lib/app/alice/folder")
/// ```
public actor FileSystemBackend: RecordZoneBackend {
    static let kind = "filesystem"
    static let maximumLabelLength = 40

    nonisolated let executor = QueueExecutor(label: "convkit.folder")
    public nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    public nonisolated let policy: RecordPolicy
    public nonisolated let layout: FolderLayout
    /// This writer's folder name (its label and generated ID); nil for a read-only reader.
    public nonisolated let device: String?
    let state: FolderState?
    /// The ID in the folder's FORMAT when it was opened: checked again before each operation.
    let folderID: String
    let pollInterval: Duration

    /// What this device has read of the folder: winners, positions, claims, verified files.
    let index: FolderIndex
    /// How many records a look at the folder applies to the index per transaction.
    static let refreshPage = 2_000

    /// Every key that claims an identity in one zone generation, over all devices' readable
    /// segments: taken from the index once, then only what is new.
    struct ZoneClaims {
        var generation: UInt64
        var read: Set<String> = []
        var claims = KeyClaims()
    }
    var zoneClaims: [ZoneName: ZoneClaims] = [:]
    /// When this device's folder in each zone generation was last looked over, and its time then.
    var ownChecked: [String: (stamp: String, at: ContinuousClock.Instant)] = [:]
    /// The last sequence this instance handed out, per zone generation.
    var lastSequence: [String: UInt64] = [:]

    /// Opens a zone folder.
    /// - Parameters:
    ///   - root: the shared folder.
    ///   - device: the label this process writes under (1–40 of `A–Z a–z 0–9 . _ -`); nil opens
    ///     read-only. The device's folder is the label plus a generated ID, kept in
    ///     `stateDirectory` (without one, each instance is a new device).
    ///   - policy: the checks applied to every record read or written.
    ///   - pollInterval: how often ``waitForChanges(in:since:timeout:)`` looks at the folder.
    ///   - stateDirectory: the writer's local state, outside the shared folder (``FolderState``):
    ///     its device ID, the folder's ID, its lock and its sequence counters.
    /// - Throws: ``RecordZoneError/Code/folderUnavailable`` when the folder is missing or empty
    ///   (not mounted?) or is another folder than this state wrote to before — nothing is written
    ///   then; a new folder is created only by a writer whose state has none on record;
    ///   ``RecordZoneError/Code/deviceInUse`` when another process writes with this state;
    ///   ``RecordZoneError/Code/invalidArguments`` for a label that is not valid.
    public init(root: String, device label: String?, policy: RecordPolicy = RecordPolicy(), pollInterval: Duration = .milliseconds(20),
                stateDirectory: String? = nil) throws(RecordZoneError) {
        let layout = FolderLayout(root: root)
        self.layout = layout
        self.policy = policy
        self.pollInterval = pollInterval
        guard let label else {
            guard let found = try layout.folderID() else {
                throw RecordZoneError(.folderUnavailable, "\(root) is missing or empty: not a convkit zone folder (not mounted?)")
            }
            folderID = found
            device = nil
            state = nil
            index = try FolderIndex(path: nil)
            return
        }
        try Self.checkLabel(label)
        let state = try stateDirectory.map { dir throws(RecordZoneError) in try FolderState(directory: dir, label: label) }
        let remembered = try state?.folderID()
        let folderID: String
        if let found = try layout.folderID() {
            if let remembered, remembered != found {
                throw RecordZoneError(.folderUnavailable, "\(root) is another zone folder (\(found)) than the one this device writes to (\(remembered))")
            }
            folderID = found
        } else if let remembered {
            throw RecordZoneError(.folderUnavailable, "\(root) is missing or empty, but this device wrote to folder \(remembered) there: not mounted? Nothing was written")
        } else {
            folderID = try layout.create()
        }
        if remembered == nil { try state?.remember(folderID: folderID) }
        self.folderID = folderID
        self.state = state
        device = state?.device ?? "\(label)-\(Sodium.randomBytes(8).hexString)"
        index = try FolderIndex(path: state?.indexPath)
    }

    /// Refuses to go on when the folder is no longer the one opened: a share unmounted (or
    /// another one mounted) while the backend is open. Nothing is read from or written into it.
    func checkFolder() throws(RecordZoneError) {
        guard try layout.folderID() == folderID else {
            throw RecordZoneError(.folderUnavailable, "\(layout.root) is missing, empty (not mounted?) or another zone folder than the one opened; nothing was written")
        }
    }

    /// A device label: 1–40 characters of `A–Z a–z 0–9 . _ -`, not starting with `.` or `_`.
    public static func checkLabel(_ label: String) throws(RecordZoneError) {
        guard label.utf8.count <= maximumLabelLength, (try? ZoneName(label)) != nil else {
            throw RecordZoneError(.invalidArguments, "device label '\(label)' must be 1–\(maximumLabelLength) characters of A–Z a–z 0–9 . _ - (not starting with . or _)")
        }
    }

    // MARK: Zones

    public func createZone(_ zone: ZoneName) throws(RecordZoneError) {
        try checkFolder()
        _ = try writingDevice()
        let state = try layout.zoneState(zone)
        guard !state.exists else { return }
        try FileIO.makeDirectory(layout.generationFolder(zone, state.generation + 1))
    }

    /// The places where one device wrote two files under one sequence (two writers as one
    /// device: a store copied before copies were detected, or a tool's mistake), as
    /// `<zone>/<generation>/<device> sequence <n>: <k> files`. Readers read all of them; this
    /// says it happened.
    public func duplicatedSequences() throws(RecordZoneError) -> [String] {
        var found = [String]()
        for zone in try zones() {
            let generation = try currentGeneration(zone)
            for device in try layout.devices(zone, generation: generation) {
                let files = try layout.segments(zone, generation: generation, device: device)
                for sequence in FolderLayout.duplicatedSequences(files).sorted() {
                    found.append("\(zone)/\(generation)/\(device) sequence \(sequence): \(files.filter { $0.sequence == sequence }.count) files")
                }
            }
        }
        return found
    }

    public func zones() throws(RecordZoneError) -> [ZoneName] {
        try checkFolder()
        return try layout.zoneNames().filter { (try? layout.zoneState($0).exists) == true }
    }

    public func deleteZone(_ zone: ZoneName) throws(RecordZoneError) {
        try checkFolder()
        let device = try writingDevice()
        let generation = try currentGeneration(zone)
        let marker = layout.generationFolder(zone, generation) + "/" + FolderLayout.deletedMarkerPrefix + device
        try FileIO.writeAtomically(Data("deleted by \(device)\n".utf8), to: marker)
    }

    public func fetchDatabaseChanges(since token: ChangeToken?) throws(RecordZoneError) -> DatabaseChanges {
        try checkFolder()
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
        try checkFolder()
        let generation = try currentGeneration(zone)
        if let device { try republishOwnSegments(zone, generation: generation, device: device) }
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
        try checkFolder()
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
            try republishOwnSegments(zone, generation: generation, device: device)
            var position = try refresh(zone, generation: generation)
            var accepted = [(index: Int, record: Record, bytes: Data)]()
            var pendingIndex = [RecordID: Int]()
            let plan = try SaveChecks.plan(indices.map { records[$0] }, savePolicy: savePolicy, policy: policy) { (record) throws(RecordZoneError) in
                .success(try index.winner(record.id, generation))
            }
            for (i, decision) in zip(indices, plan.decisions) {
                let record = records[i]
                switch decision {
                case .refused(let error): results[i] = .failure(error)
                case .superseded(let winner): results[i] = .success(winner)
                case .store(let encoded):
                    pendingIndex[record.id] = accepted.count
                    accepted.append((i, record, encoded))
                }
            }
            guard !accepted.isEmpty else { continue }
            let sequence = try writeSegment(accepted.map(\.bytes), zone: zone, generation: generation, device: device)
            // Our own segment is applied as written: we know what it holds, whatever a sync tool
            // later does to the copy in the folder.
            position[device, default: DeviceProgress()].markRead(sequence)
            let stored = accepted.enumerated().map { offset, item in
                var stored = item.record
                stored.serverMetadata = ServerMetadata(changeTag: Self.changeTag(device, sequence, offset), receivedAt: Date())
                return (stored, item.bytes)
            }
            // Each won over the version held (or the one before it in this batch) in its decision.
            for (item, winner) in zip(accepted, try index.apply(stored, zone, generation, position: position, decided: true)) {
                results[item.index] = .success(winner)
            }
            // Written: the chains they made are the pins now, and the store that owns this
            // backend keeps them with its records.
            policy.pins.publish(plan.pins, markChanged: true)
        }
        return results.map { $0 ?? .failure(RecordZoneError(.internalError, "no result")) }
    }

    public func fetch(_ ids: [RecordID]) throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try checkFolder()
        try BackendLimits.checkBatch(ids.count)
        var results = [Result<Record, RecordZoneError>]()
        var generations = [ZoneName: UInt64]()
        for id in ids {
            do throws(RecordZoneError) {
                let generation: UInt64
                if let known = generations[id.zone] {
                    generation = known
                } else {
                    generation = try currentGeneration(id.zone)
                    _ = try refresh(id.zone, generation: generation)
                    generations[id.zone] = generation
                }
                guard let record = try index.winner(id, generation) else { throw RecordZoneError(.unknownItem, "no record \(id)") }
                results.append(.success(record))
            } catch {
                results.append(.failure(RecordZoneError(error.code, error.message, recordID: id)))
            }
        }
        return results
    }

    public func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) throws(RecordZoneError) -> QueryResult {
        try checkFolder()
        let generation = try currentGeneration(query.zone)
        _ = try refresh(query.zone, generation: generation)
        return try query.run(over: try index.winners(query.zone, generation), cursor: cursor, limit: limit)
    }

    // MARK: Assets

    public func putAsset(_ data: Data, expected: AssetReference?) throws(RecordZoneError) -> AssetReference {
        try checkFolder()
        _ = try writingDevice()
        return try layout.assets.put(data, expected: expected)
    }

    public func asset(_ reference: AssetReference) throws(RecordZoneError) -> Data {
        try layout.assets.get(reference)
    }
}
