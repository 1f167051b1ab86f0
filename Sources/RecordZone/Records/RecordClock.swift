import Foundation
import Synchronization

/// A hybrid-logical-clock reading: milliseconds since 1970 in the high 48 bits, a counter in the
/// low 16. Readings from one ``HybridLogicalClock`` always increase, even when the wall clock
/// steps back, and stay close to wall time.
public struct RecordClock: RawRepresentable, Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    public var rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }

    public init(milliseconds: UInt64, counter: UInt16) {
        rawValue = (milliseconds << 16) | UInt64(counter)
    }

    public var milliseconds: UInt64 { rawValue >> 16 }
    public var counter: UInt16 { UInt16(truncatingIfNeeded: rawValue) }

    public static func < (lhs: RecordClock, rhs: RecordClock) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String { "\(milliseconds).\(counter)" }
}

/// Issues increasing ``RecordClock`` readings. The wall clock is injected, so tests control time.
public final class HybridLogicalClock: Sendable {
    private let wallMilliseconds: @Sendable () -> UInt64
    private let last = Mutex<UInt64>(0)

    /// - Parameter wallMilliseconds: the wall clock; defaults to the system's.
    public init(wallMilliseconds: @escaping @Sendable () -> UInt64 = HybridLogicalClock.systemMilliseconds) {
        self.wallMilliseconds = wallMilliseconds
    }

    public static let systemMilliseconds: @Sendable () -> UInt64 = {
        UInt64(max(0, Date().timeIntervalSince1970 * 1000))
    }

    /// A reading later than every reading issued or observed before.
    public func now() -> RecordClock {
        let wall = wallMilliseconds() << 16
        return RecordClock(rawValue: last.withLock { last in
            last = max(last &+ 1, wall)
            return last
        })
    }

    /// Moves the clock past a reading seen from elsewhere, so later local versions win over it.
    public func observe(_ clock: RecordClock) {
        last.withLock { $0 = max($0, clock.rawValue) }
    }
}
