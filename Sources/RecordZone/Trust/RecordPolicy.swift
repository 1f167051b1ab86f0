import Foundation
import Synchronization

/// The checks every reader applies to every inbound record: a valid Ed25519 signature by the
/// author key, and ownership — the record's ID names its owner (``OwnershipRule``), and the
/// author key must speak for that owner: the key pinned for it (the first key seen, trust on
/// first use), or one a ``KeyRotation`` signed by the pinned key moved the pin to.
///
/// The rules are fixed; the pins grow as records are admitted. Whoever stores records persists
/// ``takeChangedChains()`` in the same transaction as the records that made them.
public final class RecordPolicy: Sendable {
    public let rules: [OwnershipRule]
    /// Whether a record whose ID no rule covers is refused (a closed schema, like the chat's).
    public let requiresOwner: Bool
    private let ownedTypes: Set<String>

    private struct Pins {
        var chains: [String: KeyChain]
        var changed = Set<String>()
        /// Unpinned identities seen with unrelated keys: nothing is pinned for them on first use
        /// until ``pinVerified(_:for:)`` settles them.
        var conflicted = Set<String>()
    }
    private let pins: Mutex<Pins>

    /// The rules every policy has, before its own: an identity's key records (``KeyRotation``,
    /// ``DeviceCertificate``, ``DeviceRevocation``), each named with the identity's hash.
    public static let keyRules = [
        OwnershipRule(recordType: KeyRotation.recordType, owner: .hashedName(prefix: KeyRotation.namePrefix, field: KeyRotation.identityField)),
        OwnershipRule(recordType: DeviceCertificate.recordType, owner: .hashedName(prefix: DeviceCertificate.namePrefix, field: DeviceCertificate.identityField)),
        OwnershipRule(recordType: DeviceRevocation.recordType, owner: .hashedName(prefix: DeviceRevocation.namePrefix, field: DeviceRevocation.identityField)),
    ]

    public init(rules: [OwnershipRule] = [], requiresOwner: Bool = false, pinnedKeys: [String: KeyChain] = [:]) {
        self.rules = Self.keyRules + rules
        self.requiresOwner = requiresOwner
        self.ownedTypes = Set(self.rules.map(\.recordType))
        self.pins = Mutex(Pins(chains: pinnedKeys))
    }

    /// The chain pinned for one identity.
    public func chain(for identity: String) -> KeyChain? { pins.withLock { $0.chains[identity] } }

    /// The chains added or changed since the last call. Persist them in the transaction that
    /// stores the records that made them; on failure, hand them back with ``restoreChangedChains(_:)``.
    public func takeChangedChains() -> [String: KeyChain] {
        pins.withLock { pins in
            defer { pins.changed.removeAll() }
            return Dictionary(uniqueKeysWithValues: pins.changed.compactMap { id in pins.chains[id].map { (id, $0) } })
        }
    }

    /// The identities whose chains changed since the last ``takeChangedChains()``.
    public var changedIdentities: Set<String> { pins.withLock { $0.changed } }

    /// Installs chains read back from storage (whole: retired keys stay valid for what they signed).
    public func install(_ chains: [String: KeyChain]) {
        pins.withLock { pins in pins.chains.merge(chains) { _, stored in stored } }
    }

    /// Marks chains as changed again (their transaction did not commit).
    public func restoreChangedChains(_ chains: [String: KeyChain]) {
        pins.withLock { $0.changed.formUnion(chains.keys) }
    }

    /// Whether `key` speaks for `identity` now: the chain's current key or a certified device
    /// not revoked, or nothing is pinned yet and `key` is pinned now (trust on first use).
    public func bind(identity: String, key: Data) -> Bool {
        pins.withLock { pins in
            if let chain = pins.chains[identity] { return chain.allowsNow(key) }
            pins.chains[identity] = KeyChain(current: key)
            pins.changed.insert(identity)
            return true
        }
    }

    /// Identities held in conflict (no pin, claimed with unrelated keys), as read or as restored
    /// from storage.
    public var conflictedIdentities: Set<String> { pins.withLock { $0.conflicted } }

    /// Holds identities in conflict again after a restart.
    public func markConflicted(_ identities: some Sequence<String>) {
        pins.withLock { $0.conflicted.formUnion(identities) }
    }

