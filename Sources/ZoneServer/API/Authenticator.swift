import Foundation
import RecordZone
import Synchronization

/// Checks request signatures: well-formed, fresh (within the clock skew), made by the key bound
/// to the claimed identity (trust on first use, as record ownership), and within the per-key
/// rate limit (kept per server). Replays are refused by the storage
/// (``ZoneStorage/claimNonce(_:at:horizon:)``), where every server sharing it sees the nonces.
final class Authenticator: Sendable {
    enum Failure: Error {
        case unauthenticated(AuthenticationProblem, String)
        case rateLimited(retryAfter: Double)
    }

    private let policy: RecordPolicy
    private let now: @Sendable () -> Date
    private let maximumSkew: Double
    private let rate: Double
    private let burst: Double

    private struct Bucket {
        var tokens: Double
        var updated: Date
    }
    private let buckets = Mutex([Data: Bucket]())

    /// An authenticated request: who, with which key, and the nonce to claim.
    struct Authenticated {
        var identity: String
        var key: Data
        /// The key and the request's nonce: seen twice, the request is a replay.
        var nonce: Data
        /// The time the request was signed at (what the signature covers, so a replay carries
        /// it too): the nonce is kept under it. The server's own clock would file a replay that
        /// comes a minute later under another minute, where the nonce was never seen.
        var time: Date
    }

    /// How long a nonce must be remembered: past twice the skew, its request is stale anyway.
    var nonceHorizon: TimeInterval { 2 * maximumSkew }

    init(policy: RecordPolicy, now: @escaping @Sendable () -> Date, maximumSkew: Double, requestsPerSecond: Double, burst: Double) {
        self.policy = policy
        self.now = now
        self.maximumSkew = maximumSkew
        self.rate = requestsPerSecond
        self.burst = burst
    }

    /// Why a request's headers alone already fail authentication (before its body is read), or
    /// nil when they may pass: the signature, which covers the body, is checked later.
    func precheck(_ headers: [String: String]) -> Failure? {
        guard let header = headers["authorization"] else { return .unauthenticated(.missingSignature, "missing Authorization header") }
        guard let credentials = RequestSignature.parse(header) else { return .unauthenticated(.missingSignature, "malformed Authorization header") }
        if let skew = skewFailure(credentials, now: now()) { return skew }
        guard headers[RequestSignature.deviceHeader.lowercased()] == nil else { return nil }
        return keyFailure(identity: credentials.identity, key: credentials.publicKey, chain: policy.pins.chain(for: credentials.identity))
    }

    /// The refusal of a request whose time is further from the server's clock than allowed,
    /// saying by how much (a client shows it: its clock is wrong, not its key).
    private func skewFailure(_ credentials: RequestSignature.Credentials, now clock: Date) -> Failure? {
        let ahead = Double(credentials.timestamp) / 1000 - clock.timeIntervalSince1970
        guard abs(ahead) > maximumSkew else { return nil }
        return .unauthenticated(.clockSkew(seconds: ahead), "the request's time is \(Int(abs(ahead).rounded())) s \(ahead > 0 ? "ahead of" : "behind") the server's clock (at most \(Int(maximumSkew)) s allowed)")
    }

    /// Why `key` may not speak for `identity` now (nil when it may, or nothing is pinned yet):
    /// a revoked device of the identity, or a key the identity's chain does not hold.
    func keyFailure(identity: String, key: Data, chain: KeyChain?) -> Failure? {
        guard let chain, !chain.allowsNow(key) else { return nil }
        if chain.device(key)?.revokedAfter != nil { return .unauthenticated(.deviceRevoked, "this device of '\(identity)' was revoked") }
        return .unauthenticated(.unknownKey, "'\(identity)' is bound to another key")
    }

    /// The authenticated identity of a request (its nonce not yet claimed).
    func authenticate(_ request: HTTPRequest) throws(Failure) -> Authenticated {
        guard let header = request.headers["authorization"] else { throw .unauthenticated(.missingSignature, "missing Authorization header") }
        guard let credentials = RequestSignature.parse(header) else { throw .unauthenticated(.missingSignature, "malformed Authorization header") }
        let clock = now()
        if let skew = skewFailure(credentials, now: clock) { throw skew }
        guard RequestSignature.verify(credentials, method: request.method, path: request.path, query: request.query, body: request.body) else {
            throw .unauthenticated(.badSignature, "request signature does not verify")
        }
        if let certificate = request.headers[RequestSignature.deviceHeader.lowercased()] {
            try enroll(certificate, credentials, at: clock)
        }
        guard policy.pins.bind(identity: credentials.identity, key: credentials.publicKey) else {
            throw keyFailure(identity: credentials.identity, key: credentials.publicKey, chain: policy.pins.chain(for: credentials.identity))
                ?? .unauthenticated(.unknownKey, "'\(credentials.identity)' is bound to another key")
        }
        if let after = spend(credentials.publicKey, at: clock) { throw .rateLimited(retryAfter: after) }
        return Authenticated(identity: credentials.identity, key: credentials.publicKey, nonce: credentials.publicKey + credentials.nonce,
                             time: Date(timeIntervalSince1970: Double(credentials.timestamp) / 1000))
    }

    /// Takes one request from `key`'s allowance (a request, or a zone a stream reads for it).
    /// - Returns: nil when it had one; otherwise the seconds until it has.
    func spend(_ key: Data, at clock: Date? = nil) -> Double? {
        let clock = clock ?? now()
        return buckets.withLock { buckets in
            var bucket = buckets[key] ?? Bucket(tokens: burst, updated: clock)
            bucket.tokens = min(burst, bucket.tokens + max(0, clock.timeIntervalSince(bucket.updated)) * rate)
            bucket.updated = clock
            defer { buckets[key] = bucket }
            guard bucket.tokens >= 1 else { return max(0.001, (1 - bucket.tokens) / rate) }
            bucket.tokens -= 1
            return nil
        }
    }

    /// Admits the device certificate a newly linked device sends with its requests, so its key
    /// is bound through the identity's chain before its first save (only when it is not yet).
    private func enroll(_ header: String, _ credentials: RequestSignature.Credentials, at clock: Date) throws(Failure) {
        if policy.pins.chain(for: credentials.identity)?.allowsNow(credentials.publicKey) == true { return }
        guard let bytes = Data(base64Encoded: header), let record = try? Record(canonical: bytes),
            record.recordType == DeviceCertificate.recordType, record[DeviceCertificate.keyField]?.bytesValue == credentials.publicKey,
            record[DeviceCertificate.identityField]?.stringValue == credentials.identity, let expires = DeviceCertificate.expiry(of: record)
        else { throw .unauthenticated(.deviceCertificate, "the \(RequestSignature.deviceHeader) header is not this device's certificate") }
        guard Double(expires.milliseconds) >= (clock.timeIntervalSince1970 - maximumSkew) * 1000 else {
            throw .unauthenticated(.deviceCertificate, "the device certificate's link code expired")
        }
        if case .failure(let rejected) = policy.admit(encoded: bytes, source: "request") {
            throw .unauthenticated(.deviceCertificate, "the device certificate is refused: \(rejected.reason)")
        }
    }
}
