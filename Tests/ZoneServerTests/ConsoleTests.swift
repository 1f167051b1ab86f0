import ConversationKit
import Foundation
import Synchronization
import RecordZone
import StorageTestSupport
import Testing
import TestSupport
@testable import ZoneServer

/// The operator's console (`/console/`) over HTTP: nothing without a session, sessions that
/// end, CSRF on what changes something, strict headers, and hostile record content as text.
/// (A real browser drives it in ConsoleBrowserTests.)
@Suite struct ConsoleTests {
    static let token = String(repeating: "7", count: 64)

    /// A clock a test moves by hand (the server's `now`): sessions end and sign-in minutes pass
    /// when the test says, whatever the machine's load.
    final class HandClock: Sendable {
        let date = Mutex(Date())
        var now: Date { date.withLock { $0 } }
        func advance(_ seconds: TimeInterval) { date.withLock { $0 += seconds } }
    }

    static func fixture(storage: (any ZoneStorage)? = nil, clock: HandClock? = nil) throws -> ServerFixture {
        try ServerFixture(storage: storage) { configuration in
            if let clock { configuration.now = { clock.now } }
            configuration.console = ConsoleSettings(token: token)
        }
    }

    static func get(_ fixture: ServerFixture, _ path: String, cookie: String? = nil) async throws -> RawResponse {
        try await RawConnection.exchange(port: fixture.port, method: "GET", path: path, headers: cookie.map { ["Cookie": "convkit_console=\($0)"] } ?? [:])
    }

    static func post(_ fixture: ServerFixture, _ path: String, form: String, cookie: String? = nil) async throws -> RawResponse {
        var headers = ["Content-Type": "application/x-www-form-urlencoded"]
        if let cookie { headers["Cookie"] = "convkit_console=\(cookie)" }
        return try await RawConnection.exchange(port: fixture.port, method: "POST", path: path, headers: headers, body: Data(form.utf8))
    }

    /// Signs in: the session's cookie and its CSRF token (from a page's sign-out form).
    static func signIn(_ fixture: ServerFixture) async throws -> (cookie: String, csrf: String) {
        let answer = try await post(fixture, "/console/sign-in", form: "token=\(token)")
        #expect(answer.status == 303 && answer.headers["location"] == "/console/")
        let setCookie = try #require(answer.headers["set-cookie"])
        #expect(setCookie.contains("HttpOnly") && setCookie.contains("SameSite=Strict") && setCookie.contains("Path=/console"), "\(setCookie)")
        let cookie = try #require(setCookie.split(separator: ";").first?.split(separator: "=", maxSplits: 1).last.map(String.init))
        let page = try await get(fixture, "/console/", cookie: cookie)
        #expect(page.status == 200, "\(page.text)")
        let csrf = try #require(page.text.range(of: #"name="csrf" value="([0-9a-f]+)""#, options: .regularExpression).map { String(page.text[$0].dropFirst(19).dropLast()) })
        return (cookie, csrf)
    }

    static let pages = ["/console", "/console/", "/console/zones", "/console/zones/speakers", "/console/zones/speakers/changes",
                        "/console/zones/speakers/records/x", "/console/identities/alice", "/console/refused", "/console/metrics"]

    @Test func nothingAnswersWithoutASession() async throws {
        // The server's clock stands still: the ten failures fall in one minute however slow the machine.
        let fixture = try Self.fixture(clock: HandClock())
        for cookie in [nil, "forged", String(repeating: "0", count: 64)] {
            for path in Self.pages {
                let answer = try await Self.get(fixture, path, cookie: cookie)
                #expect(answer.status == 303 && answer.headers["location"] == "/console/sign-in", "\(path) \(String(describing: cookie)): \(answer.status)")
                #expect(!answer.text.contains("speakers"), "\(path)")
            }
            #expect(try await Self.get(fixture, "/console/metrics.json", cookie: cookie).status == 401)
            #expect(try await Self.post(fixture, "/console/sign-out", form: "csrf=x", cookie: cookie).status == 401)
        }
        // The sign-in page and the stylesheet answer; a wrong token does not sign in.
        let page = try await Self.get(fixture, "/console/sign-in")
        #expect(page.status == 200 && page.text.contains("name=\"token\""))
        let wrong = try await Self.post(fixture, "/console/sign-in", form: "token=\(String(repeating: "8", count: 64))")
        #expect(wrong.status == 401 && wrong.headers["set-cookie"] == nil)
        // Every answer carries the headers that keep a page from being framed, sniffed, cached
        // or given a script from elsewhere.
        for answer in [page, wrong] {
            #expect(answer.headers["content-security-policy"]?.contains("default-src 'none'") == true)
            #expect(answer.headers["content-security-policy"]?.contains("frame-ancestors 'none'") == true)
            #expect(answer.headers["x-content-type-options"] == "nosniff" && answer.headers["cache-control"] == "no-store")
        }
        // Ten failures a minute from one address, then none from it is even tried (the right
        // token included); another address still signs in.
        for _ in 0..<9 { _ = try await Self.post(fixture, "/console/sign-in", form: "token=guess") }
        #expect(try await Self.post(fixture, "/console/sign-in", form: "token=\(Self.token)").status == 429)
        let elsewhere = try await RawConnection.exchange(port: fixture.port, method: "POST", path: "/console/sign-in",
                                                         headers: ["Content-Type": "application/x-www-form-urlencoded"], body: Data("token=\(Self.token)".utf8), source: "127.0.0.2")
        #expect(elsewhere.status == 303 && elsewhere.headers["set-cookie"] != nil, "\(elsewhere.status)")
        // The API beside it answers as before.
        #expect(try await RawConnection.exchange(port: fixture.port, method: "GET", path: "/healthz").status == 200)
    }

