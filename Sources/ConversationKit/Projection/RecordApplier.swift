import Foundation
import RecordZone
import SQLiteKit
import Synchronization

/// Applies record versions to the cache inside a write transaction: the merge rule against the
/// version held, the chat's field rules (``ChatSchema/violation(of:reader:)``), then the
/// projection of the record's type (``Projection``, one file each in this folder) into the
/// tables it owns. Local changes and pulled changes go through the same path, so both sides of
/// a conversation build their tables the same way. The applier itself keeps the records, the
/// followed zones and the quarantine (`ck_records`, `ck_zone_state`, `ck_quarantine`), and
/// collects the events to publish after the commit.
struct RecordApplier {
    enum Origin { case local, remote }

    let db: Database
    var localSpeaker: String?
    /// This device's keys (nil before the store is set up): what the applier signs with when it
    /// commits on its own (key shares) and opens what was shared with this device.
    var device: ConversationStore.LocalIdentity?
    let clock: HybridLogicalClock
    let policy: RecordPolicy
    /// This device's current epochs as the last sends decided them (the store's, across transactions).
    let epochs: EpochCache
    private(set) var events: [StoreEvent] = []
    private(set) var quarantinedCount = 0
    /// Whether this transaction queued a local change for the backend.
    var queuedLocalChange = false
    /// Conversations already ensured in this transaction.
    var ensured = Set<String>()
    /// Whom the local speaker blocks, once read in this transaction (``blocked()``).
    var blockedSpeakers: Set<String>?
    // What each projection gathers over the transaction and writes in ``finish()``.
    var keys = KeyWork()
    var deliveries = DeliveryWork()
    var groups = GroupWork()

    init(db: Database, localSpeaker: String?, device: ConversationStore.LocalIdentity?, clock: HybridLogicalClock, policy: RecordPolicy, epochs: EpochCache) {
        self.db = db
        self.localSpeaker = localSpeaker
        self.device = device
        self.clock = clock
        self.policy = policy
        self.epochs = epochs
    }

    /// What the merge rule weighs a new version of a record against: the version held.
    struct HeldVersion {
        let clock: RecordClock
        let author: Data
        let signature: Data
    }

    /// The version held of `id`, if any.
    func held(_ id: RecordID) throws -> HeldVersion? {
        try db.first("SELECT clock, author, signature FROM ck_records WHERE zone = ? AND name = ?", [id.zone.rawValue, id.name]) { row in
            HeldVersion(clock: RecordClock(rawValue: UInt64(bitPattern: row.int(0))), author: row.blob(1), signature: row.blob(2))
        }
    }

