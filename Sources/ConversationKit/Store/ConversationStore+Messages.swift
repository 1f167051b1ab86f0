import Foundation
import RecordZone
import SQLiteKit

extension ConversationStore {
    // MARK: Conversations

    /// The conversation with `other`, if one exists here.
    public func existingConversation(with other: String) throws(ConversationError) -> Conversation? {
        let local = try requireIdentity()
        let zone = ChatRecords.conversationZone(local.identifier, other).rawValue
        return try read { db in try Self.conversations(db, where: "c.zone = ?", [zone], local: local.identifier).first }
    }

    /// Whether `identifier` has published a profile: one this store holds, or one in the
    /// speaker's own zone on the backend (pulled and verified, so it is cached after). Check it before starting a
    /// conversation with a name a person typed: a typo otherwise makes a conversation with
    /// nobody, whose messages still end `synced`.
    /// - Throws: a backend error when the store does not know the speaker and the backend
    ///   cannot be asked (offline): whether it exists is then unknown;
    ///   ``ConversationError/Code/keyConflict`` when the backend holds profiles of it signed by
    ///   unrelated keys (held back until the person compares fingerprints or trusts an introduction).
    public func speakerExists(_ identifier: String) async throws(ConversationError) -> Bool {
        try ChatRecords.validate(identifier: identifier)
        func held() async throws(ConversationError) -> Bool {
            try await read { db in
                try db.first("SELECT 1 FROM ck_records WHERE type = ? AND name = ? AND is_deleted = 0", [ChatRecords.speakerType, identifier]) { _ in true }
            } ?? false
        }
        if try await held() { return true }
        // The speaker's own zone, pulled and verified as any other: a profile lands in the
        // cache, or its records are held back for a conflict.
        _ = try await engine.pull(zones: [ChatRecords.speakerZone(identifier)], backend: try backend())
        if try await held() { return true }
        if !(try await claimedFingerprints(for: identifier)).isEmpty {
            throw ConversationError(.keyConflict, "'\(identifier)' exists but is claimed with unrelated keys (an impostor?): "
                                    + "compare fingerprints with them, or trust an introduction from someone you trust")
        }
        return false
    }

    /// Removes the conversation with `other` from this store only: every row of its zone
    /// (``ZoneTables``: messages — unsent ones too: they are not sent —, receipts, reactions,
    /// members, keys, files and what is queued for it) and its cached files; a block of `other`
    /// stays. Nothing is
    /// deleted on the backend; if `other` writes again, the conversation comes back with what
    /// the backend holds.
    public func removeConversation(with other: String) async throws(ConversationError) {
        let local = try requireIdentity()
        try ChatRecords.validate(identifier: other)
        let zone = ChatRecords.conversationZone(local.identifier, other).rawValue
        try await write { applier in
            guard try applier.db.first("SELECT 1 FROM conversations WHERE zone = ?", [zone], { _ in true }) != nil else {
                throw ConversationError(.unknownConversation, "no conversation with '\(other)'")
            }
            try ZoneTables.remove(zone, in: applier.db)
            applier.note(.conversationChanged(zone))
        }
        // Its cached files (a download under way writes into a folder that is gone: it fails).
        try? FileManager.default.removeItem(atPath: fileDirectory(ofZone: zone))
    }

    /// The conversation with `other`, started (offline, through the outbox) if there is none.
    /// Both sides starting it at once still end in one conversation: its zone comes from the pair.
    @discardableResult
    public func conversation(with other: String) async throws(ConversationError) -> Conversation {
        let local = try requireIdentity()
        try ChatRecords.validate(identifier: other)
        guard other != local.identifier else { throw ConversationError(.invalidIdentifier, "a conversation needs another speaker") }
        let zone = ChatRecords.conversationZone(local.identifier, other).rawValue
        return try await write { applier in
            try self.joinIfNeeded(other, as: local, in: &applier)
            guard let conversation = try Self.conversations(applier.db, where: "c.zone = ?", [zone], local: local.identifier).first else {
                throw ConversationError(.unknownConversation, "conversation \(zone) was not created")
            }
            return conversation
        }
    }

    /// Every conversation: pinned first, then the most recent (``Conversation/listOrder(_:_:)``);
    /// archived ones only when asked.
    public func conversations(includeArchived: Bool = false) throws(ConversationError) -> [Conversation] {
        let local = try requireIdentity()
        return try read { db in try Self.conversations(db, where: includeArchived ? "1" : "coalesce(s.is_archived, 0) = 0", [], local: local.identifier) }
    }

