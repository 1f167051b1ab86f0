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

    private nonisolated let executor = QueueExecutor(label: "convkit.folder")
    public nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    public nonisolated let policy: RecordPolicy
    public nonisolated let layout: FolderLayout
    /// This writer's folder name (its label and generated ID); nil for a read-only reader.
    public nonisolated let device: String?
    private let state: FolderState?
    /// The ID in the folder's FORMAT when it was opened: checked again before each operation.
    private let folderID: String
    private let pollInterval: Duration

    /// What this device has read of the folder: winners, positions, claims, verified files.
    private let index: FolderIndex
    /// How many records a look at the folder applies to the index per transaction.
    private static let refreshPage = 2_000

    /// Every key that claims an identity in one zone generation, over all devices' readable
    /// segments: taken from the index once, then only what is new.
    private struct ZoneClaims {
        var generation: UInt64
        var read: Set<String> = []
        var claims = KeyClaims()
    }
    private var zoneClaims: [ZoneName: ZoneClaims] = [:]
    /// When this device's folder in each zone generation was last looked over, and its time then.
    private var ownChecked: [String: (stamp: String, at: ContinuousClock.Instant)] = [:]
    /// The last sequence this instance handed out, per zone generation.
    private var lastSequence: [String: UInt64] = [:]

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
    private func checkFolder() throws(RecordZoneError) {
        guard try layout.folderID() == folderID else {
            throw RecordZoneError(.folderUnavailable, "\(layout.root) is missing, empty (not mounted?) or another zone folder than the one opened; nothing was written")
        }
    }

    /// A device label: 1–40 characters of `A–Z a–z 0–9 . _ -`, not starting with `.` or `_`.
    static func checkLabel(_ label: String) throws(RecordZoneError) {
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

    // MARK: Reading

    private struct Page {
        var records: [Record] = []
        var rejected: [RejectedRecord] = []
        var position: VersionVector
        var moreComing = false
    }

    /// Reads every segment not read yet at `start`, device by device (sorted by name), each
    /// device's files by sequence, until `limit` records (valid or rejected) have been read. A
    /// file that does not hold what its name says (incomplete, replaced, damaged) is reported and
    /// skipped — read again on a later call — and blocks nothing after it. The page is admitted
    /// as one batch, so what it pins does not depend on the order devices are listed.
    private func read(_ zone: ZoneName, generation: UInt64, from start: VersionVector, limit: Int) throws(RecordZoneError) -> Page {
        var page = Page(position: start)
        var gathered = [(bytes: Data, source: String, changeTag: String, file: Int)]()
        // The files read in this page: their key, full hash, whether their signatures were
        // verified before (by this device, in its local state), and whether all of it is here.
        var files = [(key: String, hash: Data, trusted: Bool, whole: Bool)]()
        deviceLoop: for device in try layout.devices(zone, generation: generation) {
            var progress = start[device] ?? DeviceProgress()
            defer { page.position[device] = progress }
            let segments = try layout.segments(zone, generation: generation, device: device)
            let duplicated = FolderLayout.duplicatedSequences(segments)
            for file in segments where progress.needsReading(file, duplicated: duplicated.contains(file.sequence)) {
                // Two files under one sequence (a copied store wrote as this device): each is
                // read whole, by its digest, and its records admitted as any others.
                let isDuplicate = duplicated.contains(file.sequence)
                let source = "\(zone)/\(generation)/\(device)/\(file.name)"
                let data = try FileIO.read(layout.segmentFile(zone, generation, device: device, name: file.name))
                let hash = Sodium.sha256(data)
                let encoded: [Data]
                switch Segment.decode(data, named: file.digest, hash: hash) {
                case .success(let records): encoded = records
                case .failure(let reason):
                    page.rejected.append(RejectedRecord(recordID: nil, reason: reason, source: source))
                    continue
                }
                // Only records count against the page: damaged files are reported whatever their
                // number, so a page always moves on.
                let first = isDuplicate ? 0 : min(progress.offset(in: file.sequence), encoded.count)
                let room = isDuplicate ? encoded.count : max(0, limit - gathered.count)
                let end = first + min(room, encoded.count - first)
                files.append((source, hash, index.wasVerified(source, hash: hash), first == 0 && end == encoded.count))
                for offset in first..<end {
                    gathered.append((encoded[offset], "\(source) #\(offset)", Self.changeTag(device, file.sequence, offset), files.count - 1))
                }
                if end < encoded.count {
                    page.moreComing = true
                    progress.partial = DeviceProgress.Partial(sequence: file.sequence, offset: UInt32(end))
                    break deviceLoop
                }
                if isDuplicate { progress.duplicatesRead.insert(file.digest) }
                progress.markRead(file.sequence)
            }
        }
        // Signatures of a file this device verified before, byte for byte the same (its full
        // hash), are not checked again; ownership is decided for every record as always.
        let admitted = policy.admit(batch: gathered.map(\.bytes), source: { gathered[$0].source },
                                    claimsElsewhere: { self.claims(zone, generation: generation) },
                                    signedHere: { files[gathered[$0].file].trusted })
        var clean = Array(repeating: true, count: files.count)
        for (item, outcome) in zip(gathered, admitted) {
            switch outcome {
            case .success(var record):
                record.serverMetadata = ServerMetadata(changeTag: item.changeTag)
                page.records.append(record)
            case .failure(let rejection):
                clean[item.file] = false
                page.rejected.append(rejection)
            }
        }
        for (file, clean) in zip(files, clean) where clean && file.whole && !file.trusted {
            index.markVerified(file.key, hash: file.hash)
        }
        return page
    }

    /// What every device's readable segments of a zone claim (see ``KeyClaims``), brought up to
    /// date with the folder. A file that cannot be read or does not hold what its name says is
    /// left for a later call, as in ``read(_:generation:from:limit:)``.
    private func claims(_ zone: ZoneName, generation: UInt64) -> KeyClaims {
        var state = zoneClaims[zone].flatMap { $0.generation == generation ? $0 : nil } ?? {
            let known = try? index.claims(zone, generation)
            return ZoneClaims(generation: generation, read: known?.files ?? [], claims: known?.claims ?? KeyClaims())
        }()
        var added = KeyClaims()
        var files = [String]()
        for device in (try? layout.devices(zone, generation: generation)) ?? [] {
            for file in (try? layout.segments(zone, generation: generation, device: device)) ?? [] {
                let key = "\(device)/\(file.name)"
                guard !state.read.contains(key),
                    let data = try? FileIO.read(layout.segmentFile(zone, generation, device: device, name: file.name)),
                    case .success(let encoded) = Segment.decode(data, named: file.digest)
                else { continue }
                for bytes in encoded {
                    guard let record = try? Record(canonical: bytes), case .success(let identity)? = policy.rules.owner(of: record) else { continue }
                    // Any key can sign a claim of its own; a key record (rotation, device) relates
                    // keys only when it is genuine.
                    if OwnershipRules.keyRules.contains(where: { $0.recordType == record.recordType }), !record.hasValidSignature() { continue }
                    added.add(record, owner: identity)
                }
                state.read.insert(key)
                files.append(key)
            }
        }
        if !files.isEmpty {
            state.claims.merge(added)
            // Not kept (a full disk): read again by the next process.
            try? index.addClaims(added, files: files, zone, generation)
        }
        zoneClaims[zone] = state
        return state.claims
    }

    /// Brings the index's winners of a zone generation up to date with the folder, a page of
    /// records per transaction. - Returns: how far it has read.
    private func refresh(_ zone: ZoneName, generation: UInt64) throws(RecordZoneError) -> VersionVector {
        var position = try index.position(zone, generation)
        while true {
            let page = try read(zone, generation: generation, from: position, limit: Self.refreshPage)
            if page.position != position {
                var versions = [(record: Record, bytes: Data)]()
                versions.reserveCapacity(page.records.count)
                for record in page.records { versions.append((record, try record.encoded())) }
                try index.apply(versions, zone, generation, position: page.position)
                position = page.position
            }
            if !page.moreComing { return position }
        }
    }

    /// Writes a segment of this device's: first its local copy (with local state), then the file
    /// in the folder. - Returns: its sequence.
    private func writeSegment(_ records: [Data], zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) -> UInt64 {
        let sequence = try allocateSequence(zone, generation: generation, device: device)
        let data = Segment.encode(records)
        let hash = Sodium.sha256(data)
        let name = Segment.fileName(sequence, digest: Segment.digest(fromHash: hash))
        try state?.keepCopy(data, of: name, zone: zone, generation: generation)
        try layout.writeSegment(data, zone: zone, generation: generation, device: device, sequence: sequence, hash: hash)
        let path = layout.segmentFile(zone, generation, device: device, name: name)
        index.setOwnFileStamp(path, FileIO.stamp(path))
        // Every record in it was verified on its way in (the save's checks).
        index.markVerified("\(zone)/\(generation)/\(device)/\(name)", hash: hash)
        // Our own write changed the folder's time: that is no reason to look the folder over again.
        let key = "\(zone)/\(generation)"
        if let last = ownChecked[key], let stamp = FileIO.stamp(layout.deviceFolder(zone, generation, device: device)) {
            ownChecked[key] = (stamp, last.at)
            let recordedKey = Self.ownFolderKey(layout.deviceFolder(zone, generation, device: device))
            if let checked = index.ownFileStamp(recordedKey).flatMap(Self.parseOwnFolderRecord) {
                index.setOwnFileStamp(recordedKey, "\(stamp) \(checked.at)")
            }
        }
        return sequence
    }

    /// How often this device's own files are looked over at least (for files changed in place,
    /// which no folder time shows).
    static let ownFilesLookInterval: Duration = .seconds(30)

    /// The index key under which the last full look at a device folder is kept.
    static func ownFolderKey(_ folder: String) -> String { "folder:" + folder }

    /// `<folder stamp> <seconds since 1970 of the look>`.
    static func parseOwnFolderRecord(_ text: String) -> (stamp: String, at: Double)? {
        guard let space = text.lastIndex(of: " "), let at = Double(text[text.index(after: space)...]) else { return nil }
        return (String(text[..<space]), at)
    }

    /// Puts back, as new segments, this device's segments that are missing from the folder or
    /// do not read back whole there (deleted by a cleanup or a sync tool, or damaged and copied
    /// back), from its local copies. Readers that read the old file merge the same versions again.
    private func republishOwnSegments(_ zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) {
        guard let state else { return }
        // Each file is looked at only when the device's folder changed (a file added, removed or
        // renamed over), and at least every 30 s (a file changed in place: its own time shows it).
        let folderStamp = FileIO.stamp(layout.deviceFolder(zone, generation, device: device)) ?? "-"
        let key = "\(zone)/\(generation)", now = ContinuousClock.now
        if let last = ownChecked[key], last.stamp == folderStamp, now - last.at < Self.ownFilesLookInterval { return }
        // A new process whose device folder is as the last one left it (no file added, removed
        // or renamed over since), less than the interval after the last full look (in any
        // process: short-lived ones included), goes on with that look's window.
        let recordedKey = Self.ownFolderKey(layout.deviceFolder(zone, generation, device: device))
        let wallNow = Date().timeIntervalSince1970
        if ownChecked[key] == nil, let last = index.ownFileStamp(recordedKey).flatMap(Self.parseOwnFolderRecord), last.stamp == folderStamp,
            case let age = wallNow - last.at, age >= 0, age < Double(Self.ownFilesLookInterval.components.seconds) {
            ownChecked[key] = (folderStamp, now - .milliseconds(Int(age * 1000)))
            return
        }
        defer {
            ownChecked[key] = (folderStamp, now)
            index.setOwnFileStamp(recordedKey, "\(folderStamp) \(wallNow)")
        }
        let copies = state.ownSegmentsFolder(zone, generation)
        for name in try FileIO.list(copies) {
            guard let parsed = Segment.parse(fileName: name) else { continue }
            let path = layout.segmentFile(zone, generation, device: device, name: name)
            let stamp = FileIO.stamp(path)
            if let stamp {
                if index.ownFileStamp(path) == stamp { continue }
                if let data = try? FileIO.read(path), case .success = Segment.decode(data, named: parsed.digest) {
                    index.setOwnFileStamp(path, stamp)
                    continue
                }
            }
            guard case .success(let records) = Segment.decode(try FileIO.read(copies + "/" + name), named: parsed.digest) else { continue }
            _ = try writeSegment(records, zone: zone, generation: generation, device: device)
            unlink(copies + "/" + name)
            // The damaged copy is this device's own file: removing it lets readers' reports of it close.
            if stamp != nil { unlink(path) }
            index.setOwnFileStamp(path, nil)
        }
    }

    /// A sequence this device never used in this zone generation: above every one in the folder
    /// (listed once per process) and, with local state, above every one it ever handed out (a
    /// deleted file's included).
    private func allocateSequence(_ zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) -> UInt64 {
        let key = "\(zone)/\(generation)"
        let floor: UInt64
        if let handedOut = lastSequence[key] {
            floor = handedOut
        } else {
            try layout.removeTemporaryFiles(zone, generation: generation, device: device)
            floor = try layout.segments(zone, generation: generation, device: device).last?.sequence ?? 0
        }
        let next = try state?.nextSequence(key, above: floor) ?? floor + 1
        lastSequence[key] = next
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

/// Which of one device's segments have been read: whole sequences (as ranges), and how many
/// records of one more.
struct DeviceProgress: Hashable, Sendable {
    /// Sorted, disjoint, non-adjacent ranges of sequences read in full.
    var ranges: [ClosedRange<UInt64>] = []
    var partial: Partial?
    /// The digests of the files read under a sequence that more than one file holds (a copied
    /// store that wrote as this device): each such file is read, whatever was read before.
    var duplicatesRead: Set<UInt64> = []

    /// Whether `file` is still to be read: its sequence is not, or other files share its
    /// sequence (`duplicated`) and this one was not read by its digest.
    func needsReading(_ file: SegmentFile, duplicated: Bool) -> Bool {
        !hasRead(file.sequence) || (duplicated && !duplicatesRead.contains(file.digest))
    }

    struct Partial: Hashable, Sendable {
        var sequence: UInt64
        var offset: UInt32
    }

    func hasRead(_ sequence: UInt64) -> Bool {
        ranges.contains { $0.contains(sequence) }
    }

    /// How many records of `sequence` were read already.
    func offset(in sequence: UInt64) -> Int {
        partial?.sequence == sequence ? Int(partial?.offset ?? 0) : 0
    }

    mutating func markRead(_ sequence: UInt64) {
        if partial?.sequence == sequence { partial = nil }
        guard !hasRead(sequence) else { return }
        ranges.append(sequence...sequence)
        ranges.sort { $0.lowerBound < $1.lowerBound }
        var merged = [ClosedRange<UInt64>]()
        for range in ranges {
            if let last = merged.last, range.lowerBound <= last.upperBound &+ 1 {
                merged[merged.count - 1] = last.lowerBound...max(last.upperBound, range.upperBound)
            } else {
                merged.append(range)
            }
        }
        ranges = merged
    }
}

/// The position of a reader in a filesystem zone: one ``DeviceProgress`` per device.
struct VersionVector: Hashable, Sendable {
    var devices: [String: DeviceProgress] = [:]

    subscript(device: String) -> DeviceProgress? {
        get { devices[device] }
        set { devices[device] = newValue }
    }

    subscript(device: String, default value: DeviceProgress) -> DeviceProgress {
        get { devices[device] ?? value }
        set { devices[device] = newValue }
    }

    /// `count` devices, then per device sorted by name: `u16 len, name, count ranges, (u64
    /// first, u64 last) per range, u8 has partial, [u64 sequence, u32 offset]`; then, only when
    /// some device has them, `u32 count` and per such device `u16 len, name, u32 n, n × u64
    /// digest`: the files read under a duplicated sequence. A `count` is a u16, or 0xFFFF and a
    /// u32 from 65,535 on: a hostile folder may hold any number of devices, or of gaps in one
    /// device's sequences.
    var encoded: Data {
        var w = ByteWriter()
        Self.writeCount(devices.count, to: &w)
        for (device, progress) in devices.sorted(by: { $0.key < $1.key }) {
            w.string16(device)
            Self.writeCount(progress.ranges.count, to: &w)
            for range in progress.ranges {
                w.u64(range.lowerBound)
                w.u64(range.upperBound)
            }
            if let partial = progress.partial {
                w.u8(1)
                w.u64(partial.sequence)
                w.u32(partial.offset)
            } else {
                w.u8(0)
            }
        }
        let duplicates = devices.filter { !$0.value.duplicatesRead.isEmpty }.sorted { $0.key < $1.key }
        if !duplicates.isEmpty {
            w.u32(UInt32(truncatingIfNeeded: duplicates.count))
            for (device, progress) in duplicates {
                w.string16(device)
                w.u32(UInt32(truncatingIfNeeded: progress.duplicatesRead.count))
                for digest in progress.duplicatesRead.sorted() { w.u64(digest) }
            }
        }
        return Data(w.bytes)
    }

    init() {}

    private static func writeCount(_ count: Int, to w: inout ByteWriter) {
        if count < 0xFFFF {
            w.u16(UInt16(count))
        } else {
            w.u16(0xFFFF)
            w.u32(UInt32(truncatingIfNeeded: count))
        }
    }

    private static func readCount(_ r: inout ByteReader) -> Int? {
        guard let short = try? r.u16() else { return nil }
        guard short == 0xFFFF else { return Int(short) }
        return (try? r.u32()).map { Int($0) }
    }

    init?(encoded data: Data) {
        guard let parsed: [String: DeviceProgress] = data.withUnsafeBytes({ raw in
            var r = ByteReader(raw)
            guard let count = Self.readCount(&r), count <= r.remaining / 5 else { return nil }
            var devices = [String: DeviceProgress]()
            for _ in 0..<count {
                guard let name = try? r.string16(what: "device"), let rangeCount = Self.readCount(&r), rangeCount <= r.remaining / 16 else { return nil }
                var progress = DeviceProgress()
                for _ in 0..<rangeCount {
                    guard let first = try? r.u64(), let last = try? r.u64(), first <= last else { return nil }
                    progress.ranges.append(first...last)
                }
                guard let flag = try? r.u8() else { return nil }
                if flag == 1 {
                    guard let sequence = try? r.u64(), let offset = try? r.u32() else { return nil }
                    progress.partial = DeviceProgress.Partial(sequence: sequence, offset: offset)
                } else if flag != 0 {
                    return nil
                }
                devices[name] = progress
            }
            if r.remaining > 0 {
                guard let count = try? r.u32(), Int(count) <= r.remaining / 6 else { return nil }
                for _ in 0..<count {
                    guard let name = try? r.string16(what: "device"), let n = try? r.u32(), Int(n) <= r.remaining / 8 else { return nil }
                    for _ in 0..<n {
                        guard let digest = try? r.u64() else { return nil }
                        devices[name, default: DeviceProgress()].duplicatesRead.insert(digest)
                    }
                }
            }
            return r.remaining == 0 ? devices : nil
        }) else { return nil }
        devices = parsed
    }
}
