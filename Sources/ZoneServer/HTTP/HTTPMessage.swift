import Foundation
import RecordZone

/// A request as the handler sees it: fully received, headers with lowercased names, query
/// arguments decoded.
public struct HTTPRequest: Sendable {
    public var method: String
    public var path: String
    public var query: [(String, String)]
    public var headers: [String: String]
    public var body: Data
    /// The address the request came from (IPv4 or IPv6, as text), for a service whose
    /// ``HTTPService/needsClient(path:)`` asks for it; empty otherwise.
    public var client: String

    public init(method: String, path: String, query: [(String, String)] = [], headers: [String: String] = [:], body: Data = Data(), client: String = "") {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.client = client
    }

    public func queryValue(_ name: String) -> String? { query.first { $0.0 == name }?.1 }
}

/// A response: status, headers, body.
public struct HTTPResponse: Sendable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: Data
    /// For a `101 Switching Protocols`: given the connection once the answer is sent (a stream).
    var upgrade: (@Sendable (StreamConnection) async -> Void)?

    public init(status: Int, headers: [(String, String)] = [], body: Data = Data()) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A `101 Switching Protocols` to `protocolName`: the connection then goes to `stream`.
    static func switching(to protocolName: String, headers: [(String, String)] = [], _ stream: @escaping @Sendable (StreamConnection) async -> Void) -> HTTPResponse {
        var response = HTTPResponse(status: 101, headers: [("Upgrade", protocolName), ("Connection", "Upgrade")] + headers)
        response.upgrade = stream
        return response
    }

    /// A JSON response.
    public static func json<T: Encodable>(_ value: T, status: Int = 200, headers: [(String, String)] = []) -> HTTPResponse {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        guard let body = try? encoder.encode(value) else {
            return HTTPResponse(status: 500, headers: [("Content-Type", "application/json")], body: Data(#"{"error":{"code":"\#(RecordZoneError.Code.internalError.rawValue)","message":"cannot encode the response"}}"#.utf8))
        }
        return HTTPResponse(status: status, headers: [("Content-Type", "application/json")] + headers, body: body)
    }
}

/// A certificate and its private key (PEM), for serving HTTPS.
public struct TLSIdentity: Sendable {
    public var certificatePEM: String
    public var keyPEM: String

    public init(certificatePEM: String, keyPEM: String) {
        self.certificatePEM = certificatePEM
        self.keyPEM = keyPEM
    }

    /// Reads the two PEM files. - Throws: ``RecordZoneError/Code/ioError``.
    public init(certificateFile: String, keyFile: String) throws(RecordZoneError) {
        let read = { (path: String) throws(RecordZoneError) -> String in
            guard let data = FileManager.default.contents(atPath: path) else { throw RecordZoneError(.ioError, "cannot read \(path)") }
            return String(decoding: data, as: UTF8.self)
        }
        self.init(certificatePEM: try read(certificateFile), keyPEM: try read(keyFile))
    }
}

/// Limits the HTTP layer enforces before a handler runs.
public struct HTTPLimits: Sendable {
    /// The largest request body; larger ones get 413 without being read whole.
    public var maximumBodyBytes = 48 << 20
    /// The most connections at once; more wait to be accepted. Room for ten thousand clients
    /// online, each holding a long poll, and those sending; the server raises its descriptor
    /// limit to fit (up to the hard limit) and, where the hard limit is lower, serves fewer
    /// and says so in its log.
    public var maximumConnections: UInt32 = 16_384
    /// From this many open connections on, the least recently active idle ones (between
    /// requests, or connected with none yet; never one in a request or a long poll) are closed
    /// within a second, so that connections held open and idle cannot keep a new client out.
    /// nil: seven eighths of ``maximumConnections``.
    public var idleConnectionsGiveWayAt: UInt32? = nil
    /// The most connections at once from one address, so one client cannot take them all.
    public var maximumConnectionsPerAddress: UInt32 = 64
    /// Seconds a connection may stay idle (a slow client) before it is closed.
    public var connectionTimeoutSeconds: UInt32 = 15
    /// Bytes of memory each connection may use for headers and buffers: room for headers past
    /// ``maximumHeaderBytes``, so that they get the JSON 431. libmicrohttpd clears a connection's
    /// whole pool after each request, so this is what a busy connection costs: with 256 KiB,
    /// ten thousand clients grew the server by gigabytes and spent a few per cent of its CPU on
    /// clearing memory.
    public var connectionMemoryBytes = 32 << 10
    /// The most header bytes (names and values) a request may carry; more get a JSON 431. (A
    /// request whose headers do not even fit `connectionMemoryBytes` is refused by libmicrohttpd
    /// itself: a 431 with its own small HTML body.)
    public var maximumHeaderBytes = 16 << 10
    /// Threads that accept, read and write connections (libmicrohttpd's polling threads, each
    /// with its share of the connections and of the connection limit); nil: one per core.
    /// Handlers run on threads of their own either way.
    public var pollingThreads: UInt32? = nil

    public init() {}
}
