import CLibMicroHTTPD
import CMicroHTTPD
import Foundation
import RecordZone
import Synchronization

/// What an HTTP server serves: a value that turns requests into responses, with two early looks
/// at a request so that hostile traffic costs the attacker, not the server.
public protocol HTTPService: Sendable {
    /// Looks at a request's method, path and headers before its body is read; an answer refuses
    /// it with the body unread (an unauthenticated 40 MiB upload costs nothing).
    func preflight(method: String, path: String, headers: [String: String]) -> HTTPResponse?
    /// Looks at the first bytes of a body while it is still arriving (at 8 KiB, then each time it
    /// doubles); an answer refuses the request, and the rest of the body is dropped as it comes.
    func checkBody(method: String, path: String, prefix: Data) -> HTTPResponse?
    /// Whether answering the request may wait long for something else to happen (a long poll):
    /// its handler is then cancelled as soon as its client goes away.
    func mayWait(method: String, path: String) -> Bool
    /// Whether answering the request needs the client's address (``HTTPRequest/client``): read
    /// only then, off every other request's path.
    func needsClient(path: String) -> Bool
    /// Answers a complete request.
    func respond(to request: HTTPRequest) async -> HTTPResponse
}

extension HTTPService {
    public func preflight(method: String, path: String, headers: [String: String]) -> HTTPResponse? { nil }
    public func checkBody(method: String, path: String, prefix: Data) -> HTTPResponse? { nil }
    public func mayWait(method: String, path: String) -> Bool { false }
    public func needsClient(path: String) -> Bool { false }
}

/// Gauges of one HTTP server, shared with whoever reports them. They hold the server's work
/// itself (its handlers, its answers on their way out), which its stop closes: give each
/// server counters of its own.
public final class HTTPCounters: Sendable {
    /// Answers on their way out (from a complete request until libmicrohttpd has sent its answer).
    let answers = ServerWork()
    /// Requests handed to their handlers.
    let handlers = ServerWork()
    let abandoned = Atomic<Int>(0)
    let memoryReleases = Atomic<Int>(0)
    /// The listening daemon's idle-connection tracking (nil when not listening).
    let pressure = Mutex<HTTPServer.Pressure?>(nil)

    public init() {}

    /// Idle connections made to give way to new ones since the server started listening.
    public var idleConnectionsGivenWayCount: Int {
        pressure.withLock { $0.map { Int(cmhd_evicted_count($0.pointer)) } ?? 0 }
    }

    /// Handlers cancelled because their client went away while they waited (``HTTPService/mayWait(method:path:)``).
    public var abandonedCount: Int { abandoned.load(ordering: .relaxed) }
    /// How many times memory was given back to the system after a crowd of connections closed.
    public var memoryReleaseCount: Int { memoryReleases.load(ordering: .relaxed) }
    /// Connections open now.
    public var openConnectionCount: Int {
        pressure.withLock { $0.map { Int(cmhd_open_count($0.pointer)) } ?? 0 }
    }

    /// Requests being handled or answered now (counted until their answer has been sent).
    public var inFlightCount: Int { answers.count }
    /// Requests handed to a handler and not yet answered by it (a long poll waiting, say).
    public var runningHandlerCount: Int { handlers.count }
}

