import Foundation
import RecordZone
import SQLiteKit

/// Pull: the database change feed names the zones that moved (or a push's catch-up brought it);
/// speakers' own zones first, then the conversations the local speaker takes part in, page by
/// page, each page applied with its token in one transaction.
extension SyncEngine {
    /// - Parameter caughtUp: the feed the push's last batch read, used instead of fetching it
    ///   (its advanced zones are not fetched either); when that batch's transaction found
    ///   nothing else to fetch and stored the token, there is nothing left to do.
    func pull(_ report: inout SyncReport, localSpeaker: String, caughtUp: CaughtUp? = nil) async throws(ConversationError) {
        if caughtUp?.finished == true {
            progress?(SyncProgress(zone: nil, zonesDone: 0, zones: 0, pulled: report.pulled))
            return
        }
        let changes: DatabaseChanges
        if let caughtUp { changes = caughtUp.database } else { changes = try await fetchDatabaseChanges() }
        let advanced = caughtUp?.advanced ?? []
        let plan = try await writeRecoverable { applier in try self.startPull(changes, advanced: advanced, localSpeaker: localSpeaker, applier: &applier) }
        guard let plan else {
            progress?(SyncProgress(zone: nil, zonesDone: 0, zones: 0, pulled: report.pulled))
            return
        }
        let total = plan.speakerZones.count + plan.conversations.count
        try await pullZones(plan.speakerZones, report: &report) { index, zone, pulled in
            SyncProgress(zone: zone.rawValue, zonesDone: index, zones: total, pulled: pulled)
        }
        // Conversations to read again from the start (refetched), whether or not the feed names
        // them — looked for after the speakers' zones, whose revocations and rotations may have
        // just sent some back to be decided again.
        let refetched = try await read { db in try Self.refetched(localSpeaker, in: db) }
        let zones = Set(plan.conversations).union(refetched).sorted()
        try await pullZones(zones, report: &report, overlapping: true) { index, zone, pulled in
            SyncProgress(zone: zone.rawValue, zonesDone: plan.speakerZones.count + index, zones: max(total, plan.speakerZones.count + zones.count), pulled: pulled)
        }
        // Speakers first followed while the conversations were read (a group's members): their
        // profiles and devices in this sync, not the next.
        let newSpeakers = try await read { db in
            try db.rows("SELECT zone FROM ck_zone_state WHERE zone LIKE 's-%' AND token IS NULL AND is_missing = 0 ORDER BY zone") { $0.text(0) }
        }
            .compactMap { try? ZoneName($0) }
        try await pullZones(newSpeakers, report: &report)
        let done = plan.speakerZones.count + zones.count + newSpeakers.count
        progress?(SyncProgress(zone: nil, zonesDone: done, zones: done, pulled: report.pulled))
        try await writeRecoverable { applier in
            for zone in changes.deletedZones {
                try applier.db.execute("UPDATE ck_zone_state SET token = NULL, is_created = 0 WHERE zone = ?", [zone.rawValue])
            }
            try self.finishPull(at: changes.token, in: applier.db)
        }
    }

    /// The zones a pull fetches, in order.
    struct PullPlan {
        /// Speakers' own zones, first: who holds which keys and devices is decided there
        /// before a conversation's records are read.
        var speakerZones: [ZoneName]
        /// The conversations the feed names that the local speaker takes part in.
        var conversations: [ZoneName]
    }

    /// The first step of a pull, in a write transaction: follows the speakers the feed's
    /// conversations name (the store follows only the speakers it knows: its own, the other side
    /// of each of its conversations, those found by a query) and plans what to fetch — nothing
    /// of the zones in `advanced`. - Returns: nil when there is nothing to fetch at all; the
    /// pull is then finished in this transaction (the feed's token stored).
    nonisolated func startPull(_ changes: DatabaseChanges, advanced: Set<ZoneName>, localSpeaker: String, applier: inout RecordApplier) throws -> PullPlan? {
        let conversations = changes.changedZones.filter { Self.isFollowedConversation($0, localSpeaker) }
        let changed = Set(changes.changedZones).subtracting(advanced)
        try applier.follow(localSpeaker)
        for zone in conversations.flatMap(ChatRecords.speakerZones(of:)) { try applier.follow(zone: zone) }
        // New: never read, and not found missing (that one is read when the feed names it).
        let followed = try applier.db.rows("SELECT zone, token IS NULL AND is_missing = 0 FROM ck_zone_state WHERE zone LIKE 's-%' ORDER BY zone") { ($0.text(0), $0.int(1) != 0) }
        let plan = PullPlan(speakerZones: followed.compactMap { name, isNew in (try? ZoneName(name)).flatMap { isNew || changed.contains($0) ? $0 : nil } },
                            conversations: changed.intersection(conversations).sorted())
        guard plan.speakerZones.isEmpty, plan.conversations.isEmpty, changes.deletedZones.isEmpty,
              try Self.refetched(localSpeaker, in: applier.db).isEmpty else { return plan }
        try finishPull(at: changes.token, in: applier.db)
        return nil
    }

