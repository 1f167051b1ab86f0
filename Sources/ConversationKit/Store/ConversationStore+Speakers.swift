import Foundation
import RecordZone
import SQLiteKit

extension ConversationStore {
    /// Sets up the store's own speaker: creates its key pair on first use (kept in the store
    /// directory, mode 0600) and publishes its signed Speaker record through the outbox.
    /// Calling it again with the same identifier updates the name and tags.
    /// - Throws: ``ConversationError/Code/invalidIdentifier``;
    ///   ``ConversationError/Code/storeBelongsToAnotherSpeaker`` when this store is another
    ///   speaker's (open that speaker's own store instead; nothing of theirs is touched).
    @discardableResult
    public func setupLocalSpeaker(identifier: String, name: String, tags: [String] = []) async throws(ConversationError) -> Speaker {
        try ChatRecords.validate(identifier: identifier)
        let local: LocalIdentity
        if let existing = database.identity.withLock({ $0 }) {
            guard existing.identifier == identifier else {
                throw ConversationError(.storeBelongsToAnotherSpeaker, "this store belongs to '\(existing.identifier)'; open '\(identifier)'s own store directory instead")
            }
            local = existing
        } else {
            let key: SigningKey
            do { key = try KeyFile.loadOrCreate(at: keyFile) } catch { throw ConversationError(.storeNotWritable, "cannot keep the speaker key: \(error.message)", backendError: error) }
            local = LocalIdentity(identifier: identifier, key: key, identityKey: key)
            guard policy.pins.pinVerified(key.publicKey, for: identifier) else {
                throw ConversationError(.keyConflict, "this store holds another key for '\(identifier)'")
            }
        }
        do { _ = try ChatRecords.speaker(identifier: identifier, name: name, tags: tags) } catch {
            throw ConversationError(.invalidIdentifier, error.message)
        }
        try await write { applier in
            try Self.setLocalSpeaker(identifier, ifAbsent: true, in: &applier)
            applier.device = local
            // A new name or tags keep the avatar.
            let avatar = try Self.avatar(of: identifier, in: applier.db)
            try self.commitProfile(identifier, name: name, tags: tags, avatar: avatar, as: local, in: &applier)
            try applier.publishEncryptionKey()
        }
        database.identity.withLock { $0 = local }
        guard let speaker = try await loadSpeaker(identifier) else {
            throw ConversationError(.database, "the local speaker's profile was not stored")
        }
        return speaker
    }

    /// Makes `identifier` the store's local speaker (a store has one: `ifAbsent` keeps one
    /// already set, otherwise a second fails), and marks the messages it said among those held
    /// as its own.
    static func setLocalSpeaker(_ identifier: String, ifAbsent: Bool = false, in applier: inout RecordApplier) throws {
        try applier.db.execute("INSERT INTO ck_meta (key, value) VALUES ('local_speaker', ?)\(ifAbsent ? " ON CONFLICT (key) DO NOTHING" : "")", [identifier])
        applier.localSpeaker = identifier
        try applier.markOwnMessages()
    }

    /// Publishes a version of the local speaker's profile: both copies (its zone, the
    /// directory) with one clock, past the version shown now, whichever copy that came from —
    /// so it wins over a profile from a clock hours ahead too.
    func commitProfile(_ identifier: String, name: String, tags: [String], avatar: AvatarReference?, as local: LocalIdentity,
                       in applier: inout RecordApplier) throws {
        let shown = try applier.db.first("SELECT clock FROM speakers WHERE identifier = ?", [identifier]) { RecordClock(rawValue: UInt64(bitPattern: $0.int(0))) }
        try commitLocal(try ChatRecords.speaker(identifier: identifier, name: name, tags: tags, avatar: avatar), as: local, after: shown, in: &applier)
    }

    /// The avatar a speaker's profile names, from the cache.
    static func avatar(of identifier: String, in db: Database) throws -> AvatarReference? {
        try db.first("SELECT avatar_hash, avatar_size, avatar_width, avatar_height FROM speakers WHERE identifier = ? AND avatar_hash IS NOT NULL",
                     [identifier]) { row in
            (try? AssetReference(hash: row.blob(0), size: UInt64(row.int(1)))).map {
                AvatarReference(asset: $0, size: PixelSize(width: Int(row.int(2)), height: Int(row.int(3))))
            }
        } ?? nil
    }

