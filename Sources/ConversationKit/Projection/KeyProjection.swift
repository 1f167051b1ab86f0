import Foundation
import RecordZone
import SQLiteKit
import Synchronization

/// Encryption in the applier (docs/ENCRYPTION.md, docs/PROTOCOL.md §3.2): every message this
/// device sends is sealed with its sender key of the conversation's current epoch; the key is
/// shared, as `KeyShare` records committed in the same transaction and pushed before the
/// message, with every device of every member that may read it; a share for this device is
/// opened as it arrives, and the messages waiting for its epoch are shown.
///
/// A new epoch is made before a message when a member or a device it was shared with is gone
/// (removed, left, revoked), when a member joined a group that does not share its history,
/// and after 100 messages or 7 days. A device or member that appears later (its key record
/// pulled after the message, a group that shares its history) is given every epoch of this
/// device it may read, in the transaction that learned of it — so no reader waits on a sender
/// that has nothing new to say.
extension RecordApplier {
    static let messagesPerEpoch: Int64 = 100
    static let epochLifetime: Int64 = 7 * 24 * 3600 * 1000

    enum Unsealed {
        case opened(Record)
        case waiting(epoch: Data)
        case refused(String)
    }

    /// Opens a message's sealed fields with the sender key its epoch names, if this device holds it.
    func unseal(_ record: Record) throws -> Unsealed { try Self.unseal(record, in: db) }

    static func unseal(_ record: Record, in db: Database) throws -> Unsealed {
        guard let senderField = ChatRecords.sealing(record.recordType)?.sender else { return .refused("a sealed \(record.recordType), which seals nothing") }
        guard let speaker = record.string(senderField) else { return .refused("a sealed \(record.recordType) without a \(senderField)") }
        let zone = record.id.zone.rawValue
        var held: Data?
        do {
            let epoch = try Sealing.epoch(of: record[Sealing.sealedField]?.bytesValue ?? Data())
            held = try db.first("SELECT key FROM sender_keys WHERE zone = ? AND epoch = ? AND sender = ? AND device = ?",
                                [zone, epoch, speaker, record.authorKey]) { $0.blob(0) }
        } catch let failure as Sealing.Failure {
            return .refused(Self.describe(failure))
        }
        do {
            let opened = try Sealing.open(record, sender: speaker) { _ in held }
            guard (opened.string("content")?.utf8.count ?? 0) <= Message.maximumContentBytes else { return .refused("message content over 64 KiB") }
            guard (opened.string("emoji")?.utf8.count ?? 0) <= MessageReaction.maximumEmojiBytes else { return .refused("a reaction over \(MessageReaction.maximumEmojiBytes) bytes") }
            return .opened(opened)
        } catch {
            if case .keyMissing(let epoch) = error { return .waiting(epoch: epoch) }
            return .refused(Self.describe(error))
        }
    }

    private static func describe(_ failure: Sealing.Failure) -> String {
        switch failure {
        case .malformed(let why): "its sealed content is malformed: \(why)"
        case .keyMissing: "the key of its epoch is not held"
        case .notAuthentic: "its sealed content does not open with its epoch's key (altered, or moved from another record, conversation or sender)"
        }
    }

    /// Seals what a record seals (a message's `content`, a reaction's `emoji`) for its
    /// conversation with this device's current epoch (made and shared first when due). A store
    /// not set up yet writes it as it is.
    /// - Parameter clock: the clock it will be signed at, when known (a group's message);
    ///   otherwise now (it is signed at or just after it).
    mutating func seal(_ record: Record, at clock: RecordClock? = nil) throws -> Record {
        guard let device, let local = localSpeaker else { return record }
        let zone = record.id.zone.rawValue
        let current = try currentEpoch(in: zone, local: local, device: device)
        let at = Int64(bitPattern: (clock ?? self.clock.now()).rawValue)
        try db.execute("""
            UPDATE own_epochs SET messages = messages + 1, first_clock = min(coalesce(first_clock, ?), ?), last_clock = max(coalesce(last_clock, ?), ?)
            WHERE zone = ? AND epoch = ?
            """, [at, at, at, at, zone, current.epoch])
        // Kept for the next send, with this one counted, past this transaction's own writes.
        var counted = current
        counted.messages += 1
        try epochs.keep(counted, in: zone, db: db, pins: policy.pins)
        let epoch = current.epoch, key = current.key
        let fields = (ChatRecords.sealing(record.recordType)?.fields ?? ["content"]).filter { record[$0] != nil }
        let sealed = try Sealing.seal(fields, of: record, sender: local, device: device.key.publicKey, epoch: epoch, key: key)
        if let bytes = sealed[Sealing.sealedField]?.bytesValue { keys.sealedHere[record.id] = (bytes, record) }
        return sealed
    }

