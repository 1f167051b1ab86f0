import ConversationKit
import Foundation
@testable import RecordZone
import StorageTestSupport
import Testing
import TestSupport
@testable import ZoneServer

@Suite struct ConversationStoreTests {
    @Test(arguments: ChatBackend.allCases)
    func offlineSendsOnBothSidesEndInOneConversationInTheSameOrder(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        // Both offline: nothing synced yet, bob unknown to alice and the reverse.
        let first = try await alice.send("Hi Bob", to: "bob")
        #expect(first.syncState == .pending)
        try await alice.send("Are you there?", to: "bob")
        try await bob.send("Hello Alice", to: "alice")
        try await alice.send("Third from alice", to: "bob")
        try await bob.send("Second from bob", to: "alice")
        #expect(try alice.pendingChangeCount() > 0)

        try await syncAll([alice, bob])

        let aliceConversations = try alice.conversations(), bobConversations = try bob.conversations()
        #expect(aliceConversations.count == 1 && bobConversations.count == 1)
        let conversation = try #require(aliceConversations.first)
        #expect(conversation.id == bobConversations.first?.id)
        #expect(conversation.nonLocalSpeaker == "bob" && bobConversations.first?.nonLocalSpeaker == "alice")
        let aliceView = try history(alice, conversation.id, pageSize: 2), bobView = try history(bob, conversation.id, pageSize: 3)
        #expect(aliceView.count == 5)
        #expect(aliceView.map(\.id) == bobView.map(\.id))
        #expect(aliceView.map(\.content) == bobView.map(\.content))
        #expect(aliceView.allSatisfy { $0.syncState == .synced })
        #expect(bobView.allSatisfy { $0.syncState == .synced })
        #expect(try alice.pendingChangeCount() == 0 && bob.pendingChangeCount() == 0)
        // Unread counts: each side has the other's messages unread.
        #expect(try alice.unreadCount(in: conversation.id) == 2)
        #expect(try bob.unreadCount(in: conversation.id) == 3)
        #expect(try bob.totalUnreadCount() == 3)
        #expect(try alice.allKnownSpeakers().map(\.identifier) == ["bob"])
    }

    @Test(arguments: ChatBackend.allCases)
    func bothStartingTheConversationOfflineGivesExactlyOne(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let fromAlice = try await alice.conversation(with: "bob")
        let fromBob = try await bob.conversation(with: "alice")
        #expect(fromAlice.id == fromBob.id)
        try await syncAll([alice, bob])
        for store in [alice, bob] {
            let conversations = try store.conversations()
            #expect(conversations.count == 1)
            #expect(conversations.first?.id == fromAlice.id)
            // Both sides agree on who started it and who joined.
            #expect(Set([conversations.first?.startedBy, conversations.first?.joinedBy]) == Set(["alice", "bob"]))
        }
        #expect(try alice.conversations().first?.startedBy == bob.conversations().first?.startedBy)
        #expect(try alice.existingConversation(with: "bob")?.id == fromAlice.id)
        #expect(try alice.existingConversation(with: "carol") == nil)
    }

    @Test(arguments: ChatBackend.allCases)
    func editsDeletesAndReadReceiptsReachTheOtherSide(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let keep = try await alice.send("first draft", to: "bob")
        let drop = try await alice.send("oops, wrong chat", to: "bob")
        let reply = try await bob.send("ok", to: "alice")
        try await syncAll([alice, bob])
        #expect(try bob.unreadCount(in: keep.id.conversation) == 2)

        let edited = try await alice.edit(keep.id, content: "final text")
        #expect(edited.editedAt != nil && edited.syncState == .pending)
        try await alice.delete(drop.id)
        #expect(try alice.message(drop.id) == nil)
        try await bob.markAsRead(keep.id)
        #expect(try bob.message(keep.id)?.readAt != nil)
        await #expect(throws: ConversationError.self) { try await bob.edit(keep.id, content: "not mine") }
        await #expect(throws: ConversationError.self) { try await alice.markAsRead(keep.id) }  // alice is not the listener
        try await syncAll([alice, bob])

        let bobView = try history(bob, keep.id.conversation)
        #expect(Set(bobView.map(\.content)) == ["final text", "ok"])
        #expect(bobView.first?.editedAt != nil)
        #expect(try bob.message(drop.id) == nil)
        let aliceCopy = try #require(try alice.message(keep.id))
        #expect(aliceCopy.readAt != nil, "alice sees bob's receipt")
        #expect(try alice.message(reply.id)?.readAt == nil)
        #expect(try bob.unreadCount(in: keep.id.conversation) == 0)  // one read, one deleted
        try await alice.markAllAsRead(in: reply.id.conversation)
        #expect(try alice.totalUnreadCount() == 0)
        try await syncAll([alice, bob])
        #expect(try bob.message(reply.id)?.readAt != nil)
    }

