import Foundation

/// A typed value of a record field.
///
/// Dates are kept to the millisecond (as CloudKit does), so that a record always encodes to the
/// same bytes. Doubles must be finite. Lists hold scalar values, not other lists.
/// ``FieldValue/unknown(tag:payload:)`` carries a value of a type written by a newer version;
/// it survives decoding and re-encoding unchanged.
public enum FieldValue: Hashable, Sendable {
    case string(String)
    case int(Int64)
    case double(Double)
    case bool(Bool)
    case date(Date)
    case bytes(Data)
    case reference(RecordID)
    case asset(AssetReference)
    case list([FieldValue])
    case unknown(tag: UInt8, payload: Data)

    /// The date's milliseconds since 1970, the precision a record keeps.
    static func milliseconds(_ date: Date) -> Int64 {
        let value = (date.timeIntervalSince1970 * 1000).rounded()
        guard value.isFinite, value > Double(Int64.min), value < Double(Int64.max) else { return 0 }
        return Int64(value)
    }

    /// Makes a date field value from milliseconds since 1970.
    public static func date(milliseconds: Int64) -> FieldValue {
        .date(Date(timeIntervalSince1970: Double(milliseconds) / 1000))
    }

    /// Whether two values are the same once encoded: dates compare by millisecond.
    public func isCanonicallyEqual(to other: FieldValue) -> Bool {
        switch (self, other) {
        case (.date(let a), .date(let b)): return Self.milliseconds(a) == Self.milliseconds(b)
        case (.list(let a), .list(let b)):
            return a.count == b.count && zip(a, b).allSatisfy { $0.isCanonicallyEqual(to: $1) }
        default: return self == other
        }
    }

    public var stringValue: String? { if case .string(let v) = self { v } else { nil } }
    public var intValue: Int64? { if case .int(let v) = self { v } else { nil } }
    public var doubleValue: Double? { if case .double(let v) = self { v } else { nil } }
    public var boolValue: Bool? { if case .bool(let v) = self { v } else { nil } }
    public var dateValue: Date? { if case .date(let v) = self { v } else { nil } }
    public var bytesValue: Data? { if case .bytes(let v) = self { v } else { nil } }
    public var referenceValue: RecordID? { if case .reference(let v) = self { v } else { nil } }
    public var assetValue: AssetReference? { if case .asset(let v) = self { v } else { nil } }
    public var listValue: [FieldValue]? { if case .list(let v) = self { v } else { nil } }
}

extension FieldValue: Comparable {
    /// Orders values of the same kind naturally (strings by UTF-8 bytes, dates by millisecond);
    /// values of different kinds order by kind. Used for query sorting and ranges.
    public static func < (lhs: FieldValue, rhs: FieldValue) -> Bool {
        switch (lhs, rhs) {
        case (.string(let a), .string(let b)): return a.utf8.lexicographicallyPrecedes(b.utf8)
        case (.int(let a), .int(let b)): return a < b
        case (.double(let a), .double(let b)): return a < b
        case (.bool(let a), .bool(let b)): return !a && b
        case (.date(let a), .date(let b)): return milliseconds(a) < milliseconds(b)
        case (.bytes(let a), .bytes(let b)): return a.lexicographicallyPrecedes(b)
        case (.reference(let a), .reference(let b)): return a < b
        case (.asset(let a), .asset(let b)): return a.hash.lexicographicallyPrecedes(b.hash)
        case (.list(let a), .list(let b)): return a.lexicographicallyPrecedes(b)
        case (.unknown(let ta, let pa), .unknown(let tb, let pb)):
            return ta != tb ? ta < tb : pa.lexicographicallyPrecedes(pb)
        default: return lhs.kindTag < rhs.kindTag
        }
    }

    /// The tag this value's kind has in the canonical encoding.
    var kindTag: UInt8 {
        switch self {
        case .string: 1
        case .int: 2
        case .double: 3
        case .bool: 4
        case .date: 5
        case .bytes: 6
        case .reference: 7
        case .asset: 8
        case .list: 9
        case .unknown(let tag, _): tag
        }
    }
}

/// A reference to an asset stored by content hash: its SHA-256 and its size in bytes.
public struct AssetReference: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The SHA-256 of the asset's bytes (32 bytes).
    public let hash: Data
    public let size: UInt64

    public init(hash: Data, size: UInt64) throws(RecordZoneError) {
        guard hash.count == 32 else {
            throw RecordZoneError(.invalidArguments, "asset hash must be 32 bytes, got \(hash.count)")
        }
        self.hash = hash
        self.size = size
    }

    /// The reference for these bytes.
    public init(for data: Data) {
        self.hash = Sodium.sha256(data)
        self.size = UInt64(data.count)
    }

    /// The hash in lowercase hexadecimal, as used for file names.
    public var hexHash: String { hash.hexString }

    public var description: String { "sha256:\(hexHash) (\(size) bytes)" }
}

extension Data {
    /// Lowercase hexadecimal.
    public var hexString: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(count * 2)
        for byte in self {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Parses lowercase or uppercase hexadecimal; nil when not valid.
    public init?(hexString: String) {
        let chars = Array(hexString.utf8)
        guard chars.count % 2 == 0 else { return nil }
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var bytes = [UInt8]()
        bytes.reserveCapacity(chars.count / 2)
        var index = 0
        while index < chars.count {
            guard let high = nibble(chars[index]), let low = nibble(chars[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        self.init(bytes)
    }
}