    /// Publishes this device's encryption key once (its record held with this key: nothing to do).
    mutating func publishEncryptionKey() throws {
        guard let device, let local = localSpeaker else { return }
        let record = try EncryptionKey.record(identity: local, device: device.key.publicKey, key: device.boxKeys.publicKey)
        let held = try db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ?", [record.id.zone.rawValue, record.id.name]) { $0.blob(0) }
        if let held, (try? Record(canonical: held))?[EncryptionKey.keyField]?.bytesValue == device.boxKeys.publicKey { return }
        try commitLocal([record], signedWith: device.key)
    }

    // MARK: Projections

    /// A device's key: kept, and this device's epochs shared with it where its owner may read them.
    mutating func projectEncryptionKey(_ record: Record) throws {
        guard let parts = try? EncryptionKey.parts(record) else { return }
        try db.execute("""
            INSERT INTO encryption_keys (identity, device, key) VALUES (?, ?, ?)
            ON CONFLICT (identity, device) DO UPDATE SET key = excluded.key WHERE key != excluded.key
            """, [parts.identity, parts.device, parts.key])
        guard db.changes > 0, let local = localSpeaker else { return }
        // A device of this person's: every other sender's epoch this one holds goes to it too.
        if parts.identity == local, parts.device != device?.key.publicKey { keys.historyToShare = .all }
        // The conversations where this device holds epochs of this person's (its own, or its
        // other devices' to pass on) that the key's owner may read.
        let zones = parts.identity == local
            ? try db.rows("SELECT DISTINCT zone FROM sender_keys WHERE sender = ?", [local]) { $0.text(0) }
            : try db.rows("""
                SELECT DISTINCT zone FROM sender_keys WHERE sender = ? AND (zone = ? OR zone IN (SELECT zone FROM group_runs WHERE speaker = ?))
                """, [local, ChatRecords.conversationZone(local, parts.identity).rawValue, parts.identity]) { $0.text(0) }
        keys.zonesToShare.formUnion(zones)
    }

    /// A share: when it holds a box for this device, the sender key is opened and kept, and the
    /// messages waiting for its epoch are shown. A box for this device that does not open to
    /// what the record claims is refused (quarantined): its key is never used.
    mutating func projectKeyShare(_ record: Record, origin: Origin) throws {
        guard let device, let local = localSpeaker, let parts = try? KeyShare.parts(record), parts.recipient == local,
              let box = parts.boxes[device.key.publicKey]
        else { return }
        let zone = record.id.zone
        let held = try db.first("SELECT 1 FROM sender_keys WHERE zone = ? AND epoch = ?", [zone.rawValue, parts.epoch]) { _ in true } ?? false
        guard !held else { return }
        try takeSenderKey(box, of: record, zone: zone, sender: parts.sender, device: parts.device, epoch: parts.epoch, origin: origin)
    }

    /// A history share to this device (another device of this person's passing on a sender's
    /// epoch): opened and kept as a key share's, when this device does not hold the epoch yet.
    mutating func projectHistoryShare(_ record: Record, origin: Origin) throws {
        guard let device, let local = localSpeaker, let parts = try? HistoryShare.parts(record), parts.owner == local,
              let box = parts.boxes[device.key.publicKey]
        else { return }
        let held = try db.first("SELECT 1 FROM sender_keys WHERE zone = ? AND epoch = ?", [parts.zone.rawValue, parts.epoch]) { _ in true } ?? false
        guard !held else { return }
        try takeSenderKey(box, of: record, zone: parts.zone, sender: parts.sender, device: parts.device, epoch: parts.epoch, origin: origin)
    }

