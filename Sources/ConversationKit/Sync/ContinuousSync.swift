import Foundation
import RecordZone
import SQLiteKit
import Synchronization

extension ConversationStore {
    /// Keeps the store in step with its backend until the calling task is cancelled (as
    /// CKSyncEngine schedules sync for its apps): a local change is pushed as soon as it is
    /// committed — by this process, or by another one writing the same store (seen through
    /// SQLite's `data_version`, every 250 ms); a remote change arrives as soon as the backend
    /// tells of it (``LiveChanges``): a zone server pushes it down one stream, memory and a
    /// folder's inotify say which zones moved. A backend that cannot tell (an older server: no
    /// stream; a file system without notifications) is long-polled, one wait per followed zone
    /// (`longPolls`, the default but for folders). Zones that are new (a conversation someone
    /// else started, a group the local speaker was let into) or deleted are in the database feed:
    /// a zone server's stream says when to read it (``LiveChange/feed``); otherwise (memory, a
    /// folder, an older server) the feed is looked at every `pollInterval`. With the stream telling,
    /// `pollInterval` only pushes what is due in the outbox, and the feed is looked at once a
    /// minute (``StreamLink/feedCheck``) for what a server cannot tell (a followed zone made later).
    /// While the backend cannot be reached it backs off (0.5 s doubling to 30 s) and
    /// catches up when it answers; ``StoreEvent/syncActivity(_:)`` reports each round and each
    /// change of reachability.
    /// - Throws: only what stops it for good — ``ConversationError/Code/noLocalSpeaker``, a
    ///   backend that cannot be opened (a folder locked by another process).
    public func run(pollInterval: Duration = .seconds(1), longPolls: Bool? = nil) async throws(ConversationError) {
        let local = try requireIdentity()
        let backend = try backend()
        let useLongPolls = longPolls ?? !(backend is FileSystemBackend)
        let kicks = SyncKicks()
        let rounds = ChangeWaiters()
        let link = StreamLink()
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.watchLocalChanges(kicks) }
            group.addTask { await self.watchOtherProcesses(kicks) }
            group.addTask {
                var checked = ContinuousClock.now
                while !Task.isCancelled {
                    // The feed is looked at each time unless the stream tells when to.
                    if !link.carriesFeed || ContinuousClock.now - checked >= StreamLink.feedCheck {
                        kicks.kick(.poll)
                        checked = .now
                    } else {
                        kicks.kick(.tick)
                    }
                    do { try await Task.sleep(for: pollInterval) } catch { return }
                }
            }
            // A backend that tells of its changes is followed; one that cannot (an older
            // server, a file system without notifications) is long-polled, or left to the polls.
            if let live = backend as? any LiveChanges {
                group.addTask { await self.followStream(live, kicks: kicks, rounds: rounds, link: link, longPolls: useLongPolls) }
            } else if useLongPolls {
                group.addTask { await self.watchZones(backend, kicks: kicks, rounds: rounds) }
            }
            if configuration.sharesPresence, backend.carriesTyping {
                group.addTask { await self.sayOnline(local, backend) }
            }
            await self.runRounds(local, backend, kicks: kicks, rounds: rounds, link: link)
            group.cancelAll()
        }
    }

    /// Runs a round per batch of kicks until cancelled: a poll or a retry is a whole sync, a
    /// local change a push, a moved zone a pull of that zone.
    private func runRounds(_ local: LocalIdentity, _ backend: any RecordZoneBackend, kicks: SyncKicks, rounds: ChangeWaiters, link: StreamLink) async {
        var unreachable = false
        var backoff = 0.5
        while !Task.isCancelled {
            let causes = await kicks.next()
            if Task.isCancelled { return }
            // Pages taken from the stream and not yet applied: a failed round gives them back
            // (the stream moved on past them; nothing else would bring them before the next poll).
            var pages = [PushedPage]()
            do {
                var report: SyncReport
                if causes.contains(.poll) {
                    // A whole sync only when the feed moved (or after a failure); an idle look
                    // writes nothing.
                    var moved = unreachable
                    if !moved { moved = try await engine.databaseMoved(backend: backend) }
                    let due = try await engine.outboxDue()
                    if moved {
                        report = try await sync()
                    } else if due || causes.contains(.localChange) {
                        report = try await engine.pushOnly(localSpeaker: local.identifier, backend: backend)
                    } else {
                        report = SyncReport()
                    }
                } else {
                    report = SyncReport()
                    var push = causes.contains(.localChange)
                    if !push, causes.contains(.tick) { push = try await engine.outboxDue() }
                    if push { report = try await engine.pushOnly(localSpeaker: local.identifier, backend: backend) }
                    // A zone whose token moved since its poll woke (a push's catch-up took it past
                    // this store's own versions) is not fetched: its poll asks again from there.
                    let kicked = causes.compactMap { if case .zone(let zone, let from) = $0 { (zone, from) } else { nil } }
                    let zones = try await read { db in
                        try Set(kicked.filter { zone, from in
                            guard let from else { return true }
                            let stored = try db.first("SELECT token FROM ck_zone_state WHERE zone = ?", [zone.rawValue]) { $0.optionalBlob(0).map(ChangeToken.init(data:)) } ?? nil
                            return stored.map { $0 == from } ?? true
                        }.map(\.0))
                    }.sorted()
                    if !zones.isEmpty { try await absorb(try await engine.pull(zones: zones, backend: backend), into: &report, local, backend) }
                }
                // What the stream pushed, after the push (whose catch-up may already hold it).
                pages = kicks.takePages()
                if !pages.isEmpty {
                    let pushed = try await engine.applyPushed(pages, backend: backend)
                    pages = []
                    link.followAgain(pushed.diverged)
                    try await absorb(pushed.report, into: &report, local, backend)
                }
                reachability.withLock { $0 = true }
                if unreachable {
                    unreachable = false
                    database.hub.publish([.syncActivity(.reachable)])
                }
                backoff = 0.5
                if report != SyncReport() { database.hub.publish([.syncActivity(.synced(report))]) }
            } catch {
                kicks.giveBack(pages)
                let refused = error.code == .notAuthenticated || error.code == .deviceRevoked
                reachability.withLock { $0 = refused }
                configuration.logger.warning("\(refused ? "the backend does not accept this device" : "backend unreachable"), backing off \(backoff) s: \(error)")
                if !unreachable {
                    unreachable = true
                    database.hub.publish([.syncActivity(refused ? .notAccepted(error.code, error.message) : .unreachable(error.description))])
                }
                kicks.kick(.poll)  // catch up whole once it answers
                do { try await Task.sleep(for: .milliseconds(Int(backoff * 1000))) } catch { return }
                backoff = min(30, backoff * 2)
            }
            rounds.wake(Self.roundSignal)
        }
    }

    private static let roundSignal = ChatRecords.constantZone("round")

    /// What a pull outside a whole sync brought (a zone kicked, pages pushed), added to the
    /// round's report; a device certificate it held back with its identity may settle a conflict.
    private func absorb(_ pulled: SyncReport, into report: inout SyncReport, _ local: LocalIdentity, _ backend: any RecordZoneBackend) async throws(ConversationError) {
        report.pulled += pulled.pulled
        report.quarantined += pulled.quarantined
        report.clocksAhead += pulled.clocksAhead
        report.blocked += pulled.blocked.filter { !report.blocked.contains($0) }
        if pulled.quarantined > 0, try await settleResolvedConflicts() > 0 {
            report.pushed += try await engine.pushOnly(localSpeaker: local.identifier, backend: backend).pushed
        }
    }

    /// Kicks a push after each commit of this process that queued a local change.
    private func watchLocalChanges(_ kicks: SyncKicks) async {
        let signal = StoreDatabase.outboxSignal
        var seen = database.localChanges.generation(of: signal)
        if (try? await loadPendingChangeCount()) ?? 0 > 0 { kicks.kick(.localChange) }
        while !Task.isCancelled {
            guard await database.localChanges.wait(for: signal, after: seen, timeout: .seconds(3600)) else { continue }
            seen = database.localChanges.generation(of: signal)
            kicks.kick(.localChange)
        }
    }

    /// Kicks a push when another process (or connection) committed to the store and left
    /// something due in the outbox.
    private func watchOtherProcesses(_ kicks: SyncKicks) async {
        var version = try? await read { db in try db.first("PRAGMA data_version") { $0.int(0) } }
        while !Task.isCancelled {
            do { try await Task.sleep(for: .milliseconds(250)) } catch { return }
            let now = try? await read { db in try db.first("PRAGMA data_version") { $0.int(0) } }
            guard now != version else { continue }
            version = now
            let due = SyncEngine.milliseconds(configuration.now())
            if (try? await read({ db in try Outbox.hasDue(at: due, in: db) })) == true { kicks.kick(.localChange) }
        }
    }

    /// One stream for every followed zone (the speakers' own zones and the conversations, from
    /// their stored tokens): what it pushes waits for the next round, which applies it, and a
    /// zone it says moved is pulled by that round; the zones are followed again after every
    /// round (new ones, and those the stream took elsewhere). A backend without a stream after
    /// all is long-polled instead (`longPolls`) or left to the polls; a stream cut is opened
    /// again (backing off 0.5 s doubling to 30 s), from the tokens the store keeps: nothing is missed.
    private func followStream(_ backend: any LiveChanges, kicks: SyncKicks, rounds: ChangeWaiters, link: StreamLink, longPolls: Bool) async {
        var backoff = 0.5
        while !Task.isCancelled {
            let stream: any ChangeStream
            do {
                stream = try await backend.openChangeStream()
            } catch {
                if error.code == .routeNotFound {
                    configuration.logger.notice("no stream (\(error.message)): \(longPolls ? "long polls" : "the polls") instead")
                    if longPolls { await watchZones(backend, kicks: kicks, rounds: rounds) }
                    return
                }
                configuration.logger.info("no stream (\(error)), again in \(backoff) s")
                do { try await Task.sleep(for: .milliseconds(Int(backoff * 1000))) } catch { return }
                backoff = min(30, backoff * 2)
                continue
            }
            link.attach(stream)
            liveWatches.attach(stream)
            try? stream.followFeed()
            let opened = ContinuousClock.now
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    while !Task.isCancelled {
                        let round = rounds.generation(of: Self.roundSignal)
                        if let stored = try? await self.read({ db in
                            try db.rows("SELECT zone, token FROM ck_zone_state WHERE token IS NOT NULL") { ($0.text(0), $0.optionalBlob(1).map(ChangeToken.init(data:))) }
                        }) {
                            link.follow(stored: Dictionary(stored.compactMap { name, token in (try? ZoneName(name)).map { ($0, token) } }) { $1 })
                        }
                        _ = await rounds.wait(for: Self.roundSignal, after: round, timeout: .seconds(3600))
                    }
                }
                group.addTask {
                    do {
                        while let change = try await stream.next() {
                            switch change {
                            case .changes(let zone, let since, let changes):
                                let round = rounds.generation(of: Self.roundSignal)
                                if kicks.push(PushedPage(zone: zone, since: since, changes: changes)) {
                                    _ = await rounds.wait(for: Self.roundSignal, after: round, timeout: .seconds(30))
                                }
                            case .moved(let zone):
                                kicks.kick(zone.map { .zone($0, waitedFrom: nil) } ?? .poll)
                            case .feed:
                                link.heardFeed()
                                kicks.kick(.poll)
                            case .live(let zone, let told):
                                self.liveWatches.received(zone, told)
                            case .failed(let zone, let error):
                                // Read by request from here: at once when it must be read again
                                // whole (and followed again from there); otherwise the polls
                                // look at it, and the stream again later.
                                let expired = error.code == .changeTokenExpired
                                link.unfollow(zone, refused: !expired)
                                if expired { kicks.kick(.zone(zone, waitedFrom: nil)) }
                                self.configuration.logger.info("the stream no longer follows \(zone): \(error)")
                            }
                        }
                    } catch {
                        self.configuration.logger.info("stream ended: \(error)")
                    }
                }
                await group.next()
                group.cancelAll()
            }
            stream.close()
            link.attach(nil)
            liveWatches.attach(nil)
            // A stream that stood a while is opened again at once; one that keeps failing, later.
            if ContinuousClock.now - opened > .seconds(Double(Wire.StreamFrame.silenceSeconds)) { backoff = 0.5 }
            do { try await Task.sleep(for: .milliseconds(Int(backoff * 1000))) } catch { return }
            backoff = min(30, backoff * 2)
        }
    }

    /// One long poll per followed zone (the speakers' own zones and the conversations, from
    /// their stored tokens); a zone that moved is kicked, and its poll waits for the next round
    /// before asking again. The set is read again after every round.
    private func watchZones(_ backend: any RecordZoneBackend, kicks: SyncKicks, rounds: ChangeWaiters) async {
        while !Task.isCancelled {
            let zones = (try? await read { db in
                try db.rows("SELECT zone, token FROM ck_zone_state WHERE token IS NOT NULL ORDER BY zone") { ($0.text(0), $0.blob(1)) }
            }) ?? []
            let watched = Set(zones.map(\.0))
            await withTaskGroup(of: Void.self) { group in
                for (name, _) in zones {
                    guard let zone = try? ZoneName(name) else { continue }
                    group.addTask {
                        while !Task.isCancelled {
                            let round = rounds.generation(of: Self.roundSignal)
                            let token = (try? await self.read { db in
                                try db.first("SELECT token FROM ck_zone_state WHERE zone = ?", [name]) { $0.optionalBlob(0).map(ChangeToken.init(data:)) } ?? nil
                            }) ?? nil
                            let moved: Bool
                            do { moved = try await backend.waitForChanges(in: zone, since: token, timeout: .seconds(25)) } catch {
                                // An expired token (the zone recreated, or the server's data
                                // restored from an earlier copy): the round fetches it again
                                // from the start. Otherwise the round loop backs off; this poll
                                // waits for it.
                                if (error as? RecordZoneError)?.code == .changeTokenExpired { kicks.kick(.zone(zone, waitedFrom: nil)) }
                                _ = await rounds.wait(for: Self.roundSignal, after: round, timeout: .seconds(30))
                                continue
                            }
                            if moved {
                                kicks.kick(.zone(zone, waitedFrom: token))
                                _ = await rounds.wait(for: Self.roundSignal, after: round, timeout: .seconds(30))
                            }
                        }
                    }
                }
                // Start again when the set of zones changes (a new conversation, a new speaker).
                group.addTask {
                    while !Task.isCancelled {
                        let round = rounds.generation(of: Self.roundSignal)
                        _ = await rounds.wait(for: Self.roundSignal, after: round, timeout: .seconds(3600))
                        let now = (try? await self.read { db in try db.rows("SELECT zone FROM ck_zone_state WHERE token IS NOT NULL") { $0.text(0) } }) ?? []
                        if Set(now) != watched { return }
                    }
                }
                await group.next()
                group.cancelAll()
            }
        }
    }
}

