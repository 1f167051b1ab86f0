import Foundation

/// The JSON bodies of the zone server's API (version 1), shared by the server and the client.
/// Records use their JSON form (``Record``'s `Codable`); tokens and cursors are base64.
/// ``ZoneChanges`` and ``DatabaseChanges`` travel as they are (they are `Codable`).
public enum Wire {
    public struct ErrorBody: Codable, Sendable {
        public var error: Failure
        public init(_ error: Failure) { self.error = error }
    }

    /// An error, for a whole request or for one record.
    public struct Failure: Codable, Sendable {
        public var code: String
        public var message: String
        public var serverRecord: Record?
        public var retryAfter: Double?

        public init(code: String, message: String, serverRecord: Record? = nil, retryAfter: Double? = nil) {
            self.code = code
            self.message = message
            self.serverRecord = serverRecord
            self.retryAfter = retryAfter
        }

        public init(_ error: RecordZoneError) {
            self.init(code: error.code.rawValue, message: error.message, serverRecord: error.serverRecord, retryAfter: error.retryAfter)
        }

        public func error(recordID: RecordID? = nil) -> RecordZoneError {
            RecordZoneError(RecordZoneError.Code(rawValue: code) ?? .internalError, message, recordID: recordID,
                            serverRecord: serverRecord, retryAfter: retryAfter)
        }
    }

    public struct Zones: Codable, Sendable {
        public var zones: [String]
        public init(zones: [String]) { self.zones = zones }
    }

    public struct Wait: Codable, Sendable {
        public var changed: Bool
        public init(changed: Bool) { self.changed = changed }
    }

    public struct Modify: Codable, Sendable {
        public var records: [Record]
        public var policy: SavePolicy?
        public init(records: [Record], policy: SavePolicy) {
            self.records = records
            self.policy = policy
        }
    }

    /// One record's outcome: the record, or an error.
    public struct Outcome: Codable, Sendable {
        public var record: Record?
        public var error: Failure?
        public init(_ result: Result<Record, RecordZoneError>) {
            switch result {
            case .success(let record): self.record = record
            case .failure(let error): self.error = Failure(error)
            }
        }
        public func result(for id: RecordID?) -> Result<Record, RecordZoneError> {
            if let record { return .success(record) }
            return .failure(error?.error(recordID: id) ?? RecordZoneError(.internalError, "empty outcome", recordID: id))
        }
    }

    public struct Outcomes: Codable, Sendable {
        public var results: [Outcome]
        public init(results: [Outcome]) { self.results = results }
    }

    public struct ID: Codable, Sendable {
        public var zone: String
        public var name: String
        public init(_ id: RecordID) {
            zone = id.zone.rawValue
            name = id.name
        }
    }

    public struct Fetch: Codable, Sendable {
        public var ids: [ID]
        public init(ids: [ID]) { self.ids = ids }
    }

    public struct Query: Codable, Sendable {
        public var recordType: String
        public var predicates: [RecordQuery.Predicate]?
        public var sort: [RecordQuery.Sort]?
        public var cursor: String?
        public var limit: Int?
        public init(recordType: String, predicates: [RecordQuery.Predicate], sort: [RecordQuery.Sort], cursor: String?, limit: Int) {
            self.recordType = recordType
            self.predicates = predicates
            self.sort = sort
            self.cursor = cursor
            self.limit = limit
        }
    }

    public struct QueryResults: Codable, Sendable {
        public var records: [Record]
        public var cursor: String?
        public init(records: [Record], cursor: String?) {
            self.records = records
            self.cursor = cursor
        }
    }

    public struct Asset: Codable, Sendable {
        public var sha256: String
        public var size: UInt64
        public init(_ reference: AssetReference) {
            sha256 = reference.hexHash
            size = reference.size
        }
    }
}

extension RecordQuery.Predicate: Codable {
    private enum Keys: String, CodingKey { case equals, contains, range }
    private struct Operand: Codable {
        var field: String
        var value: FieldValue?
        var lower: FieldValue?
        var upper: FieldValue?
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        guard c.allKeys.count == 1, let key = c.allKeys.first else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "a predicate is one of equals, contains, range"))
        }
        let operand = try c.decode(Operand.self, forKey: key)
        switch key {
        case .equals, .contains:
            guard let value = operand.value else {
                throw DecodingError.dataCorruptedError(forKey: key, in: c, debugDescription: "needs a value")
            }
            self = key == .equals ? .equals(operand.field, value) : .contains(operand.field, value)
        case .range:
            self = .range(operand.field, lower: operand.lower, upper: operand.upper)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        switch self {
        case .equals(let field, let value): try c.encode(Operand(field: field, value: value), forKey: .equals)
        case .contains(let field, let value): try c.encode(Operand(field: field, value: value), forKey: .contains)
        case .range(let field, let lower, let upper): try c.encode(Operand(field: field, lower: lower, upper: upper), forKey: .range)
        }
    }
}

extension ZoneName: Codable {
    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        do {
            self = try ZoneName(text)
        } catch {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: error.message))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}

extension ZoneChanges: Codable {
    private enum Keys: String, CodingKey { case records, rejected, token, moreComing }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        self.init(records: try c.decode([Record].self, forKey: .records), rejected: try c.decode([RejectedRecord].self, forKey: .rejected),
                  token: try c.decode(ChangeToken.self, forKey: .token), moreComing: try c.decode(Bool.self, forKey: .moreComing))
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(records, forKey: .records)
        try c.encode(rejected, forKey: .rejected)
        try c.encode(token, forKey: .token)
        try c.encode(moreComing, forKey: .moreComing)
    }
}

extension DatabaseChanges: Codable {
    private enum Keys: String, CodingKey { case changedZones, deletedZones, token }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        self.init(changedZones: try c.decode([ZoneName].self, forKey: .changedZones), deletedZones: try c.decode([ZoneName].self, forKey: .deletedZones),
                  token: try c.decode(ChangeToken.self, forKey: .token))
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(changedZones, forKey: .changedZones)
        try c.encode(deletedZones, forKey: .deletedZones)
        try c.encode(token, forKey: .token)
    }
}

/// On the wire: `{"zone", "name", "reason", "source", "record"}` (zone and name absent when
/// unknown; `record`, the canonical bytes in base64, when the reader has them, so the client can
/// decide with its own pins).
extension RejectedRecord: Codable {
    private enum Keys: String, CodingKey { case zone, name, reason, source, record }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        let id: RecordID? = if let zone = try c.decodeIfPresent(String.self, forKey: .zone), let name = try c.decodeIfPresent(String.self, forKey: .name) {
            try? RecordID(zone: zone, name: name)
        } else {
            nil
        }
        self.init(recordID: id, reason: try c.decode(RejectionReason.self, forKey: .reason), source: try c.decode(String.self, forKey: .source),
                  data: try c.decodeIfPresent(Data.self, forKey: .record))
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encodeIfPresent(recordID?.zone.rawValue, forKey: .zone)
        try c.encodeIfPresent(recordID?.name, forKey: .name)
        try c.encode(reason, forKey: .reason)
        try c.encode(source, forKey: .source)
        try c.encodeIfPresent(data, forKey: .record)
    }
}