    /// Opens a share's box for this device and keeps the sender key, then shows the messages
    /// and reactions that waited for it; a box that does not open to what the record claims is refused
    /// (quarantined): its key is never used.
    private mutating func takeSenderKey(_ box: Data, of record: Record, zone: ZoneName, sender: String, device origin: Data, epoch: Data, origin source: Origin) throws {
        guard let device, let local = localSpeaker else { return }
        let key: Data
        do {
            key = try Sealing.openShare(box, zone: zone, sender: sender, device: origin, epoch: epoch,
                                        publicKey: device.boxKeys.publicKey, secretKey: device.boxKeys.secretKey)
        } catch {
            try quarantine(RejectedRecord(recordID: record.id, reason: .schemaViolation("a key share whose box for this device does not open to what it claims (sealed to another device, or for another conversation, sender or epoch)"),
                                          source: source == .local ? "local" : "pull", data: try? record.encoded()))
            return
        }
        try db.execute("INSERT INTO sender_keys (zone, epoch, sender, device, key) VALUES (?, ?, ?, ?, ?)", [zone.rawValue, epoch, sender, origin, key])
        // Another device of this person's epoch: this one passes it on where it is missing;
        // another sender's: to this person's other devices that lack it.
        if sender == local, origin != device.key.publicKey { keys.zonesToShare.insert(zone.rawValue) }
        if sender != local, case .epochs(var epochs) = keys.historyToShare {
            epochs.insert(epoch)
            keys.historyToShare = .epochs(epochs)
        }
        let waiting = try db.rows("""
            SELECT r.record FROM messages m JOIN ck_records r ON r.zone = m.zone AND r.name = m.name
            WHERE m.zone = ? AND m.waiting_epoch = ?
            """, [zone.rawValue, epoch]) { try? Record(canonical: $0.blob(0)) }
        for case let message? in waiting { try projectMessage(message, origin: .remote, gated: false) }
        let waitingReactions = try db.rows("SELECT message, reactor FROM reactions WHERE zone = ? AND waiting_epoch = ?", [zone.rawValue, epoch]) {
            ChatRecords.reactionName(for: $0.text(0), reactor: $0.text(1))
        }
        for name in waitingReactions {
            let held = try db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ?", [zone.rawValue, name]) { try? Record(canonical: $0.blob(0)) }
            if case let reaction?? = held { try projectReaction(reaction, origin: .remote) }
        }
    }

    /// Which other senders' epochs ``shareHistory()`` passes on to this person's other devices.
    enum HistoryToShare: Equatable {
        /// Those received in this transaction.
        case epochs(Set<Data>)
        /// Every one held (a device of this person's appeared).
        case all
    }

