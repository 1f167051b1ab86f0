import Foundation

/// The bodies of the zone server's API (version 1), shared by the server and the client.
///
/// Records travel as their canonical bytes, exactly as signed (``SignedRecord``), in one of two
/// forms chosen by `Content-Type` / `Accept`:
/// - `application/json`: each record is `{"bytes": "<base64>", "changeTag", "receivedAt"}`;
/// - `application/vnd.convkit.records` (the client's default): `"CKW" 0x01`, a u32 count, then
///   per record a u32 length and its canonical bytes (big-endian), then the same JSON document,
///   in which each record's `bytes` is replaced by `"i": <its index in the table>`.
/// Tokens and cursors are base64; times are unix milliseconds; no number in a body exceeds 2^53.
public enum Wire {
    public static let jsonType = "application/json"
    public static let recordsType = "application/vnd.convkit.records"

    /// A record as it travels: its canonical bytes and the server's metadata. Decoding it
    /// verifies nothing; the reader's policy does (``RecordPolicy/admit(batch:source:)``).
    public struct SignedRecord: Sendable, Hashable {
        public var bytes: Data
        public var changeTag: String?
        /// When the server received it, in unix milliseconds.
        public var receivedAt: Int64?

        public init(bytes: Data, changeTag: String? = nil, receivedAt: Int64? = nil) {
            self.bytes = bytes
            self.changeTag = changeTag
            self.receivedAt = receivedAt
        }

