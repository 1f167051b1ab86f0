import Foundation

/// The keys that speak for one identity: the identity key in force, the keys it replaced (each
/// valid for versions up to the clock of the rotation that retired it), and how the reader came
/// to trust them. Chains are kept whole — a reader restarted after a rotation still accepts what
/// the retired key signed before it.
public struct KeyChain: Hashable, Sendable, Codable {
    /// A key the identity used before a ``KeyRotation``.
    public struct RetiredKey: Hashable, Sendable, Codable {
        public var key: Data
        /// The last clock this key may sign at.
        public var until: RecordClock
    }

    public var current: Data
    public var retired: [RetiredKey]

    public init(current: Data, retired: [RetiredKey] = []) {
        self.current = current
        self.retired = retired
    }

    /// Whether `key` may sign a version at `clock`.
    public func allows(_ key: Data, at clock: RecordClock) -> Bool {
        key == current || retired.contains { $0.key == key && clock <= $0.until }
    }

    /// Every key the chain has held, current first.
    public var keys: [Data] { [current] + retired.map(\.key) }
}
