@testable import ConversationKit
import Foundation
import RecordZone
import Synchronization
import Testing
import TestSupport
@testable import ZoneServer

/// Typing indicators (docs/PROTOCOL.md §2, "Typing"): live through a zone server (and memory),
/// never stored, gone when the typist stops saying it, nothing over a folder.
@Suite struct TypingTests {
    typealias Taken = LiveCollectionTests.Taken

    /// Pairs of stores (PostgreSQL: alice on one server, bob on the other).
    static func pair(_ kind: ChatBackend) async throws -> (ChatFixture, ConversationStore, ConversationStore, String) {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob", onSecondServer: true)
        try await syncAll([alice, bob])
        let sent = try await alice.send("hi", to: "bob")
        try await syncAll([alice, bob])
        return (fixture, alice, bob, sent.id.conversation)
    }

    @Test(arguments: [ChatBackend.memory, .http, .postgres].filter(ChatBackend.allCases.contains))
    func typingShowsOnTheOtherSideAndASendEndsIt(_ kind: ChatBackend) async throws {
        let (fixture, alice, bob, conversation) = try await Self.pair(kind)
        defer { withExtendedLifetime(fixture) {} }   // its servers serve to the end
        let seenByBob = Taken(bob.typingSpeakers(in: conversation)), seenByAlice = Taken(alice.typingSpeakers(in: conversation))
        #expect(try await seenByBob.next() == [], "nobody types at first")
        #expect(try await seenByAlice.next() == [])
        try await alice.setTyping(true, in: conversation)
        #expect(try await seenByBob.next(within: 30) == ["alice"])
        // Said again within its refresh interval: no request, nothing changes.
        try await alice.setTyping(true, in: conversation)
        _ = try await alice.send("here it is", to: "bob")
        #expect(try await seenByBob.next(within: 30) == [], "a send ends typing")
        // Bob types: alice sees him, never herself.
        try await bob.setTyping(true, in: conversation)
        #expect(try await seenByAlice.next(within: 30) == ["bob"])
        try await bob.setTyping(false, in: conversation)
        #expect(try await seenByAlice.next(within: 30) == [])
    }

    /// With their continuous syncs running, typing and presence come down the streams the
    /// syncs hold: the server answers no typing or presence long poll (PostgreSQL: alice on one
    /// server, bob on the other, the state passed between them).
    @Test(arguments: [ChatBackend.http, .postgres].filter(ChatBackend.allCases.contains))
    func typingAndPresenceComeDownTheRunningSyncsStream(_ kind: ChatBackend) async throws {
        let (fixture, alice, bob, conversation) = try await Self.pair(kind)
        defer { withExtendedLifetime(fixture) {} }
        let apis = [fixture.zoneServer, fixture.secondServer].compactMap { $0?.api }
        let runs = [alice, bob].map { store in Task { try await store.run() } }
        defer { runs.forEach { $0.cancel() } }
        // Each stream asked for the feed once it carried the watches: both are in place.
        #expect(await until(seconds: 20) { apis.map { $0.streamCounters.feeds.load(ordering: .relaxed) }.reduce(0, +) >= 2 })
        let typing = Taken(bob.typingSpeakers(in: conversation)), presence = Taken(bob.presence(in: conversation))
        #expect(try await typing.next() == [], "nobody types at first")
        try await alice.setTyping(true, in: conversation)
        #expect(try await typing.next(within: 30) == ["alice"])
        try await alice.setTyping(false, in: conversation)
        #expect(try await typing.next(within: 30) == [])
        // Alice's sync said she is online: bob sees it (at once, or at the change).
        var shown = try await presence.next(within: 30)
        while shown.first?.isOnline != true { shown = try await presence.next(within: 30) }
        #expect(shown.map(\.identity) == ["alice"])
        let polls = apis.map { $0.metrics.answered(.typing) + $0.metrics.answered(.presence) }.reduce(0, +)
        #expect(polls == 0, "\(polls) typing or presence long polls answered")
        #expect(apis.map { $0.streamCounters.lives.load(ordering: .relaxed) }.reduce(0, +) >= 3, "live frames pushed")
    }

