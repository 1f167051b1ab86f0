import Synchronization

/// A backend that tells of its zones' changes as they happen, rather than being asked: a zone
/// server pushes the new versions themselves down its stream (docs/PROTOCOL.md §2.4); memory
/// and a watched folder (inotify) say which zones moved, and the reader reads them. The
/// continuous sync follows its zones there and fetches only what the stream does not carry.
public protocol LiveChanges: RecordZoneBackend {
    /// Opens a stream. - Throws: the backend's refusal, ``RecordZoneError/Code/routeNotFound``
    /// where this backend has no stream after all (an older server, a folder on a file system
    /// without notifications: ask instead).
    func openChangeStream() async throws(RecordZoneError) -> any ChangeStream
}

/// One open stream of a ``LiveChanges`` backend.
public protocol ChangeStream: Sendable {
    /// Follows `zones`, each from its token (nil: from its beginning); following a zone again
    /// starts it again from the token given.
    func follow(_ zones: [ZoneName: ChangeToken?]) throws(RecordZoneError)
    /// Asks to be told (``LiveChange/feed``) when the database feed may name a zone this stream
    /// does not follow. A stream that cannot tell ignores it (its reader polls the feed).
    func followFeed() throws(RecordZoneError)
    /// Whether ``watch(_:presenceOf:)`` may be asked (the backend carries typing and presence
    /// down this stream).
    var canWatch: Bool { get }
    /// Watches a zone's live state — who types there, and the presence of `presenceOf` — told
    /// as ``LiveChange/live(_:_:)``, at once and at each change; replaces an earlier watch of it.
    func watch(_ zone: ZoneName, presenceOf: [String]) throws(RecordZoneError)
    /// Stops watching `zone`.
    func unwatch(_ zone: ZoneName) throws(RecordZoneError)
    /// The next change, in the order the backend sent them; nil once the stream was closed;
    /// throws what ended it otherwise (``RecordZoneError/Code/networkUnavailable``, or the
    /// backend's reason).
    func next() async throws -> LiveChange?
    /// Closes the stream; ``next()`` then returns nil.
    func close()
}

/// What a ``ChangeStream`` carries.
public enum LiveChange: Sendable {
    /// A page of a followed zone's changes after `since`, verified as a fetched page is (a pushed
    /// record is as untrusted as a fetched one): it holds the zone's changes from `since` only,
    /// so a reader applies it (and keeps its token) only where its own token is `since`.
    case changes(ZoneName, since: ChangeToken?, ZoneChanges)
    /// The backend no longer follows this zone for this stream (why: the error); read it by
    /// request from here on.
    case failed(ZoneName, RecordZoneError)
    /// This zone moved (nil: any zone may have, new ones too): read it by request. What a
    /// backend says that does not carry the changes themselves.
    case moved(ZoneName?)
    /// The database feed may name a zone this stream does not follow (a conversation started
    /// with this identity, a group it was let into, a zone deleted): read the feed. Only after
    /// ``ChangeStream/followFeed()``, first at once (it may have moved before the stream opened);
    /// a reader that had it may stop polling the feed while the stream stands.
    case feed
    /// A watched zone's live state (``ChangeStream/watch(_:presenceOf:)``), or why the watch
    /// was refused (it then ends).
    case live(ZoneName, Result<LiveState, RecordZoneError>)
}

/// Who types in a zone (the reader left out) and the presence of those it asked about who take
/// part in it now, in the order asked.
public struct LiveState: Sendable, Hashable {
    public var typing: [String]
    public var presence: [Presence]

    public init(typing: [String], presence: [Presence]) {
        self.typing = typing
        self.presence = presence
    }
}

extension ChangeStream {
    public func followFeed() throws(RecordZoneError) {}
    public var canWatch: Bool { false }
    public func watch(_ zone: ZoneName, presenceOf: [String]) throws(RecordZoneError) {
        throw RecordZoneError(.routeNotFound, "this stream carries no typing or presence")
    }
    public func unwatch(_ zone: ZoneName) throws(RecordZoneError) {}
}

/// A ``ChangeStream`` that says which zones moved and carries nothing else (``LiveChange/moved(_:)``):
/// moves not yet taken are gathered, so a burst of writes to a zone is one event.
final class MovedZones: ChangeStream {
    private struct State {
        var zones: [ZoneName] = []
        var any = false
        var closed = false
        var waiter: CheckedContinuation<LiveChange?, Never>?
    }
    private let state = Mutex(State())
    private let followed: @Sendable (MovedZones, [ZoneName: ChangeToken?]) -> Void
    private let closing: @Sendable () -> Void

    /// - Parameters:
    ///   - followed: told of each follow, to watch those zones (and say which moved already).
    ///   - closing: told once, when the stream is closed.
    init(followed: @escaping @Sendable (MovedZones, [ZoneName: ChangeToken?]) -> Void = { _, _ in }, closing: @escaping @Sendable () -> Void) {
        self.followed = followed
        self.closing = closing
    }

    deinit { close() }

    /// `zone` moved (nil: any may have).
    func moved(_ zone: ZoneName?) {
        let waiter = state.withLock { state -> CheckedContinuation<LiveChange?, Never>? in
            guard !state.closed else { return nil }
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter
            }
            if let zone {
                if !state.zones.contains(zone) { state.zones.append(zone) }
            } else {
                state.any = true
            }
            return nil
        }
        waiter?.resume(returning: .moved(zone))
    }

    func follow(_ zones: [ZoneName: ChangeToken?]) throws(RecordZoneError) {
        guard !state.withLock({ $0.closed }) else { throw RecordZoneError(.networkUnavailable, "the stream is closed") }
        followed(self, zones)
    }

    func next() async throws -> LiveChange? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let now = state.withLock { state -> LiveChange?? in
                    if state.closed || Task.isCancelled { return .some(nil) }
                    if state.any {
                        state.any = false
                        state.zones = []
                        return .moved(nil)
                    }
                    if !state.zones.isEmpty { return .moved(state.zones.removeFirst()) }
                    state.waiter = continuation
                    return nil
                }
                if let now { continuation.resume(returning: now) }
            }
        } onCancel: {
            let waiter = state.withLock { state in
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume(returning: nil)
        }
    }

    func close() {
        let (waiter, first) = state.withLock { state -> (CheckedContinuation<LiveChange?, Never>?, Bool) in
            defer {
                state.closed = true
                state.waiter = nil
            }
            return (state.waiter, !state.closed)
        }
        waiter?.resume(returning: nil)
        if first { closing() }
    }
}
