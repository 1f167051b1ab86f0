import ConversationKit
import Foundation
import Testing
import TestSupport

/// Full-text search (FTS5) over the messages a store shows, kept in step with edits, deletions
/// and messages opened late.
@Suite struct SearchTests {
    @Test(arguments: ChatBackend.allCases)
    func searchFindsWhatIsShownAndFollowsEditsAndDeletions(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let tent = try await alice.send("Who brings the tent? The tent is heavy.", to: "bob")
        let cafe = try await alice.send("Meet at the café by the station", to: "bob")
        let mine = try await bob.send("I bring the tent", to: "alice")
        try await syncAll([alice, bob, alice])
        // Best first: twice the word ranks above once; each with its snippet.
        let hits = try bob.search("tent")
        #expect(hits.map(\.message.id) == [tent.id, mine.id])
        #expect(hits.first?.snippet.contains("[tent]") == true, "\(hits.first?.snippet ?? "")")
        #expect(try bob.search("cafe station").map(\.message.id) == [cafe.id], "diacritics folded, every word")
        #expect(try bob.search("tent", from: "bob").map(\.message.id) == [mine.id])
        #expect(try bob.search("tent", in: "c-0000000000000000-0000000000000000").isEmpty)
        // An edit is found by its new words only; a deleted message not at all.
        _ = try await alice.edit(tent.id, content: "Who brings the hammock?")
        try await alice.delete(cafe.id)
        try await syncAll([alice, bob])
        #expect(try bob.search("tent").map(\.message.id) == [mine.id])
        #expect(try bob.search("hammock").map(\.message.id) == [tent.id])
        #expect(try bob.search("station").isEmpty)
    }

    @Test func aQueryIsWordsNeverSyntax() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        let sent = try await alice.send("NEAR the \"quoted\" OR star* thing", to: "bob")
        for query in ["NEAR(", "\"quoted", "star*", "OR", "thing)"] {
            #expect(try alice.search(query).map(\.message.id) == [sent.id], "\(query)")
        }
        #expect(throws: ConversationError.self) { try alice.search("   ") }
    }

    /// A message that waits for its key is found once it opens, by its text.
    @Test func aMessageOpenedLateIsFound() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let sent = try await alice.send("before we met, the lantern", to: "bob")
        try await alice.sync()
        try await bob.sync()
        #expect(try bob.search("lantern").isEmpty)
        try await alice.sync()
        try await bob.sync()
        #expect(try bob.search("lantern").map(\.message.id) == [sent.id])
    }
}
