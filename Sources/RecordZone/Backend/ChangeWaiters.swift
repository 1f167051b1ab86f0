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
        var waiting: [ZoneName: [UUID: CheckedContinuation<Bool, Never>]] = [:]
        var generations: [ZoneName: UInt64] = [:]
        /// Moved on by ``wakeAll()``: part of every zone's generation.
        var epoch: UInt64 = 0
        /// Each waiter's timeout, cancelled when it is answered first.
        var timers: [UUID: Task<Void, Never>] = [:]
        /// Set by ``releaseAll()``: every wait from then on returns at once.
        var released = false

        func generation(of zone: ZoneName) -> UInt64 { (generations[zone] ?? 0) &+ epoch &* 0x1_0000_0000 }
    }
    private let state = Mutex(State())

    public init() {}

    /// How many callers wait now (for metrics).
    public var count: Int { state.withLock { $0.waiting.values.reduce(0) { $0 + $1.count } } }

    public func generation(of zone: ZoneName) -> UInt64 { state.withLock { $0.generation(of: zone) } }

    /// Waits until the zone is woken after `generation`, the timeout passes, or the task is cancelled.
    /// - Returns: true when woken by a change.
    public func wait(for zone: ZoneName, after generation: UInt64, timeout: Duration) async -> Bool {
        let id = UUID()
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let answer = state.withLock { state -> Bool? in
                    if state.released { return false }
                    if state.generation(of: zone) != generation { return true }
                    state.waiting[zone, default: [:]][id] = continuation
                    return nil
                }
                if let answer {
                    continuation.resume(returning: answer)
                    return
                }
                let timer = Task { [weak self] in
                    guard (try? await Task.sleep(for: timeout)) != nil else { return }
                    self?.resume(zone, id, false)
                }
                // If the waiter was answered meanwhile, its timer is not needed.
                let answered = state.withLock { state in
                    guard state.waiting[zone]?[id] != nil else { return true }
                    state.timers[id] = timer
                    return false
                }
                if answered { timer.cancel() }
                // Cancelled before it was registered: the cancellation handler found nothing.
                if Task.isCancelled { resume(zone, id, false) }
            }
        } onCancel: {
            resume(zone, id, false)
        }
    }

    /// Wakes everyone waiting for `zone` and moves its generation on.
    public func wake(_ zone: ZoneName) {
        let (woken, timers) = state.withLock { state in
            state.generations[zone, default: 0] &+= 1
            let woken = state.waiting.removeValue(forKey: zone) ?? [:]
            return (woken, woken.keys.compactMap { state.timers.removeValue(forKey: $0) })
        }
        timers.forEach { $0.cancel() }
        for continuation in woken.values { continuation.resume(returning: true) }
    }

    /// Wakes everyone, and moves every zone's generation on (changes may have been missed: a
    /// notification connection was lost and is back).
    public func wakeAll() {
        let (woken, timers) = state.withLock { state in
            state.epoch &+= 1
            defer {
                state.waiting.removeAll()
                state.timers.removeAll()
            }
            return (state.waiting.values.flatMap(\.values), Array(state.timers.values))
        }
        timers.forEach { $0.cancel() }
        for continuation in woken { continuation.resume(returning: true) }
    }

    /// Releases every waiter with false, and answers every later wait at once (a server stopping).
    public func releaseAll() {
        let (woken, timers) = state.withLock { state in
            defer {
                state.released = true
                state.waiting.removeAll()
                state.timers.removeAll()
            }
            return (state.waiting.values.flatMap(\.values), Array(state.timers.values))
        }
        timers.forEach { $0.cancel() }
        for continuation in woken { continuation.resume(returning: false) }
    }

    private func resume(_ zone: ZoneName, _ id: UUID, _ value: Bool) {
        let (continuation, timer) = state.withLock { ($0.waiting[zone]?.removeValue(forKey: id), $0.timers.removeValue(forKey: id)) }
        timer?.cancel()
        continuation?.resume(returning: value)
    }
}
