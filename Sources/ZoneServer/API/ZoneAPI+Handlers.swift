import Foundation
import RecordZone

extension ZoneAPI {
    func handle(_ matched: Route.Matched, _ request: HTTPRequest, identity: String) async throws -> HTTPResponse {
        switch matched.route {
        case .health:
            if let problem = await storage.healthProblem() {
                return .json(["status": "unavailable", "storage": problem], status: 503, headers: [("Retry-After", "1")])
            }
            return .json(["status": "ok", "storage": "ok"])
        case .metrics:
            let body = metrics.render(recordsStored: (try? await storage.recordCount()) ?? -1, longPollsWaiting: storage.waitingCount, inFlight: counters.inFlightCount,
                                      idleGivenWay: counters.idleConnectionsGivenWayCount, openConnections: counters.openConnectionCount,
                                      abandoned: counters.abandonedCount, memoryReleases: counters.memoryReleaseCount)
                + streamCounters.render() + storage.metricsText()
            return HTTPResponse(status: 200, headers: [("Content-Type", "text/plain; version=0.0.4")], body: Data(body.utf8))
        case .listZones:
            let zones = try await readable(try await storage.zones().filter { access.canRead(zone: $0, as: identity) }, identity)
            return .json(Wire.Zones(zones: zones.map(\.rawValue)))
        case .createZone, .deleteZone:
            let zone = try zoneParameter(matched)
            let allowed = matched.route == .createZone ? access.canCreate(zone: zone, as: identity) : access.canDelete(zone: zone, as: identity)
            guard allowed else { throw forbidden(identity, zone) }
            if matched.route == .createZone {
                try await storage.createZone(zone)
            } else {
                try await storage.deleteZone(zone)
            }
            return HTTPResponse(status: 204)
        case .databaseChanges:
            let token = try tokenParameter(request)
            let access = self.access
            let changes = try await storage.fetchDatabaseChanges(since: token) { access.canRead(zone: $0, as: identity) }
            return .json(try await readable(changes, identity))
        case .zoneChanges:
            let (zone, versions) = try await readableZone(matched, identity)
            let limit = try Self.pageLimit(try intParameter(request, "limit"), default: 200)
            return wire(try await storage.changes(in: zone, since: try tokenParameter(request), limit: limit, readable: versions), for: request)
        case .stream:
            guard request.headers["upgrade"]?.lowercased() == Wire.StreamFrame.protocolName else {
                throw APIError(.invalidArguments, "a stream is opened with 'Connection: Upgrade' and 'Upgrade: \(Wire.StreamFrame.protocolName)'", status: 426,
                               headers: [("Upgrade", Wire.StreamFrame.protocolName)])
            }
            // The key the request was signed with (verified): the stream ends when it is no longer allowed.
            guard let key = request.headers["authorization"].flatMap(RequestSignature.parse)?.publicKey else {
                throw APIError(.notAuthenticated, "missing Authorization header", authentication: .missingSignature)
            }
            return .switching(to: Wire.StreamFrame.protocolName, headers: [(Wire.StreamFrame.framesHeader, Wire.StreamFrame.offeredFrames)]) { connection in
                await ZoneStream(api: self, identity: identity, key: key, connection: connection).run()
            }
        case .waitForChanges:
            let (zone, _) = try await readableZone(matched, identity)
            let seconds = min(Double(try intParameter(request, "timeout") ?? 30), Double(configuration.maximumWait.components.seconds))
            let changed = try await storage.waitForChanges(in: zone, since: try tokenParameter(request), timeout: .milliseconds(Int(max(0, seconds) * 1000)))
            return .json(Wire.Wait(changed: changed))
        case .setTyping:
            let zone = try await typingZone(matched, identity)
            let body = try decode(Wire.SetTyping.self, request, canonical: false)
            guard await storage.setTyping(body.typing, identity: identity, in: zone) else {
                let after = TypingBoard.minimumInterval.inSeconds
                throw APIError(.requestRateLimited, "'\(identity)' said it types in '\(zone)' less than \(after) s ago", retryAfter: after)
            }
            return HTTPResponse(status: 204)
        case .typing:
            let zone = try await typingZone(matched, identity)
            let seconds = min(Double(try intParameter(request, "timeout") ?? 0), Double(configuration.maximumWait.components.seconds))
            let since = try versionParameter(request)
            let state = await storage.typing.wait(in: zone, since: since, timeout: .milliseconds(Int(max(0, seconds) * 1000)))
            return .json(Wire.Typing(TypingState(identities: state.identities.filter { $0 != identity }, version: state.version)))
        case .setPresence:
            let body = try decode(Wire.SetPresence.self, request, canonical: false)
            guard await storage.setPresence(body.online, identity: identity) else {
                let after = Double(PresenceBoard.minimumInterval.components.seconds)
                throw APIError(.requestRateLimited, "'\(identity)' said its presence less than \(after) s ago", retryAfter: after)
            }
            return HTTPResponse(status: 204)
        case .presence:
            let zone = try await typingZone(matched, identity)
            let asked = try presenceIdentities(request)
            let seconds = min(Double(try intParameter(request, "timeout") ?? 0), Double(configuration.maximumWait.components.seconds))
            let since = try versionParameter(request)
            let present = try await takingPart(asked.filter { $0 != identity }, in: zone)
            let state = await storage.presence.wait(of: present, since: since, timeout: .milliseconds(Int(max(0, seconds) * 1000)))
            return .json(Wire.PresenceList(state))
        case .modify:
            try refuseOverTheBatchLimit(request.body, "records")
            let body = try decode(Wire.Modify.self, request, canonical: true)
            guard body.records.count <= Record.maximumBatchSize else {
                throw APIError(.limitExceeded, "a request holds at most \(Record.maximumBatchSize) records, got \(body.records.count)")
            }
            var results = [Result<Record, RecordZoneError>?](repeating: nil, count: body.records.count)
            var allowed = [(Int, Record)]()
            for (index, signed) in body.records.enumerated() {
                let record: Record
                do { record = try signed.decoded() } catch {
                    results[index] = .failure(RecordZoneError(.malformed, "record \(index) is not a canonical record: \(error)"))
                    continue
                }
                if !access.canWrite(record, as: identity) {
                    results[index] = .failure(RecordZoneError(.notAuthorized, "'\(identity)' may not write \(record.id)", recordID: record.id))
                } else if let refusal = refusalByServerTime(record) ?? refusalOfAnUnknownOwner(record, as: identity) {
                    results[index] = .failure(refusal)
                } else {
                    allowed.append((index, record))
                }
            }
            let access = self.access
            // A replicator copies what members signed, in whatever order it comes: readers decide it by the rule.
            let gate = isReplicator(identity) ? nil : access.governance.map { SaveGate(governance: $0, identity: identity) }
            var saved = try await storage.save(allowed.map(\.1), policy: body.policy ?? .merge, feedSince: body.since,
                                               visibleTo: { access.canRead(zone: $0, as: identity) }, gate: gate)
            if let feed = saved.catchUp.database { saved.catchUp.database = try await readable(feed, identity) }
            for ((index, _), result) in zip(allowed, saved.results) { results[index] = result }
            // What was refused (not a version that lost to a newer one), for the console.
            for (index, result) in results.enumerated() {
                if case .failure(let error)? = result, error.code != .serverRecordChanged {
                    refusals.note(identity: identity, record: allowed.first { $0.0 == index }?.1 ?? (try? body.records[index].decoded()), error: error)
                }
            }
            let outcomes = zip(results, body.records).map { result, sent in
                Wire.Outcome(result ?? .failure(RecordZoneError(.internalError, "no result")), sent: sent.bytes)
            }
            return wire(Wire.Outcomes(results: outcomes, catchUp: saved.catchUp.isEmpty ? nil : saved.catchUp), for: request)
        case .fetch:
            try refuseOverTheBatchLimit(request.body, "IDs")
            let body = try decode(Wire.Fetch.self, request, canonical: true)
            guard body.ids.count <= Record.maximumBatchSize else {
                throw APIError(.limitExceeded, "a request holds at most \(Record.maximumBatchSize) IDs")
            }
            var outcomes = [Wire.Outcome?](repeating: nil, count: body.ids.count)
            var readable = [(Int, RecordID)]()
            for (index, id) in body.ids.enumerated() {
                guard let recordID = try? RecordID(zone: id.zone, name: id.name) else {
                    outcomes[index] = Wire.Outcome(.failure(RecordZoneError(.invalidArguments, "invalid record ID \(id.zone)/\(id.name)")))
                    continue
                }
                guard access.canRead(zone: recordID.zone, as: identity) else {
                    outcomes[index] = Wire.Outcome(.failure(RecordZoneError(.notAuthorized, "'\(identity)' may not read \(recordID.zone)", recordID: recordID)))
                    continue
                }
                readable.append((index, recordID))
            }
            let versions = try await readableVersions(of: Array(Set(readable.map(\.1.zone))), identity)
            for ((index, id), result) in zip(readable, try await storage.stored(readable.map(\.1))) {
                switch result {
                case .success(let signed):
                    if let versions = versions[id.zone] {
                        // A governed zone: only versions this reader may read (decoded to tell their type and clock).
                        guard let versions, let record = try? signed.decoded(), versions.allows(record.recordType, record.clock) else {
                            outcomes[index] = Wire.Outcome(.failure(RecordZoneError(.notAuthorized, "'\(identity)' may not read \(id)", recordID: id)))
                            continue
                        }
                    }
                    outcomes[index] = Wire.Outcome(record: signed)
                case .failure(let error): outcomes[index] = Wire.Outcome(.failure(error))
                }
            }
            return wire(Wire.Outcomes(results: outcomes.map { $0 ?? Wire.Outcome(.failure(RecordZoneError(.internalError, "no result"))) }), for: request)
        case .query:
            let (zone, versions) = try await readableZone(matched, identity)
            let body = try decode(Wire.Query.self, request, canonical: true)
            let cursor = try body.cursor.map { text throws(APIError) -> QueryCursor in
                guard let data = Data(base64Encoded: text) else { throw APIError(.invalidArguments, "cursor is not base64") }
                return QueryCursor(data: data)
            }
            let result = try await storage.query(RecordQuery(zone: zone, recordType: body.recordType, predicates: body.predicates ?? [], sort: body.sort ?? []),
                                                 cursor: cursor, limit: try Self.pageLimit(body.limit, default: 100))
            let records = result.records.filter { versions?.allows($0.recordType, $0.clock) ?? true }.compactMap { try? Wire.SignedRecord($0) }
            return wire(Wire.QueryResults(records: records, cursor: result.cursor?.data.base64EncodedString()), for: request)
        case .putAsset:
            let expected = try assetParameter(matched, size: UInt64(request.body.count))
            let reference = try await putAsset(request.body, expected: expected)
            return .json(Wire.Asset(reference), status: 201)
        case .getAsset:
            guard let size = try intParameter(request, "size"), size >= 0 else {
                throw APIError(.invalidArguments, "size is required")
            }
            let data = try await storage.asset(try assetParameter(matched, size: UInt64(size)))
            return HTTPResponse(status: 200, headers: [("Content-Type", "application/octet-stream")], body: data)
        case .publicRecord:
            // Unauthenticated: only what the access policy makes public, the same 404 for a
            // record that is not public as for one not held (no probing of other zones).
            guard let name = matched.parameters["name"], let id = try? RecordID(zone: try zoneParameter(matched), name: name), access.isPublic(id),
                  case .success(let signed)? = try await storage.stored([id]).first
            else { throw APIError(.unknownItem, "no public record there") }
            return .json(Wire.Outcome(record: signed))
        }
    }

