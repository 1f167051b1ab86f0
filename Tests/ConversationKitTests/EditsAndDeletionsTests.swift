import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// Edit history, deleted messages' placeholders and apps' custom payloads (docs/PROTOCOL.md §3):
/// every reader ends with the same view, whatever versions it saw.
@Suite struct EditsAndDeletionsTests {
    @Test(arguments: ChatBackend.allCases)
    func everyReaderHoldsTheSameHistoryAndTheSamePlaceholder(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let sent = try await alice.send("meet at 6", to: "bob")
        try await syncAll([alice, bob])
        _ = try await alice.edit(sent.id, content: "meet at 7")
        _ = try await alice.edit(sent.id, content: "meet at 7, by the mill")
        // Bob pulls once, after both edits: over a server he never saw the middle version.
        try await syncAll([alice, bob])
        let expected = ["meet at 6", "meet at 7", "meet at 7, by the mill"]
        #expect(try alice.editHistory(of: sent.id).map(\.content) == expected)
        #expect(try bob.editHistory(of: sent.id) == alice.editHistory(of: sent.id))
        #expect(try bob.editHistory(of: sent.id).first?.at == sent.spokenAt)
        // The earlier texts are sealed with the content: none of them in the clear on the backend.
        #expect(try await EncryptionTests.messageRecords(in: sent.id.conversation, fixture).allSatisfy { $0["history"] == nil && $0["content"] == nil })
        if let kept = try await fixture.keptBytes() { #expect(EncryptionTests.places(kept, holding: "meet at 6").isEmpty) }

        // Deleted: a placeholder in its place on both sides, at the same time, with nothing of it.
        let before = try await alice.send("and bring a torch", to: "bob")
        try await alice.delete(sent.id)
        try await syncAll([alice, bob])
        for store in [alice, bob] {
            let shown = try store.messages(in: sent.id.conversation, includeDeleted: true).messages
            let placeholder = try #require(shown.first { $0.id == sent.id })
            #expect(placeholder.isDeleted && placeholder.content.isEmpty && placeholder.speaker == "alice" && placeholder.listener == "bob")
            #expect(placeholder.custom == nil && placeholder.editedAt == nil && placeholder.mentions.isEmpty)
            #expect(shown.map(\.id) == [sent.id, before.id])
            #expect(try store.messages(in: sent.id.conversation).messages.map(\.id) == [before.id])
            #expect(throws: ConversationError.self) { try store.editHistory(of: sent.id) }
        }
        // The same view on both sides but for each one's own ticks (delivered, read).
        func said(_ store: ConversationStore) throws -> [String] {
            try store.messages(in: sent.id.conversation, includeDeleted: true).messages.map { "\($0.id) \($0.speaker) \($0.spokenAt) \($0.isDeleted) \($0.content)" }
        }
        #expect(try said(alice) == said(bob))
    }

    /// A reader that only ever gets the tombstone (it came after the deletion, and the server
    /// keeps the newest version) shows the placeholder the others show.
    @Test(arguments: ChatBackend.allCases)
    func aReaderThatOnlySawTheTombstoneShowsTheSamePlaceholder(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        _ = try await bob.send("hi", to: "alice")
        try await syncAll([bob, alice])
        let gone = try await alice.send("something I regret", to: "bob")
        try await alice.sync()
        try await alice.delete(gone.id)
        try await alice.sync()
        try await bob.sync()
        let zone = gone.id.conversation
        let seenByAlice = try #require(try alice.messages(in: zone, includeDeleted: true).messages.first { $0.id == gone.id })
        let seenByBob = try #require(try bob.messages(in: zone, includeDeleted: true).messages.first { $0.id == gone.id })
        #expect(seenByBob.isDeleted && seenByBob.speaker == "alice" && seenByBob.listener == "bob")
        #expect(seenByBob.spokenAt == seenByAlice.spokenAt)
        #expect(try bob.unreadCount(in: zone) == 0)
        #expect(try bob.search("regret").isEmpty)
    }

    @Test func aGroupMessageIsEditedInItsGroupWithItsHistory() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Trip", members: ["bob", "carol"])
        try await syncAll([alice, bob, carol])
        let sent = try await alice.send("Friday", toGroup: group.id)
        let edited = try await alice.edit(sent.id, content: "Saturday")
        #expect(edited.id.conversation == group.id && edited.content == "Saturday")
        try await syncAll([alice, bob, carol])
        for store in [bob, carol] {
            #expect(try store.message(sent.id)?.content == "Saturday")
            #expect(try store.editHistory(of: sent.id).map(\.content) == ["Friday", "Saturday"])
        }
        #expect(try bob.quarantine().isEmpty && alice.quarantine().isEmpty)
        try await alice.delete(sent.id)
        try await syncAll([alice, bob, carol])
        #expect(try carol.messages(in: group.id, includeDeleted: true).messages.map(\.isDeleted) == [true])
    }

    @Test func editsAreBoundedAndEachKept() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        let sent = try await alice.send("v0", to: "bob")
        for edit in 1...Message.maximumEdits { _ = try await alice.edit(sent.id, content: "v\(edit)") }
        await #expect { try await alice.edit(sent.id, content: "one too many") } throws: { ($0 as? ConversationError)?.code == .tooManyEdits }
        #expect(try alice.editHistory(of: sent.id).map(\.content) == (0...Message.maximumEdits).map { "v\($0)" })
        #expect(try alice.message(sent.id)?.content == "v\(Message.maximumEdits)")
    }

    @Test(arguments: ChatBackend.allCases)
    func aCustomPayloadTravelsSealedWithItsFallbackText(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let poll = CustomPayload(type: "com.example.poll", data: Data(#"{"question":"Lunch?","options":["pizza","soup"]}"#.utf8))
        let sent = try await alice.send("Poll: Lunch? (pizza / soup)", to: "bob", custom: poll)
        #expect(sent.custom == poll)
        try await syncAll([alice, bob])
        #expect(try bob.message(sent.id)?.custom == poll)
        #expect(try bob.message(sent.id)?.content == "Poll: Lunch? (pizza / soup)")
        // An edit changes the text and keeps the payload.
        _ = try await alice.edit(sent.id, content: "Poll: Lunch today? (pizza / soup)")
        try await syncAll([alice, bob])
        #expect(try bob.message(sent.id)?.custom == poll)
        #expect(try await EncryptionTests.messageRecords(in: sent.id.conversation, fixture).allSatisfy { $0["customType"] == nil && $0["customData"] == nil })
        if let kept = try await fixture.keptBytes() { #expect(EncryptionTests.places(kept, holding: "com.example.poll").isEmpty) }
        // Refused before anything is written: a bad type, data over 64 KiB.
        for bad in [CustomPayload(type: "Com.Example", data: Data()), CustomPayload(type: "", data: Data()), CustomPayload(type: "9lives", data: Data()),
                    CustomPayload(type: "com.example.big", data: Data(count: CustomPayload.maximumDataBytes + 1))] {
            await #expect { try await alice.send("x", to: "bob", custom: bad) } throws: { ($0 as? ConversationError)?.code == .invalidCustomPayload }
        }
        #expect(try history(alice, sent.id.conversation).count == 1)
    }
}
