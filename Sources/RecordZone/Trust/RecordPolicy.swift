import Foundation
import Synchronization

/// Why a record was refused. A refused record is never applied and never returned as valid;
/// it is reported with this reason so tools can show it.
public enum RejectionReason: Error, Hashable, Sendable, CustomStringConvertible {
    case malformed(String)
    case unsigned
    case invalidSignature
    case ownerFieldMissing(field: String)
    /// The author key is not the key pinned for the identity that owns the record.
    case ownerKeyMismatch(identity: String)
    /// The owner named by the record is not among its members (e.g. not a participant).
    case ownerNotMember(identity: String, listField: String)
    /// A segment file that is incomplete or damaged; nothing in it was applied.
    case corruptSegment(String)
    /// Refused by the backend (a server), which gave this reason.
    case refusedByBackend(String)

    public var description: String {
        switch self {
        case .malformed(let why): "malformed record: \(why)"
        case .unsigned: "record is not signed"
        case .invalidSignature: "signature does not verify"
        case .ownerFieldMissing(let field): "owner field '\(field)' is missing"
        case .ownerKeyMismatch(let identity): "signed by a key that is not the one pinned for '\(identity)'"
        case .ownerNotMember(let identity, let list): "owner '\(identity)' is not in '\(list)'"
        case .corruptSegment(let why): "corrupt segment: \(why)"
        case .refusedByBackend(let why): "refused by the backend: \(why)"
        }
    }
}

extension RejectionReason: Codable {
    private enum Keys: String, CodingKey { case kind, detail, identity, field, list }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        let detail = try c.decodeIfPresent(String.self, forKey: .detail) ?? ""
        switch try c.decode(String.self, forKey: .kind) {
        case "malformed": self = .malformed(detail)
        case "unsigned": self = .unsigned
        case "invalidSignature": self = .invalidSignature
        case "ownerFieldMissing": self = .ownerFieldMissing(field: try c.decode(String.self, forKey: .field))
        case "ownerKeyMismatch": self = .ownerKeyMismatch(identity: try c.decode(String.self, forKey: .identity))
        case "ownerNotMember":
            self = .ownerNotMember(identity: try c.decode(String.self, forKey: .identity), listField: try c.decode(String.self, forKey: .list))
        case "corruptSegment": self = .corruptSegment(detail)
        default: self = .refusedByBackend(detail)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        switch self {
        case .malformed(let detail): try c.encode("malformed", forKey: .kind); try c.encode(detail, forKey: .detail)
        case .unsigned: try c.encode("unsigned", forKey: .kind)
        case .invalidSignature: try c.encode("invalidSignature", forKey: .kind)
        case .ownerFieldMissing(let field): try c.encode("ownerFieldMissing", forKey: .kind); try c.encode(field, forKey: .field)
        case .ownerKeyMismatch(let identity): try c.encode("ownerKeyMismatch", forKey: .kind); try c.encode(identity, forKey: .identity)
        case .ownerNotMember(let identity, let list):
            try c.encode("ownerNotMember", forKey: .kind)
            try c.encode(identity, forKey: .identity)
            try c.encode(list, forKey: .list)
        case .corruptSegment(let detail): try c.encode("corruptSegment", forKey: .kind); try c.encode(detail, forKey: .detail)
        case .refusedByBackend(let detail): try c.encode("refusedByBackend", forKey: .kind); try c.encode(detail, forKey: .detail)
        }
    }
}

/// A record (or raw bytes) that a reader refused, with the reason and where it came from.
public struct RejectedRecord: Error, Hashable, Sendable, CustomStringConvertible {
    public var recordID: RecordID?
    public var reason: RejectionReason
    /// Where the bytes came from: a segment file, a request, a save.
    public var source: String

    public init(recordID: RecordID?, reason: RejectionReason, source: String) {
        self.recordID = recordID
        self.reason = reason
        self.source = source
    }

    public var description: String {
        "\(recordID.map { "\($0)" } ?? "?") from \(source): \(reason)"
    }
}

/// Who owns records of one type.
public struct OwnershipRule: Sendable, Hashable {
    public enum Owner: Sendable, Hashable {
        /// The record's name is the owner's identity (a speaker's profile).
        case recordName
        /// A string field names the owner's identity (a message's sender); with `memberOf`, that
        /// identity must also appear in the named list-of-strings field (a conversation's participants).
        case field(String, memberOf: String? = nil)
    }

    public var recordType: String
    public var owner: Owner

    public init(recordType: String, owner: Owner) {
        self.recordType = recordType
        self.owner = owner
    }

    /// The fields a tombstone of this type keeps, so that its owner can still be checked.
    public var tombstoneFields: Set<String> {
        switch owner {
        case .recordName: []
        case .field(let name, let list): list.map { [name, $0] } ?? [name]
        }
    }
}

/// The keys known for one identity: the one in force and those it replaced.
public struct KeyChain: Hashable, Sendable {
    public var current: Data
    /// Earlier keys, each valid for versions up to the clock of the rotation that retired it.
    public var retired: [(key: Data, until: RecordClock)]

