import Foundation
import Synchronization

/// A backend that talks to a zone server (`convkitd serve`) over HTTP.
///
/// Every request is signed with the speaker's key (``RequestSignature``). Everything read is
/// verified again here with the client's own ``RecordPolicy``: the server is not trusted.
/// Errors map onto ``RecordZoneError``: a network failure is ``RecordZoneError/Code/networkUnavailable``
/// (transient); 4xx answers are not transient; 429 and 503 are retried after the server's
/// `Retry-After` (a few times, briefly) and then surface with ``RecordZoneError/retryAfter`` set.
///
/// ```swift
/// let backend = HTTPBackend(url: URL(string: "http://127.0.0.1:8080")!, identity: "alice", key: key, policy: policy)
/// ```
public final class HTTPBackend: RecordZoneBackend, Sendable {
    /// How records travel (``Wire``): as a binary table of canonical bytes (the default), or
    /// base64 inside JSON.
    public enum WireForm: Sendable { case binary, json }

    public let baseURL: URL
    public let wireForm: WireForm
    public let identity: String
    public let policy: RecordPolicy
    let key: SigningKey
    /// A linked device's certificate, sent with every request (``RequestSignature/deviceHeader``).
    let deviceCertificate: Data?
    /// The bytes of versions this client saved lately, by signature: when a pull brings them
    /// back, bytes equal to what it signed and saved need no second verification.
    private let recentlySaved = Mutex<[Data: Data]>([:])
    private static let recentlySavedLimit = 8192
    /// A PEM file of CA certificates for an HTTPS server (nil: the system's store).
    let caFile: String?
    let now: @Sendable () -> Date
    /// How many times a 429 or 503 is retried before it surfaces.
    let maximumRetries: Int
    /// The longest wait before such a retry.
    let maximumRetryDelay: Double
    /// A stream's pings and the silence that ends it (the server's must be alike).
    let streamTiming: Wire.StreamFrame.Timing

    /// - Parameter deviceCertificate: on a linked device, its ``DeviceCertificate`` (canonical
    ///   bytes): a server binds the device's key from it.
    public init(url: URL, identity: String, key: SigningKey, policy: RecordPolicy = RecordPolicy(), deviceCertificate: Data? = nil,
                wireForm: WireForm = .binary, caFile: String? = nil, maximumRetries: Int = 2, maximumRetryDelay: Double = 2,
                streamTiming: Wire.StreamFrame.Timing = .standard, now: @escaping @Sendable () -> Date = { Date() }) {
        baseURL = url
        self.wireForm = wireForm
        self.caFile = caFile
        self.identity = identity
        self.key = key
        self.deviceCertificate = deviceCertificate
        self.policy = policy
        self.maximumRetries = maximumRetries
        self.maximumRetryDelay = maximumRetryDelay
        self.streamTiming = streamTiming
        self.now = now
    }

    /// Whether the server answers its health check (`GET /healthz`).
    public func isHealthy() async -> Bool {
        (try? await send("GET", "/healthz", timeout: 10)) != nil
    }

    // MARK: Zones

    public func createZone(_ zone: ZoneName) async throws(RecordZoneError) {
        _ = try await send("PUT", "/v1/zones/\(zone.rawValue)")
    }

    public func zones() async throws(RecordZoneError) -> [ZoneName] {
        try await get(Wire.Zones.self, "/v1/zones").zones.compactMap { try? ZoneName($0) }
    }

    public func deleteZone(_ zone: ZoneName) async throws(RecordZoneError) {
        _ = try await send("DELETE", "/v1/zones/\(zone.rawValue)")
    }

    public func fetchDatabaseChanges(since token: ChangeToken?) async throws(RecordZoneError) -> DatabaseChanges {
        try await get(DatabaseChanges.self, "/v1/changes", query: token.map { [("token", $0.base64)] } ?? [])
    }

    // MARK: Changes

    public func fetchChanges(in zone: ZoneName, since token: ChangeToken?, limit: Int) async throws(RecordZoneError) -> ZoneChanges {
        // Every backend takes any limit and pages within its own (the server refuses one out of 1…1000).
        var query = [("limit", String(BackendLimits.clampPage(limit)))]
        if let token { query.append(("token", token.base64)) }
        return admit(try await get(Wire.Changes.self, "/v1/zones/\(zone.rawValue)/changes", query: query, records: true))
    }