    /// Applies one version. Returns false when it lost the merge or was quarantined.
    /// - Parameter known: the version held, when the caller has just read it (nil: read here).
    @discardableResult
    mutating func apply(_ record: Record, origin: Origin, held known: HeldVersion?? = nil) throws -> Bool {
        let zone = record.id.zone.rawValue, name = record.id.name
        let held = try known ?? self.held(record.id)
        if let held {
            var current = Record(id: record.id, type: record.recordType)
            current.clock = held.clock
            current.authorKey = held.author
            current.signature = held.signature
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
        switch Projection.of[record.recordType] {
        case .speaker: try projectSpeaker(record)
        case .conversation: try projectMember(record)
        case .message: try projectMessage(record, origin: origin)
        case .receipt: try projectReceipt(record)
        case .reaction: try projectReaction(record, origin: origin)
        case .delivery: try projectDelivery(record)
        case .block: try projectBlock(record)
        case .group: try applyGroupChange(record)
        case .key:
            switch record.recordType {
            case EncryptionKey.recordType: try projectEncryptionKey(record)
            case KeyShare.recordType: try projectKeyShare(record, origin: origin)
            default: try projectHistoryShare(record, origin: origin)
            }
        case nil: break  // a type from a newer version: kept in ck_records, not shown
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
        let held = try records.map { try self.held($0.id) }
        if let past = ([after] + held.map { $0?.clock }).compactMap({ $0 }).max(), past >= signingClock, past.rawValue < UInt64.max {
            signingClock = RecordClock(rawValue: past.rawValue + 1)
        }
        var applied = Set<RecordID>()
        for (var record, held) in zip(records, held) {
            // A second version of one record in the batch weighs against the first: read again.
            let known: HeldVersion?? = applied.insert(record.id).inserted ? .some(held) : .none
            guard db.isGrouped else {
                try record.sign(with: key, clock: signingClock)
                try applyLocal(record, held: known)
                continue
            }
            // In a grouped write (group commit), the signature is made on another core while
            // the writer projects the version and runs the writes grouped after it: the version
            // is stored with a blank one (same length) and completed before the commit, so
            // nothing outside the transaction ever reads it blank.
            let signing = DeferredSignature(record, key: key, clock: signingClock)
            record.authorKey = key.publicKey
            record.clock = signingClock
            record.signature = DeferredSignature.blank
            try applyLocal(record, held: known)
            db.beforeCommit.append { db in try signing.complete(in: db) }
        }
    }

    /// Applies an already signed local version and queues it in the outbox.
    /// - Parameter known: the version held, when the caller has just read it (nil: read here).
    mutating func applyLocal(_ record: Record, held known: HeldVersion?? = nil) throws {
        guard try apply(record, origin: .local, held: known) else {
            throw ConversationError(.database, "a local change to \(record.id) lost the merge or was refused")
        }
        try Outbox.enqueue(zone: record.id.zone.rawValue, name: record.id.name, clock: record.clock.rawValue, in: db)
        queuedLocalChange = true
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

    /// Follows a speaker: its own zone (profile, devices, revocations) is pulled from now on.
    func follow(_ identifier: String) throws { try follow(zone: ChatRecords.speakerZone(identifier)) }

    /// Follows a speaker's own zone, known by name (a conversation zone's name holds both hashes).
    func follow(zone: ZoneName) throws {
        try db.execute("INSERT INTO ck_zone_state (zone) VALUES (?) ON CONFLICT (zone) DO NOTHING", [zone.rawValue])
    }

    /// Takes a record held back as `code` out of the quarantine (it is applied now).
    func release(zone: String, name: String, quarantinedAs code: RejectionReason.Code) throws {
        try db.execute("DELETE FROM ck_quarantine WHERE zone = ? AND name = ? AND code = ?", [zone, name, code.rawValue])
    }

    /// Writes what was gathered over the transaction; call once, before the commit.
    mutating func finish() throws {
        let changed = groups.changed
        groups.changed.removeAll()
        for zone in changed.sorted() { try decideGroup(zone) }
        for zone in groups.reread.sorted() { try db.execute("UPDATE ck_zone_state SET token = NULL WHERE zone = ?", [zone]) }
        groups.reread.removeAll()
        let sharing = keys.zonesToShare
        keys.zonesToShare.removeAll()
        for zone in sharing.sorted() { try shareEpochs(in: zone) }
        try shareHistory()
        try finishDeliveries()
        try SearchIndex.catchUp(in: db)
    }

}

/// The projections: the record types each takes and the tables it owns — the only tables its
/// file writes, and no other projection's file writes them (`ProjectionTests` reads the files).
/// A projection that needs another's table asks its owner (a receipt marks its message read
/// through ``RecordApplier/markRead(_:at:byListener:)``).
enum Projection: String, CaseIterable {
    case speaker, conversation, message, receipt, reaction, delivery, block, group, key

    var recordTypes: [String] {
        switch self {
        case .speaker: [ChatRecords.speakerType]
        case .conversation: [ChatRecords.memberType]
        case .message: [ChatRecords.messageType]
        case .receipt: [ChatRecords.receiptType]
        case .reaction: [ChatRecords.reactionType]
        case .delivery: [ChatRecords.deliveryType]
        case .block: [ChatRecords.blockType]
        case .group: [GroupChange.recordType]
        case .key: [EncryptionKey.recordType, KeyShare.recordType, HistoryShare.recordType]
        }
    }

    var tables: [String] {
        switch self {
        case .speaker: ["speakers", "speaker_tags"]
        case .conversation: ["conversations", "conversation_members"]
        case .message: ["messages", "message_mentions", "message_versions", "attachments"]
        case .receipt: ["receipts"]
        case .reaction: ["reactions"]
        case .delivery: ["deliveries", "held_messages"]
        case .block: ["blocked_speakers"]
        case .group: ["group_members", "group_runs", "group_state"]
        case .key: ["encryption_keys", "sender_keys", "own_epochs", "epoch_recipients"]
        }
    }

    /// The projection of each record type.
    static let of: [String: Projection] = Dictionary(uniqueKeysWithValues: allCases.flatMap { projection in projection.recordTypes.map { ($0, projection) } })

    /// The file in `Sources/ConversationKit/Projection/` that projects it.
    var file: String { rawValue.prefix(1).uppercased() + rawValue.dropFirst() + "Projection.swift" }

    /// The tables the applier itself writes.
    static let applierTables = ["ck_records", "ck_zone_state", "ck_quarantine"]
}

/// A local version's signature made on another core while the writer applies the version and
/// runs the writes grouped after it (``RecordApplier/commitLocal(_:signedWith:after:)``), then
/// written over the blank one it was stored with, before the grouped transaction commits.
final class DeferredSignature: Sendable {
    /// What a version waiting for its signature holds instead (as long as a real one).
    static let blank = Data(count: Sodium.signatureLength)

    private let id: RecordID
    private let clock: RecordClock
    private let signed = Mutex<Result<Record, RecordZoneError>?>(nil)
    private let done = DispatchSemaphore(value: 0)

    init(_ record: Record, key: SigningKey, clock: RecordClock) {
        id = record.id
        self.clock = clock
        Self.signatures.async { [self] in
            var record = record
            let outcome = Result { () throws(RecordZoneError) -> Record in
                try record.sign(with: key, clock: clock)
                return record
            }
            signed.withLock { $0 = outcome }
            done.signal()
        }
    }

    /// Where the signatures are made, in order: a serial queue of its own, so a thread wakes
    /// only when it is idle (a wake-up per signature cost the writer about what the signature
    /// did), and never one of the global queues' threads, which Swift's tasks run on here: a
    /// task blocked on the writer, itself waiting for a signature, must not hold the thread
    /// the signature needs.
    private static let signatures = DispatchQueue(label: "conversationkit.signatures", qos: .userInitiated)

    /// Waits for the signature (on the writer's queue, never the cooperative pool) and writes the
    /// signed version over the blank one — nothing when that version was undone with its write.
    func complete(in db: Database) throws {
        done.wait()
        guard let outcome = signed.withLock({ $0 }) else { return }
        let record = try outcome.get()
        try db.execute("UPDATE ck_records SET signature = ?, record = ? WHERE zone = ? AND name = ? AND clock = ? AND signature = ?",
                       [record.signature, try record.encoded(), id.zone.rawValue, id.name, clock.rawValue, Self.blank])
    }
}
