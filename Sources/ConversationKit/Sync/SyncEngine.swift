import Foundation
import RecordZone
import SQLiteKit

/// How far a ``ConversationStore/sync(progress:)`` has come: the zone it pulls now (nil at the
/// end), how many of the zones it pulls are done, and the records pulled so far.
public struct SyncProgress: Sendable, Hashable {
    public let zone: String?
    public let zonesDone: Int
    public let zones: Int
    public let pulled: Int
}

/// What one ``ConversationStore/sync()`` did.
public struct SyncReport: Sendable, Hashable {
    /// Local versions the backend accepted.
    public var pushed = 0
    /// Local versions the backend refused for good (their messages are marked failed).
    public var failed = 0
    /// Local versions left in the outbox for a later retry (transient errors).
    public var deferred = 0
    /// Remote versions applied to the cache.
    public var pulled = 0
    /// Records refused on the way in.
    public var quarantined = 0
    /// Zones fetched again from the start after their token expired.
    public var refetchedZones = 0
    /// Other speakers' avatars downloaded into the image cache.
    public var avatarsDownloaded = 0
    /// Files downloaded during the sync (``StoreConfiguration/fileDownload``).
    public var filesDownloaded = 0
    /// Versions received with a clock more than ``StoreConfiguration/clockSkewTolerance`` ahead of
    /// this machine's wall clock (a writer whose clock is fast): applied, flagged, not followed.
    public var clocksAhead = 0
    /// Whose records this sync held back, and why: an identity claimed with unrelated keys, a
    /// key that does not speak for its identity, a revoked or uncertified device, a damaged file
    /// in a folder (by its path). One entry each.
    public var blocked: [Blocked] = []

    /// What a sync held back: whose records or which file, why as a code, and for people.
    public struct Blocked: Sendable, Hashable, CustomStringConvertible {
        /// The identity, or the record or file, held back.
        public let subject: String
        public let code: RejectionReason.Code
        /// `subject: reason`.
        public let description: String
    }
}

