import ConversationKit
import Foundation
import RecordZone
import SQLiteKit
import Testing
import TestSupport

/// Bad input, identity switching and crashes: clear typed errors, nothing half-written, nothing lost.
@Suite struct StoreRobustnessTests {
    @Test func badInputGetsTypedErrorsAndWritesNothing() async throws {
        let fixture = try await ChatFixture(.memory)
        let store = try ConversationStore(directory: fixture.storePath("alice"), backend: fixture.factory(device: "alice"))
        #expect(await code { try await store.send("hi", to: "bob") } == .noLocalSpeaker)
        #expect(await code { try await store.setupLocalSpeaker(identifier: "", name: "Nobody") } == .invalidIdentifier)
        #expect(await code { try await store.setupLocalSpeaker(identifier: String(repeating: "x", count: 129), name: "Long") } == .invalidIdentifier)
        #expect(await code { try await store.setupLocalSpeaker(identifier: "_system", name: "Reserved") } == .invalidIdentifier)
        #expect(await code { try await store.setupLocalSpeaker(identifier: "tab\there", name: "Tab") } == .invalidIdentifier)
        try await store.setupLocalSpeaker(identifier: "alice", name: "Alice")
        let pending = try store.pendingChangeCount()
        #expect(await code { try await store.send(String(repeating: "x", count: 64 * 1024 + 1), to: "bob") } == .contentTooLarge)
        #expect(await code { try await store.send("", to: "bob") } == .emptyContent)
        #expect(await code { try await store.send("hi", to: "") } == .invalidIdentifier)
        #expect(await code { try await store.send("hi", to: "alice") } == .invalidIdentifier)
        #expect(await code { _ = try store.unreadCount(in: "c-0000000000000000-0000000000000000") } == .unknownConversation)
        #expect(await code { try await store.markAsRead(MessageID(conversation: "c-x", name: "nope")) } == .unknownMessage)
        #expect(await code { try await store.delete(MessageID(conversation: "c-x", name: "nope")) } == .unknownMessage)
        // Nothing was half-written: no conversation, no outbox entry.
        #expect(try store.conversations().isEmpty)
        #expect(try store.pendingChangeCount() == pending)
        // Exactly 64 KiB is fine.
        let big = try await store.send(String(repeating: "y", count: 64 * 1024), to: "bob")
        #expect(big.content.utf8.count == 64 * 1024)
    }

    @Test func aStoreDirectoryThatCannotBeCreatedIsATypedError() async throws {
        let dir = try TemporaryDirectory("blocked")
        let fixture = try await ChatFixture(.memory)
        // A file where the directory should go: it cannot be created, whoever runs the test.
        let blocker = dir.path + "/file"
        try Data("x".utf8).write(to: URL(fileURLWithPath: blocker))
        #expect(await code { _ = try ConversationStore(directory: blocker + "/store", backend: fixture.factory(device: "a")) } == .storeNotWritable)
        #expect(await code { _ = try ConversationStore(directory: blocker, backend: fixture.factory(device: "a")) } == .storeNotWritable)
    }

    @Test func aCorruptDatabaseFileIsATypedError() async throws {
        let fixture = try await ChatFixture(.memory)
        let path = fixture.storePath("alice")
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        try Data(repeating: 0x5A, count: 8192).write(to: URL(fileURLWithPath: path + "/store.sqlite"))
        #expect(await code { _ = try ConversationStore(directory: path, backend: fixture.factory(device: "alice")) } == .databaseCorrupt)
    }

