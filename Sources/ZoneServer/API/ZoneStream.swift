import Foundation
import RecordZone
import Synchronization

/// One client's stream (docs/PROTOCOL.md §2, "The stream"): the zones it follows, each from its
/// token, and a push of each zone's new versions as soon as they are committed — read by
/// exactly the rules of `GET /v1/zones/{zone}/changes` (who may read the zone, which versions of
/// a group), one page at a time; when asked, a `feed` frame when a zone it does not follow moves
/// for its identity (``StreamAudience``), and a `live` frame with the typing and presence of each
/// zone it watches, at each change.
///
/// Nothing is queued ahead of the client: a zone that moves is marked, and its changes are read
/// from the stream's token for it when the page before has left this server's memory (the
/// socket took all but ``ZoneStream/bufferedLimit`` bytes). So a reader that stops reading
/// costs one page, never a backlog; when it reads again it gets everything from its tokens, and
/// one that stays silent (``ZoneServerConfiguration/streamTiming``) is closed.
final class ZoneStream: Sendable {
    /// Bytes written ahead of the client before the next page is read.
    static let bufferedLimit = 1 << 20

    private struct State {
        var tokens: [ZoneName: ChangeToken?] = [:]
        var dirty: Set<ZoneName> = []
        var lastHeard = ContinuousClock.now
        /// The client asked for the feed (``StreamAudience``), and a `feed` frame is due.
        var feed = false
        var feedDue = false
        /// The zones watched (typing and presence), each with the identities asked about, and
        /// those whose `live` frame is due.
        var watches: [ZoneName: [String]] = [:]
        var liveDue: Set<ZoneName> = []
        /// What the last `live` frame of each watch said (a state that did not change is not told again).
        var told: [ZoneName: LiveState] = [:]
    }
    private let api: ZoneAPI
    private let identity: String
    /// The key the stream was opened with.
    private let key: Data
    private let connection: StreamConnection
    private let state = Mutex(State())
    private let id = UUID()
    /// Something to do: a zone moved, the client followed more.
    private let signal: AsyncStream<Void>
    private let signalContinuation: AsyncStream<Void>.Continuation

    init(api: ZoneAPI, identity: String, key: Data, connection: StreamConnection) {
        self.api = api
        self.identity = identity
        self.key = key
        self.connection = connection
        (signal, signalContinuation) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// Serves the stream until either side closes it.
    func run() async {
        api.streamCounters.opened.add(1, ordering: .relaxed)
        defer {
            api.storage.waiters.stopObserving(id)
            api.storage.typing.stopObserving(id)
            api.storage.presence.stopObserving(id)
            if let key = api.access.audienceKey(of: identity) { api.audience.leave(key, as: id) }
            connection.close()
            api.streamCounters.closed.add(1, ordering: .relaxed)
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.readFrames() }
            group.addTask { await self.keepAlive() }
            group.addTask { await self.push() }
            await group.next()
            signalContinuation.finish()
            group.cancelAll()
        }
        // What was said last (why the stream ends) reaches the client, if it reads within a second.
        await connection.finish(by: .now + .seconds(1))
    }

    /// The client's frames, until it closes.
    private func readFrames() async {
        while let payload = await connection.nextFrame() {
            state.withLock { $0.lastHeard = .now }
            guard let frame = try? JSONDecoder().decode(Wire.StreamFrame.self, from: payload) else {
                return fail(RecordZoneError(.malformed, "a stream frame is a JSON object with a known type"))
            }
            switch frame.type {
            case .ping: continue
            case .follow:
                do { try follow(frame.zones ?? [:]) } catch { return fail(error) }
                if frame.feed == true { followFeed() }
            case .watch, .unwatch:
                guard let name = frame.zone, let zone = try? ZoneName(name) else {
                    return fail(RecordZoneError(.malformed, "a '\(frame.type.rawValue)' frame names a zone"))
                }
                if frame.type == .watch {
                    guard await watch(zone, of: frame.of ?? []) else { return }
                } else {
                    state.withLock { state in
                        state.watches[zone] = nil
                        state.liveDue.remove(zone)
                        state.told[zone] = nil
                    }
                }
            case .changes, .failed, .feed, .live:
                return fail(RecordZoneError(.malformed, "a client does not send '\(frame.type.rawValue)' frames"))
            }
        }
    }

