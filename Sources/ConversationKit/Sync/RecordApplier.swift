import Foundation
import RecordZone
import SQLiteKit

/// Applies record versions to the cache inside a write transaction: the merge rule against the
/// version held, the chat model's own checks, then the projection into the chat tables.
/// Local changes and pulled changes go through the same path, so both sides of a conversation
/// build their tables the same way. Collects the events to publish after the commit.
struct RecordApplier {
    enum Origin { case local, remote }

    let db: Database
    var localSpeaker: String?
    /// This device's keys (nil before the store is set up): what the applier signs with when it
    /// commits on its own (key shares) and opens what was shared with this device.
    var device: ConversationStore.LocalIdentity?
    let clock: HybridLogicalClock
    let policy: RecordPolicy
    /// Conversations whose sender keys this device shares again in ``finish()``: a member or a
    /// device appeared that an epoch was not shared with.
    var zonesToShare = Set<String>()
    /// Other senders' epochs to pass on to this person's other devices in ``finish()``.
    var historyToShare = HistoryToShare.epochs([])
    private(set) var events: [StoreEvent] = []
    private(set) var quarantinedCount = 0
    /// Whether this transaction queued a local change for the backend.
    var queuedLocalChange = false
    /// Zones where messages of others arrived: this device's Delivery record is written again
    /// in ``finish()``. Zones where the local speaker's own arrived from another of its devices:
    /// the Delivery records held there are weighed again.
    var deliveryZones = Set<String>(), reweighedZones = Set<String>()
    /// Message records new in this transaction, by zone and sender, not yet in `held_messages`.
    var heldPending: [HeldSender: (count: Int64, newest: String)] = [:]
    /// The local speaker's message-name prefix, `m.<h(speaker)>.` (``finishDeliveries()``).
    var ownPrefix: (speaker: String, prefix: String)?
    /// Conversations already ensured in this transaction.
    private var ensured = Set<String>()
    /// Groups whose changes moved in this transaction: their membership, and their messages,
    /// are decided again in ``finish()``.
    private var changedGroups = Set<String>()
    /// Groups the local speaker's membership grew in (added again, or its runs decided anew to
    /// cover more): their token is dropped in ``finish()``, so the zone is read again from the
    /// start — a server shows each reader only what its membership then let it read.
    private var rereadGroups = Set<String>()
    /// Whom the local speaker blocks, once read in this transaction (``blocked()``).
    private var blockedSpeakers: Set<String>?
    /// What ``seal(_:at:)`` sealed in this transaction, by record: the sealed bytes and the
    /// plaintext record they came from. A local change is projected from its plaintext instead
    /// of being opened again.
    var sealedHere: [RecordID: (sealed: Data, plain: Record)] = [:]

    init(db: Database, localSpeaker: String?, device: ConversationStore.LocalIdentity?, clock: HybridLogicalClock, policy: RecordPolicy) {
        self.db = db
        self.localSpeaker = localSpeaker
        self.device = device
        self.clock = clock
        self.policy = policy
    }

    /// Applies one version. Returns false when it lost the merge or was quarantined.
    @discardableResult
    mutating func apply(_ record: Record, origin: Origin) throws -> Bool {
        let zone = record.id.zone.rawValue, name = record.id.name
        let held = try db.first("SELECT clock, author, signature FROM ck_records WHERE zone = ? AND name = ?", [zone, name]) { row in
            (UInt64(bitPattern: row.int(0)), row.blob(1), row.blob(2))
        }
        if let held {
            var current = Record(id: record.id, type: record.recordType)
            current.clock = RecordClock(rawValue: held.0)
            current.authorKey = held.1
            current.signature = held.2
            guard MergeRule.wins(record, over: current) else { return false }
        }
        if let violation = ChatRecords.violation(of: record, reader: localSpeaker) {
            try quarantine(RejectedRecord(recordID: record.id, reason: .schemaViolation(violation.detail), source: origin == .local ? "local" : "pull",
                                          data: try? record.encoded()))
            return false
        }
        try db.execute("""
            INSERT INTO ck_records (zone, name, type, clock, author, signature, is_deleted, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (zone, name) DO UPDATE SET type = excluded.type, clock = excluded.clock, author = excluded.author,
                signature = excluded.signature, is_deleted = excluded.is_deleted, record = excluded.record
            """, [zone, name, record.recordType, record.clock.rawValue, record.authorKey, record.signature, record.isDeleted, try record.encoded()])
        if held == nil, record.recordType == ChatRecords.messageType { try countHeld(record, origin: origin) }
        switch record.recordType {
        case ChatRecords.speakerType: try projectSpeaker(record)
        case ChatRecords.memberType: try projectMember(record)
        case ChatRecords.messageType: try projectMessage(record, origin: origin)
        case ChatRecords.receiptType: try projectReceipt(record)
        case ChatRecords.reactionType: try projectReaction(record, origin: origin)
        case ChatRecords.deliveryType: try projectDelivery(record)
        case ChatRecords.blockType: try projectBlock(record)
        case GroupChange.recordType: try applyGroupChange(record)
        case EncryptionKey.recordType: try projectEncryptionKey(record)
        case KeyShare.recordType: try projectKeyShare(record, origin: origin)
        case HistoryShare.recordType: try projectHistoryShare(record, origin: origin)
        default: break  // a type from a newer version: kept in ck_records, not shown
        }
        return true
    }

    /// Adds an event to publish after the commit.
    mutating func note(_ event: StoreEvent) { events.append(event) }

