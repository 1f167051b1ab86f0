import ConversationKit
import Foundation
import SQLiteKit
import Testing
import TestSupport

/// A store whose schema is not this version's is refused with its own code, never mistaken for
/// a store that cannot be written.
@Suite struct StoreVersionTests {
    @Test func aStoreOfAnotherSchemaVersionIsRefusedWithItsOwnCode() async throws {
        let fixture = try await ChatFixture(.memory)
        let path = fixture.storePath("alice")
        var store: ConversationStore? = try await fixture.store("alice")
        _ = try await store?.send("kept", to: "bob")
        store?.close()
        store = nil
        let file = path + "/store.sqlite"
        let current = try Database(path: file, readOnly: true).userVersion

        // An older schema, opened only to look at: nothing may migrate it.
        try Database(path: file).execute("PRAGMA user_version = \(current - 1)")
        let older = Self.error { _ = try ConversationStore.inspecting(directory: path) }
        #expect(older?.code == .storeVersionMismatch)
        #expect(older?.sqliteError?.schema?.found == current - 1 && older?.sqliteError?.schema?.known == current && older?.sqliteError?.schema?.isNewer == false)

        // A newer schema (a later version wrote it): refused for writing and for looking.
        try Database(path: file).execute("PRAGMA user_version = \(current + 1)")
        let newer = Self.error { _ = try ConversationStore(directory: path, backend: fixture.factory(device: "alice")) }
        #expect(newer?.code == .storeVersionMismatch && newer?.sqliteError?.schema?.isNewer == true)
        #expect(Self.error { _ = try ConversationStore.inspecting(directory: path) }?.code == .storeVersionMismatch)

        // Put back, it opens with what it held.
        try Database(path: file).execute("PRAGMA user_version = \(current)")
        let reopened = try ConversationStore.inspecting(directory: path)
        #expect(try reopened.conversations().count == 1)
    }

    /// Migration 25: an outbox that held a copy of each queued version references the stored
    /// one instead, its attempts kept; a copy the records no longer hold (a pulled version took
    /// its place) is left with nothing to push, and leaves the queue at the next sync.
    @Test func anOutboxOfCopiesBecomesAnOutboxOfReferences() async throws {
        let (fixture, path, bob, sends, queued) = try await Self.aliceClosedWithQueued(["queued before the upgrade", "and after it"])
        let file = path + "/store.sqlite", sent = sends[0], later = sends[1]
        // The schema as version 24 left it: the outbox holding the bytes of each queued version
        // (and the conversations' newest-message column migration 26 drops).
        try Database(path: file).execute("""
            CREATE TABLE old_outbox (id INTEGER PRIMARY KEY, zone TEXT NOT NULL, name TEXT NOT NULL, record BLOB NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at INTEGER NOT NULL DEFAULT 0, last_error TEXT, last_error_code TEXT, UNIQUE (zone, name)) STRICT;
            INSERT INTO old_outbox (zone, name, record, attempts) SELECT o.zone, o.name, r.record, 2 FROM ck_outbox o JOIN ck_records r ON r.zone = o.zone AND r.name = o.name ORDER BY o.clock;
            INSERT INTO old_outbox (zone, name, record) VALUES ('c-gone', 'no longer held', x'0102');
            DROP TABLE ck_outbox;
            ALTER TABLE old_outbox RENAME TO ck_outbox;
            ALTER TABLE conversations ADD COLUMN last_message_at INTEGER;
            ALTER TABLE messages DROP COLUMN mentions;
            \(Self.before29)
            PRAGMA user_version = 24;
            """)
        let alice = try ConversationStore(directory: path, backend: fixture.factory(device: "alice"))
        let entries = try alice.outbox()
        #expect(entries.count == queued + 1)
        #expect(entries.filter { $0.attempts == 2 }.count == queued, "attempts kept")
        #expect(entries.contains { $0.name == sent.id.name && $0.recordType == "Message" })
        // Migration 27 keys the queue by record and orders it by clock: still as written.
        let order = entries.map(\.name)
        #expect(try #require(order.firstIndex(of: sent.id.name)) < #require(order.firstIndex(of: later.id.name)))
        let report = try await alice.sync()
        #expect(report.pushed == queued, "the copy the records no longer held is not pushed")
        #expect(try alice.outbox().isEmpty)
        try await bob.sync()
        #expect(try bob.messages(in: sent.id.conversation).messages.map(\.content) == ["queued before the upgrade", "and after it"])
    }

