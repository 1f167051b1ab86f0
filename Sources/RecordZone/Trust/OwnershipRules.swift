/// The fixed half of a ``RecordPolicy``: which ``OwnershipRule`` covers which record ID, so the
/// owner of any record is a function of its ID alone. A value: every reader holding the same
/// rules decides the same owners.
public struct OwnershipRules: Sendable, Hashable {
    /// The rules every policy has, before its own: an identity's key records (``KeyRotation``,
    /// ``DeviceCertificate``, ``DeviceRevocation``), each named with the identity's hash.
    public static let keyRules = [
        OwnershipRule(recordType: KeyRotation.recordType, owner: .hashedName(prefix: KeyRotation.namePrefix, field: KeyRotation.identityField)),
        OwnershipRule(recordType: DeviceCertificate.recordType, owner: .hashedName(prefix: DeviceCertificate.namePrefix, field: DeviceCertificate.identityField)),
        OwnershipRule(recordType: DeviceRevocation.recordType, owner: .hashedName(prefix: DeviceRevocation.namePrefix, field: DeviceRevocation.identityField)),
    ]

    /// The key rules, then the policy's own, in the order they are tried.
    public let all: [OwnershipRule]
    /// Whether a record whose ID no rule covers is refused (a closed schema, like the chat's).
    public let requiresOwner: Bool
    private let ownedTypes: Set<String>
    /// The types some rule lets only an identity key sign (``OwnershipRule/identityKeyOnly``).
    let identityKeyTypes: Set<String>

    public init(_ rules: [OwnershipRule] = [], requiresOwner: Bool = false) {
        all = Self.keyRules + rules
        self.requiresOwner = requiresOwner
        ownedTypes = Set(all.map(\.recordType))
        identityKeyTypes = Set(all.filter(\.identityKeyOnly).map(\.recordType))
    }

    /// Whether only its owner's identity key may sign this record.
    func requiresIdentityKey(_ record: Record) -> Bool {
        identityKeyTypes.contains(record.recordType) && rule(for: record.id)?.identityKeyOnly == true
    }

    /// The rule that covers a record ID, if any.
    public func rule(for id: RecordID) -> OwnershipRule? {
        all.first { $0.matches(id) }
    }

    /// The identity that owns a record, as its ID names it (nil when no rule covers it).
    public func owner(of record: Record) -> Result<String, RejectionReason>? {
        guard let rule = rule(for: record.id) else { return nil }
        guard rule.recordType == record.recordType else { return .failure(.notOwnedByID(recordType: record.recordType)) }
        return rule.owner(of: record)
    }

    /// Why a record no rule covers is refused: an owned type under a free name, or any record
    /// when the rules require an owner; nil when it needs only a signature.
    func refusalOfUnowned(_ record: Record) -> RejectionReason? {
        requiresOwner || ownedTypes.contains(record.recordType) ? .notOwnedByID(recordType: record.recordType) : nil
    }

    /// The fields a tombstone of this record keeps, so that its owner can still be checked.
    public func tombstoneFields(for record: Record) -> Set<String> {
        rule(for: record.id)?.tombstoneFields ?? []
    }
}
