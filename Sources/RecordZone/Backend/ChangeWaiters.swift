import Foundation
import Synchronization

/// Callers waiting for a zone to change (``RecordZoneBackend/waitForChanges(in:since:timeout:)``):
/// woken by a write to the zone, or by their timeout, or by cancellation; each exactly once.
///
/// Each zone has a generation that every ``wake(_:)`` moves on. A caller reads it
/// (``generation(of:)``) before checking the zone and passes it to
/// ``wait(for:after:timeout:)``; a write that lands between the check and the wait has moved
/// the generation, and the wait returns at once. No wake is ever missed.
public final class ChangeWaiters: Sendable {
    private struct State {
        /// Each waiter, and the zones it waits for (it is woken by the first; one waiting for
        /// none ends by its timeout or cancellation).
        var continuations: [UUID: CheckedContinuation<Bool, Never>] = [:]
        var zonesOf: [UUID: [ZoneName]] = [:]
        /// The waiters of each zone.
        var waiting: [ZoneName: Set<UUID>] = [:]
        var generations: [ZoneName: UInt64] = [:]
        /// Moved on by ``wakeAll()``: part of every zone's generation.
        var epoch: UInt64 = 0
        /// Each waiter's timeout, cancelled when it is answered first.
        var timers: [UUID: Task<Void, Never>] = [:]
        /// Set by ``releaseAll()``: every wait from then on returns at once.
        var released = false
        /// Observers (``observe(_:as:_:)``): told of every wake of their zones, until removed.
        var observers: [UUID: @Sendable (ZoneName?) -> Void] = [:]
        var observing: [ZoneName: Set<UUID>] = [:]
        var observedBy: [UUID: Set<ZoneName>] = [:]
        /// Observers of every zone (``observeEvery(as:_:)``).
        var everyObservers: [UUID: @Sendable (Wake) -> Void] = [:]

        func generation(of zone: ZoneName) -> UInt64 { (generations[zone] ?? 0) &+ epoch &* 0x1_0000_0000 }
        func generation(of zones: [ZoneName]) -> UInt64 { zones.reduce(epoch &* 0x1_0000_0000) { $0 &+ (generations[$1] ?? 0) } }

        /// Takes a waiter out from under every zone it waits for.
        mutating func remove(_ id: UUID) -> (CheckedContinuation<Bool, Never>?, Task<Void, Never>?) {
            for zone in zonesOf.removeValue(forKey: id) ?? [] {
                waiting[zone]?.remove(id)
                if waiting[zone]?.isEmpty == true { waiting[zone] = nil }
            }
            return (continuations.removeValue(forKey: id), timers.removeValue(forKey: id))
        }
    }
    private let state = Mutex(State())

    public init() {}

    /// How many callers wait now (for metrics).
    public var count: Int { state.withLock { $0.continuations.count } }

    public func generation(of zone: ZoneName) -> UInt64 { state.withLock { $0.generation(of: zone) } }

    /// One generation for several zones together: it moves when any of theirs does.
    public func generation(of zones: [ZoneName]) -> UInt64 { state.withLock { $0.generation(of: zones) } }

    /// Waits until the zone is woken after `generation`, the timeout passes, or the task is cancelled.
    /// - Returns: true when woken by a change.
    public func wait(for zone: ZoneName, after generation: UInt64, timeout: Duration) async -> Bool {
        await wait(forAnyOf: [zone], after: generation, timeout: timeout)
    }

