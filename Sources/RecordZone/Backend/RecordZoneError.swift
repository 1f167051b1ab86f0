import Foundation

/// The error every backend and the record layer throw: a code (CloudKit's names where they
/// apply), a human-readable message, and the context it happened in.
public struct RecordZoneError: Error, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable, Hashable, Codable {
        /// A change token is from another incarnation of the zone (deleted and recreated).
        case changeTokenExpired
        /// The record on the server is not the one the save expected (carries it).
        case serverRecordChanged
        case zoneNotFound
        case unknownItem
        /// A batch, record, asset or body is over its limit.
        case limitExceeded
        case invalidArguments
        /// A record's signature is missing or does not verify.
        case invalidSignature
        /// A record's author is not allowed to write it, or a key file is unsafe.
        case notAuthorized
        /// Bytes that are not a valid record, token or segment.
        case malformed
        case networkUnavailable
        case serviceUnavailable
        case requestRateLimited
        case assetCorrupt
        /// Another process already writes as this device.
        case deviceInUse
        /// A shared folder is missing, empty (not mounted?) or another folder than the one this
        /// device writes to; nothing was written.
        case folderUnavailable
        case ioError
        case internalError
        /// A request's signature is missing, malformed, stale, replayed or wrong (HTTP 401).
        case notAuthenticated
        /// No route has this path (HTTP 404).
        case routeNotFound
        /// The path exists, with other methods (HTTP 405, with `Allow`).
        case methodNotAllowed
    }

    public var code: Code
    public var message: String
    public var recordID: RecordID?
    /// With ``Code/serverRecordChanged``: the record the backend holds.
    public var serverRecord: Record?
    /// With rate limiting and unavailability: how long to wait before retrying, in seconds.
    public var retryAfter: Double?
    /// With ``Code/notAuthenticated``: why the server did not accept who signed the request.
    public var authentication: AuthenticationProblem?

    public init(_ code: Code, _ message: String, recordID: RecordID? = nil, serverRecord: Record? = nil, retryAfter: Double? = nil,
                authentication: AuthenticationProblem? = nil) {
        self.code = code
        self.message = message
        self.recordID = recordID
        self.serverRecord = serverRecord
        self.retryAfter = retryAfter
        self.authentication = authentication
    }

    /// Whether trying the same operation again later may succeed. The one place retry
    /// decisions are made.
    public var isTransient: Bool {
        switch code {
        case .networkUnavailable, .serviceUnavailable, .requestRateLimited, .ioError, .deviceInUse, .folderUnavailable: true
        case .changeTokenExpired, .serverRecordChanged, .zoneNotFound, .unknownItem, .limitExceeded,
            .invalidArguments, .invalidSignature, .notAuthorized, .malformed, .assetCorrupt, .internalError,
            .notAuthenticated, .routeNotFound, .methodNotAllowed:
            false
        }
    }

    public var description: String {
        recordID.map { "\(code.rawValue): \($0): \(message)" } ?? "\(code.rawValue): \(message)"
    }
}

/// Why a server answered a request 401 (``RecordZoneError/Code/notAuthenticated``): what a
/// client must tell its user, since each asks for something else (fix the clock, link the
/// device again, nothing at all).
public enum AuthenticationProblem: Sendable, Hashable, CustomStringConvertible {
    /// No `Authorization` header, or one that does not parse.
    case missingSignature
    /// The signature does not verify over the request.
    case badSignature
    /// The request's nonce was seen before.
    case replayed
    /// The request's time is this many seconds ahead of the server's clock (negative: behind),
    /// more than the server allows.
    case clockSkew(seconds: Double)
    /// The identity is bound to another key: this key never spoke for it (or someone else's does).
    case unknownKey
    /// The key is a device of the identity that has been revoked: nothing it signs is accepted.
    case deviceRevoked
    /// The device certificate sent with a new device's requests is not its own, expired or refused.
    case deviceCertificate

    /// The name on the wire (`reason` in an error body).
    public var name: String {
        switch self {
        case .missingSignature: "missingSignature"
        case .badSignature: "badSignature"
        case .replayed: "replayed"
        case .clockSkew: "clockSkew"
        case .unknownKey: "unknownKey"
        case .deviceRevoked: "deviceRevoked"
        case .deviceCertificate: "deviceCertificate"
        }
    }

    /// From the wire: the reason's name and, for ``clockSkew(seconds:)``, the skew.
    public init?(name: String, skewSeconds: Double?) {
        switch name {
        case "missingSignature": self = .missingSignature
        case "badSignature": self = .badSignature
        case "replayed": self = .replayed
        case "clockSkew": self = .clockSkew(seconds: skewSeconds ?? 0)
        case "unknownKey": self = .unknownKey
        case "deviceRevoked": self = .deviceRevoked
        case "deviceCertificate": self = .deviceCertificate
        default: return nil
        }
    }

    public var description: String {
        switch self {
        case .missingSignature: "the request is not signed"
        case .badSignature: "the request's signature does not verify"
        case .replayed: "the request was replayed"
        case .clockSkew(let seconds):
            "this machine's clock is \(Int(abs(seconds).rounded())) s \(seconds > 0 ? "ahead of" : "behind") the server's: set it right"
        case .unknownKey: "the server holds another key for this identity"
        case .deviceRevoked: "this device was revoked: nothing it signs is accepted any more"
        case .deviceCertificate: "the server refused this device's certificate"
        }
    }
}