    /// Follows more zones (or the same from another token).
    private func follow(_ zones: [String: ChangeToken?]) throws(RecordZoneError) {
        var named = [ZoneName: ChangeToken?]()
        for (name, token) in zones {
            guard let zone = try? ZoneName(name) else { throw RecordZoneError(.invalidArguments, "'\(name)' is not a zone name") }
            named[zone] = token
        }
        let refused = state.withLock { state -> Bool in
            guard state.tokens.merging(named, uniquingKeysWith: { $1 }).count <= Wire.StreamFrame.maximumZones else { return true }
            state.tokens.merge(named) { $1 }
            state.dirty.formUnion(named.keys)
            return false
        }
        guard !refused else { throw RecordZoneError(.limitExceeded, "a stream follows at most \(Wire.StreamFrame.maximumZones) zones") }
        api.storage.waiters.observe(named.keys, as: id) { [weak self] zone in self?.moved(zone) }
        signalContinuation.yield()
    }

    /// Tells the client of the database feed from now on: at once (it may have moved while the
    /// client was away), then whenever a zone the stream does not follow moves for its identity
    /// (``StreamAudience``). Nothing at all where the policy names no audience for the identity.
    private func followFeed() {
        guard let key = api.access.audienceKey(of: identity), state.withLock({ state in
            defer { state.feed = true }
            return !state.feed
        }) else { return }
        api.audience.join(key, as: id) { [weak self] zone in self?.feedMoved(zone) }
        feedMoved(nil)
    }

    /// A zone of the identity's audience moved (nil: any may have): the client reads the feed,
    /// unless the stream follows that zone (its changes come down the stream).
    private func feedMoved(_ zone: ZoneName?) {
        let due = state.withLock { state in
            guard state.feed, zone.map({ state.tokens[$0] == nil }) ?? true else { return false }
            state.feedDue = true
            return true
        }
        if due { signalContinuation.yield() }
    }

    /// Watches a zone's typing and the presence of `asked` there: a `live` frame at once, then
    /// at each change. Each watch is a request's worth of the key's allowance (it waits when
    /// spent); one the server cannot take is refused in a `live` frame with the error.
    /// - Returns: false when the stream ends meanwhile.
    private func watch(_ zone: ZoneName, of asked: [String]) async -> Bool {
        guard await spendAllowance() else { return false }
        guard let identities = PresenceBoard.ask(asked) else {
            return refuse(zone, RecordZoneError(.invalidArguments, "a watch asks the presence of 0–\(PresenceBoard.maximumAsked) identities, none empty"))
        }
        let taken = state.withLock { state -> Bool in
            guard state.watches[zone] != nil || state.watches.count < Wire.StreamFrame.maximumWatches else { return false }
            state.watches[zone] = identities
            state.liveDue.insert(zone)
            state.told[zone] = nil
            return true
        }
        guard taken else { return refuse(zone, RecordZoneError(.limitExceeded, "a stream watches at most \(Wire.StreamFrame.maximumWatches) zones")) }
        api.storage.typing.observe([zone], as: id) { [weak self] moved in self?.liveMoved { watched, _ in watched == moved } }
        api.storage.presence.observe(identities, as: id) { [weak self] identity in self?.liveMoved { _, asked in identity.map(asked.contains) ?? true } }
        signalContinuation.yield()
        return true
    }