    /// Signs local versions of one thing with one clock past every version held of any of them
    /// and past `after`, applies them and queues them in the outbox: a new version always wins
    /// over the one it replaces, even one from a clock hours ahead.
    mutating func commitLocal(_ records: [Record], signedWith key: SigningKey, after: RecordClock? = nil) throws {
        var signingClock = clock.now()
        var past = after
        for record in records {
            let held = try db.first("SELECT clock FROM ck_records WHERE zone = ? AND name = ?", [record.id.zone.rawValue, record.id.name]) {
                RecordClock(rawValue: UInt64(bitPattern: $0.int(0)))
            }
            past = [past, held].compactMap { $0 }.max()
        }
        if let past, past >= signingClock, past.rawValue < UInt64.max { signingClock = RecordClock(rawValue: past.rawValue + 1) }
        for var record in records {
            try record.sign(with: key, clock: signingClock)
            try applyLocal(record)
        }
    }

    /// Applies an already signed local version and queues it in the outbox.
    mutating func applyLocal(_ record: Record) throws {
        guard try apply(record, origin: .local) else {
            throw ConversationError(.database, "a local change to \(record.id) lost the merge or was refused")
        }
        try Outbox.enqueue(zone: record.id.zone.rawValue, name: record.id.name, clock: record.clock.rawValue, in: db)
        queuedLocalChange = true
    }


    /// Marks a local message failed for good, with why.
    mutating func fail(_ message: MessageID, _ failure: SyncFailure) throws {
        try db.execute("UPDATE messages SET sync_state = ?, sync_error = ?, sync_error_code = ? WHERE zone = ? AND name = ?",
                       [SyncStateColumn.failed.rawValue, failure.message, failure.storedCode, message.conversation, message.name])
        note(.syncStateChanged(message))
    }

