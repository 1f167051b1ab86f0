import Foundation
@testable import RecordZone
import Testing
import TestSupport
@testable import ConversationKit

/// A store copied to a new machine with its folder copy (`cp -a`), both machines writing after:
/// nothing either shows `synced` is lost. The copy notices it is not the instance that wrote as
/// its folder device and takes a new one; and a reader given two files under one sequence
/// anyway reads both.
@Suite struct CopiedStoreTests {
    /// Copies every file of `from` that `to` lacks (a sync tool's union of two folder copies).
    static func union(_ from: String, into to: String) throws {
        let manager = FileManager.default
        for path in try manager.subpathsOfDirectory(atPath: from) {
            var isDirectory: ObjCBool = false
            guard manager.fileExists(atPath: from + "/" + path, isDirectory: &isDirectory), !isDirectory.boolValue,
                !manager.fileExists(atPath: to + "/" + path)
            else { continue }
            try manager.createDirectory(atPath: (to + "/" + path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try manager.copyItem(atPath: from + "/" + path, toPath: to + "/" + path)
        }
    }

    @Test func aStoreCopiedWithItsFolderCopyLosesNothingWhenBothMachinesWrite() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let bob = try await fixture.store("bob")
        let old = try await fixture.store("alice")
        _ = try await old.send("before the move", to: "bob")
        try await syncAll([old, bob])
        old.close()
        // The new laptop: the store and the folder copy, copied whole.
        let newStore = fixture.directory.path + "/new-alice", newFolder = fixture.directory.path + "/new-shared"
        try FileManager.default.copyItem(atPath: fixture.storePath("alice"), toPath: newStore)
        try FileManager.default.copyItem(atPath: fixture.folder, toPath: newFolder)
        let oldAgain = try ConversationStore(directory: fixture.storePath("alice"), backend: fixture.factory(device: "alice"))
        let copy = try ConversationStore(directory: newStore, backend: .folder(newFolder, device: "alice"))
        var sent = [MessageID]()
        for (store, text) in [(oldAgain, "from the old laptop"), (copy, "from the new laptop")] {
            sent.append(try await store.send(text, to: "bob").id)
            try await store.sync()
            #expect(try store.message(sent.last!)?.syncState == .synced)
        }
        // The two folder copies kept in step again.
        try Self.union(newFolder, into: fixture.folder)
        try Self.union(fixture.folder, into: newFolder)
        for store in [oldAgain, copy, bob] { try await store.sync() }
        let expected = ["before the move", "from the old laptop", "from the new laptop"]
        for (name, store) in [("bob", bob), ("old laptop", oldAgain), ("new laptop", copy)] {
            let shown = try history(store, sent[0].conversation).map(\.content)
            #expect(Set(shown) == Set(expected) && shown.count == 3, "\(name): \(shown)")
        }
        // The copy wrote under a device of its own.
        let devices = try FileManager.default.contentsOfDirectory(atPath: fixture.folder + "/zones/" + sent[0].conversation + "/1")
        #expect(devices.filter { $0.hasPrefix("alice-") }.count == 2, "\(devices)")
    }

    /// A hostile folder writer puts a second file under a sequence of alice's own device folder
    /// (which readers now read): a forged message and a rewrite of her real one, with another
    /// key. Both are refused by the normal rules; alice's message stays as she wrote it.
    @Test func aForgedFileUnderAnotherDevicesSequenceForgesNothing() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        let real = try await alice.send("genuine", to: "bob")
        try await syncAll([alice, bob])
        let zone = try ZoneName(real.id.conversation)
        let layout = FolderLayout(root: fixture.folder)
        let generation = try layout.zoneState(zone).generation
        let device = try #require(try layout.devices(zone, generation: generation).first { $0.hasPrefix("alice-") })
        let sequence = try #require(try layout.segments(zone, generation: generation, device: device).first?.sequence)
        let mallory = SigningKey.generate(), clock = RecordClock(milliseconds: UInt64(Date().timeIntervalSince1970 * 1000) + 60_000, counter: 0)
        var rewrite = try #require(try alice.records(in: zone.rawValue).first { $0.id.name == real.id.name })
        rewrite.fields["content"] = .string("rewritten")
        try rewrite.sign(with: mallory, clock: clock)
        var forged = try ChatRecords.message(name: ChatRecords.messageName(speaker: "alice", clock: clock), speaker: "alice", listener: "bob",
                                             content: "forged", spokenAt: Int64(clock.milliseconds), editedAt: nil)
        try forged.sign(with: mallory, clock: clock)
        try layout.writeSegment(Segment.encode([try rewrite.encoded(), try forged.encoded()]), zone: zone, generation: generation, device: device, sequence: sequence)
        try await bob.sync()
        #expect(try history(bob, zone.rawValue).map(\.content) == ["genuine"])
        #expect(try bob.quarantine().filter { $0.code == .keyConflict }.count == 2)
        // And the folder check says a device's sequence holds two files.
        let reader = try FileSystemBackend(root: fixture.folder, device: nil, policy: ConversationStore.recordPolicy())
        #expect(try await reader.duplicatedSequences().contains { $0.contains(device) })
    }

    /// Two files under one sequence of one device (what two writers as one device left): a
    /// reader reads both — also one that had read the first before the second appeared.
    @Test func aReaderReadsBothFilesOfADuplicatedSequence() async throws {
        let directory = try TemporaryDirectory("duplicate")
        let writer = try FileSystemBackend(root: directory.path, device: "w", policy: RecordPolicy())
        let zone = try ZoneName("notes")
        try await writer.createZone(zone)
        let key = SigningKey.generate()
        func note(_ name: String) throws -> Data {
            var record = Record(id: try RecordID(zone: zone, name: name), type: "Note", fields: ["text": .string(name)])
            try record.sign(with: key, clock: HybridLogicalClock().now())
            return try record.encoded()
        }
        let layout = FolderLayout(root: directory.path)
        let generation = try layout.zoneState(zone).generation
        try layout.writeSegment(Segment.encode([try note("first")]), zone: zone, generation: generation, device: "twin", sequence: 7)
        let reader = try FileSystemBackend(root: directory.path, device: nil, policy: RecordPolicy())
        let before = try await reader.fetchChanges(in: zone, since: nil, limit: 100)
        #expect(before.records.map(\.id.name) == ["first"])
        try layout.writeSegment(Segment.encode([try note("second")]), zone: zone, generation: generation, device: "twin", sequence: 7)
        #expect(try await reader.waitForChanges(in: zone, since: before.token, timeout: .seconds(5)))
        let after = try await reader.fetchChanges(in: zone, since: before.token, limit: 100)
        #expect(Set(after.records.map(\.id.name)).contains("second"), "\(after.records.map(\.id.name))")
        let fresh = try FileSystemBackend(root: directory.path, device: nil, policy: RecordPolicy())
        #expect(Set(try await fresh.fetchChanges(in: zone, since: nil, limit: 100).records.map(\.id.name)) == ["first", "second"])
        // Read once, both stay read.
        let again = try await reader.fetchChanges(in: zone, since: after.token, limit: 100)
        #expect(again.records.isEmpty)
        // And it is said.
        #expect(try await fresh.duplicatedSequences() == ["notes/\(generation)/twin sequence 7: 2 files"])
    }
}
