import Foundation

/// Why bytes are not a valid canonical record. Every malformed input maps to one of these;
/// the decoder never reads past the end of its input.
public enum RecordDecodingError: Error, Hashable, Sendable, CustomStringConvertible {
    case tooLarge(size: Int)
    case truncated(offset: Int, needed: Int)
    case badMagic
    case unsupportedVersion(UInt8)
    case invalidUTF8(what: String)
    case invalidName(String)
    case invalidLength(what: String, length: Int)
    case invalidFlags(UInt8)
    case fieldsOutOfOrder(key: String)
    /// A record name, type or field key not in Unicode NFC (two spellings of one text).
    case notNormalized(what: String)
    case invalidValue(field: String, reason: String)
    case trailingBytes(count: Int)

    public var description: String {
        switch self {
        case .tooLarge(let size): "record is \(size) bytes; the limit is \(Record.maximumEncodedSize)"
        case .truncated(let offset, let needed): "truncated: needed \(needed) more bytes at offset \(offset)"
        case .badMagic: "not a canonical record (bad magic)"
        case .unsupportedVersion(let v): "unsupported record format version \(v)"
        case .invalidUTF8(let what): "\(what) is not valid UTF-8"
        case .invalidName(let reason): "invalid name: \(reason)"
        case .invalidLength(let what, let length): "invalid length \(length) for \(what)"
        case .invalidFlags(let flags): "unknown flags 0x\(String(flags, radix: 16))"
        case .fieldsOutOfOrder(let key): "field '\(key)' is out of order or repeated"
        case .notNormalized(let what): "\(what) is not in Unicode NFC (one spelling per text: compose it first)"
        case .invalidValue(let field, let reason): "field '\(field)': \(reason)"
        case .trailingBytes(let count): "\(count) bytes after the end of the record"
        }
    }
}

extension Record {
    /// Decodes a record from its canonical encoding (``encoded()``), keeping unknown value types.
    ///
    /// The decoder accepts only canonical input: fields strictly in order, no trailing bytes,
    /// so that decoding and re-encoding gives back exactly the input.
    /// - Throws: ``RecordDecodingError`` for any malformed input.
    public init(canonical data: Data) throws(RecordDecodingError) {
        guard data.count <= Record.maximumEncodedSize else { throw .tooLarge(size: data.count) }
        let result: Result<Record, RecordDecodingError> = data.withUnsafeBytes { raw in
            var reader = ByteReader(raw)
            do throws(RecordDecodingError) {
                return .success(try reader.record())
            } catch {
                return .failure(error)
            }
        }
        self = try result.get()
        signedBytes = data
    }
}

struct ByteReader {
    let bytes: UnsafeRawBufferPointer
    var offset = 0

    init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    var remaining: Int { bytes.count - offset }