    /// Stores an upload; bytes that do not match their path are the client's fault (400).
    private func putAsset(_ body: Data, expected: AssetReference) async throws -> AssetReference {
        do {
            return try await storage.putAsset(body, expected: expected)
        } catch {
            if error.code == .assetCorrupt { throw APIError(error, status: 400) }
            throw error
        }
    }

    /// Refuses a body over 400 entries before decoding any: a binary body by its declared
    /// count, a JSON one by a scan that stops past the limit (one object per entry, one for the
    /// body).
    /// (Also run on a body's first bytes while the rest is on its way.)
    func refuseOverTheBatchLimit(_ body: Data, _ what: String) throws(APIError) {
        let limit = "a request holds at most \(Record.maximumBatchSize) \(what)"
        if let declared = Wire.declaredRecordCount(body) {
            guard declared <= Record.maximumBatchSize else { throw APIError(.limitExceeded, "\(limit), got \(declared)") }
        } else if Wire.jsonObjectCountExceeds(body, Record.maximumBatchSize + 1) {
            throw APIError(.limitExceeded, limit)
        }
    }

    /// A record of an identity the server holds no key for yet, sent by someone else: a server
    /// learns an identity's key only from that identity's own signed requests (or its first own
    /// record), never from a record another participant signed and sent (which would let alice
    /// bind her key to dora before dora ever connects). Replicators copy what others signed,
    /// and may.
    private func refusalOfAnUnknownOwner(_ record: Record, as identity: String) -> RecordZoneError? {
        guard configuration.replicators[identity] == nil, case .success(let owner)? = storage.policy.rules.owner(of: record),
            owner != identity, storage.policy.pins.chain(for: owner) == nil
        else { return nil }
        return RecordZoneError(.notAuthorized, "'\(identity)' may not send the first record of '\(owner)': the server learns '\(owner)''s key only from '\(owner)'",
                               recordID: record.id)
    }