    /// A page of changes as this client takes it: what the server sent is verified here, once,
    /// over the bytes received. So are the records it refused for a key it does not hold for
    /// their owner: whose key is whose is this reader's pins' to decide.
    func admit(_ page: Wire.Changes) -> ZoneChanges {
        var received = page.records, standing = [RejectedRecord]()
        for rejection in page.rejected {
            if rejection.reason.isAboutKeys, let bytes = rejection.data {
                received.append(Wire.SignedRecord(bytes: bytes))
            } else {
                standing.append(rejection)
            }
        }
        let (records, rejected) = admit(received)
        return ZoneChanges(records: records, rejected: standing + rejected, token: page.token, moreComing: page.moreComing)
    }

    public func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
        let seconds = Self.wholeSeconds(timeout)
        var query = [("timeout", String(seconds))]
        if let token { query.append(("token", token.base64)) }
        return try await get(Wire.Wait.self, "/v1/zones/\(zone.rawValue)/wait", query: query, timeout: Double(seconds) + 15).changed
    }

    /// A long poll's timeout as the server takes it, whole seconds: a shorter wait rounds up,
    /// never down to none.
    private static func wholeSeconds(_ timeout: Duration) -> Int {
        max(0, Int(timeout.inSeconds.rounded(.up)))
    }

    // MARK: Typing

    public var carriesTyping: Bool { true }

    /// The server takes the typist from the request's signature (`identity` is this client's).
    public func setTyping(_ typing: Bool, in zone: ZoneName, as identity: String) async throws(RecordZoneError) {
        let body: Data
        do { body = try JSONEncoder().encode(Wire.SetTyping(typing: typing)) } catch { throw RecordZoneError(.internalError, "cannot encode: \(error)") }
        _ = try await send("PUT", "/v1/zones/\(zone.rawValue)/typing", body: body)
    }

    public func typing(in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> TypingState {
        let seconds = Self.wholeSeconds(timeout)
        var query = [("timeout", String(seconds))]
        if let version { query.append(("since", String(version))) }
        let answer = try await get(Wire.Typing.self, "/v1/zones/\(zone.rawValue)/typing", query: query, timeout: Double(seconds) + 15)
        guard let version = UInt64(answer.version) else { throw RecordZoneError(.malformed, "a typing version that is not a number: \(answer.version)") }
        return TypingState(identities: answer.typing, version: version)
    }

    // MARK: Presence

    public func setPresence(_ online: Bool, as identity: String) async throws(RecordZoneError) {
        let body: Data
        do { body = try JSONEncoder().encode(Wire.SetPresence(online: online)) } catch { throw RecordZoneError(.internalError, "cannot encode: \(error)") }
        _ = try await send("PUT", "/v1/presence", body: body)
    }

    public func presence(of identities: [String], in zone: ZoneName, since version: UInt64?, timeout: Duration) async throws(RecordZoneError) -> PresenceState {
        let seconds = Self.wholeSeconds(timeout)
        var query = [("of", identities.joined(separator: ",")), ("timeout", String(seconds))]
        if let version { query.append(("since", String(version))) }
        let answer = try await get(Wire.PresenceList.self, "/v1/zones/\(zone.rawValue)/presence", query: query, timeout: Double(seconds) + 15)
        guard let state = answer.state else { throw RecordZoneError(.malformed, "a presence version that is not a number: \(answer.version)") }
        return state
    }

    // MARK: Records

    public func save(_ records: [Record], policy savePolicy: SavePolicy) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try await save(records, policy: savePolicy, catchingUpFrom: nil).results
    }

    public func save(_ records: [Record], policy savePolicy: SavePolicy, catchingUpFrom databaseToken: ChangeToken?) async throws(RecordZoneError) -> SaveAnswer {
        try BackendLimits.checkBatch(records.count)
        let request = try Wire.Modify(records: records, policy: savePolicy, since: databaseToken)
        let body = try await post(Wire.Outcomes.self, "/v1/records/modify", request)
        guard body.results.count == records.count else {
            throw RecordZoneError(.malformed, "the server answered \(body.results.count) results for \(records.count) records")
        }
        let results = zip(zip(records, request.records), body.results).map { sent, outcome -> Result<Record, RecordZoneError> in
            let (record, ours) = sent
            // Our own version is stored: keep it (nothing to verify), with the server's metadata.
            let metadata = outcome.stored.map { Wire.SignedRecord(bytes: ours.bytes, changeTag: $0.changeTag, receivedAt: $0.receivedAt) }
                ?? outcome.record.flatMap { $0.bytes == ours.bytes ? $0 : nil }
            if let metadata {
                remember(ours.bytes)
                var kept = record
                kept.serverMetadata = metadata.serverMetadata
                return .success(kept)
            }
            return checked(outcome, id: record.id)
        }
        return SaveAnswer(results: results, catchUp: body.catchUp ?? .none)
    }

    public func fetch(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
        try BackendLimits.checkBatch(ids.count)
        let body = try await post(Wire.Outcomes.self, "/v1/records/fetch", Wire.Fetch(ids: ids.map(Wire.ID.init)))
        guard body.results.count == ids.count else {
            throw RecordZoneError(.malformed, "the server answered \(body.results.count) results for \(ids.count) IDs")
        }
        return zip(ids, body.results).map { id, outcome in checked(outcome, id: id) }
    }

    /// `GET /v1/public/{zone}/{name}`, which the server answers without authentication.
    public func fetchPublic(_ id: RecordID) async throws(RecordZoneError) -> Record? {
        let outcome: Wire.Outcome
        do { outcome = try await get(Wire.Outcome.self, "/v1/public/\(id.zone.rawValue)/\(id.name)") } catch where error.code == .unknownItem {
            return nil
        }
        return try checked(outcome, id: id).get()
    }

    public func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) async throws(RecordZoneError) -> QueryResult {
        let request = Wire.Query(recordType: query.recordType, predicates: query.predicates, sort: query.sort,
                                 cursor: cursor?.data.base64EncodedString(), limit: BackendLimits.clampPage(limit))
        let body = try await post(Wire.QueryResults.self, "/v1/zones/\(query.zone.rawValue)/query", request)
        let next = try body.cursor.map { text throws(RecordZoneError) -> QueryCursor in
            guard let data = Data(base64Encoded: text) else { throw RecordZoneError(.malformed, "the server sent a malformed cursor") }
            return QueryCursor(data: data)
        }
        return QueryResult(records: admit(body.records).records, cursor: next)
    }

    // MARK: Assets

    public func putAsset(_ data: Data, expected: AssetReference?) async throws(RecordZoneError) -> AssetReference {
        // With the reference given, the server's check is the one (it hashes what it stores and
        // answers assetCorrupt): hashing here too would only repeat it.
        let reference: AssetReference
        if let expected {
            guard data.count == expected.size, data.count <= BackendLimits.maximumAssetSize else {
                throw RecordZoneError(data.count > BackendLimits.maximumAssetSize ? .limitExceeded : .assetCorrupt,
                                      "asset is \(data.count) bytes; \(expected) names \(expected.size) (at most \(BackendLimits.maximumAssetSize))")
            }
            reference = expected
        } else {
            reference = try AssetChecks.reference(for: data, expected: nil)
        }
        _ = try await send("PUT", "/v1/assets/\(reference.hexHash)", body: data, contentType: "application/octet-stream")
        return reference
    }

    public func asset(_ reference: AssetReference) async throws(RecordZoneError) -> Data {
        let data = try await send("GET", "/v1/assets/\(reference.hexHash)", query: [("size", String(reference.size))])
        try AssetChecks.verify(data, against: reference)
        return data
    }

    // MARK: Verification

    /// Decodes and verifies records read from the server, once each, over the bytes received
    /// (signatures on all cores), and splits them into those that pass the client's policy and
    /// those that do not.
    private func admit(_ received: [Wire.SignedRecord]) -> (records: [Record], rejected: [RejectedRecord]) {
        // Our own versions coming back, byte for byte, were verified when we signed them.
        let ours = recentlySaved.withLock { saved in received.map { saved[$0.bytes.suffix(Sodium.signatureLength)] == $0.bytes } }
        var valid = [Record](), rejected = [RejectedRecord]()
        for (signed, outcome) in zip(received, policy.admit(batch: received.map(\.bytes), source: { _ in "http" }, signedHere: { ours[$0] })) {
            switch outcome {
            case .success(var record):
                record.serverMetadata = signed.serverMetadata
                valid.append(record)
            case .failure(let rejection): rejected.append(rejection)
            }
        }
        return (valid, rejected)
    }

    private func remember(_ bytes: Data) {
        recentlySaved.withLock { saved in
            if saved.count >= Self.recentlySavedLimit { saved.removeAll(keepingCapacity: true) }
            saved[bytes.suffix(Sodium.signatureLength)] = bytes
        }
    }

    /// One record's outcome from the server, its record verified (a server record that comes
    /// with an error is dropped when it does not verify).
    private func checked(_ outcome: Wire.Outcome, id: RecordID) -> Result<Record, RecordZoneError> {
        if let signed = outcome.record {
            let (records, rejected) = admit([signed])
            if let record = records.first { return .success(record) }
            return .failure(SaveChecks.error(for: rejected.first?.reason ?? .malformed("no record"), recordID: id))
        }
        guard var error = outcome.error?.error(recordID: id) else { return .failure(RecordZoneError(.internalError, "empty outcome", recordID: id)) }
        if let server = error.serverRecord, policy.check(server) != nil { error.serverRecord = nil }
        return .failure(error)
    }

    // MARK: Transport

    /// A GET; `records`: the answer carries records, in the wire form this client chose.
    private func get<T: Decodable>(_ type: T.Type, _ path: String, query: [(String, String)] = [], timeout: Double = 60,
                                   records: Bool = false) async throws(RecordZoneError) -> T {
        try decode(type, try await send("GET", path, query: query, timeout: timeout), binary: records && wireForm == .binary)
    }

    /// A POST whose body and answer carry records, in the wire form this client chose.
    private func post<T: Decodable, B: Encodable>(_ type: T.Type, _ path: String, _ body: B) async throws(RecordZoneError) -> T {
        let binary = wireForm == .binary
        let data: Data
        do { data = try Wire.encode(body, binary: binary) } catch {
            throw RecordZoneError(.invalidArguments, "cannot encode the request: \(error)")
        }
        return try decode(type, try await send("POST", path, body: data, contentType: binary ? Wire.recordsType : Wire.jsonType), binary: binary)
    }

    private func decode<T: Decodable>(_ type: T.Type, _ data: Data, binary: Bool) throws(RecordZoneError) -> T {
        do { return try Wire.decode(type, from: data, binary: binary) } catch {
            throw RecordZoneError(.malformed, "the server sent a malformed answer: \(Record.describe(error))")
        }
    }

    /// Sends a signed request; retries 429 and 503 after the server's delay, and once at once a
    /// request a reused connection dropped unanswered.
    func send(_ method: String, _ path: String, query: [(String, String)] = [], body: Data = Data(),
              contentType: String = "application/json", timeout: Double = 60) async throws(RecordZoneError) -> Data {
        var attempt = 0, resent = false
        while true {
            let status: Int, data: Data, retryAfterHeader: Double?
            do {
                (status, data, retryAfterHeader) = try await exchange(method, path, query: query, body: body, contentType: contentType, timeout: timeout)
            } catch where error.code == .networkUnavailable && error.retryAfter == 0 && !resent {
                // A reused connection closed under the request, nothing answered: once more,
                // signed anew (every request is a read or a save of signed versions, which the
                // server merges: sending one twice changes nothing).
                resent = true
                continue
            }
            if (200..<300).contains(status) { return data }
            let failure = try? JSONDecoder().decode(Wire.ErrorBody.self, from: data).error
            var error = failure?.error() ?? RecordZoneError(.internalError, "HTTP \(status)")
            // The server's own code stands; the status speaks only for an answer without one
            // this client knows (a proxy's page, a newer server's code).
            if failure.flatMap({ RecordZoneError.Code(rawValue: $0.code) }) == nil {
                switch status {
                case 401: error.code = .notAuthenticated
                case 403: error.code = .notAuthorized
                case 413: error.code = .limitExceeded
                case 429: error.code = .requestRateLimited
                case 503: error.code = .serviceUnavailable
                case 500...: if failure == nil { error.code = .serviceUnavailable }
                default: break
                }
            }
            if status == 429 || status == 503 {
                let delay = failure?.retryAfter ?? retryAfterHeader ?? 1
                error.retryAfter = delay
                if attempt < maximumRetries {
                    attempt += 1
                    try? await Task.sleep(for: .milliseconds(Int(min(delay, maximumRetryDelay) * 1000)))
                    continue
                }
            }
            throw error
        }
    }

    private func exchange(_ method: String, _ path: String, query: [(String, String)], body: Data, contentType: String,
                          timeout: Double) async throws(RecordZoneError) -> (Int, Data, Double?) {
        let queryString = RequestSignature.canonicalQuery(query)
        var headers = [
            ("Content-Type", contentType),
            ("Accept", wireForm == .binary ? "\(Wire.recordsType), \(Wire.jsonType)" : Wire.jsonType),
            ("Authorization", RequestSignature.authorization(method: method, path: path, query: query, body: body, identity: identity, key: key, now: now())),
        ]
        if let deviceCertificate { headers.append((RequestSignature.deviceHeader, deviceCertificate.base64EncodedString())) }
        let answer = try await CurlTransport.shared.perform(HTTPExchange(
            method: method, url: baseURL.absoluteString.trimmingSuffix("/") + path + (queryString.isEmpty ? "" : "?" + queryString),
            headers: headers, body: body, timeout: timeout, caFile: caFile))
        return (answer.status, answer.body, answer.headers["retry-after"].flatMap(Double.init))
    }
}

extension String {
    func trimmingSuffix(_ suffix: String) -> String {
        hasSuffix(suffix) ? String(dropLast(suffix.count)) : self
    }
}
