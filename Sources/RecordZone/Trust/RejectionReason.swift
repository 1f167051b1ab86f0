import Foundation

/// Why a record was refused. A refused record is never applied and never returned as valid;
/// it is reported with this reason so tools can show it.
public enum RejectionReason: Error, Hashable, Sendable, CustomStringConvertible {
    case malformed(String)
    case unsigned
    case invalidSignature
    /// The ID names no owner for a record of this type (an owned type under a free name, or a
    /// free record where the policy requires an owner).
    case notOwnedByID(recordType: String)
    /// The field that must name the ID's owner is missing.
    case ownerFieldMissing(field: String)
    /// The field names someone other than the owner the ID names.
    case ownerFieldMismatch(field: String)
    /// The author key is not one that speaks for the identity that owns the record: the reader
    /// has another key pinned for it.
    case keyConflict(identity: String)
    /// The reader has no key pinned for the identity, and the records it read claim it with
    /// unrelated keys: held back until a ref or the app settles which key is the identity's.
    case identityConflict(identity: String)
    /// A device certificate that does not hold (an invitation not signed by the identity, an
    /// expired or reused link code), or a revocation not signed by the identity key.
    case deviceNotCertified(String)
    /// Signed by a device of the identity after its revocation's clock.
    case deviceRevoked(identity: String)
    /// A segment file that is incomplete or damaged; nothing in it was applied.
    case corruptSegment(String)
    /// Refused by the backend (a server), which gave this reason.
    case refusedByBackend(String)
    /// Signed and owned as it should be, but against its schema's rules (a chat record with
    /// fields that do not match its zone, say): the schema's own words.
    case schemaViolation(String)
    /// A group's record (a message) by someone who was not in the group at the record's clock:
    /// held back, and shown if a change that makes them one at that clock comes.
    case notAMember(identity: String)

    /// The reasons, as codes (stored and sent).
    public enum Code: String, Sendable, Hashable, Codable, CaseIterable {
        case malformed, unsigned, invalidSignature, notOwnedByID, ownerFieldMissing, ownerFieldMismatch, keyConflict, identityConflict,
            deviceNotCertified, deviceRevoked, corruptSegment, refusedByBackend, schemaViolation, notAMember
    }

    public var description: String {
        switch self {
        case .malformed(let why): "malformed record: \(why)"
        case .unsigned: "record is not signed"
        case .invalidSignature: "signature does not verify"
        case .notOwnedByID(let type): "the record ID names no owner for a '\(type)' record"
        case .ownerFieldMissing(let field): "owner field '\(field)' is missing"
        case .ownerFieldMismatch(let field): "field '\(field)' names someone other than the owner the record ID names"
        case .keyConflict(let identity): "signed by a key that does not speak for '\(identity)'"
        case .identityConflict(let identity): "'\(identity)' is claimed with unrelated keys; held back until one is trusted"
        case .deviceNotCertified(let why): "device not certified: \(why)"
        case .deviceRevoked(let identity): "signed by a device of '\(identity)' after it was revoked"
        case .corruptSegment(let why): "corrupt segment: \(why)"
        case .refusedByBackend(let why): "refused by the backend: \(why)"
        case .schemaViolation(let why): why
        case .notAMember(let identity): "'\(identity)' was not a member of the group at the record's clock"
        }
    }

    /// Whether the refusal is about which key speaks for an identity (another reader, with other
    /// pins, may decide otherwise), not about the record itself.
    public var isAboutKeys: Bool {
        switch self {
        case .keyConflict, .identityConflict, .deviceRevoked: true
        default: false
        }
    }

    /// The reason's code.
    public var code: Code {
        switch self {
        case .malformed: .malformed
        case .unsigned: .unsigned
        case .invalidSignature: .invalidSignature
        case .notOwnedByID: .notOwnedByID
        case .ownerFieldMissing: .ownerFieldMissing
        case .ownerFieldMismatch: .ownerFieldMismatch
        case .keyConflict: .keyConflict
        case .identityConflict: .identityConflict
        case .deviceNotCertified: .deviceNotCertified
        case .deviceRevoked: .deviceRevoked
        case .corruptSegment: .corruptSegment
        case .refusedByBackend: .refusedByBackend
        case .schemaViolation: .schemaViolation
        case .notAMember: .notAMember
        }
    }

    /// The identity a refusal is about, when it is about which key speaks for one.
    public var identity: String? {
        switch self {
        case .keyConflict(let who), .identityConflict(let who), .deviceRevoked(let who): who
        default: nil
        }
    }
}

extension RejectionReason: Codable {
    private enum Keys: String, CodingKey { case kind, detail }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        let detail = try c.decodeIfPresent(String.self, forKey: .detail) ?? ""
        switch try c.decode(String.self, forKey: .kind) {
        case "malformed": self = .malformed(detail)
        case "unsigned": self = .unsigned
        case "invalidSignature": self = .invalidSignature
        case "notOwnedByID": self = .notOwnedByID(recordType: detail)
        case "ownerFieldMissing": self = .ownerFieldMissing(field: detail)
        case "ownerFieldMismatch": self = .ownerFieldMismatch(field: detail)
        case "keyConflict": self = .keyConflict(identity: detail)
        case "identityConflict": self = .identityConflict(identity: detail)
        case "deviceNotCertified": self = .deviceNotCertified(detail)
        case "deviceRevoked": self = .deviceRevoked(identity: detail)
        case "corruptSegment": self = .corruptSegment(detail)
        case "schemaViolation": self = .schemaViolation(detail)
        case "notAMember": self = .notAMember(identity: detail)
        default: self = .refusedByBackend(detail)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(code.rawValue, forKey: .kind)
        switch self {
        case .unsigned, .invalidSignature: break
        case .malformed(let detail), .corruptSegment(let detail), .refusedByBackend(let detail),
            .notOwnedByID(let detail), .ownerFieldMissing(let detail), .ownerFieldMismatch(let detail), .keyConflict(let detail),
            .identityConflict(let detail), .deviceNotCertified(let detail), .deviceRevoked(let detail), .schemaViolation(let detail),
            .notAMember(let detail):
            try c.encode(detail, forKey: .detail)
        }
    }
}

/// A record (or raw bytes) that a reader refused, with the reason and where it came from.
public struct RejectedRecord: Error, Hashable, Sendable, CustomStringConvertible {
    public var recordID: RecordID?
    public var reason: RejectionReason
    /// Where the bytes came from: a segment file, a request, a save.
    public var source: String
    /// The record's canonical bytes, when the reader has them: a record held back for an
    /// identity conflict is admitted again from them once the conflict is settled.
    public var data: Data?

    public init(recordID: RecordID?, reason: RejectionReason, source: String, data: Data? = nil) {
        self.recordID = recordID
        self.reason = reason
        self.source = source
        self.data = data
    }

    public var description: String {
        "\(recordID.map { "\($0)" } ?? "?") from \(source): \(reason)"
    }
}
