import Foundation
import Synchronization

/// The checks every reader applies to every inbound record: a valid Ed25519 signature by the
/// author key, and ownership — the record's ID names its owner (``OwnershipRules``), and the
/// author key must speak for that owner in its chain (``KeyPins``): the identity key pinned for
/// it (the first key seen, trust on first use, or a verified one), a key a ``KeyRotation``
/// moved the pin to, or a device it certified (``DeviceCertificate``) and did not revoke.
///
/// The rules are a fixed value; the pins grow as records are admitted. A writer decides into a
/// value (``decideOwnership(_:)``: the reasons and the ``PinChanges``), stores those chains in
/// the transaction that stores the records (``PinTable``), and publishes them after the commit.
/// A reader's admissions (``admit(batch:source:signedHere:)``, ``check(_:)``) publish at
/// once and leave the chains for ``KeyPins/takeChangedChains()``.
public final class RecordPolicy: Sendable {
    public let rules: OwnershipRules
    public let pins: KeyPins
    /// Serializes readers' admissions: each decides and publishes as one step.
    private let admission = Mutex(())

    public init(rules: OwnershipRules, pins: KeyPins = KeyPins()) {
        self.rules = rules
        self.pins = pins
    }

    public convenience init(rules: [OwnershipRule] = [], requiresOwner: Bool = false, pinnedKeys: [String: KeyChain] = [:]) {
        self.init(rules: OwnershipRules(rules, requiresOwner: requiresOwner), pins: KeyPins(pinnedKeys))
    }

    /// Signs a tombstone for `record` that keeps the fields its owner check needs.
    public func tombstone(for record: Record, signedWith key: SigningKey, clock: RecordClock) throws(RecordZoneError) -> Record {
        try record.tombstone(keeping: rules.tombstoneFields(for: record), signedWith: key, clock: clock)
    }

    /// Checks one record; pins its owner's key on first sight. Returns the reason when refused.
    public func check(_ record: Record) -> RejectionReason? {
        check([record])[0]
    }

    /// Whether the pins as they stand still allow a version that was admitted earlier: its
    /// author may sign for its owner at its clock. False once a revocation or a rotation admitted
    /// since has made it invalid (a device's version after `revokedAfter`, a retired key's after
    /// its rotation). A version with no owner, or whose owner has no chain, is allowed.
    public func stillAllows(_ record: Record) -> Bool {
        guard case .success(let owner)? = rules.owner(of: record), let chain = pins.chain(for: owner) else { return true }
        return chain.allows(record.authorKey, at: record.clock)
    }

    /// Decodes and checks encoded bytes.
    public func admit(encoded data: Data, source: String) -> Result<Record, RejectedRecord> {
        admit(batch: [data]) { _ in source }[0]
    }

    /// Checks decoded records as a reader: signatures over each record's own bytes in parallel
    /// across cores, then ownership as ``admit(batch:source:signedHere:)`` decides it; the pins
    /// change at once. - Returns: per record, why it is refused, or nil.
    public func check(_ records: [Record]) -> [RejectionReason?] {
        let signatures = verifySignatures(records)
        return admission.withLock { _ in
            let (reasons, changes) = decideOwnership(zip(records, signatures).map { $1 == nil ? $0 : nil })
            pins.publish(changes, markChanged: true)
            return zip(signatures, reasons).map { $0 ?? $1 }
        }
    }

    /// The signature half of a check, in parallel across cores: per record, why its signature
    /// fails, or nil.
    public func verifySignatures(_ records: [Record]) -> [RejectionReason?] {
        Self.parallelMap(records, Self.checkSignature)
    }

    /// The ownership half, for records whose signatures are verified (nil: refused already,
    /// skipped), decided against the pins as they stand, into a value: nothing shared changes.
    /// - Returns: per record why it is refused, or nil; and the chains the records that pass
    ///   would change, to store with them and publish after the commit.
    public func decideOwnership(_ records: [Record?]) -> (reasons: [RejectionReason?], pins: PinChanges) {
        var draft = PinDraft(pins)
        let verified = records.map { $0.map { Result<Record, SignatureFailure>.success($0) } ?? .failure(SignatureFailure(id: nil, reason: .unsigned)) }
        let outcomes = decide(verified, elsewhere: nil, draft: &draft)
        let reasons = zip(records, outcomes).map { record, outcome -> RejectionReason? in
            guard record != nil, case .failure(let failure) = outcome else { return nil }
            return failure.reason
        }
        return (reasons, draft.changes)
    }

