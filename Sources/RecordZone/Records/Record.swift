import Foundation

/// One version of a record: its ID, type, typed fields and the signed system fields.
///
/// A record is a value. Build it, set fields, then ``sign(with:)``; the signature covers exactly
/// the record's canonical bytes (``canonicalBytes()``), so the wire or storage form never matters.
///
/// ```swift
/// var note = Record(id: try RecordID(zone: "notes", name: "n1"), type: "Note")
/// note["title"] = .string("Hello")
/// try note.sign(with: keyPair, clock: clock.now())
/// ```
public struct Record: Hashable, Sendable {
    /// The largest canonical encoding of one record, signature included: 1 MiB.
    public static let maximumEncodedSize = 1 << 20
    /// The most records one save, delete or fetch batch may hold.
    public static let maximumBatchSize = 400
    /// The longest record type name.
    public static let maximumTypeLength = 255

    public var id: RecordID { didSet { signedBytes = nil } }
    public var recordType: String { didSet { signedBytes = nil } }
    /// The fields, by name. Use the subscript to read and write single fields.
    public var fields: [String: FieldValue] { didSet { signedBytes = nil } }

    /// The author's Ed25519 public key (32 bytes); empty until signed.
    public var authorKey: Data { didSet { signedBytes = nil } }
    /// The hybrid-logical-clock version; with ``authorKey`` it orders versions (``MergeRule``).
    public var clock: RecordClock { didSet { signedBytes = nil } }
    /// Whether this version is a tombstone: the record was deleted.
    public var isDeleted: Bool { didSet { signedBytes = nil } }
    /// The detached Ed25519 signature (64 bytes) over ``canonicalBytes()``; empty when unsigned.
    public var signature: Data { didSet { signedBytes = nil } }

    /// Metadata the backend keeps about the stored record. Never encoded, never signed.
    public var serverMetadata: ServerMetadata?

    /// The exact canonical encoding this version was decoded from or signed as, kept so that no
    /// layer encodes it again (``encoded()`` returns it) and a signature is checked over the very
    /// bytes received. Any change to the record drops it.
    var signedBytes: Data?

    public init(id: RecordID, type: String, fields: [String: FieldValue] = [:]) {
        self.id = id
        self.recordType = type
        self.fields = fields
        self.authorKey = Data()
        self.clock = RecordClock(rawValue: 0)
        self.isDeleted = false
        self.signature = Data()
    }

    public subscript(field: String) -> FieldValue? {
        get { fields[field] }
        set { fields[field] = newValue }
    }

    public var isSigned: Bool { signature.count == Sodium.signatureLength }

    /// Signs this version: sets the author key and clock, then signs the canonical bytes.
    /// - Throws: ``RecordZoneError`` when the record is not valid to encode (bad type name,
    ///   non-finite double, nested list, over 1 MiB).
    public mutating func sign(with key: SigningKey, clock: RecordClock) throws(RecordZoneError) {
        authorKey = key.publicKey
        self.clock = clock
        signature = Data()
        // The body written, signed and followed by its signature in one buffer.
        var writer = ByteWriter()
        try writeBody(into: &writer)
        guard writer.bytes.count + Sodium.signatureLength + 1 <= Self.maximumEncodedSize else {
            throw RecordZoneError(.limitExceeded, "record \(id) is \(writer.bytes.count) bytes; the limit is \(Self.maximumEncodedSize)", recordID: id)
        }
        let signature = key.sign(writer.bytes)
        writer.u8(UInt8(signature.count))
        writer.append(signature)
        self.signature = signature
        signedBytes = Data(writer.bytes)
    }

    /// Returns a signed tombstone for this record: same ID and type, no fields except those
    /// named in `keeping` (an ownership policy keeps the fields that name the owner).
    public func tombstone(keeping: Set<String> = [], signedWith key: SigningKey, clock: RecordClock) throws(RecordZoneError) -> Record {
        var stone = Record(id: id, type: recordType, fields: fields.filter { keeping.contains($0.key) })
        stone.isDeleted = true
        try stone.sign(with: key, clock: clock)
        return stone
    }

    /// Whether the signature is a valid Ed25519 signature by ``authorKey`` over the canonical bytes.
    public func hasValidSignature() -> Bool {
        guard isSigned, authorKey.count == Sodium.publicKeyLength else { return false }
        let body: Data
        if let signedBytes {
            body = signedBytes.prefix(signedBytes.count - 1 - signature.count)
        } else {
            guard let encoded = try? canonicalBytes() else { return false }
            body = encoded
        }
        return Sodium.verify(signature: signature, message: body, publicKey: authorKey)
    }

    public static func == (lhs: Record, rhs: Record) -> Bool {
        lhs.id == rhs.id && lhs.recordType == rhs.recordType && lhs.authorKey == rhs.authorKey
            && lhs.clock == rhs.clock && lhs.isDeleted == rhs.isDeleted && lhs.signature == rhs.signature
            && lhs.fields.count == rhs.fields.count
            && lhs.fields.allSatisfy { key, value in rhs.fields[key].map { value.isCanonicallyEqual(to: $0) } ?? false }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(id)
        hasher.combine(clock)
        hasher.combine(signature)
    }
}

/// What a backend knows about a stored record, kept apart from the signed record.
public struct ServerMetadata: Hashable, Sendable, Codable {
    /// The change tag: changes whenever the stored version changes (CloudKit's `recordChangeTag`).
    public var changeTag: String
    /// When the backend received this version, if it knows.
    public var receivedAt: Date?

    public init(changeTag: String, receivedAt: Date? = nil) {
        self.changeTag = changeTag
        self.receivedAt = receivedAt
    }
}
