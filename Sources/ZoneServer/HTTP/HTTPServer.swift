import CLibMicroHTTPD
import CMicroHTTPD
import Foundation
import RecordZone
import Synchronization

/// An HTTP/1.1 server on libmicrohttpd: one internal polling thread (epoll) accepts, parses and
/// writes; each complete request is handed to an async handler while its connection is
/// suspended, so a slow handler (a long poll) never holds the polling thread, and a slow client
/// never holds anyone but itself.
/// See <https://www.gnu.org/software/libmicrohttpd/manual/libmicrohttpd.html>.
public final class HTTPServer: Sendable {
    public typealias Handler = @Sendable (HTTPRequest) async -> HTTPResponse
    /// Looks at a request's method, path and headers before its body is read; an answer refuses
    /// it with the body unread (an unauthenticated 40 MiB upload costs nothing).
    public typealias Preflight = @Sendable (_ method: String, _ path: String, _ headers: [String: String]) -> HTTPResponse?

    let handler: Handler
    let preflight: Preflight
    let limits: HTTPLimits
    let logger: Logger
    /// The running daemon; only start and stop touch it.
    private struct Daemon: @unchecked Sendable { let pointer: OpaquePointer }
    private let daemon = Mutex<Daemon?>(nil)
    /// Handler tasks still running; a task resumes its connection only while the daemon runs
    /// (under the `daemon` lock), never after ``stop(grace:)`` has stopped it.
    private let handlers = Mutex(Handlers())
    private struct Handlers {
        var running: [UInt64: Task<Void, Never>] = [:]
        /// Handlers that finished before they were registered.
        var finishedEarly = Set<UInt64>()
    }
    private let nextHandler = Atomic<UInt64>(0)
    private let inFlight = Atomic<Int>(0)
    private let boundPort = Atomic<Int>(0)

    public init(limits: HTTPLimits = HTTPLimits(), logger: Logger = .silent, preflight: @escaping Preflight = { _, _, _ in nil },
                handler: @escaping Handler) {
        self.handler = handler
        self.preflight = preflight
        self.limits = limits
        self.logger = logger
    }

    /// Starts listening on `host` (an IPv4 or IPv6 address, or a host name: its first address)
    /// and `port` (0: any free port), over HTTPS with `tls`.
    /// - Returns: the port bound.
    /// - Throws: ``RecordZoneError/Code/ioError`` when the address cannot be bound.
    @discardableResult
    public func start(host: String, port: Int, tls: TLSIdentity? = nil) throws(RecordZoneError) -> Int {
        guard (0...65535).contains(port) else { throw RecordZoneError(.invalidArguments, "port \(port) is out of range") }
        let context = Unmanaged.passUnretained(self).toOpaque()
        errno = 0
        guard let started = cmhd_start(UInt16(port), host, accessHandler, context, completedHandler, context,
                                       limits.maximumConnections, limits.maximumConnectionsPerAddress, limits.connectionTimeoutSeconds,
                                       limits.connectionMemoryBytes, tls?.keyPEM, tls?.certificatePEM)
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
        daemon.withLock { $0 = Daemon(pointer: started) }
        let bound = Int(cmhd_bound_port(started))
        boundPort.store(bound, ordering: .releasing)
        return bound
    }

    /// The port bound by ``start(host:port:)``.
    public var port: Int { boundPort.load(ordering: .acquiring) }

    /// Handlers still running (a long poll waiting, say).
    public var runningHandlerCount: Int { handlers.withLock { $0.running.count } }

    /// Requests being handled or answered now (counted until their answer has been sent).
    public var inFlightCount: Int { inFlight.load(ordering: .acquiring) }

    /// Called by libmicrohttpd when a request is over, its answer sent or its connection gone.
    fileprivate func completed(_ exchange: Exchange) {
        if exchange.started { inFlight.subtract(1, ordering: .relaxed) }
    }

    /// Stops accepting, waits up to `grace` for the requests in flight, cancels the handlers
    /// still running and waits for them, then stops the daemon: no handler resumes a connection
    /// after that.
    public func stop(grace: Duration = .seconds(10)) async {
        guard let running = daemon.withLock({ $0 })?.pointer else { return }
        // Quiescing hands the listening socket back to us: close it, so nobody connects any more.
        let listener = MHD_quiesce_daemon(running)
        if listener >= 0 { close(listener) }
        let deadline = ContinuousClock.now.advanced(by: grace)
        while inFlightCount > 0, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
        let late = handlers.withLock { Array($0.running.values) }
        for task in late { task.cancel() }
        for task in late { await task.value }
        // From here no handler may touch a connection: the daemon frees them all.
        daemon.withLock { $0 = nil }
        MHD_stop_daemon(running)
    }

