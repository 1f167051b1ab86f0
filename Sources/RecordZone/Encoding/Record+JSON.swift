import Foundation

/// The readable JSON form of records, for people and tools (the wire carries the canonical
/// bytes themselves: ``Wire``). Bytes are base64, dates are milliseconds since 1970, 64-bit
/// integers (the clock, int values) are decimal strings so that every JSON parser reads them
/// exactly, and each field value is an object with one key naming its type:
///
/// ```json
/// {"zone":"notes","name":"n1","type":"Note","author":"<base64>","clock":"7095310565998592",
///  "deleted":false,"signature":"<base64>",
///  "fields":{"title":{"string":"Hello"},"count":{"int":"3"},"when":{"date":1700000000000}}}
/// ```
///
/// The signature never depends on JSON formatting: it covers the canonical bytes, which the
/// JSON form carries exactly (`server` metadata is not signed).
extension Record: Codable {
    private enum Keys: String, CodingKey {
        case zone, name, type, author, clock, deleted, signature, fields, server
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        let id: RecordID
        do {
            id = try RecordID(zone: try c.decode(String.self, forKey: .zone), name: try c.decode(String.self, forKey: .name))
        } catch let error as RecordZoneError {
            throw DecodingError.dataCorruptedError(forKey: .name, in: c, debugDescription: error.message)
        }
        self.init(id: id, type: try c.decode(String.self, forKey: .type), fields: try c.decodeIfPresent([String: FieldValue].self, forKey: .fields) ?? [:])
        authorKey = try c.decodeIfPresent(Data.self, forKey: .author) ?? Data()
        if let text = try c.decodeIfPresent(String.self, forKey: .clock) {
            guard let value = UInt64(text) else { throw DecodingError.dataCorruptedError(forKey: .clock, in: c, debugDescription: "clock is not a decimal uint64") }
            clock = RecordClock(rawValue: value)
        }
        isDeleted = try c.decodeIfPresent(Bool.self, forKey: .deleted) ?? false
        signature = try c.decodeIfPresent(Data.self, forKey: .signature) ?? Data()
        serverMetadata = try c.decodeIfPresent(ServerMetadata.self, forKey: .server)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(id.zone.rawValue, forKey: .zone)
        try c.encode(id.name, forKey: .name)
        try c.encode(recordType, forKey: .type)
        try c.encode(authorKey, forKey: .author)
        try c.encode(String(clock.rawValue), forKey: .clock)
        try c.encode(isDeleted, forKey: .deleted)
        try c.encode(signature, forKey: .signature)
        try c.encode(fields, forKey: .fields)
        try c.encodeIfPresent(serverMetadata, forKey: .server)
    }

    /// Decodes a record from JSON.
    /// - Throws: ``RecordZoneError`` (``RecordZoneError/Code/malformed``) with the decoder's reason.
    public init(json: Data) throws(RecordZoneError) {
        do {
            self = try JSONDecoder().decode(Record.self, from: json)
        } catch {
            throw RecordZoneError(.malformed, "not a JSON record: \(Self.describe(error))")
        }
    }

    /// The record as JSON, keys sorted.
    public func json() throws(RecordZoneError) -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        do {
            return try encoder.encode(self)
        } catch {
            throw RecordZoneError(.invalidArguments, "record \(id) cannot be written as JSON: \(error)", recordID: id)
        }
    }

    public static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.dataCorrupted(let context), DecodingError.typeMismatch(_, let context),
            DecodingError.valueNotFound(_, let context):
            let path = context.codingPath.map(\.stringValue).joined(separator: ".")
            return path.isEmpty ? context.debugDescription : "\(path): \(context.debugDescription)"
        case DecodingError.keyNotFound(let key, _): return "missing key '\(key.stringValue)'"
        default: return "\(error)"
        }
    }
}

extension FieldValue: Codable {
    private enum Keys: String, CodingKey {
        case string, int, double, bool, date, bytes, reference, asset, list, unknown
    }
    private struct Reference: Codable { var zone: String; var name: String }
    private struct Asset: Codable { var sha256: String; var size: UInt64 }
    private struct Unknown: Codable { var tag: UInt8; var payload: Data }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        guard c.allKeys.count == 1, let key = c.allKeys.first else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "a field value is an object with exactly one type key"))
        }
        func corrupt(_ why: String) -> DecodingError {
            DecodingError.dataCorruptedError(forKey: key, in: c, debugDescription: why)
        }
        switch key {
        case .string: self = .string(try c.decode(String.self, forKey: key))
        case .int:
            guard let value = Int64(try c.decode(String.self, forKey: key)) else { throw corrupt("an int is a decimal int64 in a string") }
            self = .int(value)
        case .double:
            let d = try c.decode(Double.self, forKey: key)
            guard d.isFinite else { throw corrupt("double must be finite") }
            self = .double(d)
        case .bool: self = .bool(try c.decode(Bool.self, forKey: key))
        case .date: self = .date(milliseconds: try c.decode(Int64.self, forKey: key))
        case .bytes: self = .bytes(try c.decode(Data.self, forKey: key))
        case .reference:
            let r = try c.decode(Reference.self, forKey: key)
            do { self = .reference(try RecordID(zone: r.zone, name: r.name)) } catch { throw corrupt(error.message) }
        case .asset:
            let a = try c.decode(Asset.self, forKey: key)
            guard let hash = Data(hexString: a.sha256) else { throw corrupt("asset sha256 is not hex") }
            do { self = .asset(try AssetReference(hash: hash, size: a.size)) } catch { throw corrupt(error.message) }
        case .list:
            let items = try c.decode([FieldValue].self, forKey: key)
            guard !items.contains(where: { $0.listValue != nil }) else { throw corrupt("lists may not nest") }
            self = .list(items)
        case .unknown:
            let u = try c.decode(Unknown.self, forKey: key)
            guard u.tag == 0 || u.tag > 9 else { throw corrupt("tag \(u.tag) is a known type") }
            guard u.tag != 0 else { throw corrupt("tag 0 is reserved") }
            self = .unknown(tag: u.tag, payload: u.payload)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        switch self {
        case .string(let v): try c.encode(v, forKey: .string)
        case .int(let v): try c.encode(String(v), forKey: .int)
        case .double(let v): try c.encode(v, forKey: .double)
        case .bool(let v): try c.encode(v, forKey: .bool)
        case .date(let v): try c.encode(FieldValue.milliseconds(v), forKey: .date)
        case .bytes(let v): try c.encode(v, forKey: .bytes)
        case .reference(let r): try c.encode(Reference(zone: r.zone.rawValue, name: r.name), forKey: .reference)
        case .asset(let a): try c.encode(Asset(sha256: a.hexHash, size: a.size), forKey: .asset)
        case .list(let items): try c.encode(items, forKey: .list)
        case .unknown(let tag, let payload): try c.encode(Unknown(tag: tag, payload: payload), forKey: .unknown)
        }
    }
}