    /// The conversations not archived, read without blocking the caller's thread.
    func loadConversations() async throws(ConversationError) -> [Conversation] {
        let local = try requireIdentity()
        return try await read { db in try Self.conversations(db, where: "coalesce(s.is_archived, 0) = 0", [], local: local.identifier) }
    }

    /// Unread messages to the local speaker in one conversation.
    public func unreadCount(in conversation: String) throws(ConversationError) -> Int {
        let local = try requireIdentity()
        return try read { db in
            try Self.requireConversation(db, conversation)
            return Int(try db.first("SELECT count(*) FROM messages m WHERE m.zone = ? AND \(Self.unreadToLocal)",
                             [conversation, local.identifier, local.identifier]) { $0.int(0) } ?? 0)
        }
    }

    /// Unread messages to the local speaker over all conversations.
    public func totalUnreadCount() throws(ConversationError) -> Int {
        let local = try requireIdentity()
        return try read { db in
            Int(try db.first("SELECT count(*) FROM messages m WHERE \(Self.unreadToLocal)", [local.identifier, local.identifier]) { $0.int(0) } ?? 0)
        }
    }

    // MARK: Messages

    /// Sends a message: committed locally with its outbox entry and returned at once, offline
    /// or not; ``sync()`` delivers it.
    /// - Throws: ``ConversationError/Code/emptyContent``, ``ConversationError/Code/contentTooLarge``
    ///   (over 64 KiB of UTF-8), ``ConversationError/Code/invalidIdentifier``.
    /// - Parameter replyingTo: the message this one answers, in the same conversation (sealed
    ///   with the content; ``replies(to:)`` lists a message's answers).
    /// - Parameter mentions: speakers mentioned at spans of `content` (``Mention/written(_:in:)``
    ///   finds "@identifier" spans); sealed with the content.
    /// - Throws: ``ConversationError/Code/invalidMention`` for a span outside the content or an
    ///   invalid identifier.
    /// - Parameter custom: an app's own kind of message, sealed with it; `content` is then the
    ///   text shown where its type is not understood.
    ///   ``ConversationError/Code/invalidCustomPayload`` when it breaks ``CustomPayload/isValid``.
    @discardableResult
    public func send(_ content: String, to listener: String, replyingTo parent: MessageID? = nil, mentions: [Mention] = [],
                     custom: CustomPayload? = nil) async throws(ConversationError) -> Message {
        try await send(content, to: listener, replyingTo: parent, mentions: mentions, custom: custom, file: nil)
    }

    /// A send, with a file staged in the cache (``sendFile(_:to:caption:mediaType:replyingTo:)``).
    func send(_ content: String, to listener: String, replyingTo parent: MessageID?, mentions: [Mention] = [],
              custom: CustomPayload? = nil, file: StagedFile?) async throws(ConversationError) -> Message {
        let local = try requireIdentity()
        try Self.validate(content: content, mentions: mentions, custom: custom)
        try ChatRecords.validate(identifier: listener)
        guard listener != local.identifier else { throw ConversationError(.invalidIdentifier, "cannot send a message to yourself") }
        let name = ChatRecords.messageName(speaker: local.identifier, clock: clock.now())
        let now = Self.milliseconds(configuration.now())
        let zone = ChatRecords.conversationZone(local.identifier, listener)
        let id = MessageID(conversation: zone.rawValue, name: name)
        defer { stopTypingAfterSend(in: zone.rawValue) }
        return try await write { applier in
            // Causal order: a message is spoken after every message of the conversation its
            // sender holds, whatever the clocks say (an answer never shows above its question).
            let latest = try applier.db.first("SELECT max(spoken_at) FROM messages WHERE zone = ?", [zone.rawValue]) { $0.optionalInt(0) } ?? nil
            let spokenAt = max(now, (latest ?? Int64.min) &+ 1)
            let replyTo = try Self.replyTarget(parent, in: zone.rawValue, db: applier.db)
            let record = try ChatRecords.message(name: name, speaker: local.identifier, listener: listener, content: content, spokenAt: spokenAt, editedAt: nil,
                                                 replyTo: replyTo, mentions: mentions, custom: custom, file: file?.manifest)
            try self.joinIfNeeded(listener, as: local, in: &applier)
            try self.commitLocal(try applier.seal(record), as: local, in: &applier)
            if let file { try self.placeStagedFile(file, as: id, now: now, in: &applier) }
            try Self.clearDraft(zone.rawValue, in: &applier)
            return try Self.message(applier.db, id)
        }
    }

