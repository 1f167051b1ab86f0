import Foundation
import RecordZone

/// The record-zone API (version 1) as a value: routes and handlers that turn a request into a
/// response, over a ``ZoneStorage`` (SQLite or PostgreSQL), with signed requests, zone access control, limits
/// and metrics. It knows nothing of sockets: ``ZoneServer`` serves it over ``HTTPServer``, and
/// tests may call ``respond(to:)`` directly.
public struct ZoneAPI: HTTPService {
    public let storage: any ZoneStorage
    let access: any ZoneAccessPolicy
    let configuration: ZoneServerConfiguration
    let authenticator: Authenticator
    let metrics = Metrics()
    let streamCounters = StreamCounters()
    /// The streams told of zones they do not follow (the database feed).
    let audience: StreamAudience
    /// The saves refused since start (the newest), for the console.
    public let refusals = RefusalLog()
    /// The transport's gauges, reported by `/metrics`.
    let counters: HTTPCounters

    public init(storage: any ZoneStorage, access: any ZoneAccessPolicy = OpenZoneAccess(), configuration: ZoneServerConfiguration = ZoneServerConfiguration(),
                counters: HTTPCounters = HTTPCounters()) {
        self.storage = storage
        // A replicator's key is pinned as its identity's, so no other key can speak for it.
        let replicators = configuration.replicators.filter { storage.policy.pins.pinVerified($0.value, for: $0.key) }
        if replicators.count < configuration.replicators.count {
            configuration.logger.error("replicators bound to another key before, left out: \(Set(configuration.replicators.keys).subtracting(replicators.keys).sorted())")
        }
        self.access = replicators.isEmpty ? access : ReplicatingZoneAccess(access, replicators: Set(replicators.keys))
        self.configuration = configuration
        self.counters = counters
        audience = StreamAudience(storage: storage, access: self.access, logger: configuration.logger)
        authenticator = Authenticator(policy: storage.policy, now: configuration.now, maximumSkew: configuration.maximumClockSkew,
                                      requestsPerSecond: configuration.requestsPerSecond, burst: configuration.burst)
    }

    /// Refuses, before its body is read, a request that cannot succeed whatever its body: an
    /// unknown route, a control character in the path, or an authenticated route with a body
    /// whose `Authorization` is missing, malformed, stale, or names a key its identity does not
    /// allow (the signature itself, which covers the body, is checked once the body is in).
    public func preflight(method: String, path: String, headers: [String: String]) -> HTTPResponse? {
        let refusal: APIError
        var matched: Route?
        do {
            let route = try Route.match(method: method, path: path)
            matched = route.route
            // A request without a body is authenticated in full at once: checking its header
            // here too would only add work to the polling thread every request passes through.
            let body = headers["transfer-encoding"] != nil || (headers["content-length"].flatMap(Int.init) ?? 0) > 0
            guard route.isAuthenticated, body, let failure = authenticator.precheck(headers) else { return nil }
            refusal = APIError(failure)
        } catch {
            refusal = error
        }
        metrics.record(method: method, route: matched, status: refusal.status, seconds: 0)
        return refusal.response
    }

    /// Refuses a modify or fetch body over the batch limit from its first bytes (a binary body's
    /// declared count, a JSON body's first entries), while the rest is still on the wire.
    public func checkBody(method: String, path: String, prefix: Data) -> HTTPResponse? {
        guard let route = try? Route.match(method: method, path: path).route, route == .modify || route == .fetch else { return nil }
        do {
            try refuseOverTheBatchLimit(prefix, route == .modify ? "records" : "IDs")
            return nil
        } catch {
            metrics.record(method: method, route: route, status: error.status, seconds: 0)
            return error.response
        }
    }

    /// A long poll waits for a change: it ends as soon as its client goes away.
    public func mayWait(method: String, path: String) -> Bool {
        let route = (try? Route.match(method: method, path: path))?.route
        return route == .waitForChanges || route == .typing
    }

    /// A page of a followed zone's changes for a stream: as `GET /v1/zones/{zone}/changes`
    /// answers `identity` (who may read the zone, which versions of a group).
    func streamChanges(in zone: ZoneName, since token: ChangeToken?, identity: String) async throws -> Wire.Changes {
        let (zone, versions) = try await readableZone(zone, identity)
        return try await storage.changes(in: zone, since: token, limit: 200, readable: versions)
    }

