import Foundation
import SQLiteKit
import Testing
import TestSupport
@testable import RecordZone

/// What only the filesystem backend must show: real processes sharing one folder, crashes
/// mid-write, and files that arrive damaged or incomplete.
@Suite struct FileSystemBackendTests {
    let clock = HybridLogicalClock()

    @Test func twoProcessesWritingAtOnceBothSucceedAndEverythingIsSeen() async throws {
        let dir = try TemporaryDirectory("fs2proc")
        let writer = try builtProduct("convkit-zone-writer")
        let children = try ["left", "right"].map {
            try ChildProcess(writer, ["--root", dir.path, "--device", $0, "--zone", "shared", "--count", "300", "--batch", "7"])
        }
        for child in children {
            let status = await child.wait()
            #expect(status == 0, "\(child.standardError)")
            #expect(child.lines.count == 300)
        }
        let reader = try FileSystemBackend(root: dir.path, device: nil)
        let all = try await fetchAll(reader, try zone("shared"), limit: 64)
        let names = all.records.map(\.id.name)
        #expect(names.count == 600 && Set(names).count == 600)
        #expect(Set(names) == Set(children.flatMap { $0.lines.map { String($0.dropFirst(4)) } }))
        #expect(all.rejected.isEmpty)
    }

    @Test func aSecondWriterWithTheSameStateGetsALockError() async throws {
        let dir = try TemporaryDirectory("fslock")
        let state = dir.path + "/state-laptop"
        let holder = try FileSystemBackend(root: dir.path + "/shared", device: "laptop", stateDirectory: state)
        #expect { try FileSystemBackend(root: dir.path + "/shared", device: "laptop", stateDirectory: state) } throws: { ($0 as? RecordZoneError)?.code == .deviceInUse }
        let child = try ChildProcess(try builtProduct("convkit-zone-writer"),
                                     ["--root", dir.path + "/shared", "--device", "laptop", "--state", state, "--zone", "z", "--count", "5"])
        #expect(await child.wait() == 1)
        #expect(child.standardError.contains("deviceInUse"))
        #expect(child.standardOutput.isEmpty)
        // Another device is fine, and so is this one once the holder is gone.
        _ = try FileSystemBackend(root: dir.path + "/shared", device: "phone", stateDirectory: dir.path + "/state-phone")
        _ = holder
    }