    /// Passes other senders' epochs this device holds to this person's other devices (not
    /// revoked) that the history share held lacks: one `HistoryShare` per epoch, every device's
    /// box again — so a new device reads the past even from a sender who never comes back (one
    /// removed from a group cannot write there any more).
    mutating func shareHistory() throws {
        let due = keys.historyToShare
        keys.historyToShare = .epochs([])
        guard due != .epochs([]), let device, let local = localSpeaker else { return }
        let others = (try devices(of: [local])[local] ?? [:]).filter { $0.key != device.key.publicKey }
        guard !others.isEmpty else { return }
        let held = try db.rows("SELECT zone, epoch, sender, device, key FROM sender_keys WHERE sender != ? ORDER BY zone, epoch", [local]) {
            ($0.text(0), $0.blob(1), $0.text(2), $0.blob(3), $0.blob(4))
        }
        for (zone, epoch, sender, origin, key) in held where Sealing.isUsable(epoch: epoch, key: key, device: origin) {
            if case .epochs(let epochs) = due, !epochs.contains(epoch) { continue }
            guard let zoneName = try? ZoneName(zone) else { continue }
            let id = try HistoryShare.recordID(owner: local, epoch: epoch)
            let shared = try db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ?", [id.zone.rawValue, id.name]) { try? Record(canonical: $0.blob(0)) } ?? nil
            // What the devices have: the boxes of the history share held, and of the sender's own
            // share to this person (a device it already reached needs nothing passed on).
            let direct = try db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ?",
                                      [zone, KeyShare.name(sender: sender, epoch: epoch, recipient: local)]) { try? Record(canonical: $0.blob(0)) } ?? nil
            let has = Set((shared.flatMap { try? HistoryShare.parts($0) }?.boxes.keys).map(Array.init) ?? [])
                .union((direct.flatMap { try? KeyShare.parts($0) }?.boxes.keys).map(Array.init) ?? [])
            guard !Set(others.keys).isSubset(of: has) else { continue }
            let boxes = others.map { target, boxKey in
                (device: target, box: Sealing.sealShare(zone: zoneName, sender: sender, device: origin, epoch: epoch, key: key, to: boxKey))
            }
            try commitLocal([try HistoryShare.record(owner: local, zone: zoneName, sender: sender, device: origin, epoch: epoch, boxes: boxes)], signedWith: device.key)
        }
    }

    // MARK: Epochs

    /// This device's epoch for a conversation, made (and shared) anew when due; shared with
    /// whoever it lacks otherwise. The last send's decision stands while nothing it was made
    /// from has changed (``EpochCache``): then only the count and the age are weighed again.
    private mutating func currentEpoch(in zone: String, local: String, device: ConversationStore.LocalIdentity) throws -> EpochCache.Epoch {
        let now = Int64(clock.now().milliseconds)
        if let kept = try epochs.kept(in: zone, local: local, device: device.key.publicKey, db: db, pins: policy.pins),
           kept.messages < Self.messagesPerEpoch, now - kept.createdAt < Self.epochLifetime {
            return kept
        }
        let members = try members(of: zone, local: local)
        let devices = try devices(of: members)
        if let (epoch, createdAt, count) = try db.first("SELECT epoch, created_at, messages FROM own_epochs WHERE zone = ? ORDER BY rowid DESC LIMIT 1", [zone], {
               ($0.blob(0), $0.int(1), $0.int(2))
           }),
           let key = try db.first("SELECT key FROM sender_keys WHERE zone = ? AND epoch = ?", [zone, epoch], { $0.blob(0) }),
           Sealing.isUsable(epoch: epoch, key: key) {   // a damaged row: a new epoch replaces it
            let recipients = try recipients(of: epoch, in: zone)
            let lost = recipients.contains { member, held in !members.contains(member) || !held.isSubset(of: Set((devices[member] ?? [:]).keys)) }
            let joinedUnshared = try members.contains { recipients[$0] == nil } && groupHistory(zone) == .sinceAdded  // the read only when one joined
            if !lost, !joinedUnshared, count < Self.messagesPerEpoch, now - createdAt < Self.epochLifetime {
                try share(epoch, key: key, in: zone, with: members, devices: devices, recipients: recipients, device: device)
                return EpochCache.Epoch(epoch: epoch, key: key, createdAt: createdAt, messages: count, local: local, device: device.key.publicKey)
            }
        }
        let epoch = Sodium.randomBytes(Sealing.epochLength), key = Sodium.randomBytes(Sodium.aeadKeyLength)
        try db.execute("INSERT INTO sender_keys (zone, epoch, sender, device, key) VALUES (?, ?, ?, ?, ?)", [zone, epoch, local, device.key.publicKey, key])
        try db.execute("INSERT INTO own_epochs (zone, epoch, created_at) VALUES (?, ?, ?)", [zone, epoch, now])
        try share(epoch, key: key, in: zone, with: members, devices: devices, recipients: [:], device: device)
        return EpochCache.Epoch(epoch: epoch, key: key, createdAt: now, messages: 0, local: local, device: device.key.publicKey)
    }

    /// Shares every epoch of this device in `zone` with the devices of the members who may read
    /// one of its messages and lack it: in a pair, both; in a group, the members it was made
    /// for and anyone the history rule lets read a message between its first and last clock
    /// (``GroupMembership/mayRead(_:at:)``, from the runs as decided now) — removed since or not.
    mutating func shareEpochs(in zone: String) throws {
        guard let device, let local = localSpeaker, let zoneName = try? ZoneName(zone) else { return }
        let epochs = try db.rows("""
            SELECT o.epoch, k.key, o.first_clock, o.last_clock FROM own_epochs o JOIN sender_keys k ON k.zone = o.zone AND k.epoch = o.epoch
            WHERE o.zone = ? ORDER BY o.rowid
            """, [zone]) { ($0.blob(0), $0.blob(1), $0.optionalInt(2), $0.optionalInt(3)) }
        let isGroup = ChatRecords.isGroupZone(zoneName)
        let pair = isGroup ? [] : try members(of: zone, local: local)
        var runs: [String: [GroupMembership.Run]] = [:]
        if isGroup {
            for (speaker, run) in try db.rows("SELECT speaker, from_clock, until_clock FROM group_runs WHERE zone = ? ORDER BY from_clock", [zone], { row in
                (row.text(0), GroupMembership.Run(from: RecordClock(rawValue: UInt64(bitPattern: row.int(1))), until: row.optionalInt(2).map { RecordClock(rawValue: UInt64(bitPattern: $0)) }))
            }) { runs[speaker, default: []].append(run) }
        }
        let history = try groupHistory(zone) ?? .sinceAdded
        var devices: [String: [Data: Data]] = [:]
        func withDevices(of readers: some Sequence<String>) throws {
            for reader in readers where devices[reader] == nil { devices[reader] = try self.devices(of: [reader])[reader] ?? [:] }
        }
        for (epoch, key, first, last) in epochs where Sealing.isUsable(epoch: epoch, key: key) {
            let recipients = try recipients(of: epoch, in: zone)
            var readers = Set(recipients.keys).union(pair)
            // A reader added during the epoch (a since-added group whose sender had not learned
            // of it) gets a share dated from when it may read: a server serves it nothing older.
            var readableFrom: [String: RecordClock] = [:]
            if let first, let last {
                let span = (RecordClock(rawValue: UInt64(bitPattern: first)), RecordClock(rawValue: UInt64(bitPattern: last)))
                for (reader, readerRuns) in runs where GroupMembership.mayRead(runs: readerRuns, history: history, between: span.0, and: span.1) {
                    readers.insert(reader)
                    if history == .sinceAdded, !GroupMembership.mayRead(runs: readerRuns, history: history, between: span.0, and: span.0),
                       let added = readerRuns.map(\.from).filter({ $0 >= span.0 && $0 < span.1 }).min() {
                        readableFrom[reader] = RecordClock(rawValue: added.rawValue + 1)
                    }
                }
            }
            try withDevices(of: readers)
            try share(epoch, key: key, in: zone, with: readers.sorted(), devices: devices, recipients: recipients, device: device, readableFrom: readableFrom)
        }
        // The epochs of this person's other devices that this one holds: passed on to the
        // devices of the members now (both, in a pair) that the shares held lack — so an epoch
        // reaches a device its own device never saw (revoked or gone before it could share).
        let kin = try db.rows("SELECT epoch, key, device FROM sender_keys WHERE zone = ? AND sender = ? AND device != ?", [zone, local, device.key.publicKey]) {
            ($0.blob(0), $0.blob(1), $0.blob(2))
        }
        guard !kin.isEmpty else { return }
        let members = try members(of: zone, local: local)
        try withDevices(of: members)
        for (epoch, key, origin) in kin where Sealing.isUsable(epoch: epoch, key: key, device: origin) {
            var held: [String: Set<Data>] = [:]
            for member in members {
                let name = KeyShare.name(sender: local, epoch: epoch, recipient: member)
                let record = try db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ?", [zone, name]) { try? Record(canonical: $0.blob(0)) } ?? nil
                held[member] = Set((record.flatMap { try? KeyShare.parts($0) }?.boxes.keys).map(Array.init) ?? [])
            }
            try share(epoch, key: key, in: zone, with: members, devices: devices, recipients: held, device: device, origin: origin)
        }
    }

    /// Writes a share of `epoch` for each member whose devices now are not all among those it
    /// was shared with (every device again: a version replaces the one before), and notes them.
    /// - Parameter origin: the epoch's device, when it is another device of this person's.
    private mutating func share(_ epoch: Data, key: Data, in zone: String, with members: [String], devices: [String: [Data: Data]],
                                recipients: [String: Set<Data>], device: ConversationStore.LocalIdentity, origin: Data? = nil,
                                readableFrom: [String: RecordClock] = [:]) throws {
        guard let local = localSpeaker, let zoneName = try? ZoneName(zone) else { return }
        let epochDevice = origin ?? device.key.publicKey
        for member in members.sorted() {
            let now = devices[member] ?? [:]
            let held = recipients[member]
            if let held, Set(now.keys).isSubset(of: held) { continue }
            if !now.isEmpty {
                let boxes = now.map { target, boxKey in
                    (device: target, box: Sealing.sealShare(zone: zoneName, sender: local, device: epochDevice, epoch: epoch, key: key, to: boxKey))
                }
                var record = try KeyShare.record(zone: zoneName, sender: local, recipient: member, epoch: epoch, boxes: boxes, device: origin)
                try record.sign(with: device.key, clock: try shareClock(record.id, epoch: epoch, notBefore: readableFrom[member]))
                try applyLocal(record)
            }
            guard origin == nil else { continue }  // another device's epoch: the shares held say who has it
            let all = (held ?? []).union(now.keys).sorted { $0.lexicographicallyPrecedes($1) }
            try db.execute("""
                INSERT INTO epoch_recipients (zone, epoch, member, devices) VALUES (?, ?, ?, ?)
                ON CONFLICT (zone, epoch, member) DO UPDATE SET devices = excluded.devices
                """, [zone, epoch, member, all.reduce(Data(), +)])
        }
    }

    /// The clock a share of `epoch` is signed at: its first message's (or now, before it has
    /// one) — or `notBefore`, the first clock its reader may read at — past the share's version
    /// held. Dated with its epoch, a share written after this device was revoked still counts
    /// for the messages it signed before (the revocation's clock bounds what a device signs,
    /// PROTOCOL.md §4.3; a server refuses it anyway).
    private func shareClock(_ id: RecordID, epoch: Data, notBefore: RecordClock? = nil) throws -> RecordClock {
        let first = try db.first("SELECT first_clock FROM own_epochs WHERE zone = ? AND epoch = ?", [id.zone.rawValue, epoch]) { $0.optionalInt(0) } ?? nil
        let held = try db.first("SELECT clock FROM ck_records WHERE zone = ? AND name = ?", [id.zone.rawValue, id.name]) { UInt64(bitPattern: $0.int(0)) }
        let at = first.map { UInt64(bitPattern: $0) } ?? clock.now().rawValue
        return RecordClock(rawValue: max(at, notBefore?.rawValue ?? 0, held.map { $0 &+ 1 } ?? 0))
    }

    /// Who is in a conversation now: a pair's two speakers, a group's members.
    private func members(of zone: String, local: String) throws -> [String] {
        guard let name = try? ZoneName(zone) else { return [] }
        if ChatRecords.isGroupZone(name) {
            return try db.rows("SELECT speaker FROM group_members WHERE zone = ?", [zone]) { $0.text(0) }
        }
        guard let other = try db.first("SELECT other FROM conversations WHERE zone = ?", [zone], { $0.text(0) }) else { return [local] }
        return [local, other]
    }

    /// The encryption keys of each member's devices that may sign now (not revoked; a retired
    /// identity key left out), by device — this device's own too: its share to itself lets a
    /// store rebuilt from its backend, or an identity recovered, read what it sent.
    private func devices(of members: [String]) throws -> [String: [Data: Data]] {
        var devices: [String: [Data: Data]] = [:]
        for member in members {
            guard let chain = policy.pins.chain(for: member) else { continue }
            for (device, key) in try db.rows("SELECT device, key FROM encryption_keys WHERE identity = ?", [member], { ($0.blob(0), $0.blob(1)) })
            where chain.allowsNow(device) && key.count == Sodium.boxPublicKeyLength {
                devices[member, default: [:]][device] = key
            }
        }
        return devices
    }

    /// The members an epoch was shared with, and their devices.
    private func recipients(of epoch: Data, in zone: String) throws -> [String: Set<Data>] {
        var recipients: [String: Set<Data>] = [:]
        for (member, bytes) in try db.rows("SELECT member, devices FROM epoch_recipients WHERE zone = ? AND epoch = ?", [zone, epoch], { ($0.text(0), $0.blob(1)) }) {
            let keys = stride(from: 0, to: bytes.count, by: Sodium.publicKeyLength).map { bytes.subdata(in: bytes.startIndex + $0 ..< bytes.startIndex + $0 + Sodium.publicKeyLength) }
            recipients[member] = Set(keys)
        }
        return recipients
    }

    /// A group's history setting (nil: not a group, or not decided yet).
    private func groupHistory(_ zone: String) throws -> GroupMembership.History? {
        try db.first("SELECT history FROM group_state WHERE zone = ?", [zone]) { GroupMembership.History(rawValue: $0.text(0)) } ?? nil
    }
}

