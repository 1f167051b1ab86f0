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
    /// With rate limiting and unavailability: how long to wait before retrying.
    public var retryAfter: Double?

    public init(_ code: Code, _ message: String, recordID: RecordID? = nil, serverRecord: Record? = nil, retryAfter: Double? = nil) {
        self.code = code
        self.message = message
        self.recordID = recordID
        self.serverRecord = serverRecord
        self.retryAfter = retryAfter
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