    /// Replaces the content of one of the local speaker's messages (a new signed version, in a
    /// pair or a group). The version carries the texts before it, so every reader holds the same
    /// history (``editHistory(of:)``); a custom payload and what it answers stay as they were.
    /// - Parameter mentions: the new text's mentions (the old ones' spans do not carry over).
    /// - Throws: ``ConversationError/Code/tooManyEdits`` past ``Message/maximumEdits``.
    @discardableResult
    public func edit(_ id: MessageID, content: String, mentions: [Mention] = []) async throws(ConversationError) -> Message {
        let local = try requireIdentity()
        try Self.validate(content: content, mentions: mentions, custom: nil)
        return try await write { applier in
            let current = try self.ownMessage(id, local: local, db: applier.db)
            var history = try Self.history(applier.db, id)
            guard history.count < Message.maximumEdits else {
                throw ConversationError(.tooManyEdits, "\(id) was edited \(history.count) times, the most a message may be")
            }
            history.append(MessageVersion(content: current.content, at: current.editedAt ?? current.spokenAt))
            let record = try ChatRecords.message(name: id.name, speaker: local.identifier, listener: current.listener.isEmpty ? nil : current.listener,
                                                 in: try ZoneName(id.conversation), content: content, spokenAt: Self.milliseconds(current.spokenAt),
                                                 editedAt: Self.milliseconds(self.configuration.now()), replyTo: current.replyTo?.name, mentions: mentions,
                                                 custom: current.custom, history: history, file: try Self.manifest(applier.db, id))
            try self.commitLocal(try applier.seal(record), as: local, in: &applier)
            return try Self.message(applier.db, id)
        }
    }

    /// Every version of a message's text, oldest first, the current one last (one version for a
    /// message never edited).
    /// - Throws: ``ConversationError/Code/unknownMessage`` for a deleted message too: its history
    ///   went with it.
    public func editHistory(of id: MessageID) throws(ConversationError) -> [MessageVersion] {
        try read { db in
            let message = try Self.message(db, id)
            return try Self.history(db, id) + [MessageVersion(content: message.content, at: message.editedAt ?? message.spokenAt)]
        }
    }

    /// The manifest of a message's file, as the store keeps it (for a new version of the message).
    static func manifest(_ db: Database, _ id: MessageID) throws -> AttachmentManifest? {
        guard let file = try message(db, id).attachment else { return nil }
        return try db.first("SELECT file_key, chunks, thumbnail, image_width, image_height FROM attachments WHERE zone = ? AND name = ?", [id.conversation, id.name]) { row in
            AttachmentManifest(name: file.name, mediaType: file.mediaType, size: file.size, key: row.blob(0),
                               chunks: AttachmentManifest.chunks(fromHashes: row.blob(1), size: file.size) ?? [], thumbnail: row.optionalBlob(2),
                                      pixelWidth: row.optionalInt(3).map(Int.init), pixelHeight: row.optionalInt(4).map(Int.init))
        } ?? nil
    }

    /// The versions before a message's current one, oldest first.
    static func history(_ db: Database, _ id: MessageID) throws -> [MessageVersion] {
        try db.rows("SELECT content, at FROM message_versions WHERE zone = ? AND name = ? ORDER BY version", [id.conversation, id.name]) {
            MessageVersion(content: $0.text(0), at: date($0.int(1)))
        }
    }

    /// Deletes one of the local speaker's messages with a signed tombstone: every reader then
    /// shows a placeholder in its place (``Message/isDeleted``), its text and history gone.
    public func delete(_ id: MessageID) async throws(ConversationError) {
        let local = try requireIdentity()
        try await write { applier in
            _ = try self.ownMessage(id, local: local, db: applier.db)
            let held = try applier.db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ?", [id.conversation, id.name]) { $0.blob(0) }
            guard let held, let current = try? Record(canonical: held) else {
                throw ConversationError(.unknownMessage, "no record for message \(id)")
            }
            let stone = try self.policy.tombstone(for: current, signedWith: local.key, clock: self.clock.now())
            try self.applyLocal(stone, in: &applier)
        }
        try await removeDiscardedFiles()
    }

    /// Marks a message to the local speaker as read: a Receipt record signed by the reader,
    /// which shows the sender ``Message/readAt``. Marking a read message again does nothing.
    public func markAsRead(_ id: MessageID) async throws(ConversationError) {
        try await markAsRead([id])
    }