/// An HTTP/1.1 server on libmicrohttpd. Its internal polling thread (epoll) accepts, parses and
/// writes; each complete request is handed, its connection suspended, to a task of its own on the
/// server's handler threads — so a slow handler (a long poll) never holds the polling thread, a
/// slow client holds nobody but itself, a long poll whose client goes away is cancelled at once
/// (``DisconnectWatch``), and every handler and stream ends before the server does (``ServerWork``).
///
/// ```swift
/// let server = HTTPServer(service: MyService())
/// let port = try server.start(host: "127.0.0.1", port: 0)   // serves in the background
/// // or, in a task of the caller's: try await server.run(host: "::", port: 8443, tls: identity)
/// ...
/// await server.stop(timeout: .seconds(10))
/// ```
/// See <https://www.gnu.org/software/libmicrohttpd/manual/libmicrohttpd.html>.
public final class HTTPServer: Sendable {
    let service: any HTTPService
    let limits: HTTPLimits
    let logger: Logger
    public let counters: HTTPCounters
    /// Where the serving loop and the handlers run: threads of the server's own, so a process
    /// whose cooperative pool is busy (CPU-bound work, blocking calls) still answers promptly.
    private let executor = HandlerExecutor(label: "convkit.http.handlers")
    /// The upgraded connections (streams), on a thread of their own; nil when the system would
    /// not give the loop its descriptors (an upgrade is then answered 503).
    let streams = StreamLoop()

    /// A complete request handed to its handler, its connection suspended.
    private struct Pending: @unchecked Sendable {
        let exchange: Exchange
        let request: HTTPRequest
        let connection: OpaquePointer
    }
    /// Ends when the server begins stopping.
    private let stopping: AsyncStream<Void>
    private let stoppingContinuation: AsyncStream<Void>.Continuation

    private struct Daemon: @unchecked Sendable {
        let pointer: OpaquePointer
        let pressure: Pressure
        /// nil when it could not start (requests that wait are then not watched).
        let disconnects: DisconnectWatch?
        /// The listening socket, once quiesced: closed after the daemon stops.
        var quiescedListener: Int32 = -1
    }
    /// The shim's idle-connection tracking of a daemon (freed with it by ``stopDaemon(_:)``).
    struct Pressure: @unchecked Sendable { let pointer: OpaquePointer }
    private enum Phase { case idle, listening, stopping, stopped }
    private struct State {
        var phase = Phase.idle
        var daemon: Daemon?
        var port = 0
        var deadline = ContinuousClock.now
        var listeningWaiters: [CheckedContinuation<Int, any Error>] = []
        var stoppedWaiters: [CheckedContinuation<Void, Never>] = []
    }
    private let state = Mutex(State())
    /// Whether the server listens and has not begun stopping (streams are adopted only then).
    /// The daemon is stopped only once every handler has resumed its connection (the handlers'
    /// ``ServerWork``, closed by the stop), so none touches a connection the daemon has freed.
    private let accepting = Atomic(false)
    /// The streams' tasks (each until its connection closes), ended before the server is.
    private let streamWork = ServerWork()

    public init(service: any HTTPService, limits: HTTPLimits = HTTPLimits(), logger: Logger = .silent, counters: HTTPCounters = HTTPCounters()) {
        self.service = service
        self.limits = limits
        self.logger = logger
        self.counters = counters
        (stopping, stoppingContinuation) = AsyncStream.makeStream()
    }

    /// Listens on `host` (an IPv4 or IPv6 address, or a host name: its first address) and `port`
    /// (0: any free port), over HTTPS with `tls`, and serves in a background task until
    /// ``stop(timeout:)``.
    /// - Returns: the port bound.
    /// - Throws: ``RecordZoneError/Code/ioError`` when the address cannot be bound, saying why.
    @discardableResult
    public func start(host: String, port: Int, tls: TLSIdentity? = nil) throws(RecordZoneError) -> Int {
        let bound = try listen(host: host, port: port, tls: tls)
        Task(executorPreference: executor) { await self.serve() }
        return bound
    }

    /// Listens (as ``start(host:port:tls:)``) and serves in the caller's task until
    /// ``stop(timeout:)``: after a stop, the handlers still running get until the deadline, are
    /// then cancelled, and all have ended before the daemon stops and this returns.
    public func run(host: String, port: Int, tls: TLSIdentity? = nil) async throws(RecordZoneError) {
        try listen(host: host, port: port, tls: tls)
        await withTaskExecutorPreference(executor) { await serve() }
    }

