import ConversationKit
import Foundation
import PostgresKit
import RecordZone
import SQLiteKit
import Testing
import TestSupport
@testable import ZoneServer

/// Admission decides, the transaction commits, then memory changes: a key pin is stored with the
/// records that made it, or not at all, in memory and on disk — on SQLite and on PostgreSQL.
@Suite struct PinAdmissionTests {
    /// A storage, and how to open it again (as after a restart: the pins read from disk).
    struct Opened {
        let storage: any ZoneStorage
        let reopen: @Sendable () async throws -> any ZoneStorage
        /// Makes the next insert of a record named `name` fail inside the save's transaction.
        let failInserts: @Sendable (String) async throws -> Void
    }

    static func open(_ kind: String) async throws -> (Opened, TemporaryDirectory) {
        let directory = try TemporaryDirectory("pins")
        if kind == "postgres" {
            let database = try await SharedPostgres.freshDatabase()
            let open: @Sendable () async throws -> any ZoneStorage = {
                try await PostgresZoneStorage(conninfo: database, poolSize: 2, policy: ConversationStore.recordPolicy())
            }
            return (Opened(storage: try await open(), reopen: open, failInserts: { name in
                let db = try PostgresConnection(database)
                try db.executeScript("""
                    CREATE FUNCTION ck_test_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$;
                    CREATE TRIGGER ck_test_fail BEFORE INSERT ON ck_records FOR EACH ROW WHEN (NEW.name LIKE '%\(name)') EXECUTE FUNCTION ck_test_fail();
                    """)
            }), directory)
        }
        let path = directory.path
        let open: @Sendable () async throws -> any ZoneStorage = { try SQLiteZoneStorage(directory: path, policy: ConversationStore.recordPolicy()) }
        return (Opened(storage: try await open(), reopen: open, failInserts: { name in
            let db = try Database(path: path + "/zones.sqlite")
            try db.execute("CREATE TRIGGER ck_test_fail BEFORE INSERT ON records WHEN NEW.name LIKE '%\(name)' BEGIN SELECT RAISE(ABORT, 'injected failure'); END;")
        }), directory)
    }

    static let erin = Keys.key(0x41), frank = Keys.key(0x42)

    /// A record refused after admission (its zone is missing; `ifServerRecordUnchanged` fails)
    /// leaves no pin; a concurrent save of another identity persists only its own.
    @Test(arguments: QueryIndexTests.storages)
    func aRecordRefusedAfterAdmissionLeavesNoPinAndConcurrentSavesKeepOnlyTheirOwn(_ kind: String) async throws {
        let (opened, directory) = try await Self.open(kind)
        _ = directory
        let storage = opened.storage
        let zone = try conversationZone("erin", "frank")
        try await storage.createZone(zone)
        let missing = try conversationZone("frank", "gina")
        async let erinSaved = storage.save([try message(zone, "e1", from: "erin", to: "frank", key: Self.erin)], policy: .merge)
        async let frankRefused = storage.save([try message(missing, "f1", from: "frank", to: "gina", key: Self.frank)], policy: .merge)
        let (erinResults, frankResults) = try await (erinSaved, frankRefused)
        #expect((try? erinResults[0].get()) != nil)
        guard case .failure(let error) = frankResults[0] else { Issue.record("a record in a missing zone was stored"); return }
        #expect(error.code == .zoneNotFound)
        // ifServerRecordUnchanged with a change tag the server never gave.
        var unchanged = try message(zone, "g1", from: "gina", to: "erin", key: Keys.key(0x43))
        unchanged.serverMetadata = ServerMetadata(changeTag: "999")
        guard case .failure(let changed) = try await storage.save([unchanged], policy: .ifServerRecordUnchanged)[0] else {
            Issue.record("a record whose server version changed was stored"); return
        }
        #expect(changed.code == .serverRecordChanged)

        #expect(storage.policy.pins.chain(for: "erin")?.current == Self.erin.publicKey)
        #expect(storage.policy.pins.chain(for: "frank") == nil, "a refused record's pin is in memory")
        #expect(storage.policy.pins.chain(for: "gina") == nil, "a refused record's pin is in memory")
        // One more save, which in the write-behind days persisted whatever was pending.
        _ = try await storage.save([try message(zone, "e2", from: "erin", to: "frank", key: Self.erin)], policy: .merge)
        let reopened = try await opened.reopen()
        #expect(reopened.policy.pins.chain(for: "erin")?.current == Self.erin.publicKey)
        #expect(reopened.policy.pins.chain(for: "frank") == nil, "a refused record's pin is on disk")
        #expect(reopened.policy.pins.chain(for: "gina") == nil, "a refused record's pin is on disk")
    }

