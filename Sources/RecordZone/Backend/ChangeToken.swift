import Foundation

/// An opaque, versioned position in a zone's (or the database's) change history.
///
/// Callers store and pass tokens back; they never look inside. Inside, a zone token names the
/// zone and its incarnation, so a token from a deleted-and-recreated zone is recognised and
/// answered with ``RecordZoneError/Code/changeTokenExpired``.
public struct ChangeToken: Hashable, Sendable, Codable, CustomStringConvertible {
    public let data: Data

    public init(data: Data) { self.data = data }

    /// The token as base64, for storage in text and for tools.
    public var base64: String { data.base64EncodedString() }

    public init?(base64: String) {
        guard let data = Data(base64Encoded: base64) else { return nil }
        self.data = data
    }

    public var description: String { base64 }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let data = Data(base64Encoded: text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "change token is not base64"))
        }
        self.data = data
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(base64)
    }
}

/// The inside of a token: format version, kind, backend, zone, incarnation and a
/// backend-specific position.
package struct TokenContents: Equatable {
    package enum Kind: UInt8 { case zone = 1, database = 2 }
    static let version: UInt8 = 1

    package var kind: Kind
    package var backend: String
    package var zone: String
    package var incarnation: String
    package var position: Data

    package var token: ChangeToken {
        var w = ByteWriter()
        w.u8(Self.version)
        w.u8(kind.rawValue)
        w.string16(backend)
        w.string16(zone)
        w.string16(incarnation)
        w.u32(UInt32(position.count))
        w.append(position)
        return ChangeToken(data: Data(w.bytes))
    }

    /// Parses a token; any malformed token is ``RecordZoneError/Code/invalidArguments``.
    package init(_ token: ChangeToken, expecting kind: Kind, backend: String) throws(RecordZoneError) {
        let parsed: TokenContents? = token.data.withUnsafeBytes { raw in
            var r = ByteReader(raw)
            guard let version = try? r.u8(), version == Self.version,
                let k = try? r.u8(), let kind = Kind(rawValue: k),
                let backend = try? r.string16(what: "backend"),
                let zone = try? r.string16(what: "zone"),
                let incarnation = try? r.string16(what: "incarnation"),
                let length = try? r.u32(), let position = try? r.data(Int(length)), r.remaining == 0
            else { return nil }
            return TokenContents(kind: kind, backend: backend, zone: zone, incarnation: incarnation, position: position)
        }
        guard let parsed, parsed.kind == kind, parsed.backend == backend else {
            throw RecordZoneError(.invalidArguments, "not a \(backend) \(kind) change token")
        }
        self = parsed
    }

    package init(kind: Kind, backend: String, zone: String, incarnation: String, position: Data) {
        self.kind = kind
        self.backend = backend
        self.zone = zone
        self.incarnation = incarnation
        self.position = position
    }

    /// Parses a zone token and checks it belongs to this zone and incarnation.
    package static func zonePosition(_ token: ChangeToken?, backend: String, zone: ZoneName, incarnation: String) throws(RecordZoneError) -> Data? {
        guard let token else { return nil }
        let contents = try TokenContents(token, expecting: .zone, backend: backend)
        guard contents.zone == zone.rawValue else {
            throw RecordZoneError(.invalidArguments, "change token is for zone '\(contents.zone)', not '\(zone)'")
        }
        guard contents.incarnation == incarnation else {
            throw RecordZoneError(.changeTokenExpired, "zone '\(zone)' was deleted and recreated since this token; fetch it again from the start")
        }
        return contents.position
    }
}

extension TokenContents {
    /// Parses a server's zone token against the zone as it stands: its position (0 for no
    /// token). - Throws: ``RecordZoneError/Code/changeTokenExpired`` for an earlier incarnation,
    /// or for a position past the zone's `sequence` — the server's data went back in time (a
    /// restore from an earlier copy), and the changes that now take those numbers would be
    /// skipped by a reader resuming from it.
    package static func zoneSequence(_ token: ChangeToken?, backend: String, zone: ZoneName, incarnation: String, current sequence: Int64) throws(RecordZoneError) -> Int64 {
        guard let position = try zonePosition(token, backend: backend, zone: zone, incarnation: incarnation) else { return 0 }
        let since = Int64(bitPattern: SequencePosition.decode(position))
        try refuseAhead(since, of: sequence, "zone '\(zone)'")
        return since
    }

