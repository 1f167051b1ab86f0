import Foundation

/// The checks a backend makes before it stores a version, shared so every backend refuses the
/// same records with the same codes.
package enum SaveChecks {
    /// Refuses versions that are too large, unsigned, forged or not their author's to write.
    /// Signatures are verified in parallel; ownership in order, as readers would.
    /// - Returns: per record, its canonical encoding ready to store, or why it was refused.
    package static func admit(_ records: [Record], policy: RecordPolicy) -> [Result<Data, RecordZoneError>] {
        let verified = RecordPolicy.parallelMap(records, encodeAndVerify)
        return zip(records, verified).map { record, outcome in
            guard case .success = outcome, let reason = policy.checkOwnership(record) else { return outcome }
            return .failure(error(for: reason, recordID: record.id))
        }
    }

    private static func encodeAndVerify(_ record: Record) -> Result<Data, RecordZoneError> {
        let encoded: Data
        do {
            encoded = try record.encoded()  // throws limitExceeded past 1 MiB
        } catch {
            return .failure(error)
        }
        let body = encoded.prefix(encoded.count - 1 - record.signature.count)
        if let reason = RecordPolicy.checkSignature(record, signedBytes: body) {
            return .failure(error(for: reason, recordID: record.id))
        }
        return .success(encoded)
    }

    package static func error(for reason: RejectionReason, recordID: RecordID?) -> RecordZoneError {
        let code: RecordZoneError.Code
        switch reason {
        case .unsigned, .invalidSignature: code = .invalidSignature
        case .ownerFieldMissing, .ownerKeyMismatch, .ownerNotMember: code = .notAuthorized
        case .malformed, .corruptSegment, .refusedByBackend: code = .malformed
        }
        return RecordZoneError(code, reason.description, recordID: recordID)
    }

    /// Applies ``SavePolicy/ifServerRecordUnchanged``: the record's change tag must match the stored one.
    package static func checkUnchanged(_ record: Record, current: Record?, policy: SavePolicy) -> RecordZoneError? {
        guard policy == .ifServerRecordUnchanged else { return nil }
        if current?.serverMetadata?.changeTag == record.serverMetadata?.changeTag { return nil }
        return RecordZoneError(.serverRecordChanged, "the record changed on the server since it was fetched", recordID: record.id, serverRecord: current)
    }
}
