import ConversationKit
import Foundation
import SQLiteKit
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
        #expect(hits.map(\.snippet) == ["Who brings the [tent]? The [tent] is heavy.", "I bring the [tent]"], "each hit with its own message's snippet")
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

    /// The index is fed in batches (every 64th message's write indexes those waiting): a message
    /// is found whether it is indexed yet or still waits, through edits and deletions on either
    /// side of the mark, a removed conversation and a rowid SQLite hands out again; a store
    /// opened read-only finds the waiting ones too.
    @Test func aMessageIsFoundWhetherIndexedOrWaiting() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        let file = try Database(path: fixture.storePath("alice") + "/store.sqlite", readOnly: true)
        func mark() throws -> (indexed: Int64, newest: Int64) {
            try #require(try file.first("SELECT (SELECT value FROM ck_meta WHERE key = 'search_indexed'), (SELECT max(rowid) FROM messages)") { ($0.int(0), $0.int(1)) })
        }
        func found(_ word: String) throws -> [MessageID] { try alice.search(word, limit: 1000).map(\.message.id) }
        var sent = [Message]()
        for i in 0..<70 { sent.append(try await alice.send("word\(i) common", to: "bob")) }
        let first = try mark()
        #expect(first.indexed >= 64 && first.indexed < first.newest, "\(first)")
        #expect(try found("common").count == 70)
        for i in [0, 63, 64, 69] { #expect(try found("word\(i)") == [sent[i].id]) }

        // An indexed message and a waiting one, each edited and deleted.
        _ = try await alice.edit(sent[1].id, content: "hammock one")
        _ = try await alice.edit(sent[68].id, content: "hammock two")
        try await alice.delete(sent[2].id)
        try await alice.delete(sent[69].id)
        func expectEdited() throws {
            #expect(Set(try found("hammock")) == [sent[1].id, sent[68].id])
            for i in [1, 2, 68, 69] { #expect(try found("word\(i)").isEmpty, "word\(i)") }
            #expect(try found("common").count == 66)
        }
        try expectEdited()
        let inspecting = try ConversationStore.inspecting(directory: fixture.storePath("alice"))
        #expect(try inspecting.search("hammock").count == 2, "a read-only store finds the waiting messages")

        // Another conversation's messages, until they are all indexed: the edited and deleted
        // waiting ones went in as they stand now.
        var carol = [Message]()
        repeat { carol.append(try await alice.send("carol's lantern", to: "carol")) } while try mark().indexed < mark().newest
        #expect(carol.count <= 64)
        try expectEdited()
        #expect(try found("lantern").count == carol.count)

        // Removing it frees the highest rowids; the next message takes one at or below the mark,
        // and is indexed at once, never twice.
        try await alice.removeConversation(with: "carol")
        #expect(try found("lantern").isEmpty)
        let reused = try await alice.send("reused lantern", to: "bob")
        let after = try mark()
        #expect(after.newest <= after.indexed, "\(after): the new message took a rowid at or below the mark")
        #expect(try found("lantern") == [reused.id])
        // Messages at or below the mark (indexed by the trigger), then past it (by a batch).
        var fillers = 0
        repeat {
            _ = try await alice.send("filler", to: "bob")
            fillers += 1
        } while try mark().indexed < mark().newest || fillers < carol.count
        #expect(try found("lantern") == [reused.id])
        #expect(try found("filler").count == fillers)
        try expectEdited()
        #expect(try file.first("SELECT count(*) FROM message_search WHERE message_search MATCH 'lantern'") { $0.int(0) } == 1)
    }
}
