import Foundation
import RecordZone
import SQLiteKit

/// How a store reaches its backend. The store hands the backend its own ``RecordPolicy``
/// (with the keys it has pinned), so every record it pulls is verified by the store's rules.
public struct BackendFactory: Sendable {
    let make: @Sendable (RecordPolicy) throws(RecordZoneError) -> any RecordZoneBackend

    /// Any backend, built with the store's policy.
    public static func custom(_ make: @escaping @Sendable (RecordPolicy) throws(RecordZoneError) -> any RecordZoneBackend) -> BackendFactory {
        BackendFactory(make: make)
    }

    /// A shared folder (``FileSystemBackend``), written as `device`.
    public static func folder(_ root: String, device: String) -> BackendFactory {
        BackendFactory { policy throws(RecordZoneError) in try FileSystemBackend(root: root, device: device, policy: policy) }
    }

    /// A connection to an in-memory backend shared with other stores (tests, previews).
    public static func memory(_ backend: InMemoryBackend) -> BackendFactory {
        BackendFactory { policy in backend.connection(policy: policy) }
    }
}

/// Tunables of a store, with defaults for production; tests inject the clock and randomness.
public struct StoreConfiguration: Sendable {
    /// Records per pulled page.
    public var pageSize = 200
    /// Records per pushed batch (at most ``Record/maximumBatchSize``).
    public var pushBatchSize = Record.maximumBatchSize
    /// First retry delay after a transient push failure; doubles per attempt, with jitter.
    public var retryBaseDelay = 0.5
    public var retryMaximumDelay = 300.0
    /// The wall clock (retry scheduling, message times).
    public var now: @Sendable () -> Date = { Date() }
    /// A uniform random number in 0..<1 for retry jitter.
    public var random: @Sendable () -> Double = { Double.random(in: 0..<1) }
    /// The version clock; defaults to one driven by ``now``.
    public var clock: HybridLogicalClock?

    public init() {}
}
