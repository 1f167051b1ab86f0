import ConversationKit
import Foundation
import SQLiteKit
import Testing
import TestSupport

/// Keys read back from a store whose file rotted: a damaged row is never handed to the
/// sealing code (which traps on a wrong length), and nothing that can be sent is lost.
@Suite struct StoredKeyDamageTests {
    @Test func aDamagedSenderKeyIsReplacedByANewEpochAndTheMessageArrives() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let first = try await alice.send("before", to: "bob")
        try await syncAll([alice, bob])
        // Every sender key row of alice's store shortened by a byte.
        let damage = try Database(path: fixture.storePath("alice") + "/store.sqlite")
        try damage.execute("UPDATE sender_keys SET key = substr(key, 1, 31)")
        let second = try await alice.send("after", to: "bob")
        try await syncAll([alice, bob])
        #expect(try alice.message(second.id)?.syncState == .synced)
        let read = try bob.messages(in: first.id.conversation).messages
        #expect(read.map(\.content) == ["before", "after"])
        #expect(read.allSatisfy { !$0.isWaitingForKey })
    }
}
