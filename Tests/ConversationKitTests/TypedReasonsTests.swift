import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ConversationKit

/// What the store refuses keeps why as a code, to the API: a forged record, and a record that is
/// signed and owned right but breaks a chat rule.
@Suite struct TypedReasonsTests {
    @Test func quarantineEntriesCarryTheirCode() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        _ = try await alice.send("hi", to: "bob")
        try await syncAll([alice, bob])
        let zone = ChatRecords.conversationZone("alice", "bob")
        let clock = RecordClock(milliseconds: 1_800_000_000_000, counter: 0)
        // Alice's own key, her own message name, but a listener the conversation does not hold.
        var misplaced = try ChatRecords.message(name: ChatRecords.messageName(speaker: "alice", clock: clock), speaker: "alice", listener: "bob",
                                                content: "to carol", spokenAt: 1_800_000_000_000, editedAt: nil)
        misplaced.fields["listener"] = .string("carol")
        try misplaced.sign(with: try fixture.key(of: "alice"), clock: clock)
        // Bob's name, another key.
        var forged = try ChatRecords.message(name: ChatRecords.messageName(speaker: "bob", clock: clock), speaker: "bob", listener: "alice",
                                             content: "forged", spokenAt: 1_800_000_000_000, editedAt: nil)
        try forged.sign(with: SigningKey.generate(), clock: clock)
        for record in [misplaced, forged] { try await fixture.plant(try record.encoded(), in: zone) }
        try await bob.sync()
        let entries = try bob.quarantine()
        #expect(Set(entries.compactMap(\.code)) == [.schemaViolation, .keyConflict], "\(entries)")
        #expect(entries.first { $0.code == .schemaViolation }?.reason.contains("do not match its conversation") == true)
    }
}
