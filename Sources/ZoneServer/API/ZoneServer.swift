import Foundation
import RecordZone

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
    public var now: @Sendable () -> Date = { Date() }
    public var logger = Logger.silent

    public init() {}
}

/// The HTTP zone server: the record-zone API (version 1) over ``SQLiteBackend`` storage,
/// with signed requests, zone access control, limits and metrics. `convkitd serve` runs one;
/// tests start one in-process on 127.0.0.1, port 0.
///
/// ```swift
/// let storage = try SQLiteBackend(directory: "/var/lib/convkitd", policy: ConversationStore.recordPolicy())
/// let server = ZoneServer(storage: storage, access: ChatZoneAccess())
/// let port = try server.start(host: "127.0.0.1", port: 8080)
/// ```
public final class ZoneServer: Sendable {
    public let storage: SQLiteBackend
    let access: any ZoneAccessPolicy
    let configuration: ZoneServerConfiguration
    let authenticator: Authenticator
    let metrics = Metrics()
    let http: HTTPServer

    public init(storage: SQLiteBackend, access: any ZoneAccessPolicy = OpenZoneAccess(), configuration: ZoneServerConfiguration = ZoneServerConfiguration()) {
        self.storage = storage
        self.access = access
        self.configuration = configuration
        authenticator = Authenticator(policy: storage.policy, now: configuration.now, maximumSkew: configuration.maximumClockSkew,
                                      requestsPerSecond: configuration.requestsPerSecond, burst: configuration.burst)
        let router = Router()
        http = HTTPServer(limits: configuration.limits, logger: configuration.logger, preflight: { [router] method, path, headers in
            router.server?.preflight(method: method, path: path, headers: headers)
        }) { [router] request in
            await router.server?.respond(to: request) ?? HTTPResponse(status: 503)
        }
        router.server = self
    }

    /// Starts listening, over HTTPS with `tls`. - Returns: the port bound (useful with port 0).
    @discardableResult
    public func start(host: String, port: Int, tls: TLSIdentity? = nil) throws(RecordZoneError) -> Int {
        let bound = try http.start(host: host, port: port, tls: tls)
        configuration.logger.info("listening on \(host):\(bound)\(tls == nil ? "" : " (HTTPS)")")
        return bound
    }

    public var port: Int { http.port }

    /// Stops accepting, answers waiting long polls, waits up to `grace` for requests in flight
    /// (then cancels them and waits for their handlers), and stops.
    public func stop(grace: Duration = .seconds(10)) async {
        storage.releaseWaiters()
        await http.stop(grace: grace)
        configuration.logger.info("stopped")
    }

    /// Refuses, before its body is read, a request that cannot succeed whatever its body: an
    /// unknown route, a control character in the path, or an authenticated route whose
    /// `Authorization` is missing, malformed, stale, or names a key its identity does not allow
    /// (the signature itself, which covers the body, is checked once the body is in).
    func preflight(method: String, path: String, headers: [String: String]) -> HTTPResponse? {
        let refusal: APIError
        do {
            let route = try Route.match(method: method, path: path)
            guard route.isAuthenticated, let why = authenticator.precheck(headers) else { return nil }
            refusal = APIError(401, RecordZoneError.Code.notAuthenticated.rawValue, why)
        } catch {
            refusal = error
        }
        metrics.record(method: method, status: refusal.status, seconds: 0)
        return refusal.response
    }

    /// Handles one request: the whole API, as a function (tests may call it directly too).
    public func respond(to request: HTTPRequest) async -> HTTPResponse {
        let start = ContinuousClock.now
        var identity = "-"
        let response: HTTPResponse
        do {
            let route = try Route.match(method: request.method, path: request.path)
            if route.isAuthenticated {
                do {
                    identity = try authenticator.authenticate(request)
                } catch {
                    switch error {
                    case .unauthenticated(let why): throw APIError(401, RecordZoneError.Code.notAuthenticated.rawValue, why)
                    case .rateLimited(let after):
                        throw APIError(429, RecordZoneError.Code.requestRateLimited.rawValue, "too many requests; retry after \(String(format: "%.3f", after)) s",
                                       retryAfter: after)
                    }
                }
            }
            // A first request binds its identity to its key: on disk before it is answered.
            try await storage.persistPins()
            response = try await handle(route, request, identity: identity)
        } catch let error as APIError {
            response = error.response
        } catch let error as RecordZoneError {
            response = APIError(error).response
        } catch {
            response = APIError(500, RecordZoneError.Code.internalError.rawValue, "\(error)").response
        }
        let seconds = Double((ContinuousClock.now - start).components.attoseconds) / 1e18 + Double((ContinuousClock.now - start).components.seconds)
        metrics.record(method: request.method, status: response.status, seconds: seconds)
        configuration.logger.debug("\(request.method) \(request.path) \(response.status) \(String(format: "%.1f", seconds * 1000)) ms \(identity)")
        if response.status >= 500 { configuration.logger.info("\(request.method) \(request.path) failed: \(response.status)") }
        return response
    }
}

/// Breaks the reference cycle between the server and its HTTP handler.
final class Router: @unchecked Sendable {
    weak var server: ZoneServer?
}

/// An error answered as a JSON body with an HTTP status.
struct APIError: Error {
    var status: Int
    var failure: Wire.Failure
    /// Extra headers (a 405's `Allow`).
    var headers: [(String, String)] = []

    init(_ status: Int, _ code: String, _ message: String, retryAfter: Double? = nil, headers: [(String, String)] = []) {
        self.status = status
        failure = Wire.Failure(code: code, message: message, retryAfter: retryAfter)
        self.headers = headers
    }

    init(_ error: RecordZoneError) {
        status = Self.status(for: error.code)
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
        case .serviceUnavailable, .networkUnavailable, .deviceInUse: 503
        case .assetCorrupt, .ioError, .internalError: 500
        }
    }
}
