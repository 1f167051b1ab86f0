import ConversationKit
import Foundation
@testable import RecordZone
import StorageTestSupport
import Synchronization
import Testing
import TestSupport
@testable import ZoneServer

extension Result where Failure == RecordZoneError {
    var failureCode: RecordZoneError.Code? {
        if case .failure(let error) = self { return error.code }
        return nil
    }
}

@Suite struct ZoneServerTests {

    /// A replay that reaches the server a minute later by its clock (still within the skew) is
    /// refused: the nonce is kept under the request's signed time, which the replay carries, not
    /// under the server's minute (a full run once answered such a replay 200).
    @Test func aReplayAcrossAMinuteOfTheServersClockIsRefused() async throws {
        let clock = Mutex(Date(timeIntervalSince1970: 1_800_000_059.5))
        let fixture = try ServerFixture { $0.now = { clock.withLock { $0 } } }
        let signedAt = clock.withLock { $0 }, nonce = Sodium.randomBytes(16)
        let first = try await fixture.signed("GET", "/v1/zones", identity: "alice", key: Keys.alice, now: signedAt, nonce: nonce)
        #expect(first.status == 200)
        clock.withLock { $0 = $0.addingTimeInterval(1) }
        let replayed = try await fixture.signed("GET", "/v1/zones", identity: "alice", key: Keys.alice, now: signedAt, nonce: nonce)
        #expect(replayed.status == 401 && replayed.errorCode == "notAuthenticated", "\(replayed.status) \(replayed.text)")
    }