    /// A member removed from a group is told nothing more of who types in it: membership is
    /// checked at each change a watch tells, not only when it begins, so the watch the removed
    /// member's stream holds is refused at the first change after the removal, and ends.
    @Test(arguments: ChatBackend.allCases.filter(\.isServer))
    func aRemovedMembersWatchEndsAtTheNextChange(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let server = try #require(fixture.zoneServer)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Plans", members: ["bob", "carol"])
        try await syncAll([alice, bob, carol])
        let running = Task { try await carol.run(pollInterval: .seconds(600)) }
        defer { running.cancel() }
        #expect(await until(seconds: 20) { server.api.streamCounters.feeds.load(ordering: .relaxed) >= 1 }, "carol's stream carries the watches")
        let seen = Taken(carol.typingSpeakers(in: group.id))
        #expect(try await seen.next() == [])
        try await bob.setTyping(true, in: group.id)
        #expect(try await seen.next(within: 30) == ["bob"])

        try await alice.removeMember("carol", from: group.id)
        try await alice.sync()
        try await bob.setTyping(false, in: group.id)
        #expect(try await seen.next(within: 30) == [])
        let zone = try ZoneName(group.id)
        let refused = await until(seconds: 30) {
            guard case .failure(let error)? = carol.liveWatches.current(zone).told else { return false }
            return error.code == .notAuthorized
        }
        #expect(refused, "the watch was not refused after the removal")
        // Bob types again (past the board's interval for one typist): carol is not told.
        try await Task.sleep(for: TypingBoard.minimumInterval)
        try await bob.setTyping(true, in: group.id)
        await #expect(throws: Taken<[String]>.TimedOut.self, "a removed member was told who types") { try await seen.next(within: 2) }
    }

    /// A typist that stops saying it (its app gone) is gone within the lifetime, for every reader.
    @Test(arguments: [ChatBackend.memory, .http].filter(ChatBackend.allCases.contains))
    func typingNotSaidAgainEndsByItself(_ kind: ChatBackend) async throws {
        let (fixture, alice, bob, conversation) = try await Self.pair(kind)
        defer { withExtendedLifetime(fixture) {} }
        let seen = Taken(bob.typingSpeakers(in: conversation))
        #expect(try await seen.next() == [])
        let start = ContinuousClock.now
        try await alice.setTyping(true, in: conversation)
        #expect(try await seen.next(within: 30) == ["alice"])
        #expect(try await seen.next(within: 30) == [])
        let gone = ContinuousClock.now - start
        #expect(gone >= TypingBoard.lifetime, "not before its lifetime: \(gone)")
    }

    /// The board's rule on its own: one typist may not change its state in a zone within 0.25 s
    /// (another typist may; a state another server took is applied as it comes).
    @Test func theBoardRefusesATypistTooSoon() throws {
        let board = TypingBoard(), zone = try ZoneName("c-0123456789abcdef-fedcba9876543210")
        #expect(board.set(true, identity: "alice", in: zone))
        #expect(!board.set(false, identity: "alice", in: zone))
        #expect(board.set(true, identity: "bob", in: zone))
        #expect(board.current(in: zone).identities == ["alice", "bob"])
        #expect(board.set(false, identity: "alice", in: zone, rateLimited: false))
        #expect(board.current(in: zone).identities == ["bob"])
    }

    /// A folder carries nothing live: nothing is said, nobody is seen typing, nothing fails.
    @Test func aFolderCarriesNoTyping() async throws {
        let (fixture, alice, bob, conversation) = try await Self.pair(.filesystem)
        try await alice.setTyping(true, in: conversation)
        var seen: [[String]] = []
        for await typists in bob.typingSpeakers(in: conversation) { seen.append(typists) }
        #expect(seen == [[]], "one empty list, then the end")
        let kept = try await fixture.keptBytes() ?? []
        #expect(!kept.contains { $0.place.contains("typing") })
        #expect(await code { try await alice.setTyping(true, in: "c-0000000000000000-1111111111111111") } == .unknownConversation)
    }

