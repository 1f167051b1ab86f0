import ConversationKit
import Foundation
@testable import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// End-to-end encryption in the store (docs/ENCRYPTION.md), over every backend: what a backend
/// holds of a conversation is sealed, member devices read it once synced, a message whose key
/// has not arrived waits for it and resolves by itself, and a member removed or a device
/// revoked reads nothing said after.
@Suite struct EncryptionTests {
    static let backends = ChatBackend.allCases

    /// Every message record a backend holds in `zone`, as a raw reader fetches it.
    static func messageRecords(in zone: String, _ fixture: ChatFixture) async throws -> [Record] {
        let reader = try fixture.rawBackend("alice", key: try fixture.key(of: "alice"))
        var records: [Record] = [], token: ChangeToken? = nil
        while true {
            let page = try await reader.fetchChanges(in: try ZoneName(zone), since: token, limit: 200)
            records += page.changedRecords.filter { $0.recordType == "Message" }
            token = page.token
            if !page.moreComing { break }
        }
        return records
    }

    /// The files under `path` (a shared folder, a server's database directory) that hold `text`.
    static func files(under path: String, holding text: String) -> [String] {
        let needle = Data(text.utf8)
        return (FileManager.default.enumerator(atPath: path)?.compactMap { $0 as? String } ?? []).filter { file in
            (try? Data(contentsOf: URL(fileURLWithPath: path + "/" + file)))?.range(of: needle) != nil
        }
    }

    @Test(arguments: backends)
    func aPairConversationIsSealedOnTheBackendAndReadOnBothSides(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let sent = try await alice.send("the plan: meet at the old mill 🌵", to: "bob")
        try await syncAll([alice, bob])
        try await bob.send("see you there", to: "alice")
        try await syncAll([alice, bob])
        for store in [alice, bob] {
            #expect(try history(store, sent.id.conversation).map(\.content) == ["the plan: meet at the old mill 🌵", "see you there"])
            #expect(try history(store, sent.id.conversation).allSatisfy { !$0.isWaitingForKey })
        }
        let records = try await Self.messageRecords(in: sent.id.conversation, fixture)
        #expect(records.count == 2)
        for record in records {
            #expect(record["content"] == nil && record["sealed"]?.bytesValue != nil, "the backend holds no content in the clear")
        }
        // Byte by byte, in every file the backend keeps (the folder; the server's SQLite files).
        let kept = kind == .filesystem ? fixture.folder : kind == .http ? fixture.directory.path + "/server" : nil
        if let kept {
            #expect(!Self.files(under: kept, holding: "alice").isEmpty, "the search finds what is in the clear (identifiers)")
            for text in ["old mill", "see you there"] { #expect(Self.files(under: kept, holding: text).isEmpty, "\(text) is in \(kept)") }
        }
        // An edit is sealed again.
        try await alice.edit(sent.id, content: "the plan: the new mill")
        try await syncAll([alice, bob])
        #expect(try bob.message(sent.id)?.content == "the plan: the new mill")
        #expect(try await Self.messageRecords(in: sent.id.conversation, fixture).allSatisfy { $0["content"] == nil })
    }

    @Test func aMessageWhoseKeyIsNotHeldYetWaitsAndResolvesByItself() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        // Alice writes before she has ever seen bob's device: nothing is shared with it yet.
        let sent = try await alice.send("before we met", to: "bob")
        try await alice.sync()
        try await bob.sync()
        let waiting = try #require(try bob.message(sent.id))
        #expect(waiting.isWaitingForKey && waiting.content.isEmpty)
        // Alice learns of bob's device at her next sync and shares the key in the same sync.
        let events = bob.events()
        try await alice.sync()
        try await bob.sync()
        #expect(await awaitEvents(events, seconds: 5) { $0 == .messageChanged(sent.id) })
        let resolved = try #require(try bob.message(sent.id))
        #expect(!resolved.isWaitingForKey && resolved.content == "before we met")
        // Read again from scratch, it opens at once.
        try await bob.refetch(zone: sent.id.conversation)
        try await bob.sync()
        #expect(try bob.message(sent.id)?.content == "before we met")
    }
}