    public init(current: Data) {
        self.current = current
        self.retired = []
    }

    func allows(_ key: Data, at clock: RecordClock) -> Bool {
        key == current || retired.contains { $0.key == key && clock <= $0.until }
    }

    public init(current: Data, retired: [(key: Data, until: RecordClock)]) {
        self.current = current
        self.retired = retired
    }

    public static func == (lhs: KeyChain, rhs: KeyChain) -> Bool {
        lhs.current == rhs.current && lhs.retired.map(\.key) == rhs.retired.map(\.key)
            && lhs.retired.map(\.until) == rhs.retired.map(\.until)
    }
    public func hash(into hasher: inout Hasher) { hasher.combine(current) }
}

extension KeyChain: Codable {
    private struct Retired: Codable { var key: Data; var until: RecordClock }
    private enum Keys: String, CodingKey { case current, retired }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        current = try c.decode(Data.self, forKey: .current)
        retired = try c.decode([Retired].self, forKey: .retired).map { ($0.key, $0.until) }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(current, forKey: .current)
        try c.encode(retired.map { Retired(key: $0.key, until: $0.until) }, forKey: .retired)
    }
}

/// The checks every reader applies to every inbound record: a valid Ed25519 signature by the
/// author key, and ownership — the author must be the record's owner, whose key is pinned the
/// first time it is seen. A different key later is refused unless a ``KeyRotation`` record
/// signed by the pinned key moved the pin.
///
/// Types without a rule need only a valid signature.
public final class RecordPolicy: Sendable {
    public let rules: [String: OwnershipRule]
    private let pins: Mutex<[String: KeyChain]>
    private let pinChanges = Atomic<Int>(0)

    public init(rules: [OwnershipRule] = [], pinnedKeys: [String: KeyChain] = [:]) {
        self.rules = Dictionary(rules.map { ($0.recordType, $0) }, uniquingKeysWith: { _, last in last })
        self.pins = Mutex(pinnedKeys)
    }

    /// The keys pinned so far, by identity (to persist them).
    public var pinnedKeys: [String: KeyChain] { pins.withLock { $0 } }

    /// How many times a pin was added or moved: persist ``pinnedKeys`` when it changes.
    public var pinChangeCount: Int { pinChanges.load(ordering: .acquiring) }

    /// Whether `key` speaks for `identity`: it is the key pinned for it (or one still valid),
    /// or nothing is pinned yet and `key` is pinned now (trust on first use).
    public func bind(identity: String, key: Data) -> Bool {
        pins.withLock { pins in
            if let chain = pins[identity] { return key == chain.current }
            pins[identity] = KeyChain(current: key)
            pinChanges.add(1, ordering: .releasing)
            return true
        }
    }

    /// Pins `key` for `identity` if nothing is pinned yet (the local speaker's own key).
    public func pin(_ key: Data, for identity: String) {
        pins.withLock { pins in
            guard pins[identity] == nil else { return }
            pins[identity] = KeyChain(current: key)
            pinChanges.add(1, ordering: .releasing)
        }
    }

    /// The fields a tombstone of this record type keeps.
    public func tombstoneFields(for recordType: String) -> Set<String> {
        recordType == KeyRotation.recordType ? [KeyRotation.identityField] : rules[recordType]?.tombstoneFields ?? []
    }

    /// Signs a tombstone for `record` that keeps the fields its owner check needs.
    public func tombstone(for record: Record, signedWith key: SigningKey, clock: RecordClock) throws(RecordZoneError) -> Record {
        try record.tombstone(keeping: tombstoneFields(for: record.recordType), signedWith: key, clock: clock)
    }

    /// Checks a record; pins its owner's key on first sight. Returns the reason when refused.
    /// - Parameter signedBytes: the record's canonical body when the caller has it already
    ///   (as decoded from the wire); otherwise it is encoded again.
    public func check(_ record: Record, signedBytes: Data? = nil) -> RejectionReason? {
        Self.checkSignature(record, signedBytes: signedBytes) ?? checkOwnership(record)
    }

    /// Decodes and checks encoded bytes.
    public func admit(encoded data: Data, source: String) -> Result<Record, RejectedRecord> {
        admit(batch: [data]) { _ in source }[0]
    }

    /// Checks decoded records: signatures in parallel across cores, then ownership in order.
    /// - Returns: per record, why it is refused, or nil.
    public func check(_ records: [Record]) -> [RejectionReason?] {
        zip(records, Self.parallelMap(records) { Self.checkSignature($0, signedBytes: nil) }).map { record, signatureProblem in
            signatureProblem ?? checkOwnership(record)
        }
    }

    /// Decodes and checks a batch: signatures are verified in parallel across cores, then
    /// ownership is checked in order (pinning depends on order, so it stays sequential).
    public func admit(batch: [Data], source: (Int) -> String) -> [Result<Record, RejectedRecord>] {
        let verified = Self.parallelMap(batch, Self.decodeAndVerify)
        return verified.enumerated().map { index, outcome in
            switch outcome {
            case .failure(let rejection):
                return .failure(RejectedRecord(recordID: rejection.id, reason: rejection.reason, source: source(index)))
            case .success(let record):
                if let reason = checkOwnership(record) {
                    return .failure(RejectedRecord(recordID: record.id, reason: reason, source: source(index)))
                }
                return .success(record)
            }
        }
    }

