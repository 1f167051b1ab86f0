import Foundation
import RecordZone
import SQLiteKit

/// The recovery code: the identity key, wrapped for the day the first device is lost
/// (docs/ENCRYPTION.md "Recovery").
extension ConversationStore {
    /// On the first device: makes a new recovery code and commits the `Recovery` record it
    /// opens — the identity key wrapped with Argon2id + secretbox — to the speaker's zone (pushed
    /// by the next sync). A code made before no longer opens anything. Show the code to the
    /// person once, to write down: whoever holds it can become this identity.
    /// - Returns: the code, 13 groups of 4 characters.
    /// - Throws: ``ConversationError/Code/notIdentityDevice`` on a linked device.
    public func createRecoveryCode() async throws(ConversationError) -> String {
        let local = try requireIdentity()
        guard let identityKey = local.identityKey else {
            throw ConversationError(.notIdentityDevice, "only the first device of '\(local.identifier)', which holds its identity key, can make a recovery code")
        }
        let code = Recovery.newCode()
        let record: Record
        do { record = try Recovery.record(identity: local.identifier, seed: identityKey.seed, code: code) } catch {
            throw ConversationError(.storeNotWritable, "cannot make the recovery record: \(error.message)", backendError: error)
        }
        try await write { applier in try applier.commitLocal([record], signedWith: identityKey) }
        return Recovery.text(of: code)
    }

    /// When the recovery record this store holds was made (nil: none).
    public func recoveryCodeCreated() throws(ConversationError) -> Date? {
        guard let identifier = localSpeakerIdentifier, let id = try? Recovery.recordID(identity: identifier) else { return nil }
        return try read { db in
            try db.first("SELECT clock FROM ck_records WHERE zone = ? AND name = ? AND is_deleted = 0", [id.zone.rawValue, id.name]) {
                Date(timeIntervalSince1970: Double(RecordClock(rawValue: UInt64(bitPattern: $0.int(0))).milliseconds) / 1000)
            }
        }
    }

    /// Sets up a new store in `directory` as the first device of `identifier`, from the recovery
    /// code its lost first device made (``createRecoveryCode()``): fetches the speaker's
    /// `Recovery` record from the backend (a zone server serves it without authentication),
    /// opens it with the code, keeps the identity key as `speaker.key` and syncs — every key
    /// share to the first device opens again, so the whole history reads, and the store sends
    /// as the same identity. The linked devices stay linked.
    /// - Returns: the restored store, synced.
    /// - Throws: ``ConversationError/Code/invalidRecoveryCode``, ``ConversationError/Code/wrongRecoveryCode``
    ///   (nothing is written), ``ConversationError/Code/noRecoveryRecord``,
    ///   ``ConversationError/Code/storeBelongsToAnotherSpeaker`` (the directory holds a store
    ///   set up already), ``ConversationError/Code/notAuthentic`` (a record that is not a
    ///   recovery record of its key), a backend error (the key is kept: sync again).
    public static func restore(directory: String, identifier: String, code text: String, backend: BackendFactory,
                               configuration: StoreConfiguration = StoreConfiguration()) async throws(ConversationError) -> ConversationStore {
        try ChatRecords.validate(identifier: identifier)
        guard let code = Recovery.code(from: text) else {
            throw ConversationError(.invalidRecoveryCode, "not a recovery code: 13 groups of 4 characters, A–Z and 2–7, as 'convkit recovery create' printed it")
        }
        let store = try ConversationStore(directory: directory, backend: backend, configuration: configuration, readOnly: false)
        if let existing = store.localSpeakerIdentifier {
            throw ConversationError(.storeBelongsToAnotherSpeaker, "\(directory) holds '\(existing)'s store: restore into a new directory")
        }
        if FileManager.default.fileExists(atPath: store.keyFile) || FileManager.default.fileExists(atPath: store.deviceKeyFile) {
            throw ConversationError(.storeBelongsToAnotherSpeaker, "\(directory) holds a key file already: restore into a new directory")
        }
        let record = try await store.fetchRecoveryRecord(identifier)
        let key: SigningKey
        do { key = try Recovery.open(record, code: code) } catch {
            if error == .wrongCode {
                throw ConversationError(.wrongRecoveryCode, "the code does not open '\(identifier)'s recovery record (a typo, or an older code a newer one replaced): nothing was restored")
            }
            throw ConversationError(.notAuthentic, "'\(identifier)'s recovery record is not usable: \(error)")
        }
        do { try KeyFile.write(key, to: store.keyFile) } catch {
            throw ConversationError(.storeNotWritable, "cannot keep the speaker key: \(error.message)", backendError: error)
        }
        try await store.adoptIdentity(identifier, key: key)
        return store
    }

    /// The speaker's recovery record, fetched before this store holds any key (a throwaway one
    /// signs the requests; a zone server answers without checking it).
    private func fetchRecoveryRecord(_ identifier: String) async throws(ConversationError) -> Record {
        let state = FileManager.default.temporaryDirectory.appendingPathComponent("convkit-recovery-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: state) }
        let record: Record?
        do {
            let id = try Recovery.recordID(identity: identifier)
            let probe = try backendFactory.make(BackendContext(policy: ChatRecords.policy(), identity: identifier, key: SigningKey.generate(),
                                                               deviceCertificate: nil, stateDirectory: state))
            record = try await probe.fetchPublic(id)
        } catch {
            throw ConversationError(.backend, "cannot fetch '\(identifier)'s recovery record: \(error.message)", backendError: error)
        }
        guard let record, !record.isDeleted else {
            throw ConversationError(.noRecoveryRecord, "the backend holds no recovery record for '\(identifier)' (none was made with 'convkit recovery create', or it was not synced)")
        }
        return record
    }

    /// Makes `key` (the identity key, kept in `speaker.key`) this store's local speaker, and syncs.
    func adoptIdentity(_ identifier: String, key: SigningKey) async throws(ConversationError) {
        guard policy.pins.pinVerified(key.publicKey, for: identifier) else {
            throw ConversationError(.keyConflict, "the store holds another key for '\(identifier)'")
        }
        try await write { applier in
            try Self.setLocalSpeaker(identifier, in: &applier)
        }
        database.identity.withLock { $0 = LocalIdentity(identifier: identifier, key: key, identityKey: key) }
        try await sync()
    }
}
