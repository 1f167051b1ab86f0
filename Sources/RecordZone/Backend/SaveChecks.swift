import Foundation

/// The checks a backend makes before it stores a version, shared so every backend refuses the
/// same records with the same codes.
package enum SaveChecks {
    /// Refuses versions that are too large, unsigned, forged or not their author's to write, and
    /// anything signed by a device the backend knows is revoked, whatever clock it claims (a
    /// stolen device cannot backdate its way in; readers accept what it signed before).
    /// Signatures are verified in parallel (``verify(_:policy:)``); ownership in order, as readers
    /// would, into a value (``decideOwnership(_:verified:policy:)``): nothing shared changes.
    /// - Returns: per record, its canonical encoding ready to store, or why it was refused; and
    ///   the chains the admitted records would change. A backend that then refuses some of them
    ///   (a missing zone, a changed server record) decides again over what it stores
    ///   (``settle(_:storing:admission:policy:)``) and stores exactly those chains with them.
    package static func admit(_ records: [Record], policy: RecordPolicy) -> (outcomes: [Result<Data, RecordZoneError>], pins: PinChanges) {
        decideOwnership(records, verified: verify(records, policy: policy), policy: policy)
    }

    /// The checks that need no pins changed: size, a revoked device, the signature.
    package static func verify(_ records: [Record], policy: RecordPolicy) -> [Result<Data, RecordZoneError>] {
        // Too large to store, or signed by a device the backend knows is revoked: refused before
        // ownership is decided (a revoked device's chain entry would still allow early clocks).
        var outcomes: [Result<Data, RecordZoneError>] = records.map { record in
            // limitExceeded past 1 MiB
            Result { () throws(RecordZoneError) in try record.encoded() }.flatMap { encoded in
                if case .success(let owner)? = policy.rules.owner(of: record), policy.pins.isRevokedDevice(record.authorKey, of: owner) {
                    return .failure(Self.error(for: .deviceRevoked(identity: owner), recordID: record.id))
                }
                return .success(encoded)
            }
        }
        let candidates = outcomes.indices.filter { if case .success = outcomes[$0] { true } else { false } }
        for (index, reason) in zip(candidates, policy.verifySignatures(candidates.map { records[$0] })) {
            if let reason { outcomes[index] = .failure(Self.error(for: reason, recordID: records[index].id)) }
        }
        return outcomes
    }

    /// Ownership of the versions `verified` passed, against the pins as they stand now.
    package static func decideOwnership(_ records: [Record], verified: [Result<Data, RecordZoneError>],
                                        policy: RecordPolicy) -> (outcomes: [Result<Data, RecordZoneError>], pins: PinChanges) {
        var outcomes = verified
        let (reasons, pins) = policy.decideOwnership(zip(records, verified).map { record, outcome in
            if case .success = outcome { record } else { nil }
        })
        for (index, reason) in reasons.enumerated() {
            if let reason { outcomes[index] = .failure(Self.error(for: reason, recordID: records[index].id)) }
        }
        return (outcomes, pins)
    }

    /// The chains a save stores with the versions it keeps (`storing`, indices into `records`),
    /// decided again over exactly those: a version refused after admission leaves no pin. A kept
    /// version that only another, refused, version made valid (its device certificate) is
    /// refused now. When the backend keeps every admitted version (the common case), the
    /// admission's own chains are the answer and nothing is decided twice.
    /// - Returns: why such versions are refused, by index, and the chains to store.
    package static func settle(_ records: [Record], storing: [Int], admission: (outcomes: [Result<Data, RecordZoneError>], pins: PinChanges),
                               policy: RecordPolicy) -> (refused: [Int: RecordZoneError], pins: PinChanges) {
        let admitted = admission.outcomes.indices.filter { if case .success = admission.outcomes[$0] { true } else { false } }
        if storing.sorted() == admitted { return ([:], admission.pins) }
        let kept = Set(storing)
        let (reasons, pins) = policy.decideOwnership(records.indices.map { kept.contains($0) ? records[$0] : nil })
        var refused = [Int: RecordZoneError]()
        for index in storing { if let reason = reasons[index] { refused[index] = Self.error(for: reason, recordID: records[index].id) } }
        return (refused, pins)
    }

    package static func error(for reason: RejectionReason, recordID: RecordID?) -> RecordZoneError {
        let code: RecordZoneError.Code
        switch reason {
        case .unsigned, .invalidSignature: code = .invalidSignature
        case .notOwnedByID, .ownerFieldMissing, .ownerFieldMismatch, .keyConflict, .identityConflict, .deviceNotCertified, .deviceRevoked, .notAMember: code = .notAuthorized
        case .malformed, .corruptSegment, .refusedByBackend: code = .malformed
        case .schemaViolation: code = .invalidArguments
        }
        return RecordZoneError(code, reason.description, recordID: recordID)
    }

    /// What a backend does with one version of a save.
    package enum Decision {
        /// Refused: the save check or the save policy failed.
        case refused(RecordZoneError)
        /// The version held wins the merge: it stays, and is the answer.
        case superseded(by: Record)
        /// Store these canonical bytes.
        case store(Data)
    }

    /// Decides one version's fate from its admission (``admit(_:policy:)``), the version held
    /// now, and the save policy: the one rule every backend applies. The held version is decided
    /// again by the pins as they stand (``RecordPolicy/stillAllows(_:)``): one a revocation or a
    /// rotation admitted since has made invalid wins no merge — readers refuse it, so a valid
    /// version its owner saves (an older one stated again) replaces it, whatever the clocks.
    package static func decide(_ record: Record, admitted: Result<Data, RecordZoneError>, current: Record?, policy: SavePolicy,
                               pins: RecordPolicy) -> Decision {
        switch admitted {
        case .failure(let error): return .refused(error)
        case .success(let encoded):
            if let error = checkUnchanged(record, current: current, policy: policy) { return .refused(error) }
            // The held version's pins are looked up only when it would win (an edit usually does not).
            if let current, !MergeRule.wins(record, over: current), pins.stillAllows(current) { return .superseded(by: current) }
            return .store(encoded)
        }
    }

    /// A batch decided whole: per version what to do, and exactly the chains the versions to
    /// store change (store them in the same transaction; publish them after it commits).
    package struct Plan {
        package var decisions: [Decision]
        package var pins: PinChanges
    }

    /// Decides a save the one way every backend does: admission (``admit(_:policy:)``, or
    /// `verified` when the signatures were checked before the caller's transaction), the save
    /// policy against the version held (`held`: the stored winner, or why the record cannot be
    /// stored there, e.g. its zone is missing; a version earlier in the batch counts as held),
    /// then ``settle(_:storing:admission:policy:)`` over what is left to store.
    /// - Parameter gate: refuses more of the admitted versions (a server's access rule that
    ///   the zone's own records decide), given the admission's outcomes.
    package static func plan<E: Error>(_ records: [Record], verified: [Result<Data, RecordZoneError>]? = nil, savePolicy: SavePolicy, policy: RecordPolicy,
                                       gate: (([Result<Data, RecordZoneError>]) throws(E) -> [Result<Data, RecordZoneError>])? = nil,
                                       held: (Record) throws(E) -> Result<Record?, RecordZoneError>) throws(E) -> Plan {
        let admission = decideOwnership(records, verified: verified ?? verify(records, policy: policy), policy: policy)
        let admitted = try gate.map { gate throws(E) in try gate(admission.outcomes) } ?? admission.outcomes
        var decisions = [Decision](), pending = [RecordID: Record]()
        for (record, outcome) in zip(records, admitted) {
            switch try held(record) {
            case .failure(let error):
                decisions.append(.refused(error))
            case .success(let stored):
                let decision = decide(record, admitted: outcome, current: pending[record.id] ?? stored, policy: savePolicy, pins: policy)
                if case .store = decision { pending[record.id] = record }
                decisions.append(decision)
            }
        }
        let storing = decisions.indices.filter { if case .store = decisions[$0] { true } else { false } }
        let (refused, pins) = settle(records, storing: storing, admission: admission, policy: policy)
        for (index, error) in refused { decisions[index] = .refused(error) }
        return Plan(decisions: decisions, pins: pins)
    }

    /// Applies ``SavePolicy/ifServerRecordUnchanged``: the record's change tag must match the stored one.
    static func checkUnchanged(_ record: Record, current: Record?, policy: SavePolicy) -> RecordZoneError? {
        guard policy == .ifServerRecordUnchanged else { return nil }
        if current?.serverMetadata?.changeTag == record.serverMetadata?.changeTag { return nil }
        return RecordZoneError(.serverRecordChanged, "the record changed on the server since it was fetched", recordID: record.id, serverRecord: current)
    }
}
