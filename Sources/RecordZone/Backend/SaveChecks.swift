import Foundation

/// The checks a backend makes before it stores a version, shared so every backend refuses the
/// same records with the same codes.
enum SaveChecks {
    /// Refuses a version that is too large, unsigned, forged or not its author's to write.
    static func admit(_ record: Record, policy: RecordPolicy) -> RecordZoneError? {
        let encodedSize: Int
        do {
            encodedSize = try record.encoded().count
        } catch {
            return error
        }
        guard encodedSize <= Record.maximumEncodedSize else {
            return RecordZoneError(.limitExceeded, "record encodes to \(encodedSize) bytes", recordID: record.id)
        }
        guard let reason = policy.check(record) else { return nil }
        return error(for: reason, recordID: record.id)
    }

    static func error(for reason: RejectionReason, recordID: RecordID?) -> RecordZoneError {
        let code: RecordZoneError.Code
        switch reason {
        case .unsigned, .invalidSignature: code = .invalidSignature
        case .ownerFieldMissing, .ownerKeyMismatch, .ownerNotMember: code = .notAuthorized
        case .malformed, .corruptSegment: code = .malformed
        }
        return RecordZoneError(code, reason.description, recordID: recordID)
    }

    /// Applies ``SavePolicy/ifServerRecordUnchanged``: the record's change tag must match the stored one.
    static func checkUnchanged(_ record: Record, current: Record?, policy: SavePolicy) -> RecordZoneError? {
        guard policy == .ifServerRecordUnchanged else { return nil }
        if current?.serverMetadata?.changeTag == record.serverMetadata?.changeTag { return nil }
        return RecordZoneError(.serverRecordChanged, "the record changed on the server since it was fetched", recordID: record.id, serverRecord: current)
    }
}