    /// Waits until any of `zones` is woken after their generation together
    /// (``generation(of:)-([ZoneName])``), the timeout passes, or the task is cancelled.
    /// - Returns: true when woken by a change.
    public func wait(forAnyOf zones: [ZoneName], after generation: UInt64, timeout: Duration) async -> Bool {
        let id = UUID(), zones = Array(Set(zones))
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let answer = state.withLock { state -> Bool? in
                    if state.released { return false }
                    if state.generation(of: zones) != generation { return true }
                    for zone in zones { state.waiting[zone, default: []].insert(id) }
                    state.zonesOf[id] = zones
                    state.continuations[id] = continuation
                    return nil
                }
                if let answer {
                    continuation.resume(returning: answer)
                    return
                }
                let timer = Task { [weak self] in
                    guard (try? await Task.sleep(for: timeout)) != nil else { return }
                    self?.resume(id, false)
                }
                // If the waiter was answered meanwhile, its timer is not needed.
                let answered = state.withLock { state in
                    guard state.continuations[id] != nil else { return true }
                    state.timers[id] = timer
                    return false
                }
                if answered { timer.cancel() }
                // Cancelled before it was registered: the cancellation handler found nothing.
                if Task.isCancelled { resume(id, false) }
            }
        } onCancel: {
            resume(id, false)
        }
    }

    /// Wakes everyone waiting for `zone`, tells its observers, and moves its generation on.
    public func wake(_ zone: ZoneName) {
        let (woken, told, every) = state.withLock { state in
            state.generations[zone, default: 0] &+= 1
            return ((state.waiting[zone] ?? []).map { state.remove($0) }, (state.observing[zone] ?? []).compactMap { state.observers[$0] },
                    Array(state.everyObservers.values))
        }
        for (continuation, timer) in woken {
            timer?.cancel()
            continuation?.resume(returning: true)
        }
        for observer in told { observer(zone) }
        for observer in every { observer(.zone(zone)) }
    }

    /// Tells the observers of every zone that who may read `zone` may have changed (its
    /// governing records moved, on any server sharing the storage): nobody waits for that.
    public func wakeReaders(of zone: ZoneName) {
        for observer in state.withLock({ Array($0.everyObservers.values) }) { observer(.readers(zone)) }
    }

    /// What an observer of every zone is told (``observeEvery(as:_:)``).
    public enum Wake: Sendable {
        /// A commit to the zone.
        case zone(ZoneName)
        /// Who may read the zone may have changed (``wakeReaders(of:)``).
        case readers(ZoneName)
        /// Any zone may have moved (``wakeAll()``, ``releaseAll()``).
        case all
    }

    /// Tells `observer` of every later wake of `zones` (their name), and of every ``wakeAll()``
    /// and ``releaseAll()`` (nil), on the waking thread, until ``stopObserving(_:)``: what a
    /// stream holds instead of a wait a zone (each wake costs one call per observer of that
    /// zone, nothing per other zone). Calling it again for `id` adds zones.
    public func observe(_ zones: some Sequence<ZoneName>, as id: UUID, _ observer: @escaping @Sendable (ZoneName?) -> Void) {
        state.withLock { state in
            state.observers[id] = observer
            for zone in zones where state.observedBy[id, default: []].insert(zone).inserted {
                state.observing[zone, default: []].insert(id)
            }
        }
    }

    /// Tells `observer` of every later wake of any zone, as ``observe(_:as:_:)`` does of some:
    /// what a server's audience (who must hear of a zone it does not follow) listens to.
    public func observeEvery(as id: UUID, _ observer: @escaping @Sendable (Wake) -> Void) {
        state.withLock { $0.everyObservers[id] = observer }
    }

    /// Ends an observation (``observe(_:as:_:)``, ``observeEvery(as:_:)``).
    public func stopObserving(_ id: UUID) {
        state.withLock { state in
            state.observers[id] = nil
            state.everyObservers[id] = nil
            for zone in state.observedBy.removeValue(forKey: id) ?? [] {
                state.observing[zone]?.remove(id)
                if state.observing[zone]?.isEmpty == true { state.observing[zone] = nil }
            }
        }
    }

    /// Wakes everyone, and moves every zone's generation on (changes may have been missed: a
    /// notification connection was lost and is back).
    public func wakeAll() {
        let (woken, told, every) = state.withLock { state in
            state.epoch &+= 1
            return (Array(state.continuations.keys).map { state.remove($0) }, Array(state.observers.values), Array(state.everyObservers.values))
        }
        for (continuation, timer) in woken {
            timer?.cancel()
            continuation?.resume(returning: true)
        }
        for observer in told { observer(nil) }
        for observer in every { observer(.all) }
    }

    /// Releases every waiter with false, and answers every later wait at once (a server stopping).
    public func releaseAll() {
        let (woken, told, every) = state.withLock { state in
            state.released = true
            return (Array(state.continuations.keys).map { state.remove($0) }, Array(state.observers.values), Array(state.everyObservers.values))
        }
        for (continuation, timer) in woken {
            timer?.cancel()
            continuation?.resume(returning: false)
        }
        for observer in told { observer(nil) }
        for observer in every { observer(.all) }
    }

    /// Whether ``releaseAll()`` was called (a stream ends rather than observe on).
    public var isReleased: Bool { state.withLock { $0.released } }

    private func resume(_ id: UUID, _ value: Bool) {
        let (continuation, timer) = state.withLock { $0.remove(id) }
        timer?.cancel()
        continuation?.resume(returning: value)
    }
}