        public init(_ record: Record) throws(RecordZoneError) {
            self.init(bytes: try record.encoded(), changeTag: record.serverMetadata?.changeTag,
                      receivedAt: record.serverMetadata?.receivedAt.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) })
        }

        /// The server's metadata, as records carry it.
        public var serverMetadata: ServerMetadata? {
            changeTag.map { ServerMetadata(changeTag: $0, receivedAt: receivedAt.map { Date(timeIntervalSince1970: Double($0) / 1000) }) }
        }

        /// The record these bytes encode, with the server's metadata (not verified).
        public func decoded() throws(RecordDecodingError) -> Record {
            var record = try Record(canonical: bytes)
            record.serverMetadata = serverMetadata
            return record
        }
    }

    /// Encodes a body in the JSON or the binary form.
    public static func encode<T: Encodable>(_ value: T, binary: Bool) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        guard binary else { return try encoder.encode(value) }
        let table = RecordTable()
        encoder.userInfo[RecordTable.key] = table
        let document = try encoder.encode(value)
        var w = ByteWriter()
        w.append(binaryMagic)
        w.u32(UInt32(table.records.count))
        for bytes in table.records {
            w.u32(UInt32(bytes.count))
            w.append(bytes)
        }
        w.append(document)
        return Data(w.bytes)
    }

    /// Decodes a body whose JSON (the whole body, or the binary form's document) must be
    /// canonical — keys sorted, no insignificant whitespace, no
    /// escaped slashes, as ``encode(_:binary:)`` writes it (Python: `json.dumps(body,
    /// sort_keys=True, separators=(",", ":"))`) — so that every reader of a body that carries
    /// signed records sees the same thing: a duplicate key or any other ambiguity is refused.
    /// - Throws: ``NonCanonicalJSON`` when the body is valid JSON but not in that form.
    public static func decodeCanonical<T: Codable>(_ type: T.Type, from data: Data, binary: Bool) throws -> T {
        let value = try decode(type, from: data, binary: binary)
        guard try encode(value, binary: binary) == data else { throw NonCanonicalJSON() }
        return value
    }

    /// A JSON body that decodes but is not in the canonical form (a duplicate key, unsorted keys,
    /// whitespace, an unknown key).
    public struct NonCanonicalJSON: Error, CustomStringConvertible {
        public var description: String {
            "the JSON body is not canonical (keys sorted, no duplicates, no whitespace, no escaped slashes, no unknown keys)"
        }
    }

    /// Decodes a body in the JSON or the binary form.
    /// - Throws: a `DecodingError` (or ``RecordDecodingError``) for any malformed body.
    public static func decode<T: Decodable>(_ type: T.Type, from data: Data, binary: Bool) throws -> T {
        let decoder = JSONDecoder()
        guard binary else { return try decoder.decode(type, from: data) }
        let table: Result<([Data], Int), RecordDecodingError> = data.withUnsafeBytes { raw in
            var r = ByteReader(raw)
            do throws(RecordDecodingError) {
                guard r.remaining >= 4, Array(try r.raw(4)) == binaryMagic else { throw .badMagic }
                let count = Int(try r.u32())
                // Each record takes at least its 4-byte length: a count beyond that is a lie.
                guard count <= r.remaining / 4 else { throw .invalidLength(what: "record table", length: count) }
                var records = [Data]()
                records.reserveCapacity(count)
                for _ in 0..<count {
                    let length = Int(try r.u32())
                    guard length <= Record.maximumEncodedSize else { throw .tooLarge(size: length) }
                    records.append(try r.data(length))
                }
                return .success((records, r.offset))
            } catch {
                return .failure(error)
            }
        }
        let (records, documentStart) = try table.get()
        decoder.userInfo[RecordTable.key] = RecordTable(records)
        return try decoder.decode(type, from: data.suffix(from: data.startIndex + documentStart))
    }

    static let binaryMagic: [UInt8] = [0x43, 0x4B, 0x57, 0x01]  // "CKW" 1

    /// Whether a JSON body holds more than `limit` objects (`{` outside strings), found by one
    /// scan that stops as soon as it passes the limit — so a million-entry body is refused after
    /// its first entries, before any decoding. (A modify body holds one object for the body and
    /// one per record.)
    public static func jsonObjectCountExceeds(_ body: Data, _ limit: Int) -> Bool {
        var count = 0, inString = false, escaped = false
        for byte in body {
            if inString {
                if escaped { escaped = false } else if byte == UInt8(ascii: "\\") { escaped = true } else if byte == UInt8(ascii: "\"") { inString = false }
            } else if byte == UInt8(ascii: "\"") {
                inString = true
            } else if byte == UInt8(ascii: "{") {
                count += 1
                if count > limit { return true }
            }
        }
        return false
    }

    /// How many records a binary body says it holds, read from its first 8 bytes — so a server
    /// can refuse a body over its limit before decoding any of it. Nil for anything else.
    public static func declaredRecordCount(_ body: Data) -> Int? {
        guard body.count >= 8, Array(body.prefix(4)) == binaryMagic else { return nil }
        return body.dropFirst(4).prefix(4).reduce(0) { $0 << 8 | Int($1) }
    }

    /// One frame of the stream (docs/PROTOCOL.md §2, "The stream"): a JSON object whose `type`
    /// says which of the other fields it has.
    public struct StreamFrame: Codable, Sendable {
        public enum Kind: String, Codable, Sendable {
            /// Client: follow `zones`, each from its token (null: from the zone's beginning);
            /// with `feed` true, be told of the database feed too (``feed``).
            case follow
            /// Server: a page of a followed zone's changes after `since` (the token the zone was
            /// followed from, or the last page's), as `GET /v1/zones/{zone}/changes` answers it.
            case changes
            /// Server: a followed zone can no longer be followed (`error`: why); the client
            /// falls back to reading it by request.
            case failed
            /// Either side, at least every ``StreamFrame/heartbeatSeconds``.
            case ping
            /// Server, to a stream that asked for it (`follow` with `feed`): the database feed may
            /// name a zone the stream does not follow (a conversation started with the client, a
            /// group it was let into, a zone deleted): read the feed. Sent at once when asked (the
            /// feed may have moved while the client was away), then whenever it applies.
            case feed
            /// Client: watch `zone`'s live state — who types there, and the presence of `of`
            /// (0–256 identities) — replacing an earlier watch of it. Only to a server that offers
            /// it (``StreamFrame/framesHeader``).
            case watch
            /// Client: stop watching `zone`.
            case unwatch
            /// Server: a watched zone's live state (`typing`, `presence`), at once and at each
            /// change; with `error` instead, the watch is refused and ended.
            case live
        }
        /// The longest either side stays silent: a ping is sent at the latest then.
        public static let heartbeatSeconds = 15
        /// A side that heard nothing for this long takes the other for dead and closes.
        public static let silenceSeconds = 45

        /// How often one side pings and how long a silence it takes for the other's end. The
        /// protocol's (``standard``) everywhere but where both ends are set alike: a test of a
        /// dead link, a network known to be quick.
        public struct Timing: Sendable, Equatable {
            public var heartbeat: Duration
            public var silence: Duration

            public init(heartbeat: Duration, silence: Duration) {
                self.heartbeat = heartbeat
                self.silence = silence
            }

            /// A ping every ``StreamFrame/heartbeatSeconds``, the end after ``StreamFrame/silenceSeconds``.
            public static let standard = Timing(heartbeat: .seconds(heartbeatSeconds), silence: .seconds(silenceSeconds))
        }
        /// The protocol named in the opening request's `Upgrade` header and in the `101`.
        public static let protocolName = "convkit-stream/1"
        /// The most zones one stream follows.
        public static let maximumZones = 10_000
        /// The most zones one stream watches (``Kind/watch``) at a time.
        public static let maximumWatches = 64
        /// The `101`'s header naming the client frames a server reads beyond `follow` and `ping`.
        public static let framesHeader = "ConvKit-Stream-Frames"
        /// What this version's servers name there.
        public static let offeredFrames = "watch, unwatch"

        public var type: Kind
        public var zones: [String: ChangeToken?]?
        public var zone: String?
        /// A `changes` frame's starting point (absent: the zone's beginning): a client applies
        /// the page only where its own token for the zone is this one.
        public var since: ChangeToken?
        public var changes: Changes?
        public var error: Failure?
        /// A `follow` frame's ask to be told of the database feed (``Kind/feed``): once true, for
        /// the stream's life.
        public var feed: Bool?
        /// A `watch` frame's identities whose presence it asks.
        public var of: [String]?
        /// A `live` frame's typists (the client left out) and presence (of those watched who
        /// take part in the zone now, in the order asked).
        public var typing: [String]?
        public var presence: [PresenceList.Entry]?

        public init(type: Kind, zones: [String: ChangeToken?]? = nil, feed: Bool? = nil, zone: String? = nil, since: ChangeToken? = nil, changes: Changes? = nil,
                    error: Failure? = nil, of: [String]? = nil, typing: [String]? = nil, presence: [PresenceList.Entry]? = nil) {
            self.type = type
            self.zones = zones
            self.feed = feed
            self.of = of
            self.typing = typing
            self.presence = presence
            self.zone = zone
            self.since = since
            self.changes = changes
            self.error = error
        }

        public func encoded() throws -> Data {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            return try encoder.encode(self)
        }

        /// A frame on the wire: `payload`'s length (4 bytes, big-endian), then `payload`.
        public static func framed(_ payload: Data) -> Data {
            var frame = Data(capacity: payload.count + 4)
            withUnsafeBytes(of: UInt32(payload.count).bigEndian) { frame.append(contentsOf: $0) }
            frame.append(payload)
            return frame
        }
    }

    public struct ErrorBody: Codable, Sendable {
        public var error: Failure
        public init(_ error: Failure) { self.error = error }
    }

    /// An error, for a whole request or for one record.
    public struct Failure: Codable, Sendable {
        /// A ``RecordZoneError/Code`` by name (a client keeps one it does not know as `internalError`).
        public var code: String
        public var message: String
        public var serverRecord: SignedRecord?
        /// Seconds to wait before retrying (429, 503).
        public var retryAfter: Double?
        /// With `notAuthenticated`: an ``AuthenticationProblem`` by name.
        public var reason: String?
        /// With the reason `clockSkew`: how many seconds the request's time is ahead of the
        /// server's clock (negative: behind).
        public var skewSeconds: Double?

        /// The body of an error: every one a server sends is made from a ``RecordZoneError``.
        public init(_ error: RecordZoneError) {
            code = error.code.rawValue
            message = error.message
            serverRecord = error.serverRecord.flatMap { try? SignedRecord($0) }
            retryAfter = error.retryAfter
            reason = error.authentication?.name
            if case .clockSkew(let seconds)? = error.authentication { skewSeconds = seconds }
        }

        /// The error, with the server's record decoded (not verified: the caller checks it).
        public func error(recordID: RecordID? = nil) -> RecordZoneError {
            RecordZoneError(RecordZoneError.Code(rawValue: code) ?? .internalError, message, recordID: recordID,
                            serverRecord: serverRecord.flatMap { try? $0.decoded() }, retryAfter: retryAfter,
                            authentication: reason.flatMap { AuthenticationProblem(name: $0, skewSeconds: skewSeconds) })
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

    /// `PUT /v1/zones/{zone}/typing`'s body.
    public struct SetTyping: Codable, Sendable {
        public var typing: Bool
        public init(typing: Bool) { self.typing = typing }
    }

    /// `GET /v1/zones/{zone}/typing`'s answer: who types, and the version to wait past (decimal).
    public struct Typing: Codable, Sendable {
        public var typing: [String]
        public var version: String
        public init(_ state: TypingState) {
            typing = state.identities
            version = String(state.version)
        }
    }

    /// `PUT /v1/presence`'s body.
    public struct SetPresence: Codable, Sendable {
        public var online: Bool
        public init(online: Bool) { self.online = online }
    }

    /// `GET /v1/zones/{zone}/presence`'s answer: each one asked who takes part in the zone,
    /// and the version to wait past (decimal).
    public struct PresenceList: Codable, Sendable {
        public struct Entry: Codable, Sendable {
            public var identity: String
            public var online: Bool
            /// Milliseconds since 1970; absent when the server has not heard of them since it started.
            public var lastSeen: Int64?

            public init(_ presence: Presence) {
                identity = presence.identity
                online = presence.isOnline
                lastSeen = presence.lastSeen.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) }
            }

            public var presence: Presence {
                Presence(identity: identity, isOnline: online, lastSeen: lastSeen.map { Date(timeIntervalSince1970: Double($0) / 1000) })
            }
        }
        public var presence: [Entry]
        public var version: String
        public init(_ state: PresenceState) {
            presence = state.presence.map(Entry.init)
            version = String(state.version)
        }
        public var state: PresenceState? {
            UInt64(version).map { version in PresenceState(presence: presence.map(\.presence), version: version) }
        }
    }

    public struct Modify: Codable, Sendable {
        public var records: [SignedRecord]
        public var policy: SavePolicy?
        /// The client's database token: the answer then carries the feed since it (``SaveCatchUp``).
        public var since: ChangeToken?
        public init(records: [Record], policy: SavePolicy, since: ChangeToken? = nil) throws(RecordZoneError) {
            self.records = try records.map { record throws(RecordZoneError) in try SignedRecord(record) }
            self.policy = policy
            self.since = since
        }
    }

    /// One record's outcome: the record, or an error.
    /// One record's outcome: the record, or an error. A save whose own version now wins
    /// answers with `stored` alone (the server's metadata for the bytes it was sent), not the
    /// bytes again.
    public struct Outcome: Codable, Sendable {
        public var record: SignedRecord?
        public var stored: Stored?
        public var error: Failure?
        public init(record: SignedRecord) { self.record = record }
        public init(_ result: Result<Record, RecordZoneError>, sent: Data? = nil) {
            switch result {
            case .success(let record):
                do {
                    let signed = try SignedRecord(record)
                    if let sent, signed.bytes == sent {
                        stored = Stored(changeTag: signed.changeTag, receivedAt: signed.receivedAt)
                    } else {
                        self.record = signed
                    }
                } catch { self.error = Failure(error) }
            case .failure(let error): self.error = Failure(error)
            }
        }
    }

    /// The server's metadata for a version it stored as sent.
    public struct Stored: Codable, Sendable {
        public var changeTag: String?
        public var receivedAt: Int64?
    }

    public struct Outcomes: Codable, Sendable {
        public var results: [Outcome]
        /// A modify's catch-up (absent in a fetch's answer, and when there is nothing to tell).
        public var catchUp: SaveCatchUp?
        public init(results: [Outcome], catchUp: SaveCatchUp? = nil) {
            self.results = results
            self.catchUp = catchUp
        }
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
        public var records: [SignedRecord]
        public var cursor: String?
        public init(records: [SignedRecord], cursor: String?) {
            self.records = records
            self.cursor = cursor
        }
    }

    /// One page of a zone's changes, as the server stores the records (it does not verify them
    /// again: the reader does).
    public struct Changes: Codable, Sendable {
        public var records: [SignedRecord]
        public var rejected: [RejectedRecord]
        public var token: ChangeToken
        public var moreComing: Bool
        public init(records: [SignedRecord], rejected: [RejectedRecord] = [], token: ChangeToken, moreComing: Bool) {
            self.records = records
            self.rejected = rejected
            self.token = token
            self.moreComing = moreComing
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

/// The binary form's record table, handed to the coder through `userInfo`.
final class RecordTable: @unchecked Sendable {
    static let key = CodingUserInfoKey(rawValue: "convkit.recordTable")!  // a constant, valid key
    private(set) var records: [Data]
    init(_ records: [Data] = []) { self.records = records }

    func add(_ bytes: Data) -> Int {
        records.append(bytes)
        return records.count - 1
    }

    func bytes(at index: Int) -> Data? { records.indices.contains(index) ? records[index] : nil }
}

extension Wire.SignedRecord: Codable {
    private enum Keys: String, CodingKey { case bytes, i, changeTag, receivedAt }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        if let table = decoder.userInfo[RecordTable.key] as? RecordTable {
            let index = try c.decode(Int.self, forKey: .i)
            guard let bytes = table.bytes(at: index) else {
                throw DecodingError.dataCorruptedError(forKey: .i, in: c, debugDescription: "no record \(index) in the body's table")
            }
            self.bytes = bytes
        } else {
            bytes = try c.decode(Data.self, forKey: .bytes)
        }
        changeTag = try c.decodeIfPresent(String.self, forKey: .changeTag)
        receivedAt = try c.decodeIfPresent(Int64.self, forKey: .receivedAt)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        if let table = encoder.userInfo[RecordTable.key] as? RecordTable {
            try c.encode(table.add(bytes), forKey: .i)
        } else {
            try c.encode(bytes, forKey: .bytes)
        }
        try c.encodeIfPresent(changeTag, forKey: .changeTag)
        try c.encodeIfPresent(receivedAt, forKey: .receivedAt)
    }
}