    /// A watched zone's live state for a stream, by exactly the rules of the typing and presence
    /// routes: `identity` takes part in `zone` now (403 otherwise); who types there but it; the
    /// presence of those of `identities` who take part now, in their order.
    func liveState(in zone: ZoneName, of identities: [String], identity: String) async throws -> LiveState {
        try await takingPartNow(zone, identity)
        let present = try await takingPart(identities.filter { $0 != identity }, in: zone)
        return LiveState(typing: storage.typing.current(in: zone).identities.filter { $0 != identity }, presence: storage.presence.current(of: present).presence)
    }

    /// Handles one request: the whole API, as a function.
    public func respond(to request: HTTPRequest) async -> HTTPResponse {
        let start = ContinuousClock.now
        var identity = "-"
        var matched: Route?
        let response: HTTPResponse
        do {
            let route = try Route.match(method: request.method, path: request.path)
            matched = route.route
            if route.isAuthenticated {
                let authenticated: Authenticator.Authenticated
                do {
                    authenticated = try authenticator.authenticate(request)
                } catch {
                    throw APIError(error)
                }
                guard try await storage.claimNonce(authenticated.nonce, at: authenticated.time, horizon: authenticator.nonceHorizon) else {
                    throw APIError(.notAuthenticated, "replayed request (nonce seen before)", authentication: .replayed)
                }
                // A first request binds its identity to its key: stored (and, with several
                // servers, agreed) before it is answered; the key is checked again after.
                try await storage.persistPins(for: authenticated.identity)
                let chain = storage.policy.pins.chain(for: authenticated.identity)
                guard chain?.allowsNow(authenticated.key) == true else {
                    throw APIError(authenticator.keyFailure(identity: authenticated.identity, key: authenticated.key, chain: chain)
                                   ?? .unauthenticated(.unknownKey, "'\(authenticated.identity)' is bound to another key"))
                }
                identity = authenticated.identity
            }
            response = try await handle(route, request, identity: identity)
        } catch let error as APIError {
            response = error.response
        } catch let error as RecordZoneError {
            response = APIError(error).response
        } catch {
            response = APIError(.internalError, "\(error)").response
        }
        let elapsed = ContinuousClock.now - start
        let seconds = elapsed.inSeconds
        metrics.record(method: request.method, route: matched, status: response.status, seconds: seconds)
        configuration.logger.debug("\(request.method) \(request.path) \(response.status) \(String(format: "%.1f", seconds * 1000)) ms \(identity)")
        if response.status >= 500 { configuration.logger.info("\(request.method) \(request.path) failed: \(response.status)") }
        return response
    }
}

/// An error answered as a JSON body with an HTTP status: always a ``RecordZoneError`` (its code
/// decides the status, ``status(for:)``, unless a route says otherwise).
struct APIError: Error {
    var status: Int
    var failure: Wire.Failure
    /// Extra headers (a 405's `Allow`).
    var headers: [(String, String)] = []

    init(_ code: RecordZoneError.Code, _ message: String, status: Int? = nil, retryAfter: Double? = nil,
         authentication: AuthenticationProblem? = nil, headers: [(String, String)] = []) {
        self.init(RecordZoneError(code, message, retryAfter: retryAfter, authentication: authentication), status: status)
        self.headers = headers
    }

    /// The answer to a request that failed authentication or its rate limit.
    init(_ failure: Authenticator.Failure) {
        switch failure {
        case .unauthenticated(let problem, let message): self.init(.notAuthenticated, message, authentication: problem)
        case .rateLimited(let after):
            self.init(.requestRateLimited, "too many requests; retry after \(String(format: "%.3f", after)) s", retryAfter: after)
        }
    }

    init(_ error: RecordZoneError, status: Int? = nil) {
        self.status = status ?? Self.status(for: error.code)
        failure = Wire.Failure(error)
    }

    var response: HTTPResponse {
        var headers = self.headers
        if let after = failure.retryAfter { headers.append(("Retry-After", String(Int(after.rounded(.up))))) }
        return .json(Wire.ErrorBody(failure), status: status, headers: headers)
    }

    static func status(for code: RecordZoneError.Code) -> Int {
        switch code {
        case .invalidArguments, .malformed, .invalidSignature: 400
        case .notAuthenticated: 401
        case .notAuthorized: 403
        case .zoneNotFound, .unknownItem, .routeNotFound: 404
        case .methodNotAllowed: 405
        case .serverRecordChanged: 409
        case .changeTokenExpired: 410
        case .limitExceeded: 413
        case .requestRateLimited: 429
        case .serviceUnavailable, .networkUnavailable, .deviceInUse, .folderUnavailable: 503
        case .assetCorrupt, .ioError, .internalError: 500
        }
    }
}