    /// What only a server can refuse, by its own clock rather than the record's: a device
    /// certificate whose link code has expired (signed with a backdated clock).
    private func refusalByServerTime(_ record: Record) -> RecordZoneError? {
        // The skew allowed to requests applies: a code made on a machine a little behind the server is not yet expired.
        if let expires = DeviceCertificate.expiry(of: record),
            Double(expires.milliseconds) < (configuration.now().timeIntervalSince1970 - configuration.maximumClockSkew) * 1000 {
            return RecordZoneError(.notAuthorized, "the device certificate's link code expired", recordID: record.id)
        }
        return nil
    }

    // MARK: Parameters

    private func zoneParameter(_ matched: Route.Matched) throws(APIError) -> ZoneName {
        guard let text = matched.parameters["zone"], let zone = try? ZoneName(text) else {
            throw APIError(.invalidArguments, "invalid zone name")
        }
        return zone
    }

    /// The zone a read names, with the versions `identity` may read of it (nil: all), or 403.
    private func readableZone(_ matched: Route.Matched, _ identity: String) async throws -> (ZoneName, ReadableVersions?) {
        try await readableZone(try zoneParameter(matched), identity)
    }

    /// `zone`, with the versions `identity` may read of it (nil: all), or 403.
    func readableZone(_ zone: ZoneName, _ identity: String) async throws -> (ZoneName, ReadableVersions?) {
        guard access.canRead(zone: zone, as: identity) else { throw forbidden(identity, zone) }
        guard let versions = try await readableVersions(of: [zone], identity)[zone] else { return (zone, nil) }
        guard let versions else { throw forbidden(identity, zone) }
        return (zone, versions)
    }