    /// A watch refused: said in its `live` frame. - Returns: whether the stream still stands.
    private func refuse(_ zone: ZoneName, _ error: RecordZoneError) -> Bool {
        connection.send((try? Wire.StreamFrame(type: .live, zone: zone.rawValue, error: Wire.Failure(error)).encoded()) ?? Data())
    }

    /// Typing or presence moved for the watches `affected` picks (by zone, and identities asked).
    private func liveMoved(_ affected: (ZoneName, [String]) -> Bool) {
        let due = state.withLock { state in
            let zones = state.watches.filter { affected($0.key, $0.value) }.keys
            state.liveDue.formUnion(zones)
            return !zones.isEmpty
        }
        if due { signalContinuation.yield() }
    }

    /// A followed zone moved (nil: any may have).
    private func moved(_ zone: ZoneName?) {
        state.withLock { state in
            if let zone { state.dirty.insert(zone) } else { state.dirty.formUnion(state.tokens.keys) }
        }
        signalContinuation.yield()
    }

    /// Says `feed` when due, then each watched zone's live state that moved, then each moved
    /// zone's changes, a page at a time, until the stream ends.
    private func push() async {
        for await _ in signal {
            guard sayFeed() else { return }
            while let (zone, asked) = state.withLock({ state in state.liveDue.popFirst().flatMap { zone in state.watches[zone].map { (zone, $0) } } }) {
                guard await pushLive(zone, asked) else { return }
            }
            while let zone = state.withLock({ $0.dirty.popFirst() }) {
                guard await pushPage(zone) else { return }
            }
        }
    }

    /// Sends the zone's changes after the stream's token for it, a page (more to come: marked
    /// again); a zone that can no longer be followed is dropped, and the client told why.
    /// (Out of ``push()``: an async function's frame is allocated per stream while it waits, so
    /// the loop that waits keeps a small one.) - Returns: false when the stream ended.
    private func pushPage(_ zone: ZoneName) async -> Bool {
        await connection.drained(below: Self.bufferedLimit)
        guard !connection.isClosed else { return false }
        guard let token = state.withLock({ $0.tokens[zone] }) else { return true }
        // Each zone read is a request's worth of the key's rate allowance.
        guard keyAllowed() else { return false }
        guard await spendAllowance() else { return false }
        do {
            let changes = try await api.streamChanges(in: zone, since: token, identity: identity)
            guard !changes.records.isEmpty || !changes.rejected.isEmpty || changes.token != token else { return true }
            let frame = Wire.StreamFrame(type: .changes, zone: zone.rawValue, since: token, changes: changes)
            guard connection.send(try frame.encoded()) else { return false }
            api.streamCounters.pushes.add(1, ordering: .relaxed)
            api.streamCounters.records.add(changes.records.count, ordering: .relaxed)
            state.withLock { state in
                // Followed again meanwhile from another token: that one stands.
                if state.tokens[zone] == token { state.tokens[zone] = changes.token }
                if changes.moreComing { state.dirty.insert(zone) }
            }
        } catch {
            // The zone is no longer followed, and the client told why (a token the storage
            // cannot serve, a zone it may not read, a storage failure).
            let failure = Self.failure(of: error)
            state.withLock { state in
                state.tokens[zone] = nil
                state.dirty.remove(zone)
            }
            // A zone deleted: its deletion is in the feed.
            if failure.code == RecordZoneError.Code.zoneNotFound.rawValue { feedMoved(zone) }
            return connection.send((try? Wire.StreamFrame(type: .failed, zone: zone.rawValue, error: failure).encoded()) ?? Data())
        }
        return true
    }

    /// Waits until the key's rate allowance has a request's worth and spends it (a watch and a
    /// zone read each cost one). - Returns: false when the stream ended meanwhile.
    private func spendAllowance() async -> Bool {
        while let after = api.authenticator.spend(key) {
            do { try await Task.sleep(for: .milliseconds(Int((after * 1000).rounded(.up)))) } catch { return false }
        }
        return true
    }

