@testable import ChatSchema
import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// Blocking a speaker (docs/PROTOCOL.md §3, `Block`): hidden on every device of the blocker,
/// refused by a zone server, and put back by unblocking.
@Suite struct BlockingTests {
    /// Alice blocks bob: his message and reaction leave her view at once, and her laptop's after
    /// a sync. Bob's store, once it has read the block, sends nothing more there (`blocked`); a
    /// message he sent before reading it is refused by a zone server — even one behind another
    /// server sharing the database — and, over a memory or folder backend that refuses nothing,
    /// hidden by alice's stores. Unblocking shows what alice holds of his again, and bob writes
    /// to her as before.
    @Test(arguments: ChatBackend.allCases)
    func aBlockedSpeakersMessagesAreHiddenAndTheirWritesStop(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        defer { withExtendedLifetime(fixture) {} }
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob", onSecondServer: kind == .postgres)
        let laptop = try ConversationStore(directory: fixture.storePath("alice-laptop"), backend: fixture.factory(device: "alice-laptop"))
        try await alice.sync()
        try await laptop.setupLocalSpeaker(linking: try alice.linkDevice(), label: "laptop")
        let question = try await alice.send("Lunch?", to: "bob")
        try await syncAll([alice, bob])
        let hello = try await bob.send("Hi alice", to: "alice")
        try await bob.react(to: question.id, with: "👍")
        try await syncAll([bob, alice, laptop])
        let zone = question.id.conversation
        #expect(try history(alice, zone).map(\.content) == ["Lunch?", "Hi alice"])

        try await alice.block("bob")
        #expect(try alice.blockedSpeakers() == ["bob"])
        #expect(try history(alice, zone).map(\.content) == ["Lunch?"], "hidden at once, before any sync")
        #expect(try alice.reactions(to: question.id).isEmpty)
        #expect(try alice.conversations().first { $0.id == zone }?.isBlocked == true)
        try await syncAll([alice, laptop])
        #expect(try laptop.blockedSpeakers() == ["bob"], "her other device blocks him too")
        #expect(try history(laptop, zone).map(\.content) == ["Lunch?"])

        // Bob sends before his store reads the block: a server refuses it; a folder takes it
        // and alice's stores do not show it.
        let early = try await bob.send("Are you there?", to: "alice")
        try await bob.sync()
        let earlyState = try #require(try bob.message(early.id)).syncState
        if kind.isServer {
            guard case .failed(let failure) = earlyState else { Issue.record("refused by the server, yet \(earlyState)"); return }
            #expect(failure.backendCode == .notAuthorized && failure.message.contains("blocked"))
        } else {
            #expect(earlyState == .synced)
        }
        // Having read the block, his store sends nothing more there.
        let late = try await bob.send("Hello?", to: "alice")
        try await bob.react(to: question.id, with: "😢")
        let report = try await bob.sync()
        #expect(report.pushed == 0 && report.failed == 2)
        guard case .failed(let failure)? = try bob.message(late.id)?.syncState else { Issue.record("a message to someone who blocked him is not failed"); return }
        #expect(failure.code == .blocked)
        try await syncAll([alice, laptop])
        for store in [alice, laptop] {
            #expect(try history(store, zone).map(\.content) == ["Lunch?"])
            #expect(try store.reactions(to: question.id).isEmpty)
        }
        if kind.isServer {
            // Every message name the server holds (alice's raw reader cannot verify bob's
            // device without his zone: those come as rejected, still named).
            let reader = try fixture.rawBackend("alice", key: try fixture.key(of: "alice"))
            var held = Set<String>(), token: ChangeToken? = nil
            while true {
                let page = try await reader.fetchChanges(in: try ZoneName(zone), since: token, limit: 200)
                held.formUnion(page.records.map(\.id.name) + page.rejected.compactMap { $0.recordID?.name })
                token = page.token
                if !page.moreComing { break }
            }
            #expect(Set(held.filter { $0.hasPrefix("m.") }) == Set([question.id.name, hello.id.name]), "the server took nothing of bob's after the block")
        }

        // Unblocked (from the laptop): bob's messages are back on both of alice's devices.
        try await laptop.unblock("bob")
        try await syncAll([laptop, alice, bob])
        let shown = kind.isServer ? ["Lunch?", "Hi alice"] : ["Lunch?", "Hi alice", "Are you there?"]
        for store in [alice, laptop] {
            #expect(try store.blockedSpeakers().isEmpty)
            #expect(try history(store, zone).map(\.content) == shown)
            #expect(try store.reactions(to: question.id).map(\.emoji) == ["👍"])
        }
        let again = try await bob.send("Hello again", to: "alice")
        try await syncAll([bob, alice])
        #expect(try bob.message(again.id)?.syncState == .synced)
        #expect(try history(alice, zone).last?.content == "Hello again")
    }

