import CCurl
import Foundation
import Synchronization

/// A zone server's stream (docs/PROTOCOL.md §2, "The stream"): one connection, opened with one
/// signed request, down which the server pushes every new version of the zones this client
/// follows — verified here as a fetched page is (``HTTPBackend`` checks every signature with its
/// own policy: a pushed record is as untrusted as a fetched one).
///
/// ```swift
/// let stream = try await backend.openStream()
/// try stream.follow([zone: token])
/// for try await event in stream.events { … }   // ends with an error when the connection does
/// ```
///
/// The connection runs on a thread of its own (libcurl connects, does TLS, and carries the
/// bytes; the framing is ours), never on the caller's: it pings the server every
/// ``Wire/StreamFrame/heartbeatSeconds`` and takes it for gone after
/// ``Wire/StreamFrame/silenceSeconds`` without a frame.
public final class ServerStream: ChangeStream {
    /// What the server pushed.
    public typealias Event = LiveChange

    /// The events, in the order the server sent them; the sequence ends with an error when
    /// the connection does (``RecordZoneError/Code/networkUnavailable``, or the server's reason
    /// for closing it), and without one after ``close()``. While the reader lets them pile up
    /// (more than the stream's `bufferedEvents`), the connection reads nothing more, and the
    /// server, finding the socket full, pushes nothing more: nothing is lost, the rest comes
    /// from the server's tokens once the reader takes them. Iterating holds the stream open.
    public var events: Events { Events(stream: self) }
    /// The connection and its thread (which holds it, not this handle: a stream nobody holds
    /// any more is closed).
    let core: Core

    private init(core: Core) { self.core = core }

    deinit { core.close() }

    /// Opens the stream: connects, sends the signed opening request, and returns once the
    /// server answered `101` (or throws its refusal, as any request's).
    static func open(_ backend: HTTPBackend, bufferedEvents: Int) async throws(RecordZoneError) -> ServerStream {
        let core = try Core(backend: backend, bufferedEvents: bufferedEvents)
        let opened: Result<Void, RecordZoneError> = await withCheckedContinuation { opened in
            let thread = Thread { core.run(opened: opened) }
            thread.name = "convkit.stream"
            thread.start()
        }
        try opened.get()
        return ServerStream(core: core)
    }

    /// Follows `zones`, each from its token (nil: from its beginning); following a zone again
    /// starts it again from the token given.
    public func follow(_ zones: [ZoneName: ChangeToken?]) throws(RecordZoneError) {
        let frame = Wire.StreamFrame(type: .follow, zones: Dictionary(uniqueKeysWithValues: zones.map { ($0.key.rawValue, $0.value) }))
        guard let payload = try? frame.encoded() else { throw RecordZoneError(.invalidArguments, "cannot encode the zones to follow") }
        try core.queue(payload)
    }

    /// Asks to be told of the database feed (``LiveChange/feed``): at once, then whenever a
    /// zone this stream does not follow moves for this identity (docs/PROTOCOL.md §2.4).
    public func followFeed() throws(RecordZoneError) {
        guard let payload = try? Wire.StreamFrame(type: .follow, zones: [:], feed: true).encoded() else {
            throw RecordZoneError(.invalidArguments, "cannot encode the ask for the feed")
        }
        try core.queue(payload)
    }

    /// Whether the server reads `watch` frames (its `101` named them, ``Wire/StreamFrame/framesHeader``).
    public var canWatch: Bool { core.offersWatch.withLock { $0 } }

    public func watch(_ zone: ZoneName, presenceOf identities: [String]) throws(RecordZoneError) {
        guard canWatch else { throw RecordZoneError(.routeNotFound, "this server's stream carries no typing or presence") }
        try send(Wire.StreamFrame(type: .watch, zone: zone.rawValue, of: identities))
    }

    public func unwatch(_ zone: ZoneName) throws(RecordZoneError) {
        guard canWatch else { return }
        try send(Wire.StreamFrame(type: .unwatch, zone: zone.rawValue))
    }

    private func send(_ frame: Wire.StreamFrame) throws(RecordZoneError) {
        guard let payload = try? frame.encoded() else { throw RecordZoneError(.invalidArguments, "cannot encode a '\(frame.type.rawValue)' frame") }
        try core.queue(payload)
    }

    /// Closes the stream; ``events`` ends.
    public func close() { core.close() }

    public func next() async throws -> LiveChange? { try await core.events.next() }

    /// The events as an asynchronous sequence (``events``).
    public struct Events: AsyncSequence, Sendable {
        public typealias Element = Event
        let stream: ServerStream

