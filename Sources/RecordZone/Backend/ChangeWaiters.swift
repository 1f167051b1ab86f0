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
    }
    private let state = Mutex(State())

    public init() {}

    /// How many callers wait now (for metrics).
    public var count: Int { state.withLock { $0.waiting.values.reduce(0) { $0 + $1.count } } }

    public func generation(of zone: ZoneName) -> UInt64 { state.withLock { $0.generations[zone] ?? 0 } }

    /// Waits until the zone is woken after `generation`, the timeout passes, or the task is cancelled.
    /// - Returns: true when woken by a change.
    public func wait(for zone: ZoneName, after generation: UInt64, timeout: Duration) async -> Bool {
        let id = UUID()
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let alreadyMoved = state.withLock { state in
                    if (state.generations[zone] ?? 0) != generation { return true }
                    state.waiting[zone, default: [:]][id] = continuation
                    return false
                }
                if alreadyMoved {
                    continuation.resume(returning: true)
                    return
                }
                Task { [weak self] in
                    try? await Task.sleep(for: timeout)
                    self?.resume(zone, id, false)
                }
            }
        } onCancel: {
            resume(zone, id, false)
        }
    }

    /// Wakes everyone waiting for `zone` and moves its generation on.
    public func wake(_ zone: ZoneName) {
        let woken = state.withLock { state in
            state.generations[zone, default: 0] &+= 1
            return state.waiting.removeValue(forKey: zone) ?? [:]
        }
        for continuation in woken.values { continuation.resume(returning: true) }
    }

    /// Releases every waiter with false (a server stopping).
    public func releaseAll() {
        let woken = state.withLock { state in
            defer { state.waiting.removeAll() }
            return state.waiting.values.flatMap(\.values)
        }
        for continuation in woken { continuation.resume(returning: false) }
    }

    private func resume(_ zone: ZoneName, _ id: UUID, _ value: Bool) {
        let continuation = state.withLock { $0.waiting[zone]?.removeValue(forKey: id) }
        continuation?.resume(returning: value)
    }
}