    @Test func aWriterKilledMidWriteLosesNothingItAcknowledged() async throws {
        let dir = try TemporaryDirectory("fskill")
        let tool = try builtProduct("convkit-zone-writer")
        let state = dir.path + "/state"
        let root = dir.path + "/shared"
        let child = try ChildProcess(tool, ["--root", root, "--device", "victim", "--state", state, "--zone", "z", "--count", "100000", "--batch", "3"])
        let gotSome = await child.waitUntil { $0.lines.count >= 60 }
        #expect(gotSome)
        child.kill(SIGKILL)
        _ = await child.wait()
        let acknowledged = Set(child.lines.map { String($0.dropFirst(4)) })
        #expect(acknowledged.count >= 60 && acknowledged.count < 100000)

        let reader = try FileSystemBackend(root: root, device: nil)
        let all = try await fetchAll(reader, try zone("z"), limit: 500)
        let present = Set(all.records.map(\.id.name))
        #expect(acknowledged.isSubset(of: present), "lost \(acknowledged.subtracting(present).count) acknowledged records")
        #expect(all.rejected.isEmpty, "\(all.rejected)")

        // The same device starts again (the kernel dropped the lock) and carries on.
        let again = try ChildProcess(tool, ["--root", root, "--device", "victim", "--state", state, "--zone", "z", "--count", "5", "--prefix", "again"])
        #expect(await again.wait() == 0, "\(again.standardError)")
        let after = try await fetchAll(reader, try zone("z"), since: all.token)
        let names = Set(after.records.map(\.id.name)), expected = Set((0..<5).map { "again-\($0)" })
        #expect(expected.isSubset(of: names))
        // The batch the kill cut short (kept locally, never acknowledged) may be published now,
        // once: nothing the reader had comes again.
        #expect(names.subtracting(expected).allSatisfy { $0.hasPrefix("victim-") && !present.contains($0) && !acknowledged.contains($0) }, "\(names)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: FolderLayout(root: root).generationFolder(try zone("z"), 1)).count == 1,
                "one device folder: the restarted writer is the same device")
    }

    @Test(arguments: ["truncated", "flipped", "trailing"])
    func aDamagedSegmentBlocksOnlyItselfAndIsReadOnceWhole(_ damage: String) async throws {
        let dir = try TemporaryDirectory("fsdamage")
        let writer = try FileSystemBackend(root: dir.path, device: "writer")
        let z = try zone("z")
        try await writer.createZone(z)
        try await saveAll(writer, try (0..<3).map { try signed(z, "first-\($0)", clock: clock.now()) })
        try await saveAll(writer, try (0..<3).map { try signed(z, "second-\($0)", clock: clock.now()) })
        try await saveAll(writer, try (0..<3).map { try signed(z, "third-\($0)", clock: clock.now()) })
        let layout = FolderLayout(root: dir.path)
        let device = try #require(writer.device)
        let path = layout.segmentFile(z, 1, device: device, name: try layout.segments(z, generation: 1, device: device)[1].name)
        let whole = try Data(contentsOf: URL(fileURLWithPath: path))
        var broken = whole
        switch damage {
        case "truncated": broken = whole.prefix(whole.count / 2)
        case "flipped": broken[whole.count / 2] ^= 0x10
        default: broken.append(0)
        }
        // Damaged in place, under its own name (as `cp`, `rsync --inplace` or NFS can leave it).
        try broken.write(to: URL(fileURLWithPath: path))

        let reader = try FileSystemBackend(root: dir.path, device: nil)
        let seen = try await fetchAll(reader, z)
        #expect(Set(seen.records.map(\.id.name)) == ["first-0", "first-1", "first-2", "third-0", "third-1", "third-2"],
                "only the damaged file is held back")
        #expect(seen.rejected.count == 1)
        #expect(seen.rejected.first.map { if case .corruptSegment = $0.reason { true } else { false } } == true)
        #expect(FileManager.default.fileExists(atPath: path), "a damaged file is never deleted")
        #expect(try await reader.waitForChanges(in: z, since: seen.token, timeout: .milliseconds(50)) == false)
        let feed = try await reader.fetchDatabaseChanges(since: nil)

        // The file-sync tool finishes delivering it, in place: the rest arrives, exactly once.
        try whole.write(to: URL(fileURLWithPath: path))
        #expect(try await reader.fetchDatabaseChanges(since: feed.token).changedZones == [z], "the database feed sees a file completed in place")
        #expect(try await reader.waitForChanges(in: z, since: seen.token, timeout: .seconds(5)) == true)
        let rest = try await fetchAll(reader, z, since: seen.token)
        #expect(rest.records.map(\.id.name).sorted() == ["second-0", "second-1", "second-2"])
        #expect(rest.rejected.isEmpty)
        // The writer's own sends never fail because of a damaged copy of its own file.
        try broken.write(to: URL(fileURLWithPath: path))
        let restarted = try FileSystemBackend(root: dir.path, device: "writer")
        try await saveAll(restarted, [try signed(z, "fourth", clock: clock.now())])
    }

    @Test func temporaryFilesAreIgnoredByReaders() async throws {
        let dir = try TemporaryDirectory("fstmp")
        let writer = try FileSystemBackend(root: dir.path, device: "w")
        let z = try zone("z")
        try await writer.createZone(z)
        try await saveAll(writer, [try signed(z, "a", clock: clock.now())])
        let folder = FolderLayout(root: dir.path).deviceFolder(z, 1, device: try #require(writer.device))
        try Data("half a segm".utf8).write(to: URL(fileURLWithPath: folder + "/.000000000002-0000000000000000.seg.123.tmp"))
        let all = try await fetchAll(writer, z)
        #expect(all.records.map(\.id.name) == ["a"] && all.rejected.isEmpty)
    }

    @Test func aTamperedAssetIsDetectedOnRead() async throws {
        let dir = try TemporaryDirectory("fsasset")
        let backend = try FileSystemBackend(root: dir.path, device: "w")
        let bytes = Data("avatar bytes".utf8)
        let reference = try await backend.putAsset(bytes)
        let path = FolderLayout(root: dir.path).assetFile(reference)
        try Data("avatar bytez".utf8).write(to: URL(fileURLWithPath: path))
        await #expect { try await backend.asset(reference) } throws: { ($0 as? RecordZoneError)?.code == .assetCorrupt }
        // Putting the asset again repairs the damaged copy.
        _ = try await backend.putAsset(bytes)
        #expect(try await backend.asset(reference) == bytes)
    }

    @Test func theFolderHoldsNoDatabaseAndAReadOnlyReaderCannotWrite() async throws {
        let dir = try TemporaryDirectory("fsformat")
        let writer = try FileSystemBackend(root: dir.path, device: "w")
        let z = try zone("z")
        try await writer.createZone(z)
        try await saveAll(writer, [try signed(z, "a", clock: clock.now())])
        let enumerator = try #require(FileManager.default.enumerator(atPath: dir.path))
        for case let name as String in enumerator {
            let data = (try? Data(contentsOf: URL(fileURLWithPath: dir.path + "/" + name))) ?? Data()
            #expect(!data.starts(with: Data("SQLite format 3".utf8)), "\(name) is a SQLite database")
        }
        let reader = try FileSystemBackend(root: dir.path, device: nil)
        await #expect { try await reader.save([try signed(z, "b", clock: clock.now())]) } throws: { ($0 as? RecordZoneError)?.code == .notAuthorized }
        try "convkit-filesystem-zone 99\n".write(toFile: dir.path + "/FORMAT", atomically: true, encoding: .utf8)
        #expect { try FileSystemBackend(root: dir.path, device: nil) } throws: { ($0 as? RecordZoneError)?.code == .malformed }
        #expect { try FileSystemBackend(root: dir.path + "/nothing", device: nil) } throws: { ($0 as? RecordZoneError)?.code == .folderUnavailable }
    }

    /// A folder may hold any number of devices, and any number of gaps in one device's
    /// sequences (a hostile writer's): a reader's position encodes past 65,535 of either —
    /// where a u16 count trapped — and reads back the same.
    @Test func aPositionWithMoreThan65535DevicesOrRangesRoundTrips() throws {
        var vector = VersionVector()
        for index in 0..<70_000 { vector["device-\(index)", default: DeviceProgress()].markRead(UInt64(index)) }
        var gaps = DeviceProgress()
        gaps.ranges = stride(from: UInt64(1), to: 140_002, by: 2).map { $0...$0 }  // every other sequence read
        #expect(gaps.ranges.count == 70_001)
        gaps.duplicatesRead = [7, 9]
        vector["gaps"] = gaps
        let decoded = try #require(VersionVector(encoded: vector.encoded))
        #expect(decoded == vector)
        // A short position still encodes in the compact form, and a cut one is refused.
        var small = VersionVector()
        small["a", default: DeviceProgress()].markRead(1)
        #expect(small.encoded.prefix(2) == Data([0, 1]))
        #expect(VersionVector(encoded: vector.encoded.dropLast(3)) == nil)
    }
}