    /// The port, once the server listens (for a ``run(host:port:tls:)`` started in another
    /// task). - Throws: why it could not listen.
    public func waitUntilListening() async throws -> Int {
        try await withCheckedThrowingContinuation { continuation in
            let port = state.withLock { state -> Int? in
                if state.phase != .idle { return state.port }
                state.listeningWaiters.append(continuation)
                return nil
            }
            if let port { continuation.resume(returning: port) }
        }
    }

    /// The port bound.
    public var port: Int { state.withLock { $0.port } }

    /// Stops accepting (new requests on open connections get 503), gives the handlers still
    /// running until `timeout` (the caller releases its long polls first), cancels the rest and
    /// waits for them, then stops the daemon: no handler resumes a connection after that.
    public func stop(timeout: Duration = .seconds(10)) async {
        beginStopping(timeout: timeout)
        await withCheckedContinuation { continuation in
            let stopped = state.withLock { state in
                if state.phase == .stopped { return true }
                state.stoppedWaiters.append(continuation)
                return false
            }
            if stopped { continuation.resume() }
        }
    }

    @discardableResult
    private func listen(host: String, port: Int, tls: TLSIdentity?) throws(RecordZoneError) -> Int {
        let result: Result<Int, RecordZoneError>
        do { result = .success(try bind(host: host, port: port, tls: tls)) } catch { result = .failure(error) }
        let waiters = state.withLock { state in
            defer { state.listeningWaiters = [] }
            return state.listeningWaiters
        }
        waiters.forEach { $0.resume(with: result.mapError { $0 as any Error }) }
        return try result.get()
    }

    private func bind(host: String, port: Int, tls: TLSIdentity?) throws(RecordZoneError) -> Int {
        guard (0...65535).contains(port) else { throw RecordZoneError(.invalidArguments, "port \(port) is out of range") }
        guard state.withLock({ $0.phase == .idle }) else { throw RecordZoneError(.invalidArguments, "the server was started already") }
        let context = Unmanaged.passUnretained(self).toOpaque()
        errno = 0
        var pressure: OpaquePointer? = nil
        let connections = fittingConnections()
        let giveWayAt = min(limits.idleConnectionsGiveWayAt ?? (connections - connections / 8), connections)
        guard let started = cmhd_start(UInt16(port), host, accessHandler, context, completedHandler, context,
                                       connections, limits.maximumConnectionsPerAddress, giveWayAt, limits.connectionTimeoutSeconds,
                                       limits.connectionMemoryBytes, limits.pollingThreads ?? UInt32(ProcessInfo.processInfo.activeProcessorCount), tls?.keyPEM, tls?.certificatePEM, &pressure),
            let pressure
        else {
            let code = errno
            let why = switch code {
            case ENXIO, EAFNOSUPPORT: "cannot resolve \(host)"
            case EADDRINUSE: "the address is in use"
            case EACCES: "permission denied (ports below 1024 need privileges)"
            case EADDRNOTAVAIL: "\(host) is not an address of this machine"
            case ENOTSUP: "this libmicrohttpd has no TLS support"
            case 0: tls == nil ? "libmicrohttpd could not start" : "libmicrohttpd could not start (is the certificate or key malformed?)"
            default: String(cString: strerror(code))
            }
            throw RecordZoneError(.ioError, "cannot listen on \(host):\(port): \(why)")
        }
        let bound = Int(cmhd_bound_port(started))
        state.withLock { state in
            state.daemon = Daemon(pointer: started, pressure: Pressure(pointer: pressure), disconnects: DisconnectWatch { [weak self] in self?.clientGone($0) })
            state.phase = .listening
            accepting.store(true, ordering: .sequentiallyConsistent)
            state.port = bound
        }
        counters.pressure.withLock { $0 = Pressure(pointer: pressure) }
        // An IPv6 address in brackets, as in a URL: [::1]:8443.
        logger.info("listening on \(host.contains(":") ? "[\(host)]" : host):\(bound)\(tls == nil ? "" : " (HTTPS)")")
        return bound
    }