    /// Decodes and checks a batch: signatures are verified in parallel across cores, then
    /// ownership in order. An identity nothing is pinned for yet, claimed in the batch with
    /// unrelated keys, is pinned to none of them: its records come back as
    /// ``RejectionReason/identityConflict(identity:)``, whatever order they were read in.
    /// - Parameter signedHere: whether the bytes at an index are exactly what this reader signed
    ///   itself (its own versions coming back): their signature needs no second check; their
    ///   ownership is decided like any other's.
    public func admit(batch: [Data], source: (Int) -> String, signedHere: (Int) -> Bool = { _ in false }) -> [Result<Record, RejectedRecord>] {
        admit(batch: batch, source: source, claimsElsewhere: nil, signedHere: signedHere)
    }

    /// ``admit(batch:source:signedHere:)`` for a reader that can tell what the rest of its store
    /// claims (a folder: every device's segments), asked only when the batch holds an unpinned
    /// identity, so a page boundary cannot split two claims of one identity.
    func admit(batch: [Data], source: (Int) -> String, claimsElsewhere: (() -> KeyClaims)?,
               signedHere: (Int) -> Bool = { _ in false }) -> [Result<Record, RejectedRecord>] {
        let trusted = batch.indices.map(signedHere)
        let verified = Self.parallelMap(Array(zip(batch, trusted))) { bytes, isOwn in
            isOwn ? Self.decode(bytes) : Self.decodeAndVerify(bytes)
        }
        let decided = admission.withLock { _ in
            var draft = PinDraft(pins)
            let decided = decide(verified, elsewhere: claimsElsewhere, draft: &draft)
            pins.publish(draft.changes, markChanged: true)
            return decided
        }
        return zip(batch.indices, decided).map { index, outcome in
            outcome.mapError { failure in
                // A refused record keeps its bytes: one refused for its keys travels on (another
                // reader, with other pins, may decide otherwise), and a quarantine shows it.
                RejectedRecord(recordID: failure.id, reason: failure.reason, source: source(index), data: failure.id == nil ? nil : batch[index])
            }
        }
    }

    /// The one ownership path every admission takes, for records whose signatures are decided:
    /// conflicts over the batch (and what `elsewhere` claims), then each record's owner and key,
    /// an identity's key records first.
    private func decide(_ verified: [Result<Record, SignatureFailure>], elsewhere: (() -> KeyClaims)?, draft: inout PinDraft) -> [Result<Record, SignatureFailure>] {
        let records = verified.map { try? $0.get() }
        let owners = records.map { $0.flatMap(rules.owner(of:)) }
        let conflicted = detectConflicts(records, owners: owners, elsewhere: elsewhere, draft: &draft)
        var results = verified
        for index in Self.keyRecordsFirst(records) {
            guard case .success(let record) = verified[index],
                let reason = checkOwnership(record, owner: owners[index], conflicted: conflicted, draft: &draft)
            else { continue }
            results[index] = .failure(SignatureFailure(id: record.id, reason: reason))
        }
        return results
    }

    /// The order in which a batch's ownership is decided: an identity's key records (rotations,
    /// device certificates, revocations) before the records they make valid, whatever order
    /// they were read in.
    static func keyRecordsFirst(_ records: [Record?]) -> [Int] {
        let isKeyRecord = { (record: Record?) in OwnershipRules.keyRules.contains { $0.recordType == record?.recordType } }
        return records.indices.filter { isKeyRecord(records[$0]) } + records.indices.filter { !isKeyRecord(records[$0]) }
    }

