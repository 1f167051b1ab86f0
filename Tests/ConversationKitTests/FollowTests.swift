import ConversationKit
import Foundation
import Synchronization
@testable import RecordZone
import StorageTestSupport
import Testing
import TestSupport
@testable import ZoneServer

/// A store follows the speakers it knows — the other side of its conversations, those it found
/// by a query — and downloads nothing of anyone else's.
@Suite struct FollowTests {
    /// Counts, by owner, every record a real backend hands the store.
    final class CountingBackend: RecordZoneBackend, @unchecked Sendable {
        let inner: any RecordZoneBackend
        private let lock = NSLock()
        private var seen = [RecordID]()
        init(_ inner: any RecordZoneBackend) { self.inner = inner }

        var received: [RecordID] { lock.withLock { seen } }
        private func count(_ ids: [RecordID]) { lock.withLock { seen += ids } }

        func createZone(_ zone: ZoneName) async throws(RecordZoneError) { try await inner.createZone(zone) }
        func zones() async throws(RecordZoneError) -> [ZoneName] { try await inner.zones() }
        func deleteZone(_ zone: ZoneName) async throws(RecordZoneError) { try await inner.deleteZone(zone) }
        func fetchDatabaseChanges(since token: ChangeToken?) async throws(RecordZoneError) -> DatabaseChanges { try await inner.fetchDatabaseChanges(since: token) }
        func fetchChanges(in zone: ZoneName, since token: ChangeToken?, limit: Int) async throws(RecordZoneError) -> ZoneChanges {
            let page = try await inner.fetchChanges(in: zone, since: token, limit: limit)
            count(page.records.map(\.id) + page.rejected.compactMap(\.recordID))
            return page
        }
        func save(_ records: [Record], policy: SavePolicy) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
            try await inner.save(records, policy: policy)
        }
        func fetch(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Record, RecordZoneError>] {
            let results = try await inner.fetch(ids)
            count(results.compactMap { try? $0.get().id })
            return results
        }
        func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) async throws(RecordZoneError) -> QueryResult {
            let result = try await inner.query(query, cursor: cursor, limit: limit)
            count(result.records.map(\.id))
            return result
        }
        func putAsset(_ data: Data, expected: AssetReference?) async throws(RecordZoneError) -> AssetReference { try await inner.putAsset(data, expected: expected) }
        func asset(_ reference: AssetReference) async throws(RecordZoneError) -> Data { try await inner.asset(reference) }
        func waitForChanges(in zone: ZoneName, since token: ChangeToken?, timeout: Duration) async throws(RecordZoneError) -> Bool {
            try await inner.waitForChanges(in: zone, since: token, timeout: timeout)
        }
    }

    /// A server holds 10,000 other speakers (a profile in each one's zone and in the directory).
    /// Carol's new store, talking with bob and finding three speakers by tag, receives only
    /// records of carol, bob and those three.
    @Test func aNewStoreDownloadsOnlyTheSpeakersItKnows() async throws {
        let fixture = try await ChatFixture(.http)
        let storage = try #require(fixture.zoneServer).storage
        let others = 10_000
        let names = (0..<others).map { "speaker-\($0)" }
        try await storage.createZones(try names.map { try ChatFixture.speakerZone($0) } + [try ZoneName("speakers")])
        let clock = HybridLogicalClock()
        let profiles = try names.enumerated().flatMap { index, name in
            let key = try SigningKey(seed: Sodium.sha256(Data(name.utf8)))
            let tags: [FieldValue] = [.string("group-\(index % 100)")] + (index % 2500 == 7 ? [.string("rare")] : [])
            return try [try ChatFixture.speakerZone(name), try ZoneName("speakers")].map { zone in
                var record = Record(id: try RecordID(zone: zone, name: name), type: "Speaker", fields: ["name": .string(name), "tags": .list(tags)])
                try record.sign(with: key, clock: clock.now())
                return record
            }
        }
        for start in stride(from: 0, to: profiles.count, by: Record.maximumBatchSize) {
            let saved = try await storage.save(Array(profiles[start..<min(start + Record.maximumBatchSize, profiles.count)]), policy: .merge)
            #expect(saved.allSatisfy { (try? $0.get()) != nil })
        }

        let bob = try await fixture.store("bob")
        try await bob.send("hi carol", to: "carol")
        try await bob.sync()

        let url = try #require(fixture.serverURL)
        let counted = Mutex<CountingBackend?>(nil)
        let carol = try ConversationStore(directory: fixture.storePath("carol"), backend: .custom { context in
            let backend = CountingBackend(HTTPBackend(url: url, identity: context.identity, key: context.key, policy: context.policy))
            counted.withLock { $0 = backend }
            return backend
        })
        try await carol.setupLocalSpeaker(identifier: "carol", name: "Carol")
        try await carol.sync()
        let found = try await carol.speakers(matching: SpeakerQuery(tag: "rare"))
        #expect(found.map(\.identifier) == ["speaker-2507", "speaker-5007", "speaker-7", "speaker-7507"])
        // Bob wrote before carol's device existed: he shares his key with it once he has seen it.
        try await bob.sync()
        try await carol.sync()

        let conversation = try #require(try carol.existingConversation(with: "bob"))
        #expect(try carol.messages(in: conversation.id).messages.map(\.content) == ["hi carol"])
        #expect(try carol.speaker(fromRef: SpeakerRef(identifier: "speaker-7"))?.trust == .firstUse)
        let received = try #require(counted.withLock { $0 }).received
        let known = Set(["carol", "bob"] + found.map(\.identifier))
        // A record in a speaker's own zone is that speaker's (a profile, a device key).
        let owners = received.map { id in
            id.zone.rawValue.hasPrefix("c-") ? "conversation"
                : known.first { ChatSchema.isSpeakerZone(id.zone) && id.zone.rawValue == "s-" + OwnershipRule.identityHash($0) } ?? id.name
        }
        #expect(Set(owners).subtracting(known + ["conversation"]).isEmpty, "records of speakers carol does not know: \(Set(owners).subtracting(known))")
        // Carol's own profile and device key back; bob's profile and device key, his member
        // record, message and its key shares (to his own device, then to carol's); the four
        // found, from the directory and then from their own zones; her own Delivery record for
        // bob's message. Of 20,000 profiles: 17 records.
        #expect(received.count == 17, "carol received \(received.map(\.description))")
    }
}
