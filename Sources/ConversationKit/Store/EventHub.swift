import Foundation
import Synchronization

/// Fans store events out to every live subscriber, each with a stream that holds
/// ``buffer`` events: past it the oldest go, and the subscriber gets ``StoreEvent/reset`` after
/// them.
final class EventHub: Sendable {
    static let buffer = 10_000
    private let subscribers = Mutex<[UUID: AsyncStream<StoreEvent>.Continuation]>([:])

    func stream() -> AsyncStream<StoreEvent> {
        let (stream, continuation) = AsyncStream<StoreEvent>.makeStream(bufferingPolicy: .bufferingNewest(Self.buffer))
        let id = UUID()
        subscribers.withLock { $0[id] = continuation }
        continuation.onTermination = { [weak self] _ in
            self?.subscribers.withLock { _ = $0.removeValue(forKey: id) }
        }
        return stream
    }

    /// Hands `events` to every subscriber. One that drops any (its stream is full) gets a
    /// ``StoreEvent/reset`` after the batch: newer than every event dropped, so a subscriber
    /// that falls behind always learns it, however far.
    func publish(_ events: [StoreEvent]) {
        guard !events.isEmpty else { return }
        let targets = subscribers.withLock { Array($0.values) }
        for continuation in targets {
            var dropped = false
            for event in events {
                if case .dropped = continuation.yield(event) { dropped = true }
            }
            if dropped { continuation.yield(.reset) }
        }
    }

    func finish() {
        let targets = subscribers.withLock { subscribers in
            defer { subscribers.removeAll() }
            return Array(subscribers.values)
        }
        for continuation in targets { continuation.finish() }
    }
}