    /// The connections the process's descriptors allow, up to ``HTTPLimits/maximumConnections``:
    /// the soft descriptor limit is raised as far as needed and the hard limit allows (as Go and
    /// nginx's `worker_rlimit_nofile` do), keeping 256 descriptors for the rest of the process
    /// (databases, files, the watch); a lower hard limit is reported in the log.
    private func fittingConnections() -> UInt32 {
        let reserve: rlim_t = 256
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return limits.maximumConnections }
        let wanted = rlim_t(limits.maximumConnections) + reserve
        if limit.rlim_cur < wanted {
            var raised = limit
            raised.rlim_cur = limit.rlim_max == rlim_t.max ? wanted : min(wanted, limit.rlim_max)
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        guard limit.rlim_cur != rlim_t.max, limit.rlim_cur < wanted else { return limits.maximumConnections }
        let fitting = UInt32(max(16, Int(limit.rlim_cur) - Int(reserve)))
        logger.warning("the descriptor limit (\(limit.rlim_cur), hard \(limit.rlim_max)) allows \(fitting) connections, not \(limits.maximumConnections): raise the hard limit (ulimit -Hn, systemd LimitNOFILE=) to serve more")
        return fitting
    }

    /// The serving loop of a listening server (one per server): it waits for the stop, gives the
    /// handlers still running until the deadline, cancels the rest and waits for them, then
    /// stops the daemon. (Requests are handed to their handlers by the polling thread itself.)
    private func serve() async {
        let trimming = Task(executorPreference: executor) { await self.releaseMemoryAfterCrowds() }
        for await _ in stopping {}
        trimming.cancel()
        // Streams end at once (their clients resume from their tokens elsewhere or later).
        await streams?.stop()
        let deadline = state.withLock { $0.deadline }
        for work in [counters.handlers, streamWork] where await !work.waitUntilEmpty(until: deadline) {
            logger.info("\(work.cancelAll()) \(work === streamWork ? "streams" : "handlers") still running at the stop deadline were cancelled")
            await work.waitUntilEmpty()
        }
        // The answers of the last handlers are on their way out: give them the rest of the time.
        await counters.answers.waitUntilEmpty(until: deadline)
        let (daemon, waiters) = state.withLock { state in
            defer {
                state.daemon = nil
                state.phase = .stopped
                state.stoppedWaiters = []
            }
            return (state.daemon, state.stoppedWaiters)
        }
        if let daemon { stopDaemon(daemon) }
        waiters.forEach { $0.resume() }
    }

