import Foundation
import RecordZone
import SQLiteKit

extension ConversationStore {
    /// How far this store trusts `identifier`'s key: verified, pinned on first use, conflicted
    /// (claimed with unrelated keys; its records held back), or unknown.
    public func trust(of identifier: String) -> SpeakerTrust {
        if let chain = policy.pins.chain(for: identifier) { return chain.isVerified ? .verified : .firstUse }
        return policy.pins.conflictedIdentities.contains(identifier) ? .conflicted : .unknown
    }

    /// The fingerprints of the keys that claim a conflicted identity, for the app to compare
    /// with the person out of band before calling ``trust(_:fingerprint:)``.
    public func candidateFingerprints(for identifier: String) throws(ConversationError) -> [String] {
        Set(try heldBack(identifier).map(\.record.authorKey)).map { KeyChain.fingerprint(identity: identifier, key: $0) }.sorted()
    }

    /// The conversation with the speaker a ref names, started if there is none. A ref that
    /// carries a key pins it (verified) when nothing is pinned, and settles a conflict.
    /// - Throws: ``ConversationError/Code/keyConflict`` when the store holds another key for
    ///   the speaker: a pin never switches silently.
    @discardableResult
    public func conversation(with ref: SpeakerRef) async throws(ConversationError) -> Conversation {
        if let key = ref.publicKey { try await settle(ref.identifier, key: key) }
        return try await conversation(with: ref.identifier)
    }

    /// Trusts the key of `identifier` whose fingerprint the app compared with the person:
    /// pins it (verified) and admits the records held back for the conflict that it signed;
    /// the others stay in quarantine as key conflicts.
    /// - Throws: ``ConversationError/Code/keyConflict`` when no key seen for the identity has
    ///   this fingerprint, or another key is pinned already.
    public func trust(_ identifier: String, fingerprint: String) async throws(ConversationError) {
        let keys = Set(try heldBack(identifier).map(\.record.authorKey) + (policy.pins.chain(for: identifier).map { [$0.current] } ?? []))
        guard let key = keys.first(where: { KeyChain.fingerprint(identity: identifier, key: $0) == fingerprint }) else {
            throw ConversationError(.keyConflict, "no key seen for '\(identifier)' has the fingerprint \(fingerprint)")
        }
        try await settle(identifier, key: key)
    }

    /// Pins `key` for `identifier` as verified and admits what was held back for it.
    private func settle(_ identifier: String, key: Data) async throws(ConversationError) {
        guard policy.pins.pinVerified(key, for: identifier) else {
            throw ConversationError(.keyConflict, "the store holds another key for '\(identifier)'")
        }
        let held = try heldBack(identifier)
        let policy = self.policy
        try await write { applier in
            for (id, record) in held {
                if let reason = policy.check(record) {
                    try applier.db.execute("UPDATE ck_quarantine SET code = ?, reason = ? WHERE id = ?", [reason.code.rawValue, reason.description, id])
                } else {
                    try applier.apply(record, origin: .remote)
                    try applier.db.execute("DELETE FROM ck_quarantine WHERE id = ?", [id])
                }
            }
        }
    }

    /// Records held back because `identifier` was in conflict, with their quarantine row IDs.
    private func heldBack(_ identifier: String) throws(ConversationError) -> [(id: Int64, record: Record)] {
        try read { db in
            try db.rows("SELECT id, record FROM ck_quarantine WHERE identity = ? AND code = 'identityConflict' AND record IS NOT NULL ORDER BY id",
                        [identifier]) { row in (row.int(0), row.blob(1)) }
        }.compactMap { id, bytes in (try? Record(canonical: bytes)).map { (id, $0) } }
    }
}
