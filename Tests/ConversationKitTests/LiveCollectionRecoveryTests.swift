@testable import ConversationKit
import Foundation
import SQLiteKit
import Synchronization
import Testing
import TestSupport

/// What a live collection does when the store cannot answer it: a read that fails, and a
/// subscriber that falls behind the store's events.
@Suite struct LiveCollectionRecoveryTests {
    typealias Taken = LiveCollectionTests.Taken

    /// Events the subscribers fall behind by: twice what the store holds for one.
    static let behind = 2 * EventHub.buffer

    @Test func aReadThatFailsKeepsTheMessageAndSaysWhy() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let hello = try await alice.send("hello", to: "bob")
        let live = try alice.liveMessages(in: hello.id.conversation)
        let snapshots = Taken(live.snapshots)
        #expect(try await snapshots.next().messages.map(\.syncState) == [.pending])

        // Another program damages the file: every read of a message fails from now on (the
        // push's write does not touch that table, so the message is still sent and marked).
        let damage = try Database(path: fixture.storePath("alice") + "/store.sqlite")
        try damage.execute("ALTER TABLE deliveries RENAME TO deliveries_away")
        try await alice.sync()
        var snapshot = try await snapshots.next()
        #expect(snapshot.error != nil, "the failed read reaches the subscriber")
        #expect(snapshot.messages.map(\.content) == ["hello"], "and the message it could not read stays")
        #expect(snapshot.changes.isEmpty)

        // Repaired: the next change reads the window again, and the error is gone.
        try damage.execute("ALTER TABLE deliveries_away RENAME TO deliveries")
        let again = try await bob.send("again", to: "alice")
        try await syncAll([alice, bob, alice])
        snapshot = try await snapshots.next()
        #expect(snapshot.error == nil)
        while snapshot.messages.count < 2 { snapshot = try await snapshots.next() }
        #expect(snapshot.messages.map(\.id) == [hello.id, again.id] && snapshot.messages.first?.syncState == .synced)
        #expect(try snapshot.messages == alice.messages(in: hello.id.conversation, includeDeleted: true).messages)
    }

    @Test func aSubscriberFarBehindGetsAResetAndEndsWithTheRightWindow() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        _ = try await bob.send("first", to: "alice")
        try await syncAll([bob, alice])
        let zone = try #require(try alice.conversations().first).id
        let live = try alice.liveMessages(in: zone, pageSize: 20)
        let liveConversations = try alice.liveConversations()
        let snapshots = Taken(live.snapshots), conversationSnapshots = Taken(liveConversations.snapshots)
        #expect(try await snapshots.next().messages.map(\.content) == ["first"])
        _ = try await conversationSnapshots.next()
        let raw = alice.events()

        // The store's reader held (a long read of another caller's): the collections wait on
        // their first read while the events pile up far past what their streams hold.
        let gate = DispatchSemaphore(value: 0), holding = Atomic<Bool>(false)
        let hold = Task { try await alice.read { _ in holding.store(true, ordering: .relaxed); gate.wait() } }
        while !holding.load(ordering: .relaxed) { try await Task.sleep(for: .milliseconds(5)) }
        var sent: [MessageID] = []
        for index in 0..<Self.behind { sent.append(try await alice.send("m\(index)", to: "bob").id) }
        gate.signal()
        try await hold.value

        // The subscriber that never read learns it missed events, after what it was given.
        var seen = 0, reset = false
        for await event in raw {
            seen += 1
            if event == .reset { reset = true; break }
        }
        #expect(reset && seen <= EventHub.buffer + 1, "a reset, after at most the buffer: \(seen)")

        // The collections read their window again and end as a full read shows it.
        var snapshot = try await snapshots.next()
        while snapshot.messages.count < Self.behind + 1 { snapshot = try await snapshots.next() }
        #expect(snapshot.messages.map(\.content) == ["first"] + (0..<Self.behind).map { "m\($0)" })
        #expect(Array(snapshot.messages.suffix(Self.behind).map(\.id)) == sent)
        #expect(try Array(snapshot.messages.suffix(1000)) == alice.messages(in: zone, limit: 1000, includeDeleted: true).messages)
        #expect(snapshot.error == nil)
        let all = try alice.conversations()
        var conversations = try await conversationSnapshots.next()
        while conversations.conversations != all { conversations = try await conversationSnapshots.next() }
        #expect(conversations.conversations == all)
    }
}