    mutating func need(_ n: Int) throws(RecordDecodingError) {
        guard n >= 0, n <= remaining else { throw .truncated(offset: offset, needed: n - remaining) }
    }
    mutating func u8() throws(RecordDecodingError) -> UInt8 {
        try need(1)
        defer { offset += 1 }
        return bytes[offset]
    }
    mutating func u16() throws(RecordDecodingError) -> UInt16 {
        try need(2)
        defer { offset += 2 }
        return UInt16(bytes[offset]) << 8 | UInt16(bytes[offset + 1])
    }
    mutating func u32() throws(RecordDecodingError) -> UInt32 {
        try need(4)
        var v: UInt32 = 0
        for i in 0..<4 { v = v << 8 | UInt32(bytes[offset + i]) }
        offset += 4
        return v
    }
    mutating func u64() throws(RecordDecodingError) -> UInt64 {
        try need(8)
        var v: UInt64 = 0
        for i in 0..<8 { v = v << 8 | UInt64(bytes[offset + i]) }
        offset += 8
        return v
    }
    mutating func raw(_ n: Int) throws(RecordDecodingError) -> UnsafeRawBufferPointer {
        try need(n)
        defer { offset += n }
        return UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + n])
    }
    mutating func data(_ n: Int) throws(RecordDecodingError) -> Data { Data(try raw(n)) }
    mutating func string(_ n: Int, what: String) throws(RecordDecodingError) -> String {
        let slice = try raw(n)
        guard let s = String(validating: slice, as: UTF8.self) else { throw .invalidUTF8(what: what) }
        return s
    }
    mutating func string16(what: String) throws(RecordDecodingError) -> String {
        try string(Int(try u16()), what: what)
    }

    mutating func record() throws(RecordDecodingError) -> Record {
        guard remaining >= 4, bytes[0] == CanonicalEncoding.magic[0], bytes[1] == CanonicalEncoding.magic[1],
            bytes[2] == CanonicalEncoding.magic[2]
        else { throw .badMagic }
        offset = 3
        let version = try u8()
        guard version == CanonicalEncoding.version else { throw .unsupportedVersion(version) }
        let id: RecordID
        do {
            id = try RecordID(zone: try string16(what: "zone name"), name: try string16(what: "record name"))
        } catch let error as RecordZoneError {
            throw .invalidName(error.message)
        } catch let error as RecordDecodingError {
            throw error
        } catch {
            throw .invalidName("\(error)")
        }
        let type = try string16(what: "record type")
        guard !type.isEmpty else { throw .invalidLength(what: "record type", length: 0) }
        guard NormalForm.isNFC(type) else { throw .notNormalized(what: "record type") }
        var record = Record(id: id, type: type)
        let keyLength = Int(try u8())
        guard keyLength == 0 || keyLength == Sodium.publicKeyLength else {
            throw .invalidLength(what: "author key", length: keyLength)
        }
        record.authorKey = try data(keyLength)
        record.clock = RecordClock(rawValue: try u64())
        let flags = try u8()
        guard flags & ~1 == 0 else { throw .invalidFlags(flags) }
        record.isDeleted = flags == 1
        let fieldCount = Int(try u32())
        // Each field needs at least 2 (key length) + 1 (key) + 1 (tag) + 4 (length) bytes.
        guard fieldCount <= remaining / 8 else { throw .invalidLength(what: "field count", length: fieldCount) }
        var fields = [String: FieldValue](minimumCapacity: fieldCount)
        var previousKey: UnsafeRawBufferPointer? = nil
        for _ in 0..<fieldCount {
            let keyCount = Int(try u16())
            guard keyCount > 0, keyCount <= CanonicalEncoding.maximumKeyLength else {
                throw .invalidLength(what: "field name", length: keyCount)
            }
            let keyBytes = try raw(keyCount)
            guard let key = String(validating: keyBytes, as: UTF8.self) else { throw .invalidUTF8(what: "field name") }
            guard NormalForm.isNFC(key) else { throw .notNormalized(what: "field name") }
            if let previous = previousKey, !previous.lexicographicallyPrecedes(keyBytes) {
                throw .fieldsOutOfOrder(key: key)
            }
            previousKey = keyBytes
            let value = try self.value(allowList: true, field: key)
            guard fields.updateValue(value, forKey: key) == nil else { throw .fieldsOutOfOrder(key: key) }
        }
        record.fields = fields
        let signatureLength = Int(try u8())
        guard signatureLength == 0 || signatureLength == Sodium.signatureLength else {
            throw .invalidLength(what: "signature", length: signatureLength)
        }
        record.signature = try data(signatureLength)
        guard remaining == 0 else { throw .trailingBytes(count: remaining) }
        return record
    }

    mutating func value(allowList: Bool, field: String) throws(RecordDecodingError) -> FieldValue {
        let tag = try u8()
        let length = Int(try u32())
        try need(length)
        let end = offset + length
        func fixed(_ n: Int) throws(RecordDecodingError) {
            guard length == n else { throw .invalidValue(field: field, reason: "tag \(tag) needs \(n) bytes, has \(length)") }
        }
        let value: FieldValue
        switch tag {
        case 0: throw .invalidValue(field: field, reason: "tag 0 is reserved")
        case 1: value = .string(try string(length, what: "field '\(field)'"))
        case 2: try fixed(8); value = .int(Int64(bitPattern: try u64()))
        case 3:
            try fixed(8)
            let d = Double(bitPattern: try u64())
            guard d.isFinite else { throw .invalidValue(field: field, reason: "non-finite double") }
            value = .double(d)
        case 4:
            try fixed(1)
            let b = try u8()
            guard b <= 1 else { throw .invalidValue(field: field, reason: "bool byte \(b)") }
            value = .bool(b == 1)
        case 5: try fixed(8); value = .date(milliseconds: Int64(bitPattern: try u64()))
        case 6: value = .bytes(try data(length))
        case 7:
            let zone = try string16(what: "reference zone")
            let name = try string16(what: "reference name")
            do {
                value = .reference(try RecordID(zone: zone, name: name))
            } catch {
                throw .invalidValue(field: field, reason: "bad reference: \(error.message)")
            }
        case 8:
            try fixed(40)
            let hash = try data(32)
            let size = try u64()
            do {
                value = .asset(try AssetReference(hash: hash, size: size))
            } catch {
                throw .invalidValue(field: field, reason: error.message)
            }
        case 9:
            guard allowList else { throw .invalidValue(field: field, reason: "nested list") }
            let count = Int(try u32())
            guard count <= length / 5 else { throw .invalidLength(what: "list count", length: count) }
            var items = [FieldValue]()
            items.reserveCapacity(count)
            for _ in 0..<count { items.append(try self.value(allowList: false, field: field)) }
            value = .list(items)
        default: value = .unknown(tag: tag, payload: try data(length))
        }
        guard offset == end else { throw .invalidValue(field: field, reason: "length \(length) does not match its content") }
        return value
    }
}