    @Test func aSessionEndsOnSignOutWithItsCSRFToken() async throws {
        let fixture = try Self.fixture()
        let (cookie, csrf) = try await Self.signIn(fixture)
        for path in Self.pages.dropLast(3) {
            let answer = try await Self.get(fixture, path, cookie: cookie)
            #expect([200, 404].contains(answer.status) && answer.text.contains("convkitd console"), "\(path): \(answer.status)")
        }
        #expect(try await Self.get(fixture, "/console/metrics.json", cookie: cookie).status == 200)
        // A form without the session's token changes nothing.
        #expect(try await Self.post(fixture, "/console/sign-out", form: "csrf=\(String(repeating: "a", count: 64))", cookie: cookie).status == 403)
        #expect(try await Self.post(fixture, "/console/sign-out", form: "", cookie: cookie).status == 403)
        #expect(try await Self.get(fixture, "/console/zones", cookie: cookie).status == 200, "still signed in")
        let out = try await Self.post(fixture, "/console/sign-out", form: "csrf=\(csrf)", cookie: cookie)
        #expect(out.status == 303 && out.headers["set-cookie"]?.contains("Max-Age=0") == true)
        #expect(try await Self.get(fixture, "/console/zones", cookie: cookie).status == 303, "signed out")
    }

    /// Idle past its lifetime (30 minutes by the server's clock), a session is gone; used, it
    /// lasts; 12 hours after it began, it is gone however used.
    @Test func aSessionEndsIdleOrOld() async throws {
        let clock = HandClock()
        let fixture = try Self.fixture(clock: clock)
        let (idle, _) = try await Self.signIn(fixture)
        clock.advance(29 * 60)
        #expect(try await Self.get(fixture, "/console/zones", cookie: idle).status == 200, "29 minutes idle: still on")
        clock.advance(30 * 60 + 1)
        #expect(try await Self.get(fixture, "/console/zones", cookie: idle).status == 303, "30 minutes idle: ended")
        #expect(try await Self.get(fixture, "/console/zones", cookie: idle).status == 303, "and stays ended")
        let (used, _) = try await Self.signIn(fixture)
        for _ in 0..<24 {
            clock.advance(29 * 60)
            #expect(try await Self.get(fixture, "/console/zones", cookie: used).status == 200)
        }
        clock.advance(29 * 60)
        #expect(try await Self.get(fixture, "/console/zones", cookie: used).status == 303, "past 12 hours: ended")
    }