/// The stream the continuous sync holds, and the zones it follows there.
final class StreamLink: Sendable {
    private struct State {
        var stream: (any ChangeStream)?
        /// Each followed zone, with the token last followed from.
        var followed: [ZoneName: ChangeToken?] = [:]
        /// Zones the server would not follow, and when it said so.
        var refused: [ZoneName: ContinuousClock.Instant] = [:]
        /// The stream said it tells of the database feed (``LiveChange/feed``).
        var carriesFeed = false
    }
    private let state = Mutex(State())
    /// How long a zone the server would not follow is left to the polls before it is asked again.
    static let refusedFor = Duration.seconds(30)
    /// How often the feed is looked at while the stream tells of it: for what a server cannot
    /// tell (a followed zone made after it was found missing, a server that failed to read who
    /// may read a group).
    static let feedCheck = Duration.seconds(60)

    func attach(_ stream: (any ChangeStream)?) {
        state.withLock { state in
            state.stream = stream
            state.followed = [:]
            state.carriesFeed = false
        }
    }

    /// Whether the stream attached tells of the database feed.
    var carriesFeed: Bool { state.withLock { $0.carriesFeed } }

    func heardFeed() { state.withLock { $0.carriesFeed = true } }

    /// Follows the zones of `stored` the stream does not follow yet, each from its token.
    func follow(stored: [ZoneName: ChangeToken?]) {
        let now = ContinuousClock.now
        let (stream, new) = state.withLock { state -> ((any ChangeStream)?, [ZoneName: ChangeToken?]) in
            state.refused = state.refused.filter { now - $0.value < Self.refusedFor }
            // Up to the stream's limit; the zones beyond it are left to the polls.
            let room = max(0, Wire.StreamFrame.maximumZones - state.followed.count)
            let new = Dictionary(stored.filter { state.followed[$0.key] == nil && state.refused[$0.key] == nil }.sorted { $0.key < $1.key }.prefix(room).map { ($0.key, $0.value) }) { $1 }
            state.followed.merge(new) { $1 }
            return (state.stream, new)
        }
        if !new.isEmpty { try? stream?.follow(new) }
    }