    /// The server's rules: only those in a conversation say or see typing in it (a group's
    /// members now, not one removed), and one typist may not change its state in a zone more
    /// often than every 0.25 s.
    @Test(arguments: [ChatBackend.http, .postgres].filter(ChatBackend.allCases.contains))
    func onlyThoseInAConversationTypeInItAndNotTooOften(_ kind: ChatBackend) async throws {
        let (fixture, alice, _, conversation) = try await Self.pair(kind)
        let zone = try ZoneName(conversation)
        _ = try await fixture.store("mallory")
        let mallory = try fixture.rawBackend("mallory", key: try fixture.key(of: "mallory"))
        defer { withExtendedLifetime(fixture) {} }
        for attempt in [{ try await mallory.setTyping(true, in: zone, as: "mallory") },
                        { _ = try await mallory.typing(in: zone, since: nil, timeout: .zero) }] {
            do {
                try await attempt()
                Issue.record("mallory reached a conversation she is not in")
            } catch let error as RecordZoneError {
                #expect(error.code == .notAuthorized)
            }
        }
        // Three states sent at once by a client that does not retry a 429 by itself (ours do,
        // after the server's Retry-After): one is taken, the others come within 0.25 s of it.
        let raw = HTTPBackend(url: try #require(fixture.serverURL), identity: "alice", key: try fixture.key(of: "alice"), maximumRetries: 0)
        let answers = await withTaskGroup(of: RecordZoneError.Code?.self) { group in
            for typing in [true, false, true] {
                group.addTask {
                    do throws(RecordZoneError) {
                        try await raw.setTyping(typing, in: zone, as: "alice")
                        return nil
                    } catch {
                        return error.code
                    }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(answers.filter { $0 == nil }.count >= 1 && answers.contains(.requestRateLimited), "\(answers)")
        // A group: a member removed neither says nor sees typing there.
        let carol = try await fixture.store("carol")
        try await syncAll([alice, carol])
        let group = try await alice.createGroup(name: "Three", members: ["carol"])
        try await syncAll([alice, carol])
        let groupZone = try ZoneName(group.id)
        let carolRaw = try fixture.rawBackend("carol", key: try fixture.key(of: "carol"))
        try await carolRaw.setTyping(true, in: groupZone, as: "carol")
        try await alice.removeMember("carol", from: group.id)
        try await alice.sync()
        do {
            _ = try await carolRaw.typing(in: groupZone, since: nil, timeout: .zero)
            Issue.record("a removed member still sees who types in the group")
        } catch {
            #expect(error.code == .notAuthorized)
        }
    }

    /// Who takes part in a group now is decided by the server's clock, the one it authenticates
    /// requests against (never the machine's own): set an hour back, the server finds carol,
    /// added a moment ago by the machine's clock, not yet a member, for typing and presence.
    @Test func whoTakesPartInAGroupNowIsDecidedByTheServersClock() async throws {
        let serverBehind = Mutex(0.0)  // seconds
        let fixture = try await ChatFixture(.http) { configuration in
            configuration.now = { Date().addingTimeInterval(-serverBehind.withLock { $0 }) }
            configuration.maximumClockSkew = 7200
        }
        let alice = try await fixture.store("alice"), carol = try await fixture.store("carol")
        try await syncAll([alice, carol])
        let group = try await alice.createGroup(name: "Three", members: ["carol"])
        try await syncAll([alice, carol])
        let zone = try ZoneName(group.id)
        let carolRaw = try fixture.rawBackend("carol", key: try fixture.key(of: "carol"))
        _ = try await carolRaw.typing(in: zone, since: nil, timeout: .zero)
        #expect(try await carolRaw.presence(of: ["alice"], in: zone, since: nil, timeout: .zero).presence.count == 1)

        serverBehind.withLock { $0 = 3600 }
        await #expect { _ = try await carolRaw.typing(in: zone, since: nil, timeout: .zero) } throws: { ($0 as? RecordZoneError)?.code == .notAuthorized }
        await #expect { try await carolRaw.setTyping(true, in: zone, as: "carol") } throws: { ($0 as? RecordZoneError)?.code == .notAuthorized }
        await #expect { _ = try await carolRaw.presence(of: ["alice"], in: zone, since: nil, timeout: .zero) } throws: {
            ($0 as? RecordZoneError)?.code == .notAuthorized
        }
        withExtendedLifetime(fixture) {}
    }

    /// The issue's figures, on an otherwise idle machine (scripts/test.sh runs it alone): shown on
    /// the other side within 200 ms over a server, gone within 5 s after the typist's last word.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["CONVKIT_TIMING_TESTS"] == "1", "runs alone: CONVKIT_TIMING_TESTS=1 (scripts/test.sh)"))
    func typingShowsWithin200MillisecondsAndGoesWithinFiveSeconds() async throws {
        let (fixture, alice, bob, conversation) = try await Self.pair(.http)
        defer { withExtendedLifetime(fixture) {} }
        let seen = Taken(bob.typingSpeakers(in: conversation))
        #expect(try await seen.next() == [])
        try await Task.sleep(for: .milliseconds(300))   // bob's long poll is waiting
        let start = ContinuousClock.now
        try await alice.setTyping(true, in: conversation)
        #expect(try await seen.next(within: 5) == ["alice"])
        let shown = ContinuousClock.now - start
        #expect(shown < .milliseconds(200), "shown after \(shown)")
        #expect(try await seen.next(within: 10) == [])
        let gone = ContinuousClock.now - start
        #expect(gone < .seconds(5), "gone after \(gone)")
    }
}
