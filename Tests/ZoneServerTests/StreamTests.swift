import ConversationKit
import Foundation
import Synchronization
@testable import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// The stream (docs/PROTOCOL.md §2, "The stream"): one connection per client, down which the
/// server pushes the records themselves.
@Suite struct StreamTests {
    @Test func aSavedMessageIsPushedToTheFollowerWithNoFetch() async throws {
        let fixture = try ServerFixture()
        let zone = try conversationZone("alice", "bob")
        let alice = fixture.client("alice", key: Keys.alice), bob = fixture.client("bob", key: Keys.bob)
        try await alice.createZone(zone)
        try await alice.save([try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice, text: "before")]).forEach { _ = try $0.get() }

        let stream = try await bob.openStream()
        defer { stream.close() }
        try stream.follow([zone: nil])
        let events = Pushed(stream)
        // What the zone held: pushed at once, verified.
        guard case .changes(let first, let since, let page)? = await events.next() else { Issue.record("nothing pushed for the zone followed"); return }
        #expect(first == zone && since == nil, "the first page reads from where the zone was followed: its beginning")
        #expect(page.records.map { $0.fields["content"] } == [.string("before")])
        #expect(page.rejected.isEmpty && !page.moreComing)

        let fetchesBefore = fixture.server.api.metrics.answered(.zoneChanges)
        try await alice.save([try message(zone, "m2", from: "alice", to: "bob", key: Keys.alice, text: "live")]).forEach { _ = try $0.get() }
        guard case .changes(_, let liveSince, let live)? = await events.next() else { Issue.record("the new message was not pushed"); return }
        #expect(live.records.map { $0.fields["content"] } == [.string("live")])
        #expect(liveSince == page.token, "each page reads on from the one before")
        // The token pushed reads on from there: nothing more to fetch.
        #expect(try await bob.fetchChanges(in: zone, since: live.token, limit: 10).records.isEmpty)
        #expect(fixture.server.api.metrics.answered(.zoneChanges) == fetchesBefore + 1, "only the check above fetched")
        let metrics = try await fixture.signed("GET", "/metrics", identity: "bob", key: Keys.bob)
        #expect(metrics.text.contains("convkitd_streams_open 1"))
        #expect(metrics.text.contains("convkitd_stream_records_total 2"))
    }

    @Test func aFollowFromATokenPushesOnlyWhatCameAfterIt() async throws {
        let fixture = try ServerFixture()
        let zone = try conversationZone("alice", "bob")
        let alice = fixture.client("alice", key: Keys.alice), bob = fixture.client("bob", key: Keys.bob)
        try await alice.createZone(zone)
        try await alice.save([try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice, text: "seen")]).forEach { _ = try $0.get() }
        let token = try await bob.fetchChanges(in: zone, since: nil, limit: 10).token
        try await alice.save([try message(zone, "m2", from: "alice", to: "bob", key: Keys.alice, text: "missed")]).forEach { _ = try $0.get() }

        let stream = try await bob.openStream()
        defer { stream.close() }
        try stream.follow([zone: token])
        let events = Pushed(stream)
        guard case .changes(_, _, let page)? = await events.next() else { Issue.record("nothing pushed"); return }
        #expect(page.records.map { $0.fields["content"] } == [.string("missed")])
        // Nothing more while nothing is saved.
        #expect(await events.next(seconds: 0.5) == nil)
    }

    /// A stream that asked for the feed is told at once, then whenever a zone it does not follow
    /// moves for its identity (a conversation started with it, one deleted) — never for a zone
    /// it follows (its pages say it) nor for others' conversations.
    @Test func theFeedIsToldOfZonesTheStreamDoesNotFollowAlone() async throws {
        let fixture = try ServerFixture()
        let followed = try conversationZone("alice", "bob"), started = try conversationZone("carol", "bob"), others = try conversationZone("alice", "carol")
        let alice = fixture.client("alice", key: Keys.alice), carol = fixture.client("carol", key: Keys.carol)
        try await alice.createZone(followed)
        try await alice.createZone(others)

        let stream = try await fixture.client("bob", key: Keys.bob).openStream()
        defer { stream.close() }
        try stream.followFeed()
        let events = Pushed(stream)
        guard case .feed? = await events.next() else { Issue.record("the feed was not told at once"); return }
        try stream.follow([followed: nil])
        guard case .changes? = await events.next() else { Issue.record("the followed zone was not read"); return }
        // A followed zone's message comes as its page alone; others' conversations say nothing.
        try await alice.save([try message(followed, "m1", from: "alice", to: "bob", key: Keys.alice, text: "followed")]).forEach { _ = try $0.get() }
        guard case .changes(let zone, _, _)? = await events.next() else { Issue.record("the message was not pushed"); return }
        #expect(zone == followed)
        try await alice.save([try message(others, "m1", from: "alice", to: "carol", key: Keys.alice, text: "not bob's")]).forEach { _ = try $0.get() }
        #expect(await events.next(seconds: 0.5) == nil, "nothing told of a conversation bob takes no part in")
        // A conversation started with bob, then deleted: the feed each time.
        try await carol.createZone(started)
        try await carol.save([try message(started, "m1", from: "carol", to: "bob", key: Keys.carol, text: "new")]).forEach { _ = try $0.get() }
        guard case .feed? = await events.next() else { Issue.record("a new conversation was not told"); return }
        try await carol.deleteZone(started)
        guard case .feed? = await events.next() else { Issue.record("a deleted conversation was not told"); return }
        // A followed zone deleted: the stream ends it (not found), and tells of the feed.
        try await alice.deleteZone(followed)
        guard case .failed(let gone, let error)? = await events.next() else { Issue.record("the followed zone's deletion was not said"); return }
        #expect(gone == followed && error.code == .zoneNotFound)
        guard case .feed? = await events.next() else { Issue.record("a deleted followed zone did not tell of the feed"); return }
        #expect(await events.next(seconds: 0.3) == nil)
        let metrics = try await fixture.signed("GET", "/metrics", identity: "bob", key: Keys.bob)
        #expect(metrics.text.contains("convkitd_stream_feeds_total 4"), "\(metrics.text)")
    }

    /// A watch of a zone tells who types there and the presence of those asked about, at once
    /// and at each change, by the rules of the typing and presence routes; an outsider's watch is
    /// refused alone; after an unwatch nothing more comes.
    @Test func aWatchTellsTypingAndPresenceAtEachChange() async throws {
        let fixture = try ServerFixture()
        let zone = try conversationZone("alice", "bob")
        let alice = fixture.client("alice", key: Keys.alice)
        try await alice.createZone(zone)
        let stream = try await fixture.client("bob", key: Keys.bob).openStream()
        defer { stream.close() }
        #expect(stream.canWatch, "the 101 offered watches")
        let events = Pushed(stream)
        func live() async -> LiveState? {
            guard case .live(let told, .success(let state))? = await events.next() else { return nil }
            return told == zone ? state : nil
        }
        try stream.watch(zone, presenceOf: ["alice", "carol"])
        let first = await live()
        #expect(first?.typing == [] && first?.presence.map(\.identity) == ["alice"] && first?.presence.first?.isOnline == false,
                "carol takes no part: left out; \(String(describing: first))")
        try await alice.setTyping(true, in: zone, as: "alice")
        #expect(await live()?.typing == ["alice"])
        try await alice.setPresence(true, as: "alice")
        let online = await live()
        #expect(online?.presence.first?.isOnline == true && online?.presence.first?.lastSeen != nil)
        // Bob's own typing is never told to him (and a state that did not change is not told again).
        try await fixture.client("bob", key: Keys.bob).setTyping(true, in: zone, as: "bob")
        #expect(await events.next(seconds: 0.5) == nil)
        // An outsider's watch is refused alone.
        let outsider = try await fixture.client("carol", key: Keys.carol).openStream()
        defer { outsider.close() }
        let refused = Pushed(outsider)
        try outsider.watch(zone, presenceOf: [])
        guard case .live(_, .failure(let error))? = await refused.next() else { Issue.record("an outsider's watch was not refused"); return }
        #expect(error.code == .notAuthorized)
        // Frames are read in order: once another zone's watch is answered, the unwatch was read.
        let other = try conversationZone("bob", "carol")
        try stream.unwatch(zone)
        try stream.watch(other, presenceOf: [])
        guard case .live(other, .success)? = await events.next() else { Issue.record("the other watch was not answered"); return }
        try await alice.setTyping(false, in: zone, as: "alice")
        #expect(await events.next(seconds: 0.5) == nil, "nothing after the unwatch")
        #expect(fixture.server.api.metrics.answered(.typing) + fixture.server.api.metrics.answered(.presence) == 0)
    }

    /// A watch costs a request's worth of the key's allowance: past it, watches wait for the
    /// allowance to come back (four a second here, after a burst of two), and none is refused.
    @Test func watchesPastTheKeysAllowanceWaitForItAndAreNotRefused() async throws {
        let fixture = try ServerFixture { $0.requestsPerSecond = 4; $0.burst = 2 }
        let others = ["carol", "dave", "erin", "frank", "grace"]
        var zones = [ZoneName]()
        // Each zone made by the other side, with a key of its own (bob's allowance stays whole).
        for (index, other) in others.enumerated() {
            let zone = try conversationZone("bob", other)
            try await fixture.client(other, key: Keys.key(UInt8(30 + index))).createZone(zone)
            zones.append(zone)
        }
        let stream = try await fixture.client("bob", key: Keys.bob).openStream()
        defer { stream.close() }
        let events = Pushed(stream)
        let start = ContinuousClock.now
        for zone in zones { try stream.watch(zone, presenceOf: []) }
        var answered = Set<ZoneName>()
        while answered.count < zones.count {
            guard case .live(let zone, let told)? = await events.next(seconds: 30) else {
                Issue.record("\(answered.count) of \(zones.count) watches answered")
                return
            }
            if case .failure(let error) = told { Issue.record("a watch was refused: \(error)") }
            answered.insert(zone)
        }
        #expect(answered == Set(zones))
        // At most two went on the burst; the other three or more waited a quarter second each.
        let waited = ContinuousClock.now - start
        #expect(waited >= .milliseconds(600), "five watches answered in \(waited) with an allowance of four a second")
    }

    @Test func anOutsidersFollowFailsForThatZoneAlone() async throws {
        let fixture = try ServerFixture()
        let zone = try conversationZone("alice", "bob"), own = try conversationZone("carol", "bob")
        let alice = fixture.client("alice", key: Keys.alice), carol = fixture.client("carol", key: Keys.carol)
        try await alice.createZone(zone)
        try await alice.save([try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice, text: "private")]).forEach { _ = try $0.get() }
        try await carol.createZone(own)

        let stream = try await carol.openStream()
        defer { stream.close() }
        try stream.follow([zone: nil])
        let events = Pushed(stream)
        guard case .failed(let failed, let error)? = await events.next() else { Issue.record("an outsider's follow was not refused"); return }
        #expect(failed == zone && error.code == .notAuthorized)
        // The stream stays, for the zones carol may read; and alice's next message never reaches her.
        try stream.follow([own: nil])
        guard case .changes(let ownZone, _, _)? = await events.next() else { Issue.record("the stream did not go on"); return }
        #expect(ownZone == own)
        try await alice.save([try message(zone, "m2", from: "alice", to: "bob", key: Keys.alice, text: "still private")]).forEach { _ = try $0.get() }
        #expect(await events.next(seconds: 0.5) == nil)
    }

    @Test func anUnsignedOrPlainOpeningIsRefused() async throws {
        let fixture = try ServerFixture()
        // Signed, but not an upgrade: 426, and what to ask for.
        let plain = try await fixture.signed("GET", "/v1/stream", identity: "bob", key: Keys.bob)
        #expect(plain.status == 426 && plain.errorCode == "invalidArguments")
        // A forged signature: 401, no stream.
        let stream = fixture.client("bob", key: Keys.mallory)
        try await fixture.client("bob", key: Keys.bob).createZone(try conversationZone("alice", "bob"))
        await #expect { try await stream.openStream() } throws: { ($0 as? RecordZoneError)?.code == .notAuthenticated }
        #expect(fixture.server.api.streamCounters.open == 0)
    }

    @Test func overHTTPSTheStreamCarriesThePushesAsOverHTTP() async throws {
        let directory = try TemporaryDirectory("stream-tls")
        let certificate = try TestCertificate(in: directory.path)
        let storage = try SQLiteZoneStorage(directory: directory.path + "/server", policy: ConversationStore.recordPolicy())
        let server = ZoneServer(storage: storage, access: ChatZoneAccess())
        let port = try server.start(host: "127.0.0.1", port: 0, tls: try TLSIdentity(certificateFile: certificate.certificateFile, keyFile: certificate.keyFile))
        let url = try #require(URL(string: "https://127.0.0.1:\(port)"))
        let alice = HTTPBackend(url: url, identity: "alice", key: Keys.alice, policy: ConversationStore.recordPolicy(), caFile: certificate.certificateFile)
        let bob = HTTPBackend(url: url, identity: "bob", key: Keys.bob, policy: ConversationStore.recordPolicy(), caFile: certificate.certificateFile)
        let zone = try conversationZone("alice", "bob")
        try await alice.createZone(zone)
        let stream = try await bob.openStream()
        try stream.follow([zone: nil])
        let events = Pushed(stream)
        guard case .changes? = await events.next() else { Issue.record("nothing pushed over HTTPS"); return }
        for text in ["one", "two", "three"] {
            try await alice.save([try message(zone, text, from: "alice", to: "bob", key: Keys.alice, text: text)]).forEach { _ = try $0.get() }
        }
        var received = [FieldValue?]()
        while received.count < 3, case .changes(_, _, let page)? = await events.next() { received += page.records.map { $0.fields["content"] } }
        #expect(received == [.string("one"), .string("two"), .string("three")])
        // A client that does not trust the certificate opens nothing.
        let untrusting = HTTPBackend(url: url, identity: "bob", key: Keys.bob, policy: ConversationStore.recordPolicy())
        await #expect { try await untrusting.openStream() } throws: { ($0 as? RecordZoneError)?.code == .networkUnavailable }
        stream.close()
        await server.stop()
    }

    /// A reader that stops reading costs the server a page, not a backlog; once it reads again it
    /// gets every record, in order.
    @Test func aReaderThatStopsReadingGetsEverythingWhenItReadsAgain() async throws {
        let fixture = try ServerFixture()
        let zone = try conversationZone("alice", "bob")
        let alice = fixture.client("alice", key: Keys.alice), bob = fixture.client("bob", key: Keys.bob)
        try await alice.createZone(zone)
        // bob's stream buffers only two events: what does not fit waits on the server's side.
        let stream = try await bob.openStream(bufferedEvents: 2)
        try stream.follow([zone: nil])
        let padding = String(repeating: "x", count: 8000)
        for batch in 0..<30 {
            let records = try (0..<100).map { try message(zone, "b\(batch)-\(100 + $0)", from: "alice", to: "bob", key: Keys.alice, text: "\(batch)-\(100 + $0) " + padding) }
            try await alice.save(records).forEach { _ = try $0.get() }
        }
        // 3,000 records of 8 kB (24 MB) for a reader that takes none: what the sockets' buffers
        // and the server's megabyte ahead of them hold is pushed, no more.
        try await Task.sleep(for: .milliseconds(500))
        #expect(fixture.server.api.streamCounters.records.load(ordering: .relaxed) < 3000, "everything was pushed to a reader that read nothing")
        var received = [String]()
        do {
            for try await event in stream.events {
                guard case .changes(_, _, let page) = event else { continue }
                for record in page.records {
                    guard case .string(let text)? = record.fields["content"] else { continue }
                    received.append(String(text.prefix { $0 != " " }))
                }
                if received.count >= 3000 { break }
            }
        } catch {
            Issue.record("the stream ended: \(error)")
        }
        stream.close()
        let sent = (0..<30).flatMap { batch in (0..<100).map { "\(batch)-\(100 + $0)" } }
        #expect(received.count == 3000 && received == sent, "\(received.count) records, in the order saved")
    }

    /// A device revoked while its stream is open (a lost phone) gets nothing said after: its
    /// stream ends, as its next request would be refused.
    @Test func aRevokedDevicesStreamEndsBeforeTheNextPush() async throws {
        let fixture = try ServerFixture()
        let own = try ZoneName("s-" + OwnershipRule.identityHash("alice")), zone = try conversationZone("alice", "bob")
        let phone = Keys.key(31)
        let alice = fixture.client("alice", key: Keys.alice)
        try await alice.createZone(own)
        try await alice.createZone(zone)
        let code = LinkCode.issue(identity: "alice", identityKey: Keys.alice, expires: RecordClock(milliseconds: UInt64((Date().timeIntervalSince1970 + 600) * 1000), counter: 0))
        let certificate = try DeviceCertificate.record(code: code, device: phone, label: "phone", zone: own, clock: HybridLogicalClock().now()).encoded()
        let onPhone = HTTPBackend(url: fixture.url, identity: "alice", key: phone, policy: ConversationStore.recordPolicy(), deviceCertificate: certificate)
        let stream = try await onPhone.openStream()
        defer { stream.close() }
        try stream.follow([zone: nil])
        let events = Pushed(stream)
        guard case .changes? = await events.next() else { Issue.record("the phone's stream pushed nothing"); return }
        try await alice.save([try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice, text: "before")]).forEach { _ = try $0.get() }
        guard case .changes(_, _, let before)? = await events.next() else { Issue.record("the phone missed a message before its revocation"); return }
        #expect(before.records.map { $0.fields["content"] } == [.string("before")])

        let revocation = try DeviceRevocation.record(identity: "alice", device: phone.publicKey, revokedAfter: HybridLogicalClock().now(), zone: own,
                                                     identityKey: Keys.alice, clock: HybridLogicalClock().now())
        _ = try await alice.save([revocation]).map { try $0.get() }
        try await alice.save([try message(zone, "m2", from: "alice", to: "bob", key: Keys.alice, text: "after")]).forEach { _ = try $0.get() }
        #expect(await until { events.error != nil }, "the revoked phone's stream is still open")
        #expect(events.error?.code == .notAuthenticated && events.error?.authentication == .deviceRevoked, "\(String(describing: events.error))")
        #expect(await events.next(seconds: 0.2) == nil, "something was pushed to a revoked device")
    }

    @Test func aClosedClientEndsItsStreamOnTheServer() async throws {
        let fixture = try ServerFixture()
        let bob = fixture.client("bob", key: Keys.bob)
        try await bob.createZone(try conversationZone("alice", "bob"))
        let stream = try await bob.openStream()
        try stream.follow([try conversationZone("alice", "bob"): nil])
        #expect(await until { fixture.server.api.streamCounters.open == 1 })
        stream.close()
        #expect(await until { fixture.server.api.streamCounters.open == 0 }, "the server still holds the stream")
        // And a stopping server ends the streams it holds.
        let second = try await bob.openStream()
        let events = Pushed(second)
        await fixture.server.stop()
        #expect(await until { events.error?.code == .networkUnavailable }, "the stream did not end with the server")
    }

    /// A hostile client that asks the server to follow more zones than a stream may: its stream
    /// ends with the reason, and the server goes on serving it (a new stream) and everyone else.
    @Test func aFollowOfTooManyZonesEndsThatStreamAlone() async throws {
        let fixture = try ServerFixture()
        let bob = fixture.client("bob", key: Keys.bob)
        let zone = try conversationZone("alice", "bob")
        try await bob.createZone(zone)
        let greedy = try await bob.openStream()
        defer { greedy.close() }
        let events = Pushed(greedy)
        let many = try (0...Wire.StreamFrame.maximumZones).map { try ZoneName("s-\(String(format: "%016x", $0))") }
        try greedy.follow(Dictionary(uniqueKeysWithValues: many.map { ($0, nil) }))
        #expect(await until { events.error != nil })
        #expect(events.error?.code == .limitExceeded, "\(String(describing: events.error))")
        #expect(await until { fixture.server.api.streamCounters.open == 0 }, "the server still holds the greedy stream")

        let next = try await bob.openStream()
        defer { next.close() }
        try next.follow([zone: nil])
        let pushed = Pushed(next)
        try await fixture.client("alice", key: Keys.alice).save([try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice, text: "still served")]).forEach { _ = try $0.get() }
        // (The empty zone's first token may come first.)
        var received = [FieldValue?]()
        while received.isEmpty, case .changes(_, _, let page)? = await pushed.next() { received = page.records.map { $0.fields["content"] } }
        #expect(received == [.string("still served")])
    }

    /// A hostile server (or one that was broken into) that pushes what it likes: a forged
    /// record is held back with its reason, as a fetched one is, next to the genuine one; a
    /// frame longer than any page ends the stream with a typed error; a `101` to another
    /// protocol is refused.
    @Test func whatAHostileServerPushesIsCheckedAsWhatItAnswers() async throws {
        let zone = try conversationZone("alice", "bob")
        let genuine = try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice, text: "genuine")
        var forged = try message(zone, "m2", from: "alice", to: "bob", key: Keys.alice, text: "forged").encoded()
        let at = try #require(forged.range(of: Data("forged".utf8)))
        forged[at.lowerBound] ^= 0x20  // "forged" → "Forged", after the signature
        let page = Wire.StreamFrame(type: .changes, zone: zone.rawValue, changes: Wire.Changes(
            records: [Wire.SignedRecord(bytes: try genuine.encoded()), Wire.SignedRecord(bytes: forged)], token: ChangeToken(data: Data([1])), moreComing: false))
        let head = Data("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: convkit-stream/1\r\n\r\n".utf8)
        let hostile = try CannedHTTPServer(answer: head + Wire.StreamFrame.framed(try page.encoded()) + Data([0x7f, 0xff, 0xff, 0xff]))
        defer { hostile.stop() }
        let bob = HTTPBackend(url: try #require(URL(string: "http://127.0.0.1:\(hostile.port)")), identity: "bob", key: Keys.bob, policy: ConversationStore.recordPolicy())
        let stream = try await bob.openStream()
        defer { stream.close() }
        let events = Pushed(stream)
        guard case .changes(let pushedZone, let since, let pushed)? = await events.next() else { Issue.record("the page was not delivered: \(String(describing: events.error))"); return }
        #expect(pushedZone == zone && since == nil)
        #expect(pushed.records == [genuine], "only the genuine record is taken")
        #expect(pushed.rejected.map(\.reason) == [.invalidSignature], "the forged one is held back, with its reason")
        #expect(await until { events.error != nil })
        #expect(events.error?.code == .limitExceeded, "a 2 GiB frame ends the stream: \(String(describing: events.error))")

        let other = try CannedHTTPServer(answer: Data("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n".utf8))
        defer { other.stop() }
        let elsewhere = HTTPBackend(url: try #require(URL(string: "http://127.0.0.1:\(other.port)")), identity: "bob", key: Keys.bob, policy: ConversationStore.recordPolicy())
        await #expect(throws: RecordZoneError.self) { _ = try await elsewhere.openStream() }
    }

    /// A hostile client that floods its stream with frames that are not the protocol's has that
    /// stream ended with `malformed` on the first, and the server goes on serving: the same
    /// key's next stream is followed and pushed to.
    @Test func aFloodOfMalformedFramesEndsThatStreamAlone() async throws {
        let fixture = try ServerFixture()
        let zone = try conversationZone("alice", "bob")
        try await fixture.client("alice", key: Keys.alice).createZone(zone)
        let bob = fixture.client("bob", key: Keys.bob)
        let hostile = try await bob.openStream()
        defer { hostile.close() }
        let ended = Pushed(hostile)
        try hostile.core.queue(try Wire.StreamFrame(type: .changes, zone: zone.rawValue).encoded())  // a server's kind of frame
        for n in 0..<2_000 { try? hostile.core.queue(Data("not a frame \(n) \(String(repeating: "{", count: n % 64))".utf8)) }
        #expect(await until { ended.error != nil })
        #expect(ended.error?.code == .malformed, "\(String(describing: ended.error))")
        #expect(await until { fixture.server.api.streamCounters.open == 0 })

        let next = try await bob.openStream()
        defer { next.close() }
        try next.follow([zone: nil])
        let pushed = Pushed(next)
        guard case .changes(let followed, _, _)? = await pushed.next() else { Issue.record("the server did not serve on: \(String(describing: pushed.error))"); return }
        #expect(followed == zone)
    }

    /// A stream the server ends waits for the client to read why and close, but not for ever:
    /// a client that reads nothing more (its queue of events full) is closed within a second
    /// or so of the end, and holds nothing on the server.
    @Test func aClientThatNeverReadsTheEndIsClosedWithinASecond() async throws {
        let fixture = try ServerFixture()
        let bob = fixture.client("bob", key: Keys.bob)
        let zone = try conversationZone("alice", "bob")
        try await bob.createZone(zone)
        let deaf = try await bob.openStream(bufferedEvents: 1)
        defer { deaf.close() }
        try deaf.follow([zone: nil])  // its first page fills the client's queue: it reads no more
        try #require(await until { fixture.server.api.streamCounters.pushes.load(ordering: .relaxed) == 1 })
        let many = try (0...Wire.StreamFrame.maximumZones).map { try ZoneName("s-\(String(format: "%016x", $0))") }
        try deaf.follow(Dictionary(uniqueKeysWithValues: many.map { ($0, nil) }))  // refused: the server ends the stream
        let ended = ContinuousClock.now
        #expect(await until(seconds: 10) { fixture.server.api.streamCounters.open == 0 }, "the server still holds a stream whose client reads nothing")
        #expect(ContinuousClock.now - ended < .seconds(5))
    }

    /// A client that sends faster than its stream is served is held back (the server stops
    /// reading its socket while 256 frames wait), not cut off: after 5,000 pings at once, its
    /// follow is still honoured.
    @Test func aClientSendingFasterThanServedIsHeldBackNotCut() async throws {
        let fixture = try ServerFixture()
        let zone = try conversationZone("alice", "bob")
        try await fixture.client("alice", key: Keys.alice).createZone(zone)
        let stream = try await fixture.client("bob", key: Keys.bob).openStream()
        defer { stream.close() }
        let pushed = Pushed(stream)
        let ping = try Wire.StreamFrame(type: .ping).encoded()
        for _ in 0..<5_000 { try stream.core.queue(ping) }
        try stream.follow([zone: nil])
        guard case .changes(let followed, _, _)? = await pushed.next() else { Issue.record("the stream was cut: \(String(describing: pushed.error))"); return }
        #expect(followed == zone)
        #expect(fixture.server.api.streamCounters.open == 1)
    }

    /// Open streams are never idle connections: when the server is past the mark where idle
    /// connections give way to new ones, it is the idle ones that go, and every stream stays.
    @Test func openStreamsNeverGiveWayAsIdle() async throws {
        let fixture = try ServerFixture { $0.limits.idleConnectionsGiveWayAt = 8 }
        let zone = try conversationZone("alice", "bob")
        try await fixture.client("alice", key: Keys.alice).createZone(zone)
        let bob = fixture.client("bob", key: Keys.bob)
        var streams = [ServerStream]()
        for _ in 0..<12 {
            let stream = try await bob.openStream()
            try stream.follow([zone: nil])
            streams.append(stream)
        }
        defer { streams.forEach { $0.close() } }
        let pushed = streams.map { Pushed($0) }
        try #require(await until { fixture.server.api.streamCounters.open == 12 })
        // Idle connections come and go past the mark.
        var idle = [RawConnection]()
        for _ in 0..<6 { idle.append(try RawConnection(port: fixture.port)) }
        try await fixture.client("alice", key: Keys.alice).save([try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice, text: "to all")]).forEach { _ = try $0.get() }
        for events in pushed {
            var got = false
            while !got, case .changes(_, _, let page)? = await events.next() { got = page.records.map { $0.fields["content"] } == [.string("to all")] }
            #expect(got, "a stream was given way: \(String(describing: events.error))")
        }
        #expect(fixture.server.api.streamCounters.open == 12)
        #expect(fixture.server.http.counters.idleConnectionsGivenWayCount > 0, "the idle connections gave way")
        _ = idle
    }

    /// A link that falls silent — blackholed: each side's kernel still takes the other's bytes,
    /// nothing arrives — ends the stream within the silence the side that notices keeps, while a
    /// quiet living link is kept by the pings. Pings every 0.2 s here; the side under test takes
    /// 1.5 s of silence for the end, the other 45 s (so only the side under test can end it).
    @Test(arguments: [true, false]) func aBlackholedLinkEndsTheStreamWithinTheSilence(_ serverNotices: Bool) async throws {
        let quick = Wire.StreamFrame.Timing(heartbeat: .milliseconds(200), silence: .milliseconds(1500))
        let patient = Wire.StreamFrame.Timing(heartbeat: .milliseconds(200), silence: .seconds(45))
        let fixture = try ServerFixture { $0.streamTiming = serverNotices ? quick : patient }
        let proxy = try FaultProxy(tcpPort: fixture.port)
        defer { proxy.stop() }
        let zone = try conversationZone("alice", "bob")
        let alice = fixture.client("alice", key: Keys.alice)
        try await alice.createZone(zone)
        let bob = HTTPBackend(url: try #require(URL(string: "http://127.0.0.1:\(proxy.port)")), identity: "bob", key: Keys.bob,
                              policy: ConversationStore.recordPolicy(), streamTiming: serverNotices ? patient : quick)
        let stream = try await bob.openStream()
        defer { stream.close() }
        try stream.follow([zone: nil])
        let events = Pushed(stream)
        guard case .changes? = await events.next() else { Issue.record("the zone's first page was not pushed"); return }
        // Quiet for twice the silence: the pings keep both ends, and a message still comes.
        #expect(await events.next(seconds: 3) == nil && events.error == nil, "\(String(describing: events.error))")
        try await alice.save([try message(zone, "m1", from: "alice", to: "bob", key: Keys.alice, text: "alive")]).forEach { _ = try $0.get() }
        guard case .changes(_, _, let page)? = await events.next() else { Issue.record("a quiet stream did not go on: \(String(describing: events.error))"); return }
        #expect(page.records.map { $0.fields["content"] } == [.string("alive")])

        proxy.blackhole(true)
        if serverNotices {
            #expect(await until(seconds: 10) { fixture.server.api.streamCounters.open == 0 }, "the server closed the silent client's stream")
        } else {
            #expect(await until(seconds: 10) { events.error != nil }, "the client ended the silent server's stream")
            #expect(events.error?.code == .networkUnavailable && events.error?.message.contains("said nothing") == true, "\(String(describing: events.error))")
        }
    }
}

/// What a stream pushed, collected as it comes.
final class Pushed: Sendable {
    private let state = Mutex<(events: [ServerStream.Event], taken: Int, error: RecordZoneError?)>(([], 0, nil))

    init(_ stream: ServerStream) {
        Task { [weak self] in
            do {
                for try await event in stream.events { self?.state.withLock { $0.events.append(event) } }
            } catch {
                self?.state.withLock { $0.error = error as? RecordZoneError ?? RecordZoneError(.internalError, "\(error)") }
            }
        }
    }

    /// Why the stream ended (nil: it has not, or ended without an error).
    var error: RecordZoneError? { state.withLock { $0.error } }

    /// The next event, or nil when none comes within `seconds`.
    func next(seconds: Double = 10) async -> ServerStream.Event? {
        guard await until(seconds: seconds, { state.withLock { $0.events.count > $0.taken } }) else { return nil }
        return state.withLock { state in
            defer { state.taken += 1 }
            return state.events[state.taken]
        }
    }
}
