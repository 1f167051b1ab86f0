import Foundation
import Synchronization

/// Who is typing in a zone, as a backend with a live channel tells it
/// (``RecordZoneBackend/typing(in:since:timeout:)``): never stored, gone on restart.
public struct TypingState: Sendable, Hashable {
    /// The identities typing now, sorted.
    public var identities: [String]
    /// Moves on with every change; passed back as `since`, a wait returns at the next change.
    public var version: UInt64

    public init(identities: [String], version: UInt64) {
        self.identities = identities
        self.version = version
    }
}

/// Typing indicators in memory (docs/PROTOCOL.md §2, "Typing"): per zone, who is typing and
/// until when. A typist's state lasts ``lifetime`` unless said again (clients say it every
/// ``refreshInterval`` while typing), so a client that vanishes stops showing within it; waiters
/// (long polls) are woken by every change, expiries included. A typist changing its state more
/// often than every ``minimumInterval`` is refused (the caller answers 429). Used by the zone
/// server's storages and the in-memory backend.
public final class TypingBoard: Sendable {
    /// How long "typing" holds without being said again.
    public static let lifetime = Duration.milliseconds(4_500)
    /// How often a typing client says it again.
    public static let refreshInterval = Duration.seconds(3)
    /// The shortest interval between two states from one typist in one zone.
    public static let minimumInterval = Duration.milliseconds(250)

    private struct State {
        /// Until when each typist types, per zone.
        var zones: [ZoneName: [String: ContinuousClock.Instant]] = [:]
        /// When each typist last changed its state, typing or not (for the rate limit).
        var lastChange: [ZoneName: [String: ContinuousClock.Instant]] = [:]
    }
    private let state = Mutex(State())
    private let waiters = ChangeWaiters()

    public init() {}

    /// Sets a typist's state, unless it changed less than ``minimumInterval`` ago.
    /// - Parameter rateLimited: false for a state another server already accepted (PostgreSQL's
    ///   notifications), applied as it comes.
    /// - Returns: false when refused for the rate.
    @discardableResult
    public func set(_ typing: Bool, identity: String, in zone: ZoneName, rateLimited: Bool = true) -> Bool {
        let now = ContinuousClock.now
        let (accepted, changed) = state.withLock { state -> (Bool, Bool) in
            if rateLimited, let last = state.lastChange[zone]?[identity], now - last < Self.minimumInterval { return (false, false) }
            state.lastChange[zone, default: [:]][identity] = now
            let was = state.zones[zone]?[identity] != nil
            if typing {
                state.zones[zone, default: [:]][identity] = now + Self.lifetime
            } else {
                state.zones[zone]?[identity] = nil
                if state.zones[zone]?.isEmpty == true { state.zones[zone] = nil }
            }
            return (true, was != typing)
        }
        guard accepted else { return false }
        if changed { waiters.wake(zone) }
        if typing {
            // The expiry: if nobody said it again by then, the typist is gone and waiters learn it.
            Task { [weak self] in
                try? await Task.sleep(for: Self.lifetime + .milliseconds(20))
                self?.expire(zone)
            }
        }
        return true
    }

    /// Who types in `zone` now, and the version of that.
    public func current(in zone: ZoneName) -> TypingState {
        let now = ContinuousClock.now
        let version = waiters.generation(of: zone)
        let identities = state.withLock { state in (state.zones[zone] ?? [:]).filter { $0.value > now }.keys.sorted() }
        return TypingState(identities: identities, version: version)
    }

    /// The state once it differs from `version` (at once when it does already), or after
    /// `timeout` as it is then.
    public func wait(in zone: ZoneName, since version: UInt64?, timeout: Duration) async -> TypingState {
        let generation = waiters.generation(of: zone)
        if let version, version == generation {
            _ = await waiters.wait(for: zone, after: generation, timeout: timeout)
        }
        return current(in: zone)
    }

    /// Tells `observer` of every later change of who types in `zones`, until
    /// ``stopObserving(_:)`` (a stream's watches); calling it again for `id` adds zones.
    public func observe(_ zones: some Sequence<ZoneName>, as id: UUID, _ observer: @escaping @Sendable (ZoneName) -> Void) {
        waiters.observe(zones, as: id) { zone in if let zone { observer(zone) } }
    }

    public func stopObserving(_ id: UUID) { waiters.stopObserving(id) }

    /// How many zones have someone typing (for metrics and tests).
    public var activeZoneCount: Int { state.withLock { $0.zones.count } }

    /// Ends every long poll (a server stopping).
    public func releaseAll() { waiters.releaseAll() }

    private func expire(_ zone: ZoneName) {
        let now = ContinuousClock.now
        let changed = state.withLock { state -> Bool in
            guard let typists = state.zones[zone] else { return false }
            let live = typists.filter { $0.value > now }
            state.zones[zone] = live.isEmpty ? nil : live
            // Rate-limit marks older than the interval are of no use any more.
            state.lastChange[zone] = state.lastChange[zone]?.filter { now - $0.value < Self.minimumInterval }
            if state.lastChange[zone]?.isEmpty == true { state.lastChange[zone] = nil }
            return live.count != typists.count
        }
        if changed { waiters.wake(zone) }
    }
}