    @Test(arguments: ChatBackend.allCases)
    func aTagQueryFindsBobAndNotCarol(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice", tags: ["swift"])
        let bob = try await fixture.store("bob", tags: ["swift", "linux"])
        let carol = try await fixture.store("carol", tags: ["rust"])
        try await syncAll([bob, carol])  // they publish their profiles
        #expect(try alice.allKnownSpeakers().isEmpty)
        let events = alice.events()
        let found = try await alice.speakers(matching: SpeakerQuery(tag: "swift"))
        #expect(await awaitEvents(events) { $0 == .speakerFound("bob") })
        #expect(found.map(\.identifier) == ["bob"])
        #expect(found.first?.name == "Bob" && found.first?.tags == ["linux", "swift"])
        #expect(try alice.allKnownSpeakers().map(\.identifier) == ["bob"])
        #expect(try alice.speaker(fromRef: SpeakerRef(identifier: "bob"))?.name == "Bob")
        #expect(try await alice.speakers(matching: SpeakerQuery(tag: "nobody")).isEmpty)
        // A profile update reaches those who know the speaker.
        try await bob.updateLocalSpeaker(name: "Robert", tags: ["swift"])
        try await bob.sync()
        try await alice.sync()
        #expect(try alice.speaker(fromRef: SpeakerRef(identifier: "bob"))?.name == "Robert")
        #expect(try alice.localSpeaker?.isLocalSpeaker == true)
    }