    /// Marks every unread message of a conversation as read.
    public func markAllAsRead(in conversation: String) async throws(ConversationError) {
        let local = try requireIdentity()
        let unread = try await read { db in
            try Self.requireConversation(db, conversation)
            return try db.rows("SELECT m.name FROM messages m WHERE m.zone = ? AND \(Self.unreadToLocal)", [conversation, local.identifier, local.identifier]) {
                MessageID(conversation: conversation, name: $0.text(0))
            }
        }
        try await markAsRead(unread)
        try await write { applier in
            try applier.db.execute("UPDATE conversation_settings SET is_marked_unread = 0 WHERE zone = ? AND is_marked_unread = 1", [conversation])
            if applier.db.changes > 0 { applier.note(.conversationChanged(conversation)) }
        }
    }

    /// A send's end to the conversation's draft.
    static func clearDraft(_ zone: String, in applier: inout RecordApplier) throws {
        try applier.db.execute("UPDATE conversation_settings SET draft = NULL WHERE zone = ? AND draft IS NOT NULL", [zone])
        if applier.db.changes > 0 { applier.note(.conversationChanged(zone)) }
    }

    private func markAsRead(_ ids: [MessageID]) async throws(ConversationError) {
        let local = try requireIdentity()
        let readAt = Self.milliseconds(configuration.now())
        try await write { applier in
            for id in ids {
                let message = try Self.message(applier.db, id)
                let isGroup = message.listener.isEmpty
                guard isGroup ? message.speaker != local.identifier : message.listener == local.identifier else {
                    throw ConversationError(.notYourMessage, "only \(isGroup ? "the others in the group" : "the listener") can mark \(id) as read")
                }
                guard message.readAt == nil else { continue }
                let zone = try ZoneName(id.conversation)
                try self.commitLocal(try ChatRecords.receipt(zone: zone, message: id.name, reader: local.identifier, readAt: readAt), as: local, in: &applier)
            }
        }
    }

    /// Who has read a message, and when, oldest first: in a group every member's receipt
    /// ("read by 3 of 5": `readers(of:).count` of the group's other members), in a pair the
    /// listener's. A receipt by its own speaker is never made; in a group, one by someone never
    /// in it (a folder lets anyone write) is left out.
    public func readers(of id: MessageID) throws(ConversationError) -> [MessageReader] {
        try read { db in
            _ = try Self.message(db, id)
            return try db.rows("""
                SELECT r.reader, r.read_at FROM receipts r WHERE r.zone = ? AND r.message = ?
                    AND (r.zone NOT LIKE 'g-%' OR EXISTS (SELECT 1 FROM group_runs g WHERE g.zone = r.zone AND g.speaker = r.reader))
                ORDER BY r.read_at, r.reader
                """, [id.conversation, id.name]) {
                MessageReader(speaker: $0.text(0), readAt: Self.date($0.int(1)))
            }
        }
    }

    /// Whose stores hold one of the local speaker's messages, by name: the members (in a pair,
    /// the listener) one of whose devices said it holds the message and every one before it
    /// (a Delivery record), or who read it — "delivered to 4, read by 2 of 5" with
    /// ``readers(of:)``. Empty for a message someone else said. In a group, only those who were
    /// ever in it count.
    public func deliveredTo(_ id: MessageID) throws(ConversationError) -> [String] {
        let local = try requireIdentity()
        return try read { db in
            let message = try Self.message(db, id)
            guard message.speaker == local.identifier else { return [] }
            let member = "(? NOT LIKE 'g-%' OR EXISTS (SELECT 1 FROM group_runs g WHERE g.zone = ? AND g.speaker = who))"
            return try db.rows("""
                SELECT who FROM (SELECT member AS who FROM deliveries WHERE zone = ? AND through >= ? UNION SELECT reader FROM receipts WHERE zone = ? AND message = ?)
                WHERE who != ? AND \(member) ORDER BY who
                """, [id.conversation, id.name, id.conversation, id.name, local.identifier, id.conversation, id.conversation]) { $0.text(0) }
        }
    }

    /// The answers to a message, oldest first (a thread; `.count` is its reply count) — whether
    /// or not the message itself is still there (see ``parent(of:)``).
    public func replies(to id: MessageID) throws(ConversationError) -> [Message] {
        try read { db in
            try Self.requireConversation(db, id.conversation)
            return try Self.messages(db, "WHERE zone = ? AND reply_to = ? AND is_deleted = 0 ORDER BY spoken_at, name", [id.conversation, id.name])
        }
    }

    /// What a reply answers, as a view shows above it: the message, a deleted message (a
    /// placeholder, never the text it had), or one this store does not hold (not synced yet).
    /// Nil for a message that answers nothing.
    public func parent(of id: MessageID) throws(ConversationError) -> ReplyParent? {
        try read { db in
            guard let parent = try Self.message(db, id).replyTo else { return nil }
            if let shown = try? Self.message(db, parent) { return .message(shown) }
            let deleted = try db.first("SELECT is_deleted FROM messages WHERE zone = ? AND name = ?", [parent.conversation, parent.name]) { $0.int(0) != 0 } ?? false
            return deleted ? .deleted(parent) : .notHeld(parent)
        }
    }

