import Foundation

/// The checks a backend makes before it stores a version, shared so every backend refuses the
/// same records with the same codes.
package enum SaveChecks {
    /// Refuses versions that are too large, unsigned, forged or not their author's to write, and
    /// anything signed by a device the backend knows is revoked, whatever clock it claims (a
    /// stolen device cannot backdate its way in; readers accept what it signed before).
    /// Signatures are verified in parallel; ownership in order, as readers would.
    /// - Returns: per record, its canonical encoding ready to store, or why it was refused.
    package static func admit(_ records: [Record], policy: RecordPolicy) -> [Result<Data, RecordZoneError>] {
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
        for (index, reason) in zip(candidates, policy.check(candidates.map { records[$0] })) {
            if let reason { outcomes[index] = .failure(Self.error(for: reason, recordID: records[index].id)) }
        }
        return outcomes
    }

    package static func error(for reason: RejectionReason, recordID: RecordID?) -> RecordZoneError {
        let code: RecordZoneError.Code
        switch reason {
        case .unsigned, .invalidSignature: code = .invalidSignature
        case .notOwnedByID, .ownerFieldMissing, .ownerFieldMismatch, .keyConflict, .identityConflict, .deviceNotCertified, .deviceRevoked: code = .notAuthorized
        case .malformed, .corruptSegment, .refusedByBackend: code = .malformed
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
    /// now, and the save policy: the one rule every backend applies.
    package static func decide(_ record: Record, admitted: Result<Data, RecordZoneError>, current: Record?, policy: SavePolicy) -> Decision {
        switch admitted {
        case .failure(let error): return .refused(error)
        case .success(let encoded):
            if let error = checkUnchanged(record, current: current, policy: policy) { return .refused(error) }
            if let current, !MergeRule.wins(record, over: current) { return .superseded(by: current) }
            return .store(encoded)
        }
    }

    /// Applies ``SavePolicy/ifServerRecordUnchanged``: the record's change tag must match the stored one.
    static func checkUnchanged(_ record: Record, current: Record?, policy: SavePolicy) -> RecordZoneError? {
        guard policy == .ifServerRecordUnchanged else { return nil }
        if current?.serverMetadata?.changeTag == record.serverMetadata?.changeTag { return nil }
        return RecordZoneError(.serverRecordChanged, "the record changed on the server since it was fetched", recordID: record.id, serverRecord: current)
    }
}