    /// Every 5 s: when at least 256 connections closed since the last look, gives the memory
    /// they used back to the system. glibc keeps freed memory in its arenas, so without this a
    /// crowd that came and went (a reconnect storm, a network change) left the server hundreds
    /// of megabytes larger for good.
    private func releaseMemoryAfterCrowds() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(5))
            let open = counters.openConnectionCount
            let peak = counters.pressure.withLock { $0.map { Int(cmhd_take_peak($0.pointer)) } ?? 0 }
            if peak - open >= 256 {
                cmhd_release_free_memory()
                counters.memoryReleases.add(1, ordering: .relaxed)
            }
        }
    }

    /// Answers a request: `id` is its handler's in the handlers' ``ServerWork`` (``HTTPCounters``).
    private func handle(_ pending: Pending, id: UInt64) async {
        let request = pending.request
        // A request that may wait long (a long poll) is cancelled if its client goes away.
        let watch = service.mayWait(method: request.method, path: request.path) ? state.withLock({ $0.daemon?.disconnects }) : nil
        let watched = watch?.add(pending.connection, id: id)
        pending.exchange.response = await service.respond(to: request)
        if let watched { watch?.remove(watched) }
        MHD_resume_connection(pending.connection)
    }

    /// The client of request `id` went away: its handler is cancelled.
    fileprivate func clientGone(_ id: UInt64) {
        if counters.handlers.cancel(id) { counters.abandoned.add(1, ordering: .relaxed) }
    }

    /// Stops accepting and tells the serving loop, which then finishes the stop.
    private func beginStopping(timeout: Duration) {
        let daemon = state.withLock { state -> Daemon? in
            if state.phase == .idle { state.phase = .stopped }
            guard state.phase == .listening else { return nil }
            state.phase = .stopping
            accepting.store(false, ordering: .sequentiallyConsistent)
            state.deadline = ContinuousClock.now.advanced(by: timeout)
            return state.daemon
        }
        // No handler or stream starts from now on: new requests on open connections get 503.
        counters.handlers.close()
        streamWork.close()
        guard let daemon else { return }
        // Quiescing hands the listening socket back to us. Shut down, it refuses whoever connects
        // now; it is closed only once the daemon has stopped (libmicrohttpd's threads may still
        // be about to accept on it, and a closed number may be another socket's by then).
        let listener = MHD_quiesce_daemon(daemon.pointer)
        if listener >= 0 {
            _ = shutdown(listener, Int32(SHUT_RDWR))
            state.withLock { $0.daemon?.quiescedListener = listener }
        }
        stoppingContinuation.finish()
    }

    /// Stops without waiting (for a server dropped without a stop): the serving loop gives its
    /// handlers a second, cancels the rest, and stops the daemon when they have ended.
    func abandon() {
        beginStopping(timeout: .seconds(1))
    }

    deinit {
        // The serving loop holds the server until it has stopped the daemon.
        if let daemon = state.withLock({ $0.daemon }) { stopDaemon(daemon) }
    }

    /// Stops libmicrohttpd's daemon and frees what the shim kept for it.
    private func stopDaemon(_ daemon: Daemon) {
        counters.pressure.withLock { $0 = nil }
        cmhd_stop(daemon.pointer, daemon.pressure.pointer)
        if daemon.quiescedListener >= 0 { close(daemon.quiescedListener) }
        daemon.disconnects?.stop()
    }

    // MARK: Per-request state

    /// One request on one connection, from its headers to its response.
    final class Exchange: @unchecked Sendable {
        let method: String
        let path: String
        /// The request's headers, names lowercased, read once with the request line.
        let headers: [String: String]
        var body = Data()
        /// The body size at which ``HTTPService/checkBody(method:path:prefix:)`` looks next.
        var nextCheck = 8 << 10
        var started = false
        /// Its ID among the answers on their way out, once complete.
        var answer: UInt64?
        var response: HTTPResponse?

        init(method: String, path: String, headers: [String: String]) {
            self.method = method
            self.path = path
            self.headers = headers
        }
    }

    fileprivate func access(_ connection: OpaquePointer, url: String, method: String,
                            upload: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>,
                            state pointer: UnsafeMutablePointer<UnsafeMutableRawPointer?>) -> MHD_Result {
        guard let existing = pointer.pointee else {
            let exchange = Exchange(method: method, path: url, headers: headers(connection))
            pointer.pointee = Unmanaged.passRetained(exchange).toOpaque()
            let refusal = refusalByHeaders(exchange, connection)
            exchange.response = refusal
            return refusal.map { queue($0, on: connection) } ?? .YES
        }
        let exchange = Unmanaged<Exchange>.fromOpaque(existing).takeUnretainedValue()
        if uploadSize.pointee > 0 {
            defer { uploadSize.pointee = 0 }
            // A refused request keeps nothing of its body.
            guard exchange.response == nil, let upload else { return .YES }
            guard exchange.body.count + uploadSize.pointee <= limits.maximumBodyBytes else {
                return refuse(exchange, Self.error(413, .limitExceeded, "the body is over \(limits.maximumBodyBytes) bytes"))
            }
            upload.withMemoryRebound(to: UInt8.self, capacity: uploadSize.pointee) { exchange.body.append($0, count: uploadSize.pointee) }
            if exchange.body.count >= exchange.nextCheck {
                exchange.nextCheck = exchange.body.count * 2
                if let refusal = service.checkBody(method: exchange.method, path: exchange.path, prefix: exchange.body) {
                    return refuse(exchange, refusal)
                }
            }
            return .YES
        }
        if let response = exchange.response { return queue(response, on: connection) }
        guard !exchange.started else { return .YES }
        exchange.started = true
        var client = ""
        if service.needsClient(path: url) {
            var address = [CChar](repeating: 0, count: 64)
            cmhd_client_address(connection, &address, address.count)
            client = String(decoding: address.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        let request = HTTPRequest(method: method, path: url, query: values(connection, .GET_ARGUMENT_KIND),
                                  headers: exchange.headers, body: exchange.body, client: client)
        exchange.answer = counters.answers.begin()
        // Either the stop (which closes the handlers' work) waits for this handler, or this
        // request is refused: never neither.
        let pending = Pending(exchange: exchange, request: request, connection: connection)
        let handed = counters.handlers.start(on: executor, prepare: { MHD_suspend_connection(connection) }) { id in
            await self.handle(pending, id: id)
        }
        if handed == nil {
            exchange.response = Self.error(503, .serviceUnavailable, "the server is stopping", headers: [("Retry-After", "1"), ("Connection", "close")])
            return queue(exchange.response ?? HTTPResponse(status: 503), on: connection)
        }
        return .YES
    }

    /// A refusal decided from the request line and headers alone.
    private func refusalByHeaders(_ exchange: Exchange, _ connection: OpaquePointer) -> HTTPResponse? {
        let headerBytes = exchange.headers.reduce(0) { $0 + $1.key.utf8.count + $1.value.utf8.count + 4 }
        if headerBytes > limits.maximumHeaderBytes {
            return Self.error(431, .limitExceeded, "the headers are \(headerBytes) bytes; the limit is \(limits.maximumHeaderBytes)")
        }
        if let length = exchange.headers["content-length"].flatMap(Int.init), length > limits.maximumBodyBytes {
            return Self.error(413, .limitExceeded, "the body is \(length) bytes; the limit is \(limits.maximumBodyBytes)")
        }
        return service.preflight(method: exchange.method, path: exchange.path, headers: exchange.headers)
    }

    /// Refuses mid-upload: the rest of the body is read and dropped (libmicrohttpd 0.9.75 cannot
    /// answer before the upload ends), then the refusal is answered.
    private func refuse(_ exchange: Exchange, _ response: HTTPResponse) -> MHD_Result {
        exchange.response = response
        exchange.body = Data()
        return .YES
    }

    private func queue(_ response: HTTPResponse, on connection: OpaquePointer) -> MHD_Result {
        // No loop to hand a stream to: the upgrade is refused as any request a server cannot take now.
        if response.upgrade != nil, streams == nil {
            return queue(Self.error(503, .serviceUnavailable, "this server cannot hold streams now", headers: [("Retry-After", "60")]), on: connection)
        }
        let made = if response.upgrade != nil {
            MHD_create_response_for_upgrade(upgradeHandler, Unmanaged.passUnretained(self).toOpaque())
        } else {
            response.body.withUnsafeBytes { raw in
                MHD_create_response_from_buffer(raw.count, UnsafeMutableRawPointer(mutating: raw.baseAddress), .RESPMEM_MUST_COPY)
            }
        }
        guard let made else { return .NO }
        defer { MHD_destroy_response(made) }
        for (name, value) in response.headers { _ = MHD_add_response_header(made, name, value) }
        let queued = MHD_queue_response(connection, UInt32(response.status), made)
        if queued == .NO { logger.debug("could not queue a \(response.status) answer (connection closing)") }
        return queued
    }

    /// The request's headers, names lowercased (the first of repeated ones).
    private func headers(_ connection: OpaquePointer) -> [String: String] {
        Dictionary(values(connection, .HEADER_KIND).map { ($0.0.lowercased(), $0.1) }, uniquingKeysWith: { first, _ in first })
    }

    private func values(_ connection: OpaquePointer, _ kind: MHD_ValueKind) -> [(String, String)] {
        let box = PairBox()
        let unmanaged = Unmanaged.passRetained(box)
        defer { unmanaged.release() }
        _ = MHD_get_connection_values(connection, kind, { cls, _, key, value in
            guard let cls, let key else { return .YES }
            let box = Unmanaged<PairBox>.fromOpaque(cls).takeUnretainedValue()
            box.pairs.append((String(cString: key), value.map { String(cString: $0) } ?? ""))
            return .YES
        }, unmanaged.toOpaque())
        return box.pairs
    }

    final class PairBox {
        var pairs: [(String, String)] = []
    }

    static func error(_ status: Int, _ code: RecordZoneError.Code, _ message: String, headers: [(String, String)] = []) -> HTTPResponse {
        .json(Wire.ErrorBody(Wire.Failure(RecordZoneError(code, message))), status: status, headers: headers)
    }

    /// Called by libmicrohttpd once a `101` is sent: the socket goes to the stream loop, and
    /// the connection to the response's handler (on a handler thread: this one is the daemon's).
    fileprivate func upgraded(_ exchange: Exchange, socket: Int32, handle: OpaquePointer, extra: Data) {
        guard let streams, let stream = exchange.response?.upgrade, accepting.load(ordering: .acquiring),
            let connection = streams.adopt(socket: socket, handle: handle, extra: extra)
        else {
            _ = cmhd_upgrade_close(handle)
            return
        }
        if streamWork.start(on: executor, { _ in await stream(connection) }) == nil { connection.close() }
    }

    /// Called by libmicrohttpd when a request is over, its answer sent or its connection gone.
    fileprivate func completed(_ exchange: Exchange) {
        if let answer = exchange.answer { counters.answers.end(answer) }
    }
}

private let accessHandler: MHD_AccessHandlerCallback = { cls, connection, url, method, _, upload, uploadSize, state in
    guard let cls, let connection, let url, let method, let uploadSize, let state else { return .NO }
    let server = Unmanaged<HTTPServer>.fromOpaque(cls).takeUnretainedValue()
    return server.access(connection, url: String(cString: url), method: String(cString: method),
                         upload: upload, uploadSize: uploadSize, state: state)
}

private let upgradeHandler: MHD_UpgradeHandler = { cls, _, state, extra, extraSize, socket, handle in
    guard let cls, let state, let handle else { return }
    let server = Unmanaged<HTTPServer>.fromOpaque(cls).takeUnretainedValue()
    let exchange = Unmanaged<HTTPServer.Exchange>.fromOpaque(state).takeUnretainedValue()
    let bytes = extra.map { Data(bytes: $0, count: extraSize) } ?? Data()
    server.upgraded(exchange, socket: socket, handle: handle, extra: bytes)
}

private let completedHandler: MHD_RequestCompletedCallback = { cls, _, state, _ in
    guard let state, let pointer = state.pointee else { return }
    let exchange = Unmanaged<HTTPServer.Exchange>.fromOpaque(pointer)
    if let cls { Unmanaged<HTTPServer>.fromOpaque(cls).takeUnretainedValue().completed(exchange.takeUnretainedValue()) }
    exchange.release()
    state.pointee = nil
}

/// A task executor on a concurrent dispatch queue of its own (whose threads Dispatch adds as they
/// block), for the server's handlers: tasks that prefer it, and their children, run there rather
/// than on Swift's cooperative pool of one thread per core.
final class HandlerExecutor: TaskExecutor {
    private let queue: DispatchQueue

    init(label: String) {
        queue = DispatchQueue(label: label, qos: .userInitiated, attributes: .concurrent)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}