    /// The name a reply carries: `parent`'s, which must be a message of the same conversation
    /// this store shows. - Throws: ``ConversationError/Code/unknownMessage``.
    static func replyTarget(_ parent: MessageID?, in zone: String, db: Database) throws -> String? {
        guard let parent else { return nil }
        guard parent.conversation == zone else { throw ConversationError(.unknownMessage, "\(parent) is not in this conversation") }
        return try message(db, parent).id.name
    }

    /// The messages (deleted ones too) whose ``MessageID/reference`` starts with `reference` (at
    /// least ``MessageID/shortestReference`` hex digits, at most the 16 of the name's random
    /// part), at most `limit`: one when it is unambiguous. Reads every message's name (a scan,
    /// not an index); meant for a person's typing, not a hot path. A sender chooses its own
    /// names, so a hostile one can make a reference ambiguous: the caller refuses it then rather
    /// than pick one (`convkit` does).
    /// - Throws: ``ConversationError/Code/invalidReference`` for a reference of other characters
    ///   or length.
    public func messages(referencedBy reference: String, limit: Int = 10) throws(ConversationError) -> [MessageID] {
        let digits = reference.lowercased()
        guard (MessageID.shortestReference...16).contains(digits.count), digits.allSatisfy(\.isHexDigit) else {
            throw ConversationError(.invalidReference, "a message reference is \(MessageID.shortestReference) to 16 hex digits, not '\(reference)'")
        }
        return try read { db in
            // The name's random part is its last 16 characters: `m.<speaker>.<clock>-<random>`.
            try db.rows("SELECT zone, name FROM messages WHERE name GLOB 'm.*' AND substr(name, -17) GLOB ? LIMIT ?",
                        ["-" + digits + "*", max(1, limit)]) { MessageID(conversation: $0.text(0), name: $0.text(1)) }
        }
    }

    /// One message, if the store has it and it is not deleted.
    public func message(_ id: MessageID) throws(ConversationError) -> Message? {
        try read { db in try? Self.message(db, id) }
    }

    /// A page of a conversation's messages, oldest first: the newest `limit` messages, or the
    /// `limit` messages just before `cursor` (``MessagePage/olderCursor`` of the page after).
    /// - Parameter includeDeleted: with deleted messages' placeholders in their places
    ///   (``Message/isDeleted``), as a chat view shows them.
    public func messages(in conversation: String, limit: Int = 50, before cursor: MessageCursor? = nil, includeDeleted: Bool = false) throws(ConversationError) -> MessagePage {
        try read(Self.pageQuery(conversation, limit: limit, before: cursor, includeDeleted: includeDeleted))
    }

    /// ``messages(in:limit:before:includeDeleted:)``, read without blocking the caller's thread.
    func loadMessages(in conversation: String, limit: Int, before cursor: MessageCursor? = nil, includeDeleted: Bool) async throws(ConversationError) -> MessagePage {
        try await read(Self.pageQuery(conversation, limit: limit, before: cursor, includeDeleted: includeDeleted))
    }

    /// A page of messages, or with `from` every message at or after it (and whether any is older).
    static func pageQuery(_ conversation: String, limit: Int, before cursor: MessageCursor? = nil, from first: MessageCursor? = nil,
                          includeDeleted: Bool) -> @Sendable (Database) throws -> MessagePage {
        let limit = max(1, min(limit, 1000))
        return { db in
            var sql = "WHERE zone = ?\(includeDeleted ? "" : " AND is_deleted = 0")"
            var values: [any DatabaseValueConvertible] = [conversation]
            if let cursor {
                sql += " AND (spoken_at, name) < (?, ?)"
                values += [cursor.spokenAt, cursor.name]
            }
            if let first {
                sql += " AND (spoken_at, name) >= (?, ?)"
                values += [first.spokenAt, first.name]
            }
            sql += " ORDER BY spoken_at DESC, name DESC"
            if first == nil {
                sql += " LIMIT ?"
                values.append(limit + 1)
            }
            var rows = try messages(db, sql, values, capacity: first == nil ? limit + 1 : 0)
            // An empty page is either an empty conversation or none at all: only then ask which.
            if rows.isEmpty { try requireConversation(db, conversation) }
            var hasOlder = rows.count > limit && first == nil
            if hasOlder { rows.removeLast() }
            if let first {
                hasOlder = try db.first("SELECT 1 FROM messages WHERE zone = ? AND (spoken_at, name) < (?, ?)\(includeDeleted ? "" : " AND is_deleted = 0") LIMIT 1",
                                        [conversation, first.spokenAt, first.name]) { _ in true } ?? false
            }
            let olderCursor = hasOlder ? rows.last.map { MessageCursor(spokenAt: milliseconds($0.spokenAt), name: $0.id.name) } : nil
            rows.withUnsafeMutableBufferPointer { $0.reverse() }  // moved, not copied: no retain and release a field
            return MessagePage(messages: rows, olderCursor: olderCursor)
        }
    }

