/// The identity of a record: the zone it lives in and its name within that zone.
///
/// Names are validated on construction: ``RecordID/init(zone:name:)`` throws for an empty name,
/// a name longer than ``RecordID/maximumNameLength`` bytes of UTF-8, a name that starts with the
/// reserved prefix `_`, one that holds a control character, or one not in Unicode NFC. Zone names are stricter still
/// (``ZoneName``), because they become folder names in a filesystem zone.
public struct RecordID: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// The longest record name, in bytes of UTF-8.
    public static let maximumNameLength = 255
    /// Names starting with this prefix are kept for the system.
    public static let reservedPrefix = "_"

    public let zone: ZoneName
    public let name: String

    /// Creates a record ID.
    /// - Throws: ``RecordZoneError`` with code ``RecordZoneError/Code/invalidArguments`` when the
    ///   name is not valid.
    public init(zone: ZoneName, name: String) throws(RecordZoneError) {
        try Self.validate(name: name, kind: "record name")
        self.zone = zone
        self.name = name
    }

    /// Creates a record ID from a zone name string and a record name, validating both.
    public init(zone: String, name: String) throws(RecordZoneError) {
        try self.init(zone: ZoneName(zone), name: name)
    }

    static func validate(name: String, kind: String) throws(RecordZoneError) {
        let count = name.utf8.count
        guard count > 0 else {
            throw RecordZoneError(.invalidArguments, "\(kind) is empty")
        }
        guard count <= maximumNameLength else {
            throw RecordZoneError(.invalidArguments, "\(kind) is \(count) bytes; the limit is \(maximumNameLength)")
        }
        guard !name.hasPrefix(reservedPrefix) else {
            throw RecordZoneError(.invalidArguments, "\(kind) '\(name)' starts with the reserved prefix '\(reservedPrefix)'")
        }
        guard !name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw RecordZoneError(.invalidArguments, "\(kind) holds a control character")
        }
        // Swift compares names by canonical equivalence, servers by bytes: one spelling only.
        guard NormalForm.isNFC(name) else { throw RecordZoneError(.invalidArguments, "\(kind) is not in Unicode NFC") }
    }

    public var description: String { "\(zone.rawValue)/\(name)" }

    public static func < (lhs: RecordID, rhs: RecordID) -> Bool {
        if lhs.zone != rhs.zone { return lhs.zone < rhs.zone }
        return lhs.name.utf8.lexicographicallyPrecedes(rhs.name.utf8)
    }
}

/// The name of a record zone: 1…64 characters from `A–Z a–z 0–9 . _ -`, not starting with
/// `.` or `_`. Zone names become folder names in a filesystem zone, so they are kept portable.
public struct ZoneName: Hashable, Sendable, Comparable, CustomStringConvertible {
    public static let maximumLength = 64
    public let rawValue: String

    /// - Throws: ``RecordZoneError`` (``RecordZoneError/Code/invalidArguments``) for an invalid name.
    public init(_ rawValue: String) throws(RecordZoneError) {
        let bytes = Array(rawValue.utf8)
        guard !bytes.isEmpty, bytes.count <= Self.maximumLength else {
            throw RecordZoneError(.invalidArguments, "zone name must be 1…\(Self.maximumLength) characters")
        }
        guard bytes[0] != UInt8(ascii: "."), bytes[0] != UInt8(ascii: "_") else {
            throw RecordZoneError(.invalidArguments, "zone name '\(rawValue)' may not start with '.' or '_'")
        }
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "-"):
                continue
            default:
                throw RecordZoneError(.invalidArguments, "zone name '\(rawValue)' may hold only A–Z a–z 0–9 . _ -")
            }
        }
        self.rawValue = rawValue
    }

    /// A name known to follow the rule (a constant of this module's own).
    init(constant rawValue: StaticString) {
        self.rawValue = "\(rawValue)"
    }

    public var description: String { rawValue }

    public static func < (lhs: ZoneName, rhs: ZoneName) -> Bool {
        lhs.rawValue.utf8.lexicographicallyPrecedes(rhs.rawValue.utf8)
    }
}
