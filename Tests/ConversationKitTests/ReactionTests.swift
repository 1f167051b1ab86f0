import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// Reactions (docs/PROTOCOL.md §3): one record per reactor per message, its emoji sealed.
@Suite struct ReactionTests {
    /// Alice and bob react to the same message while both are offline: after syncing, both
    /// hold both reactions (two records, no conflict). Reacting again replaces one's own;
    /// taking it back removes it everywhere. The backend holds no emoji in the clear.
    @Test(arguments: ChatBackend.allCases)
    func twoOfflineReactionsToOneMessageMerge(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let message = try await alice.send("Dinner at eight?", to: "bob")
        try await syncAll([alice, bob])
        try await alice.react(to: message.id, with: "🎉")
        try await bob.react(to: message.id, with: "👍")
        #expect(try alice.reactions(to: message.id).map(\.emoji) == ["🎉"], "shown at once, before any sync")
        try await syncAll([alice, bob, alice])
        for store in [alice, bob] {
            let reactions = try store.reactions(to: message.id)
            #expect(Set(reactions.map { "\($0.reactor) \($0.emoji)" }) == ["alice 🎉", "bob 👍"])
            #expect(reactions.allSatisfy { !$0.isWaitingForKey })
        }
        // Bob changes his mind, then alice takes hers back.
        try await bob.react(to: message.id, with: "❤️")
        try await alice.removeReaction(from: message.id)
        try await syncAll([alice, bob, alice])
        for store in [alice, bob] {
            #expect(try store.reactions(to: message.id).map { "\($0.reactor) \($0.emoji)" } == ["bob ❤️"])
        }
        // What the backend keeps never holds the emoji.
        if let kept = try await fixture.keptBytes() {
            for emoji in ["🎉", "👍", "❤️"] {
                #expect(!kept.contains { $0.bytes.range(of: Data(emoji.utf8)) != nil }, "\(emoji) is in the clear on the backend")
            }
        }
    }

    /// In a group of three: every member's reaction counts, and someone outside the group
    /// cannot react.
    @Test func aGroupCountsEachMembersReaction() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Trip", members: ["bob"])
        try await syncAll([alice, bob])
        let message = try await alice.send("Which day?", toGroup: group.id)
        try await syncAll([alice, bob])
        try await bob.react(to: message.id, with: "🚗")
        try await alice.react(to: message.id, with: "🚗")
        try await syncAll([alice, bob, alice])
        #expect(try bob.reactions(to: message.id).map(\.reactor).sorted() == ["alice", "bob"])
        await #expect(throws: ConversationError.self) { try await carol.react(to: message.id, with: "🙃") }
    }

    /// A member removed while offline reacts before learning of it: over a backend that lets
    /// anyone write (memory, as a folder), every reader leaves the reaction out, as it holds back
    /// a message signed after the removal — whichever came first to it.
    @Test func aReactionAfterItsReactorsRemovalIsNotCounted() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Trip", members: ["bob", "carol"])
        try await syncAll([alice, bob, carol])
        let message = try await alice.send("Which day?", toGroup: group.id)
        try await syncAll([alice, bob, carol])
        try await carol.react(to: message.id, with: "🙂")
        try await alice.removeMember("carol", from: group.id)
        try await carol.react(to: message.id, with: "🙃")
        try await syncAll([alice, carol, bob, alice])
        for store in [alice, bob] { #expect(try store.reactions(to: message.id).isEmpty) }
    }

    /// A reaction sealed before its reactor shared the key with the reader's device waits, as
    /// a message does, and shows by itself once the share arrives.
    @Test func aReactionWhoseKeyIsNotHeldYetWaitsAndResolvesByItself() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        // Alice writes and reacts before she has ever seen bob's device.
        let sent = try await alice.send("before we met", to: "bob")
        try await alice.react(to: sent.id, with: "🌅")
        try await alice.sync()
        try await bob.sync()
        let waiting = try bob.reactions(to: sent.id)
        #expect(waiting.map(\.reactor) == ["alice"] && waiting.allSatisfy { $0.isWaitingForKey && $0.emoji.isEmpty })
        try await alice.sync()
        try await bob.sync()
        #expect(try bob.reactions(to: sent.id).map { "\($0.emoji) \($0.isWaitingForKey)" } == ["🌅 false"])
    }

    @Test func aReactionIsShortAndHasNoControlCharacters() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        let message = try await alice.send("hi", to: "bob")
        for bad in ["", "\u{1B}[31m", String(repeating: "👍", count: 17)] {
            await #expect(throws: ConversationError.self) { try await alice.react(to: message.id, with: bad) }
        }
        #expect(try alice.reactions(to: message.id).isEmpty)
        await #expect(throws: ConversationError.self) {
            try await alice.react(to: MessageID(conversation: message.id.conversation, name: "m.0000000000000000.nothing"), with: "👍")
        }
    }
}
