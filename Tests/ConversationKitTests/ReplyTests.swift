import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// Replies (docs/PROTOCOL.md §3): a message names the message it answers, sealed with its
/// content; a thread lists a message's answers, and a reply to a deleted message shows a
/// placeholder, never the deleted text.
@Suite struct ReplyTests {
    @Test(arguments: ChatBackend.allCases)
    func aReplyNamesItsParentAndOutlivesItsDeletion(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let question = try await alice.send("Who brings the tent?", to: "bob")
        try await syncAll([alice, bob])
        let answer = try await bob.send("I do", to: "alice", replyingTo: question.id)
        #expect(answer.replyTo == question.id)
        try await syncAll([bob, alice])
        #expect(try alice.message(answer.id)?.replyTo == question.id)
        #expect(try alice.replies(to: question.id).map(\.content) == ["I do"])
        #expect(try alice.parent(of: answer.id) == .message(try #require(try alice.message(question.id))))
        #expect(try alice.parent(of: question.id) == nil)
        // An edit keeps what it answers.
        _ = try await bob.edit(answer.id, content: "I do, and the stove")
        // Sealed with the content: no message record on the backend says what it answers.
        #expect(try await EncryptionTests.messageRecords(in: question.id.conversation, fixture).allSatisfy { $0["replyTo"] == nil })
        // The question deleted: the answer stays, above it a placeholder.
        try await alice.delete(question.id)
        try await syncAll([alice, bob, alice])
        #expect(try bob.parent(of: answer.id) == .deleted(question.id))
        #expect(try alice.message(answer.id)?.content == "I do, and the stove")
        #expect(try bob.replies(to: question.id).map(\.id) == [answer.id])
        #expect(try history(bob, question.id.conversation).map(\.content) == ["I do, and the stove"])
    }

    @Test func aGroupThreadCountsItsReplies() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Trip", members: ["bob", "carol"])
        try await syncAll([alice, bob, carol])
        let question = try await alice.send("Which day?", toGroup: group.id)
        try await syncAll([alice, bob, carol])
        _ = try await bob.send("Friday", toGroup: group.id, replyingTo: question.id)
        _ = try await carol.send("Saturday", toGroup: group.id, replyingTo: question.id)
        try await syncAll([bob, carol, alice])
        #expect(Set(try alice.replies(to: question.id).map(\.content)) == ["Friday", "Saturday"])
    }

    @Test func aReplyAnswersAMessageOfItsOwnConversation() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        let toBob = try await alice.send("hi bob", to: "bob")
        await #expect(throws: ConversationError.self) { try await alice.send("wrong thread", to: "carol", replyingTo: toBob.id) }
        await #expect(throws: ConversationError.self) {
            try await alice.send("no such message", to: "bob", replyingTo: MessageID(conversation: toBob.id.conversation, name: "m.0000000000000000.none"))
        }
        #expect(try history(alice, toBob.id.conversation).count == 1)
    }
}
