import Foundation

/// The on-disk format of a filesystem zone folder, version 2.
///
/// ```
/// <root>/FORMAT                                  "convkit-filesystem-zone 2\nfolder <id>\n"
/// <root>/assets/<first 2 hex>/<sha256 hex>       asset bytes, named by their SHA-256
/// <root>/zones/<zone>/<generation>/              one folder per incarnation of the zone (1, 2, …)
/// <root>/zones/<zone>/<generation>/deleted.<device>   marker: <device> deleted this incarnation
/// <root>/zones/<zone>/<generation>/<device>/<seq>-<digest>.seg   segments (``Segment``)
/// ```
/// `<device>` is a writer's label and its generated ID (`laptop-3f9a…`), so two machines that
/// chose one label never share a folder; `<digest>` names the segment's content, so a file is
/// read once it holds exactly what its name says. A zone exists when its highest generation
/// folder has no `deleted.*` marker. Files whose names start with `.` are temporary and never
/// read. Nothing in the folder is edited in place; the writer's lock and its sequence counters
/// live in its local state (``FolderState``), outside the shared folder.
public struct FolderLayout: Sendable {
    static let formatHeader = "convkit-filesystem-zone 2"
    static let deletedMarkerPrefix = "deleted."
    static let digestLength = 8

    public let root: String

    var formatFile: String { root + "/FORMAT" }
    var zonesFolder: String { root + "/zones" }
    func zoneFolder(_ zone: ZoneName) -> String { "\(zonesFolder)/\(zone.rawValue)" }
    func generationFolder(_ zone: ZoneName, _ generation: UInt64) -> String { "\(zoneFolder(zone))/\(generation)" }
    func deviceFolder(_ zone: ZoneName, _ generation: UInt64, device: String) -> String {
        "\(generationFolder(zone, generation))/\(device)"
    }
    func segmentFile(_ zone: ZoneName, _ generation: UInt64, device: String, name: String) -> String {
        "\(deviceFolder(zone, generation, device: device))/\(name)"
    }
    var assets: AssetFolder { AssetFolder(root: root + "/assets") }
    func assetFile(_ reference: AssetReference) -> String { assets.path(for: reference) }

    /// The folder's ID, from its FORMAT file; nil when the folder is missing or empty (a share
    /// that is not mounted looks like this).
    /// - Throws: ``RecordZoneError/Code/malformed`` for a folder of another format, and
    ///   ``RecordZoneError/Code/folderUnavailable`` for a folder that holds files but no FORMAT.
    func folderID() throws(RecordZoneError) -> String? {
        if !FileIO.exists(formatFile) {
            let entries = try FileIO.list(root).filter { !$0.hasPrefix(".") }
            if entries.isEmpty { return nil }
            // Another device may be creating the folder right now: FORMAT comes first.
            guard FileIO.exists(formatFile) else {
                throw RecordZoneError(.folderUnavailable, "\(root) holds files but no FORMAT: not a convkit zone folder")
            }
        }
        let text = String(decoding: try FileIO.read(formatFile), as: UTF8.self)
        let lines = text.split(separator: "\n").map(String.init)
        guard lines.first == Self.formatHeader, lines.count == 2, lines[1].hasPrefix("folder "), lines[1].count > 7 else {
            throw RecordZoneError(.malformed, "\(root)/FORMAT says '\(lines.first ?? "")'; this version reads '\(Self.formatHeader)'")
        }
        return String(lines[1].dropFirst(7))
    }

    /// Makes a new, empty zone folder with a new ID (never over an existing FORMAT).
    func create() throws(RecordZoneError) -> String {
        let id = Sodium.randomBytes(16).hexString
        try FileIO.makeDirectory(root)
        do {
            try FileIO.writeAtomically(Data("\(Self.formatHeader)\nfolder \(id)\n".utf8), to: formatFile, replacing: false)
        } catch where FileIO.exists(formatFile) {
            // Another device created it first: that one is the folder.
            return try folderID() ?? id
        }
        try FileIO.makeDirectory(zonesFolder)
        return id
    }

    func zoneNames() throws(RecordZoneError) -> [ZoneName] {
        try FileIO.list(zonesFolder).compactMap { try? ZoneName($0) }.sorted()
    }