    /// In a group, a blocked member's messages are hidden from the blocker only (on a device
    /// that had them before the block, and on one that reads the block first); the others still
    /// see them. Blocking oneself or a malformed identifier is refused.
    @Test func aBlockedMembersGroupMessagesAreHiddenFromTheBlockerOnly() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Trip", members: ["bob", "carol"])
        try await syncAll([alice, bob, carol])
        try await alice.block("carol")
        _ = try await carol.send("Road trip!", toGroup: group.id)
        _ = try await bob.send("Yes!", toGroup: group.id)
        try await syncAll([carol, bob, alice, bob])
        #expect(try history(alice, group.id).map(\.content) == ["Yes!"])
        #expect(try history(bob, group.id).map(\.content) == ["Road trip!", "Yes!"])
        // Alice's new device reads the block and carol's message in the other order (the pair's
        // zone first, as a fresh reader takes zones), and shows the same.
        let laptop = try ConversationStore(directory: fixture.storePath("alice-laptop"), backend: fixture.factory(device: "alice-laptop"))
        try await laptop.setupLocalSpeaker(linking: try alice.linkDevice(), label: "laptop")
        try await syncAll([alice, laptop, laptop])
        #expect(try laptop.blockedSpeakers() == ["carol"])
        #expect(try history(laptop, group.id).map(\.content) == ["Yes!"])
        #expect(await code { try await alice.block("alice") } == .invalidIdentifier)
        #expect(await code { try await alice.block("Carol!") } == .invalidIdentifier)
        try await alice.unblock("carol")
        #expect(try history(alice, group.id).map(\.content) == ["Road trip!", "Yes!"])
    }

    /// The server's rule (``PairBlocks``) decided from the zone's `Block` records in any order:
    /// the newest version of each participant's block counts; a tombstone lifts it; the
    /// blocked one's tombstones and the blocker's own records still pass; a block naming
    /// someone outside the pair is refused.
    @Test func theServerRuleTakesTheNewestBlockWhateverTheOrder() throws {
        let alice = try SigningKey(seed: Data(repeating: 1, count: 32)), bob = try SigningKey(seed: Data(repeating: 2, count: 32))
        let zone = ChatRecords.conversationZone("alice", "bob")
        func block(_ clock: UInt64, deleted: Bool = false, blocked: String = "bob") throws -> Record {
            var record = Record(id: try RecordID(zone: zone, name: "block-alice"), type: ChatRecords.blockType, fields: ["blocker": .string("alice")])
            if deleted { record.isDeleted = true } else { record["blocked"] = .string(blocked) }
            try record.sign(with: alice, clock: RecordClock(milliseconds: clock, counter: 0))
            return record
        }
        var message = Record(id: try RecordID(zone: zone, name: "m.\(ChatRecords.identityHash("bob")).1"), type: ChatRecords.messageType, fields: ["speaker": .string("bob")])
        try message.sign(with: bob, clock: RecordClock(milliseconds: 5, counter: 0))
        var stone = message
        stone.isDeleted = true
        let (on, off) = (try block(10), try block(20, deleted: true))
        for governing in [[on, off], [off, on]] {
            var state = ChatGovernance().decide(zone, governing: governing)
            #expect(state.admit(message, owner: "bob", as: "bob") == nil, "unblocked by the newer tombstone")
        }
        var state = ChatGovernance().decide(zone, governing: [try block(30), off])
        #expect(state.admit(message, owner: "bob", as: "bob")?.contains("blocked") == true)
        #expect(state.admit(stone, owner: "bob", as: "bob") == nil, "taking back what he said stays possible")
        #expect(state.admit(try block(40, blocked: "carol"), owner: "alice", as: "alice") != nil)
        #expect(state.admit(try block(50, deleted: true), owner: "alice", as: "alice") == nil)
        #expect(state.admit(message, owner: "bob", as: "bob") == nil, "the tombstone just admitted lifts it")
        #expect(ChatGovernance().governsReads(of: zone) == false)
    }
}