    /// Refuses a token position past where the store stands now (`current`): its data went
    /// back in time; the reader must start again from no token.
    package static func refuseAhead(_ position: Int64, of current: Int64, _ what: String) throws(RecordZoneError) {
        guard position <= current else {
            throw RecordZoneError(.changeTokenExpired, "the change token is ahead of \(what) (its data was restored from an earlier copy); fetch again from the start")
        }
    }

    /// Parses a database token of a server whose identity is `instance`: its position (0 for
    /// no token). - Throws: ``RecordZoneError/Code/changeTokenExpired`` for another server's.
    package static func databasePosition(_ token: ChangeToken?, backend: String, instance: String) throws(RecordZoneError) -> Int64 {
        guard let token else { return 0 }
        let contents = try TokenContents(token, expecting: .database, backend: backend)
        guard contents.incarnation == instance else { throw RecordZoneError(.changeTokenExpired, "database token is from another server") }
        return Int64(bitPattern: SequencePosition.decode(contents.position))
    }

    /// A database token of a server whose identity is `instance`, at `position`.
    package static func databaseToken(backend: String, instance: String, position: Int64) -> ChangeToken {
        TokenContents(kind: .database, backend: backend, zone: "", incarnation: instance, position: SequencePosition.encode(UInt64(bitPattern: position))).token
    }
}

/// A sequence number as a token position: 8 bytes, big-endian.
package enum SequencePosition {
    package static func encode(_ value: UInt64) -> Data { withUnsafeBytes(of: value.bigEndian) { Data($0) } }
    package static func decode(_ data: Data) -> UInt64 { data.prefix(8).reduce(0) { $0 << 8 | UInt64($1) } }
}

/// What a change token holds, for people and tools (`convkit token decode`).
public struct ChangeTokenDescription: Sendable, Hashable, Codable {
    /// `zone` or `database`.
    public let kind: String
    /// The backend that issued it: `server` (a zone server), `filesystem`, `memory`.
    public let backend: String
    public let zone: String
    /// The zone's incarnation: a token from an earlier one has expired.
    public let incarnation: String
    /// Where the next page starts, readably: a sequence number, per-device read ranges, or hex.
    public let position: String
}

extension ChangeToken {
    /// What the token holds, or nil when it is not a token of this format.
    public func describe() -> ChangeTokenDescription? {
        for kind in [TokenContents.Kind.zone, .database] {
            for backend in ["server", "filesystem", "memory"] {
                guard let contents = try? TokenContents(self, expecting: kind, backend: backend) else { continue }
                return ChangeTokenDescription(kind: kind == .zone ? "zone" : "database", backend: backend, zone: contents.zone,
                                              incarnation: contents.incarnation, position: Self.readable(contents))
            }
        }
        return nil
    }

    private static func readable(_ contents: TokenContents) -> String {
        if contents.backend == "filesystem", contents.kind == .zone, let vector = VersionVector(encoded: contents.position) {
            return vector.devices.sorted { $0.key < $1.key }.map { device, progress in
                let ranges = progress.ranges.map { $0.lowerBound == $0.upperBound ? "\($0.lowerBound)" : "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ",")
                let partial = progress.partial.map { " (+\($0.offset) records of \($0.sequence))" } ?? ""
                return "\(device): \(ranges.isEmpty ? "none" : ranges)\(partial)"
            }.joined(separator: "; ")
        }
        if contents.kind == .zone, contents.position.count == 8 { return "sequence \(SequencePosition.decode(contents.position))" }
        return contents.position.map { String(format: "%02x", $0) }.joined()
    }
}
