import Foundation
import Testing
import TestSupport
@testable import RecordZone

/// The contract every backend keeps. Each test runs once per ``BackendKind``; a new backend
/// joins by adding a case to the fixture, not by copying tests.
@Suite struct BackendConformanceTests {
    let clock = HybridLogicalClock()

    @Test(arguments: BackendKind.allCases)
    func pagingWithSmallLimitsReturnsEveryChangeExactlyOnce(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let z = try zone("paging")
        try await backend.createZone(z)
        var expected = [RecordID: Record]()
        for batch in 0..<5 {
            let records = try (0..<7).map { try signed(z, "r\(batch * 7 + $0)", fields: ["n": .int(Int64($0))], clock: clock.now()) }
            for record in try await saveAll(backend, records) { expected[record.id] = record }
        }
        // Update a few: a record's later version is a change too.
        for name in ["r0", "r9", "r30"] {
            let record = try signed(z, name, fields: ["n": .int(-1)], clock: clock.now())
            expected[record.id] = try await saveAll(backend, [record])[0]
        }
        for limit in [1, 3, 8] {
            let all = try await fetchAll(backend, z, limit: limit)
            let versions = all.records.map { "\($0.id)@\($0.clock)" }
            #expect(Set(versions).count == versions.count, "a version came twice with limit \(limit)")
            var merged = [RecordID: Record]()
            for record in all.records { MergeRule.merge(record, into: &merged) }
            #expect(merged.count == 35)
            #expect(merged.keys.allSatisfy { merged[$0] == expected[$0] })
            #expect(all.rejected.isEmpty)
            let after = try await backend.fetchChanges(in: z, since: all.token, limit: limit)
            #expect(after.records.isEmpty && !after.moreComing)
        }
    }

    @Test(arguments: BackendKind.allCases)
    func resumesFromAStoredToken(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let z = try zone("resume")
        try await backend.createZone(z)
        try await saveAll(backend, try (0..<10).map { try signed(z, "a\($0)", clock: clock.now()) })
        let first = try await fetchAll(backend, z, limit: 4)
        // The token survives being stored as text.
        let stored = try #require(ChangeToken(base64: first.token.base64))
        try await saveAll(backend, try (0..<5).map { try signed(z, "b\($0)", clock: clock.now()) })
        let second = try await fetchAll(backend, z, since: stored, limit: 2)
        #expect(Set(second.records.map(\.id.name)) == Set((0..<5).map { "b\($0)" }))
        #expect(second.records.count == 5)
    }

    @Test(arguments: BackendKind.allCases)
    func recreatedZoneExpiresOldTokens(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let z = try zone("phoenix")
        try await backend.createZone(z)
        try await backend.createZone(z)  // idempotent
        try await saveAll(backend, [try signed(z, "old", clock: clock.now())])
        let token = try await fetchAll(backend, z).token
        let database = try await backend.fetchDatabaseChanges(since: nil)
        #expect(database.changedZones == [z])

        try await backend.deleteZone(z)
        #expect(try await backend.zones().isEmpty)
        await #expect { try await backend.fetchChanges(in: z, since: token, limit: 10) } throws: {
            ($0 as? RecordZoneError)?.code == .zoneNotFound
        }
        let afterDelete = try await backend.fetchDatabaseChanges(since: database.token)
        #expect(afterDelete.deletedZones == [z])

