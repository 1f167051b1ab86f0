/// A backend that pushes its zones' new versions down a connection it holds, rather than being
/// asked (a zone server's stream, docs/PROTOCOL.md §2.4): the continuous sync follows its zones
/// there, and fetches only what the stream cannot carry.
public protocol LiveChanges: RecordZoneBackend {
    /// Opens a stream. - Throws: the backend's refusal, ``RecordZoneError/Code/routeNotFound``
    /// where this backend has no stream after all (an older server: ask instead).
    func openChangeStream() async throws(RecordZoneError) -> any ChangeStream
}

/// One open stream of a ``LiveChanges`` backend.
public protocol ChangeStream: Sendable {
    /// Follows `zones`, each from its token (nil: from its beginning); following a zone again
    /// starts it again from the token given.
    func follow(_ zones: [ZoneName: ChangeToken?]) throws(RecordZoneError)
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
}
