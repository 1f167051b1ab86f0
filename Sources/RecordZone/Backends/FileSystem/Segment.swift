import Foundation

/// An immutable segment file: one batch of records written by one device.
///
/// ```
/// "CKSG" 0x01          magic and format version
/// u32 record count
/// per record: u32 length, canonical record bytes (``Record/encoded()``)
/// 32 bytes             SHA-256 of every byte above
/// ```
/// A segment that is cut short, has a flipped byte or trailing bytes fails its checksum or its
/// framing and is reported, never applied, and never deleted: a file-sync tool may still be
/// delivering it.
enum Segment {
    static let magic: [UInt8] = Array("CKSG".utf8)
    static let version: UInt8 = 1
    static let fileExtension = "seg"

    static func encode(_ records: [Data]) -> Data {
        var w = ByteWriter()
        w.reserve(records.reduce(41) { $0 + $1.count + 4 })
        w.append(magic)
        w.u8(version)
        w.u32(UInt32(records.count))
        for record in records {
            w.u32(UInt32(record.count))
            w.append(record)
        }
        w.append(Sodium.sha256(Data(w.bytes)))
        return Data(w.bytes)
    }

    /// The records' bytes, once the checksum and framing are verified.
    static func decode(_ data: Data) -> Result<[Data], RejectionReason> {
        guard data.count >= magic.count + 1 + 4 + 32 else {
            return .failure(.corruptSegment("\(data.count) bytes is too short"))
        }
        let body = data.prefix(data.count - 32)
        guard Sodium.constantTimeEqual(Sodium.sha256(body), data.suffix(32)) else {
            return .failure(.corruptSegment("checksum mismatch (incomplete or damaged file)"))
        }
        return body.withUnsafeBytes { raw -> Result<[Data], RejectionReason> in
            var r = ByteReader(raw)
            guard let head = try? r.raw(4), Array(head) == magic else { return .failure(.corruptSegment("bad magic")) }
            guard let v = try? r.u8(), v == version else { return .failure(.corruptSegment("unsupported segment version")) }
            guard let count = try? r.u32(), Int(count) <= r.remaining / 4 else {
                return .failure(.corruptSegment("bad record count"))
            }
            var records = [Data]()
            records.reserveCapacity(Int(count))
            for _ in 0..<count {
                guard let length = try? r.u32(), let bytes = try? r.data(Int(length)) else {
                    return .failure(.corruptSegment("record framing runs past the end"))
                }
                records.append(bytes)
            }
            guard r.remaining == 0 else { return .failure(.corruptSegment("\(r.remaining) trailing bytes")) }
            return .success(records)
        }
    }

    /// `<sequence, 12 digits>-<first 8 bytes of the file's SHA-256, hex>.seg`: a name unique to
    /// the file's content, so a reused sequence or a file replaced in place is never mistaken for
    /// one already read.
    static func fileName(_ sequence: UInt64, digest: UInt64) -> String {
        let digits = String(sequence)
        let hex = String(digest, radix: 16)
        return String(repeating: "0", count: max(0, 12 - digits.count)) + digits + "-"
            + String(repeating: "0", count: 16 - hex.count) + hex + "." + fileExtension
    }

    /// The digest a file's name carries for `data`.
    static func digest(of data: Data) -> UInt64 { digest(fromHash: Sodium.sha256(data)) }

    /// The digest a file's name carries, from the file's SHA-256.
    static func digest(fromHash hash: Data) -> UInt64 { hash.prefix(8).reduce(0) { $0 << 8 | UInt64($1) } }

    /// The sequence and digest in a segment file name, or nil for any other file (temporary
    /// files start with a dot and are never read).
    static func parse(fileName name: String) -> (sequence: UInt64, digest: UInt64)? {
        guard !name.hasPrefix("."), name.hasSuffix("." + fileExtension) else { return nil }
        let parts = name.dropLast(fileExtension.count + 1).split(separator: "-")
        guard parts.count == 2, parts[1].count == 16, let sequence = UInt64(parts[0]), let digest = UInt64(parts[1], radix: 16) else { return nil }
        return (sequence, digest)
    }

    /// The records of a segment file whose content is the one its name names (`hash`: the
    /// file's SHA-256, when the caller has it).
    static func decode(_ data: Data, named digest: UInt64, hash: Data? = nil) -> Result<[Data], RejectionReason> {
        guard Self.digest(fromHash: hash ?? Sodium.sha256(data)) == digest else {
            return .failure(.corruptSegment("the content is not the one its name names (incomplete, replaced or damaged)"))
        }
        return decode(data)
    }
}
