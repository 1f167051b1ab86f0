@testable import ConversationKit
import Foundation
import SQLiteKit
import Testing
import TestSupport

/// Removing a conversation forgets all of it: one list of a zone's tables (``ZoneTables``),
/// checked against every table of the schema.
@Suite struct ZoneTablesTests {
    @Test func removingAConversationLeavesNoRowOfItInAnyTableAndNoFile() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        // Everything a conversation can hold: messages with a mention and an edit, a file, a
        // reaction, a receipt, a delivery, keys, settings, an unsent message in the outbox.
        let hi = try await alice.send("hi bob", to: "bob", mentions: [Mention(speaker: "bob", utf8Range: 3..<6)])
        _ = try await alice.edit(hi.id, content: "hi bob!", mentions: [Mention(speaker: "bob", utf8Range: 3..<6)])
        let url = URL(fileURLWithPath: fixture.directory.path + "/notes.txt")
        try Data("the notes".utf8).write(to: url)
        let file = try await alice.sendFile(url, to: "bob")
        try await syncAll([alice, bob])
        try await bob.react(to: hi.id, with: "👍")
        try await bob.markAsRead(hi.id)
        _ = try await bob.send("hello alice", to: "alice")
        try await syncAll([bob, alice])
        let zone = hi.id.conversation
        try await alice.pin(zone)
        try await alice.setDraft("more to say", in: zone)
        _ = try await alice.send("not sent yet", to: "bob")
        #expect(try alice.fileURL(of: file.id) != nil)

        let path = fixture.storePath("alice")
        let before = try Self.rowsNaming(zone, in: path + "/store.sqlite")
        for table in ["messages", "message_mentions", "message_versions", "reactions", "receipts", "deliveries", "attachments", "ck_outbox", "ck_records",
                      "conversation_settings", "own_epochs", "sender_keys", "conversation_members"] {
            #expect(before[table, default: 0] > 0, "the scenario puts rows of the conversation in \(table)")
        }

        try await alice.removeConversation(with: "bob")
        let after = try Self.rowsNaming(zone, in: path + "/store.sqlite")
        #expect(after.isEmpty, "rows left: \(after)")
        let files = FileManager.default.enumerator(atPath: path)?.compactMap { $0 as? String }.filter { $0.contains(zone) } ?? []
        #expect(files.isEmpty, "files left: \(files)")
        #expect(try alice.conversations().isEmpty)
    }

    @Test func everyTableWithAZoneIsInTheList() throws {
        let directory = try TemporaryDirectory("zone-tables")
        _ = try ConversationStore(directory: directory.path, backend: .folder(directory.path + "/shared", device: "d"))
        let db = try Database(path: directory.path + "/store.sqlite", readOnly: true)
        let withZone = try Self.tables(db).filter { try Self.columns(of: $0, in: db).contains("zone") }
        let listed = Set(ZoneTables.removed).union(ZoneTables.kept.keys)
        #expect(Set(withZone).subtracting(listed).isEmpty, "tables with a zone column not in ZoneTables")
        #expect(listed.subtracting(withZone).isEmpty, "ZoneTables names tables without a zone column")
        #expect(Set(ZoneTables.removed).isDisjoint(with: ZoneTables.kept.keys))
        // A cache reset says what it does with each of them, once.
        #expect(Set(ZoneTables.reset.map(\.table)) == listed && ZoneTables.reset.count == listed.count)
    }

    /// Per table of the schema (virtual tables and their shadows too): rows with a column equal
    /// to `zone`.
    static func rowsNaming(_ zone: String, in path: String) throws -> [String: Int] {
        let db = try Database(path: path, readOnly: true)
        var found: [String: Int] = [:]
        for table in try tables(db) {
            let columns = try columns(of: table, in: db)
            guard !columns.isEmpty else { continue }
            let condition = columns.map { "\"\($0)\" = ?1" }.joined(separator: " OR ")
            let count = try db.first("SELECT count(*) FROM \"\(table)\" WHERE \(condition)", [zone]) { $0.int(0) } ?? 0
            if count > 0 { found[table] = Int(count) }
        }
        return found
    }

    static func tables(_ db: Database) throws -> [String] {
        try db.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name") { $0.text(0) }
    }

    static func columns(of table: String, in db: Database) throws -> [String] {
        try db.rows("SELECT name FROM pragma_table_info(?)", [table]) { $0.text(0) }
    }
}