    /// A zone `identity` takes part in now, for typing: one it may read, and in a governed zone
    /// (a group) one whose present it may read (a member now, not one removed).
    private func typingZone(_ matched: Route.Matched, _ identity: String) async throws -> ZoneName {
        try await takingPartNow(try zoneParameter(matched), identity)
    }

    @discardableResult
    func takingPartNow(_ zone: ZoneName, _ identity: String) async throws -> ZoneName {
        let (zone, versions) = try await readableZone(zone, identity)
        guard versions.map({ $0.allows("", serverClock) }) ?? true else { throw forbidden(identity, zone) }
        return zone
    }

    /// The `of` argument of a presence request: 1–256 distinct identities, comma-separated.
    private func presenceIdentities(_ request: HTTPRequest) throws(APIError) -> [String] {
        guard let text = request.queryValue("of"), !text.isEmpty else { throw APIError(.invalidArguments, "of names the identities asked about, comma-separated") }
        guard let identities = PresenceBoard.ask(text.split(separator: ",", omittingEmptySubsequences: false).map(String.init)) else {
            throw APIError(.invalidArguments, "of names 1–\(PresenceBoard.maximumAsked) identities, none empty")
        }
        return identities
    }

    /// A long poll's `since`: a version as answered.
    private func versionParameter(_ request: HTTPRequest) throws(APIError) -> UInt64? {
        try request.queryValue("since").map { text throws(APIError) -> UInt64 in
            guard let version = UInt64(text) else { throw APIError(.invalidArguments, "since takes a version as answered (decimal digits)") }
            return version
        }
    }

    /// Those of `identities` who take part in `zone` now: who may read it, and in a governed
    /// zone (a group) read its present — as ``typingZone(_:_:)`` decides for the caller.
    func takingPart(_ identities: [String], in zone: ZoneName) async throws(RecordZoneError) -> [String] {
        let readers = identities.filter { access.canRead(zone: zone, as: $0) }
        guard let governance = access.governance, governance.governsReads(of: zone), !readers.isEmpty else { return readers }
        guard let state = try await storage.governed([zone], by: governance)[zone] else { return [] }
        let now = serverClock
        return readers.filter { state.readable(by: $0)?.allows("", now) == true }
    }

    /// Now, as a record clock, by the server's clock (the one requests are authenticated against).
    private var serverClock: RecordClock {
        RecordClock(milliseconds: UInt64(max(0, configuration.now().timeIntervalSince1970 * 1000)), counter: 0)
    }