    @Test func switchingIdentityNeverDropsAnotherSpeakersUnsentMessages() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        let unsent = try await alice.send("still in the outbox", to: "bob")
        #expect(await code { try await alice.setupLocalSpeaker(identifier: "bob", name: "Bob") } == .storeBelongsToAnotherSpeaker)
        // Reopening the directory is still alice's store, with her message.
        let reopened = try ConversationStore(directory: fixture.storePath("alice"), backend: fixture.factory(device: "alice"))
        #expect(reopened.localSpeakerIdentifier == "alice")
        #expect(try reopened.message(unsent.id)?.syncState == .pending)
        #expect(try reopened.pendingChangeCount() == alice.pendingChangeCount())
        // Bob opens his own store beside it.
        let bob = try await fixture.store("bob")
        #expect(try bob.conversations().isEmpty)
        // Or per speaker under one root: each identity gets its own store.
        let root = fixture.directory.path + "/by-speaker"
        let first = try ConversationStore.open(speaker: "alice", in: root, backend: fixture.factory(device: "a"))
        try await first.setupLocalSpeaker(identifier: "alice", name: "Alice")
        try await first.send("from alice's store", to: "bob")
        let second = try ConversationStore.open(speaker: "bob", in: root, backend: fixture.factory(device: "b"))
        #expect(second.localSpeakerIdentifier == nil && second.directory != first.directory)
        #expect(try ConversationStore.open(speaker: "alice", in: root, backend: fixture.factory(device: "a")).pendingChangeCount() == first.pendingChangeCount())
    }

    @Test func theKeyAndPinsSurviveAReopen() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await bob.send("hello", to: "alice")
        try await syncAll([bob, alice])
        let key = try #require(alice.localPublicKey)
        let reopened = try ConversationStore(directory: fixture.storePath("alice"), backend: .folder(fixture.folder, device: "alice-2"))
        #expect(reopened.localPublicKey == key)
        let mode = try #require(FileManager.default.attributesOfItem(atPath: fixture.storePath("alice") + "/speaker.key")[.posixPermissions] as? Int)
        #expect(mode & 0o077 == 0)
        #expect(try reopened.totalUnreadCount() == 1)
    }

    @Test func aSyncKilledMidPullAndRunAgainEndsWithEveryMessageExactlyOnce() async throws {
        let fixture = try await ChatFixture(.filesystem)
        // Alice's device is on the folder, and bob looked her up: his messages are shared with her.
        let first = try await fixture.store("alice")
        try await first.sync()
        first.close()
        let bob = try await fixture.store("bob")
        #expect(try await bob.speakerExists("alice"))
        let count = 1500
        for i in 0..<count { try await bob.send("message \(i)", to: "alice") }
        try await bob.sync()
        // Everything a pull from scratch reads: the messages, and the member, profile, device key
        // and key share records beside them.
        let raw = try FileSystemBackend(root: fixture.folder, device: nil, policy: ConversationStore.recordPolicy())
        var everything = 0
        for zone in try await raw.zones() {
            var token: ChangeToken?
            while true {
                let page = try await raw.fetchChanges(in: zone, since: token, limit: 500)
                everything += page.records.count
                token = page.token
                if !page.moreComing { break }
            }
        }

        let tool = try builtProduct("convkit-store-sync")
        let arguments = ["--store", fixture.storePath("alice"), "--folder", fixture.folder, "--device", "alice", "--identifier", "alice", "--page-size", "1"]
        // The child sends itself SIGKILL once 40 messages are applied, while its sync goes on.
        let killed = try ChildProcess(tool, arguments + ["--kill-self-after", "40"])
        let status = await killed.wait()
        #expect(killed.wasKilledBySignal && status == SIGKILL, "\(killed.standardError)")
        let beforeKill = killed.lines.filter { $0.hasPrefix("added") }.count
        #expect(beforeKill >= 40)
        #expect(!killed.standardOutput.contains("done"), "the sync finished before it was killed")

        let second = try ChildProcess(tool, arguments)
        #expect(await second.wait() == 0, "\(second.standardError)")
        // The second run resumed from the stored token: it pulled less than everything.
        let done = try #require(second.lines.first { $0.hasPrefix("done ") })
        let pulled = try #require(done.split(separator: " ").first { $0.hasPrefix("pulled=") }.flatMap { Int($0.dropFirst(7)) })
        #expect(pulled > 0 && pulled <= everything - beforeKill, "pulled \(pulled) of \(everything), \(beforeKill) before the kill")

        let alice = try ConversationStore(directory: fixture.storePath("alice"), backend: .folder(fixture.folder, device: "alice"))
        let conversation = try #require(try alice.conversations().first)
        let messages = try history(alice, conversation.id, pageSize: 100)
        #expect(messages.count == count)
        #expect(Set(messages.map(\.id)).count == count)
        #expect(Set(messages.map(\.content)) == Set((0..<count).map { "message \($0)" }))
        #expect(try alice.unreadCount(in: conversation.id) == count)
        // A further sync finds nothing new.
        let again = try await alice.sync()
        #expect(again.pulled == 0)
    }

    /// Every version a store holds verifies: none left with the blank signature a grouped
    /// write stores until its signature, made on another core, is written before the commit.
    static func expectEverySignatureVerifies(_ path: String, _ comment: Comment? = nil) throws {
        let database = try Database(path: path, readOnly: true)
        let versions = try database.rows("SELECT record FROM ck_records") { $0.blob(0) }
        let unverified = versions.filter { bytes in !((try? Record(canonical: bytes))?.hasValidSignature() ?? false) }
        #expect(!versions.isEmpty && unverified.isEmpty, "\(unverified.count) of \(versions.count) versions do not verify. \(comment?.description ?? "")")
    }

    /// Twenty sends at once share commits (their signatures made beside the writer): each is
    /// stored signed, pushed, accepted by the server (which checks every signature) and read by
    /// the other side.
    @Test func concurrentSendsAreSignedPushedAndRead() async throws {
        let fixture = try await ChatFixture(.http)
        let alice = try await fixture.store("alice")
        try await alice.sync()
        let bob = try await fixture.store("bob")
        #expect(try await bob.speakerExists("alice"))
        let texts = (1...20).map { "at once \($0)" }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for text in texts { group.addTask { try await bob.send(text, to: "alice") } }
            try await group.waitForAll()
        }
        try Self.expectEverySignatureVerifies(fixture.storePath("bob") + "/store.sqlite")
        #expect(try await bob.sync().pushed >= texts.count)
        try await alice.sync()
        let conversation = try #require(try alice.conversations().first)
        #expect(Set(try history(alice, conversation.id).map(\.content)) == Set(texts))
    }

    /// Rounds of the kill soak: CONVKIT_KILL_SOAK_ROUNDS for the long form.
    static var killSoakRounds: Int { ProcessInfo.processInfo.environment["CONVKIT_KILL_SOAK_ROUNDS"].flatMap(Int.init) ?? 3 }

    /// Group commit: 20 callers send at once in a child process (their sends share commits),
    /// which is killed with SIGKILL at a random point after some acknowledgements; every send
    /// that returned is in the store when it opens again, round after round.
    @Test func concurrentSendsKilledRightAfterTheirAcknowledgementLoseNothing() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice")
        try await alice.sync()
        alice.close()
        let bob = try await fixture.store("bob")
        #expect(try await bob.speakerExists("alice"))
        bob.close()
        let tool = try builtProduct("convkit-store-sync")
        var generator = SystemRandomNumberGenerator()
        var acknowledged = Set<String>()
        for round in 0..<Self.killSoakRounds {
            let child = try ChildProcess(tool, ["--store", fixture.storePath("bob"), "--folder", fixture.folder, "--device", "bob", "--identifier", "bob",
                                                "--send-to", "alice", "--senders", "20", "--count", "1000000", "--prefix", "r\(round)"])
            let threshold = Int.random(in: 20...120, using: &generator)
            // (It prints "added" lines too: the store's events.)
            let gotSome = await child.waitUntil { $0.lines.filter { $0.hasPrefix("sent ") }.count >= threshold }
            #expect(gotSome, "round \(round): \(child.standardError)")
            child.kill(SIGKILL)
            _ = await child.wait()
            #expect(child.wasKilledBySignal, "round \(round) ended on its own: \(child.standardError)")
            let sent = child.lines.compactMap { $0.hasPrefix("sent ") ? String($0.dropFirst(5)) : nil }
            #expect(sent.count >= threshold)
            acknowledged.formUnion(sent)

            let reopened = try ConversationStore(directory: fixture.storePath("bob"), backend: .folder(fixture.folder, device: "bob"))
            let conversation = try #require(try reopened.conversations().first)
            let held = Set(try history(reopened, conversation.id, pageSize: 500).map(\.id.name))
            let lost = acknowledged.subtracting(held).count, queued = try reopened.outbox().count
            #expect(lost == 0, "round \(round): lost \(lost) of \(acknowledged.count) acknowledged sends")
            #expect(queued >= acknowledged.count, "round \(round): every acknowledged send waits in the outbox")
            reopened.close()
            let database = try Database(path: fixture.storePath("bob") + "/store.sqlite", readOnly: true)
            #expect(try database.first("PRAGMA integrity_check") { $0.text(0) } == "ok")
            try Self.expectEverySignatureVerifies(fixture.storePath("bob") + "/store.sqlite", "round \(round)")
        }
    }
}