    /// Pins `key` for `identity` as verified (a ref carried it, or the app compared its
    /// fingerprint). - Returns: false when another key is pinned: a pin never switches silently.
    public func pinVerified(_ key: Data, for identity: String) -> Bool {
        pins.withLock { pins in
            if let chain = pins.chains[identity] {
                guard chain.current == key else { return false }
                if chain.isVerified { return true }
                pins.chains[identity]?.isVerified = true
            } else {
                pins.chains[identity] = KeyChain(current: key, isVerified: true)
            }
            pins.conflicted.remove(identity)
            pins.changed.insert(identity)
            return true
        }
    }

    /// The rule that covers a record ID, if any.
    public func rule(for id: RecordID) -> OwnershipRule? {
        rules.first { $0.matches(id) }
    }

    /// The identity that owns a record, as its ID names it (nil when no rule covers it).
    public func owner(of record: Record) -> Result<String, RejectionReason>? {
        guard let rule = rule(for: record.id) else { return nil }
        guard rule.recordType == record.recordType else { return .failure(.notOwnedByID(recordType: record.recordType)) }
        return rule.owner(of: record)
    }

    /// The fields a tombstone of this record keeps.
    public func tombstoneFields(for record: Record) -> Set<String> {
        rule(for: record.id)?.tombstoneFields ?? []
    }

    /// Signs a tombstone for `record` that keeps the fields its owner check needs.
    public func tombstone(for record: Record, signedWith key: SigningKey, clock: RecordClock) throws(RecordZoneError) -> Record {
        try record.tombstone(keeping: tombstoneFields(for: record), signedWith: key, clock: clock)
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
        let signatures = Self.parallelMap(records) { Self.checkSignature($0, signedBytes: nil) }
        let owners = zip(records, signatures).map { $1 == nil ? owner(of: $0) : nil }
        let conflicted = detectConflicts(records, owners: owners, elsewhere: nil)
        var reasons = signatures
        for index in Self.keyRecordsFirst(records) where signatures[index] == nil {
            reasons[index] = checkOwnership(records[index], owner: owners[index], conflicted: conflicted)
        }
        return reasons
    }

    /// The order in which a batch's ownership is decided: an identity's key records (rotations,
    /// device certificates, revocations) before the records they make valid, whatever order
    /// they were read in.
    static func keyRecordsFirst(_ records: [Record?]) -> [Int] {
        let isKeyRecord = { (record: Record?) in keyRules.contains { $0.recordType == record?.recordType } }
        return records.indices.filter { isKeyRecord(records[$0]) } + records.indices.filter { !isKeyRecord(records[$0]) }
    }

    /// Decodes and checks a batch: signatures are verified in parallel across cores, then
    /// ownership in order. An identity nothing is pinned for yet, claimed in the batch with
    /// unrelated keys, is pinned to none of them: its records come back as
    /// ``RejectionReason/identityConflict(identity:)``, whatever order they were read in.
    public func admit(batch: [Data], source: (Int) -> String) -> [Result<Record, RejectedRecord>] {
        admit(batch: batch, source: source, claimsElsewhere: nil)
    }

    /// ``admit(batch:source:)`` for a reader that can tell what the rest of its store claims (a
    /// folder: every device's segments), asked only when the batch holds an unpinned identity,
    /// so a page boundary cannot split two claims of one identity.
    func admit(batch: [Data], source: (Int) -> String, claimsElsewhere: (() -> KeyClaims)?) -> [Result<Record, RejectedRecord>] {
        let verified = Self.parallelMap(batch, Self.decodeAndVerify)
        let records = verified.map { try? $0.get() }
        let owners = records.map { $0.flatMap(owner(of:)) }
        let conflicted = detectConflicts(records, owners: owners, elsewhere: claimsElsewhere)
        var results = [Result<Record, RejectedRecord>?](repeating: nil, count: batch.count)
        for index in Self.keyRecordsFirst(records) {
            switch verified[index] {
            case .failure(let rejection):
                results[index] = .failure(RejectedRecord(recordID: rejection.id, reason: rejection.reason, source: source(index)))
            case .success(let record):
                if let reason = checkOwnership(record, owner: owners[index], conflicted: conflicted) {
                    results[index] = .failure(RejectedRecord(recordID: record.id, reason: reason, source: source(index), data: batch[index]))
                } else {
                    results[index] = .success(record)
                }
            }
        }
        return results.map { $0! }
    }