/// This device's current epoch of each conversation as the last send decided it, so that the
/// next send in the conversation seals at once instead of reading again who the members are,
/// their devices, the epoch and whom it was shared with (six statements a send).
///
/// A decision stands only while nothing it was made from can have changed: it is kept with the
/// writer connection's change count over the tables it reads (``tables``, moved by any row
/// written there, any rollback — an epoch made in a transaction that is undone is never used —
/// and any other connection's commit) and the key pins' generation (devices added or
/// revoked), both taken after the send's own writes; a send finding either moved decides
/// again from the tables. What it kept is what those tables would say again: every member's
/// devices hold the epoch (``RecordApplier/share(_:key:in:with:devices:recipients:device:origin:readableFrom:)``
/// ran), nobody it was shared with is gone.
final class EpochCache: Sendable {
    /// The tables a decision reads (the pins are weighed by their generation).
    static let tables: Set<String> = ["own_epochs", "sender_keys", "epoch_recipients", "encryption_keys", "group_members", "group_state", "conversations"]

    struct Epoch {
        let epoch: Data
        let key: Data
        let createdAt: Int64
        /// Messages sealed with it so far.
        var messages: Int64
        /// Whose it is: a decision never serves another identity or device.
        let local: String
        let device: Data
    }

    private struct Kept {
        let epoch: Epoch
        let changeCount: UInt64
        let pins: UInt64
    }