    deinit {
        if let running = daemon.withLock({ $0 }) { MHD_stop_daemon(running.pointer) }
    }

    // MARK: Per-request state

    /// One request on one connection, from its headers to its response.
    final class Exchange: @unchecked Sendable {
        let method: String
        let path: String
        /// The request's headers, names lowercased, read once with the request line.
        let headers: [String: String]
        var body = Data()
        var isTooLarge = false
        var started = false
        var response: HTTPResponse?

        init(method: String, path: String, headers: [String: String]) {
            self.method = method
            self.path = path
            self.headers = headers
        }
    }

    fileprivate func access(_ connection: OpaquePointer, url: String, method: String,
                            upload: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>,
                            state: UnsafeMutablePointer<UnsafeMutableRawPointer?>) -> MHD_Result {
        guard let pointer = state.pointee else {
            let exchange = Exchange(method: method, path: url, headers: headers(connection))
            state.pointee = Unmanaged.passRetained(exchange).toOpaque()
            if let length = exchange.headers["content-length"].flatMap(Int.init), length > limits.maximumBodyBytes {
                return queue(Self.error(413, RecordZoneError.Code.limitExceeded.rawValue, "the body is \(length) bytes; the limit is \(limits.maximumBodyBytes)"), on: connection)
            }
            if let refusal = preflight(method, url, exchange.headers) {
                exchange.response = refusal
                return queue(refusal, on: connection)
            }
            return .YES
        }
        let exchange = Unmanaged<Exchange>.fromOpaque(pointer).takeUnretainedValue()
        if uploadSize.pointee > 0 {
            // A request refused by its headers keeps nothing of its body.
            if !exchange.isTooLarge, exchange.response == nil || exchange.started, let upload {
                if exchange.body.count + uploadSize.pointee > limits.maximumBodyBytes {
                    exchange.isTooLarge = true
                    exchange.body = Data()
                } else {
                    upload.withMemoryRebound(to: UInt8.self, capacity: uploadSize.pointee) { exchange.body.append($0, count: uploadSize.pointee) }
                }
            }
            uploadSize.pointee = 0
            return .YES
        }
        if exchange.isTooLarge {
            return queue(Self.error(413, RecordZoneError.Code.limitExceeded.rawValue, "the body is over \(limits.maximumBodyBytes) bytes"), on: connection)
        }
        if let response = exchange.response { return queue(response, on: connection) }
        guard !exchange.started else { return .YES }
        exchange.started = true
        let request = HTTPRequest(method: method, path: url, query: values(connection, .GET_ARGUMENT_KIND),
                                  headers: exchange.headers,
                                  body: exchange.body)
        inFlight.add(1, ordering: .relaxed)
        MHD_suspend_connection(connection)
        let handler = self.handler
        nonisolated(unsafe) let suspended = connection
        let id = nextHandler.add(1, ordering: .relaxed).newValue
        let task = Task {
            exchange.response = await handler(request)
            self.daemon.withLock { running in
                if running != nil { MHD_resume_connection(suspended) }
            }
            self.handlers.withLock { handlers in
                if handlers.running.removeValue(forKey: id) == nil { handlers.finishedEarly.insert(id) }
            }
        }
        handlers.withLock { handlers in
            // A fast handler may have finished already; only the running ones are kept.
            if handlers.finishedEarly.remove(id) == nil { handlers.running[id] = task }
        }
        return .YES
    }

    private func queue(_ response: HTTPResponse, on connection: OpaquePointer) -> MHD_Result {
        let made = response.body.withUnsafeBytes { raw in
            MHD_create_response_from_buffer(raw.count, UnsafeMutableRawPointer(mutating: raw.baseAddress), .RESPMEM_MUST_COPY)
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

    static func error(_ status: Int, _ code: String, _ message: String, headers: [(String, String)] = []) -> HTTPResponse {
        .json(Wire.ErrorBody(Wire.Failure(code: code, message: message)), status: status, headers: headers)
    }
}

private let accessHandler: MHD_AccessHandlerCallback = { cls, connection, url, method, _, upload, uploadSize, state in
    guard let cls, let connection, let url, let method, let uploadSize, let state else { return .NO }
    let server = Unmanaged<HTTPServer>.fromOpaque(cls).takeUnretainedValue()
    return server.access(connection, url: String(cString: url), method: String(cString: method),
                         upload: upload, uploadSize: uploadSize, state: state)
}

private let completedHandler: MHD_RequestCompletedCallback = { cls, _, state, _ in
    guard let state, let pointer = state.pointee else { return }
    let exchange = Unmanaged<HTTPServer.Exchange>.fromOpaque(pointer)
    if let cls { Unmanaged<HTTPServer>.fromOpaque(cls).takeUnretainedValue().completed(exchange.takeUnretainedValue()) }
    exchange.release()
    state.pointee = nil
}
