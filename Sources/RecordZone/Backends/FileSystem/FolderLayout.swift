import Foundation

/// The on-disk format of a filesystem zone folder, version 1.
///
/// ```
/// <root>/FORMAT                                   "convkit-filesystem-zone 1"
/// <root>/devices/<device>/lock                    flock'd by the process writing as <device>
/// <root>/assets/<first 2 hex>/<sha256 hex>        asset bytes, named by their SHA-256
/// <root>/zones/<zone>/<generation>/               one folder per incarnation of the zone (1, 2, …)
/// <root>/zones/<zone>/<generation>/deleted.<device>   marker: <device> deleted this incarnation
/// <root>/zones/<zone>/<generation>/<device>/<seq>.seg  segments, seq = 000000000001, 2, … (``Segment``)
/// ```
/// A zone exists when its highest generation folder has no `deleted.*` marker; creating a
/// deleted zone makes the next generation. Files whose names start with `.` are temporary and
/// never read. No SQLite database (or any other file edited in place) lives in the folder.
public struct FolderLayout: Sendable {
    static let formatLine = "convkit-filesystem-zone 1\n"
    static let deletedMarkerPrefix = "deleted."
    static let digestLength = 8

    public let root: String

    var formatFile: String { root + "/FORMAT" }
    var zonesFolder: String { root + "/zones" }
    func lockFile(device: String) -> String { "\(root)/devices/\(device)/lock" }
    func zoneFolder(_ zone: ZoneName) -> String { "\(zonesFolder)/\(zone.rawValue)" }
    func generationFolder(_ zone: ZoneName, _ generation: UInt64) -> String { "\(zoneFolder(zone))/\(generation)" }
    func deviceFolder(_ zone: ZoneName, _ generation: UInt64, device: String) -> String {
        "\(generationFolder(zone, generation))/\(device)"
    }
    func segmentFile(_ zone: ZoneName, _ generation: UInt64, device: String, sequence: UInt64) -> String {
        "\(deviceFolder(zone, generation, device: device))/\(Segment.fileName(sequence))"
    }
    var assets: AssetFolder { AssetFolder(root: root + "/assets") }
    func assetFile(_ reference: AssetReference) -> String { assets.path(for: reference) }

    /// Creates the folder skeleton for a writing device.
    func prepare(device: String) throws(RecordZoneError) {
        try FileIO.makeDirectory("\(root)/devices/\(device)")
        try FileIO.makeDirectory(zonesFolder)
        if !FileIO.exists(formatFile) {
            do {
                try FileIO.writeAtomically(Data(Self.formatLine.utf8), to: formatFile, replacing: false)
            } catch where FileIO.exists(formatFile) {
                // Another device wrote it first.
            }
        }
        try checkFormat()
    }

    /// Refuses a folder of another format.
    func checkFormat() throws(RecordZoneError) {
        guard FileIO.exists(formatFile) else {
            throw RecordZoneError(.zoneNotFound, "\(root) is not a convkit zone folder (no FORMAT file)")
        }
        let text = String(decoding: try FileIO.read(formatFile), as: UTF8.self)
        guard text == Self.formatLine else {
            throw RecordZoneError(.malformed, "\(root)/FORMAT says '\(text.trimmingCharacters(in: .whitespacesAndNewlines))'; this version reads '\(Self.formatLine.trimmingCharacters(in: .newlines))'")
        }
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

    func segmentSequences(_ zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) -> [UInt64] {
        try FileIO.list(deviceFolder(zone, generation, device: device)).compactMap(Segment.sequence(ofFile:))
    }

    /// Writes a segment durably; fails rather than replace an existing one.
    func writeSegment(_ data: Data, zone: ZoneName, generation: UInt64, device: String, sequence: UInt64) throws(RecordZoneError) {
        let folder = deviceFolder(zone, generation, device: device)
        if !FileIO.exists(folder) {
            try FileIO.makeDirectory(folder)
            try FileIO.syncDirectory(generationFolder(zone, generation))
        }
        try FileIO.writeAtomically(data, to: segmentFile(zone, generation, device: device, sequence: sequence), replacing: false)
    }

    /// Removes this device's own leftover temporary files (from a writer killed mid-write).
    func removeTemporaryFiles(_ zone: ZoneName, generation: UInt64, device: String) throws(RecordZoneError) {
        let folder = deviceFolder(zone, generation, device: device)
        for name in try FileIO.list(folder) where name.hasPrefix(".") && name.hasSuffix(".tmp") {
            unlink("\(folder)/\(name)")
        }
    }

    /// Whether the segment after `position` exists for some device and reads back whole.
    func hasReadableSegment(_ zone: ZoneName, generation: UInt64, after position: VersionVector) throws(RecordZoneError) -> Bool {
        for device in try devices(zone, generation: generation) {
            let at = position[device] ?? DevicePosition(segment: 0, offset: 0)
            let path = segmentFile(zone, generation, device: device, sequence: at.segment + 1)
            guard FileIO.exists(path), let data = try? FileIO.read(path) else { continue }
            if case .success(let records) = Segment.decode(data), records.count > Int(at.offset) { return true }
        }
        return false
    }

    /// A short digest of a zone generation's state: its generation and every device's gap-free
    /// segment count. It changes whenever a reader would find something new.
    func digest(_ zone: ZoneName, generation: UInt64) throws(RecordZoneError) -> Data {
        var summary = "\(generation)"
        for device in try devices(zone, generation: generation) {
            let sequences = Set(try segmentSequences(zone, generation: generation, device: device))
            var count: UInt64 = 0
            while sequences.contains(count + 1) { count += 1 }
            summary += "|\(device):\(count)"
        }
        return Sodium.sha256(Data(summary.utf8)).prefix(Self.digestLength)
    }
}
