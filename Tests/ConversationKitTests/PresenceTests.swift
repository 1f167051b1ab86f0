@testable import ChatSchema
import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// Presence (docs/PROTOCOL.md §2, "Presence"): online while a store's continuous sync runs,
/// last seen when it stops, never stored, told only to those who share a conversation, nothing
/// over a folder.
@Suite struct PresenceTests {
    typealias Taken = LiveCollectionTests.Taken

    /// Bob's continuous sync says he is online: alice sees it (through another server sharing
    /// PostgreSQL too); when it stops, she sees him away, last seen then. A speaker she blocks
    /// is not shown at all.
    @Test(arguments: [ChatBackend.memory, .http, .postgres].filter(ChatBackend.allCases.contains))
    func aRunningSyncShowsItsPersonOnlineAndLastSeenWhenItStops(_ kind: ChatBackend) async throws {
        let (fixture, alice, bob, conversation) = try await TypingTests.pair(kind)
        defer { withExtendedLifetime(fixture) {} }
        let seen = Taken(alice.presence(in: conversation))
        let first = try await seen.next(within: 30)
        #expect(first.map(\.identity) == ["bob"] && first.first?.isOnline == false, "\(first)")
        let started = Date()
        let running = Task { try await bob.run() }
        let online = try await seen.next(within: 30)
        #expect(online.first?.isOnline == true, "\(online)")
        running.cancel()
        _ = await running.result
        let away = try await seen.next(within: 30)
        let lastSeen = try #require(away.first?.lastSeen)
        #expect(away.first?.isOnline == false && lastSeen >= started.addingTimeInterval(-1) && lastSeen <= Date().addingTimeInterval(1), "\(away)")

        try await alice.block("bob")
        #expect(try await Taken(alice.presence(in: conversation)).next(within: 30) == [], "blocked: not shown")
    }