    /// What a client is told of an error that ends a followed zone or a watch.
    private static func failure(of error: any Error) -> Wire.Failure {
        (error as? APIError)?.failure ?? Wire.Failure(error as? RecordZoneError ?? RecordZoneError(.internalError, "\(error)"))
    }

    private static let feedFrame = (try? Wire.StreamFrame(type: .feed).encoded()) ?? Data()

    /// Sends a `feed` frame if one is due. - Returns: false when the connection is closed.
    private func sayFeed() -> Bool {
        guard state.withLock({ state in
            defer { state.feedDue = false }
            return state.feedDue
        }) else { return true }
        guard connection.send(Self.feedFrame) else { return false }
        api.streamCounters.feeds.add(1, ordering: .relaxed)
        return true
    }

    /// Sends a watched zone's live state, unless it is what was sent last; a watch no longer
    /// allowed (a group left) ends with the reason. - Returns: false when the stream ended.
    private func pushLive(_ zone: ZoneName, _ asked: [String]) async -> Bool {
        guard keyAllowed() else { return false }
        let frame: Wire.StreamFrame
        do {
            let live = try await api.liveState(in: zone, of: asked, identity: identity)
            guard state.withLock({ state in
                defer { state.told[zone] = live }
                return state.told[zone] != live
            }) else { return true }
            frame = Wire.StreamFrame(type: .live, zone: zone.rawValue, typing: live.typing, presence: live.presence.map(Wire.PresenceList.Entry.init))
        } catch {
            state.withLock { state in
                state.watches[zone] = nil
                state.told[zone] = nil
            }
            frame = Wire.StreamFrame(type: .live, zone: zone.rawValue, error: Self.failure(of: error))
        }
        guard connection.send((try? frame.encoded()) ?? Data()) else { return false }
        api.streamCounters.lives.add(1, ordering: .relaxed)
        return true
    }

    /// What a request would be refused, a stream is too: a key revoked (a lost device) or
    /// replaced since it opened ends it, before anything more is pushed.
    /// - Returns: false when it ended the stream.
    private func keyAllowed() -> Bool {
        guard api.storage.policy.pins.chain(for: identity)?.allowsNow(key) != true else { return true }
        let why = api.authenticator.keyFailure(identity: identity, key: key, chain: api.storage.policy.pins.chain(for: identity))
        fail(why.map { APIError($0).failure } ?? Wire.Failure(RecordZoneError(.notAuthenticated, "the stream's key is no longer allowed")))
        return false
    }

    /// A ping every heartbeat (``ZoneServerConfiguration/streamTiming``); a client silent
    /// for its silence is closed.
    private func keepAlive() async {
        let ping = (try? Wire.StreamFrame(type: .ping).encoded()) ?? Data()
        let timing = api.configuration.streamTiming
        while !Task.isCancelled {
            do { try await Task.sleep(for: timing.heartbeat) } catch { return }
            let silent = state.withLock { ContinuousClock.now - $0.lastHeard }
            if silent > timing.silence {
                api.configuration.logger.info("stream of '\(identity)' closed: the client was silent for \(silent)")
                return
            }
            guard connection.send(ping) else { return }
        }
    }

    /// Says why the stream ends (the caller then returns, which ends it).
    private func fail(_ error: RecordZoneError) {
        fail(Wire.Failure(error))
    }

    private func fail(_ failure: Wire.Failure) {
        connection.discardIncoming()
        if let frame = try? Wire.StreamFrame(type: .failed, error: failure).encoded() { connection.send(frame) }
    }
}

/// What `/metrics` counts of the streams.
final class StreamCounters: Sendable {
    let opened = Atomic(0)
    let closed = Atomic(0)
    let pushes = Atomic(0)
    let records = Atomic(0)
    let feeds = Atomic(0)
    let lives = Atomic(0)

    var open: Int { opened.load(ordering: .relaxed) - closed.load(ordering: .relaxed) }