    /// The highest generation of a zone and whether it is live.
    func zoneState(_ zone: ZoneName) throws(RecordZoneError) -> (generation: UInt64, exists: Bool) {
        let generations = try FileIO.list(zoneFolder(zone)).compactMap { UInt64($0) }
        guard let generation = generations.max() else { return (0, false) }
        let deleted = try FileIO.list(generationFolder(zone, generation)).contains { $0.hasPrefix(Self.deletedMarkerPrefix) }
        return (generation, !deleted)
    }

    /// The devices that wrote into a zone generation, sorted by name.
    func devices(_ zone: ZoneName, generation: UInt64) throws(RecordZoneError) -> [String] {
        try FileIO.list(generationFolder(zone, generation))
            .filter { !$0.hasPrefix(".") && !$0.hasPrefix(Self.deletedMarkerPrefix) && (try? ZoneName($0)) != nil }
            .sorted()
    }

    /// A device's segment files, by sequence (then digest).
    func segments(_ zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) -> [SegmentFile] {
        try FileIO.list(deviceFolder(zone, generation, device: device)).compactMap { name in
            Segment.parse(fileName: name).map { SegmentFile(name: name, sequence: $0.sequence, digest: $0.digest) }
        }.sorted { ($0.sequence, $0.digest) < ($1.sequence, $1.digest) }
    }

    /// Writes a segment durably under its content name (`hash`: its SHA-256, when the caller
    /// has it); fails rather than replace a file. - Returns: the file's name.
    @discardableResult
    func writeSegment(_ data: Data, zone: ZoneName, generation: UInt64, device: String, sequence: UInt64, hash: Data? = nil) throws(RecordZoneError) -> String {
        let folder = deviceFolder(zone, generation, device: device)
        if !FileIO.exists(folder) {
            try FileIO.makeDirectory(folder)
            try FileIO.syncDirectory(generationFolder(zone, generation))
        }
        let name = Segment.fileName(sequence, digest: Segment.digest(fromHash: hash ?? Sodium.sha256(data)))
        try FileIO.writeAtomically(data, to: "\(folder)/\(name)", replacing: false)
        return name
    }

    /// Removes this device's own leftover temporary files (from a writer killed mid-write).
    func removeTemporaryFiles(_ zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) {
        let folder = deviceFolder(zone, generation, device: device)
        for name in try FileIO.list(folder) where name.hasPrefix(".") && name.hasSuffix(".tmp") {
            unlink("\(folder)/\(name)")
        }
    }

    /// The sequences more than one of these files holds (two writers as one device: a copied store).
    static func duplicatedSequences(_ files: [SegmentFile]) -> Set<UInt64> {
        var seen = Set<UInt64>(), duplicated = Set<UInt64>()
        for file in files where !seen.insert(file.sequence).inserted { duplicated.insert(file.sequence) }
        return duplicated
    }

    /// Whether some device has a segment not yet read at `position` that reads back whole.
    func hasReadableSegment(_ zone: ZoneName, generation: UInt64, after position: VersionVector) throws(RecordZoneError) -> Bool {
        for device in try devices(zone, generation: generation) {
            let progress = position[device] ?? DeviceProgress()
            let files = try segments(zone, generation: generation, device: device)
            let duplicated = Self.duplicatedSequences(files)
            for file in files where progress.needsReading(file, duplicated: duplicated.contains(file.sequence)) {
                guard let data = try? FileIO.read(segmentFile(zone, generation, device: device, name: file.name)) else { continue }
                let offset = duplicated.contains(file.sequence) ? 0 : progress.offset(in: file.sequence)
                if case .success(let records) = Segment.decode(data, named: file.digest), records.count > offset { return true }
            }
        }
        return false
    }

    /// A short digest of a zone generation's state: its generation and every segment file's
    /// name, size and modification time. It changes whenever a reader could find something new
    /// (a file completed or repaired in place included).
    func digest(_ zone: ZoneName, generation: UInt64) throws(RecordZoneError) -> Data {
        var summary = "\(generation)"
        for device in try devices(zone, generation: generation) {
            for file in try segments(zone, generation: generation, device: device) {
                summary += "|\(device)/\(file.name):" + (FileIO.stamp(segmentFile(zone, generation, device: device, name: file.name)) ?? "-")
            }
        }
        return Sodium.sha256(Data(summary.utf8)).prefix(Self.digestLength)
    }
}

/// A segment file in a device's folder.
struct SegmentFile: Sendable {
    var name: String
    var sequence: UInt64
    var digest: UInt64
}