/// The accidents of shared folders that used to lose messages silently (issue 10).
extension FileSystemBackendTests {
    /// A segment deleted in the folder (a cleanup, a sync tool) is never replaced by a new file of
    /// the same sequence: a reader that read it sees every later record, and so does a restarted
    /// writer's reader.
    @Test func aDeletedSegmentsSequenceIsNeverReused() async throws {
        let dir = try TemporaryDirectory("fsdeleted")
        let root = dir.path + "/shared", state = dir.path + "/state"
        let z = try zone("z")
        var writer: FileSystemBackend? = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
        try await #require(writer).createZone(z)
        for batch in 0..<3 { try await saveAll(try #require(writer), [try signed(z, "before-\(batch)", clock: clock.now())]) }
        let reader = try FileSystemBackend(root: root, device: nil)
        let first = try await fetchAll(reader, z)
        #expect(first.records.count == 3)
        let layout = FolderLayout(root: root)
        let device = try #require(writer?.device)
        let newest = try #require(try layout.segments(z, generation: 1, device: device).last)
        try FileManager.default.removeItem(atPath: layout.segmentFile(z, 1, device: device, name: newest.name))
        writer = nil  // the process ends; a new one starts with the same local state
        let again = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
        try await saveAll(again, [try signed(z, "after", clock: clock.now())])
        let sequences = try layout.segments(z, generation: 1, device: device).map(\.sequence)
        #expect(!sequences.contains(newest.sequence) && sequences.max() ?? 0 > newest.sequence, "\(sequences)")
        let later = try await fetchAll(reader, z, since: first.token)
        #expect(Set(later.records.map(\.id.name)) == ["after", "before-2"], "the new record reaches a reader that read the deleted file (and the republished one again)")
        // A reader that never read the deleted file gets its records from the writer's republished copy.
        let fresh = try FileSystemBackend(root: root, device: nil)
        #expect(Set(try await fetchAll(fresh, z).records.map(\.id.name)) == ["before-0", "before-1", "before-2", "after"])
    }

    /// A share that is not mounted looks like an empty folder: a device that wrote to the folder
    /// before gets `folderUnavailable` and writes nothing; so does one pointed at another folder.
    @Test func anUnmountedOrOtherFolderIsATypedErrorAndNothingIsWritten() async throws {
        let dir = try TemporaryDirectory("fsmount")
        let root = dir.path + "/mnt", state = dir.path + "/state"
        _ = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
        // Unmounted: the mount point is there, empty.
        try FileManager.default.moveItem(atPath: root, toPath: dir.path + "/away")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false)
        #expect { try FileSystemBackend(root: root, device: "laptop", stateDirectory: state) } throws: { error in
            guard let error = error as? RecordZoneError else { return false }
            return error.code == .folderUnavailable && error.message.contains("not mounted") && error.isTransient
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: root).isEmpty, "nothing was written into the mount point")
        // Missing altogether.
        try FileManager.default.removeItem(atPath: root)
        #expect { try FileSystemBackend(root: root, device: "laptop", stateDirectory: state) } throws: { ($0 as? RecordZoneError)?.code == .folderUnavailable }
        #expect(!FileManager.default.fileExists(atPath: root))
        // Another folder.
        _ = try FileSystemBackend(root: dir.path + "/other", device: "laptop", stateDirectory: dir.path + "/other-state")
        #expect { try FileSystemBackend(root: dir.path + "/other", device: "laptop", stateDirectory: state) } throws: { error in
            (error as? RecordZoneError)?.code == .folderUnavailable && (error as? RecordZoneError)?.message.contains("another zone folder") == true
        }
        // Mounted again: all is well.
        try FileManager.default.moveItem(atPath: dir.path + "/away", toPath: root)
        _ = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
    }

    /// Two machines that chose one label are two devices: neither overwrites nor hides the other.
    @Test func twoMachinesWithOneLabelAreTwoDevices() async throws {
        let dir = try TemporaryDirectory("fslabel")
        let root = dir.path + "/shared"
        let z = try zone("z")
        let one = try FileSystemBackend(root: root, device: "phone", stateDirectory: dir.path + "/machine-1")
        let two = try FileSystemBackend(root: root, device: "phone", stateDirectory: dir.path + "/machine-2")
        try await one.createZone(z)
        for n in 0..<3 {
            try await saveAll(one, [try signed(z, "one-\(n)", clock: clock.now())])
            try await saveAll(two, [try signed(z, "two-\(n)", clock: clock.now())])
        }
        #expect(one.device != two.device)
        let reader = try FileSystemBackend(root: root, device: nil)
        #expect(Set(try await fetchAll(reader, z).records.map(\.id.name)) == Set((0..<3).flatMap { ["one-\($0)", "two-\($0)"] }))
    }

    /// Bad labels and paths are refused at open, in plain words.
    @Test func badLabelsAndPathsAreRefusedAtOpen() throws {
        let dir = try TemporaryDirectory("fsbad")
        #expect { try FileSystemBackend(root: dir.path, device: "my phone") } throws: { error in
            (error as? RecordZoneError)?.code == .invalidArguments && (error as? RecordZoneError)?.message.contains("device label 'my phone'") == true
        }
        #expect { try FileSystemBackend(root: dir.path, device: String(repeating: "x", count: 41)) } throws: { ($0 as? RecordZoneError)?.code == .invalidArguments }
        try Data("a file".utf8).write(to: URL(fileURLWithPath: dir.path + "/file"))
        #expect { try FileSystemBackend(root: dir.path + "/file/zones", device: "w") } throws: { error in
            (error as? RecordZoneError)?.message.contains("is not a folder (it, or a folder above it, is a file)") == true
        }
    }

    /// More damaged files than a page holds records never stall a reader: each page reports them
    /// and moves on, and the good records all arrive.
    @Test func manyDamagedFilesNeverStallPaging() async throws {
        let dir = try TemporaryDirectory("fsmanydamaged")
        let writer = try FileSystemBackend(root: dir.path, device: "w")
        let z = try zone("z")
        try await writer.createZone(z)
        for n in 0..<6 { try await saveAll(writer, [try signed(z, "r\(n)", clock: clock.now())]) }
        let layout = FolderLayout(root: dir.path)
        let device = try #require(writer.device)
        for file in try layout.segments(z, generation: 1, device: device).prefix(4) {
            let path = layout.segmentFile(z, 1, device: device, name: file.name)
            try Data("damaged".utf8).write(to: URL(fileURLWithPath: path))
        }
        let reader = try FileSystemBackend(root: dir.path, device: nil)
        var token: ChangeToken? = nil, names = [String](), pages = 0
        repeat {
            let page = try await reader.fetchChanges(in: z, since: token, limit: 1)
            names += page.records.map(\.id.name)
            token = page.token
            pages += 1
            if !page.moreComing { break }
        } while pages < 50
        #expect(pages < 50, "paging ended")
        #expect(Set(names) == ["r4", "r5"])
    }

    /// A share unmounted while a backend is open is refused at the next write or read, with
    /// nothing written into the empty mount point (a store would otherwise recreate the zone
    /// there and show the message synced).
    @Test func aShareUnmountedWhileOpenIsRefusedAndNothingIsWritten() async throws {
        let dir = try TemporaryDirectory("fslive")
        let root = dir.path + "/mnt"
        let z = try zone("z")
        let writer = try FileSystemBackend(root: root, device: "laptop", stateDirectory: dir.path + "/state")
        try await writer.createZone(z)
        try await saveAll(writer, [try signed(z, "before", clock: clock.now())])
        try FileManager.default.moveItem(atPath: root, toPath: dir.path + "/away")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false)
        let unavailable = { (error: any Error) in (error as? RecordZoneError)?.code == .folderUnavailable }
        await #expect(performing: { try await writer.createZone(z) }, throws: unavailable)
        await #expect(performing: { try await writer.save([try signed(z, "after", clock: clock.now())]) }, throws: unavailable)
        await #expect(performing: { try await writer.fetchDatabaseChanges(since: nil) }, throws: unavailable)
        await #expect(performing: { try await writer.fetchChanges(in: z, since: nil, limit: 10) }, throws: unavailable)
        await #expect(performing: { try await writer.putAsset(Data("x".utf8)) }, throws: unavailable)
        #expect(try FileManager.default.contentsOfDirectory(atPath: root).isEmpty, "nothing was written into the mount point")
        // Mounted again, the writer carries on.
        try FileManager.default.removeItem(atPath: root)
        try FileManager.default.moveItem(atPath: dir.path + "/away", toPath: root)
        try await saveAll(writer, [try signed(z, "after", clock: clock.now())])
    }

    /// An old segment copied back under a new name (a replay by a hostile tool) changes nothing:
    /// the newer version of each record stays the winner.
    @Test func aReplayedOldSegmentChangesNothing() async throws {
        let dir = try TemporaryDirectory("fsreplay")
        let writer = try FileSystemBackend(root: dir.path, device: "w")
        let z = try zone("z")
        try await writer.createZone(z)
        var record = try signed(z, "m", clock: clock.now())
        try await saveAll(writer, [record])
        record["text"] = .string("edited")
        try record.sign(with: Keys.alice, clock: clock.now())
        try await saveAll(writer, [record])
        let layout = FolderLayout(root: dir.path)
        let device = try #require(writer.device)
        let old = try #require(try layout.segments(z, generation: 1, device: device).first)
        let bytes = try Data(contentsOf: URL(fileURLWithPath: layout.segmentFile(z, 1, device: device, name: old.name)))
        try bytes.write(to: URL(fileURLWithPath: layout.segmentFile(z, 1, device: device, name: Segment.fileName(99, digest: Segment.digest(of: bytes)))))
        let reader = try FileSystemBackend(root: dir.path, device: nil)
        _ = try await fetchAll(reader, z)
        let winner = try #require(try await reader.fetch([record.id]).first).get()
        #expect(winner["text"] == .string("edited"))
    }

    /// A new process on the same local state answers from its index what an earlier one read:
    /// another device's files, gone from the folder since, still give their records, and only
    /// what is new is read. A zone deleted and created again starts an empty index generation.
    @Test func aNewProcessAnswersFromItsIndexAndReadsOnlyWhatIsNew() async throws {
        let dir = try TemporaryDirectory("fsindex")
        let root = dir.path + "/shared", state = dir.path + "/state"
        let z = try zone("z")
        let other = try FileSystemBackend(root: root, device: "phone", stateDirectory: dir.path + "/phone")
        try await other.createZone(z)
        let early = try (0..<5).map { try signed(z, "early-\($0)", clock: clock.now()) }
        try await saveAll(other, early)
        var laptop: FileSystemBackend? = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
        try await saveAll(try #require(laptop), [try signed(z, "mine", clock: clock.now())])
        laptop = nil
        // The phone's first file goes away (a cleanup); then it writes something new.
        let layout = FolderLayout(root: root)
        let phone = try #require(other.device)
        for file in try layout.segments(z, generation: 1, device: phone) {
            try FileManager.default.removeItem(atPath: layout.segmentFile(z, 1, device: phone, name: file.name))
        }
        try await saveAll(other, [try signed(z, "late", clock: clock.now())])
        let again = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
        let ids = try (early.map(\.id.name) + ["mine", "late"]).map { try RecordID(zone: z, name: $0) }
        let found = try await again.fetch(ids).map { try $0.get().id.name }
        #expect(found == ids.map(\.name), "read before from the index, the new one from the folder")
        let queried = try await again.query(RecordQuery(zone: z, recordType: "Shared"), cursor: nil, limit: 100)
        #expect(queried.records.count == 7)
        // Deleted and created again: nothing of the old generation answers.
        try await again.deleteZone(z)
        try await again.createZone(z)
        let gone = try await again.fetch([ids[0]])
        #expect(throws: RecordZoneError.self) { try gone[0].get() }
    }

    /// The index is a cache: a damaged one is set aside and rebuilt from the folder, and every
    /// record reads back.
    @Test func aDamagedIndexIsRebuiltFromTheFolder() async throws {
        let dir = try TemporaryDirectory("fsbadindex")
        let root = dir.path + "/shared", state = dir.path + "/state"
        let z = try zone("z")
        var writer: FileSystemBackend? = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
        try await #require(writer).createZone(z)
        let records = try (0..<20).map { try signed(z, "m\($0)", clock: clock.now()) }
        try await saveAll(try #require(writer), records)
        writer = nil
        let index = state + "/" + FolderIndex.fileName
        #expect(FileManager.default.fileExists(atPath: index))
        for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: index + suffix) }
        try Data(repeating: 0x5A, count: 8192).write(to: URL(fileURLWithPath: index))
        let reopened = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
        let fetched = try await reopened.fetch(records.map(\.id)).map { try $0.get().id }
        #expect(fetched == records.map(\.id))
        try await saveAll(reopened, [try signed(z, "after", clock: clock.now())])
        #expect(try await fetchAll(FileSystemBackend(root: root, device: nil), z).records.count == 21)
    }

    /// An index another version of the program wrote (another schema) is started again, as a
    /// damaged one is (the folder fills it again).
    @Test func anIndexOfAnotherVersionIsStartedAgain() throws {
        let dir = try TemporaryDirectory("fsoldindex")
        let path = dir.path + "/" + FolderIndex.fileName
        try FolderIndex(path: path).setOwnFileStamp("a file", "a stamp")
        #expect(try FolderIndex(path: path).ownFileStamp("a file") == "a stamp")
        try Database(path: path).execute("PRAGMA user_version = \(FolderIndex.schemaVersion + 7)")
        #expect(try FolderIndex(path: path).ownFileStamp("a file") == nil, "nothing of the other version's index is read")
        #expect(try Database(path: path, readOnly: true).userVersion == FolderIndex.schemaVersion)
    }

    /// A writer's own segment damaged in place while no process of it runs (the folder's time
    /// does not change; the file's does): a process started more than 30 s after the last full
    /// look at its files — however short the earlier ones were — looks them over and puts the
    /// damaged one's records back.
    @Test func anOwnFileDamagedInPlaceIsPutBackByALaterProcess() async throws {
        let dir = try TemporaryDirectory("fsinplace")
        let root = dir.path + "/shared", state = dir.path + "/state"
        let z = try zone("z")
        var writer: FileSystemBackend? = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
        try await #require(writer).createZone(z)
        let records = try (0..<3).map { try signed(z, "m\($0)", clock: clock.now()) }
        try await saveAll(try #require(writer), records)
        let device = try #require(writer?.device)
        writer = nil
        let layout = FolderLayout(root: root)
        let file = try #require(try layout.segments(z, generation: 1, device: device).first)
        let path = layout.segmentFile(z, 1, device: device, name: file.name)
        var bytes = try Data(contentsOf: URL(fileURLWithPath: path))
        bytes[bytes.count / 2] ^= 0x10
        try bytes.write(to: URL(fileURLWithPath: path))  // in place: the folder's time stays
        // The last full look was more than 30 s ago (as if the next process started later).
        let index = try FolderIndex(path: state + "/" + FolderIndex.fileName)
        let key = FileSystemBackend.ownFolderKey(layout.deviceFolder(z, 1, device: device))
        let recorded = try #require(index.ownFileStamp(key).flatMap(FileSystemBackend.parseOwnFolderRecord))
        index.setOwnFileStamp(key, "\(recorded.stamp) \(recorded.at - 60)")
        let later = try FileSystemBackend(root: root, device: "laptop", stateDirectory: state)
        try await saveAll(later, [try signed(z, "after", clock: clock.now())])
        let reader = try FileSystemBackend(root: root, device: nil)
        let all = try await fetchAll(reader, z)
        #expect(Set(all.records.map(\.id.name)) == ["m0", "m1", "m2", "after"], "the damaged file's records were put back")
    }
}