        try await backend.createZone(z)
        await #expect { try await backend.fetchChanges(in: z, since: token, limit: 10) } throws: {
            ($0 as? RecordZoneError)?.code == .changeTokenExpired
        }
        let fresh = try await fetchAll(backend, z)
        #expect(fresh.records.isEmpty, "records of the deleted incarnation came back")
        // A token for another zone is refused, and garbage is a typed error.
        let other = try zone("other")
        try await backend.createZone(other)
        await #expect(throws: RecordZoneError.self) { try await backend.fetchChanges(in: other, since: fresh.token, limit: 10) }
        await #expect(throws: RecordZoneError.self) {
            try await backend.fetchChanges(in: other, since: ChangeToken(data: Data([1, 2, 3])), limit: 10)
        }
    }

    @Test(arguments: BackendKind.allCases)
    func databaseFeedNamesOnlyTheZonesThatChanged(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let a = try zone("a"), b = try zone("b")
        try await backend.createZone(a)
        try await backend.createZone(b)
        let first = try await backend.fetchDatabaseChanges(since: nil)
        #expect(Set(first.changedZones) == [a, b])
        // A PostgreSQL token holds the oldest transaction running in the cluster when it was
        // issued (docs/SERVER.md): while another test's older transaction runs, a feed names a
        // and b again — more, never less. Once settled, a token is past both.
        let start = try await Self.settled(backend, from: first.token)
        try #require(start != nil, "the feed named a zone again for 10 s with nothing changing")
        try await saveAll(backend, [try signed(b, "x", clock: clock.now())])
        let next = try await backend.fetchDatabaseChanges(since: start)
        #expect(next.changedZones == [b])
        #expect(try await Self.settled(backend, from: next.token) != nil, "the feed named a zone again for 10 s with nothing changing")
    }

    /// A token whose feed names nothing, from `token` on, asking again for up to 10 s: nil if none.
    static func settled(_ backend: any RecordZoneBackend, from token: ChangeToken) async throws -> ChangeToken? {
        var token = token
        for _ in 0..<200 {
            let changes = try await backend.fetchDatabaseChanges(since: token)
            if changes.changedZones.isEmpty && changes.deletedZones.isEmpty { return token }
            token = changes.token
            try await Task.sleep(for: .milliseconds(50))
        }
        return nil
    }

    @Test(arguments: BackendKind.allCases)
    func tombstonesDeleteAndAreReportedAsDeletions(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let z = try zone("stones")
        try await backend.createZone(z)
        let original = try note(z, "n1", clock: clock.now())
        try await saveAll(backend, [original, try note(z, "n2", clock: clock.now())])
        let token = try await fetchAll(backend, z).token
        let stone = try fixture.policy.tombstone(for: original, signedWith: Keys.alice, clock: clock.now())
        let result = try await backend.delete([stone])
        #expect(try result[0].get().isDeleted)
        let changes = try await fetchAll(backend, z, since: token)
        #expect(changes.records.count == 1)
        #expect(changes.records.first.map { fixture.policy.check($0) } == .some(nil))
        let page = try await backend.fetchChanges(in: z, since: token, limit: 10)
        #expect(page.deletedRecordIDs == [original.id] && page.changedRecords.isEmpty)
        #expect(try await backend.fetch([original.id])[0].get().isDeleted)
        let live = try await backend.query(RecordQuery(zone: z, recordType: "Note"), cursor: nil, limit: 10)
        #expect(live.records.map(\.id.name) == [noteName("n2")])
        // An older version cannot resurrect it.
        let stale = try await backend.save([original])
        #expect(try stale[0].get().isDeleted)
        // Delete takes tombstones only.
        await #expect(throws: RecordZoneError.self) { try await backend.delete([original]) }
    }

    @Test(arguments: BackendKind.allCases)
    func savesAnswerPerRecordWithTheWinningVersion(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let z = try zone("save")
        try await backend.createZone(z)
        let old = try signed(z, "r", fields: ["v": .int(1)], clock: RecordClock(rawValue: 100))
        let new = try signed(z, "r", fields: ["v": .int(2)], clock: RecordClock(rawValue: 200))
        let missingZone = try signed(try zone("nowhere"), "r", clock: RecordClock(rawValue: 1))
        var forged = try signed(z, "f", clock: RecordClock(rawValue: 1))
        forged["v"] = .int(9)
        let results = try await backend.save([new, old, missingZone, forged])
        #expect(try results[0].get()["v"] == .int(2))
        #expect(try results[1].get()["v"] == .int(2), "an older version must not win")
        #expect(throws: RecordZoneError.self) { try results[2].get() }
        if case .failure(let error) = results[2] { #expect(error.code == .zoneNotFound) }
        if case .failure(let error) = results[3] { #expect(error.code == .invalidSignature) } else { Issue.record("forged record saved") }
        #expect(try await backend.fetch([new.id])[0].get()["v"] == .int(2))
        let unknown = try await backend.fetch([try RecordID(zone: z, name: "nope")])
        if case .failure(let error) = unknown[0] { #expect(error.code == .unknownItem) } else { Issue.record("fetched a record that does not exist") }
        // Limits.
        let tooMany = try (0...Record.maximumBatchSize).map { try signed(z, "m\($0)", clock: RecordClock(rawValue: 1)) }
        await #expect { try await backend.save(tooMany) } throws: { ($0 as? RecordZoneError)?.code == .limitExceeded }
    }

    @Test(arguments: BackendKind.allCases)
    func optimisticSaveFailsWithTheServerRecordWhenItChanged(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let z = try zone("optimistic")
        try await backend.createZone(z)
        let first = try await saveAll(backend, [try signed(z, "r", fields: ["v": .int(1)], clock: clock.now())])[0]
        var edit = try signed(z, "r", fields: ["v": .int(2)], clock: clock.now())
        edit.serverMetadata = first.serverMetadata
        let saved = try await backend.save([edit], policy: .ifServerRecordUnchanged)
        let second = try saved[0].get()
        var stale = try signed(z, "r", fields: ["v": .int(3)], clock: clock.now())
        stale.serverMetadata = first.serverMetadata
        let conflict = try await backend.save([stale], policy: .ifServerRecordUnchanged)
        guard case .failure(let error) = conflict[0] else { Issue.record("stale save succeeded"); return }
        #expect(error.code == .serverRecordChanged)
        #expect(error.serverRecord == second)
    }

    @Test(arguments: BackendKind.allCases)
    func queriesFilterSortAndPage(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let z = try zone("people")
        try await backend.createZone(z)
        var records = [Record]()
        for i in 0..<12 {
            let tags: [FieldValue] = i % 3 == 0 ? [.string("swift"), .string("linux")] : [.string("rust")]
            records.append(try signed(z, String(format: "p%02d", i), type: "Person", fields: [
                "name": .string(String(format: "person %02d", 11 - i)), "age": .int(Int64(20 + i)), "tags": .list(tags),
                "joined": .date(milliseconds: 1_000_000 + Int64(i) * 1000), "city": .string(i % 2 == 0 ? "Oslo" : "Lima"),
            ], clock: clock.now()))
        }
        records.append(try signed(z, "other", type: "Pet", fields: ["name": .string("rex"), "city": .string("Oslo")], clock: clock.now()))
        try await saveAll(backend, records)

        func names(_ query: RecordQuery, limit: Int = 100) async throws -> [String] {
            var all = [String](), cursor: QueryCursor? = nil, pages = 0
            repeat {
                let page = try await backend.query(query, cursor: cursor, limit: limit)
                #expect(page.records.count <= limit)
                all += page.records.map(\.id.name)
                cursor = page.cursor
                pages += 1
            } while cursor != nil && pages < 100
            return all
        }
        let oslo = try await names(RecordQuery(zone: z, recordType: "Person", predicates: [.equals("city", .string("Oslo"))]))
        #expect(oslo == ["p00", "p02", "p04", "p06", "p08", "p10"])
        let swift = try await names(RecordQuery(zone: z, recordType: "Person", predicates: [.contains("tags", .string("swift"))]))
        #expect(swift == ["p00", "p03", "p06", "p09"])
        let ages = try await names(RecordQuery(zone: z, recordType: "Person", predicates: [.range("age", lower: .int(25), upper: .int(27))]))
        #expect(ages == ["p05", "p06", "p07"])
        let dates = try await names(RecordQuery(zone: z, recordType: "Person", predicates: [.range("joined", lower: .date(milliseconds: 1_010_000), upper: nil)]))
        #expect(dates == ["p10", "p11"])
        let byName = try await names(RecordQuery(zone: z, recordType: "Person", sort: [.init("name")]), limit: 5)
        #expect(byName == (0..<12).reversed().map { String(format: "p%02d", $0) })
        let byAgeDescending = try await names(RecordQuery(zone: z, recordType: "Person", predicates: [.equals("city", .string("Lima"))], sort: [.init("age", ascending: false)]), limit: 2)
        #expect(byAgeDescending == ["p11", "p09", "p07", "p05", "p03", "p01"])
        let none = try await names(RecordQuery(zone: z, recordType: "Person", predicates: [.equals("city", .string("Rome"))]))
        #expect(none.isEmpty)
        await #expect(throws: RecordZoneError.self) {
            try await backend.query(RecordQuery(zone: z, recordType: "Person"), cursor: QueryCursor(data: Data([7])), limit: 3)
        }
    }

    @Test(arguments: BackendKind.allCases)
    func assetsRoundTripAndWrongHashesAreRejected(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let bytes = Data((0..<5000).map { UInt8($0 % 251) })
        let reference = try await backend.putAsset(bytes)
        #expect(reference == AssetReference(for: bytes))
        #expect(try await backend.putAsset(bytes) == reference)  // written once, idempotent
        #expect(try await backend.asset(reference) == bytes)
        let wrong = AssetReference(for: Data("something else".utf8))
        await #expect { try await backend.putAsset(bytes, expected: wrong) } throws: { ($0 as? RecordZoneError)?.code == .assetCorrupt }
        await #expect { try await backend.asset(wrong) } throws: { ($0 as? RecordZoneError)?.code == .unknownItem }
    }

    @Test(arguments: BackendKind.allCases)
    func waitForChangesWakesOnAWriteAndTimesOutOtherwise(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let reader = try fixture.backend("reader")
        let writer = try fixture.backend("writer")
        let z = try zone("waiting")
        try await writer.createZone(z)
        let token = try await fetchAll(reader, z).token
        #expect(try await reader.waitForChanges(in: z, since: token, timeout: .milliseconds(50)) == false)
        async let woke = reader.waitForChanges(in: z, since: token, timeout: .seconds(20))
        try await Task.sleep(for: .milliseconds(30))
        let start = ContinuousClock.now
        try await saveAll(writer, [try signed(z, "ping", clock: clock.now())])
        #expect(try await woke == true)
        #expect(ContinuousClock.now - start < .seconds(10), "waiter did not wake on the write")
        // Already past the token: returns at once.
        #expect(try await reader.waitForChanges(in: z, since: token, timeout: .seconds(20)) == true)
    }

    @Test(arguments: BackendKind.allCases)
    func forgedRecordsAreRejectedAndNeverReturned(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let backend = try fixture.backend()
        let z = try zone("forgery")
        try await backend.createZone(z)
        let bobProfile = try signed(z, "p.bob", type: "Profile", fields: ["name": .string("Bob")], key: Keys.bob, clock: clock.now())
        let aliceNote = try note(z, "n1", clock: clock.now())
        try await saveAll(backend, [bobProfile, aliceNote])

        var wrongKey = try signed(z, "wrongkey", clock: clock.now())
        wrongKey.authorKey = Keys.bob.publicKey
        var altered = try aliceNote.encoded()
        let textAt = try #require(altered.range(of: Data("hello".utf8)))
        altered[textAt.lowerBound] ^= 0x20  // "hello" → "Hello"
        let wrongOwner = try signed(z, "p.bob", type: "Profile", fields: ["name": .string("Mallory")], key: Keys.mallory, clock: clock.now())
        var unsignedStone = try fixture.policy.tombstone(for: aliceNote, signedWith: Keys.alice, clock: clock.now())
        unsignedStone.signature = Data()
        let forgedStone = try fixture.policy.tombstone(for: aliceNote, signedWith: Keys.mallory, clock: clock.now())

        // Writers refuse them.
        let results = try await backend.save([wrongKey, wrongOwner, unsignedStone, forgedStone])
        let codes = results.map { result -> RecordZoneError.Code? in
            if case .failure(let error) = result { return error.code }
            return nil
        }
        #expect(codes == [.invalidSignature, .notAuthorized, .invalidSignature, .notAuthorized])

        // Readers refuse them when a hostile peer plants them anyway.
        let token = try await fetchAll(backend, z).token
        for bytes in [try wrongKey.encoded(), altered, try wrongOwner.encoded(), try unsignedStone.encoded(), try forgedStone.encoded(), Data("junk".utf8)] {
            try await fixture.plant(bytes, in: z)
        }
        // Another peer that knows alice's and bob's keys sees the same.
        let peer = try fixture.backend("peer", pinnedKeys: ["alice": KeyChain(current: Keys.alice.publicKey), "bob": KeyChain(current: Keys.bob.publicKey)])
        for (index, reader) in [backend, peer].enumerated() {
            let all = try await fetchAll(reader, z)
            #expect(!all.records.contains { $0["name"] == .string("Mallory") || $0.id.name == "wrongkey" || $0["text"] == .string("Hello") })
            #expect(!all.records.contains { $0.isDeleted })
            #expect(all.records.count == 2)
            let later = try await fetchAll(reader, z, since: index == 0 ? token : nil)
            let reasons = Set(later.rejected.map { $0.reason })
            #expect(reasons.contains(RejectionReason.invalidSignature))
            #expect(reasons.contains(RejectionReason.unsigned))
            #expect(reasons.contains(RejectionReason.keyConflict(identity: "bob")))
            #expect(reasons.contains(RejectionReason.keyConflict(identity: "alice")))
            #expect(reasons.contains { if case .malformed = $0 { true } else { false } })
            #expect(later.rejected.count == 6)
            #expect(try await reader.fetch([aliceNote.id, bobProfile.id]).map { try $0.get() } == [aliceNote, bobProfile])
        }
    }

    /// A writer cannot take over a record its ID gives to someone else: not with a version that
    /// names itself, not with a tombstone with the largest clock, not under another type.
    @Test(arguments: BackendKind.allCases)
    func versionsByAnyoneButTheIDsOwnerAreRefused(_ kind: BackendKind) async throws {
        let fixture = try await BackendFixture(kind)
        let pins = ["alice": KeyChain(current: Keys.alice.publicKey), "bob": KeyChain(current: Keys.bob.publicKey)]
        let backend = try fixture.backend("main", pinnedKeys: pins)
        let z = try zone("takeover")
        try await backend.createZone(z)
        let original = try note(z, "n1", clock: clock.now())
        try await saveAll(backend, [original, try note(z, "mine", owner: "bob", key: Keys.bob, clock: clock.now())])
        let id = original.id.name
        let rewritten = try signed(z, id, type: "Note", fields: ["owner": .string("bob"), "text": .string("bob was here")], key: Keys.bob, clock: clock.now())
        let maximal = RecordClock(rawValue: .max)
        let bobStone = try Record(id: original.id, type: "Note", fields: ["owner": .string("bob")]).tombstone(keeping: ["owner"], signedWith: Keys.bob, clock: maximal)
        let stoneNamingAlice = try fixture.policy.tombstone(for: original, signedWith: Keys.bob, clock: maximal)
        let retyped = try signed(z, id, type: "Shared", key: Keys.bob, clock: maximal)
        let hostile = [rewritten, bobStone, stoneNamingAlice, retyped]
        let results = try await backend.save(hostile)
        #expect(results.map { result -> RecordZoneError.Code? in
            if case .failure(let error) = result { return error.code }
            return nil
        } == [.notAuthorized, .notAuthorized, .notAuthorized, .notAuthorized])

        // Planted past the writer's checks, every reader refuses them and the original stays.
        for record in hostile { try await fixture.plant(try record.encoded(), in: z) }
        let peer = try fixture.backend("peer", pinnedKeys: pins)
        for reader in [backend, peer] {
            let all = try await fetchAll(reader, z)
            #expect(Set(all.rejected.map(\.reason)) == [.ownerFieldMismatch(field: "owner"), .keyConflict(identity: "alice"), .notOwnedByID(recordType: "Shared")])
            #expect(all.rejected.count == 4)
            #expect(!all.records.contains { $0.isDeleted || $0.authorKey == Keys.bob.publicKey && $0.id == original.id })
            #expect(try await reader.fetch([original.id]).map { try $0.get() } == [original])
        }
        // A reader with no pins is never handed a forgery as alice's: it sees them refused, or
        // alice held in conflict until it learns her key.
        let fresh = try await fetchAll(try fixture.backend("fresh"), z)
        #expect(!fresh.records.contains { $0.id == original.id && $0.authorKey != Keys.alice.publicKey })
        #expect(!fresh.records.contains { $0.isDeleted })
    }

    /// Random saves and deletes by three writers, partly concurrent; three replicas fetch at
    /// random moments with random page sizes. Every replica ends in the same state, and it is
    /// the state the merge rule gives over every version written.
    @Test(arguments: BackendKind.allCases)
    func replicasConvergeUnderRandomWritesAndFetchOrders(_ kind: BackendKind) async throws {
        for seed in UInt64(1)...3 {
            try await convergence(kind, seed: seed)
        }
    }

    private func convergence(_ kind: BackendKind, seed: UInt64) async throws {
        var rng = SeededRandom(seed: seed)
        let fixture = try await BackendFixture(kind)
        let z = try zone("converge")
        let writerKeys = [Keys.alice, Keys.bob, Keys.carol]
        let writers = try (0..<3).map { try fixture.backend("w\($0)") }
        // Each writer has its own clock, and the wall clocks disagree, so versions race.
        let clocks = (0..<3).map { i in HybridLogicalClock(wallMilliseconds: { 1_000_000 + UInt64(i) * 3 }) }
        try await writers[0].createZone(z)
        var everything = [RecordID: Record]()
        struct Replica { var token: ChangeToken?; var state: [RecordID: Record] = [:]; var backend: any RecordZoneBackend }
        var replicas = try (0..<3).map { Replica(token: nil, backend: try fixture.backend("replica\($0)")) }

        func randomVersion(_ w: Int, _ rng: inout SeededRandom) throws -> Record {
            let name = "k\(Int.random(in: 0..<12, using: &rng))"
            if Bool.random(using: &rng), Int.random(in: 0..<4, using: &rng) == 0 {
                let base = Record(id: try RecordID(zone: z, name: name), type: "Shared")
                return try base.tombstone(signedWith: writerKeys[w], clock: clocks[w].now())
            }
            return try signed(z, name, fields: ["v": .int(Int64.random(in: 0..<1000, using: &rng)), "by": .int(Int64(w))], key: writerKeys[w], clock: clocks[w].now())
        }

        for _ in 0..<30 {
            if Int.random(in: 0..<3, using: &rng) == 0 {
                // A concurrent round: every writer saves a batch at once.
                let batches = try (0..<3).map { w in try (0..<Int.random(in: 1...4, using: &rng)).map { _ in try randomVersion(w, &rng) } }
                for batch in batches { for r in batch { MergeRule.merge(r, into: &everything) } }
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for (w, batch) in batches.enumerated() {
                        let writer = writers[w]
                        group.addTask { _ = try await writer.save(batch) }
                    }
                    try await group.waitForAll()
                }
            } else {
                let w = Int.random(in: 0..<3, using: &rng)
                let batch = try (0..<Int.random(in: 1...5, using: &rng)).map { _ in try randomVersion(w, &rng) }
                for r in batch { MergeRule.merge(r, into: &everything) }
                let results = try await writers[w].save(batch)
                #expect(results.allSatisfy { (try? $0.get()) != nil })
            }
            // Some replica reads one page of random size.
            let r = Int.random(in: 0..<3, using: &rng)
            let page = try await replicas[r].backend.fetchChanges(in: z, since: replicas[r].token, limit: Int.random(in: 1...6, using: &rng))
            for record in page.records { MergeRule.merge(record, into: &replicas[r].state) }
            replicas[r].token = page.token
        }
        for r in replicas.indices {
            let rest = try await fetchAll(replicas[r].backend, z, since: replicas[r].token, limit: Int.random(in: 1...9, using: &rng))
            #expect(rest.rejected.isEmpty)
            for record in rest.records { MergeRule.merge(record, into: &replicas[r].state) }
        }
        for replica in replicas {
            #expect(replica.state.count == everything.count, "seed \(seed)")
            #expect(replica.state.keys.allSatisfy { replica.state[$0] == everything[$0] }, "seed \(seed)")
        }
        let ids = everything.keys.sorted()
        let stored = try await writers[0].fetch(ids).map { try $0.get() }
        #expect(stored == ids.map { everything[$0] }, "seed \(seed)")
    }
}
