import Foundation

/// The canonical binary form of a record, version 1.
///
/// Deterministic: the same record always gives the same bytes, whatever order its fields were
/// set in. All integers are big-endian and fixed-width; strings and blobs are length-prefixed.
///
/// ```
/// "CKR" 0x01                      magic and format version
/// u16 len, zone name              u16 len, record name       u16 len, record type
/// u8 len (0|32), author key       u64 clock                  u8 flags (bit 0: deleted)
/// u32 field count, then per field, sorted by the key's UTF-8 bytes, strictly ascending:
///     u16 len, key   u8 tag   u32 len, payload
/// ---- the signature covers every byte above ----
/// u8 len (0|64), signature
/// ```
///
/// Value tags: 1 string (UTF-8), 2 int64, 3 double (IEEE 754 bits, finite), 4 bool (0|1),
/// 5 date (int64 milliseconds since 1970), 6 bytes, 7 reference (u16 zone, u16 name),
/// 8 asset (32-byte SHA-256, u64 size), 9 list (u32 count, then tag + u32 len + payload per
/// element, no nested lists). Tag 0 is reserved. Any other tag is a value from a newer writer: it is kept as
/// ``FieldValue/unknown(tag:payload:)`` and written back unchanged.
public enum CanonicalEncoding {
    static let magic: [UInt8] = [0x43, 0x4B, 0x52]  // "CKR"
    static let version: UInt8 = 1
    static let maximumKeyLength = 255
}

extension Record {
    /// The canonical bytes the signature covers (everything but the signature).
    /// - Throws: ``RecordZoneError`` (``RecordZoneError/Code/invalidArguments``) when a field
    ///   cannot be encoded: a non-finite double, a nested list, a bad key or type name.
    public func canonicalBytes() throws(RecordZoneError) -> Data {
        var writer = ByteWriter()
        try writeBody(into: &writer)
        return Data(writer.bytes)
    }

    /// The full canonical encoding: the signed body followed by the signature. For a record
    /// decoded or signed here, the very bytes it was decoded from or signed as, with no work.
    public func encoded() throws(RecordZoneError) -> Data {
        if let signedBytes { return signedBytes }
        return Data(try encodedByteArray())
    }

    /// ``encoded()`` written afresh, in the array it is written in.
    package func encodedByteArray() throws(RecordZoneError) -> [UInt8] {
        var writer = ByteWriter()
        try writeBody(into: &writer)
        writer.u8(UInt8(signature.count))
        writer.append(signature)
        guard writer.bytes.count <= Self.maximumEncodedSize else {
            throw RecordZoneError(.limitExceeded, "record \(id) encodes to \(writer.bytes.count) bytes; the limit is \(Self.maximumEncodedSize)", recordID: id)
        }
        return writer.bytes
    }

    /// The full canonical encoding of an unsigned record with this one's ID and type holding
    /// just `field` (no author, clock 0, not deleted, no signature), written straight from this
    /// one: what a sealed envelope carries (PROTOCOL.md §3.2), without building that record.
    package func unsignedEncoding(of field: String) throws(RecordZoneError) -> [UInt8] {
        var writer = ByteWriter()
        try writeBody(into: &writer, unsignedWith: field)
        writer.u8(0)
        return writer.bytes
    }

