import ConversationKit
import Foundation
@testable import RecordZone
import SQLiteKit
import Synchronization
import Testing
import TestSupport

/// What apps and the tools need of the store besides chat: close, an observer of a folder,
/// who is held back and why, reachability, a logger, retrying and refetching.
@Suite struct StoreAPITests {
    /// A message is found again by its short reference or 6 or more of its digits, deleted
    /// or not, from either side; other text is refused with a typed error.
    @Test func aMessageIsFoundByItsReference() async throws {
        let fixture = try await ChatFixture(.memory)
        defer { withExtendedLifetime(fixture) {} }
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let first = try await alice.send("one", to: "bob"), second = try await alice.send("two", to: "bob")
        try await alice.delete(second.id)
        try await syncAll([alice, bob])
        for (message, store) in [(first, alice), (second, alice), (first, bob), (second, bob)] {
            let reference = message.id.reference
            #expect(reference.count == MessageID.referenceLength && message.id.name.contains("-" + reference))
            #expect(try store.messages(referencedBy: reference) == [message.id])
            #expect(try store.messages(referencedBy: String(reference.prefix(6)).uppercased()) == [message.id])
            #expect(try store.messages(referencedBy: String(message.id.name.suffix(16))) == [message.id], "all 16 digits")
        }
        let unused = try #require(["000000", "111111", "222222"].first { prefix in ![first, second].contains { $0.id.reference.hasPrefix(prefix) } })
        #expect(try alice.messages(referencedBy: unused).isEmpty)
        // Two messages whose names' random parts begin alike, as a hostile sender's own client
        // can make them (here a row written into the store's file; the API picks the part at
        // random): the reference names both, a longer prefix one.
        let twin = String(first.id.name.dropLast(6)) + (first.id.name.hasSuffix("000000") ? "111111" : "000000")
        let db = try Database(path: fixture.storePath("alice") + "/store.sqlite")
        try db.execute("INSERT INTO messages (zone, name, speaker, listener, content, spoken_at, sync_state) SELECT zone, ?, speaker, listener, 'twin', spoken_at, sync_state FROM messages WHERE zone = ? AND name = ?",
                       [twin, first.id.conversation, first.id.name])
        #expect(Set(try alice.messages(referencedBy: first.id.reference)) == [first.id, MessageID(conversation: first.id.conversation, name: twin)])
        #expect(try alice.messages(referencedBy: first.id.reference, limit: 1).count == 1)
        #expect(try alice.messages(referencedBy: String(first.id.name.suffix(16))) == [first.id])
        for bad in ["12345", "12345678901234567", "ghijkl", "one two", ""] {
            #expect { try alice.messages(referencedBy: bad) } throws: { ($0 as? ConversationError)?.code == .invalidReference }
        }
    }

