import Foundation
import RecordZone
import Synchronization

/// Tunables of a zone server.
public struct ZoneServerConfiguration: Sendable {
    public var limits = HTTPLimits()
    /// Requests per second each key may make, sustained, and in a burst. A store that syncs after
    /// every send makes about four requests per message (modify, the database feed, the
    /// conversation's changes, sometimes a speaker's zone), and sends a few hundred messages a
    /// second at most on one machine: 1,000/s sustained with bursts of 10,000 stay out of an honest
    /// client's way and still stop a runaway loop or a flood from one key.
    public var requestsPerSecond = 1_000.0
    public var burst = 10_000.0
    /// How far a request's timestamp may be from the server's clock.
    public var maximumClockSkew = RequestSignature.maximumClockSkew
    /// The longest long poll a client may ask for.
    public var maximumWait: Duration = .seconds(60)
    /// How often a stream is pinged, and how long a silent client keeps it: the protocol's,
    /// unless the clients are set alike.
    public var streamTiming = Wire.StreamFrame.Timing.standard
    public var now: @Sendable () -> Date = { Date() }
    public var logger = Logger.silent
    /// Peer servers' replicators (`convkitd replicate`), by identity (a name starting with `_`)
    /// and the only key each may sign with: they read, create and write every zone
    /// (``ReplicatingZoneAccess``); every record they save is still checked.
    public var replicators: [String: Data] = [:]
    /// The operator's console at `/console/` (``ConsoleSettings``); nil: none (the default).
    public var console: ConsoleSettings? = nil

    public init() {}
}

/// The HTTP zone server: ``ZoneAPI`` served by an ``HTTPServer``. `convkitd serve` runs one;
/// tests start one in-process on 127.0.0.1, port 0.
///
/// ```swift
/// let storage = try SQLiteZoneStorage(directory: "/var/lib/convkitd", policy: ConversationStore.recordPolicy())
/// let server = ZoneServer(storage: storage, access: ChatZoneAccess())
/// let port = try server.start(host: "127.0.0.1", port: 8080)   // serves in the background
/// ...
/// await server.stop()
/// ```
public final class ZoneServer: Sendable {
    public let api: ZoneAPI
    let http: HTTPServer
    /// The operator's listener (``startOperator(host:port:)``): `/healthz` and `/metrics` only,
    /// with connections of its own, so a crowd of clients holding every connection of the main
    /// listener never keeps the operator out.
    let operatorHTTP: HTTPServer

    public init(storage: any ZoneStorage, access: any ZoneAccessPolicy = OpenZoneAccess(), configuration: ZoneServerConfiguration = ZoneServerConfiguration()) {
        let counters = HTTPCounters()
        let api = ZoneAPI(storage: storage, access: access, configuration: configuration, counters: counters)
        self.api = api
        let service: any HTTPService = configuration.console.map { ConsoleService(api: api, settings: $0) } ?? api
        http = HTTPServer(service: service, limits: configuration.limits, logger: configuration.logger, counters: counters)
        var operatorLimits = HTTPLimits()
        operatorLimits.maximumConnections = 32
        operatorLimits.maximumConnectionsPerAddress = 32
        operatorLimits.maximumBodyBytes = 0
        operatorHTTP = HTTPServer(service: OperatorAPI(api: api), limits: operatorLimits, logger: configuration.logger)
    }

    /// Listens for the operator on an address of its own (a loopback or management address):
    /// `GET /healthz` and `GET /metrics`, nothing else, on 32 connections no client can take.
    /// Stopped with the server. - Returns: the port bound.
    @discardableResult
    public func startOperator(host: String, port: Int) throws(RecordZoneError) -> Int {
        try operatorHTTP.start(host: host, port: port)
    }

    public var storage: any ZoneStorage { api.storage }

    /// The storage's background work (``ZoneStorage/run()``), from start to stop.
    private let storageWork = Mutex<Task<Void, Never>?>(nil)

    private func startStorageWork() {
        let storage = self.storage
        storageWork.withLock { work in
            if work == nil { work = Task { await storage.run() } }
        }
    }

    private func stopStorageWork() async {
        let work = storageWork.withLock { work in defer { work = nil }; return work }
        work?.cancel()
        await work?.value
    }

    /// Starts listening, over HTTPS with `tls`, and serves in a background task until
    /// ``stop(timeout:)``; the storage's own work (``ZoneStorage/run()``) runs as long.
    /// - Returns: the port bound (useful with port 0).
    @discardableResult
    public func start(host: String, port: Int, tls: TLSIdentity? = nil) throws(RecordZoneError) -> Int {
        let port = try http.start(host: host, port: port, tls: tls)
        startStorageWork()
        return port
    }

    /// Listens and serves until ``stop(timeout:)``, in the caller's task; the storage's own
    /// work runs as long.
    public func run(host: String, port: Int, tls: TLSIdentity? = nil) async throws(RecordZoneError) {
        startStorageWork()
        do {
            try await http.run(host: host, port: port, tls: tls)
        } catch {
            await stopStorageWork()
            throw error
        }
        await stopStorageWork()
    }

    /// The port, once listening. - Throws: why the server could not start.
    public func waitUntilListening() async throws -> Int { try await http.waitUntilListening() }

    public var port: Int { http.port }

    /// Stops accepting, answers waiting long polls, gives the requests in flight until `timeout`
    /// (then cancels their handlers and waits for them), and stops.
    public func stop(timeout: Duration = .seconds(10)) async {
        storage.releaseWaiters()
        await http.stop(timeout: timeout)
        await operatorHTTP.stop(timeout: .seconds(1))
        await stopStorageWork()
        api.configuration.logger.info("stopped")
    }

    deinit {
        storageWork.withLock { $0?.cancel() }
        storage.releaseWaiters()
        http.abandon()
        operatorHTTP.abandon()
    }
}

/// The operator's routes of a ``ZoneAPI``: `/healthz` and `/metrics`; anything else is a 404.
struct OperatorAPI: HTTPService {
    let api: ZoneAPI

    func preflight(method: String, path: String, headers: [String: String]) -> HTTPResponse? {
        guard let route = try? Route.match(method: method, path: path).route, route == .health || route == .metrics else {
            return APIError(.routeNotFound, "the operator's address serves GET /healthz and GET /metrics only").response
        }
        return nil
    }

    func respond(to request: HTTPRequest) async -> HTTPResponse { await api.respond(to: request) }
}