    /// For each governed zone among `zones` that exists, the versions `identity` may read of it
    /// (nil: none), as its governing records stand (``ZoneGovernance``); other zones are left
    /// out. A replicator reads everything.
    private func readableVersions(of zones: [ZoneName], _ identity: String) async throws(RecordZoneError) -> [ZoneName: ReadableVersions?] {
        guard let governance = access.governance, !isReplicator(identity) else { return [:] }
        let governed = zones.filter(governance.governsReads(of:))
        guard !governed.isEmpty else { return [:] }
        return try await storage.governed(governed, by: governance).mapValues { $0.readable(by: identity) }
    }

    /// `zones` without the governed ones `identity` may not read at all (a replicator reads all).
    private func readable(_ zones: [ZoneName], _ identity: String) async throws(RecordZoneError) -> [ZoneName] {
        guard !isReplicator(identity) else { return zones }
        let versions = try await readableVersions(of: zones, identity)
        return zones.filter { zone in versions[zone].map { $0 != nil } ?? (access.governance?.governsReads(of: zone) != true) }
    }

    /// A database feed without the governed zones `identity` may not read at all.
    private func readable(_ changes: DatabaseChanges, _ identity: String) async throws(RecordZoneError) -> DatabaseChanges {
        DatabaseChanges(changedZones: try await readable(changes.changedZones, identity), deletedZones: try await readable(changes.deletedZones, identity),
                        token: changes.token)
    }

    private func isReplicator(_ identity: String) -> Bool { configuration.replicators[identity] != nil }

    private func forbidden(_ identity: String, _ zone: ZoneName) -> APIError {
        APIError(.notAuthorized, "'\(identity)' may not use zone '\(zone)'")
    }

    private func tokenParameter(_ request: HTTPRequest) throws(APIError) -> ChangeToken? {
        guard let text = request.queryValue("token"), !text.isEmpty else { return nil }
        guard let token = ChangeToken(base64: text) else { throw APIError(.invalidArguments, "token is not base64") }
        return token
    }

    /// A page's `limit`: 1…1000 as the OpenAPI document declares, refused otherwise (never
    /// silently clamped).
    static func pageLimit(_ limit: Int?, default value: Int) throws(APIError) -> Int {
        guard let limit else { return value }
        guard (1...BackendLimits.maximumPageSize).contains(limit) else {
            throw APIError(.invalidArguments, "limit must be 1…\(BackendLimits.maximumPageSize), got \(limit)")
        }
        return limit
    }

    private func intParameter(_ request: HTTPRequest, _ name: String) throws(APIError) -> Int? {
        guard let text = request.queryValue(name) else { return nil }
        guard let value = Int(text) else { throw APIError(.invalidArguments, "\(name) must be an integer") }
        return value
    }

    private func assetParameter(_ matched: Route.Matched, size: UInt64) throws(APIError) -> AssetReference {
        guard let hex = matched.parameters["sha256"], hex.count == 64, let hash = Data(hexString: hex), let reference = try? AssetReference(hash: hash, size: size) else {
            throw APIError(.invalidArguments, "the asset path needs a SHA-256 in hex")
        }
        return reference
    }

    /// Decodes a request body in the form its `Content-Type` names (``Wire``).
    /// - Parameter canonical: a JSON body must be canonical (``Wire/decodeCanonical(_:from:)``):
    ///   where records are signed, no two readers may see different records in one body.
    private func decode<T: Codable>(_ type: T.Type, _ request: HTTPRequest, canonical: Bool = false) throws(APIError) -> T {
        let binary = request.headers["content-type"]?.lowercased().hasPrefix(Wire.recordsType) ?? false
        do {
            if canonical { return try Wire.decodeCanonical(type, from: request.body, binary: binary) }
            return try Wire.decode(type, from: request.body, binary: binary)
        } catch let error as Wire.NonCanonicalJSON {
            throw APIError(.malformed, error.description)
        } catch {
            throw APIError(.malformed, "malformed \(binary ? "binary" : "JSON") body: \(Record.describe(error))")
        }
    }

    /// A body that carries records, in the binary form when the request's `Accept` asks for it.
    private func wire<T: Encodable>(_ value: T, for request: HTTPRequest) -> HTTPResponse {
        let binary = request.headers["accept"]?.lowercased().contains(Wire.recordsType) ?? false
        guard let body = try? Wire.encode(value, binary: binary) else { return APIError(.internalError, "cannot encode the response").response }
        return HTTPResponse(status: 200, headers: [("Content-Type", binary ? Wire.recordsType : Wire.jsonType)], body: body)
    }
}
