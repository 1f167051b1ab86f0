import Foundation
import Synchronization

/// One person's presence, as a backend with a live channel tells it
/// (``RecordZoneBackend/presence(of:in:since:timeout:)``): never stored, gone on restart.
public struct Presence: Sendable, Hashable {
    public var identity: String
    /// Whether a client of theirs says now that it is online (an app open, a sync running).
    public var isOnline: Bool
    /// When a client of theirs last said it was online (or said it went away); nil when the
    /// backend has not heard of them since it started.
    public var lastSeen: Date?

    public init(identity: String, isOnline: Bool, lastSeen: Date?) {
        self.identity = identity
        self.isOnline = isOnline
        self.lastSeen = lastSeen
    }
}

/// The presence of some people, and the version to wait past.
public struct PresenceState: Sendable, Hashable {
    /// In the order asked.
    public var presence: [Presence]
    /// Moves on when one of them goes online or offline (not when an online one says it again).
    public var version: UInt64

    public init(presence: [Presence], version: UInt64) {
        self.presence = presence
        self.version = version
    }
}

/// Presence in memory (docs/PROTOCOL.md §2, "Presence"): per identity, online until when and
/// when last seen. "Online" lasts ``lifetime`` unless said again (clients say it every
/// ``refreshInterval`` while they run), so a client that vanishes goes offline within it; a long
/// poll is woken when one of those it asks about comes online or goes (an expiry included),
/// never by anyone else. An identity
/// changing its state more often than every ``minimumInterval`` is refused (the caller answers
/// 429). Used by the zone server's storages and the in-memory backend.
public final class PresenceBoard: Sendable {
    /// How long "online" holds without being said again.
    public static let lifetime = Duration.seconds(90)
    /// How often an online client says it again.
    public static let refreshInterval = Duration.seconds(60)
    /// The shortest interval between two states from one identity.
    public static let minimumInterval = Duration.seconds(1)
    /// The most identities one ask names (a long poll's `of`, a stream's watch).
    public static let maximumAsked = 256

    /// `asked` without repeats, if a server takes it: at most ``maximumAsked`` identities, none
    /// empty or over 256 bytes; nil otherwise.
    public static func ask(_ asked: [String]) -> [String]? {
        var seen = Set<String>()
        let identities = asked.filter { seen.insert($0).inserted }
        guard identities.count <= maximumAsked, identities.allSatisfy({ !$0.isEmpty && $0.utf8.count <= 256 }) else { return nil }
        return identities
    }

    private struct Entry {
        var onlineUntil: ContinuousClock.Instant?
        var lastSeen: Date
        var lastChange: ContinuousClock.Instant
    }
    private let entries = Mutex<[String: Entry]>([:])
    private let waiters = ChangeWaiters()
    /// The key a long poll waits on for an identity (one that is no zone name shares one key).
    private static func key(_ identity: String) -> ZoneName { (try? ZoneName(identity)) ?? ZoneName(constant: "_") }
    private let lifetime: Duration

    /// - Parameter lifetime: how long "online" holds (``PresenceBoard/lifetime``; shorter in tests).
    public init(lifetime: Duration = PresenceBoard.lifetime) { self.lifetime = lifetime }

    /// Sets an identity's state, unless it changed less than ``minimumInterval`` ago.
    /// - Parameters:
    ///   - seen: when (another server's notification carries its own time).
    ///   - rateLimited: false for a state another server already accepted.
    /// - Returns: false when refused for the rate.
    @discardableResult
    public func set(_ online: Bool, identity: String, seen: Date = Date(), rateLimited: Bool = true) -> Bool {
        let now = ContinuousClock.now
        let (accepted, changed) = entries.withLock { entries -> (Bool, Bool) in
            let held = entries[identity]
            if rateLimited, let held, now - held.lastChange < Self.minimumInterval { return (false, false) }
            let was = held?.onlineUntil.map { $0 > now } ?? false
            entries[identity] = Entry(onlineUntil: online ? now + lifetime : nil, lastSeen: max(seen, held?.lastSeen ?? seen), lastChange: now)
            return (true, was != online)
        }
        guard accepted else { return false }
        if changed { waiters.wake(Self.key(identity)) }
        if online {
            // The expiry: if it was not said again by then, the identity is gone and waiters learn it.
            let lifetime = self.lifetime
            Task { [weak self] in
                try? await Task.sleep(for: lifetime + .milliseconds(20))
                self?.expire(identity)
            }
        }
        return true
    }

    /// The presence of `identities` now, in their order, and the version of that.
    public func current(of identities: [String]) -> PresenceState {
        let now = ContinuousClock.now
        let version = waiters.generation(of: identities.map(Self.key))
        let presence = entries.withLock { entries in
            identities.map { identity in
                let entry = entries[identity]
                return Presence(identity: identity, isOnline: entry?.onlineUntil.map { $0 > now } ?? false, lastSeen: entry?.lastSeen)
            }
        }
        return PresenceState(presence: presence, version: version)
    }

    /// The presence once one of theirs moved past `version` (at once when it did already), or
    /// after `timeout` as it is then.
    public func wait(of identities: [String], since version: UInt64?, timeout: Duration) async -> PresenceState {
        let keys = identities.map(Self.key)
        let generation = waiters.generation(of: keys)
        if let version, version == generation {
            _ = await waiters.wait(forAnyOf: keys, after: generation, timeout: timeout)
        }
        return current(of: identities)
    }

    /// Tells `observer` of every later change of the online state of `identities` (by name; nil:
    /// any of them may have changed), until ``stopObserving(_:)`` (a stream's watches); calling it
    /// again for `id` adds some.
    public func observe(_ identities: [String], as id: UUID, _ observer: @escaping @Sendable (String?) -> Void) {
        let shared = Self.key("")
        waiters.observe(identities.map(Self.key), as: id) { key in observer(key == shared ? nil : key?.rawValue) }
    }

    public func stopObserving(_ id: UUID) { waiters.stopObserving(id) }

    /// How many identities are online now (for metrics and tests).
    public var onlineCount: Int {
        let now = ContinuousClock.now
        return entries.withLock { $0.values.filter { $0.onlineUntil.map { $0 > now } ?? false }.count }
    }

    /// Ends every long poll (a server stopping).
    public func releaseAll() { waiters.releaseAll() }

    private func expire(_ identity: String) {
        let now = ContinuousClock.now
        let expired = entries.withLock { entries -> Bool in
            guard let until = entries[identity]?.onlineUntil, until <= now else { return false }
            entries[identity]?.onlineUntil = nil
            return true
        }
        if expired { waiters.wake(Self.key(identity)) }
    }
}