    /// A save whose transaction fails after admission (as a crash before the commit would
    /// leave it) leaves neither the record nor its pin, in memory or on disk.
    @Test(arguments: QueryIndexTests.storages)
    func aTransactionThatFailsAfterAdmissionLeavesNeitherRecordNorPin(_ kind: String) async throws {
        let (opened, directory) = try await Self.open(kind)
        _ = directory
        let storage = opened.storage
        let zone = try conversationZone("erin", "frank")
        try await storage.createZone(zone)
        try await opened.failInserts("boom")
        await #expect(throws: RecordZoneError.self) { try await storage.save([try message(zone, "boom", from: "erin", to: "frank", key: Self.erin)], policy: .merge) }
        #expect(storage.policy.pins.chain(for: "erin") == nil, "the failed save's pin is in memory")
        let reopened = try await opened.reopen()
        #expect(reopened.policy.pins.chain(for: "erin") == nil, "the failed save's pin is on disk")
        #expect(try await reopened.fetchChanges(in: zone, since: nil, limit: 10).records.isEmpty)
    }

    /// A version a revoked device saved before the revocation reached the server (a far-future
    /// clock, over its owner's message) wins no merge once the revocation is stored: readers
    /// refuse it, so the owner's own version, saved again with an ordinary clock, replaces it.
    @Test(arguments: QueryIndexTests.storages)
    func aVersionARevocationInvalidatedWinsNoMerge(_ kind: String) async throws {
        let (opened, directory) = try await Self.open(kind)
        _ = directory
        let storage = opened.storage
        let zone = try conversationZone("erin", "frank")
        let own = try ZoneName("s-" + OwnershipRule.identityHash("erin"))
        try await storage.createZone(zone)
        try await storage.createZone(own)
        let laptop = Keys.key(0x44)
        let clock = HybridLogicalClock()
        let expires = RecordClock(milliseconds: UInt64((Date().timeIntervalSince1970 + 600) * 1000), counter: 0)
        let certificate = try DeviceCertificate.record(code: LinkCode.issue(identity: "erin", identityKey: Self.erin, expires: expires), device: laptop,
                                                       label: "laptop", zone: own, clock: clock.now())
        func version(_ text: String, _ key: SigningKey, _ at: RecordClock) throws -> Record {
            var record = try message(zone, "x", from: "erin", to: "frank", key: key, text: text)
            try record.sign(with: key, clock: at)
            return record
        }
        let original = try version("original", Self.erin, clock.now())
        for result in try await storage.save([original, certificate], policy: .merge) { _ = try result.get() }
        let revokedAfter = clock.now()
        let stolen = try version("the thief's", laptop, RecordClock(milliseconds: revokedAfter.milliseconds + 3_600_000, counter: 0))
        #expect(try await storage.save([stolen], policy: .merge)[0].get().signature == stolen.signature, "stored before the revocation")
        let revocation = try DeviceRevocation.record(identity: "erin", device: laptop.publicKey, revokedAfter: revokedAfter, zone: own,
                                                     identityKey: Self.erin, clock: clock.now())
        _ = try await storage.save([revocation], policy: .merge)[0].get()

        let restated = try version("original", Self.erin, clock.now())
        #expect(restated.clock < stolen.clock)
        let saved = try await storage.save([restated], policy: .merge)[0].get()
        #expect(saved.signature == restated.signature, "\(kind): the revoked device's version won the merge")
        let held = try await storage.fetch([restated.id])[0].get()
        #expect(held.signature == restated.signature)
    }
}
