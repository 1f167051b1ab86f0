import Foundation

/// Reading a zone's segments into pages and positions, and writing this device's own.
extension FileSystemBackend {
    // MARK: Reading

    struct Page {
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
    func read(_ zone: ZoneName, generation: UInt64, from start: VersionVector, limit: Int) throws(RecordZoneError) -> Page {
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
    func claims(_ zone: ZoneName, generation: UInt64) -> KeyClaims {
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
    func refresh(_ zone: ZoneName, generation: UInt64) throws(RecordZoneError) -> VersionVector {
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
    func writeSegment(_ records: [Data], zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) -> UInt64 {
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
    func republishOwnSegments(_ zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) {
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
    func allocateSequence(_ zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) -> UInt64 {
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

    func writingDevice() throws(RecordZoneError) -> String {
        guard let device else { throw RecordZoneError(.notAuthorized, "this filesystem backend was opened read-only") }
        return device
    }

    func currentGeneration(_ zone: ZoneName) throws(RecordZoneError) -> UInt64 {
        let state = try layout.zoneState(zone)
        guard state.exists else { throw RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist in \(layout.root)") }
        return state.generation
    }

    func position(from token: ChangeToken?, zone: ZoneName, generation: UInt64) throws(RecordZoneError) -> VersionVector {
        guard let data = try TokenContents.zonePosition(token, backend: Self.kind, zone: zone, incarnation: "g\(generation)") else {
            return VersionVector()
        }
        guard let vector = VersionVector(encoded: data) else { throw RecordZoneError(.invalidArguments, "malformed change token") }
        return vector
    }

    func makeToken(_ zone: ZoneName, _ generation: UInt64, _ vector: VersionVector) -> ChangeToken {
        TokenContents(kind: .zone, backend: Self.kind, zone: zone.rawValue, incarnation: "g\(generation)", position: vector.encoded).token
    }

    static func changeTag(_ device: String, _ sequence: UInt64, _ index: Int) -> String {
        "\(device):\(sequence):\(index)"
    }

    static func encodeDigests(_ digests: [String: Data]) -> Data {
        var w = ByteWriter()
        w.u32(UInt32(digests.count))
        for (zone, digest) in digests.sorted(by: { $0.key < $1.key }) {
            w.string16(zone)
            w.append(digest)
        }
        return Data(w.bytes)
    }

    static func decodeDigests(_ data: Data) -> [String: Data]? {
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
