import Foundation

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