    /// A group made by a real store: its zone's page shows the members as the server's rule
    /// decides them; the identities list links each one's keys.
    @Test func aGroupsMembersAsTheServerDecidesThem() async throws {
        let fixture = try Self.fixture()
        var stores = [String: ConversationStore]()
        for name in ["carol", "alice", "bob"] {
            let store = try ConversationStore(directory: fixture.directory.path + "/store-" + name, backend: .server(fixture.url))
            _ = try await store.setupLocalSpeaker(identifier: name, name: name.capitalized)
            try await store.sync()
            stores[name] = store
        }
        let carol = try #require(stores["carol"])
        let group = try await carol.createGroup(name: "Trip <b>", members: ["alice", "bob"])
        try await carol.sync()
        try await carol.removeMember("bob", from: group.id)
        try await carol.sync()
        let (cookie, _) = try await Self.signIn(fixture)
        let page = try await Self.get(fixture, "/console/zones/\(group.id)", cookie: cookie)
        #expect(page.text.contains("As this server decides it") && page.text.contains("carol (creator), alice (member)") && !page.text.contains("bob (member)"), "\(page.text)")
        let identities = try await Self.get(fixture, "/console/identities", cookie: cookie)
        for name in ["alice", "bob", "carol"] { #expect(identities.text.contains("/console/identities/\(name)"), "\(identities.text)") }
    }

    /// The operator action: every session ends at once, with the CSRF token of the one asking.
    @Test func endingEverySessionSignsEveryoneOut() async throws {
        let fixture = try Self.fixture()
        let (first, csrf) = try await Self.signIn(fixture)
        let (second, _) = try await Self.signIn(fixture)
        let page = try await Self.get(fixture, "/console/sessions", cookie: second)
        #expect(page.text.contains("2 console sessions open"), "\(page.text)")
        #expect(try await Self.post(fixture, "/console/sessions/end-all", form: "csrf=nope", cookie: first).status == 403)
        #expect(try await Self.get(fixture, "/console/zones", cookie: second).status == 200)
        #expect(try await Self.post(fixture, "/console/sessions/end-all", form: "csrf=\(csrf)", cookie: first).status == 303)
        for cookie in [first, second] { #expect(try await Self.get(fixture, "/console/zones", cookie: cookie).status == 303) }
    }

    /// A record whose name, fields and owner's name hold markup and bidi controls: the pages
    /// show them as text; a forged record is marked; a refused save is listed with its reason.
    @Test func hostileContentIsTextAndForgeriesAreMarked() async throws {
        try await Self.hostileContent(try Self.fixture())
    }

    @Test(.enabled(if: SharedPostgres.isAvailable, "PostgreSQL is not installed (scripts/setup.sh installs it)"))
    func hostileContentIsTextAndForgeriesAreMarkedOnPostgreSQL() async throws {
        let storage = try await PostgresZoneStorage(conninfo: try await SharedPostgres.freshDatabase(), poolSize: 2, policy: ConversationStore.recordPolicy(),
                                                    indexedFields: ConversationStore.queryIndexes)
        try await Self.hostileContent(try Self.fixture(storage: storage))
    }

    static func hostileContent(_ fixture: ServerFixture) async throws {
        let hostile = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>\u{202E}txt.exe"
        let alice = fixture.client("alice", key: Keys.alice)
        let zone = try conversationZone("alice", "bob")
        _ = try await alice.createZone(zone)
        var record = try message(zone, "0000000000000001-" + "aaaa", from: "alice", to: "bob", key: Keys.alice, text: hostile)
        record.fields["note"] = .string(hostile)
        try record.sign(with: Keys.alice, clock: HybridLogicalClock().now())
        let saved = try await alice.save([record])
        #expect((try? saved.first?.get()) != nil, "\(saved)")
        // A forged version planted past every check: the bytes of alice's record, one signature byte changed.
        var bytes = try record.encoded()
        bytes[bytes.count - 1] ^= 0x01
        try await fixture.server.storage.injectUnchecked(bytes, into: zone, name: "m.\(OwnershipRule.identityHash("alice")).forged")
        // A save the server refuses: mallory's key claiming alice's message.
        let forged = try message(zone, "0000000000000002-bbbb", from: "alice", to: "bob", key: Keys.mallory, text: "it was me")
        let refused = try await fixture.client("alice", key: Keys.alice).save([forged])
        #expect((try? refused.first?.get()) == nil)

        let (cookie, _) = try await signIn(fixture)
        let zonePage = try await Self.get(fixture, "/console/zones/\(zone.rawValue)", cookie: cookie)
        #expect(zonePage.status == 200)
        #expect(zonePage.text.contains("FORGED OR BROKEN"), "\(zonePage.text)")
        #expect(zonePage.text.contains("<span class=\"good\">verified</span>"))
        // Opening the zone counted it (in the background): the zones list shows what was counted.
        var counted = zonePage.text.contains("2 records")
        for _ in 0..<50 where !counted {
            try await Task.sleep(for: .milliseconds(200))
            counted = try await get(fixture, "/console/zones/\(zone.rawValue)", cookie: cookie).text.contains("2 records")
        }
        #expect(counted)
        let list = try await get(fixture, "/console/zones", cookie: cookie)
        #expect(list.text.range(of: "\(zone.rawValue)</a></td><td>[0-9]+</td><td>2</td><td>[0-9]+</td>", options: .regularExpression) != nil, "\(list.text)")
        let name = record.id.name
        let recordPage = try await Self.get(fixture, "/console/zones/\(zone.rawValue)/records/\(name)", cookie: cookie)
        #expect(recordPage.status == 200 && recordPage.text.contains("verified") && recordPage.text.contains("Fingerprint"), "\(recordPage.text)")
        for page in [zonePage, recordPage] {
            #expect(!page.text.contains("<script>alert") && !page.text.contains("<img") && !page.text.contains("\u{202E}"), "\(page.text)")
        }
        #expect(recordPage.text.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(2)&gt;&lt;U+202E&gt;txt.exe"), "\(recordPage.text)")
        let refusals = try await Self.get(fixture, "/console/refused", cookie: cookie)
        #expect(refusals.text.contains(forged.id.description) && refusals.text.contains("alice"), "\(refusals.text)")
        // The changes feed, paged by token; the identity's keys.
        let changes = try await Self.get(fixture, "/console/zones/\(zone.rawValue)/changes", cookie: cookie)
        #expect(changes.status == 200 && changes.text.contains(name), "\(changes.text)")
        let identity = try await Self.get(fixture, "/console/identities/alice", cookie: cookie)
        #expect(identity.text.contains(KeyChain.fingerprint(identity: "alice", key: Keys.alice.publicKey)), "\(identity.text)")
        // A zone that is not there: 404, said on a page.
        #expect(try await Self.get(fixture, "/console/zones/c-0000000000000000-0000000000000000", cookie: cookie).status == 404)
        #expect(try await Self.get(fixture, "/console/zones/bad%20name", cookie: cookie).status == 400)
        #expect(try await Self.get(fixture, "/console/zones/..%2F..%2Fetc", cookie: cookie).status == 404)
    }
}
