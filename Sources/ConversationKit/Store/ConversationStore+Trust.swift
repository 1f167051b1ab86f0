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
        fingerprints(of: identifier, claimedIn: try heldBack(identifier))
    }

    /// ``candidateFingerprints(for:)``, read without blocking the caller's thread.
    func claimedFingerprints(for identifier: String) async throws(ConversationError) -> [String] {
        fingerprints(of: identifier, claimedIn: try await heldBack(identifier))
    }

    private func fingerprints(of identifier: String, claimedIn held: [(id: Int64, record: Record)]) -> [String] {
        policy.claimedIdentityKeys(of: identifier, in: held.map(\.record)).map { KeyChain.fingerprint(identity: identifier, key: $0) }.sorted()
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
        let keys = Set(try await heldBack(identifier).map(\.record.authorKey) + (policy.pins.chain(for: identifier).map { [$0.current] } ?? []))
        guard let key = keys.first(where: { KeyChain.fingerprint(identity: identifier, key: $0) == fingerprint }) else {
            throw ConversationError(.keyConflict, "no key seen for '\(identifier)' has the fingerprint \(fingerprint)")
        }
        try await settle(identifier, key: key)
    }

    /// An introduction of `identifier` by this store's speaker: the key this store holds for
    /// them, signed with this store's key, as text (`convkit-intro-1:…`). Someone who already
    /// holds your key passes it to ``trust(introduction:)`` to settle who `identifier` is.
    /// - Throws: ``ConversationError/Code/unknownSpeaker`` when no key is pinned for `identifier`.
    public func introduction(of identifier: String) throws(ConversationError) -> String {
        let local = try requireIdentity()
        guard let key = policy.pins.chain(for: identifier)?.current, identifier != local.identifier else {
            throw ConversationError(.unknownSpeaker, "this store holds no key for '\(identifier)' to introduce")
        }
        return Introduction.issue(of: identifier, key: key, by: local.identifier, signingKey: local.key).text
    }

    /// Trusts the key an introduction carries, when the introducer is someone this store holds a
    /// key for (pinned, not in conflict) and signed it with that key or one of its devices: pins
    /// it (verified) and admits what was held back for it — a conflict settled without comparing
    /// fingerprints. - Returns: who was introduced, and by whom.
    /// - Throws: ``ConversationError/Code/invalidIntroduction`` for text that is not an intact
    ///   introduction; ``ConversationError/Code/keyConflict`` when the introducer is not someone
    ///   this store trusts with that key, or the store holds another key for the introduced.
    @discardableResult
    public func trust(introduction text: String) async throws(ConversationError) -> (introduced: String, introducer: String) {
        let introduction: Introduction
        do { introduction = try Introduction(text: text) } catch {
            guard case .invalid(let why) = error else { throw ConversationError(.invalidIntroduction, "not an introduction") }
            throw ConversationError(.invalidIntroduction, why)
        }
        try ChatRecords.validate(identifier: introduction.introduced)
        guard !policy.pins.conflictedIdentities.contains(introduction.introducer),
            policy.pins.chain(for: introduction.introducer)?.allowsNow(introduction.signer) == true
        else {
            throw ConversationError(.keyConflict, "the introduction is signed by a key this store does not hold for '\(introduction.introducer)': "
                                    + "only someone whose key you already hold can introduce")
        }
        try await settle(introduction.introduced, key: introduction.key)
        return (introduction.introduced, introduction.introducer)
    }

    /// Pins `key` for `identifier` as verified and admits what was held back for it.
    private func settle(_ identifier: String, key: Data) async throws(ConversationError) {
        guard policy.pins.pinVerified(key, for: identifier) else {
            throw ConversationError(.keyConflict, "the store holds another key for '\(identifier)'")
        }
        try await admit(try await heldBack(identifier))
    }

    /// Admits again what was held back for keys that records read in another order would have
    /// decided at once — an identity's keys are decided in its own zone, but a folder or a first
    /// sync may read a zone where a person's linked device wrote before that person's zone:
    /// - an identity held in conflict for two of its keys is claimed by one once the device
    ///   certificate that relates them is among its held records: pinned on first use, as in order;
    /// - an identity pinned on first use to what turns out to be one of its devices' keys (only
    ///   that device had written where it was first read) is put under its identity key when the
    ///   certificate, which both keys signed, is among the records held back as key conflicts.
    /// A rival key — a forgery — stays held: no certificate relates it.
    /// - Returns: how many identities it settled.
    @discardableResult
    func settleResolvedConflicts() async throws(ConversationError) -> Int {
        var settled = 0
        for identifier in policy.pins.conflictedIdentities.sorted() {
            let held = try await heldBack(identifier)
            let roots = policy.claimedIdentityKeys(of: identifier, in: held.map(\.record))
            guard roots.count == 1, let key = roots.first, policy.pins.resolveConflict(identifier, key: key) else { continue }
            try await admit(held)
            settled += 1
        }
        let pinnedToADevice = try await read { db in
            try db.rows("SELECT DISTINCT identity FROM ck_quarantine WHERE code = 'keyConflict' AND identity IS NOT NULL AND zone LIKE 's-%' AND name LIKE ?",
                        [DeviceCertificate.namePrefix + "%"]) { $0.text(0) }
        }
        for identifier in pinnedToADevice {
            guard let chain = policy.pins.chain(for: identifier) else { continue }
            let held = try await heldBack(identifier, code: .keyConflict)
            let certifiesPin = held.contains { entry in
                guard entry.record.recordType == DeviceCertificate.recordType, case .success(let parts) = DeviceCertificate.verify(entry.record, identity: identifier) else { return false }
                return chain.isFirstUseOf(parts.device)
            }
            guard certifiesPin else { continue }
            try await admit(held)
            settled += 1
        }
        return settled
    }

    /// Admits held-back records again, as one batch (an identity's key records first): each
    /// that passes is applied and leaves the quarantine; the others stay, with the new reason.
    private func admit(_ held: [(id: Int64, record: Record)]) async throws(ConversationError) {
        let policy = self.policy
        try await write { applier in
            for ((id, record), reason) in zip(held, policy.check(held.map(\.record))) {
                if let reason {
                    try applier.db.execute("UPDATE ck_quarantine SET code = ?, reason = ? WHERE id = ?", [reason.code.rawValue, reason.description, id])
                } else {
                    try applier.apply(record, origin: .remote)
                    try applier.db.execute("DELETE FROM ck_quarantine WHERE id = ?", [id])
                }
            }
        }
    }

    /// Records held back for `identifier` (by default: because it was in conflict), with their
    /// quarantine row IDs.
    private func heldBack(_ identifier: String, code: RejectionReason.Code = .identityConflict) throws(ConversationError) -> [(id: Int64, record: Record)] {
        Self.decodeHeld(try read(Self.heldBackQuery(identifier, code)))
    }

    private func heldBack(_ identifier: String, code: RejectionReason.Code = .identityConflict) async throws(ConversationError) -> [(id: Int64, record: Record)] {
        Self.decodeHeld(try await read(Self.heldBackQuery(identifier, code)))
    }

    private static func heldBackQuery(_ identifier: String, _ code: RejectionReason.Code) -> @Sendable (Database) throws -> [(Int64, Data)] {
        { db in
            try db.rows("SELECT id, record FROM ck_quarantine WHERE identity = ? AND code = ? AND record IS NOT NULL ORDER BY id",
                        [identifier, code.rawValue]) { row in (row.int(0), row.blob(1)) }
        }
    }

    private static func decodeHeld(_ rows: [(Int64, Data)]) -> [(id: Int64, record: Record)] {
        rows.compactMap { id, bytes in (try? Record(canonical: bytes)).map { (id, $0) } }
    }
}