    /// Over a folder nobody is online: one empty list, and the stream ends.
    @Test func aFolderCarriesNoPresence() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let sent = try await alice.send("hi", to: "bob")
        try await syncAll([alice, bob])
        var all = [[Presence]]()
        for await presence in alice.presence(in: sent.id.conversation) { all.append(presence) }
        #expect(all == [[]])
    }

    /// A store that does not share presence says nothing: the other side never sees it online.
    @Test func aStoreThatDoesNotSharePresenceIsNeverShownOnline() async throws {
        let fixture = try await ChatFixture(.memory)
        var quiet = StoreConfiguration()
        quiet.sharesPresence = false
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob", configuration: quiet)
        let sent = try await alice.send("hi", to: "bob")
        try await syncAll([alice, bob])
        // Bob's sync has run a round (pulling this) before alice asks (a sharing store says it
        // is online as its first round starts).
        _ = try await alice.send("there?", to: "bob")
        try await alice.sync()
        let events = bob.events()
        let running = Task { try await bob.run() }
        #expect(await firstElement(of: events, seconds: 30) { if case .syncActivity(.synced) = $0 { true } else { false } } != nil)
        let presence = try await Taken(alice.presence(in: sent.id.conversation)).next(within: 30)
        #expect(presence == [Presence(identity: "bob", isOnline: false, lastSeen: nil)])
        running.cancel()
        _ = await running.result
    }

    /// A server tells presence only within a conversation: someone outside it is refused (403);
    /// asked about someone who is not in it, it leaves them out; in a group, a member removed
    /// is left out too. Asking for nobody, or for more than 256, is a bad request.
    @Test func theServerTellsPresenceOnlyWithinAConversation() async throws {
        let fixture = try await ChatFixture(.http)
        defer { withExtendedLifetime(fixture) {} }
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        let sent = try await alice.send("hi", to: "bob")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Trip", members: ["bob", "carol"])
        try await syncAll([alice, bob, carol])
        try await alice.removeMember("carol", from: group.id)
        try await syncAll([alice, bob, carol])
        let raw = { (who: String) throws -> any RecordZoneBackend in try fixture.rawBackend(who, key: try fixture.key(of: who)) }
        for who in ["bob", "carol"] { try await raw(who).setPresence(true, as: who) }
        let pair = try ZoneName(sent.id.conversation), groupZone = try ZoneName(group.id)

        let inPair = try await raw("alice").presence(of: ["bob", "carol"], in: pair, since: nil, timeout: .zero)
        #expect(inPair.presence.map(\.identity) == ["bob"] && inPair.presence.first?.isOnline == true, "\(inPair)")
        await #expect(throws: RecordZoneError.self) { try await raw("carol").presence(of: ["bob"], in: pair, since: nil, timeout: .zero) }
        let inGroup = try await raw("alice").presence(of: ["bob", "carol"], in: groupZone, since: nil, timeout: .zero)
        #expect(inGroup.presence.map(\.identity) == ["bob"], "carol was removed: \(inGroup)")
        await #expect(throws: RecordZoneError.self) { try await raw("carol").presence(of: ["bob"], in: groupZone, since: nil, timeout: .zero) }
        // Asked only about someone outside the conversation, a long poll has nobody to wait
        // for: it ends with its timeout (schemathesis found it hanging), with nobody in it.
        let nobody = try await raw("alice").presence(of: ["zed"], in: pair, since: nil, timeout: .zero)
        #expect(nobody.presence.isEmpty)
        let waited = try await raw("alice").presence(of: ["zed"], in: pair, since: nobody.version, timeout: .seconds(1))
        #expect(waited.presence.isEmpty && waited.version == nobody.version)
        // The most one may ask about: 256 identities of 64 characters.
        let most = (0..<256).map { String(format: "%03d", $0) + String(repeating: "x", count: 61) }
        #expect(try await raw("alice").presence(of: most, in: pair, since: nil, timeout: .zero).presence.isEmpty)
        for asked in [[], (0..<257).map { "s\($0)" }] {
            do {
                _ = try await raw("alice").presence(of: asked, in: pair, since: nil, timeout: .zero)
                Issue.record("\(asked.count) identities asked: answered")
            } catch {
                #expect((error as? RecordZoneError)?.code == .invalidArguments, "\(error)")
            }
        }
    }

    /// The board on its own: online lasts its lifetime unless said again, the version moves only
    /// when someone goes online or away, one identity may not change its state within 1 s, and
    /// a state another server took is applied as it comes.
    @Test func theBoardExpiresOnlineAndRefusesAStateTooSoon() async throws {
        let board = PresenceBoard(lifetime: .milliseconds(300))
        let start = board.current(of: ["bob"])
        #expect(start.presence == [Presence(identity: "bob", isOnline: false, lastSeen: nil)])
        #expect(board.set(true, identity: "bob"))
        let online = board.current(of: ["bob", "carol"])
        #expect(online.presence.map(\.isOnline) == [true, false] && online.version != start.version)
        #expect(!board.set(false, identity: "bob"), "within 1 s")
        #expect(board.set(false, identity: "bob", rateLimited: false), "another server's")
        #expect(board.set(true, identity: "bob", rateLimited: false))
        let gone = await board.wait(of: ["bob"], since: board.current(of: ["bob"]).version, timeout: .seconds(60))
        #expect(gone.presence.first?.isOnline == false && gone.presence.first?.lastSeen != nil, "expired after its lifetime: \(gone)")
        #expect(board.onlineCount == 0)
        let none = await board.wait(of: [], since: board.current(of: []).version, timeout: .milliseconds(50))
        #expect(none.presence.isEmpty, "a wait for nobody ends with its timeout")
    }

    /// A long poll asks about some people: another's change leaves its version as it was, and
    /// one of theirs answers it.
    @Test func aLongPollIsWokenOnlyByThoseItAsksAbout() async throws {
        let board = PresenceBoard()
        let asked = ["carol", "dave"], before = board.current(of: asked).version
        #expect(board.set(true, identity: "bob"))
        #expect(board.current(of: asked).version == before, "bob is not asked about")
        async let woken = board.wait(of: asked, since: before, timeout: .seconds(30))
        try await Task.sleep(for: .milliseconds(50))  // the wait is registered (were it not, it answers at once all the same)
        #expect(board.set(true, identity: "dave"))
        let state = await woken
        #expect(state.version != before && state.presence.map(\.isOnline) == [false, true], "\(state)")
    }
}
