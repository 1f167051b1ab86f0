import Foundation
import Synchronization

/// A folder writer's local state, kept outside the shared folder (a store keeps it in its own
/// directory), so no sync tool ever copies, merges or deletes it:
///
/// ```
/// <state>/device      "<label>-<16 hex>": the device's folder name, generated once
/// <state>/folder      the ID of the folder this device writes to (from its FORMAT)
/// <state>/lock        flock'd while a process writes as this device; never written
/// <state>/sequences   "<zone>/<generation> <next>" per line: sequences handed out, never reused
/// <state>/own/<zone>/<generation>/<segment>   a copy of each segment this device wrote, from
///                     which it republishes one that goes missing or is damaged in the folder
/// <state>/index.sqlite  what this device has read of the folder (``FolderIndex``)
/// ```
final class FolderState: Sendable {
    let directory: String
    /// The device's folder name: its label and a generated ID.
    let device: String
    private let lock: Int32
    private struct Counters {
        var next: [String: UInt64] = [:]
        var reserved: [String: UInt64] = [:]
    }
    private let counters: Mutex<Counters>
    /// Sequences reserved per write of the counters file (a crash skips at most this many).
    static let reservation: UInt64 = 64

    /// - Throws: ``RecordZoneError/Code/deviceInUse`` when another process writes with this state.
    init(directory: String, label: String) throws(RecordZoneError) {
        self.directory = directory
        try FileIO.makeDirectory(directory)
        let lockPath = directory + "/lock"
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw FileIO.error("cannot open the lock file", lockPath) }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            close(fd)
            if code == EWOULDBLOCK {
                throw RecordZoneError(.deviceInUse, "another process already writes as this device (its state \(directory) is locked)")
            }
            throw FileIO.error("cannot lock", lockPath, errno: code)
        }
        let loaded: (device: String, counters: Counters)
        do {
            loaded = try Self.load(directory, label: label)
        } catch {
            close(fd)
            throw error
        }
        device = loaded.device
        counters = Mutex(loaded.counters)
        lock = fd
    }

    /// The device's folder name (generated on first use) and its sequence counters.
    ///
    /// A device ID is never used by two writers: the state directory records the instance that
    /// writes with it (the directory's file-system device and inode numbers, which a copy — `cp
    /// -a`, a restored backup, a home directory moved to a new laptop — cannot carry). State found
    /// in another instance is a copy: it takes a new device ID (its own segments' local copies
    /// are set aside, its sequences start afresh), so the original and the copy never write two
    /// files under one sequence.
    private static func load(_ directory: String, label: String) throws(RecordZoneError) -> (device: String, counters: Counters) {
        let deviceFile = directory + "/device", instanceFile = directory + "/instance"
        let here = try instance(of: directory)
        let recorded = FileIO.exists(instanceFile)
            ? String(decoding: try FileIO.read(instanceFile), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) : nil
        var device: String
        if FileIO.exists(deviceFile) {
            device = String(decoding: try FileIO.read(deviceFile), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            // State from before instances were recorded is taken as this instance's.
            if let recorded, recorded != here {
                let copied = device
                device = "\(label)-\(Sodium.randomBytes(8).hexString)"
                if FileIO.exists(directory + "/own") {
                    guard rename(directory + "/own", directory + "/own-\(copied)") == 0 else { throw FileIO.error("cannot set aside", directory + "/own") }
                }
                if FileIO.exists(directory + "/sequences") {
                    guard unlink(directory + "/sequences") == 0 else { throw FileIO.error("cannot reset", directory + "/sequences") }
                }
                try FileIO.writeAtomically(Data((device + "\n").utf8), to: deviceFile)
            }
        } else {
            device = "\(label)-\(Sodium.randomBytes(8).hexString)"
            try FileIO.writeAtomically(Data((device + "\n").utf8), to: deviceFile)
        }
        if recorded != here { try FileIO.writeAtomically(Data((here + "\n").utf8), to: instanceFile) }
        var loaded = Counters()
        let sequencesFile = directory + "/sequences"
        if FileIO.exists(sequencesFile) {
            for line in String(decoding: try FileIO.read(sequencesFile), as: UTF8.self).split(separator: "\n") {
                let parts = line.split(separator: " ")
                guard parts.count == 2, let value = UInt64(parts[1]) else { continue }
                loaded.reserved[String(parts[0])] = value
                loaded.next[String(parts[0])] = value  // whatever was handed out before stays handed out
            }
        }
        return (device, loaded)
    }

    /// This state directory's instance: `<st_dev>:<st_ino>` (a copy gets another inode).
    static func instance(of directory: String) throws(RecordZoneError) -> String {
        var info = stat()
        guard stat(directory, &info) == 0 else { throw FileIO.error("cannot stat", directory) }
        return "\(info.st_dev):\(info.st_ino)"
    }

    var indexPath: String { directory + "/" + FolderIndex.fileName }

    deinit {
        flock(lock, LOCK_UN)
        close(lock)
    }

    func ownSegmentsFolder(_ zone: ZoneName, _ generation: UInt64) -> String {
        "\(directory)/own/\(zone.rawValue)/\(generation)"
    }

    /// Keeps a durable copy of a segment this device writes (before it goes into the folder).
    func keepCopy(_ data: Data, of name: String, zone: ZoneName, generation: UInt64) throws(RecordZoneError) {
        let folder = ownSegmentsFolder(zone, generation)
        try FileIO.makeDirectory(folder)
        try FileIO.writeAtomically(data, to: folder + "/" + name)
    }

    /// The ID of the folder this device wrote to before, if any.
    func folderID() throws(RecordZoneError) -> String? {
        let file = directory + "/folder"
        guard FileIO.exists(file) else { return nil }
        return String(decoding: try FileIO.read(file), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func remember(folderID: String) throws(RecordZoneError) {
        try FileIO.writeAtomically(Data((folderID + "\n").utf8), to: directory + "/folder")
    }

    /// The next sequence for `key` (a zone generation), above `floor` (the highest the folder
    /// shows), never one handed out before — even by a process that crashed.
    func nextSequence(_ key: String, above floor: UInt64) throws(RecordZoneError) -> UInt64 {
        let (sequence, toPersist) = counters.withLock { counters -> (UInt64, [String: UInt64]?) in
            let sequence = max(counters.next[key] ?? 1, floor + 1)
            counters.next[key] = sequence + 1
            guard sequence + 1 > counters.reserved[key] ?? 0 else { return (sequence, nil) }
            counters.reserved[key] = sequence + Self.reservation
            return (sequence, counters.reserved)
        }
        if let toPersist {
            let text = toPersist.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)\n" }.joined()
            try FileIO.writeAtomically(Data(text.utf8), to: directory + "/sequences")
        }
        return sequence
    }
}