    /// The conversations to read again from the start: created, taking part, and no token.
    static func refetched(_ localSpeaker: String, in db: Database) throws -> [ZoneName] {
        try db.rows("SELECT zone FROM ck_zone_state WHERE (zone LIKE 'c-%' OR zone LIKE 'g-%') AND token IS NULL AND is_created = 1") { $0.text(0) }
            .compactMap { try? ZoneName($0) }.filter { isFollowedConversation($0, localSpeaker) }
    }

    /// The conversation zones a store reads: its pairs (by name), and every group the backend
    /// lets it see — whether the local speaker is in one is decided from the group's changes.
    static func isFollowedConversation(_ zone: ZoneName, _ localSpeaker: String) -> Bool {
        ChatRecords.isParticipant(localSpeaker, in: zone) || ChatRecords.isGroupZone(zone)
    }

    /// The end of a whole pull: the feed's token, and when it was read.
    nonisolated func finishPull(at token: ChangeToken, in db: Database) throws {
        try db.execute("INSERT INTO ck_meta (key, value) VALUES ('database_token', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", [token.data])
        try db.execute("INSERT INTO ck_meta (key, value) VALUES ('last_sync_at', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                       [Self.milliseconds(configuration.now())])
    }

    /// The database token of the last whole pull (nil before the first).
    nonisolated func storedDatabaseToken() async throws(ConversationError) -> ChangeToken? {
        try await database.read { db in
            try db.first("SELECT value FROM ck_meta WHERE key = 'database_token'") { ChangeToken(data: $0.blob(0)) }
        }
    }

    /// The database feed since the store's token (from the start when the token expired).
    func fetchDatabaseChanges() async throws(ConversationError) -> DatabaseChanges {
        let token = try await storedDatabaseToken()
        do {
            return try await backend.fetchDatabaseChanges(since: token)
        } catch where error.code == .changeTokenExpired {
            do { return try await backend.fetchDatabaseChanges(since: nil) } catch {
                throw ConversationError.backend(error, "cannot fetch the database changes")
            }
        } catch {
            throw ConversationError.backend(error, "cannot fetch the database changes")
        }
    }

    /// Zones pulled one after another, in order.
    /// - Parameters:
    ///   - overlapping: the first page of each zone fetched while the last page of the one
    ///     before is applied (``pullZone(_:report:handed:next:)``) — for conversations only.
    ///     Speakers' zones hold the key records: each is applied, its pins stored and published,
    ///     before the next one's records are admitted against them.
    ///   - progress: what to report as each zone starts, given its index and the count pulled so far.
    func pullZones(_ zones: [ZoneName], report: inout SyncReport, overlapping: Bool = false,
                   progress made: ((Int, ZoneName, Int) -> SyncProgress)? = nil) async throws(ConversationError) {
        var handed: PageAhead?
        defer { handed?.cancel() }
        for (index, zone) in zones.enumerated() {
            if let made { progress?(made(index, zone, report.pulled)) }
            let next = overlapping && index + 1 < zones.count ? zones[index + 1] : nil
            let given = handed
            handed = nil
            do {
                handed = try await pullZone(zone, report: &report, handed: given, next: next)
            } catch {
                given?.cancel()   // if it failed before taking the page
                throw error
            }
        }
    }

    /// A zone's page fetched ahead of its turn (its signatures checked on every core), from the
    /// token the zone held then.
    struct PageAhead {
        let zone: ZoneName
        let since: ChangeToken?
        let page: Task<Result<ZoneChanges, RecordZoneError>, Never>

        func cancel() { page.cancel() }
    }

    /// The zone's token, as stored.
    nonisolated func storedToken(of zone: ZoneName) async throws(ConversationError) -> ChangeToken? {
        try await read { db in
            try db.first("SELECT token FROM ck_zone_state WHERE zone = ?", [zone.rawValue]) { $0.optionalBlob(0).map(ChangeToken.init(data:)) } ?? nil
        }
    }

    /// A fetch of the page after `token`, started now.
    func fetchAhead(_ zone: ZoneName, since token: ChangeToken?) -> PageAhead {
        let backend = backend, limit = configuration.pageSize
        return PageAhead(zone: zone, since: token, page: Task { () async -> Result<ZoneChanges, RecordZoneError> in
            do throws(RecordZoneError) { return .success(try await backend.fetchChanges(in: zone, since: token, limit: limit)) } catch { return .failure(error) }
        })
    }

    /// Reads a zone page by page, each applied with its token in one transaction.
    /// - Parameters:
    ///   - handed: this zone's first page, fetched while the zone before was applied: used when
    ///     it was fetched from the token the zone still holds, dropped otherwise.
    ///   - next: the zone to read after this one, whose first page is fetched while this one's
    ///     last page is applied.
    /// - Returns: that first page of `next`, for its turn.
    @discardableResult
    func pullZone(_ zone: ZoneName, report: inout SyncReport, handed: PageAhead? = nil, next: ZoneName? = nil) async throws(ConversationError) -> PageAhead? {
        var token = try await storedToken(of: zone)
        // Damaged files this pull still finds; quarantine rows for the zone's other ones are
        // resolved at its end (the file was repaired, or read whole since).
        var damaged = Set<String>()
        var rereading = false
        // The next page, fetched (its signatures checked on every core) while the writer applies
        // this one: the two overlap instead of taking turns.
        var ahead: Task<Result<ZoneChanges, RecordZoneError>, Never>?
        if let handed {
            if handed.zone == zone, handed.since == token { ahead = handed.page } else { handed.cancel() }
        }
        // The next zone's first page, once this zone's last one is fetched.
        var nextAhead: PageAhead?
        var handingOver = false
        defer {
            ahead?.cancel()
            if !handingOver { nextAhead?.cancel() }
        }
        while true {
            let page: ZoneChanges
            do {
                if let next = ahead {
                    ahead = nil
                    // A cancelled sync cancels the fetch it waits for, as it would its own.
                    page = try await withTaskCancellationHandler { await next.value } onCancel: { next.cancel() }.get()
                } else {
                    page = try await backend.fetchChanges(in: zone, since: token, limit: configuration.pageSize)
                }
            } catch where error.code == .changeTokenExpired {
                // The zone was deleted and recreated: drop what came from the old incarnation
                // (unsent changes stay) and fetch the zone whole again.
                try await writeRecoverable { applier in
                    try CacheReset.drop(zone: zone.rawValue, keeping: applier.localSpeaker ?? "", in: applier.db)
                }
                token = nil
                report.refetchedZones += 1
                continue
            } catch where error.code == .zoneNotFound {
                // Not there yet (a speaker who never set up): looked for again when the feed names it.
                if ChatRecords.isSpeakerZone(zone) {
                    try await writeRecoverable { applier in try applier.db.execute("UPDATE ck_zone_state SET is_missing = 1 WHERE zone = ?", [zone.rawValue]) }
                }
                return nil
            } catch {
                throw ConversationError.backend(error, "cannot fetch changes of \(zone)")
            }
            let finished = !page.moreComing
            let pageDamage = page.rejected.filter { $0.reason.code == .corruptSegment }.map(\.source)
            damaged.formUnion(pageDamage)
            let stillDamaged = damaged
            if page.moreComing {
                ahead = fetchAhead(zone, since: page.token).page
            } else if let next, nextAhead == nil {
                nextAhead = fetchAhead(next, since: try await storedToken(of: next))
            }
            let counts = try await writeRecoverable { applier in
                let applied = try Self.apply(page, of: zone, applier: &applier)
                if finished {
                    let placeholders = Array(repeating: "?", count: stillDamaged.count).joined(separator: ",")
                    try applier.db.execute("DELETE FROM ck_quarantine WHERE code = ? AND substr(source, 1, ?) = ?"
                                           + (stillDamaged.isEmpty ? "" : " AND source NOT IN (\(placeholders))"),
                                           [RejectionReason.Code.corruptSegment.rawValue, Int64(zone.rawValue.utf8.count + 1), zone.rawValue + "/"] + stillDamaged.map { $0 })
                }
                return (applied, applier.quarantinedCount)
            }
            note(page, applied: counts.0, quarantined: counts.1, in: &report)
            token = page.token
            // The local speaker's membership of this group grew while it was read (added again,
            // or a late change decided its runs anew): the applier dropped the zone's token, and
            // it is read again from the start — once — for what a server did not show it before.
            if !rereading, ChatRecords.isGroupZone(zone),
               try await read({ db in try db.first("SELECT token IS NULL FROM ck_zone_state WHERE zone = ?", [zone.rawValue]) { $0.int(0) != 0 } }) == true {
                ahead?.cancel()
                ahead = nil
                nextAhead?.cancel()
                nextAhead = nil
                rereading = true
                token = nil
                continue
            }
            if !page.moreComing {
                handingOver = true
                return nextAhead
            }
        }
    }

    /// A page's records applied (a fetched page's or a pushed one's), what it held back
    /// quarantined, and its token kept. - Returns: how many records were applied.
    nonisolated static func apply(_ page: ZoneChanges, of zone: ZoneName, applier: inout RecordApplier) throws -> Int {
        var applied = 0
        for record in page.records where try applier.apply(record, origin: .remote) { applied += 1 }
        for rejected in page.rejected {
            // A damaged file is reported by every pull until it is whole: one row for it.
            if rejected.reason.code == .corruptSegment,
                try applier.db.first("SELECT 1 FROM ck_quarantine WHERE code = ? AND source = ?", [rejected.reason.code.rawValue, rejected.source], { _ in true }) != nil {
                continue
            }
            try applier.quarantine(rejected)
        }
        try applier.db.execute("""
            INSERT INTO ck_zone_state (zone, token, is_created) VALUES (?, ?, 1)
            ON CONFLICT (zone) DO UPDATE SET token = excluded.token, is_created = 1, is_missing = 0
            """, [zone.rawValue, page.token.data])
        return applied
    }

    /// What an applied page adds to the report: its counts, clocks ahead, whose records were held back.
    nonisolated func note(_ page: ZoneChanges, applied: Int, quarantined: Int, in report: inout SyncReport) {
        report.pulled += applied
        report.quarantined += quarantined
        report.clocksAhead += observe(page.records)
        for rejection in page.rejected {
            if let line = Self.blockedLine(rejection), !report.blocked.contains(line) { report.blocked.append(line) }
        }
    }

    /// Pages a stream pushed (``LiveChanges``), applied in one transaction as fetched pages are
    /// (a pushed record is as untrusted as a fetched one: the backend verified each, the
    /// applier decides it) — each only where the zone's stored token is the page's `since`. The
    /// push's catch-up or a pull may have taken the zone elsewhere: a page that ends where the
    /// store stands is already held (the store's own versions, pushed back); any other is left,
    /// and the zone named to be followed again from the store's token. A group the local
    /// speaker's membership of grew is read again from its beginning, by request.
    /// - Returns: what was applied, and the zones to follow again, each from its stored token.
    func applyPushed(_ pages: [PushedPage], backend: any RecordZoneBackend) async throws(ConversationError) -> (report: SyncReport, diverged: [ZoneName: ChangeToken?]) {
        begin(backend)
        defer { end() }
        let (applied, diverged) = try await writeRecoverable { applier in
            var applied = [(ZoneChanges, Int, Int)](), diverged = [ZoneName: ChangeToken?]()
            for page in pages {
                let stored = try applier.db.first("SELECT token FROM ck_zone_state WHERE zone = ?", [page.zone.rawValue]) { $0.optionalBlob(0).map(ChangeToken.init(data:)) }
                // A zone this store does not follow (any more), or one being read from its beginning.
                guard let stored, let token = stored else { continue }
                guard token == page.since else {
                    if token != page.changes.token { diverged[page.zone] = token }
                    continue
                }
                diverged[page.zone] = nil
                let before = applier.quarantinedCount
                let count = try Self.apply(page.changes, of: page.zone, applier: &applier)
                applied.append((page.changes, count, applier.quarantinedCount - before))
            }
            return (applied, diverged)
        }
        var report = SyncReport()
        for (page, count, held) in applied { note(page, applied: count, quarantined: held, in: &report) }
        // The transaction's end decided the groups: a token dropped there is read again.
        let groups = Set(pages.map(\.zone)).filter(ChatRecords.isGroupZone).sorted()
        let reread = applied.isEmpty ? [] : try await read { db in
            try groups.filter { zone in try db.first("SELECT token IS NULL FROM ck_zone_state WHERE zone = ?", [zone.rawValue]) { $0.int(0) != 0 } == true }
        }
        try await pullZones(reread, report: &report)
        return (report, diverged)
    }
}

/// A page a stream pushed, waiting for the continuous sync's round to apply it.
struct PushedPage: Sendable {
    let zone: ZoneName
    let since: ChangeToken?
    let changes: ZoneChanges
}
