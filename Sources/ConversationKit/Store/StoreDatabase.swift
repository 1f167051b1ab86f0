import Foundation
import RecordZone
import SQLiteKit
import Synchronization

/// The store's database with what every transaction needs: the policy whose pins are saved
/// with the records that pinned them, and the hub that publishes events after each commit.
/// Shared by the store's API and its sync engine, so both write the same way.
final class StoreDatabase: Sendable {
    let queue: DatabaseQueue
    let policy: RecordPolicy
    let hub: EventHub
    /// Woken after each commit that queued a local change (``ConversationStore/run(pollInterval:)``
    /// pushes it at once).
    let localChanges = ChangeWaiters()
    static let outboxSignal = ChatRecords.constantZone("outbox")
    /// The local speaker and this device's keys, once set up: a write's applier signs what it
    /// commits on its own (key shares) and opens what was shared with this device.
    let identity = Mutex<ConversationStore.LocalIdentity?>(nil)
    let clock: HybridLogicalClock
    /// This device's current epochs, decided once and reused by the next sends (writer only).
    let epochs = EpochCache()

    init(queue: DatabaseQueue, policy: RecordPolicy, hub: EventHub, clock: HybridLogicalClock) {
        self.queue = queue
        self.policy = policy
        self.hub = hub
        self.clock = clock
    }

    /// A read on the reader connection (in WAL mode it never waits for a write), blocking the
    /// caller: for the store's synchronous API only. An async caller gets the overload below
    /// (the compiler picks it, and refuses this one, in an async context).
    @available(*, noasync, message: "await the read: it answers through a continuation")
    func read<T: Sendable>(_ body: (Database) throws -> T) throws(ConversationError) -> T {
        do { return try queue.readNow(body) } catch { throw ConversationError.wrap(error) }
    }

    /// A read on the reader connection's queue, answered through a continuation: it never
    /// holds a thread of Swift's cooperative pool.
    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws(ConversationError) -> T {
        do { return try await queue.read(body) } catch { throw ConversationError.wrap(error) }
    }

    /// Runs a write transaction with a record applier on the writer's queue (off Swift's
    /// cooperative pool: a slow disk or another process's lock holds no task thread); publishes
    /// its events after the commit, in commit order.
    ///
    /// A `synced` write shares its transaction — and so its commit and fsync — with the other
    /// synced writes that arrived while the writer was busy (group commit: 20 callers sending
    /// at once pay for a few syncs, not 20), each in a savepoint of its own, so one that throws
    /// is undone alone; each caller resumes only once the commit that holds its write is on
    /// disk. The log is synced after the commit, not in it (``DatabaseQueue``'s
    /// `syncsAfterCommit`): the writer runs the next group meanwhile, and the store's own
    /// readers may see a write a moment before it is on disk — a live view shows it, the pusher
    /// is woken only once it is durable. A write that pinned keys commits alone (the next sees
    /// them stored).
    ///
    /// A `deferred` write (what the backend holds and can give again: pushed versions settled,
    /// pulled pages with their tokens) commits without a sync of its own; one that pinned keys
    /// is synced after all, with a second commit: a key first seen is never forgotten by a
    /// power loss and learned again from someone else.
    func write<T: Sendable>(_ durability: DatabaseQueue.Durability = .synced,
                            _ body: @escaping @Sendable (inout RecordApplier) throws -> T) async throws(ConversationError) -> T {
        let policy = self.policy, clock = self.clock, epochs = self.epochs, local = identity.withLock { $0 }
        let transaction: @Sendable (Database) throws -> Written<T> = { db in
            // The local speaker is read once, when the store opens (or set up): ck_meta's
            // `local_speaker` and `identity` are written together.
            var applier = RecordApplier(db: db, localSpeaker: local?.identifier, device: local, clock: clock, policy: policy, epochs: epochs)
            let result = try body(&applier)
            let changed = policy.pins.changedIdentities
            try applier.readmitKeyConflicts(of: changed, policy: policy)
            try applier.invalidateAccepted(of: changed, policy: policy)
            try applier.finish()
            let pinned = try PinTable.saveChanges(of: policy.pins, in: db)
            return Written(result: result, events: applier.events, queued: applier.queuedLocalChange, pinned: pinned)
        }
        do {
            switch durability {
            case .synced:
                // Its events are published at the commit, in commit order; the pusher is woken
                // once the commit is on disk (the queue syncs the log after the commit).
                let written = try await queue.writeGrouped(transaction, afterCommit: { self.hub.publish($0.events) }, commitsAlone: { $0.pinned })
                if written.queued { localChanges.wake(Self.outboxSignal) }
                return written.result
            case .deferred:
                let written = try await queue.write(.deferred, transaction)
                if written.pinned {
                    try await queue.write { db in try db.execute("INSERT INTO ck_meta (key, value) VALUES ('pins_synced_at', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                                                                 [Int64(Date().timeIntervalSince1970 * 1000)]) }
                }
                committed(written)
                return written.result
            }
        } catch {
            throw ConversationError.wrap(error)
        }
    }

    /// What one write transaction did, for after its commit.
    private struct Written<T: Sendable>: Sendable {
        let result: T
        let events: [StoreEvent]
        let queued: Bool
        let pinned: Bool
    }

    /// After a write's commit: wakes the pusher if it queued a local change, and publishes its events.
    private func committed<T>(_ written: Written<T>) {
        if written.queued { localChanges.wake(Self.outboxSignal) }
        hub.publish(written.events)
    }
}
