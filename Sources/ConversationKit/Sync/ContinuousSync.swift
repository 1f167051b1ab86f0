import Foundation
import RecordZone
import SQLiteKit
import Synchronization

extension ConversationStore {
    /// Keeps the store in step with its backend until the calling task is cancelled (as
    /// CKSyncEngine schedules sync for its apps): a local change is pushed as soon as it is
    /// committed — by this process, or by another one writing the same store (seen through
    /// SQLite's `data_version`, every 250 ms); a remote change is pulled as soon as the backend
    /// announces it: a long poll per followed zone (`longPolls`, the default for HTTP and
    /// in-memory backends), inotify on a folder (where the kernel and file system give it), and a
    /// look at the database feed every `pollInterval` for zones that are new (a conversation
    /// someone else started) and for folders whose changes inotify does not see. While the backend cannot be reached it backs off (0.5 s doubling to 30 s) and
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
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.watchLocalChanges(kicks) }
            group.addTask { await self.watchOtherProcesses(kicks) }
            group.addTask {
                while !Task.isCancelled {
                    kicks.kick(.poll)
                    do { try await Task.sleep(for: pollInterval) } catch { return }
                }
            }
            if useLongPolls {
                group.addTask { await self.watchZones(backend, kicks: kicks, rounds: rounds) }
            }
            if configuration.sharesPresence, backend.carriesTyping {
                group.addTask { await self.sayOnline(local, backend) }
            }
            // A folder tells of its changes through inotify where it can (the poll stays, for
            // network file systems that never report remote writes).
            if let folder = backend as? FileSystemBackend, let (stop, events) = folder.changeNotifications() {
                group.addTask {
                    await withTaskCancellationHandler {
                        for await _ in events { kicks.kick(.poll) }
                    } onCancel: {
                        stop()
                    }
                }
            }
            await self.runRounds(local, backend, kicks: kicks, rounds: rounds)
            group.cancelAll()
        }
    }

    /// Runs a round per batch of kicks until cancelled: a poll or a retry is a whole sync, a
    /// local change a push, a moved zone a pull of that zone.
    private func runRounds(_ local: LocalIdentity, _ backend: any RecordZoneBackend, kicks: SyncKicks, rounds: ChangeWaiters) async {
        var unreachable = false
        var backoff = 0.5
        while !Task.isCancelled {
            let causes = await kicks.next()
            if Task.isCancelled { return }
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
                    if causes.contains(.localChange) { report = try await engine.pushOnly(localSpeaker: local.identifier, backend: backend) }
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
                    if !zones.isEmpty {
                        let pulled = try await engine.pull(zones: zones, backend: backend)
                        report.pulled += pulled.pulled
                        report.quarantined += pulled.quarantined
                        // A device certificate held back with its identity may settle a conflict.
                        if pulled.quarantined > 0, try await settleResolvedConflicts() > 0 {
                            report.pushed += try await engine.pushOnly(localSpeaker: local.identifier, backend: backend).pushed
                        }
                    }
                }
                reachability.withLock { $0 = true }
                if unreachable {
                    unreachable = false
                    database.hub.publish([.syncActivity(.reachable)])
                }
                backoff = 0.5
                if report != SyncReport() { database.hub.publish([.syncActivity(.synced(report))]) }
            } catch {
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

/// What starts a round of the continuous sync.
enum SyncCause: Sendable, Hashable {
    case localChange
    /// A zone's long poll woke, having waited from this token (nil: fetch the zone whatever
    /// its token, as after an expired one).
    case zone(ZoneName, waitedFrom: ChangeToken?)
    case poll
}

/// Kicks gathered until the round loop takes them all at once: many commits while a round runs
/// make one more round, not many.
final class SyncKicks: Sendable {
    private struct State {
        var pending = Set<SyncCause>()
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = Mutex(State())

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
