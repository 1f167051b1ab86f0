import Foundation
import RecordZone
import Testing
@testable import ConversationKit

/// A send reuses the epoch the last send decided (``EpochCache``) only while nothing that
/// decision was made from has changed: never an epoch whose transaction was undone, never one
/// that another process's change (a member removed from the same store file) made stale.
@Suite struct EpochCacheTests {
    private struct Undone: Error {}

    /// Alice's epoch is used up (a hundred messages); the write that seals the next message
    /// makes a new one and is undone after sealing (the epoch, its shares and its count with
    /// it). Her next send must make an epoch that exists: sealed with the undone one, nobody
    /// could ever read it.
    @Test func anEpochWhoseTransactionWasUndoneIsNeverUsed() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        for index in 0..<Int(RecordApplier.messagesPerEpoch) { _ = try await alice.send("message \(index)", to: "bob") }
        #expect(try await alice.read { db in try db.first("SELECT count(*) FROM own_epochs") { $0.int(0) } } == 1)
        let zone = ChatRecords.conversationZone("alice", "bob")
        await #expect(throws: (any Error).self) {
            try await alice.write { applier in
                let record = try ChatRecords.message(name: ChatRecords.messageName(speaker: "alice", clock: HybridLogicalClock().now()), speaker: "alice",
                                                     listener: "bob", in: zone, content: "never sent",
                                                     spokenAt: Int64(Date().timeIntervalSince1970 * 1000), editedAt: nil, mentions: [])
                _ = try applier.seal(record)
                throw Undone()
            }
        }
        #expect(try await alice.read { db in try db.first("SELECT count(*) FROM own_epochs") { $0.int(0) } } == 1, "the undone epoch was kept")
        let sent = try await alice.send("hello", to: "bob")
        try await syncAll([alice, bob])
        let read = try #require(try bob.message(sent.id))
        #expect(read.content == "hello" && !read.isWaitingForKey)
    }

    /// Another process on the same store (a `convkit` command beside a running daemon) removes
    /// a member; this process's next message must not use the epoch it decided before.
    @Test func anotherProcessRemovingAMemberIsSeen() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        let all = [alice, bob, carol]
        try await syncAll(all)
        let group = try await alice.createGroup(name: "Plans", members: ["bob", "carol"])
        try await syncAll(all)
        let before = try await alice.send("before", toGroup: group.id)
        let beside = try ConversationStore(directory: fixture.storePath("alice"), backend: fixture.factory(device: "alice"))
        try await beside.removeMember("carol", from: group.id)
        let after = try await alice.send("after", toGroup: group.id)
        try await syncAll(all)
        #expect(try bob.message(after.id)?.content == "after")
        #expect(try EncryptionTests.opens(carol, try alice.record(zone: group.id, name: before.id.name)))
        #expect(try !EncryptionTests.opens(carol, try alice.record(zone: group.id, name: after.id.name)))
    }
}
