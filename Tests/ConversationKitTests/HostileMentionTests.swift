import Foundation
import RecordZone
import Testing
@testable import ConversationKit

/// Mentions a peer's own, validly signed and sealed message carries that no honest sender
/// writes (a name with a space, a span past the text or inside a character, two at one start):
/// each reader keeps only the ones it can place, the same ones, in the message's row and in the
/// "mentions of me" index alike.
@Suite struct HostileMentionTests {
    @Test func aReaderKeepsOnlyTheMentionsItCanPlace() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await bob.createGroup(name: "Three", members: ["alice", "carol"])
        try await syncAll([bob, alice, carol])
        let content = "☕ alice and carol"   // "☕" is three bytes
        let mentions = [
            Mention(speaker: "alice", utf8Range: 4..<9),        // placed
            Mention(speaker: "carol", utf8Range: 4..<9),        // a second at the same start: dropped
            Mention(speaker: "Bob Smith", utf8Range: 14..<19),  // no identifier: dropped
            Mention(speaker: "carol", utf8Range: 14..<99),      // past the text: dropped
            Mention(speaker: "carol", utf8Range: 1..<2),        // inside the "☕": dropped
            Mention(speaker: "carol", utf8Range: 14..<19),      // placed
        ]
        let local = try bob.requireIdentity()
        let name = ChatRecords.messageName(speaker: "bob", clock: HybridLogicalClock().now())
        try await bob.write { applier in
            let record = try ChatRecords.message(name: name, speaker: "bob", listener: nil, in: try ZoneName(group.id), content: content,
                                                 spokenAt: Int64(Date().timeIntervalSince1970 * 1000), editedAt: nil, mentions: mentions)
            try bob.commitLocal(try applier.seal(record), as: local, in: &applier)
        }
        try await syncAll([bob, alice, carol])
        let id = MessageID(conversation: group.id, name: name)
        let expected = [Mention(speaker: "alice", utf8Range: 4..<9), Mention(speaker: "carol", utf8Range: 14..<19)]
        for reader in [alice, carol, bob] {
            let message = try #require(try reader.message(id))
            #expect(message.content == content && message.mentions == expected)
        }
        #expect(try alice.messagesMentioningMe().map(\.id) == [id])
        #expect(try carol.messagesMentioningMe().map(\.id) == [id])
    }
}