    @Test func closeReleasesTheFolderLock() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice")
        try await alice.sync()
        let twin = try ConversationStore(directory: fixture.storePath("alice"), backend: fixture.factory(device: "alice"))
        await #expect { try await twin.sync() } throws: { ($0 as? ConversationError)?.backendError?.code == .deviceInUse }
        alice.close()
        try await twin.sync()
    }

    /// A store on a folder observer reads what others wrote and writes nothing: its own changes
    /// wait in the outbox.
    @Test func aFolderObserverReadsAndWritesNothing() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice")
        // Bob's device published its encryption key once, through the folder as a writer.
        let bob = try await fixture.store("bob")
        try await bob.sync()
        bob.close()
        let sent = try await alice.send("hi", to: "bob")
        try await alice.sync()
        let before = try FileManager.default.subpathsOfDirectory(atPath: fixture.folder).sorted()
        // The same store (bob's device: its keys open what alice shared), now only observing.
        let observer = try ConversationStore(directory: fixture.storePath("bob"), backend: .folderObserver(fixture.folder))
        try await observer.setupLocalSpeaker(identifier: "bob", name: "Bobby")  // a change of its own to hold back
        let report = try await observer.sync()
        #expect(try observer.message(sent.id)?.content == "hi")
        let pending = try observer.pendingChangeCount()
        #expect(report.deferred > 0 && pending > 0, "\(report)")
        // A message sent through an observer is never shown synced: nothing took it.
        let reply = try await observer.send("not sent", to: "alice")
        try await observer.sync()
        #expect(try observer.message(reply.id)?.syncState == .pending)
        #expect(try FileManager.default.subpathsOfDirectory(atPath: fixture.folder).sorted() == before, "nothing written into the folder")
    }

    /// A forged message is quarantined, and the sync says whose records it held back and why.
    @Test func theReportSaysWhoIsHeldBack() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        _ = try await bob.send("hi", to: "alice")
        try await syncAll([alice, bob])
        let conversation = try #require(try alice.existingConversation(with: "bob")?.id)
        let mallory = try FileSystemBackend(root: fixture.folder, device: "mallory", policy: RecordPolicy())
        var forged = Record(id: try RecordID(zone: ZoneName(conversation), name: "m.\(OwnershipRule.identityHash("bob")).ffffffffffffffff-forged"),
                            type: "Message", fields: ["speaker": .string("bob"), "listener": .string("alice"), "content": .string("forged"), "spokenAt": .date(Date())])
        try forged.sign(with: SigningKey.generate(), clock: HybridLogicalClock().now())
        _ = try await mallory.save([forged])
        let lines = Mutex([String]())
        var configuration = StoreConfiguration()
        configuration.logger = Logger(label: "chat", level: .info) { line in lines.withLock { $0.append(line) } }
        let logged = try ConversationStore(directory: fixture.storePath("alice"), backend: fixture.factory(device: "alice"), configuration: configuration)
        alice.close()
        let report = try await logged.sync()
        #expect(report.blocked.map(\.description) == ["bob: signed by a key that does not speak for 'bob'"], "\(report.blocked)")
        #expect(report.blocked.map(\.code) == [.keyConflict] && report.blocked.map(\.subject) == ["bob"])
        #expect(logged.isBackendReachable == true)
        let written = lines.withLock { $0 }
        #expect(written.contains { $0.contains("info chat: synced: pushed") }, "\(written)")
        #expect(written.contains { $0.contains("notice chat: held back: bob: signed by a key") }, "\(written)")
    }

    @Test func reachabilityFollowsTheServer() async throws {
        let fixture = try await ChatFixture(.http)
        let alice = try await fixture.store("alice")
        #expect(alice.isBackendReachable == nil)
        try await alice.sync()
        #expect(alice.isBackendReachable == true)
        await fixture.zoneServer?.stop(timeout: .seconds(1))
        await #expect(throws: ConversationError.self) { try await alice.sync() }
        #expect(alice.isBackendReachable == false)
    }

    /// A failed message goes back into the outbox; a refetched zone comes back whole.
    @Test func retryAndRefetch() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        _ = try await alice.send("one", to: "bob")
        try await syncAll([alice, bob])
        let conversation = try #require(try bob.existingConversation(with: "alice")?.id)
        try await bob.refetch(zone: conversation)
        #expect(try bob.existingConversation(with: "alice") == nil, "forgotten")
        try await bob.sync()
        #expect(try bob.messages(in: conversation).messages.map(\.content) == ["one"], "pulled again whole")
        #expect(try await alice.retryFailedMessages() == 0)
        let stats = try bob.statistics()
        #expect(stats.messages == 1 && stats.lastSyncAt != nil && stats.outbox == 0)
    }

    /// A store opened for inspection reads everything and changes nothing.
    @Test func aStoreOpenedForInspectionChangesNothing() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let sent = try await alice.send("hi", to: "bob")
        try await syncAll([alice, bob])
        alice.close()
        let before = try Data(contentsOf: URL(fileURLWithPath: fixture.storePath("alice") + "/store.sqlite"))
        let inspected = try ConversationStore.inspecting(directory: fixture.storePath("alice"))
        #expect(try inspected.message(sent.id)?.content == "hi")
        #expect(try inspected.statistics().messages == 1)
        await #expect { try await inspected.send("nope", to: "bob") } throws: { ($0 as? ConversationError)?.code == .storeNotWritable }
        await #expect(throws: ConversationError.self) { try await inspected.sync() }
        #expect(try Data(contentsOf: URL(fileURLWithPath: fixture.storePath("alice") + "/store.sqlite")) == before)
        #expect { try ConversationStore.inspecting(directory: fixture.directory.path + "/nobody") } throws: { ($0 as? ConversationError)?.code == .storeNotWritable }
        #expect(!FileManager.default.fileExists(atPath: fixture.directory.path + "/nobody"), "nothing created")
    }
}
