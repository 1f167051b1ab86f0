import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// Mentions (docs/PROTOCOL.md §3): speakers named at spans of a message's text, sealed with it;
/// "mentions of me" across conversations.
@Suite struct MentionTests {
    @Test(arguments: ChatBackend.allCases)
    func aMentionReachesItsSpeakerSealed(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let text = "Hey @bob, is ☕ at @bob's fine?"
        let sent = try await alice.send(text, to: "bob", mentions: Mention.written(["bob"], in: text))
        #expect(sent.mentions.map(\.utf8Range) == [4..<8, 20..<24])
        try await syncAll([alice, bob])
        let received = try #require(try bob.message(sent.id))
        #expect(received.mentions == sent.mentions)
        #expect(received.mentions.allSatisfy { $0.speaker == "bob" && String(decoding: Array(text.utf8)[$0.utf8Range], as: UTF8.self) == "@bob" })
        #expect(try bob.messagesMentioningMe().map(\.id) == [sent.id])
        #expect(try alice.messagesMentioningMe().isEmpty)
        // Edited without them, the mentions go; the message is no longer one of bob's mentions.
        _ = try await alice.edit(sent.id, content: "never mind")
        try await syncAll([alice, bob])
        #expect(try bob.message(sent.id)?.mentions == [])
        #expect(try bob.messagesMentioningMe().isEmpty)
        #expect(try await EncryptionTests.messageRecords(in: sent.id.conversation, fixture).allSatisfy { $0["mentions"] == nil })
    }

    @Test func writtenMentionsAreWholeIdentifiers() {
        let text = "@carol, @caroline and @carol.b — @carol"
        #expect(Mention.written(["carol"], in: text).map(\.utf8Range) == [0..<6, text.utf8.count - 6..<text.utf8.count])
        #expect(Mention.written(["dave"], in: text).isEmpty)
    }

    @Test func aMentionIsASpanOfTheTextNamingAnIdentifier() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        for bad in [Mention(speaker: "bob", utf8Range: 0..<99), Mention(speaker: "Bob Smith", utf8Range: 0..<2), Mention(speaker: "bob", utf8Range: 1..<2)] {
            await #expect(throws: ConversationError.self) { try await alice.send("☕ bob", to: "bob", mentions: [bad]) }
        }
        #expect(try alice.conversations().isEmpty || history(alice, try #require(try alice.conversations().first?.id)).isEmpty)
    }
}