    private let decisions = Mutex<[String: Kept]>([:])

    /// The decision kept for `zone`, if nothing it was made from has changed since.
    func kept(in zone: String, local: String, device: Data, db: Database, pins: KeyPins) throws -> Epoch? {
        guard let held = decisions.withLock({ $0[zone] }) else { return nil }
        guard held.changeCount == (try db.changeCount(watching: Self.tables)), held.pins == pins.generation,
              held.epoch.local == local, held.epoch.device == device
        else {
            _ = decisions.withLock { $0.removeValue(forKey: zone) }
            return nil
        }
        return held.epoch
    }

    /// Keeps a decision, as of the writes made so far (the caller's own included).
    func keep(_ epoch: Epoch, in zone: String, db: Database, pins: KeyPins) throws {
        let entry = Kept(epoch: epoch, changeCount: try db.changeCount(watching: Self.tables), pins: pins.generation)
        decisions.withLock { $0[zone] = entry }
    }
}

/// What the key projection gathers over a transaction (``RecordApplier/finish()`` writes it).
struct KeyWork {
    /// Conversations whose sender keys this device shares again: a member or a device appeared
    /// that an epoch was not shared with.
    var zonesToShare = Set<String>()
    /// Other senders' epochs to pass on to this person's other devices.
    var historyToShare = RecordApplier.HistoryToShare.epochs([])
    /// What ``RecordApplier/seal(_:at:)`` sealed in this transaction, by record: the sealed bytes
    /// and the plaintext record they came from. A local change is projected from its plaintext
    /// instead of being opened again.
    var sealedHere: [RecordID: (sealed: Data, plain: Record)] = [:]
}
