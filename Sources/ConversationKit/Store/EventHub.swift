import Foundation
import Synchronization

/// Fans store events out to every live subscriber.
final class EventHub: Sendable {
    private let subscribers = Mutex<[UUID: AsyncStream<StoreEvent>.Continuation]>([:])

    func stream() -> AsyncStream<StoreEvent> {
        let (stream, continuation) = AsyncStream<StoreEvent>.makeStream(bufferingPolicy: .bufferingNewest(10_000))
        let id = UUID()
        subscribers.withLock { $0[id] = continuation }
        continuation.onTermination = { [weak self] _ in
            self?.subscribers.withLock { _ = $0.removeValue(forKey: id) }
        }
        return stream
    }

    func publish(_ events: [StoreEvent]) {
        guard !events.isEmpty else { return }
        let targets = subscribers.withLock { Array($0.values) }
        for continuation in targets {
            for event in events { continuation.yield(event) }
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