    /// - Parameter only: write the body of an unsigned record holding just this field.
    func writeBody(into w: inout ByteWriter, unsignedWith only: String? = nil) throws(RecordZoneError) {
        let typeCount = recordType.utf8.count
        guard typeCount > 0, typeCount <= Self.maximumTypeLength else {
            throw RecordZoneError(.invalidArguments, "record type must be 1…\(Self.maximumTypeLength) bytes", recordID: id)
        }
        guard NormalForm.isNFC(recordType) else { throw RecordZoneError(.invalidArguments, "record type is not in Unicode NFC", recordID: id) }
        guard authorKey.isEmpty || authorKey.count == Sodium.publicKeyLength,
            signature.isEmpty || signature.count == Sodium.signatureLength
        else {
            throw RecordZoneError(.invalidArguments, "record \(id) has a malformed author key or signature", recordID: id)
        }
        func write(_ key: String, _ value: FieldValue) throws(RecordZoneError) {
            let keyCount = key.utf8.count
            guard keyCount > 0, keyCount <= CanonicalEncoding.maximumKeyLength else {
                throw RecordZoneError(.invalidArguments, "field name must be 1…\(CanonicalEncoding.maximumKeyLength) bytes", recordID: id)
            }
            guard NormalForm.isNFC(key) else { throw RecordZoneError(.invalidArguments, "field name '\(key)' is not in Unicode NFC", recordID: id) }
            w.string16(key)
            try w.value(value, allowList: true, field: key, id: id)
        }
        w.reserve(1024)
        w.append(CanonicalEncoding.magic)
        w.u8(CanonicalEncoding.version)
        w.string16(id.zone.rawValue)
        w.string16(id.name)
        w.string16(recordType)
        if let only {
            let value = fields[only]
            w.u8(0)
            w.u64(0)
            w.u8(0)
            w.u32(value == nil ? 0 : 1)
            if let value { try write(only, value) }
            return
        }
        w.u8(UInt8(authorKey.count))
        w.append(authorKey)
        w.u64(clock.rawValue)
        w.u8(isDeleted ? 1 : 0)
        w.u32(UInt32(fields.count))
        for (key, value) in fields.sorted(by: { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }) { try write(key, value) }
    }
}

struct ByteWriter {
    var bytes: [UInt8] = []

    mutating func reserve(_ n: Int) { bytes.reserveCapacity(n) }
    mutating func u8(_ v: UInt8) { bytes.append(v) }
    mutating func u16(_ v: UInt16) { bytes.append(UInt8(v >> 8)); bytes.append(UInt8(v & 0xFF)) }
    mutating func u32(_ v: UInt32) {
        withUnsafeBytes(of: v.bigEndian) { bytes.append(contentsOf: $0) }
    }
    mutating func u64(_ v: UInt64) {
        withUnsafeBytes(of: v.bigEndian) { bytes.append(contentsOf: $0) }
    }
    /// Through the bytes' buffer: `append(contentsOf: data)` walks a `Data` byte by byte.
    mutating func append(_ data: Data) { data.withUnsafeBytes { bytes.append(contentsOf: $0) } }
    mutating func append(_ array: [UInt8]) { bytes.append(contentsOf: array) }
    mutating func string16(_ s: String) {
        u16(UInt16(truncatingIfNeeded: s.utf8.count))
        bytes.append(contentsOf: s.utf8)
    }

    /// Writes tag, u32 length and payload; the length is patched in after the payload.
    mutating func value(_ value: FieldValue, allowList: Bool, field: String, id: RecordID?) throws(RecordZoneError) {
        u8(value.kindTag)
        let lengthAt = bytes.count
        u32(0)
        switch value {
        case .string(let s): bytes.append(contentsOf: s.utf8)
        case .int(let v): u64(UInt64(bitPattern: v))
        case .double(let v):
            guard v.isFinite else {
                throw RecordZoneError(.invalidArguments, "field '\(field)' holds a non-finite double", recordID: id)
            }
            u64(v.bitPattern)
        case .bool(let v): u8(v ? 1 : 0)
        case .date(let d): u64(UInt64(bitPattern: FieldValue.milliseconds(d)))
        case .bytes(let d): append(d)
        case .reference(let r):
            string16(r.zone.rawValue)
            string16(r.name)
        case .asset(let a):
            append(a.hash)
            u64(a.size)
        case .list(let items):
            guard allowList else {
                throw RecordZoneError(.invalidArguments, "field '\(field)' nests a list in a list", recordID: id)
            }
            u32(UInt32(items.count))
            for item in items { try self.value(item, allowList: false, field: field, id: id) }
        case .unknown(_, let payload): append(payload)
        }
        let length = UInt32(bytes.count - lengthAt - 4)
        withUnsafeBytes(of: length.bigEndian) { raw in
            for i in 0..<4 { bytes[lengthAt + i] = raw[i] }
        }
    }
}