    /// The newest `limit` messages of a conversation now and after every change to it (a
    /// ``liveMessages(in:pageSize:includeDeleted:)`` collection's snapshots; for a conversation
    /// not here yet, from when it appears).
    public func observeMessages(in conversation: String, limit: Int = 50) -> AsyncStream<[Message]> {
        let events = self.events()
        return AsyncStream { continuation in
            let task = Task {
                var live = try? await loadLiveMessages(in: conversation, pageSize: limit, includeDeleted: false)
                if live == nil {
                    for await event in events {
                        switch event {
                        case .conversationChanged(conversation), .reset: break
                        default: continue
                        }
                        live = try? await loadLiveMessages(in: conversation, pageSize: limit, includeDeleted: false)
                        if live != nil { break }
                    }
                }
                guard let live else { return continuation.finish() }
                for await snapshot in live.snapshots { continuation.yield(Array(snapshot.messages.suffix(limit))) }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    // MARK: Helpers

    /// Writes the local speaker's member record for the conversation with `other`, once.
    func joinIfNeeded(_ other: String, as local: LocalIdentity, in applier: inout RecordApplier) throws {
        let zone = ChatRecords.conversationZone(local.identifier, other).rawValue
        let joined = try applier.db.first("SELECT 1 FROM conversation_members WHERE zone = ? AND speaker = ?", [zone, local.identifier]) { _ in true } ?? false
        if !joined { try commitLocal(try ChatRecords.member(local.identifier, with: other), as: local, in: &applier) }
    }

    private func ownMessage(_ id: MessageID, local: LocalIdentity, db: Database) throws -> Message {
        let message = try Self.message(db, id)
        guard message.speaker == local.identifier else { throw ConversationError(.notYourMessage, "\(id) was said by \(message.speaker)") }
        return message
    }

    static func requireConversation(_ db: Database, _ zone: String) throws {
        guard try db.first("SELECT 1 FROM conversations WHERE zone = ?", [zone], { _ in true }) != nil else {
            throw ConversationError(.unknownConversation, "no conversation \(zone)")
        }
    }

    static func validate(content: String, mentions: [Mention], custom: CustomPayload?) throws(ConversationError) {
        try validate(content: content)
        try validate(mentions, in: content)
        if let custom, !custom.isValid {
            throw ConversationError(.invalidCustomPayload, "a custom payload's type is 1-\(CustomPayload.maximumTypeBytes) characters of a-z 0-9 . - _ starting with a letter "
                                    + "('\(custom.type)'), its data at most \(CustomPayload.maximumDataBytes) bytes (\(custom.data.count))")
        }
    }

    static func validate(content: String) throws(ConversationError) {
        guard !content.isEmpty else { throw ConversationError(.emptyContent, "a message needs content") }
        let count = content.utf8.count
        guard count <= Message.maximumContentBytes else {
            throw ConversationError(.contentTooLarge, "message is \(count) bytes; the limit is \(Message.maximumContentBytes)")
        }
    }

    static func validate(_ mentions: [Mention], in content: String) throws(ConversationError) {
        for mention in mentions where Mention(field: mention.field, content: content) == nil {
            throw ConversationError(.invalidMention, "a mention of '\(mention.speaker)' at bytes \(mention.utf8Range) is not a span of the text naming a valid identifier")
        }
    }

    /// The messages that mention the local speaker, newest first (Amity's and Slack's "mentions
    /// of me").
    public func messagesMentioningMe(limit: Int = 50) throws(ConversationError) -> [Message] {
        let local = try requireIdentity()
        return try read { db in
            try Self.messages(db, """
                WHERE is_deleted = 0 AND EXISTS (SELECT 1 FROM message_mentions x WHERE x.zone = messages.zone AND x.name = messages.name AND x.speaker = ?)
                ORDER BY spoken_at DESC, name DESC LIMIT ?
                """, [local.identifier, max(1, min(limit, 1000))])
        }
    }

    /// Messages as the store shows them: the rows `clause` picks (it follows `SELECT … FROM
    /// messages`), in its order, each with its delivered tick. `capacity`: the rows expected.
    static func messages(_ db: Database, _ clause: String, _ values: [any DatabaseValueConvertible], capacity: Int = 0) throws -> [Message] {
        var reader = MessageRows()
        var messages = try db.rows("SELECT \(messageColumns) FROM messages " + clause, values, capacity: capacity) { reader.message(from: $0) }
        try markDelivered(&messages, db)
        return messages
    }

    private static let messageColumns = """
        zone, name, speaker, listener, content, spoken_at, edited_at, read_at, sync_state, sync_error, sync_error_code, waiting_epoch IS NOT NULL, reply_to,
        mentions, custom_type, custom_data, is_deleted, file_name, file_type, file_size, is_own
        """

    /// Makes ``Message``s of rows of ``messageColumns``, one string for what the rows repeat:
    /// a page is one conversation's, said by two speakers (or a group's few).
    private struct MessageRows {
        private var zones = ("", ""), speakers = ("", "")

        /// One message row; delivered only once read (``markDelivered(_:_:)`` adds the rest).
        mutating func message(from row: Row) -> Message {
            let state: SyncState
            switch SyncStateColumn(rawValue: row.int(8)) {
            case .pending: state = .pending
            case .failed: state = .failed(SyncFailure(storedCode: row.optionalText(10), message: row.optionalText(9)))
            default: state = .synced
            }
            let zone = Self.shared(row, 0, &zones), speaker = Self.shared(row, 2, &speakers), listener = Self.shared(row, 3, &speakers)
            let content = row.text(4), readAt = row.optionalInt(7).map(date), isOwn = row.int(20) != 0
            let mentions = row.optionalText(13).map { field in
                field.split(separator: " ").compactMap { Mention(field: String($0), content: content) }.sorted { $0.utf8Range.lowerBound < $1.utf8Range.lowerBound }
            }
            var message = Message(id: MessageID(conversation: zone, name: row.text(1)), content: content, speaker: speaker, listener: listener,
                           spokenAt: date(row.int(5)), editedAt: row.optionalInt(6).map(date), readAt: readAt, syncState: state,
                           isWaitingForKey: row.int(11) != 0, replyTo: row.optionalText(12).map { MessageID(conversation: zone, name: $0) },
                           mentions: mentions ?? [],
                           custom: row.optionalText(14).flatMap { type in row.optionalBlob(15).map { CustomPayload(type: type, data: $0) } }, isDeleted: row.int(16) != 0,
                           isDelivered: false,
                           attachment: row.optionalText(17).map { Attachment(name: $0, mediaType: row.optionalText(18) ?? "", size: row.optionalInt(19) ?? 0) },
                           isOwn: isOwn)
            message.isDelivered = message.takesTicks && readAt != nil
            return message
        }

        /// A column's text: one of the `recent` two when the same, the most recent first.
        /// Text of up to 15 bytes is held inside a `String`, with nothing to share: made afresh.
        private static func shared(_ row: Row, _ index: Int32, _ recent: inout (String, String)) -> String {
            row.withText(index) { bytes in
                guard let bytes, bytes.count > 15 else { return bytes.map { String(decoding: $0, as: UTF8.self) } ?? "" }
                if same(recent.0, bytes) { return recent.0 }
                if !same(recent.1, bytes) { recent.1 = String(decoding: bytes, as: UTF8.self) }
                recent = (recent.1, recent.0)
                return recent.0
            }
        }

        private static func same(_ text: String, _ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
            text.utf8.withContiguousStorageIfAvailable { held in
                guard held.count == bytes.count, let heldStart = held.baseAddress, let start = bytes.baseAddress else { return held.count == bytes.count }
                return memcmp(heldStart, start, bytes.count) == 0
            } ?? false
        }
    }

    /// One of the local speaker's messages in a pair is delivered once read, or once its
    /// listener's store says it holds every message of the conversation up to one named at or
    /// past it (a Delivery record); no other message is. The listeners' marks are read in one
    /// statement for all the messages, not one a message: a page of 50 reads one short range of
    /// an index instead of 50.
    static func markDelivered(_ messages: inout [Message], _ db: Database) throws {
        let open = messages.indices.filter { messages[$0].takesTicks && !messages[$0].isDelivered }
        guard let first = open.first else { return }
        let zone = messages[first].id.conversation
        let (clause, value) = open.allSatisfy({ messages[$0].id.conversation == zone })
            ? ("zone = ?", zone)
            : ("zone IN (SELECT value FROM json_each(?))", jsonArray(Set(open.map { messages[$0].id.conversation }).sorted()))
        var marks: [String: [String: String]] = [:]  // conversation → listener → through
        for (zone, member, through) in try db.rows("SELECT zone, member, max(through) FROM deliveries WHERE \(clause) GROUP BY zone, member", [value], {
            ($0.text(0), $0.text(1), $0.text(2))
        }) {
            marks[zone, default: [:]][member] = through
        }
        // Names compare as SQLite compares them: byte by byte.
        for index in open {
            if let through = marks[messages[index].id.conversation]?[messages[index].listener], !through.utf8.lexicographicallyPrecedes(messages[index].id.name.utf8) {
                messages[index].isDelivered = true
            }
        }
    }

    /// `values` as a JSON array, for `IN (SELECT value FROM json_each(?))`: one statement for
    /// any number of values. Written byte by byte: a JSONEncoder, or a String grown a character
    /// at a time, costs more than the read it serves.
    static func jsonArray(_ values: [String]) -> String {
        var json: [UInt8] = [UInt8(ascii: "[")]
        json.reserveCapacity(values.reduce(2) { $0 + $1.utf8.count + 3 })
        for (index, value) in values.enumerated() {
            if index > 0 { json.append(UInt8(ascii: ",")) }
            json.append(UInt8(ascii: "\""))
            for byte in value.utf8 {
                switch byte {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"): json += [UInt8(ascii: "\\"), byte]
                case 0..<0x20: json += Array(String(format: "\\u%04x", byte).utf8)
                default: json.append(byte)
                }
            }
            json.append(UInt8(ascii: "\""))
        }
        json.append(UInt8(ascii: "]"))
        return String(decoding: json, as: UTF8.self)
    }

    static func message(_ db: Database, _ id: MessageID) throws -> Message {
        guard let message = try messages(db, "WHERE zone = ? AND name = ? AND is_deleted = 0", [id.conversation, id.name]).first else {
            throw ConversationError(.unknownMessage, "no message \(id)")
        }
        return message
    }

    /// Messages to the local speaker (bound twice) not read: a pair's said to it, a group's
    /// (`listener` empty) said by anyone else. (`is_own` says the second again, for the unread
    /// index, which leaves one's own messages out.)
    static let unreadToLocal = "(m.listener = ? OR (m.listener = '' AND m.speaker != ?)) AND m.read_at IS NULL AND m.is_deleted = 0 AND m.is_own = 0"

    static func conversations(_ db: Database, where condition: String, _ values: [any DatabaseValueConvertible], local: String) throws -> [Conversation] {
        try db.rows("""
            SELECT c.zone, c.other, c.started_by, c.joined_by,
                (SELECT max(m.spoken_at) FROM messages m WHERE m.zone = c.zone AND m.is_deleted = 0) AS newest,
                (SELECT count(*) FROM messages m WHERE m.zone = c.zone AND \(unreadToLocal)),
                c.group_name, g.description, g.avatar_width, g.avatar_height,
                coalesce(s.is_archived, 0), s.muted_until, s.pinned_at, coalesce(s.is_marked_unread, 0), s.draft,
                EXISTS (SELECT 1 FROM blocked_speakers b WHERE b.identity = c.other)
            FROM conversations c LEFT JOIN group_state g ON g.zone = c.zone LEFT JOIN conversation_settings s ON s.zone = c.zone
            WHERE \(condition) ORDER BY s.pinned_at IS NULL, s.pinned_at, coalesce(newest, 0) DESC, c.zone
            """, [local, local] + values) { row in
            Conversation(id: row.text(0), nonLocalSpeaker: row.text(1), startedBy: row.optionalText(2), joinedBy: row.optionalText(3),
                         unreadCount: Int(row.int(5)), lastMessageAt: row.optionalInt(4).map(date), groupName: row.optionalText(6),
                         groupDescription: row.optionalText(7),
                         groupAvatarSize: row.optionalInt(8).flatMap { width in row.optionalInt(9).map { PixelSize(width: Int(width), height: Int($0)) } },
                         isArchived: row.int(10) != 0, mutedUntil: row.optionalInt(11).map(date), pinnedAt: row.optionalInt(12).map(date),
                         isMarkedUnread: row.int(13) != 0, draft: row.optionalText(14), isBlocked: row.int(15) != 0)
        }
    }

    static func date(_ milliseconds: Int64) -> Date { Date(timeIntervalSince1970: Double(milliseconds) / 1000) }
    static func milliseconds(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1000).rounded()) }
}

extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