    @Test func everyAuthenticationFailureIs401() async throws {
        let fixture = try ServerFixture()
        let ok = try await fixture.signed("GET", "/v1/zones", identity: "alice", key: Keys.alice)
        #expect(ok.status == 200)
        let missing = try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/v1/zones")
        let malformed = try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/v1/zones", headers: ["Authorization": "ConvKit-Ed25519 id=nope"])
        let badSignature = try await fixture.signed("POST", "/v1/records/fetch", body: Data(#"{"ids":[]}"#.utf8), identity: "alice", key: Keys.alice,
                                              signedBody: Data(#"{"ids":[{"zone":"x","name":"y"}]}"#.utf8))
        let stale = try await fixture.signed("GET", "/v1/zones", identity: "alice", key: Keys.alice, now: Date().addingTimeInterval(-600))
        let future = try await fixture.signed("GET", "/v1/zones", identity: "alice", key: Keys.alice, now: Date().addingTimeInterval(600))
        let nonce = Sodium.randomBytes(16), now = Date()
        let first = try await fixture.signed("GET", "/v1/zones", identity: "alice", key: Keys.alice, now: now, nonce: nonce)
        let replayed = try await fixture.signed("GET", "/v1/zones", identity: "alice", key: Keys.alice, now: now, nonce: nonce)
        let impostor = try await fixture.signed("GET", "/v1/zones", identity: "alice", key: Keys.mallory)
        #expect(first.status == 200)
        for (name, response) in [("missing", missing), ("malformed", malformed), ("bad signature", badSignature), ("stale", stale),
                                 ("future", future), ("replayed", replayed), ("impostor", impostor)] {
            #expect(response.status == 401, "\(name): \(response.status) \(response.text)")
            #expect(response.errorCode == "notAuthenticated", "\(name)")
        }
        // The query is signed too: changing it breaks the signature.
        let authorization = RequestSignature.authorization(method: "GET", path: "/v1/changes", query: [("token", "a")], body: Data(),
                                                           identity: "alice", key: Keys.alice, now: Date())
        let tampered = try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/v1/changes?token=b", headers: ["Authorization": authorization])
        #expect(tampered.status == 401)
        // So is the identity: alice's request relabelled as an unclaimed identity is refused and binds nothing.
        let signedAsAlice = RequestSignature.authorization(method: "GET", path: "/v1/zones", query: [], body: Data(), identity: "alice", key: Keys.alice, now: Date())
        let relabelled = signedAsAlice.replacingOccurrences(of: "id=" + Data("alice".utf8).base64EncodedString(), with: "id=" + Data("dave".utf8).base64EncodedString())
        #expect(relabelled != signedAsAlice)
        let asDave = try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/v1/zones", headers: ["Authorization": relabelled])
        #expect(asDave.status == 401 && asDave.errorCode == "notAuthenticated")
        #expect(fixture.server.storage.policy.pins.chain(for: "dave") == nil)
        #expect(try await fixture.signed("GET", "/v1/zones", identity: "dave", key: Keys.key(44)).status == 200)
    }

    /// A server restarted after alice rotated her key still serves, and still accepts, what her
    /// old key signed before the rotation — and nothing it signs after.
    @Test func aRestartAfterAKeyRotationKeepsTheWholeChain() async throws {
        let directory = try TemporaryDirectory("rotation")
        let zone = try conversationZone("alice", "bob")
        let speakers = try ZoneName("s-" + OwnershipRule.identityHash("alice"))  // alice's own zone
        let newKey = Keys.key(77)
        let clock = HybridLogicalClock()
        func aliceSays(_ name: String, key: SigningKey, at stamp: RecordClock) throws -> Record {
            var record = try message(zone, name, from: "alice", to: "bob", key: key)
            try record.sign(with: key, clock: stamp)
            return record
        }
        let beforeRotation = clock.now()
        let rotation = try KeyRotation.record(identity: "alice", zone: speakers, from: Keys.alice, to: newKey, clock: clock.now())
        let first = try ServerFixture(directory: directory)
        let alice = first.client("alice", key: Keys.alice)
        try await alice.createZone(zone)
        try await alice.createZone(speakers)
        _ = try await alice.save([try aliceSays("old", key: Keys.alice, at: beforeRotation)]).map { try $0.get() }
        _ = try await alice.save([rotation]).map { try $0.get() }
        await first.server.stop()

        let second = try ServerFixture(directory: directory)
        let rotated = second.client("alice", key: newKey)
        #expect(try await rotated.fetch([try RecordID(zone: zone, name: "m.\(OwnershipRule.identityHash("alice")).old")]).map { try $0.get().authorKey } == [Keys.alice.publicKey])
        #expect(try await rotated.fetchChanges(in: zone, since: nil, limit: 10).records.count == 1)
        let late = try await rotated.save([try aliceSays("backfilled", key: Keys.alice, at: beforeRotation), try aliceSays("late", key: Keys.alice, at: clock.now()),
                                           try aliceSays("new", key: newKey, at: clock.now())])
        #expect((try? late[0].get()) != nil, "the old key signed before the rotation")
        #expect(late[1].failureCode == .notAuthorized, "the old key after the rotation")
        #expect((try? late[2].get()) != nil)
        // Requests move to the new key with the pin.
        #expect(try await second.signed("GET", "/v1/zones", identity: "alice", key: Keys.alice).status == 401)
    }

    /// A linked device's first request carries its certificate: the server binds the device key
    /// through alice's chain (persisted: a restart keeps it). An expired code, a certificate for
    /// another key, or one signed by a key that is not alice's get 401; so does a revoked device.
    @Test func aDeviceIsBoundThroughItsCertificate() async throws {
        let directory = try TemporaryDirectory("devices")
        let own = try ZoneName("s-" + OwnershipRule.identityHash("alice"))
        let laptop = Keys.key(31)
        let now = Date()
        func certificate(_ device: SigningKey, by key: SigningKey = Keys.alice, expiresIn seconds: Double = 600) throws -> Data {
            let expires = RecordClock(milliseconds: UInt64((now.timeIntervalSince1970 + seconds) * 1000), counter: 0)
            let code = LinkCode.issue(identity: "alice", identityKey: key, expires: expires)
            return try DeviceCertificate.record(code: code, device: device, label: "laptop", zone: own,
                                                clock: RecordClock(milliseconds: UInt64((now.timeIntervalSince1970 + min(0, seconds) - 1) * 1000), counter: 0)).encoded()
        }
        let first = try ServerFixture(directory: directory)
        try await first.client("alice", key: Keys.alice).createZone(own)
        #expect(try await first.signed("GET", "/v1/zones", identity: "alice", key: laptop).status == 401)
        // Expired by more than the clock skew the server tolerates (a code a little behind is taken).
        let expired = try await first.signed("GET", "/v1/zones", identity: "alice", key: laptop,
                                             device: try certificate(laptop, expiresIn: -(RequestSignature.maximumClockSkew + 5)))
        #expect(expired.status == 401 && expired.text.contains("expired"))
        #expect(try await first.signed("GET", "/v1/zones", identity: "alice", key: laptop, device: try certificate(Keys.key(32))).status == 401)
        #expect(try await first.signed("GET", "/v1/zones", identity: "alice", key: laptop, device: try certificate(laptop, by: Keys.mallory)).status == 401)
        #expect(try await first.signed("GET", "/v1/zones", identity: "alice", key: laptop, device: try certificate(laptop)).status == 200)
        await first.server.stop()

        let second = try ServerFixture(directory: directory)
        #expect(try await second.signed("GET", "/v1/zones", identity: "alice", key: laptop).status == 200, "bound before the restart")
        let revocation = try DeviceRevocation.record(identity: "alice", device: laptop.publicKey, revokedAfter: HybridLogicalClock().now(), zone: own,
                                                     identityKey: Keys.alice, clock: HybridLogicalClock().now())
        _ = try await second.client("alice", key: Keys.alice).save([revocation]).map { try $0.get() }
        #expect(try await second.signed("GET", "/v1/zones", identity: "alice", key: laptop).status == 401)
    }

    @Test func anOutsiderGets403OnAConversationZone() async throws {
        let fixture = try ServerFixture()
        let zone = try conversationZone("alice", "bob")
        let alice = fixture.client("alice", key: Keys.alice)
        try await alice.createZone(zone)
        try await alice.save([try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice)]).forEach { _ = try $0.get() }
        let carol = fixture.client("carol", key: Keys.carol)
        let read = try await fixture.signed("GET", "/v1/zones/\(zone)/changes", identity: "carol", key: Keys.carol)
        #expect(read.status == 403 && read.errorCode == "notAuthorized")
        await #expect { try await carol.fetchChanges(in: zone, since: nil, limit: 10) } throws: { ($0 as? RecordZoneError)?.code == .notAuthorized }
        let written = try await carol.save([try message(zone, "m2", from: "carol", to: "bob", key: Keys.carol)])
        guard case .failure(let error) = written[0] else { Issue.record("an outsider wrote into the conversation"); return }
        #expect(error.code == .notAuthorized)
        // The change feed does not even name the zone to an outsider; the participants see it.
        #expect(try await carol.fetchDatabaseChanges(since: nil).changedZones.isEmpty)
        #expect(try await fixture.client("bob", key: Keys.bob).fetchDatabaseChanges(since: nil).changedZones == [zone])
        #expect(try await fixture.client("bob", key: Keys.bob).fetchChanges(in: zone, since: nil, limit: 10).records.count == 1)
        // Everyone reads the speakers zone; each writes only their own profile.
        let speakers = try ZoneName("speakers")
        try await carol.createZone(speakers)
        var profile = Record(id: try RecordID(zone: speakers, name: "alice"), type: "Speaker", fields: ["name": .string("Not Alice")])
        try profile.sign(with: Keys.carol, clock: HybridLogicalClock().now())
        guard case .failure(let profileError) = try await carol.save([profile])[0] else { Issue.record("carol wrote alice's profile"); return }
        #expect(profileError.code == .notAuthorized)
        #expect(try await carol.fetchChanges(in: speakers, since: nil, limit: 10).records.isEmpty)
        // Nobody deletes the directory; only participants delete a conversation.
        await #expect { try await carol.deleteZone(speakers) } throws: { ($0 as? RecordZoneError)?.code == .notAuthorized }
        await #expect { try await carol.deleteZone(zone) } throws: { ($0 as? RecordZoneError)?.code == .notAuthorized }
        await #expect { try await carol.createZone(try conversationZone("alice", "dave")) } throws: { ($0 as? RecordZoneError)?.code == .notAuthorized }
        #expect(try await alice.zones().contains(zone))
    }

    @Test func aForgedRecordIsRefusedWithItsReason() async throws {
        let fixture = try ServerFixture()
        let zone = try conversationZone("alice", "bob")
        let alice = fixture.client("alice", key: Keys.alice)
        try await alice.createZone(zone)
        var altered = try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice)
        altered["content"] = .string("altered after signing")
        let wrongOwner = try message(zone, "m2", from: "bob", to: "alice", key: Keys.alice)  // alice signs as bob
        _ = try await fixture.client("bob", key: Keys.bob).save([try message(zone, "m0", from: "bob", to: "alice", key: Keys.bob)])
        let body = try Wire.encode(try Wire.Modify(records: [altered, wrongOwner], policy: .merge), binary: false)  // canonical JSON
        let response = try await fixture.signed("POST", "/v1/records/modify", body: body, identity: "alice", key: Keys.alice)
        #expect(response.status == 200)
        let outcomes = try JSONDecoder().decode(Wire.Outcomes.self, from: response.body)
        #expect(outcomes.results.map { $0.error?.code } == ["invalidSignature", "notAuthorized"])
        #expect(outcomes.results[1].error?.message.contains("bob") == true)
        #expect(try await alice.fetch([altered.id, wrongOwner.id]).allSatisfy { (try? $0.get()) == nil })
    }

    @Test func anOversizedBodyIs413AndTheServerKeepsServing() async throws {
        let fixture = try ServerFixture { $0.limits.maximumBodyBytes = 64 * 1024 }
        let big = Data(repeating: UInt8(ascii: "x"), count: 200 * 1024)
        let response = try await fixture.signed("POST", "/v1/records/modify", body: big, identity: "alice", key: Keys.alice)
        #expect(response.status == 413 && response.errorCode == "limitExceeded")
        // Without a Content-Length (chunked), the limit holds too (for a request whose headers
        // pass: one without them is refused before its body, by HardeningTests).
        let authorization = RequestSignature.authorization(method: "POST", path: "/v1/records/modify", query: [], body: Data(),
                                                           identity: "alice", key: Keys.alice, now: Date())
        let connection = try RawConnection(port: fixture.port)
        connection.write("POST /v1/records/modify HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: \(authorization)\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in 0..<5 { connection.write(String(format: "%x\r\n", 20000) + String(repeating: "y", count: 20000) + "\r\n") }
        connection.write("0\r\n\r\n")
        let chunked = RawResponse(await connection.readUntilClosedOffPool().data)
        #expect(chunked.status == 413)
        let id = try RecordID(zone: "z", name: "n")
        let tooMany = try JSONEncoder().encode(Wire.Fetch(ids: (0...400).map { _ in Wire.ID(id) }))
        let batch = try await ServerFixture().signed("POST", "/v1/records/fetch", body: tooMany, identity: "alice", key: Keys.alice)
        #expect(batch.status == 413)
        #expect(try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/healthz").status == 200)
    }

    @Test func garbageGetsA4xxWithAJSONErrorAndTheServerKeepsServing() async throws {
        let fixture = try ServerFixture()
        let bodies: [(String, Data)] = [
            ("malformed JSON", Data("{\"records\": [".utf8)),
            ("wrong types", Data(#"{"records": "many"}"#.utf8)),
            ("huge number", Data(#"{"records":[{"zone":"z","name":"n","type":"T","clock":1e400}]}"#.utf8)),
            ("integer overflow", Data(#"{"records":[{"zone":"z","name":"n","type":"T","clock":99999999999999999999999}]}"#.utf8)),
            ("bad UTF-8", Data([0x7B, 0x22, 0xFF, 0xFE, 0x22, 0x3A, 0x31, 0x7D])),
            ("not JSON at all", Data((0..<512).map { UInt8(truncatingIfNeeded: $0 &* 7) })),
            ("empty", Data()),
        ]
        for (name, body) in bodies {
            let response = try await fixture.signed("POST", "/v1/records/modify", body: body, identity: "alice", key: Keys.alice)
            #expect(response.status == 400, "\(name): \(response.status)")
            #expect(response.errorCode == "malformed", "\(name): \(response.text)")
        }
        // The binary form: lying counts and lengths, a wrong magic, an index past the table.
        func table(_ count: UInt32, _ records: [Data], _ json: String, magic: [UInt8] = [0x43, 0x4B, 0x57, 0x01]) -> Data {
            var body = Data(magic) + withUnsafeBytes(of: count.bigEndian) { Data($0) }
            for record in records { body += withUnsafeBytes(of: UInt32(record.count).bigEndian) { Data($0) } + record }
            return body + Data(json.utf8)
        }
        let binaryBodies: [(String, Data)] = [
            ("a count beyond the body", table(300, [], "{}")),  // (over 400 is a 413: HardeningTests)
            ("a length beyond the body", Data([0x43, 0x4B, 0x57, 0x01, 0, 0, 0, 1, 0x7F, 0xFF, 0xFF, 0xFF, 1, 2, 3])),
            ("a wrong magic", table(0, [], #"{"records":[]}"#, magic: [0x43, 0x4B, 0x57, 0x09])),
            ("an index past the table", table(1, [Data("x".utf8)], #"{"records":[{"i":5}]}"#)),
            ("a truncated table", Data([0x43, 0x4B, 0x57])),
        ]
        for (name, body) in binaryBodies {
            let response = try await fixture.signed("POST", "/v1/records/modify", body: body, identity: "alice", key: Keys.alice, contentType: Wire.recordsType)
            #expect(response.status == 400 && response.errorCode == "malformed", "\(name): \(response.status) \(response.text)")
        }
        // A well-formed table whose record is not a canonical record: refused for that record alone.
        let junk = try await fixture.signed("POST", "/v1/records/modify", body: table(1, [Data("junk".utf8)], #"{"records":[{"i":0}]}"#),
                                            identity: "alice", key: Keys.alice, contentType: Wire.recordsType)
        #expect(junk.status == 200 && junk.text.contains("malformed"), "\(junk.text)")
        let unknown = try await fixture.signed("GET", "/v1/nothing/here", identity: "alice", key: Keys.alice)
        #expect(unknown.status == 404 && unknown.errorCode == "routeNotFound")
        let wrongMethod = try await fixture.signed("PATCH", "/v1/zones", identity: "alice", key: Keys.alice)
        #expect(wrongMethod.status == 405 && wrongMethod.errorCode == "methodNotAllowed")
        let badZone = try await fixture.signed("GET", "/v1/zones/..%2F..%2Fetc/changes", identity: "alice", key: Keys.alice)
        #expect((400..<500).contains(badZone.status))
        let badToken = try await fixture.signed("GET", "/v1/changes", query: [("token", "!!!")], identity: "alice", key: Keys.alice)
        #expect(badToken.status == 400)
        // Not HTTP at all.
        let noise = try await RawConnection.exchange(port: fixture.port, Data("\u{1}\u{2}garbage\r\n\r\n".utf8))
        #expect(noise.status == 0 || (400..<500).contains(noise.status))
        #expect(try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/healthz").status == 200)
    }

    /// Random bodies, mutated valid bodies and raw noise at every route: each gets an answer
    /// below 500, and the server serves normally afterwards.
    @Test func randomGarbageAtEveryRouteNeverBreaksTheServer() async throws {
        let fixture = try ServerFixture(access: OpenZoneAccess(), policy: RecordPolicy()) { $0.limits.connectionTimeoutSeconds = 1 }
        let client = fixture.client("alice", key: Keys.alice)
        let zone = try ZoneName("fuzz")
        try await client.createZone(zone)
        var valid = Record(id: try RecordID(zone: zone, name: "r"), type: "Item", fields: ["n": .int(1)])
        try valid.sign(with: Keys.alice, clock: HybridLogicalClock().now())
        let seeds = [try JSONEncoder().encode(Wire.Modify(records: [valid], policy: .merge)),
                     try JSONEncoder().encode(Wire.Fetch(ids: [Wire.ID(valid.id)])),
                     Data(#"{"recordType":"Item","predicates":[{"range":{"field":"n","lower":{"int":"0"}}}],"sort":[{"field":"n","ascending":true}],"limit":5}"#.utf8)]
        var rng = SeededRandom(seed: 42)
        let routes = ["/v1/records/modify", "/v1/records/fetch", "/v1/zones/fuzz/query"]
        for round in 0..<90 {
            let path = routes[round % routes.count]
            var body = seeds[round % seeds.count]
            switch round % 3 {
            case 0:  // flip, drop or insert a few bytes
                for _ in 0..<Int.random(in: 1...4, using: &rng) where !body.isEmpty {
                    let at = Int.random(in: 0..<body.count, using: &rng)
                    switch Int.random(in: 0..<3, using: &rng) {
                    case 0: body[at] ^= UInt8.random(in: 1...255, using: &rng)
                    case 1: body.remove(at: at)
                    default: body.insert(UInt8.random(in: 0...255, using: &rng), at: at)
                    }
                }
            case 1: body = Data((0..<Int.random(in: 0...300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
            default: body = body.prefix(Int.random(in: 0...body.count, using: &rng))
            }
            let response = try await fixture.signed("POST", path, body: body, identity: "alice", key: Keys.alice)
            #expect((200..<500).contains(response.status), "round \(round) \(path): \(response.status)")
            #expect(response.status == 200 || response.errorCode != nil, "round \(round): an error without a JSON error body")
        }
        for _ in 0..<20 {
            let noise = Data((0..<Int.random(in: 1...200, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
            _ = try await RawConnection.exchange(port: fixture.port, noise + Data("\r\n\r\n".utf8))
        }
        #expect(try await client.fetch([valid.id]).count == 1)
        #expect(try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/healthz").status == 200)
    }

    @Test func aSlowClientTimesOutWhileOthersAreServed() async throws {
        let fixture = try ServerFixture { $0.limits.connectionTimeoutSeconds = 1 }
        let slow = try RawConnection(port: fixture.port)
        slow.write("GET /healthz HTTP/1.1\r\nHost: x\r\n")  // and then nothing more
        // Others are answered while the slow one holds its connection open.
        for _ in 0..<20 {
            #expect(try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/healthz").status == 200)
        }
        // The server, not our 30 s receive timeout, closes the idle connection, without an answer.
        let (answer, closedByPeer) = await slow.readUntilClosedOffPool()
        #expect(closedByPeer)
        #expect(RawResponse(answer).status != 200)
    }

    @Test func fiftyConcurrentClientsWritingAndLongPollingAllSeeEveryChange() async throws {
        let fixture = try ServerFixture(access: OpenZoneAccess(), policy: RecordPolicy())
        let zone = try ZoneName("busy")
        let admin = fixture.client("admin", key: Keys.key(200))
        try await admin.createZone(zone)
        let clients = 50, perClient = 4
        let seen = try await withThrowingTaskGroup(of: Set<String>.self) { group in
            for index in 0..<clients {
                let client = HTTPBackend(url: fixture.url, identity: "client\(index)", key: Keys.key(UInt8(100 + index)), policy: RecordPolicy())
                group.addTask {
                    // Write this client's records, then long-poll until everyone's are in.
                    let records = try (0..<perClient).map { n -> Record in
                        var record = Record(id: try RecordID(zone: zone, name: "c\(index)-\(n)"), type: "Item", fields: ["n": .int(Int64(n))])
                        try record.sign(with: Keys.key(UInt8(100 + index)), clock: HybridLogicalClock().now())
                        return record
                    }
                    _ = try await client.save(records).map { try $0.get() }
                    var names = Set<String>(), token: ChangeToken? = nil
                    let deadline = ContinuousClock.now.advanced(by: .seconds(60))
                    while names.count < clients * perClient, ContinuousClock.now < deadline {
                        let page = try await client.fetchChanges(in: zone, since: token, limit: 100)
                        names.formUnion(page.records.map(\.id.name))
                        token = page.token
                        if !page.moreComing, names.count < clients * perClient {
                            _ = try await client.waitForChanges(in: zone, since: token, timeout: .seconds(10))
                        }
                    }
                    return names
                }
            }
            var all = [Set<String>]()
            for try await names in group { all.append(names) }
            return all
        }
        #expect(seen.count == clients)
        let expected = Set((0..<clients).flatMap { c in (0..<perClient).map { "c\(c)-\($0)" } })
        #expect(seen.allSatisfy { $0 == expected })
    }

    @Test func rateLimitedRequestsGet429WithRetryAfter() async throws {
        let frozen = Date()  // the server's clock stands still: no tokens come back between requests
        let fixture = try ServerFixture {
            $0.requestsPerSecond = 0.5
            $0.burst = 2
            $0.now = { frozen }
        }
        var statuses = [RawResponse]()
        for _ in 0..<4 { statuses.append(try await fixture.signed("GET", "/v1/zones", identity: "alice", key: Keys.alice)) }
        #expect(statuses.prefix(2).allSatisfy { $0.status == 200 })
        let limited = try #require(statuses.last)
        #expect(limited.status == 429 && limited.errorCode == "requestRateLimited")
        #expect(Int(limited.headers["retry-after"] ?? "") ?? 0 >= 1)
        // Another key has its own budget.
        #expect(try await fixture.signed("GET", "/v1/zones", identity: "bob", key: Keys.bob).status == 200)
    }

    @Test func healthAndMetricsDescribeTheServer() async throws {
        let fixture = try ServerFixture(access: OpenZoneAccess(), policy: RecordPolicy())
        let client = fixture.client("alice", key: Keys.alice)
        let zone = try ZoneName("metered")
        try await client.createZone(zone)
        var record = Record(id: try RecordID(zone: zone, name: "r"), type: "Item")
        try record.sign(with: Keys.alice, clock: HybridLogicalClock().now())
        _ = try await client.save([record])
        async let waiting = client.waitForChanges(in: zone, since: try await client.fetchChanges(in: zone, since: nil, limit: 10).token, timeout: .seconds(5))
        for _ in 0..<500 where fixture.server.storage.waitingCount == 0 { try await Task.sleep(for: .milliseconds(10)) }
        let metrics = try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/metrics")
        #expect(metrics.status == 200 && metrics.headers["content-type"]?.hasPrefix("text/plain") == true)
        #expect(metrics.text.contains("convkitd_records_stored 1"))
        #expect(metrics.text.contains("convkitd_long_polls_waiting 1"))
        #expect(metrics.text.contains(#"convkitd_requests_total{method="POST",route="modify",status="200"} 1"#))
        #expect(metrics.text.contains("convkitd_request_duration_seconds_bucket{le=\"+Inf\"}"))
        #expect(metrics.text.contains("convkitd_errors_total 0"))
        #expect(try await waiting == false)
        let health = try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/healthz")
        #expect(health.status == 200 && health.text == #"{"status":"ok","storage":"ok"}"#)
    }

    @Test func theOpenAPIDocumentListsExactlyTheRoutesTheServerAnswers() async throws {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Sources/ZoneServer/openapi.json")
        let document = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
        #expect((document["openapi"] as? String)?.hasPrefix("3.") == true)
        let description = try #require((document["info"] as? [String: Any])?["description"] as? String)
        #expect(description.contains("canonical binary encoding") && !description.contains("Records are in their JSON form"))
        let paths = try #require(document["paths"] as? [String: [String: Any]])
        let methods: Set<String> = ["get", "put", "post", "delete", "patch", "head", "options"]
        let documented = Set(paths.flatMap { path, operations in operations.keys.filter(methods.contains).map { "\($0.uppercased()) \(path)" } })
        let served = Set(Route.allCases.map { "\($0.method) \($0.template)" })
        #expect(documented == served, "only documented: \(documented.subtracting(served)); only served: \(served.subtracting(documented))")
        // And every documented route really answers (not 404 routeNotFound).
        let fixture = try ServerFixture()
        for route in Route.allCases {
            let path = route.template.replacingOccurrences(of: "{zone}", with: "speakers")
                .replacingOccurrences(of: "{sha256}", with: String(repeating: "0", count: 64))
            let query = route == .waitForChanges ? [("timeout", "0")] : []
            let response = try await fixture.signed(route.method, path, query: query, identity: "alice", key: Keys.alice)
            #expect(response.errorCode != "routeNotFound" && response.errorCode != "methodNotAllowed", "\(route.method) \(path)")
            // Whatever it answered is a status the document lists for it.
            let operation = try #require(paths[route.template]?[route.method.lowercased()] as? [String: Any])
            let statuses = try #require(operation["responses"] as? [String: Any])
            #expect(statuses[String(response.status)] != nil, "\(route.method) \(route.template) answered an undocumented \(response.status)")
            if route.template.hasPrefix("/v1/") {
                // 401 and the per-key rate limit (429) only where a request is authenticated.
                for status in ["400", "500", "503"] + (route.isAuthenticated ? ["401", "429"] : []) {
                    #expect(statuses[status] != nil, "\(route.method) \(route.template) does not document \(status)")
                }
            }
            // 405 with Allow on every path, Retry-After with 429 and 503.
            #expect(((statuses["405"] as? [String: Any])?["headers"] as? [String: Any])?["Allow"] != nil, "\(route.method) \(route.template): 405")
            for status in ["429", "503"] where statuses[status] != nil {
                #expect(((statuses[status] as? [String: Any])?["headers"] as? [String: Any])?["Retry-After"] != nil, "\(route.method) \(route.template): \(status)")
            }
            if route == .waitForChanges || route == .zoneChanges { #expect(statuses["410"] != nil, "\(route.template): 410") }
        }
    }
}

/// The server's query index of Speaker tags answers as a scan would: changed tags and tombstones
/// leave it, and it is rebuilt when the declared fields change — on SQLite and on PostgreSQL.
@Suite struct QueryIndexTests {
    static let storages = SharedPostgres.isAvailable ? ["sqlite", "postgres"] : ["sqlite"]

    @Test(arguments: storages)
    func tagQueriesFromTheIndexMatchAScan(_ kind: String) async throws {
        let directory = try TemporaryDirectory("index")
        let database = kind == "postgres" ? try await SharedPostgres.freshDatabase() : ""
        func open(indexed: Bool) async throws -> any ZoneStorage {
            let fields = indexed ? ConversationStore.queryIndexes : [:]
            if kind == "postgres" { return try await PostgresZoneStorage(conninfo: database, poolSize: 2, policy: ConversationStore.recordPolicy(), indexedFields: fields) }
            return try SQLiteZoneStorage(directory: directory.path, policy: ConversationStore.recordPolicy(), indexedFields: fields)
        }
        let zone = try ZoneName("speakers")
        let clock = HybridLogicalClock()
        func speaker(_ name: String, _ tags: [String], key: SigningKey) throws -> Record {
            var record = Record(id: try RecordID(zone: zone, name: name), type: "Speaker", fields: ["name": .string(name), "tags": .list(tags.map { .string($0) })])
            try record.sign(with: key, clock: clock.now())
            return record
        }
        func found(_ storage: any ZoneStorage, _ tag: String) async throws -> [String] {
            try await storage.query(RecordQuery(zone: zone, recordType: "Speaker", predicates: [.contains("tags", .string(tag))]), cursor: nil, limit: 100)
                .records.map(\.id.name)
        }
        let keys = (0..<20).map { Keys.key(UInt8(100 + $0)) }
        do {
            let storage = try await open(indexed: false)  // no index yet
            try await storage.createZone(zone)
            _ = try await storage.save(try (0..<20).map { try speaker("s\($0)", $0 % 5 == 0 ? ["swift", "linux"] : ["rust"], key: keys[$0]) }, policy: .merge)
            #expect(try await found(storage, "swift") == ["s0", "s10", "s15", "s5"].sorted())
        }
        let storage = try await open(indexed: true)
        #expect(try await found(storage, "swift") == ["s0", "s10", "s15", "s5"].sorted(), "rebuilt from the stored records")
        _ = try await storage.save([try speaker("s5", ["rust"], key: keys[5]), try speaker("s3", ["swift"], key: keys[3])], policy: .merge)
        let tombstone = try storage.policy.tombstone(for: try speaker("s10", [], key: keys[10]), signedWith: keys[10], clock: clock.now())
        _ = try await storage.save([tombstone], policy: .merge)
        #expect(try await found(storage, "swift") == ["s0", "s15", "s3"])
        #expect(try await found(storage, "linux") == ["s0", "s15"])
        #expect(try await found(storage, "rust").count == 16)
        #expect(try await found(storage, "nobody").isEmpty)
    }
}

/// The libcurl client's long polls: a sub-second wait still waits, and cancelling the waiting
/// task aborts the transfer instead of holding it for the whole timeout.
@Suite struct HTTPClientTests {
    @Test func longPollsWaitAndCancel() async throws {
        let fixture = try ServerFixture()
        let alice = fixture.client("alice", key: Keys.alice)
        let zone = try conversationZone("alice", "bob")
        try await alice.createZone(zone)
        let token = try await alice.fetchChanges(in: zone, since: nil, limit: 10).token

        let start = ContinuousClock.now
        #expect(try await alice.waitForChanges(in: zone, since: token, timeout: .milliseconds(300)) == false)
        #expect(ContinuousClock.now - start >= .milliseconds(250), "a 300 ms wait returned at once")

        let waiting = Task { try await alice.waitForChanges(in: zone, since: token, timeout: .seconds(30)) }
        try await Task.sleep(for: .milliseconds(200))
        waiting.cancel()
        let outcome = await waiting.result
        guard case .failure(let error) = outcome else { Issue.record("a cancelled long poll returned \(outcome)"); return }
        #expect((error as? RecordZoneError)?.message.contains("cancelled") == true, "\(error)")
        // The server is still there for the next request on the same client.
        #expect(try await alice.zones().contains(zone))
    }
}

/// A server's data restored from an earlier copy: a reader whose token is past the restored
/// zone is told to start again (`changeTokenExpired`) rather than skipping the messages that
/// now take the numbers it had already passed — on SQLite and on PostgreSQL.
@Suite struct RestoredStorageTests {
    @Test(arguments: QueryIndexTests.storages)
    func aTokenAheadOfARestoredZoneExpiresAndNothingNewIsSkipped(_ kind: String) async throws {
        let directory = try TemporaryDirectory("restored")
        let storage: any ZoneStorage = kind == "postgres"
            ? try await PostgresZoneStorage(conninfo: try await SharedPostgres.freshDatabase(), poolSize: 2, policy: ConversationStore.recordPolicy())
            : try SQLiteZoneStorage(directory: directory.path, policy: ConversationStore.recordPolicy())
        let zone = try conversationZone("alice", "bob")
        try await storage.createZone(zone)
        func item(_ name: String) throws -> Record { try message(zone, name, from: "alice", to: "bob", key: Keys.alice, text: name) }
        _ = try await storage.save(try ["m1", "m2", "m3"].map(item))
        let read = try await storage.fetchChanges(in: zone, since: nil, limit: 100)
        #expect(read.records.count == 3)
        // The restore: the zone as it stood after m1.
        try await storage.rewind(zone, to: 1)
        // A message acknowledged after the restore takes number 2, behind the reader's token.
        _ = try await storage.save([try item("after")]).map { try $0.get() }
        await #expect { try await storage.fetchChanges(in: zone, since: read.token, limit: 100) } throws: { ($0 as? RecordZoneError)?.code == .changeTokenExpired }
        await #expect { try await storage.waitForChanges(in: zone, since: read.token, timeout: .seconds(5)) } throws: { ($0 as? RecordZoneError)?.code == .changeTokenExpired }
        let again = try await storage.fetchChanges(in: zone, since: nil, limit: 100)
        #expect(Set(again.records.map(\.id.name)) == Set(try ["m1", "after"].map { try item($0).id.name }))
        // The database feed: a position past where the database stands expires too.
        let feed = try await storage.fetchDatabaseChanges(since: nil)
        let contents = try TokenContents(feed.token, expecting: .database, backend: "server")
        let ahead = TokenContents.databaseToken(backend: "server", instance: contents.incarnation, position: Int64(SequencePosition.decode(contents.position)) + 1_000_000)
        await #expect { try await storage.fetchDatabaseChanges(since: ahead) } throws: { ($0 as? RecordZoneError)?.code == .changeTokenExpired }
        _ = try await storage.fetchDatabaseChanges(since: feed.token)
        (storage as? PostgresZoneStorage)?.close()
    }
}