    /// The identities with no pin that these records (nil: refused already) — with the claims
    /// `elsewhere` gives, when an unpinned identity is among them — claim with more than one key
    /// not related by a rotation, or that are held in conflict already. Remembers them.
    private func detectConflicts(_ records: [Record?], owners: [Result<String, RejectionReason>?], elsewhere: (() -> KeyClaims)?) -> Set<String> {
        var claims = KeyClaims()
        for (record, owner) in zip(records, owners) {
            guard let record, case .success(let identity)? = owner else { continue }
            claims.add(record, owner: identity)
        }
        let unpinned = pins.withLock { pins in claims.identities.filter { pins.chains[$0] == nil } }
        guard !unpinned.isEmpty else { return [] }
        if let elsewhere { claims.merge(elsewhere()) }
        return pins.withLock { pins in
            let found = unpinned.filter { pins.chains[$0] == nil && (pins.conflicted.contains($0) || claims.isConflicted($0)) }
            pins.conflicted.formUnion(found)
            return Set(found)
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
    /// - Parameter owner: the record's ``owner(of:)``, when the caller has computed it already.
    func checkOwnership(_ record: Record, owner known: Result<String, RejectionReason>?? = nil, conflicted: Set<String> = []) -> RejectionReason? {
        let identity: String
        switch known ?? owner(of: record) {
        case nil:
            return requiresOwner || ownedTypes.contains(record.recordType) ? .notOwnedByID(recordType: record.recordType) : nil
        case .failure(let reason)?: return reason
        case .success(let owner)?: identity = owner
        }
        if conflicted.contains(identity) { return .identityConflict(identity: identity) }
        switch record.recordType {
        case KeyRotation.recordType: return applyRotation(record, identity: identity)
        case DeviceCertificate.recordType: return applyDevice(record, identity: identity)
        case DeviceRevocation.recordType: return applyRevocation(record, identity: identity)
        default: break
        }
        return pins.withLock { pins in
            if let chain = pins.chains[identity] {
                if chain.allows(record.authorKey, at: record.clock) { return nil }
                return chain.device(record.authorKey) != nil ? .deviceRevoked(identity: identity) : .keyConflict(identity: identity)
            }
            pins.chains[identity] = KeyChain(current: record.authorKey)
            pins.changed.insert(identity)
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

    private func applyRotation(_ record: Record, identity: String) -> RejectionReason? {
        if record.isDeleted { return .malformed("a key rotation cannot be deleted") }
        guard let newKey = record[KeyRotation.newKeyField]?.bytesValue, newKey.count == Sodium.publicKeyLength else {
            return .ownerFieldMissing(field: KeyRotation.newKeyField)
        }
        // Without the new key's acceptance anyone could claim to be an identity's earlier key.
        guard KeyRotation.isAccepted(record, identity: identity) else { return .invalidSignature }
        return pins.withLock { pins in
            var chain = pins.chains[identity] ?? KeyChain(current: record.authorKey)
            if chain.current == newKey || chain.retired.contains(where: { $0.key == newKey }) { return nil }
            guard chain.allowsIdentityKey(record.authorKey, at: record.clock) else { return .keyConflict(identity: identity) }
            if chain.current == record.authorKey {
                chain.retired.append(KeyChain.RetiredKey(key: chain.current, until: record.clock))
                chain.current = newKey
            }
            pins.chains[identity] = chain
            pins.changed.insert(identity)
            return nil
        }
    }

    /// Admits a device certificate: its invitation must be signed by a key the identity's chain
    /// allows as the identity (or pinned now, on first use), and its link code must not have
    /// certified another device.
    private func applyDevice(_ record: Record, identity: String) -> RejectionReason? {
        let parts: DeviceCertificate.Parts
        switch DeviceCertificate.verify(record, identity: identity) {
        case .failure(let reason): return reason
        case .success(let verified): parts = verified
        }
        return pins.withLock { pins in
            var chain = pins.chains[identity] ?? KeyChain(current: parts.certifier)
            guard chain.allowsIdentityKey(parts.certifier, at: record.clock) else { return .keyConflict(identity: identity) }
            if chain.devices.contains(where: { $0.enrollment == record.authorKey && $0.key != parts.device }) {
                return .deviceNotCertified("its link code certified another device already")
            }
            if let index = chain.devices.firstIndex(where: { $0.key == parts.device }) {
                guard chain.devices[index].enrollment == nil else { return nil }
                chain.devices[index].enrollment = record.authorKey  // known from its revocation first
            } else {
                chain.devices.append(KeyChain.DeviceKey(key: parts.device, revokedAfter: nil, enrollment: record.authorKey))
            }
            pins.chains[identity] = chain
            pins.changed.insert(identity)
            return nil
        }
    }

    /// Admits a device revocation signed by the identity key: the device may sign only up to
    /// the earliest `revokedAfter` seen, even when its certificate comes later.
    private func applyRevocation(_ record: Record, identity: String) -> RejectionReason? {
        let device: Data, revokedAfter: RecordClock
        switch DeviceRevocation.parts(record) {
        case .failure(let reason): return reason
        case .success(let parts): (device, revokedAfter) = parts
        }
        return pins.withLock { pins in
            var chain = pins.chains[identity] ?? KeyChain(current: record.authorKey)
            guard chain.allowsIdentityKey(record.authorKey, at: record.clock) else {
                return chain.device(record.authorKey) != nil ? .deviceNotCertified("a device cannot revoke devices") : .keyConflict(identity: identity)
            }
            if let index = chain.devices.firstIndex(where: { $0.key == device }) {
                let earliest = min(chain.devices[index].revokedAfter ?? revokedAfter, revokedAfter)
                guard chain.devices[index].revokedAfter != earliest else { return nil }
                chain.devices[index].revokedAfter = earliest
            } else {
                chain.devices.append(KeyChain.DeviceKey(key: device, revokedAfter: revokedAfter, enrollment: nil))
            }
            pins.chains[identity] = chain
            pins.changed.insert(identity)
            return nil
        }
    }

    /// Whether `key` is a device of `identity` that has been revoked (a server refuses anything
    /// such a device saves, whatever clock it claims).
    public func isRevokedDevice(_ key: Data, of identity: String) -> Bool {
        pins.withLock { $0.chains[identity]?.device(key)?.revokedAfter != nil }
    }
}

/// A record that moves an identity's pinned key to a new key. It must be signed by a key the
/// identity's chain allows, and carry the new key's signature accepting the move (so nobody can
/// claim to be an identity's earlier key by "rotating" to the real one); versions signed by the
/// old key up to the rotation's clock stay valid. Its name is `rotation.<h(identity)>.<clock>`,
/// so it is the identity's by its ID.
public enum KeyRotation {
    public static let recordType = "KeyRotation"
    public static let namePrefix = "rotation."
    public static let identityField = "identity"
    public static let newKeyField = "newKey"
    /// The new key's signature over ``acceptance(identity:oldKey:newKey:clock:)``.
    public static let acceptanceField = "acceptance"

    /// Makes and signs a rotation of `identity` from `oldKey` to `newKey`, accepted by `newKey`.
    public static func record(identity: String, zone: ZoneName, from oldKey: SigningKey, to newKey: SigningKey, clock: RecordClock) throws(RecordZoneError) -> Record {
        let name = namePrefix + OwnershipRule.identityHash(identity) + ".\(clock.rawValue)"
        let accepted = newKey.sign(acceptance(identity: identity, oldKey: oldKey.publicKey, newKey: newKey.publicKey, clock: clock))
        var record = Record(id: try RecordID(zone: zone, name: name), type: recordType,
                            fields: [identityField: .string(identity), newKeyField: .bytes(newKey.publicKey), acceptanceField: .bytes(accepted)])
        try record.sign(with: oldKey, clock: clock)
        return record
    }

    /// Whether the rotation's new key signed its acceptance of this move.
    static func isAccepted(_ record: Record, identity: String) -> Bool {
        guard let newKey = record[newKeyField]?.bytesValue, let accepted = record[acceptanceField]?.bytesValue else { return false }
        return Sodium.verify(signature: accepted, message: acceptance(identity: identity, oldKey: record.authorKey, newKey: newKey, clock: record.clock),
                             publicKey: newKey)
    }

    static func acceptance(identity: String, oldKey: Data, newKey: Data, clock: RecordClock) -> Data {
        Data("convkit-rotation-v1\n\(identity)\n\(clock.rawValue)\n".utf8) + oldKey + newKey
    }
}