    /// Changes the local speaker's name and tags (a new signed version of its Speaker record).
    @discardableResult
    public func updateLocalSpeaker(name: String, tags: [String]) async throws(ConversationError) -> Speaker {
        let local = try requireIdentity()
        return try await setupLocalSpeaker(identifier: local.identifier, name: name, tags: tags)
    }

    /// The local speaker, once set up.
    public var localSpeaker: Speaker? {
        get throws(ConversationError) {
            guard let identifier = localSpeakerIdentifier else { return nil }
            return try speaker(fromRef: SpeakerRef(identifier: identifier))
        }
    }

    /// The speaker a reference points to, if the store knows it.
    public func speaker(fromRef ref: SpeakerRef) throws(ConversationError) -> Speaker? {
        try read(speakerQuery(ref.identifier))
    }

    /// ``speaker(fromRef:)``, read without blocking the caller's thread.
    func loadSpeaker(_ identifier: String) async throws(ConversationError) -> Speaker? {
        try await read(speakerQuery(identifier))
    }

    private func speakerQuery(_ identifier: String) -> @Sendable (Database) throws -> Speaker? {
        let local = localSpeakerIdentifier
        return { db in try self.speakers(db, where: "s.identifier = ?", [identifier], local: local).first }
    }

    /// Everyone the local speaker has talked with or found by a query.
    public func allKnownSpeakers() throws(ConversationError) -> [Speaker] {
        let local = localSpeakerIdentifier
        return try read { db in try self.speakers(db, where: "s.is_known = 1 AND s.identifier != ?", [local ?? ""], local: local) }
    }

    /// Finds speakers with a tag: in the `speakers` directory zone through the backend's query
    /// (when it can be reached) and in the local cache. Found speakers join
    /// ``allKnownSpeakers()``, and the store follows them (their own zones are pulled from the
    /// next sync on). The local speaker is not among the results.
    public func speakers(matching query: SpeakerQuery) async throws(ConversationError) -> [Speaker] {
        let local = localSpeakerIdentifier
        var found = [Record]()
        var cursor: QueryCursor? = nil
        let backend = try backend()
        do {
            repeat {
                let page = try await backend.query(
                    RecordQuery(zone: ChatRecords.speakersZone, recordType: ChatRecords.speakerType, predicates: [.contains("tags", .string(query.tag))]),
                    cursor: cursor, limit: 200)
                found += page.records
                cursor = page.cursor
            } while cursor != nil
        } catch where error.isTransient || error.code == .zoneNotFound {
            // Offline, or nobody published yet: the local cache answers alone.
        } catch {
            throw ConversationError.backend(error, "speaker query failed")
        }
        let results = found
        return try await write { applier in
            for record in results { try applier.apply(record, origin: .remote) }
            let found = try applier.db.rows("""
                SELECT identifier FROM speakers WHERE is_known = 0 AND identifier != ?
                    AND identifier IN (SELECT identifier FROM speaker_tags WHERE tag = ?)
                """, [local ?? "", query.tag]) { $0.text(0) }
            for identifier in found {
                try applier.db.execute("UPDATE speakers SET is_known = 1 WHERE identifier = ?", [identifier])
                try applier.follow(identifier)
                applier.note(.speakerFound(identifier))
            }
            return try self.speakers(applier.db, where: "s.identifier IN (SELECT identifier FROM speaker_tags WHERE tag = ?) AND s.identifier != ?",
                                     [query.tag, local ?? ""], local: local)
        }
    }

    func speakers(_ db: Database, where condition: String, _ values: [any DatabaseValueConvertible], local: String?) throws -> [Speaker] {
        let rows = try db.rows("""
            SELECT s.identifier, s.name, s.avatar_width, s.avatar_height, s.avatar_error FROM speakers s WHERE \(condition) ORDER BY s.identifier
            """, values) { row in
            (row.text(0), row.text(1), row.optionalInt(2).flatMap { w in row.optionalInt(3).map { PixelSize(width: Int(w), height: Int($0)) } }, row.optionalText(4))
        }
        return try rows.map { identifier, name, avatarSize, avatarProblem in
            let tags = try db.rows("SELECT tag FROM speaker_tags WHERE identifier = ? ORDER BY tag", [identifier]) { $0.text(0) }
            var speaker = Speaker(identifier: identifier, name: name.isEmpty ? identifier : name, tags: tags, isLocalSpeaker: identifier == local,
                                  publicKey: policy.pins.chain(for: identifier)?.current, trust: trust(of: identifier))
            speaker.avatarSize = avatarSize
            speaker.avatarProblem = avatarProblem
            return speaker
        }
    }
}