    /// The identities with no pin that these records (nil: refused already) — with the claims
    /// `elsewhere` gives, when an unpinned identity is among them — claim with more than one key
    /// not related by a rotation, or that are held in conflict already. Remembers them.
    private func detectConflicts(_ records: [Record?], owners: [Result<String, RejectionReason>?], elsewhere: (() -> KeyClaims)?,
                                 draft: inout PinDraft) -> Set<String> {
        var claims = KeyClaims()
        for (record, owner) in zip(records, owners) {
            guard let record, case .success(let identity)? = owner else { continue }
            claims.add(record, owner: identity)
        }
        let unpinned = claims.identities.filter { draft.chain($0) == nil }
        guard !unpinned.isEmpty else { return [] }
        if let elsewhere { claims.merge(elsewhere()) }
        let found = Set(unpinned.filter { draft.isConflicted($0) || claims.isConflicted($0) })
        draft.changes.conflicted.formUnion(found)
        return found
    }

    struct SignatureFailure: Error {
        var id: RecordID?
        var reason: RejectionReason
    }

    /// Decodes canonical bytes, for bytes whose signature is known good.
    static func decode(_ data: Data) -> Result<Record, SignatureFailure> {
        do {
            return .success(try Record(canonical: data))
        } catch {
            return .failure(SignatureFailure(id: nil, reason: .malformed(error.description)))
        }
    }

    /// Decodes canonical bytes and verifies the signature over exactly the bytes received (a
    /// decoded record keeps them).
    static func decodeAndVerify(_ data: Data) -> Result<Record, SignatureFailure> {
        decode(data).flatMap { record in
            checkSignature(record).map { .failure(SignatureFailure(id: record.id, reason: $0)) } ?? .success(record)
        }
    }

    /// Whether the record is signed, and the signature verifies over its own canonical bytes
    /// (the very bytes it was decoded from, when it was).
    static func checkSignature(_ record: Record) -> RejectionReason? {
        guard record.isSigned, record.authorKey.count == Sodium.publicKeyLength else { return .unsigned }
        return record.hasValidSignature() ? nil : .invalidSignature
    }

    /// The ownership half of an admission, for a record whose signature is verified.
    /// - Parameter owner: the record's ``owner(of:)``, when the caller has computed it already.
    func checkOwnership(_ record: Record, owner known: Result<String, RejectionReason>??, conflicted: Set<String>, draft: inout PinDraft) -> RejectionReason? {
        let identity: String
        switch known ?? rules.owner(of: record) {
        case nil:
            return rules.refusalOfUnowned(record)
        case .failure(let reason)?: return reason
        case .success(let owner)?: identity = owner
        }
        if conflicted.contains(identity) { return .identityConflict(identity: identity) }
        switch record.recordType {
        case KeyRotation.recordType: return applyRotation(record, identity: identity, draft: &draft)
        case DeviceCertificate.recordType: return applyDevice(record, identity: identity, draft: &draft)
        case DeviceRevocation.recordType: return applyRevocation(record, identity: identity, draft: &draft)
        default: break
        }
        if rules.requiresIdentityKey(record), let chain = draft.chain(identity), !chain.allowsIdentityKey(record.authorKey, at: record.clock) {
            return chain.device(record.authorKey) != nil ? .deviceNotCertified("only the identity key signs a \(record.recordType)") : .keyConflict(identity: identity)
        }
        if let chain = draft.chain(identity) {
            if chain.allows(record.authorKey, at: record.clock) { return nil }
            return chain.device(record.authorKey) != nil ? .deviceRevoked(identity: identity) : .keyConflict(identity: identity)
        }
        draft.set(KeyChain(current: record.authorKey), for: identity)
        return nil
    }

    /// The identity keys that claim `identity` in these records (verified ones): each key no
    /// rotation or device certificate among them leads to — what a person compares fingerprints
    /// of when an identity is held back for a conflict (a linked device's key, certified by one
    /// of them, is not a candidate of its own).
    public func claimedIdentityKeys(of identity: String, in records: [Record]) -> Set<Data> {
        var claims = KeyClaims()
        for record in records where Self.checkSignature(record) == nil {
            if case .success(let owner)? = rules.owner(of: record), owner == identity { claims.add(record, owner: identity) }
        }
        return claims.rootKeys(of: identity)
    }

    /// The cores verification spreads over, read once: Foundation reads the cgroup's CPU quota
    /// from `/sys` at every `activeProcessorCount` (about 20 µs here, a third of a verification).
    static let cores = ProcessInfo.processInfo.activeProcessorCount