/// Pushes the outbox and pulls changes. One sync runs at a time (an actor); reads of the store
/// go on meanwhile on the reader connection.
///
/// Push: outbox rows in order, in batches within the backend's limits, each answered per
/// record — accepted (row removed, message synced), refused for good (row removed, message
/// failed with the reason) or transient (retried later with exponential backoff and jitter).
/// A version is pushed by its record ID, so a push repeated after a crash saves the same
/// version again and never duplicates a message.
///
/// Pull: the database change feed names the zones that moved; the own zones of the speakers the
/// store follows come first, then each conversation the local speaker takes part in: pages of
/// changes (verified by the backend's reader with the store's policy, signatures in parallel)
/// are applied with their new token in one transaction, so a crash never skips or repeats a
/// change.
actor SyncEngine {
    let database: StoreDatabase
    let configuration: StoreConfiguration
    /// The image cache, from which the assets records reference are uploaded.
    let images: AssetFolder
    /// The file cache, from which messages' files are uploaded (`Files/`).
    let files: String
    /// The backend of the syncs in progress, let go when the last one ends (the store's
    /// `close()` then releases it).
    private var connected: (any RecordZoneBackend)?
    private var callsInProgress = 0
    /// Told of each zone a whole sync pulls.
    var progress: (@Sendable (SyncProgress) -> Void)?

    func begin(_ backend: any RecordZoneBackend) {
        connected = backend
        callsInProgress += 1
    }

    func end() {
        callsInProgress -= 1
        if callsInProgress == 0 { connected = nil }
    }
    var backend: any RecordZoneBackend {
        guard let connected else { preconditionFailure("the backend is set at the start of every sync") }
        return connected
    }

    /// The store's clock, which observes every clock the pulls bring (up to the skew tolerance).
    let clock: HybridLogicalClock

    init(database: StoreDatabase, configuration: StoreConfiguration, images: AssetFolder, files: String, clock: HybridLogicalClock) {
        self.database = database
        self.configuration = configuration
        self.images = images
        self.files = files
        self.clock = clock
    }

    /// The hybrid logical clock's rule: the store's clock moves past every clock it receives,
    /// so what it writes next wins over what it has seen — but only up to the skew tolerance
    /// past its wall clock: a writer hours fast does not drag everyone's clocks hours ahead.
    /// - Returns: how many of `records` came from more than the tolerance in the future.
    nonisolated func observe(_ records: [Record]) -> Int {
        guard let newest = records.map(\.clock).max() else { return 0 }
        let bound = RecordClock(milliseconds: UInt64(max(0, (configuration.now().timeIntervalSince1970 + configuration.clockSkewTolerance) * 1000)), counter: UInt16.max)
        clock.observe(min(newest, bound))
        return newest > bound ? records.filter { $0.clock > bound }.count : 0
    }

    func sync(localSpeaker: String, deviceKey: Data, backend: any RecordZoneBackend,
              progress: (@Sendable (SyncProgress) -> Void)? = nil) async throws(ConversationError) -> SyncReport {
        self.progress = progress
        defer { self.progress = nil }
        begin(backend)
        defer { end() }
        var report = SyncReport()
        let logger = configuration.logger
        do throws(ConversationError) {
            let caughtUp = try await push(&report, localSpeaker: localSpeaker, catchingUp: true)
            try await pull(&report, localSpeaker: localSpeaker, caughtUp: caughtUp)
            // What the pull committed on its own — keys shared with a device or member it
            // learned of — goes out in the same sync: the others read it after their next pull.
            if try await outboxDue() { _ = try await push(&report, localSpeaker: localSpeaker, catchingUp: false) }
            try await failRevoked(localSpeaker: localSpeaker, deviceKey: deviceKey)
        } catch {
            logger.warning("sync stopped: \(error)")
            throw error
        }
        logger.info("synced: pushed \(report.pushed), pulled \(report.pulled), failed \(report.failed), deferred \(report.deferred), quarantined \(report.quarantined)")
        for line in report.blocked { logger.notice("held back: \(line)") }
        if report.clocksAhead > 0 { logger.notice("\(report.clocksAhead) versions came from a clock more than \(Int(configuration.clockSkewTolerance)) s ahead of this machine's") }
        return report
    }

    /// Whether the database feed names any zone as changed or deleted since the store's last
    /// pull (a look that writes nothing: an idle poll of the continuous sync costs just this).
    func databaseMoved(backend: any RecordZoneBackend) async throws(ConversationError) -> Bool {
        let token = try await storedDatabaseToken()
        guard let token else { return true }
        do {
            let changes = try await backend.fetchDatabaseChanges(since: token)
            return !changes.changedZones.isEmpty || !changes.deletedZones.isEmpty
        } catch where error.code == .changeTokenExpired {
            return true
        } catch {
            throw ConversationError.backend(error, "cannot fetch the database changes")
        }
    }

    /// Whether an outbox entry is due for a push (a new change, or a retry whose time came).
    nonisolated func outboxDue() async throws(ConversationError) -> Bool {
        let now = Self.milliseconds(configuration.now())
        return try await database.read { db in try Outbox.hasDue(at: now, in: db) }
    }

    /// Pushes the outbox only (a local change to send at once).
    func pushOnly(localSpeaker: String, backend: any RecordZoneBackend) async throws(ConversationError) -> SyncReport {
        begin(backend)
        defer { end() }
        var report = SyncReport()
        _ = try await push(&report, localSpeaker: localSpeaker, catchingUp: false)
        return report
    }

    /// Pulls the given zones only (a long poll said they moved), without the database feed.
    func pull(zones: [ZoneName], backend: any RecordZoneBackend) async throws(ConversationError) -> SyncReport {
        begin(backend)
        defer { end() }
        var report = SyncReport()
        try await pullZones(zones.sorted(), report: &report)
        return report
    }

    /// Once this device learns it was revoked, what it signed after the revocation is marked
    /// failed (a folder may have taken it, but no reader will) and never pushed again.
    private func failRevoked(localSpeaker: String, deviceKey: Data) async throws(ConversationError) {
        guard let revokedAfter = database.policy.pins.chain(for: localSpeaker)?.device(deviceKey)?.revokedAfter else { return }
        try await failSigned(by: [deviceKey], after: Int64(bitPattern: revokedAfter.rawValue),
                             why: "this device was revoked; nobody accepts what it signs after \(revokedAfter)")
    }

    /// Marks the messages `keys` signed (after `clock`, or all of them) failed with
    /// ``SyncFailure/Code/deviceRevoked`` (the cause, even of one a backend refused or a folder
    /// took first), and takes every version they signed out of the outbox.
    private func failSigned(by keys: Set<Data>, after clock: Int64 = .min, why: String) async throws(ConversationError) {
        let failure = SyncFailure(.deviceRevoked, message: why)
        try await write { applier in
            for key in keys {
                let late = try applier.db.rows("""
                    SELECT m.zone, m.name FROM messages m JOIN ck_records r ON r.zone = m.zone AND r.name = m.name
                    WHERE r.author = ? AND r.clock > ? AND coalesce(m.sync_error_code, '') != ?
                    """, [key, clock, failure.storedCode]) { ($0.text(0), $0.text(1)) }
                for (zone, name) in late {
                    try applier.fail(MessageID(conversation: zone, name: name), failure)
                }
                try Outbox.removeSigned(by: key, after: clock, in: applier.db)
            }
        }
    }

    /// What a push does when the server refuses who signs it: a revoked device's messages fail
    /// for good (``SyncFailure/Code/deviceRevoked``); otherwise (a clock too far off, a key it
    /// does not hold) they wait in the outbox with the reason, and the sync says why.
    private func refusedAuthentication(_ error: RecordZoneError, sending entries: [OutboxEntry], signedBy keys: Set<Data>) async throws(ConversationError) -> ConversationError {
        if error.authentication == .deviceRevoked {
            try await failSigned(by: keys, why: "this device was revoked; the server accepts nothing it signs")
        } else {
            try await reschedule(entries, error: error)
        }
        return ConversationError.backend(error, "push refused")
    }

    // MARK: Push

    /// What the last batch of a push learned of the database (``SaveCatchUp``): the feed since
    /// the store's database token, and the zones whose token the batch moved past its own
    /// versions (nothing else came between), which the pull need not fetch.
    struct CaughtUp {
        var database: DatabaseChanges
        var advanced: Set<ZoneName>
        /// The batch was the push's last and its transaction found nothing else to fetch: the
        /// pull is done (its token stored with the batch).
        var finished: Bool
    }

    /// Pushes the outbox. - Parameter catchingUp: whether to ask each save for the database
    /// feed since the store's token (a whole sync, whose pull then uses it).
    /// - Returns: what the last batch learned, when it told the feed.
    private func push(_ report: inout SyncReport, localSpeaker: String, catchingUp: Bool) async throws(ConversationError) -> CaughtUp? {
        let databaseToken = catchingUp ? try await storedDatabaseToken() : nil
        var attempted = Set<OutboxEntry.Version>()
        var caughtUp: CaughtUp?
        while true {
            let now = Self.milliseconds(configuration.now())
            let batchSize = min(configuration.pushBatchSize, Record.maximumBatchSize)
            let entries = try await read { db in try Outbox.due(at: now, limit: batchSize * 4, in: db) }.filter { !attempted.contains($0.version) }.prefix(batchSize)
            guard !entries.isEmpty else { return caughtUp }
            for entry in entries { attempted.insert(entry.version) }
            caughtUp = nil

            var records = [Record](), sent = [OutboxEntry]()
            for entry in entries {
                guard let data = entry.record else {
                    // A pulled version took the queued one's place: it is what the backend holds.
                    try await write { applier in _ = try Outbox.remove(entry, in: applier.db) }
                    continue
                }
                if let record = try? Record(canonical: data) {
                    records.append(record)
                    sent.append(entry)
                } else {
                    try await write { applier in
                        try Outbox.remove(entry, in: applier.db)
                        try applier.quarantine(RejectedRecord(recordID: nil, reason: .malformed("unreadable outbox entry"), source: "outbox", data: data))
                    }
                }
            }
            // What never goes out: a message whose file left the cache before it was uploaded,
            // and whatever the other participant of a pair no longer takes (they blocked us).
            var withheld = [RecordID: SyncFailure]()
            for id in await filesGone(records) {
                withheld[id] = SyncFailure(.fileMissing, message: "its file left this device's cache before it was uploaded: nobody could download it")
            }
            for (id, blocker) in try await blockedWrites(records, localSpeaker: localSpeaker) {
                withheld[id] = SyncFailure(.blocked, message: "\(blocker) blocked \(localSpeaker): nothing more of theirs goes into this conversation")
            }
            if !withheld.isEmpty {
                let failed = zip(sent, records).compactMap { entry, record in withheld[record.id].map { (entry, record, $0) } }
                try await write { applier in
                    for (entry, record, failure) in failed {
                        try Outbox.remove(entry, in: applier.db)
                        guard record.recordType == ChatRecords.messageType else { continue }
                        try applier.fail(MessageID(conversation: record.id.zone.rawValue, name: record.id.name), failure)
                    }
                }
                report.failed += failed.count
                let kept = zip(sent, records).filter { withheld[$0.1.id] == nil }
                sent = kept.map(\.0)
                records = kept.map(\.1)
                if records.isEmpty { continue }
            }
            // A group's zone is made by its creator only; a member writes into it as it is.
            let own = Set(records.map(\.id.zone)).filter { GroupMembership.creatorHash(of: $0).map { $0 == ChatRecords.identityHash(localSpeaker) } ?? true }
            if let refusal = try await ensureZonesExist(own) {
                throw try await refusedAuthentication(refusal, sending: sent, signedBy: Set(records.map(\.authorKey)))
            }
            let answer: SaveAnswer
            do {
                // The assets they reference first (an avatar, a message's file), so no reader
                // sees a reference before its bytes.
                try await uploadFiles(of: records)
                try await uploadAssets(of: records)
                answer = try await backend.save(records, policy: .merge, catchingUpFrom: databaseToken)
            } catch {
                if error.code == .notAuthenticated {
                    throw try await refusedAuthentication(error, sending: sent, signedBy: Set(records.map(\.authorKey)))
                }
                if error.code == .notAuthorized {
                    // A backend that takes no writes at all (a folder observer): the changes
                    // wait in the outbox, and the pull goes on.
                    configuration.logger.notice("the backend takes no writes: \(error)")
                    report.deferred += sent.count
                    return nil
                }
                guard error.isTransient else { throw ConversationError.backend(error, "push failed") }
                try await reschedule(sent, error: error)
                report.deferred += sent.count
                throw ConversationError.backend(error, "push failed, will retry")
            }
            guard answer.results.count == records.count else {
                throw ConversationError.backend(RecordZoneError(.malformed, "the backend answered \(answer.results.count) results for \(records.count) records"), "push failed")
            }
            let settled = zip(sent, zip(records, answer.results)).map { ($0, $1.0, $1.1) }
            let advances = answer.catchUp.zones, feed = answer.catchUp.database
            let (counts, advanced, finished) = try await writeRecoverable { applier in
                var counts = SyncReport()
                for (entry, record, result) in settled {
                    try self.settle(entry, record, result, applier: &applier, report: &counts)
                }
                // A zone whose token stood where the batch began holds, with the batch's
                // versions (now applied), everything up to where it ended: no fetching back.
                // Only zones this store pulls (its followed speakers' own zones, its
                // conversations): never the directory it writes its profile into but only queries.
                var advanced = Set<ZoneName>()
                for advance in advances where ChatRecords.isSpeakerZone(advance.zone) || Self.isFollowedConversation(advance.zone, localSpeaker) {
                    try applier.db.execute("UPDATE ck_zone_state SET token = ? WHERE zone = ? AND token IS ?", [advance.to.data, advance.zone.rawValue, advance.from?.data])
                    if applier.db.changes > 0 { advanced.insert(advance.zone) }
                }
                // The push's last batch, and nothing else to fetch: the sync ends with this
                // transaction (the one-by-one send's path: a save, and one write here).
                guard let feed, try !Outbox.hasDue(at: now, in: applier.db) else { return (counts, advanced, false) }
                return (counts, advanced, try self.startPull(feed, advanced: advanced, localSpeaker: localSpeaker, applier: &applier) == nil)
            }
            report.pushed += counts.pushed
            report.failed += counts.failed
            report.deferred += counts.deferred
            caughtUp = feed.map { CaughtUp(database: $0, advanced: advanced, finished: finished) }
        }
    }

    /// The local speaker's versions among `records` that the other participant of their pair
    /// conversation refuses: they block the local speaker (their `Block` record stands). Its
    /// own blocks and tombstones still go. - Returns: each version's ID, with who blocks.
    private func blockedWrites(_ records: [Record], localSpeaker: String) async throws(ConversationError) -> [RecordID: String] {
        let candidates = records.filter { $0.recordType != ChatRecords.blockType && !$0.isDeleted && ChatRecords.isPairZone($0.id.zone) }
        guard !candidates.isEmpty else { return [:] }
        let zones = Set(candidates.map(\.id.zone.rawValue))
        // The zone's `block-…` names: a range of its primary key, never a scan of the zone.
        let prefix = ChatRecords.blockPrefix, end = String(prefix.dropLast()) + "."
        let blockers = try await read { db in
            try zones.reduce(into: [String: String]()) { found, zone in
                found[zone] = try db.first("SELECT name FROM ck_records WHERE zone = ? AND name > ? AND name < ? AND name != ? AND type = ? AND is_deleted = 0",
                                           [zone, prefix, end, prefix + localSpeaker, ChatRecords.blockType]) { String($0.text(0).dropFirst(prefix.count)) }
            }
        }
        return candidates.reduce(into: [RecordID: String]()) { found, record in found[record.id] = blockers[record.id.zone.rawValue] }
    }

    private nonisolated func settle(_ entry: OutboxEntry, _ record: Record, _ result: Result<Record, RecordZoneError>,
                                    applier: inout RecordApplier, report: inout SyncReport) throws {
        let db = applier.db
        let isMessage = record.recordType == ChatRecords.messageType
        let zone = record.id.zone.rawValue, name = record.id.name
        switch result {
        case .success(let winner):
            let unchanged = try Outbox.remove(entry, in: db)
            if winner.signature != record.signature {
                try applier.apply(winner, origin: .remote)  // another version won the merge
            }
            if unchanged, isMessage {
                try db.execute("UPDATE messages SET sync_state = ?, sync_error = NULL, sync_error_code = NULL WHERE zone = ? AND name = ?", [SyncStateColumn.synced.rawValue, zone, name])
                applier.note(.syncStateChanged(MessageID(conversation: zone, name: name)))
            }
            report.pushed += 1
        case .failure(let error) where error.isTransient || error.code == .zoneNotFound:
            try reschedule([entry], error: error, in: db)
            report.deferred += 1
        case .failure(let error):
            try Outbox.remove(entry, in: db)
            if isMessage { try applier.fail(MessageID(conversation: zone, name: name), SyncFailure(refusal: error)) }
            report.failed += 1
        }
    }

    /// Uploads the assets the records reference, from the image cache. One this store does not
    /// hold (its cache was emptied by hand) is left out: readers then report it missing.
    private func uploadAssets(of records: [Record]) async throws(RecordZoneError) {
        var seen = Set<Data>()
        for record in records {
            for case .asset(let reference) in record.fields.values where seen.insert(reference.hash).inserted {
                guard let data = try? images.get(reference) else { continue }
                _ = try await backend.putAsset(data, expected: reference)
            }
        }
    }

    private func reschedule(_ entries: [OutboxEntry], error: RecordZoneError) async throws(ConversationError) {
        try await writeRecoverable { applier in try self.reschedule(entries, error: error, in: applier.db) }
    }

    private nonisolated func reschedule(_ entries: [OutboxEntry], error: RecordZoneError, in db: Database) throws {
        let now = configuration.now().timeIntervalSince1970
        for entry in entries {
            let attempts = entry.attempts + 1
            var delay = min(configuration.retryMaximumDelay, configuration.retryBaseDelay * pow(2, Double(attempts - 1)))
            if let serverDelay = error.retryAfter { delay = max(delay, serverDelay) }
            delay *= 0.5 + configuration.random()  // jitter: 50%…150%
            try Outbox.reschedule(entry, next: Self.milliseconds(Date(timeIntervalSince1970: now + delay)), error: error, in: db)
        }
    }

    /// Creates the zones the store has not created yet. - Returns: the server's refusal of who
    /// signs (401), for the push to handle; nil otherwise.
    private func ensureZonesExist(_ zones: Set<ZoneName>) async throws(ConversationError) -> RecordZoneError? {
        let created = Set(try await read { db in try db.rows("SELECT zone FROM ck_zone_state WHERE is_created = 1") { $0.text(0) } })
        for zone in zones.sorted() where !created.contains(zone.rawValue) {
            do {
                try await backend.createZone(zone)
            } catch where error.code == .notAuthorized {
                return nil  // a backend that takes no writes: the save says so
            } catch where error.code == .notAuthenticated {
                return error
            } catch {
                throw ConversationError.backend(error, "cannot create zone \(zone)")
            }
            try await writeRecoverable { applier in
                try applier.db.execute("INSERT INTO ck_zone_state (zone, is_created) VALUES (?, 1) ON CONFLICT (zone) DO UPDATE SET is_created = 1", [zone.rawValue])
            }
        }
        return nil
    }

    // MARK: Helpers

    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws(ConversationError) -> T {
        try await database.read(body)
    }

    func write<T: Sendable>(_ body: @escaping @Sendable (inout RecordApplier) throws -> T) async throws(ConversationError) -> T {
        try await database.write(.synced, body)
    }

    /// A write of what the backend holds and can give again — settled pushes, pulled pages and
    /// their tokens, retry times: committed without a sync of its own (``DatabaseQueue/Durability/deferred``).
    /// A power loss may take it back (never the local changes before it); the next sync then
    /// pushes again what it had settled (the same versions: no duplicates) and fetches again.
    func writeRecoverable<T: Sendable>(_ body: @escaping @Sendable (inout RecordApplier) throws -> T) async throws(ConversationError) -> T {
        try await database.write(.deferred, body)
    }

    static func milliseconds(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1000).rounded()) }

    /// What a refusal says of whose records are held back (nil for one bad record alone).
    static func blockedLine(_ rejection: RejectedRecord) -> SyncReport.Blocked? {
        let subject: String
        switch rejection.reason {
        case .identityConflict(let identity), .keyConflict(let identity), .deviceRevoked(let identity): subject = identity
        case .deviceNotCertified: subject = rejection.recordID.map { "\($0)" } ?? rejection.source
        case .corruptSegment: subject = rejection.source
        default: return nil
        }
        return SyncReport.Blocked(subject: subject, code: rejection.reason.code, description: "\(subject): \(rejection.reason)")
    }
}