    /// Follows zones again from the store's tokens (pushed pages that did not fit), but not
    /// again from a token already asked for.
    func followAgain(_ zones: [ZoneName: ChangeToken?]) {
        let (stream, again) = state.withLock { state -> ((any ChangeStream)?, [ZoneName: ChangeToken?]) in
            let again = zones.filter { zone, token in state.followed[zone].map { $0 != token } ?? false }
            state.followed.merge(again) { $1 }
            return (state.stream, again)
        }
        if !again.isEmpty { try? stream?.follow(again) }
    }

    /// The server no longer follows `zone`: it is followed again after the next round, or —
    /// `refused` (it may not be read, the storage failed) — not before ``refusedFor``.
    func unfollow(_ zone: ZoneName, refused: Bool) {
        state.withLock { state in
            state.followed[zone] = nil
            if refused { state.refused[zone] = .now }
        }
    }
}

/// What starts a round of the continuous sync.
enum SyncCause: Sendable, Hashable {
    case localChange
    /// A zone's long poll woke, having waited from this token (nil: fetch the zone whatever
    /// its token, as after an expired one).
    case zone(ZoneName, waitedFrom: ChangeToken?)
    /// The stream pushed pages (``SyncKicks/takePages()``).
    case pushed
    /// A whole sync if the database feed moved, else a push of what is due.
    case poll
    /// A push of what is due in the outbox, if anything (asks the backend nothing otherwise).
    case tick
}