    /// Maps in parallel over all cores when the batch is large enough to pay for it.
    static func parallelMap<T: Sendable, R: Sendable>(_ items: [T], _ transform: @Sendable (T) -> R) -> [R] {
        guard items.count >= 32, cores > 1 else { return items.map(transform) }
        let chunks = min(cores * 4, items.count)
        let results = UnsafeMutableBufferPointer<R?>.allocate(capacity: items.count)
        results.initialize(repeating: nil)
        defer {
            // Release what the elements hold (records, bytes) before freeing the buffer: a
            // buffer freed without this leaked every record a batch admitted.
            _ = results.deinitialize()
            results.deallocate()
        }
        nonisolated(unsafe) let output = results
        DispatchQueue.concurrentPerform(iterations: chunks) { chunk in
            let lower = items.count * chunk / chunks, upper = items.count * (chunk + 1) / chunks
            for index in lower..<upper { output[index] = transform(items[index]) }
        }
        return results.map { $0! }
    }

    private func applyRotation(_ record: Record, identity: String, draft: inout PinDraft) -> RejectionReason? {
        if record.isDeleted { return .malformed("a key rotation cannot be deleted") }
        guard let newKey = record[KeyRotation.newKeyField]?.bytesValue, newKey.count == Sodium.publicKeyLength else {
            return .ownerFieldMissing(field: KeyRotation.newKeyField)
        }
        // Without the new key's acceptance anyone could claim to be an identity's earlier key.
        guard KeyRotation.isAccepted(record, identity: identity) else { return .invalidSignature }
        var chain = draft.chain(identity) ?? KeyChain(current: record.authorKey)
        if chain.current == newKey || chain.retired.contains(where: { $0.key == newKey }) { return nil }
        guard chain.allowsIdentityKey(record.authorKey, at: record.clock) else { return .keyConflict(identity: identity) }
        if chain.current == record.authorKey {
            chain.retired.append(KeyChain.RetiredKey(key: chain.current, until: record.clock))
            chain.current = newKey
        }
        draft.set(chain, for: identity)
        return nil
    }

    /// Admits a device certificate: its invitation must be signed by a key the identity's chain
    /// allows as the identity (or pinned now, on first use), and its link code must not have
    /// certified another device.
    private func applyDevice(_ record: Record, identity: String, draft: inout PinDraft) -> RejectionReason? {
        let parts: DeviceCertificate.Parts
        switch DeviceCertificate.verify(record, identity: identity) {
        case .failure(let reason): return reason
        case .success(let verified): parts = verified
        }
        var chain = draft.chain(identity) ?? KeyChain(current: parts.certifier)
        if !chain.allowsIdentityKey(parts.certifier, at: record.clock) {
            // A pin taken on first use from a device's records (read before the identity's own
            // zone) is that device: the certificate, which both keys signed, puts the identity
            // key at the root — as the records read in order would have pinned it.
            guard chain.isFirstUseOf(parts.device) else { return .keyConflict(identity: identity) }
            chain = KeyChain(current: parts.certifier)
        }
        if chain.devices.contains(where: { $0.enrollment == record.authorKey && $0.key != parts.device }) {
            return .deviceNotCertified("its link code certified another device already")
        }
        if let index = chain.devices.firstIndex(where: { $0.key == parts.device }) {
            guard chain.devices[index].enrollment == nil else { return nil }
            chain.devices[index].enrollment = record.authorKey  // known from its revocation first
        } else {
            chain.devices.append(KeyChain.DeviceKey(key: parts.device, revokedAfter: nil, enrollment: record.authorKey))
        }
        draft.set(chain, for: identity)
        return nil
    }

    /// Admits a device revocation signed by the identity key: the device may sign only up to
    /// the earliest `revokedAfter` seen, even when its certificate comes later.
    private func applyRevocation(_ record: Record, identity: String, draft: inout PinDraft) -> RejectionReason? {
        let device: Data, revokedAfter: RecordClock
        switch DeviceRevocation.parts(record) {
        case .failure(let reason): return reason
        case .success(let parts): (device, revokedAfter) = parts
        }
        var chain = draft.chain(identity) ?? KeyChain(current: record.authorKey)
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
        draft.set(chain, for: identity)
        return nil
    }
}