        public struct AsyncIterator: AsyncIteratorProtocol {
            let stream: ServerStream
            public mutating func next() async throws -> Event? { try await stream.core.events.next() }
        }

        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(stream: stream) }
    }

    /// The stream's connection, on its own thread (``open(_:bufferedEvents:)``).
    final class Core: Sendable {
        let events: EventQueue
        private let backend: HTTPBackend
        /// Frames waiting to be written, and whether the stream was closed.
        private let outgoing = Mutex<(frames: [Data], closed: Bool)>(([], false))
        /// Written to wake the thread (a frame to send, a close).
        private let wakeup: Int32
        /// The server's `101` offered `watch` frames.
        let offersWatch = Mutex(false)

        init(backend: HTTPBackend, bufferedEvents: Int) throws(RecordZoneError) {
            self.backend = backend
            let wakeup = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
            guard wakeup >= 0 else { throw RecordZoneError(.ioError, "cannot open a stream: \(String(cString: strerror(errno)))") }
            self.wakeup = wakeup
            events = EventQueue(capacity: max(1, bufferedEvents), wakeup: wakeup)
        }

        deinit { Glibc.close(wakeup) }

        func close() {
            outgoing.withLock { $0.closed = true }
            wake()
        }

        func queue(_ payload: Data) throws(RecordZoneError) {
            let closed = outgoing.withLock { state in
                if !state.closed { state.frames.append(payload) }
                return state.closed
            }
            guard !closed else { throw RecordZoneError(.networkUnavailable, "the stream is closed") }
            wake()
        }

        private func wake() {
            var one: UInt64 = 1
            _ = write(wakeup, &one, 8)
        }

        // MARK: The connection's thread

        /// Connects, opens, then carries frames until the connection or the stream ends.
        fileprivate func run(opened: CheckedContinuation<Result<Void, RecordZoneError>, Never>) {
            guard let handle = curl_easy_init() else {
                return opened.resume(returning: .failure(RecordZoneError(.internalError, "curl_easy_init failed")))
            }
            defer { curl_easy_cleanup(handle) }
            let connection = Connection(handle: handle, wakeup: wakeup)
            do {
                try connection.connect(backend)
                let frames = try connection.open(backend)
                offersWatch.withLock { $0 = frames.contains("watch") }
            } catch {
                return opened.resume(returning: .failure(error))
            }
            opened.resume(returning: .success(()))
            do {
                try carry(connection)
                events.finish(nil)
            } catch {
                events.finish(error)
            }
            outgoing.withLock { $0.closed = true }
        }

        /// Reads frames and writes queued ones until closed or failed.
        private func carry(_ connection: Connection) throws(RecordZoneError) {
            let ping = (try? Wire.StreamFrame(type: .ping).encoded()) ?? Data()
            let silence = backend.streamTiming.silence, heartbeat = backend.streamTiming.heartbeat
            // The monotonic clock: a wall clock set back or forward (NTP, a user) neither stops
            // the pings nor ends the stream as silent.
            let clock = ContinuousClock()
            var lastHeard = clock.now, lastSent = clock.now
            while true {
                let (frames, closed) = outgoing.withLock { state in
                    defer { state.frames = [] }
                    return (state.frames, state.closed)
                }
                if closed { return }
                for frame in frames {
                    try connection.write(frame)
                    lastSent = clock.now
                }
                if clock.now - lastSent >= heartbeat {
                    try connection.write(ping)
                    lastSent = clock.now
                }
                // A reader behind: read nothing until it takes some (its taking wakes this thread);
                // the server's silence meanwhile is this side's doing.
                let reading = events.hasRoom
                if !reading { lastHeard = clock.now }
                // Only the silence ends it (a ping falling due as this is reckoned only shortens the wait).
                let heard = clock.now - lastHeard
                guard heard < silence else { throw RecordZoneError(.networkUnavailable, "the server said nothing for \(silence)") }
                let wait = max(0.001, min((heartbeat - (clock.now - lastSent)).inSeconds, (silence - heard).inSeconds))
                for payload in try connection.read(waiting: wait, socket: reading) {
                    lastHeard = clock.now
                    try deliver(payload)
                }
            }
        }

        /// One frame from the server.
        private func deliver(_ payload: Data) throws(RecordZoneError) {
            guard let frame = try? JSONDecoder().decode(Wire.StreamFrame.self, from: payload) else {
                throw RecordZoneError(.malformed, "the server sent a malformed stream frame")
            }
            let event: Event
            switch frame.type {
            case .ping: return
            case .feed: event = .feed
            case .live:
                guard let name = frame.zone, let zone = try? ZoneName(name) else { throw RecordZoneError(.malformed, "a 'live' frame without its zone") }
                if let error = frame.error {
                    event = .live(zone, .failure(error.error()))
                } else {
                    event = .live(zone, .success(LiveState(typing: frame.typing ?? [], presence: (frame.presence ?? []).map(\.presence))))
                }
            case .watch, .unwatch: throw RecordZoneError(.malformed, "the server sent a '\(frame.type.rawValue)' frame")
            case .follow: throw RecordZoneError(.malformed, "the server sent a 'follow' frame")
            case .changes:
                guard let name = frame.zone, let zone = try? ZoneName(name), let changes = frame.changes else {
                    throw RecordZoneError(.malformed, "a 'changes' frame without its zone or changes")
                }
                event = .changes(zone, since: frame.since, backend.admit(changes))
            case .failed:
                let error = frame.error?.error() ?? RecordZoneError(.internalError, "the server gave no reason")
                guard let name = frame.zone else { throw error }  // the whole stream
                guard let zone = try? ZoneName(name) else { throw RecordZoneError(.malformed, "a 'failed' frame for '\(name)', not a zone") }
                event = .failed(zone, error)
            }
            events.put(event)
        }
    }

    /// Events read and not yet taken, with room for `capacity`: the thread stops reading the
    /// socket while it is full, and the reader's taking one wakes it.
    final class EventQueue: Sendable {
        private struct State {
            var events: [Event] = []
            var head = 0
            var end: (any Error)?? = nil
            var waiter: CheckedContinuation<Event?, any Error>?
        }
        private let state = Mutex(State())
        private let capacity: Int
        private let wakeup: Int32

        init(capacity: Int, wakeup: Int32) {
            self.capacity = capacity
            self.wakeup = wakeup
        }

        var hasRoom: Bool { state.withLock { $0.events.count - $0.head < capacity } }

        func put(_ event: Event) {
            let waiter = state.withLock { state -> CheckedContinuation<Event?, any Error>? in
                guard let waiter = state.waiter else {
                    state.events.append(event)
                    return nil
                }
                state.waiter = nil
                return waiter
            }
            waiter?.resume(returning: event)
        }

        /// The end: nil after a close, the error that ended the connection otherwise.
        func finish(_ error: (any Error)?) {
            let waiter = state.withLock { state -> CheckedContinuation<Event?, any Error>? in
                if state.end == nil { state.end = .some(error) }
                defer { state.waiter = nil }
                return state.waiter
            }
            if let error { waiter?.resume(throwing: error) } else { waiter?.resume(returning: nil) }
        }

        func next() async throws -> Event? {
            try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { continuation in
                    let now = state.withLock { state -> Result<Event?, any Error>? in
                        if state.head < state.events.count {
                            defer {
                                state.head += 1
                                if state.head > 64, state.head * 2 > state.events.count {
                                    state.events.removeFirst(state.head)
                                    state.head = 0
                                }
                            }
                            return .success(state.events[state.head])
                        }
                        if let end = state.end { return end.map { .failure($0) } ?? .success(nil) }
                        if Task.isCancelled { return .success(nil) }
                        state.waiter = continuation
                        return nil
                    }
                    if let now {
                        continuation.resume(with: now)
                        self.wake()
                    }
                }
            } onCancel: {
                let waiter = state.withLock { state -> CheckedContinuation<Event?, any Error>? in
                    defer { state.waiter = nil }
                    return state.waiter
                }
                waiter?.resume(returning: nil)
            }
        }

        /// Tells the connection's thread there is room again.
        private func wake() {
            var one: UInt64 = 1
            _ = write(wakeup, &one, 8)
        }
    }

    /// The connection: libcurl's, used only on the stream's thread.
    private final class Connection {
        let handle: UnsafeMutableRawPointer
        let wakeup: Int32
        var socket: curl_socket_t = -1
        var incoming = Data()
        /// The server closed the connection after the bytes in ``incoming``.
        var ended = false

        init(handle: UnsafeMutableRawPointer, wakeup: Int32) {
            self.handle = handle
            self.wakeup = wakeup
        }

        func connect(_ backend: HTTPBackend) throws(RecordZoneError) {
            ck_setopt_string(handle, CURLOPT_URL, backend.baseURL.absoluteString)
            ck_setopt_long(handle, CURLOPT_CONNECT_ONLY, 1)
            ck_setopt_long(handle, CURLOPT_NOSIGNAL, 1)
            ck_setopt_long(handle, CURLOPT_CONNECTTIMEOUT_MS, 10_000)
            if let caFile = backend.caFile { ck_setopt_string(handle, CURLOPT_CAINFO, caFile) }
            let code = curl_easy_perform(handle)
            guard code == CURLE_OK else { throw RecordZoneError(.networkUnavailable, "stream to \(backend.baseURL): \(String(cString: curl_easy_strerror(code)))") }
            guard ck_getinfo_socket(handle, CURLINFO_ACTIVESOCKET, &socket) == CURLE_OK, socket >= 0 else {
                throw RecordZoneError(.networkUnavailable, "stream to \(backend.baseURL): no socket")
            }
        }

        /// Sends the signed opening request and reads the answer: `101`, or the refusal.
        /// - Returns: the client frames the server offers beyond `follow` and `ping`.
        func open(_ backend: HTTPBackend) throws(RecordZoneError) -> Set<String> {
            let path = "/v1/stream"
            var host = backend.baseURL.host ?? "localhost"
            if host.contains(":") { host = "[\(host)]" }
            if let port = backend.baseURL.port { host += ":\(port)" }
            var request = "GET \(path) HTTP/1.1\r\nHost: \(host)\r\nConnection: Upgrade\r\nUpgrade: \(Wire.StreamFrame.protocolName)\r\n"
            request += "Authorization: \(RequestSignature.authorization(method: "GET", path: path, query: [], body: Data(), identity: backend.identity, key: backend.key, now: backend.now()))\r\n"
            if let certificate = backend.deviceCertificate { request += "\(RequestSignature.deviceHeader): \(certificate.base64EncodedString())\r\n" }
            try sendAll(Data((request + "\r\n").utf8))
            let deadline = ContinuousClock.now + min(.seconds(30), backend.streamTiming.silence)
            var head: Range<Data.Index>?
            while head == nil {
                let left = (deadline - .now).inSeconds
                guard left > 0, incoming.count < 64 << 10 else { throw RecordZoneError(.networkUnavailable, "the server did not answer the stream's opening") }
                try receive(waiting: left)
                head = incoming.range(of: Data("\r\n\r\n".utf8))
            }
            guard let head else { return [] }
            let lines = String(decoding: incoming[..<head.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
            incoming.removeSubrange(..<head.upperBound)
            let status = lines.first.flatMap { $0.split(separator: " ").dropFirst().first }.flatMap { Int($0) } ?? 0
            if status == 101 {
                // Switched to this protocol, not another (a proxy's WebSocket, say).
                let upgrade = lines.dropFirst().first { $0.lowercased().hasPrefix("upgrade:") }.map { $0.dropFirst(8).trimmingCharacters(in: .whitespaces) }
                guard upgrade?.lowercased() == Wire.StreamFrame.protocolName else {
                    throw RecordZoneError(.malformed, "the server switched to '\(upgrade ?? "")', not \(Wire.StreamFrame.protocolName)")
                }
                let header = Wire.StreamFrame.framesHeader.lowercased() + ":"
                let offered = lines.dropFirst().first { $0.lowercased().hasPrefix(header) }.map { $0.dropFirst(header.count) } ?? ""
                return Set(offered.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
            }
            // A refusal: its body (by its length) says why, as any answer's.
            let length = lines.dropFirst().compactMap { line -> Int? in
                let parts = line.split(separator: ":", maxSplits: 1)
                guard parts.count == 2, parts[0].lowercased() == "content-length" else { return nil }
                return Int(parts[1].trimmingCharacters(in: .whitespaces))
            }.first ?? 0
            while incoming.count < min(length, 64 << 10), deadline > .now {
                try receive(waiting: (deadline - .now).inSeconds)
            }
            let failure = try? JSONDecoder().decode(Wire.ErrorBody.self, from: incoming).error
            // A server without streams answers `routeNotFound` (404), as for any unknown route.
            throw failure?.error() ?? RecordZoneError(status == 404 ? .routeNotFound : .internalError, "the stream was answered HTTP \(status)")
        }

        /// Writes a frame (its length, then its bytes).
        func write(_ payload: Data) throws(RecordZoneError) {
            try sendAll(Wire.StreamFrame.framed(payload))
        }

        /// The complete frames that arrive within `seconds` (none when it passes, or when
        /// woken for a frame to send); with `socket` false, only waits for a wake-up.
        func read(waiting seconds: Double, socket reading: Bool = true) throws(RecordZoneError) -> [Data] {
            // A frame too long to take, after the ones before it were delivered.
            if let length = nextLength, length > Wire.maximumStreamFrame { throw RecordZoneError(.limitExceeded, "the server sent a frame of \(length) bytes") }
            // Frames already here (sent with the `101`, or with the server's close) go first.
            if nextLength.map({ incoming.count < 4 + $0 }) ?? true { try receive(waiting: seconds, socket: reading) }
            var frames = [Data]()
            while let length = nextLength {
                guard length <= Wire.maximumStreamFrame else {
                    if frames.isEmpty { throw RecordZoneError(.limitExceeded, "the server sent a frame of \(length) bytes") }
                    break
                }
                let start = incoming.startIndex
                guard incoming.count >= 4 + length else { break }
                frames.append(Data(incoming[start + 4..<start + 4 + length]))
                incoming.removeFirst(4 + length)
            }
            return frames
        }

        /// The length the next frame's first 4 bytes give, once they came.
        private var nextLength: Int? {
            guard incoming.count >= 4 else { return nil }
            return incoming.prefix(4).reduce(0) { $0 << 8 | Int($1) }
        }

        /// Waits up to `seconds` for bytes (or a wake-up), and takes what arrived.
        private func receive(waiting seconds: Double, socket reading: Bool = true) throws(RecordZoneError) {
            var fds = [pollfd(fd: reading ? socket : -1, events: Int16(POLLIN), revents: 0), pollfd(fd: wakeup, events: Int16(POLLIN), revents: 0)]
            // TLS may hold decrypted bytes that poll cannot see: read first.
            if reading, try take() { return }
            let result = poll(&fds, 2, Int32(max(0, min(seconds, 3600)) * 1000))
            if result < 0, errno != EINTR { throw RecordZoneError(.networkUnavailable, "poll: \(String(cString: strerror(errno)))") }
            if fds[1].revents != 0 {
                var value: UInt64 = 0
                _ = Glibc.read(wakeup, &value, 8)
            }
            if fds[0].revents != 0 { _ = try take() }
        }

        /// Reads what libcurl has now. - Returns: whether anything came.
        private func take() throws(RecordZoneError) -> Bool {
            if ended { throw RecordZoneError(.networkUnavailable, "the server closed the stream") }
            var buffer = [UInt8](repeating: 0, count: 64 << 10)
            var any = false
            while true {
                var got = 0
                let code = buffer.withUnsafeMutableBytes { curl_easy_recv(handle, $0.baseAddress, $0.count, &got) }
                if code == CURLE_AGAIN { return any }
                guard code == CURLE_OK else { throw RecordZoneError(.networkUnavailable, "stream: \(String(cString: curl_easy_strerror(code)))") }
                guard got > 0 else {
                    // The server closed the stream: what came before the end (its last frame,
                    // saying why) is delivered first, and the next read says it ended.
                    if any {
                        ended = true
                        return true
                    }
                    throw RecordZoneError(.networkUnavailable, "the server closed the stream")
                }
                incoming.append(contentsOf: buffer[0..<got])
                any = true
            }
        }

        private func sendAll(_ data: Data) throws(RecordZoneError) {
            var offset = 0
            while offset < data.count {
                var sent = 0
                let code = data.withUnsafeBytes { raw in
                    guard let base = raw.baseAddress else { return CURLE_OK }
                    return curl_easy_send(handle, base + offset, raw.count - offset, &sent)
                }
                if code == CURLE_AGAIN {
                    var fd = pollfd(fd: socket, events: Int16(POLLOUT), revents: 0)
                    guard poll(&fd, 1, 30_000) > 0 else { throw RecordZoneError(.networkUnavailable, "the server took nothing for 30 s") }
                    continue
                }
                guard code == CURLE_OK else { throw RecordZoneError(.networkUnavailable, "stream: \(String(cString: curl_easy_strerror(code)))") }
                offset += sent
            }
        }
    }
}

extension HTTPBackend: LiveChanges {
    public func openChangeStream() async throws(RecordZoneError) -> any ChangeStream { try await openStream() }

    /// Opens a stream to the server (``ServerStream``). - Throws: the server's refusal (as any
    /// request's), ``RecordZoneError/Code/routeNotFound`` from a server without streams, or
    /// ``RecordZoneError/Code/networkUnavailable``.
    /// - Parameter bufferedEvents: how many events wait for the reader before the connection
    ///   stops reading (and the server stops pushing; nothing is lost: it pushes on from its
    ///   tokens once the reader takes them).
    public func openStream(bufferedEvents: Int = 64) async throws(RecordZoneError) -> ServerStream {
        try await ServerStream.open(self, bufferedEvents: bufferedEvents)
    }
}

extension Wire {
    /// The largest frame a client takes from a server (far above a page of 200 records).
    public static let maximumStreamFrame = 256 << 20
}