    @Test func aRecordAlteredInTheSharedFolderIsQuarantinedAndNeverShown() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await bob.send("pay 10 to carol", to: "alice")
        try await bob.sync()
        // A hostile folder edits bob's message and rewrites the segment with a valid checksum,
        // under the name its new content calls for.
        let zone = try #require(try bob.conversations().first?.id)
        let generation = "\(fixture.folder)/zones/\(zone)/1"
        let bobsFolder = try #require(try FileManager.default.contentsOfDirectory(atPath: generation).first { $0.hasPrefix("bob-") })
        let folder = generation + "/" + bobsFolder
        var altered = 0
        for name in try FileManager.default.contentsOfDirectory(atPath: folder) where name.hasSuffix(".seg") {
            let path = folder + "/" + name
            let data = try Data(contentsOf: URL(fileURLWithPath: path))
            // The content is sealed: a byte of its ciphertext (past the field's key, tag and
            // length, the envelope's version, epoch and nonce) is changed.
            #expect(data.range(of: Data("pay 10".utf8)) == nil, "the folder holds no content in the clear")
            guard let at = data.range(of: Data("sealed".utf8)) else { continue }
            var body = data.prefix(data.count - 32)
            body[at.lowerBound + 60] ^= 0x01
            let forged = body + Sodium.sha256(body)
            let sequence = try #require(Segment.parse(fileName: name)?.sequence)
            try FileManager.default.removeItem(atPath: path)
            try forged.write(to: URL(fileURLWithPath: folder + "/" + Segment.fileName(sequence, digest: Segment.digest(of: forged))))
            altered += 1
        }
        #expect(altered == 1)
        let report = try await alice.sync()
        #expect(report.quarantined == 1)
        let quarantined = try alice.quarantine()
        #expect(quarantined.count == 1)
        #expect(quarantined.first?.reason.contains("signature") == true)
        #expect(try alice.messages(in: zone).messages.isEmpty, "the altered message must not be shown")
        #expect(try alice.totalUnreadCount() == 0)
    }

    @Test(arguments: ChatBackend.allCases)
    func liveEventsAndObservedMessagesFollowChanges(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let conversation = try await alice.conversation(with: "bob")
        #expect(await firstElement(of: alice.observeMessages(in: conversation.id)) { _ in true } == [], "a new observer starts with the current page")
        let observed = alice.observeMessages(in: conversation.id)
        let events = alice.events()
        let sent = try await alice.send("hello", to: "bob")
        try await bob.send("hi alice", to: "alice")
        try await syncAll([bob, alice])
        let seen = Seen()
        #expect(await awaitEvents(events) { event in
            if case .messageAdded(let id) = event, id == sent.id { seen.add = true }
            if case .syncStateChanged(let id) = event, id == sent.id { seen.synced = true }
            return seen.add && seen.synced
        })
        // The observed conversation went from empty, through alice's message, to both, synced.
        let latest = await firstElement(of: observed) { $0.count == 2 && $0.allSatisfy { $0.syncState == .synced && !$0.isWaitingForKey } } ?? []
        #expect(latest.map(\.content).sorted() == ["hello", "hi alice"])
    }

    @Test func aTransientFailureIsRetriedWithBackoffAndNeverDuplicates() async throws {
        let fixture = try await ChatFixture(.memory)
        let clock = ManualClock()
        let flaky = FlakyBackend(fixture.server)
        var configuration = StoreConfiguration()
        configuration.now = { clock.now }
        configuration.random = { 0.5 }  // no jitter: exactly the base delay
        let alice = try ConversationStore(directory: fixture.storePath("alice"), backend: .custom { context in
            flaky.connect(context.policy)
        }, configuration: configuration)
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        let bob = try await fixture.store("bob")
        // Bob's device is on the backend, and alice has looked him up (his encryption key with it).
        try await bob.sync()
        #expect(try await alice.speakerExists("bob"))
        let message = try await alice.send("survives the network", to: "bob")

        // The save reaches the backend, then the answer is lost: the push must be retried.
        flaky.mode = .loseAnswer
        await #expect(throws: ConversationError.self) { try await alice.sync() }
        #expect(try alice.message(message.id)?.syncState == .pending)
        flaky.mode = .healthy
        // Not yet due: the retry waits for its backoff.
        let early = try await alice.sync()
        #expect(early.pushed == 0)
        clock.advance(1)
        let retried = try await alice.sync()
        #expect(retried.pushed >= 1)
        #expect(try alice.message(message.id)?.syncState == .synced)
        try await bob.sync()
        let conversation = try #require(try bob.conversations().first)
        #expect(try history(bob, conversation.id).map(\.content) == ["survives the network"])
    }

    /// The outbox references the stored version: when a newer version of the same record comes
    /// from the person's other store before the queued one went out, nothing of the older one is
    /// pushed, and the message shows the newer text, synced, on both sides.
    @Test func aQueuedVersionThatAPulledOneReplacedIsNotPushed() async throws {
        let fixture = try await ChatFixture(.memory)
        let flaky = FlakyBackend(fixture.server)
        var configuration = StoreConfiguration()
        configuration.retryBaseDelay = 0  // a deferred change is due again at once
        let laptop = try ConversationStore(directory: fixture.storePath("alice"), backend: .custom { context in
            flaky.connect(context.policy)
        }, configuration: configuration)
        try await laptop.setupLocalSpeaker(identifier: "alice", name: "Alice")
        let bob = try await fixture.store("bob")
        try await bob.sync()
        #expect(try await laptop.speakerExists("bob"))
        let sent = try await laptop.send("first", to: "bob")
        try await laptop.sync()
        // The same person's other store: her key, rebuilt from the backend.
        let other = fixture.directory.path + "/alice-other"
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: fixture.storePath("alice") + "/speaker.key", toPath: other + "/speaker.key")
        let phone = try await ConversationStore.rebuild(directory: other, identifier: "alice", backend: fixture.factory(device: "phone"))

        // The laptop's edit waits (the server defers message saves); the phone's, later, goes out.
        flaky.mode = .deferMessages
        _ = try await laptop.edit(sent.id, content: "from the laptop")
        _ = try await phone.edit(sent.id, content: "from the phone")
        try await phone.sync()
        let deferred = try await laptop.sync()
        #expect(deferred.deferred == 1)
        #expect(try laptop.message(sent.id)?.content == "from the phone", "the pull brought the newer version")
        // The queued version now names a clock the records no longer hold: it leaves the queue.
        let waiting = try laptop.outbox().map { "\($0.recordType) \($0.name)" }
        #expect(!waiting.contains { $0.hasPrefix("Message ") }, "\(waiting)")

        flaky.mode = .healthy
        let settled = try await laptop.sync()
        #expect(settled.pushed == 0)
        #expect(try laptop.outbox().isEmpty)
        #expect(try laptop.message(sent.id)?.syncState == .synced)
        try await bob.sync()
        #expect(try bob.message(sent.id)?.content == "from the phone")
        #expect(try history(laptop, sent.id.conversation).map(\.content) == ["from the phone"])
    }

    @Test func aPermanentRejectionMarksTheMessageFailedWithTheReason() async throws {
        let fixture = try await ChatFixture(.memory)
        let flaky = FlakyBackend(fixture.server)
        let alice = try ConversationStore(directory: fixture.storePath("alice"), backend: .custom { flaky.connect($0.policy) })
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        try await alice.sync()
        let message = try await alice.send("refused", to: "bob")
        flaky.mode = .refuseMessages
        let report = try await alice.sync()
        #expect(report.failed == 1)
        guard case .failed(let failure) = try alice.message(message.id)?.syncState else {
            Issue.record("message is not marked failed")
            return
        }
        #expect(failure.code == .refused && failure.backendCode == .notAuthorized && failure.message.contains("notAuthorized"))
        #expect(try alice.pendingChangeCount() == 0)
    }

    /// The server's data restored from an earlier copy: a message acknowledged after the
    /// restore takes a number bob's token had passed; bob still gets it (his token expires and
    /// the zone is fetched again), with what he already had.
    @Test(arguments: ChatBackend.allCases.filter(\.isServer))
    func aMessageSentAfterTheServerWasRestoredReachesAReaderAheadOfIt(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        for text in ["one", "two", "three"] { _ = try await alice.send(text, to: "bob") }
        try await syncAll([alice, bob])
        let zone = try ZoneName(try #require(try alice.conversations().first?.id))
        #expect(try history(bob, zone.rawValue).count == 3)
        // The restore: the conversation as it stood after its first message.
        try await #require(fixture.zoneServer).storage.rewind(zone, to: 1)
        let late = try await alice.send("after the restore", to: "bob")
        try await alice.sync()
        #expect(try alice.messages(in: late.id.conversation).messages.first { $0.id == late.id }?.syncState == .synced)
        try await bob.sync()
        #expect(try history(bob, zone.rawValue).map(\.content).contains("after the restore"))
    }

    @Test(arguments: ChatBackend.allCases)
    func aRecreatedZoneIsFetchedAgainFromTheStart(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await bob.send("before", to: "alice")
        try await syncAll([bob, alice])
        let zone = try ZoneName(try #require(try alice.conversations().first?.id))
        // Someone deletes and recreates the zone; bob writes into the new incarnation.
        let admin: any RecordZoneBackend = switch kind {
        case .memory: fixture.server
        case .filesystem: try FileSystemBackend(root: fixture.folder, device: "admin")
        case .http, .postgres: try #require(fixture.zoneServer).storage
        }
        try await admin.deleteZone(zone)
        try await admin.createZone(zone)
        try await bob.send("after", to: "alice")
        try await bob.clearAllCachedData()
        try await bob.sync()
        let report = try await alice.sync()
        #expect(report.refetchedZones == 1)
        // What the old incarnation held is gone with it; the new one is there.
        #expect(try history(alice, zone.rawValue).map(\.content) == ["after"])
    }

    @Test(arguments: ChatBackend.allCases)
    func clearingTheCacheKeepsUnsentMessagesAndSyncBringsTheRestBack(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        let one = try await bob.send("one", to: "alice")
        try await bob.send("two", to: "alice")
        try await syncAll([bob, alice])
        try await bob.react(to: one.id, with: "👍")
        try await syncAll([bob, alice])
        let zone = try #require(try alice.conversations().first?.id)
        let unsent = try await alice.send("not sent yet", to: "bob")
        try await alice.react(to: one.id, with: "🎉")  // unsent too
        try await alice.clearAllCachedData()
        #expect(try history(alice, zone).map(\.content) == ["not sent yet"])
        #expect(try alice.message(unsent.id)?.syncState == .pending)
        try await alice.sync()
        let restored = try history(alice, zone).map(\.content)
        #expect(restored.count == 3 && Set(restored) == ["one", "two", "not sent yet"])
        #expect(restored.firstIndex(of: "one")! < restored.firstIndex(of: "two")!, "one sender's messages keep their order")
        // Bob's reaction came back with its record; alice's own, unsent then, was kept and pushed.
        #expect(Set(try alice.reactions(to: one.id).map { "\($0.reactor) \($0.emoji)" }) == ["bob 👍", "alice 🎉"])
        #expect(try alice.pendingChangeCount() == 0)
    }
}

final class Seen: @unchecked Sendable {
    var add = false
    var synced = false
}

/// A backend in front of a real in-memory backend that can lose answers or refuse messages:
/// the one stand-in in these tests, since a network cannot be made to fail on cue here.
final class FlakyBackend: @unchecked Sendable {
    enum Mode { case healthy, loseAnswer, refuseMessages, deferMessages }
    private let lock = NSLock()
    private var current = Mode.healthy
    let server: InMemoryBackend

    init(_ server: InMemoryBackend) { self.server = server }

    var mode: Mode {
        get { lock.withLock { current } }
        set { lock.withLock { current = newValue } }
    }

    func connect(_ policy: RecordPolicy) -> any RecordZoneBackend {
        Connection(inner: server.connection(policy: policy), owner: self)
    }

    struct Connection: RecordZoneBackend {
        let inner: InMemoryConnection
        let owner: FlakyBackend

        func save(_ records: [Record], policy: SavePolicy) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
            switch owner.mode {
            case .healthy: return try await inner.save(records, policy: policy)
            case .loseAnswer:
                _ = try await inner.save(records, policy: policy)
                throw RecordZoneError(.networkUnavailable, "connection reset before the answer")
            case .refuseMessages, .deferMessages:
                let results = try await inner.save(records.filter { $0.recordType != "Message" }, policy: policy)
                var iterator = results.makeIterator()
                let failure = owner.mode == .refuseMessages ? RecordZoneError.Code.notAuthorized : .serviceUnavailable
                return records.map { record in
                    record.recordType == "Message"
                        ? .failure(RecordZoneError(failure, "refused by the server", recordID: record.id))
                        : iterator.next() ?? .failure(RecordZoneError(.internalError, "missing result"))
                }
            }
        }
        func createZone(_ zone: ZoneName) async throws(RecordZoneError) { try await inner.createZone(zone) }
        func zones() async throws(RecordZoneError) -> [ZoneName] { try await inner.zones() }
        func deleteZone(_ zone: ZoneName) async throws(RecordZoneError) { try await inner.deleteZone(zone) }
        func fetchDatabaseChanges(since token: ChangeToken?) async throws(RecordZoneError) -> DatabaseChanges {
            try await inner.fetchDatabaseChanges(since: token)
        }
        func fetchChanges(in zone: ZoneName, since token: ChangeToken?, limit: Int) async throws(RecordZoneError) -> ZoneChanges {
            try await inner.fetchChanges(in: zone, since: token, limit: limit)
        }
        func fetch(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] { try await inner.fetch(ids) }
        func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) async throws(RecordZoneError) -> QueryResult {
            try await inner.query(query, cursor: cursor, limit: limit)
        }
        func putAsset(_ data: Data, expected: AssetReference?) async throws(RecordZoneError) -> AssetReference {
            try await inner.putAsset(data, expected: expected)
        }
        func asset(_ reference: AssetReference) async throws(RecordZoneError) -> Data { try await inner.asset(reference) }
        func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
            try await inner.waitForChanges(in: zone, since: token, timeout: timeout)
        }
    }
}