    struct SignatureFailure: Error {
        var id: RecordID?
        var reason: RejectionReason
    }

    /// Decodes canonical bytes and verifies the signature over exactly the bytes received (the
    /// decoder accepts canonical input only, so the body is the input less the signature).
    static func decodeAndVerify(_ data: Data) -> Result<Record, SignatureFailure> {
        let record: Record
        do {
            record = try Record(canonical: data)
        } catch {
            return .failure(SignatureFailure(id: nil, reason: .malformed(error.description)))
        }
        let body = data.prefix(data.count - 1 - record.signature.count)
        if let reason = checkSignature(record, signedBytes: body) {
            return .failure(SignatureFailure(id: record.id, reason: reason))
        }
        return .success(record)
    }

    static func checkSignature(_ record: Record, signedBytes: Data?) -> RejectionReason? {
        guard record.isSigned, record.authorKey.count == Sodium.publicKeyLength else { return .unsigned }
        if let signedBytes {
            return Sodium.verify(signature: record.signature, message: signedBytes, publicKey: record.authorKey) ? nil : .invalidSignature
        }
        return record.hasValidSignature() ? nil : .invalidSignature
    }

    /// The ownership half of ``check(_:signedBytes:)``, for a record whose signature is verified.
    func checkOwnership(_ record: Record) -> RejectionReason? {
        if record.recordType == KeyRotation.recordType { return applyRotation(record) }
        guard let rule = rules[record.recordType] else { return nil }
        let identity: String
        switch rule.owner {
        case .recordName:
            identity = record.id.name
        case .field(let field, let list):
            guard let owner = record[field]?.stringValue else { return .ownerFieldMissing(field: field) }
            if let list {
                let members = record[list]?.listValue?.compactMap(\.stringValue) ?? []
                guard members.contains(owner) else { return .ownerNotMember(identity: owner, listField: list) }
            }
            identity = owner
        }
        return pins.withLock { pins in
            if let chain = pins[identity] {
                return chain.allows(record.authorKey, at: record.clock) ? nil : .ownerKeyMismatch(identity: identity)
            }
            pins[identity] = KeyChain(current: record.authorKey)
            pinChanges.add(1, ordering: .releasing)
            return nil
        }
    }

    /// Maps in parallel over all cores when the batch is large enough to pay for it.
    static func parallelMap<T: Sendable, R: Sendable>(_ items: [T], _ transform: @Sendable (T) -> R) -> [R] {
        let cores = ProcessInfo.processInfo.activeProcessorCount
        guard items.count >= 32, cores > 1 else { return items.map(transform) }
        let chunks = min(cores * 4, items.count)
        let results = UnsafeMutableBufferPointer<R?>.allocate(capacity: items.count)
        results.initialize(repeating: nil)
        defer { results.deallocate() }
        nonisolated(unsafe) let output = results
        DispatchQueue.concurrentPerform(iterations: chunks) { chunk in
            let lower = items.count * chunk / chunks, upper = items.count * (chunk + 1) / chunks
            for index in lower..<upper { output[index] = transform(items[index]) }
        }
        return results.map { $0! }
    }

    private func applyRotation(_ record: Record) -> RejectionReason? {
        guard let identity = record[KeyRotation.identityField]?.stringValue else {
            return .ownerFieldMissing(field: KeyRotation.identityField)
        }
        if record.isDeleted { return nil }
        guard let newKey = record[KeyRotation.newKeyField]?.bytesValue, newKey.count == Sodium.publicKeyLength else {
            return .ownerFieldMissing(field: KeyRotation.newKeyField)
        }
        return pins.withLock { pins in
            var chain = pins[identity] ?? KeyChain(current: record.authorKey)
            if chain.current == newKey { return nil }
            guard chain.allows(record.authorKey, at: record.clock) else { return .ownerKeyMismatch(identity: identity) }
            if chain.current == record.authorKey {
                chain.retired.append((chain.current, record.clock))
                chain.current = newKey
            }
            pins[identity] = chain
            pinChanges.add(1, ordering: .releasing)
            return nil
        }
    }
}

/// A record that moves an identity's pinned key to a new key. It must be signed by the key
/// pinned for the identity; versions signed by the old key up to the rotation's clock stay valid.
public enum KeyRotation {
    public static let recordType = "KeyRotation"
    public static let identityField = "identity"
    public static let newKeyField = "newKey"

    /// Makes and signs a rotation of `identity` from `oldKey` to `newKey`.
    public static func record(identity: String, zone: ZoneName, from oldKey: SigningKey, to newKey: Data, clock: RecordClock) throws(RecordZoneError) -> Record {
        var record = Record(
            id: try RecordID(zone: zone, name: "rotation-\(identity)-\(clock.rawValue)"), type: recordType,
            fields: [identityField: .string(identity), newKeyField: .bytes(newKey)])
        try record.sign(with: oldKey, clock: clock)
        return record
    }
}