    func render() -> String {
        """
        # HELP convkitd_streams_open Streams open now.
        # TYPE convkitd_streams_open gauge
        convkitd_streams_open \(open)
        # HELP convkitd_streams_opened_total Streams opened since start.
        # TYPE convkitd_streams_opened_total counter
        convkitd_streams_opened_total \(opened.load(ordering: .relaxed))
        # HELP convkitd_stream_pushes_total Pages of changes pushed down streams.
        # TYPE convkitd_stream_pushes_total counter
        convkitd_stream_pushes_total \(pushes.load(ordering: .relaxed))
        # HELP convkitd_stream_records_total Records pushed down streams.
        # TYPE convkitd_stream_records_total counter
        convkitd_stream_records_total \(records.load(ordering: .relaxed))
        # HELP convkitd_stream_feeds_total Streams told to read the database feed (a zone they do not follow moved).
        # TYPE convkitd_stream_feeds_total counter
        convkitd_stream_feeds_total \(feeds.load(ordering: .relaxed))
        # HELP convkitd_stream_live_total Typing and presence states pushed down streams (live frames).
        # TYPE convkitd_stream_live_total counter
        convkitd_stream_live_total \(lives.load(ordering: .relaxed))

        """
    }
}

/// The streams that asked for the database feed (docs/PROTOCOL.md §2.4, `feed`), each under its
/// identity's audience key (``ZoneAccessPolicy/audienceKey(of:)``). Every commit is told here
/// once, on the committing thread (on any server sharing the storage); its zone's audience
/// (``ZoneAccessPolicy/audience(of:)``: a pair's two participants) is looked up by name, and only
/// their streams hear of it — each then says `feed` unless it follows the zone. A governed zone
/// whose governing records moved is told to its readers (a group's members: one who was just
/// let in). So a new conversation reaches its other side at once, for one lookup per commit,
/// not one per stream.
final class StreamAudience: Sendable {
    private let streams = Mutex<[String: [UUID: @Sendable (ZoneName?) -> Void]]>([:])
    private let storage: any ZoneStorage
    private let id = UUID()

    init(storage: any ZoneStorage, access: any ZoneAccessPolicy, logger: Logger) {
        self.storage = storage
        storage.waiters.observeEvery(as: id) { [weak self] wake in
            guard let self else { return }
            switch wake {
            case .zone(let zone): self.tell(access.audience(of: zone), zone)
            case .all: self.tellEveryone()
            case .readers(let zone):
                guard let governance = access.governance, self.isHeard else { return }
                Task {
                    do {
                        guard let state = try await storage.governed([zone], by: governance)[zone] else { return }
                        self.tell(state.readers.compactMap(access.audienceKey(of:)), zone)
                    } catch {
                        // Its readers learn of it from the feed when they next read it.
                        logger.warning("who may read \(zone) now could not be read (its new readers are not told at once): \(error)")
                    }
                }
            }
        }
    }

    deinit { storage.waiters.stopObserving(id) }

    private var isHeard: Bool { streams.withLock { !$0.isEmpty } }

    func join(_ key: String, as stream: UUID, _ told: @escaping @Sendable (ZoneName?) -> Void) {
        streams.withLock { $0[key, default: [:]][stream] = told }
    }

    func leave(_ key: String, as stream: UUID) {
        streams.withLock { streams in
            streams[key]?[stream] = nil
            if streams[key]?.isEmpty == true { streams[key] = nil }
        }
    }

    private func tell(_ keys: [String], _ zone: ZoneName) {
        guard !keys.isEmpty else { return }
        let told = streams.withLock { streams in keys.flatMap { streams[$0].map { Array($0.values) } ?? [] } }
        for tell in told { tell(zone) }
    }

    private func tellEveryone() {
        for tell in streams.withLock({ $0.values.flatMap(\.values) }) { tell(nil) }
    }
}