    @Test func mentionsMoveIntoTheirMessagesRows() async throws {
        let fixture = try await ChatFixture(.memory)
        let path = fixture.storePath("bob"), file = path + "/store.sqlite"
        let alice = try await fixture.store("alice")
        var store: ConversationStore? = try await fixture.store("bob")
        let text = "@bob and @bob again", plain = "nobody named"
        let sent = try await alice.send(text, to: "bob", mentions: Mention.written(["bob"], in: text))
        let other = try await alice.send(plain, to: "bob")
        try await syncAll([alice, try #require(store)])
        store?.close()
        store = nil
        // The schema as version 27 left it: the mentions only in their own table.
        try Database(path: file).execute("ALTER TABLE messages DROP COLUMN mentions; \(Self.before29) PRAGMA user_version = 27;")
        let bob = try ConversationStore(directory: path, backend: fixture.factory(device: "bob"))
        let page = try bob.messages(in: sent.id.conversation).messages
        #expect(page.map(\.mentions) == [sent.mentions, []])
        #expect(page.map(\.id) == [sent.id, other.id])
        #expect(sent.mentions.count == 2)
        #expect(try bob.messagesMentioningMe().map(\.id) == [sent.id])
    }

    /// Migration 29: the messages the local speaker said are marked its own, and the unread
    /// index holds only the others' (one's own sent messages are in no unread count, and a send
    /// writes no page of that index).
    @Test func ownMessagesLeaveTheUnreadIndex() async throws {
        let fixture = try await ChatFixture(.memory)
        let path = fixture.storePath("bob"), file = path + "/store.sqlite"
        let alice = try await fixture.store("alice")
        var store: ConversationStore? = try await fixture.store("bob")
        let first = try await alice.send("one", to: "bob")
        _ = try await alice.send("two", to: "bob")
        try await syncAll([alice, try #require(store)])
        _ = try await store?.send("an answer", to: "alice")
        store?.close()
        store = nil
        // The schema as version 28 left it: no mark, every unread-looking message in the index.
        try Database(path: file).execute("\(Self.before29) PRAGMA user_version = 28;")
        var bob: ConversationStore? = try ConversationStore(directory: path, backend: fixture.factory(device: "bob"))
        #expect(try bob?.unreadCount(in: first.id.conversation) == 2)
        _ = try await bob?.send("and another", to: "alice")
        #expect(try bob?.totalUnreadCount() == 2)
        bob?.close()
        bob = nil
        let db = try Database(path: file, readOnly: true)
        let own = try db.rows("SELECT content FROM messages WHERE is_own = 1 ORDER BY spoken_at") { $0.text(0) }
        #expect(own == ["an answer", "and another"])
        let indexed = try db.first("SELECT count(*) FROM messages INDEXED BY messages_unread WHERE read_at IS NULL AND is_deleted = 0 AND is_own = 0") { $0.int(0) }
        #expect(indexed == 2)
    }

    /// Migration 30: records keyed by (zone, name) without a rowid move into a rowid table
    /// unique by (zone, name), every version and every queued reference to one kept.
    @Test func recordsMoveIntoARowidTable() async throws {
        let (fixture, path, bob, sends, queued) = try await Self.aliceClosedWithQueued(["queued before the upgrade"])
        let file = path + "/store.sqlite", sent = sends[0]
        let before = try Database(path: file, readOnly: true).rows("SELECT zone, name, clock, record FROM ck_records ORDER BY zone, name") {
            [$0.text(0), $0.text(1), String($0.int(2)), $0.blob(3).base64EncodedString()]
        }
        // The table as version 29 left it.
        try Database(path: file).execute("""
            CREATE TABLE keyed (zone TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, clock INTEGER NOT NULL, author BLOB NOT NULL,
                signature BLOB NOT NULL, is_deleted INTEGER NOT NULL, record BLOB NOT NULL, PRIMARY KEY (zone, name)) STRICT, WITHOUT ROWID;
            INSERT INTO keyed SELECT zone, name, type, clock, author, signature, is_deleted, record FROM ck_records;
            DROP TABLE ck_records; ALTER TABLE keyed RENAME TO ck_records;
            PRAGMA user_version = 29;
            """)
        let alice = try ConversationStore(directory: path, backend: fixture.factory(device: "alice"))
        let db = try Database(path: file, readOnly: true)
        let shape = try db.first("SELECT sql FROM sqlite_schema WHERE name = 'ck_records'") { $0.text(0) }
        #expect(shape?.contains("WITHOUT ROWID") == false)
        #expect(try db.rows("SELECT zone, name, clock, record FROM ck_records ORDER BY zone, name") {
            [$0.text(0), $0.text(1), String($0.int(2)), $0.blob(3).base64EncodedString()]
        } == before)
        #expect(try alice.outbox().count == queued)
        let report = try await alice.sync()
        #expect(report.pushed == queued, "\(report)")
        #expect(try alice.outbox().isEmpty)
        try await bob.sync()
        #expect(try bob.messages(in: sent.id.conversation).messages.map(\.content) == ["queued before the upgrade"])
    }

    /// Alice's store, closed with `texts` sent to bob (who published himself, and whom she
    /// looked up first) queued unpushed: its fixture, directory, bob's store, the messages and
    /// the outbox's count.
    static func aliceClosedWithQueued(_ texts: [String]) async throws -> (ChatFixture, String, ConversationStore, [Message], Int) {
        let fixture = try await ChatFixture(.memory)
        let bob = try await fixture.store("bob")
        try await bob.sync()
        let alice = try await fixture.store("alice")
        #expect(try await alice.speakerExists("bob") == true)
        var sent: [Message] = []
        for text in texts { sent.append(try await alice.send(text, to: "bob")) }
        let queued = try alice.outbox().count
        alice.close()
        return (fixture, fixture.storePath("alice"), bob, sent, queued)
    }

    /// The messages' table and unread index as they were before migration 29.
    static let before29 = """
        DROP INDEX messages_unread; ALTER TABLE messages DROP COLUMN is_own;
        CREATE INDEX messages_unread ON messages (listener, zone) WHERE read_at IS NULL AND is_deleted = 0;
        """

    static func error(_ body: () throws -> Void) -> ConversationError? {
        do { try body() } catch let error as ConversationError { return error } catch { return nil }
        return nil
    }
}