/// Kicks gathered until the round loop takes them all at once: many commits while a round runs
/// make one more round, not many.
final class SyncKicks: Sendable {
    private struct State {
        var pending = Set<SyncCause>()
        var pages: [PushedPage] = []
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = Mutex(State())
    /// The most pushed pages that wait for a round: the stream reads no more until it applied them.
    static let pagesWaiting = 64

    /// A page the stream pushed, for the next round. - Returns: whether as many as
    /// ``pagesWaiting`` wait now (the stream then waits for the round).
    func push(_ page: PushedPage) -> Bool {
        let full = state.withLock { state in
            state.pages.append(page)
            return state.pages.count >= Self.pagesWaiting
        }
        kick(.pushed)
        return full
    }

    /// Pages a failed round could not apply, before any pushed since.
    func giveBack(_ pages: [PushedPage]) {
        guard !pages.isEmpty else { return }
        state.withLock { $0.pages.insert(contentsOf: pages, at: 0) }
    }

    /// The pages pushed since the last call, in the order the stream sent them.
    func takePages() -> [PushedPage] {
        state.withLock { state in
            defer { state.pages = [] }
            return state.pages
        }
    }

    func kick(_ cause: SyncCause) {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.pending.insert(cause)
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    /// Waits for at least one kick (or cancellation), then takes every pending one.
    func next() async -> Set<SyncCause> {
        while !Task.isCancelled {
            let taken = state.withLock { state -> Set<SyncCause> in
                defer { state.pending = [] }
                return state.pending
            }
            if !taken.isEmpty { return taken }
            await withTaskCancellationHandler {
                await withCheckedContinuation { continuation in
                    let resumeNow = state.withLock { state -> Bool in
                        if !state.pending.isEmpty || Task.isCancelled { return true }
                        state.waiter = continuation
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            } onCancel: {
                let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                    defer { state.waiter = nil }
                    return state.waiter
                }
                waiter?.resume()
            }
        }
        return []
    }
}