    /// Quarantines a refused record with its reason (as a code and for people), keeping its
    /// bytes and the identity it concerns when the refusal is about one; it is never applied
    /// or shown.
    mutating func quarantine(_ rejected: RejectedRecord) throws {
        try db.execute("INSERT INTO ck_quarantine (zone, name, reason, source, record, received_at, code, identity) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [rejected.recordID?.zone.rawValue, rejected.recordID?.name, rejected.reason.description, rejected.source, rejected.data,
                        Int64(Date().timeIntervalSince1970 * 1000), rejected.reason.code.rawValue, rejected.reason.identity])
        quarantinedCount += 1
    }

    /// Decides again what was accepted before a chain changed: for each identity whose chain
    /// just changed, the zones holding versions its chain no longer allows — signed by a device
    /// after its revocation's clock, or by a retired key after its rotation — are dropped from
    /// the cache and fetched again from the start by the next pull, where the same rule refuses
    /// them (quarantined, with their reason) and brings back the versions they had replaced. So
    /// a revocation read after what it revokes ends in the view a reader that read it first has.
    /// - Returns: the zones to fetch again.
    @discardableResult
    mutating func invalidateAccepted(of identities: Set<String>, policy: RecordPolicy) throws -> Set<String> {
        guard !identities.isEmpty else { return [] }
        // What this store signed itself stays, as its own (a revoked device marks its late
        // messages failed instead): on a linked device, the key its certificate names.
        let ownDevice = try db.first("SELECT value FROM ck_meta WHERE key = 'device_certificate'") { row in
            (try? Record(canonical: row.blob(0)))?[DeviceCertificate.keyField]?.bytesValue
        } ?? nil
        var zones = Set<String>()
        for identity in identities {
            guard let chain = policy.pins.chain(for: identity) else { continue }
            let limits = chain.devices.compactMap { device in device.revokedAfter.map { (device.key, $0) } } + chain.retired.map { ($0.key, $0.until) }
            for (key, until) in limits where key != ownDevice {
                zones.formUnion(try db.rows("SELECT DISTINCT zone FROM ck_records WHERE author = ? AND clock > ?",
                                            [key, Int64(bitPattern: until.rawValue)]) { $0.text(0) })
            }
        }
        for zone in zones { try CacheReset.drop(zone: zone, keeping: localSpeaker ?? "", in: db) }
        return zones
    }

    /// Admits again the records quarantined as key conflicts of identities whose chains just
    /// changed: a device's records read before its certificate, or a new key's before its rotation.
    mutating func readmitKeyConflicts(of identities: Set<String>, policy: RecordPolicy) throws {
        for identity in identities {
            let held = try db.rows("SELECT id, record FROM ck_quarantine WHERE identity = ? AND code = 'keyConflict' AND record IS NOT NULL ORDER BY id",
                                   [identity]) { ($0.int(0), $0.blob(1)) }
            for (id, bytes) in held {
                guard let record = try? Record(canonical: bytes) else { continue }
                if let reason = policy.check(record) {
                    // Still refused, maybe now for another reason (a device known since, and
                    // revoked): the entry says what a reader that read in order would.
                    if reason.code != .keyConflict {
                        try db.execute("UPDATE ck_quarantine SET code = ?, reason = ?, identity = ? WHERE id = ?",
                                       [reason.code.rawValue, reason.description, reason.identity, id])
                    }
                    continue
                }
                try db.execute("DELETE FROM ck_quarantine WHERE id = ?", [id])
                try apply(record, origin: .remote)
            }
        }
    }

    /// Projects a profile (from the speaker's zone or its directory copy): the newest wins.
    private mutating func projectSpeaker(_ record: Record) throws {
        let identifier = record.id.name
        let name = record.isDeleted ? "" : record.string("name") ?? ""
        // The newer of the profile's two copies (its zone, the directory) by the merge rule's
        // order: clock, then author key — the same on every reader, whatever came first.
        let newer = try db.first("SELECT clock, public_key FROM speakers WHERE identifier = ?", [identifier]) { row in
            let clock = UInt64(bitPattern: row.int(0)), author = row.optionalBlob(1) ?? Data()
            return clock < record.clock.rawValue || (clock == record.clock.rawValue && !record.authorKey.lexicographicallyPrecedes(author))
        } ?? true
        guard newer else { return }
        let avatar = AvatarReference(record)
        // A new avatar clears the reason the old one could not be had.
        try db.execute("""
            INSERT INTO speakers (identifier, name, public_key, is_known, clock, avatar_hash, avatar_size, avatar_width, avatar_height)
                VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?)
            ON CONFLICT (identifier) DO UPDATE SET name = excluded.name, public_key = excluded.public_key, clock = excluded.clock,
                avatar_error = CASE WHEN avatar_hash IS excluded.avatar_hash THEN avatar_error END,
                avatar_hash = excluded.avatar_hash, avatar_size = excluded.avatar_size,
                avatar_width = excluded.avatar_width, avatar_height = excluded.avatar_height
            """, [identifier, name, record.authorKey, record.clock.rawValue, avatar?.asset.hash, avatar.map { Int64($0.asset.size) },
                  avatar.map { $0.size.width }, avatar.map { $0.size.height }])
        try db.execute("DELETE FROM speaker_tags WHERE identifier = ?", [identifier])
        if !record.isDeleted {
            for tag in Set(record["tags"]?.listValue?.compactMap(\.stringValue) ?? []) {
                try db.execute("INSERT INTO speaker_tags (tag, identifier) VALUES (?, ?)", [tag, identifier])
            }
        }
        events.append(.speakerUpdated(identifier))
    }

    private mutating func projectMember(_ record: Record) throws {
        guard !record.isDeleted, let speaker = record.string("speaker") else { return }
        let zone = record.id.zone.rawValue
        let participants = record["participants"]?.listValue?.compactMap(\.stringValue) ?? []
        try db.execute("""
            INSERT INTO conversation_members (zone, speaker, clock) VALUES (?, ?, ?)
            ON CONFLICT (zone, speaker) DO UPDATE SET clock = min(clock, excluded.clock)
            """, [zone, speaker, record.clock.rawValue])
        if let other = participants.first(where: { $0 != localSpeaker }) {
            try ensureConversation(zone: zone, other: other)
        }
        let members = try db.rows("SELECT speaker FROM conversation_members WHERE zone = ? ORDER BY clock, speaker", [zone]) { $0.text(0) }
        try db.execute("UPDATE conversations SET started_by = ?, joined_by = ? WHERE zone = ?",
                       [members.first, members.count > 1 ? members[1] : nil, zone])
        events.append(.conversationChanged(zone))
    }

    /// - Parameter gated: whether a group's message is first decided by membership (false: it
    ///   was, and is shown as it is).
    mutating func projectMessage(_ record: Record, origin: Origin, gated: Bool = true) throws {
        let zone = record.id.zone.rawValue, name = record.id.name
        // Someone the local speaker blocks: not shown, anywhere (shown again on unblocking).
        if let speaker = record.string("speaker"), speaker != localSpeaker, try blocked().contains(speaker) {
            try removeMessageRow(zone: zone, name: name)
            return
        }
        if gated, ChatRecords.isGroupZone(record.id.zone) {
            // A group's message shows only if its speaker was a member at its clock; with the
            // group's changes moving in this transaction, that is decided in finish().
            if changedGroups.contains(zone) { return }
            guard try isGroupMember(record.string("speaker") ?? "", zone: zone, at: record.clock) else {
                try holdBack(record, origin: origin, speakerWasMember: false)
                return
            }
            guard try localMayRead(zone: zone, at: record.clock) else {
                try holdBack(record, origin: origin, speakerWasMember: true)
                return
            }
        }
        let state = origin == .local ? SyncStateColumn.pending : .synced
        let exists = try db.first("SELECT 1 FROM messages WHERE zone = ? AND name = ?", [zone, name]) { _ in true } ?? false
        if record.isDeleted {
            try projectDeletion(record, exists: exists, state: state)
            return
        }
        let isGroup = ChatRecords.isGroupZone(record.id.zone)
        // Sealed content is opened here: the key held, it shows; not yet, it waits for its key.
        var opened = record, waiting: Data?
        if let sealed = record[Sealing.sealedField]?.bytesValue, let here = sealedHere[record.id], here.sealed == sealed {
            opened = here.plain  // sealed in this transaction: the plaintext is at hand
        } else if record[Sealing.sealedField] != nil {
            switch try unseal(record) {
            case .opened(let plain): opened = plain
            case .waiting(let epoch): waiting = epoch
            case .refused(let why):
                try quarantine(RejectedRecord(recordID: record.id, reason: .schemaViolation(why), source: origin == .local ? "local" : "pull", data: try? record.encoded()))
                try removeMessageRow(zone: zone, name: name)
                return
            }
        }
        guard let speaker = record.string("speaker"), let listener = isGroup ? "" : record.string("listener"),
            let content = waiting == nil ? opened.string("content") : "", let spokenAt = record.milliseconds("spokenAt")
        else { return }
        // The message it answers: another message's name (anything else is not a reply).
        let replyTo = opened.string("replyTo").flatMap { $0.hasPrefix(ChatRecords.messagePrefix) && $0 != name ? $0 : nil }
        let custom = ChatRecords.custom(of: opened)
        let file = waiting == nil ? AttachmentManifest(record: opened) : nil
        try db.execute("""
            INSERT INTO messages (zone, name, speaker, listener, content, spoken_at, edited_at, read_at, is_deleted, sync_state, waiting_epoch, reply_to,
                custom_type, custom_data, file_name, file_type, file_size)
            VALUES (?, ?, ?, ?, ?, ?, ?, (SELECT read_at FROM receipts WHERE zone = ? AND message = ? AND reader = ?), 0, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (zone, name) DO UPDATE SET content = excluded.content, edited_at = excluded.edited_at,
                spoken_at = excluded.spoken_at, is_deleted = 0, sync_state = excluded.sync_state, sync_error = NULL, sync_error_code = NULL,
                waiting_epoch = excluded.waiting_epoch, reply_to = excluded.reply_to, custom_type = excluded.custom_type, custom_data = excluded.custom_data,
                file_name = excluded.file_name, file_type = excluded.file_type, file_size = excluded.file_size
            """, [zone, name, speaker, listener, content, spokenAt, record.milliseconds("editedAt"), zone, name, isGroup ? localSpeaker ?? "" : listener,
                  state.rawValue, waiting, replyTo, custom?.type, custom?.data, file?.name, file?.mediaType, file?.size])
        if file != nil || exists { try projectFile(file, zone: zone, name: name, ownUpload: origin == .local && speaker == localSpeaker) }
        // A new row has no versions or mentions yet (every removal of a row takes its own).
        if exists {
            try db.execute("DELETE FROM message_versions WHERE zone = ? AND name = ?", [zone, name])
            try db.execute("DELETE FROM message_mentions WHERE zone = ? AND name = ?", [zone, name])
        }
        for (version, earlier) in (ChatRecords.history(of: opened) ?? []).enumerated() {
            try db.execute("INSERT INTO message_versions (zone, name, version, content, at) VALUES (?, ?, ?, ?, ?)",
                           [zone, name, version, earlier.content, Int64((earlier.at.timeIntervalSince1970 * 1000).rounded())])
        }
        for case let field? in opened["mentions"]?.listValue?.map(\.stringValue) ?? [] {
            guard let mention = Mention(field: field, content: content) else { continue }
            try db.execute("INSERT OR IGNORE INTO message_mentions (zone, name, start, length, speaker) VALUES (?, ?, ?, ?, ?)",
                           [zone, name, mention.utf8Range.lowerBound, mention.utf8Range.count, mention.speaker])
        }
        if !isGroup { try ensureConversation(zone: zone, other: speaker == localSpeaker ? listener : speaker) }
        events.append(exists ? .messageChanged(MessageID(conversation: zone, name: name)) : .messageAdded(MessageID(conversation: zone, name: name)))
    }

    /// A message's tombstone: a placeholder in its place, with nothing of what it said (text,
    /// history, mentions, payload, what it answered), at its name's clock — so a reader that held
    /// the message and one that only ever saw the tombstone show the same placeholder at the same
    /// place. One the local speaker may not read at that clock (a group's, before they joined)
    /// is not shown.
    private mutating func projectDeletion(_ record: Record, exists: Bool, state: SyncStateColumn) throws {
        let zone = record.id.zone.rawValue, name = record.id.name
        let clock = ChatRecords.messageClock(ofName: name) ?? record.clock
        let spokenAt = Int64(clock.milliseconds)
        let isGroup = ChatRecords.isGroupZone(record.id.zone)
        let mayRead = try exists || !isGroup || localMayRead(zone: zone, at: clock)
        guard let speaker = record.string("speaker"), mayRead else { return }
        // A pair's listener: the one of the two who is not its speaker.
        let other = try db.first("SELECT other FROM conversations WHERE zone = ?", [zone]) { $0.text(0) }
        guard let listener = isGroup ? "" : speaker == localSpeaker ? other : localSpeaker else { return }
        try db.execute("""
            INSERT INTO messages (zone, name, speaker, listener, content, spoken_at, is_deleted, sync_state) VALUES (?, ?, ?, ?, '', ?, 1, ?)
            ON CONFLICT (zone, name) DO UPDATE SET is_deleted = 1, content = '', spoken_at = excluded.spoken_at, edited_at = NULL, reply_to = NULL,
                custom_type = NULL, custom_data = NULL, file_name = NULL, file_type = NULL, file_size = NULL, waiting_epoch = NULL, sync_state = excluded.sync_state, sync_error = NULL, sync_error_code = NULL
            """, [zone, name, speaker, listener, spokenAt, state.rawValue])
        try db.execute("DELETE FROM message_mentions WHERE zone = ? AND name = ?", [zone, name])
        try db.execute("DELETE FROM message_versions WHERE zone = ? AND name = ?", [zone, name])
        try projectFile(nil, zone: zone, name: name, ownUpload: false)
        events.append(exists ? .messageChanged(MessageID(conversation: zone, name: name)) : .messageAdded(MessageID(conversation: zone, name: name)))
    }

    /// A message's file as its version names it: the manifest kept (what this device holds of it
    /// kept too while it is the same file), or — none, or another file — the one held before
    /// discarded (its cache directory goes after the transaction, ``ConversationStore/removeDiscardedFiles()``).
    /// - Parameter ownUpload: the local speaker's own new file, whose chunks this device uploads.
    private mutating func projectFile(_ file: AttachmentManifest?, zone: String, name: String, ownUpload: Bool) throws {
        guard let file else {
            try db.execute("UPDATE attachments SET discarded = 1, held = NULL, uploaded = NULL WHERE zone = ? AND name = ?", [zone, name])
            return
        }
        let chunks = AttachmentManifest.hashes(of: file.chunks)
        try db.execute("""
            INSERT INTO attachments (zone, name, file_key, chunks, thumbnail, image_width, image_height, uploaded) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (zone, name) DO UPDATE SET thumbnail = excluded.thumbnail, image_width = excluded.image_width, image_height = excluded.image_height,
                held = CASE WHEN file_key = excluded.file_key AND chunks = excluded.chunks THEN held END,
                uploaded = CASE WHEN file_key = excluded.file_key AND chunks = excluded.chunks THEN uploaded END,
                problem = CASE WHEN file_key = excluded.file_key AND chunks = excluded.chunks THEN problem END,
                discarded = CASE WHEN file_key = excluded.file_key AND chunks = excluded.chunks THEN discarded ELSE 1 END,
                file_key = excluded.file_key, chunks = excluded.chunks
            """, [zone, name, file.key, chunks, file.thumbnail, file.pixelWidth.map(Int64.init), file.pixelHeight.map(Int64.init), ownUpload ? Int64(0) : nil])
    }

    /// Takes a message out of the view, with its mentions and versions.
    private mutating func removeMessageRow(zone: String, name: String) throws {
        try db.execute("DELETE FROM messages WHERE zone = ? AND name = ?", [zone, name])
        let removed = db.changes > 0
        try db.execute("DELETE FROM message_mentions WHERE zone = ? AND name = ?", [zone, name])
        try db.execute("DELETE FROM message_versions WHERE zone = ? AND name = ?", [zone, name])
        try projectFile(nil, zone: zone, name: name, ownUpload: false)
        if removed { events.append(.messageChanged(MessageID(conversation: zone, name: name))) }
    }

    private mutating func projectReceipt(_ record: Record) throws {
        guard !record.isDeleted, let reader = record.string("reader"), let message = record.string("message"),
            let readAt = record.milliseconds("readAt")
        else { return }
        let zone = record.id.zone.rawValue
        try db.execute("""
            INSERT INTO receipts (zone, message, reader, read_at) VALUES (?, ?, ?, ?)
            ON CONFLICT (zone, message, reader) DO UPDATE SET read_at = excluded.read_at
            """, [zone, message, reader, readAt])
        // A message shows as read by the listener's receipt in a pair, by the local speaker's own
        // in a group (the others' are counted from the receipts table).
        var marked = false
        if !ChatRecords.isGroupZone(record.id.zone) {
            try db.execute("UPDATE messages SET read_at = ? WHERE zone = ? AND name = ? AND listener = ?", [readAt, zone, message, reader])
            marked = db.changes > 0
        } else if reader == localSpeaker {
            try db.execute("UPDATE messages SET read_at = ? WHERE zone = ? AND name = ?", [readAt, zone, message])
            marked = db.changes > 0
        }
        if marked { events.append(.messageChanged(MessageID(conversation: zone, name: message))) }
    }

    /// Projects a reaction: one row per reactor per message (its emoji opened, or waiting for
    /// its epoch's key); a tombstone takes it back. A sealed one that does not open is
    /// quarantined, as a message is.
    mutating func projectReaction(_ record: Record, origin: Origin) throws {
        guard let reactor = record.string("reactor"), let message = ChatRecords.reactionMessage(ofName: record.id.name) else { return }
        let zone = record.id.zone.rawValue
        defer { events.append(.messageChanged(MessageID(conversation: zone, name: message))) }
        if record.isDeleted {
            try db.execute("DELETE FROM reactions WHERE zone = ? AND message = ? AND reactor = ?", [zone, message, reactor])
            return
        }
        var emoji = record.string("emoji") ?? "", waiting: Data?
        if record[Sealing.sealedField] != nil {
            switch try unseal(record) {
            case .opened(let plain): emoji = plain.string("emoji") ?? ""
            case .waiting(let epoch): (emoji, waiting) = ("", epoch)
            case .refused(let why):
                try quarantine(RejectedRecord(recordID: record.id, reason: .schemaViolation(why), source: origin == .local ? "local" : "pull", data: try? record.encoded()))
                try db.execute("DELETE FROM reactions WHERE zone = ? AND message = ? AND reactor = ?", [zone, message, reactor])
                return
            }
        }
        guard let reactedAt = record.milliseconds("reactedAt"), waiting != nil || !emoji.isEmpty else { return }
        try db.execute("""
            INSERT INTO reactions (zone, message, reactor, emoji, reacted_at, waiting_epoch, clock) VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (zone, message, reactor) DO UPDATE SET emoji = excluded.emoji, reacted_at = excluded.reacted_at,
                waiting_epoch = excluded.waiting_epoch, clock = excluded.clock
            """, [zone, message, reactor, emoji, reactedAt, waiting, Int64(bitPattern: record.clock.rawValue)])
    }

    /// Whom the local speaker blocks (read once per transaction).
    mutating func blocked() throws -> Set<String> {
        if let blockedSpeakers { return blockedSpeakers }
        let found = Set(try db.rows("SELECT identity FROM blocked_speakers") { $0.text(0) })
        blockedSpeakers = found
        return found
    }

    /// A `Block` record: the local speaker's own (from this device or another of theirs) blocks
    /// or — a tombstone — unblocks the conversation's other participant, whose messages are then
    /// taken out of the view or put back from the records held. Another's block of the local
    /// speaker changes nothing shown: the push stops sending there (``SyncFailure/Code/blocked``).
    private mutating func projectBlock(_ record: Record) throws {
        let zone = record.id.zone.rawValue
        guard let local = localSpeaker, record.string("blocker") == local else { return }
        let other: String
        if record.isDeleted {
            guard let held = try db.first("SELECT identity FROM blocked_speakers WHERE zone = ?", [zone], { $0.text(0) }) else { return }
            other = held
            try db.execute("DELETE FROM blocked_speakers WHERE identity = ?", [other])
        } else {
            guard let blocked = record.string("blocked") else { return }
            other = blocked
            try db.execute("INSERT INTO blocked_speakers (identity, zone, blocked_at) VALUES (?, ?, ?) ON CONFLICT (identity) DO UPDATE SET blocked_at = excluded.blocked_at",
                           [other, zone, Int64(record.clock.milliseconds)])
            guard db.changes > 0 else { return }
        }
        blockedSpeakers = nil
        try reproject(messagesOf: other)
        events.append(.speakerUpdated(other))
    }

    /// Shows again, or takes out of the view, every message `speaker` said in the conversations
    /// held, from their records (as a sync would have applied them).
    private mutating func reproject(messagesOf speaker: String) throws {
        let prefix = ChatRecords.messagePrefix + ChatRecords.identityHash(speaker) + "."
        let zones = try db.rows("SELECT zone FROM conversations") { $0.text(0) }
        for zone in zones {
            let records = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND name > ? AND name < ? AND type = ?",
                                      [zone, prefix, prefix.dropLast() + "/", ChatRecords.messageType]) { try? Record(canonical: $0.blob(0)) }
            for case let record? in records where record.string("speaker") == speaker {
                try projectMessage(record, origin: .remote)
            }
            if !records.isEmpty { events.append(.conversationChanged(zone)) }
        }
    }

    /// Writes what was gathered over the transaction; call once, before the commit.
    mutating func finish() throws {
        let groups = changedGroups
        changedGroups.removeAll()
        for zone in groups.sorted() { try decideGroup(zone) }
        for zone in rereadGroups.sorted() { try db.execute("UPDATE ck_zone_state SET token = NULL WHERE zone = ?", [zone]) }
        rereadGroups.removeAll()
        let sharing = zonesToShare
        zonesToShare.removeAll()
        for zone in sharing.sorted() { try shareEpochs(in: zone) }
        try shareHistory()
        try finishDeliveries()
        try SearchIndex.catchUp(in: db)
    }

    // MARK: Groups

    /// Whether `speaker` was in the group at `clock` (its runs of membership, as last decided).
    func isGroupMember(_ speaker: String, zone: String, at clock: RecordClock) throws -> Bool {
        let at = Int64(bitPattern: clock.rawValue)
        return try db.first("""
            SELECT 1 FROM group_runs WHERE zone = ? AND speaker = ? AND from_clock < ? AND (until_clock IS NULL OR ? < until_clock)
            """, [zone, speaker, at, at]) { _ in true } ?? false
    }

    /// Whether the local speaker reads a group's version at `clock` (``GroupMembership/mayRead(_:at:)``):
    /// inside one of its runs, or — when the group keeps its whole history — before its last
    /// run ended.
    func localMayRead(zone: String, at clock: RecordClock) throws -> Bool {
        guard let local = localSpeaker else { return false }
        let history = try db.first("SELECT history FROM group_state WHERE zone = ?", [zone]) { GroupMembership.History(rawValue: $0.text(0)) } ?? nil
        guard history == .all else { return try isGroupMember(local, zone: zone, at: clock) }
        let at = Int64(bitPattern: clock.rawValue)
        guard let last = try db.first("SELECT until_clock FROM group_runs WHERE zone = ? AND speaker = ? ORDER BY from_clock DESC LIMIT 1", [zone, local],
                                      { $0.optionalInt(0) }) else { return false }
        return last.map { at < $0 } ?? true
    }

    /// A group message not shown: kept (a change that decides otherwise may still come). When
    /// its speaker was not a member at its clock, it is in the quarantine to say why; when only
    /// the local speaker was not (a message from before they joined or after they left), it is
    /// simply not theirs to see.
    private mutating func holdBack(_ record: Record, origin: Origin, speakerWasMember: Bool) throws {
        let zone = record.id.zone.rawValue, name = record.id.name
        let held = try db.first("SELECT 1 FROM ck_quarantine WHERE zone = ? AND name = ? AND code = 'notAMember'", [zone, name]) { _ in true } ?? false
        if speakerWasMember, held {
            try db.execute("DELETE FROM ck_quarantine WHERE zone = ? AND name = ? AND code = 'notAMember'", [zone, name])
        } else if !speakerWasMember, !held {
            try quarantine(RejectedRecord(recordID: record.id, reason: .notAMember(identity: record.string("speaker") ?? ""),
                                          source: origin == .local ? "local" : "pull", data: try? record.encoded()))
        }
        // The local speaker's own: shown to them as failed (why nobody else sees it), not gone.
        if !speakerWasMember, !record.isDeleted, let local = localSpeaker, record.string("speaker") == local {
            try projectMessage(record, origin: origin, gated: false)
            try fail(MessageID(conversation: zone, name: name),
                     SyncFailure(.notInGroup, message: "\(local) was not in the group at this message's clock: nobody else sees it"))
            return
        }
        try removeMessageRow(zone: zone, name: name)
    }

    /// A group's change: after every change decided so far (the usual case), decided alone
    /// against the group's tables, and only what it changed is written — the messages after its
    /// clock decided again; otherwise (the first change held, or one dated before the last
    /// decided) the group is decided again whole in ``finish()``. Both give the same tables.
    private mutating func applyGroupChange(_ record: Record) throws {
        let zone = record.id.zone.rawValue
        guard !changedGroups.contains(zone), let zoneName = try? ZoneName(zone), let change = try? GroupChange(record: record),
              var group = try resumed(zoneName, before: change)
        else {
            changedGroups.insert(zone)
            return
        }
        let roles = group.roles
        group.insert(change)
        let clock = Int64(bitPattern: change.clock.rawValue)
        try db.execute("UPDATE group_state SET last_clock = ?, last_name = ?, is_created = ?, name = ? WHERE zone = ?",
                       [clock, change.name, group.isCreated, group.name, zone])
        guard group.decisions.last?.decision == .accepted else { return }
        if change.action == .describe {
            try writeProfile(of: zone, description: group.groupDescription, avatar: group.avatar)
            events.append(.conversationChanged(zone))
        }
        // What moved: roles, and runs begun or ended at this change's clock.
        let moved = Set(roles.keys).union(group.roles.keys).filter { roles[$0] != group.roles[$0] }
        if !moved.isEmpty { zonesToShare.insert(zone) }
        if let local = localSpeaker, roles[local] == nil, group.roles[local] != nil,
           try db.first("SELECT 1 FROM group_runs WHERE zone = ? AND speaker = ?", [zone, local], { _ in true }) != nil {
            rereadGroups.insert(zone)
        }
        for speaker in moved {
            if let role = group.roles[speaker] {
                try db.execute("INSERT INTO group_members (zone, speaker, role) VALUES (?, ?, ?) ON CONFLICT (zone, speaker) DO UPDATE SET role = excluded.role",
                               [zone, speaker, role.rawValue])
            } else {
                try db.execute("DELETE FROM group_members WHERE zone = ? AND speaker = ?", [zone, speaker])
            }
            if roles[speaker] == nil {
                try db.execute("INSERT INTO group_runs (zone, speaker, from_clock, until_clock) VALUES (?, ?, ?, NULL)", [zone, speaker, clock])
                try follow(speaker)
            } else if group.roles[speaker] == nil {
                try db.execute("UPDATE group_runs SET until_clock = ? WHERE zone = ? AND speaker = ? AND until_clock IS NULL", [clock, zone, speaker])
            }
        }
        if let local = localSpeaker, try db.first("SELECT 1 FROM group_runs WHERE zone = ? AND speaker = ?", [zone, local], { _ in true }) != nil {
            try db.execute("INSERT INTO conversations (zone, other, group_name) VALUES (?, '', ?) ON CONFLICT (zone) DO UPDATE SET group_name = excluded.group_name",
                           [zone, group.name])
        }
        events.append(.conversationChanged(zone))
        // Messages after this clock were decided without it: those of the speakers whose
        // membership began or ended (all of them when it is the local speaker's).
        let joinedOrLeft = moved.filter { (roles[$0] == nil) != (group.roles[$0] == nil) }
        guard !joinedOrLeft.isEmpty else { return }
        let everyone = localSpeaker.map(joinedOrLeft.contains) ?? false
        // With the whole history kept, the local speaker's joining again shows what was said
        // before this clock too.
        let from = everyone && group.history == .all ? Int64.min : clock
        let later = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ? AND clock > ?", [zone, ChatRecords.messageType, from]) {
            try? Record(canonical: $0.blob(0))
        }
        for case let message? in later where everyone || joinedOrLeft.contains(message.string("speaker") ?? "") {
            try redecide(message, zone: zone)
        }
    }

    /// The roles of `speakers` in the group now (those not in it left out).
    private func rolesOf(_ speakers: [String], in zone: String) throws -> [String: GroupMembership.Role] {
        var roles: [String: GroupMembership.Role] = [:]
        for speaker in Set(speakers) {
            if let role = try db.first("SELECT role FROM group_members WHERE zone = ? AND speaker = ?", [zone, speaker], { GroupMembership.Role(rawValue: $0.text(0)) }) ?? nil {
                roles[speaker] = role
            }
        }
        return roles
    }

    /// The group as its tables hold it, ready to decide `change` — when `change` comes after the
    /// last change decided (nil otherwise). The rule reads only the roles of the change's actor
    /// and targets, so only those are loaded.
    private func resumed(_ zone: ZoneName, before change: GroupChange) throws -> GroupMembership? {
        guard let state = try db.first("SELECT last_clock, last_name, is_created, name, history FROM group_state WHERE zone = ?", [zone.rawValue], { row in
                  (clock: UInt64(bitPattern: row.int(0)), name: row.text(1), isCreated: row.int(2) != 0, groupName: row.optionalText(3),
                   history: GroupMembership.History(rawValue: row.text(4)) ?? .sinceAdded)
              }), (state.clock, state.name) < (change.clock.rawValue, change.name)
        else { return nil }
        return GroupMembership(zone: zone, resumingWith: try rolesOf([change.actor] + change.targets, in: zone.rawValue), isCreated: state.isCreated,
                               name: state.groupName, history: state.history)
    }

    /// How the rule decides `change` against the group as this store holds it: after the last
    /// change decided, from the group's tables; otherwise from every change held.
    func decision(of change: GroupChange, in zone: ZoneName) throws -> GroupMembership.Decision? {
        if var group = try resumed(zone, before: change) {
            group.insert(change)
            return group.decisions.last?.decision
        }
        let held = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ?", [zone.rawValue, GroupChange.recordType]) { row in
            (try? Record(canonical: row.blob(0))).flatMap { try? GroupChange(record: $0) }
        }.compactMap { $0 }
        return GroupMembership(zone: zone, changes: held + [change])?.decisions.first { $0.change.name == change.name }?.decision
    }

    /// Shows or holds back one group message by the runs as they stand.
    private mutating func redecide(_ message: Record, zone: String) throws {
        let speakerWasMember = try isGroupMember(message.string("speaker") ?? "", zone: zone, at: message.clock)
        if speakerWasMember, try localMayRead(zone: zone, at: message.clock) {
            try db.execute("DELETE FROM ck_quarantine WHERE zone = ? AND name = ? AND code = 'notAMember'", [zone, message.id.name])
            // Shown, and not as failed for want of membership (which it no longer is).
            let shown = try db.first("SELECT 1 FROM messages WHERE zone = ? AND name = ? AND sync_error_code IS NOT ?",
                                     [zone, message.id.name, SyncFailure.Code.notInGroup.rawValue]) { _ in true } ?? false
            // Shown again: pending if it is still in the outbox (never "synced" before it is).
            let queued = try db.first("SELECT 1 FROM ck_outbox WHERE zone = ? AND name = ?", [zone, message.id.name]) { _ in true } ?? false
            if !shown || message.isDeleted { try projectMessage(message, origin: queued ? .local : .remote, gated: false) }
        } else {
            try holdBack(message, origin: .remote, speakerWasMember: speakerWasMember)
        }
    }

    /// Decides a group again from every change it holds (``GroupMembership``): its members and
    /// runs, its conversation (shown once the local speaker has been in it), and every message,
    /// shown or held back by its speaker's membership at its clock — so the view is the same
    /// whatever order the changes and messages came in.
    private mutating func decideGroup(_ zone: String) throws {
        guard let zoneName = try? ZoneName(zone) else { return }
        let changes = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ? AND is_deleted = 0", [zone, GroupChange.recordType]) { row in
            (try? Record(canonical: row.blob(0))).flatMap { try? GroupChange(record: $0) }
        }.compactMap { $0 }
        guard let group = GroupMembership(zone: zoneName, changes: changes) else { return }
        if let local = localSpeaker {
            let before = try db.rows("SELECT from_clock, until_clock FROM group_runs WHERE zone = ? AND speaker = ?", [zone, local]) {
                GroupMembership.Run(from: RecordClock(rawValue: UInt64(bitPattern: $0.int(0))), until: $0.optionalInt(1).map { RecordClock(rawValue: UInt64(bitPattern: $0)) })
            }
            // A run now that no run before covered: what the local speaker may read grew.
            let grew = (group.runs[local] ?? []).contains { run in
                !before.contains { $0.from <= run.from && ($0.until.map { end in run.until.map { $0 <= end } ?? false } ?? true) }
            }
            if !before.isEmpty, grew { rereadGroups.insert(zone) }
        }
        zonesToShare.insert(zone)
        try db.execute("DELETE FROM group_members WHERE zone = ?", [zone])
        for (speaker, role) in group.roles {
            try db.execute("INSERT INTO group_members (zone, speaker, role) VALUES (?, ?, ?)", [zone, speaker, role.rawValue])
        }
        try db.execute("DELETE FROM group_runs WHERE zone = ?", [zone])
        for (speaker, runs) in group.runs {
            for run in runs {
                try db.execute("INSERT INTO group_runs (zone, speaker, from_clock, until_clock) VALUES (?, ?, ?, ?)",
                               [zone, speaker, Int64(bitPattern: run.from.rawValue), run.until.map { Int64(bitPattern: $0.rawValue) }])
            }
            try follow(speaker)
        }
        if let local = localSpeaker, group.runs[local] != nil {
            try db.execute("INSERT INTO conversations (zone, other, group_name) VALUES (?, '', ?) ON CONFLICT (zone) DO UPDATE SET group_name = excluded.group_name",
                           [zone, group.name])
        }
        if let last = group.decisions.last?.change {
            try db.execute("""
                INSERT INTO group_state (zone, last_clock, last_name, is_created, name, history) VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT (zone) DO UPDATE SET last_clock = excluded.last_clock, last_name = excluded.last_name,
                    is_created = excluded.is_created, name = excluded.name, history = excluded.history
                """, [zone, Int64(bitPattern: last.clock.rawValue), last.name, group.isCreated, group.name, group.history.rawValue])
            try writeProfile(of: zone, description: group.groupDescription, avatar: group.avatar)
        }
        events.append(.conversationChanged(zone))
        // Every message again, by the runs just decided.
        let messages = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ?", [zone, ChatRecords.messageType]) { try? Record(canonical: $0.blob(0)) }
        for case let message? in messages { try redecide(message, zone: zone) }
    }

    /// A group's description and avatar, as the last `describe` that took effect set them.
    private func writeProfile(of zone: String, description: String?, avatar: GroupChange.Avatar?) throws {
        try db.execute("""
            UPDATE group_state SET description = ?, avatar_hash = ?, avatar_size = ?, avatar_width = ?, avatar_height = ? WHERE zone = ?
            """, [description, avatar?.asset.hash, avatar.map { Int64($0.asset.size) }, avatar.map { Int64($0.width) }, avatar.map { Int64($0.height) }, zone])
    }

    /// Follows a speaker: its own zone (profile, devices, revocations) is pulled from now on.
    func follow(_ identifier: String) throws { try follow(zone: ChatRecords.speakerZone(identifier)) }

    /// Follows a speaker's own zone, known by name (a conversation zone's name holds both hashes).
    func follow(zone: ZoneName) throws {
        try db.execute("INSERT INTO ck_zone_state (zone) VALUES (?) ON CONFLICT (zone) DO NOTHING", [zone.rawValue])
    }

    private mutating func ensureConversation(zone: String, other: String) throws {
        guard ensured.insert(zone).inserted else { return }
        try follow(other)
        try db.execute("INSERT INTO conversations (zone, other) VALUES (?, ?) ON CONFLICT (zone) DO NOTHING", [zone, other])
        if db.changes > 0 { events.append(.conversationChanged(zone)) }
        try db.execute("""
            INSERT INTO speakers (identifier, name, is_known) VALUES (?, '', 1)
            ON CONFLICT (identifier) DO UPDATE SET is_known = 1
            """, [other])
    }
}
