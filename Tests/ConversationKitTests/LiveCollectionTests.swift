import ChatSchema
import ConversationKit
import Foundation
import Synchronization
import RecordZone
import Testing
import TestSupport

/// Live collections (Amity's LiveCollection, GRDB's ValueObservation): a paged snapshot that
/// pages backwards and follows what sync applies, one row read per change.
@Suite struct LiveCollectionTests {
    /// A stream's elements as they come, taken one at a time with a bound on the wait.
    final class Taken<S: Sendable>: Sendable {
        private final class Held: Sendable { let state = Mutex<(items: [S], ended: Bool)>(([], false)) }
        private let held = Held()
        private let task: Task<Void, Never>

        init(_ stream: AsyncStream<S>) {
            let held = self.held
            task = Task {
                for await element in stream { held.state.withLock { $0.items.append(element) } }
                held.state.withLock { $0.ended = true }
            }
        }

        deinit { task.cancel() }

        /// The next element, within `seconds` (a loaded machine runs the suite slowly).
        func next(within seconds: Double = 120) async throws -> S {
            let deadline = ContinuousClock.now + .seconds(seconds)
            while ContinuousClock.now < deadline {
                let (element, ended) = held.state.withLock { state in (state.items.isEmpty ? nil : state.items.removeFirst(), state.ended) }
                if let element { return element }
                if ended { break }
                try await Task.sleep(for: .milliseconds(5))
            }
            throw TimedOut()
        }

        struct TimedOut: Error {}
    }

    @Test(arguments: ChatBackend.allCases)
    func aLiveConversationPagesBackAndFollowsSyncOneRowAtATime(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        for index in 0..<120 { _ = try await bob.send("message \(index)", to: "alice") }
        try await syncAll([bob, alice])
        let zone = try #require(try alice.conversations().first).id
        let live = try alice.liveMessages(in: zone, pageSize: 50)
        let snapshots = Taken(live.snapshots)
        var snapshot = try await snapshots.next()
        #expect(snapshot.messages.map(\.content) == (70..<120).map { "message \($0)" } && snapshot.hasOlder)
        #expect(live.rowsRead == 50)
        try live.loadOlder()
        snapshot = try await snapshots.next()
        #expect(snapshot.messages.count == 100 && snapshot.messages.first?.content == "message 20" && snapshot.changes.inserted.count == 50)
        try live.loadOlder()
        snapshot = try await snapshots.next()
        #expect(snapshot.messages.count == 120 && !snapshot.hasOlder)
        #expect(live.rowsRead == 120)

        // A new message pulled by sync: one snapshot, one row read — not the conversation again.
        let new = try await bob.send("one more", to: "alice")
        try await bob.sync()
        try await alice.sync()
        snapshot = try await snapshots.next()
        #expect(snapshot.changes == CollectionChanges(inserted: [new.id]))
        #expect(snapshot.messages.last?.content == "one more" && snapshot.messages.count == 121)
        #expect(live.rowsRead == 121, "one row for the new message")
        // An edit and a deletion: the message updated in place, then its placeholder.
        _ = try await bob.edit(new.id, content: "one more, edited")
        try await bob.sync()
        try await alice.sync()
        snapshot = try await snapshots.next()
        #expect(snapshot.changes == CollectionChanges(updated: [new.id]) && snapshot.messages.last?.content == "one more, edited")
        try await bob.delete(new.id)
        try await bob.sync()
        try await alice.sync()
        snapshot = try await snapshots.next()
        #expect(snapshot.changes == CollectionChanges(updated: [new.id]) && snapshot.messages.last?.isDeleted == true)
        #expect(live.rowsRead == 123)
        // What a full read would show.
        #expect(try snapshot.messages == alice.messages(in: zone, limit: 1000, includeDeleted: true).messages)
    }

    @Test func aLiveListOfConversationsMovesTheOneThatSpokeToTheTop() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        _ = try await carol.send("hi from carol", to: "alice")
        try await carol.sync()
        try await alice.sync()
        _ = try await bob.send("hi from bob", to: "alice")
        try await bob.sync()
        try await alice.sync()
        let live = try alice.liveConversations()
        let snapshots = Taken(live.snapshots)
        var snapshot = try await snapshots.next()
        #expect(snapshot.conversations.map(\.nonLocalSpeaker) == ["bob", "carol"])
        let read = live.rowsRead
        _ = try await carol.send("me again", to: "alice")
        try await carol.sync()
        try await alice.sync()
        // Until carol's conversation is on top with one unread more (the events of one sync may
        // come as more than one snapshot).
        while snapshot.conversations.first?.nonLocalSpeaker != "carol" || snapshot.conversations.first?.unreadCount != 2 {
            snapshot = try await snapshots.next()
        }
        #expect(snapshot.conversations.map(\.nonLocalSpeaker) == ["carol", "bob"])
        #expect(try snapshot.conversations == alice.conversations())
        #expect(live.rowsRead - read <= 3, "one row per event about carol's conversation, never the list: \(live.rowsRead - read)")
    }

    @Test func observedMessagesFollowAConversationThatAppearsLater() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let zone = ChatRecords.conversationZone("alice", "bob").rawValue
        let observed = Taken(alice.observeMessages(in: zone, limit: 2))
        for index in 0..<3 { _ = try await bob.send("m\(index)", to: "alice") }
        try await bob.sync()
        try await alice.sync()
        var seen: [String] = []
        while seen != ["m1", "m2"] { seen = try await observed.next().map(\.content) }
        #expect(seen == ["m1", "m2"])
    }
}
