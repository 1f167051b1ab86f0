import Foundation
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

    @Test func aSecondWriterAsTheSameDeviceGetsALockError() async throws {
        let dir = try TemporaryDirectory("fslock")
        let holder = try FileSystemBackend(root: dir.path, device: "laptop")
        #expect { try FileSystemBackend(root: dir.path, device: "laptop") } throws: { ($0 as? RecordZoneError)?.code == .deviceInUse }
        let child = try ChildProcess(try builtProduct("convkit-zone-writer"), ["--root", dir.path, "--device", "laptop", "--zone", "z", "--count", "5"])
        #expect(await child.wait() == 1)
        #expect(child.standardError.contains("deviceInUse"))
        #expect(child.standardOutput.isEmpty)
        // Another device is fine, and so is this one once the holder is gone.
        _ = try FileSystemBackend(root: dir.path, device: "phone")
        _ = holder
    }

    @Test func aWriterKilledMidWriteLosesNothingItAcknowledged() async throws {
        let dir = try TemporaryDirectory("fskill")
        let tool = try builtProduct("convkit-zone-writer")
        let child = try ChildProcess(tool, ["--root", dir.path, "--device", "victim", "--zone", "z", "--count", "100000", "--batch", "3"])
        let gotSome = await child.waitUntil { $0.lines.count >= 60 }
        #expect(gotSome)
        child.kill(SIGKILL)
        _ = await child.wait()
        let acknowledged = Set(child.lines.map { String($0.dropFirst(4)) })
        #expect(acknowledged.count >= 60 && acknowledged.count < 100000)

        let reader = try FileSystemBackend(root: dir.path, device: nil)
        let all = try await fetchAll(reader, try zone("z"), limit: 500)
        let present = Set(all.records.map(\.id.name))
        #expect(acknowledged.isSubset(of: present), "lost \(acknowledged.subtracting(present).count) acknowledged records")
        #expect(all.rejected.isEmpty, "\(all.rejected)")

        // The same device starts again (the kernel dropped the lock) and carries on the sequence.
        let again = try ChildProcess(tool, ["--root", dir.path, "--device", "victim", "--zone", "z", "--count", "5", "--prefix", "again"])
        #expect(await again.wait() == 0, "\(again.standardError)")
        let after = try await fetchAll(reader, try zone("z"), since: all.token)
        #expect(Set(after.records.map(\.id.name)) == Set((0..<5).map { "again-\($0)" }))
    }

    @Test(arguments: ["truncated", "flipped", "trailing"])
    func aDamagedSegmentIsReportedNotAppliedAndPickedUpOnceWhole(_ damage: String) async throws {
        let dir = try TemporaryDirectory("fsdamage")
        let writer = try FileSystemBackend(root: dir.path, device: "writer")
        let z = try zone("z")
        try await writer.createZone(z)
        try await saveAll(writer, try (0..<3).map { try signed(z, "first-\($0)", clock: clock.now()) })
        try await saveAll(writer, try (0..<3).map { try signed(z, "second-\($0)", clock: clock.now()) })
        try await saveAll(writer, try (0..<3).map { try signed(z, "third-\($0)", clock: clock.now()) })
        let path = FolderLayout(root: dir.path).segmentFile(z, 1, device: "writer", sequence: 2)
        let whole = try Data(contentsOf: URL(fileURLWithPath: path))
        var broken = whole
        switch damage {
        case "truncated": broken = whole.prefix(whole.count / 2)
        case "flipped": broken[whole.count / 2] ^= 0x10
        default: broken.append(0)
        }
        try broken.write(to: URL(fileURLWithPath: path))

        let reader = try FileSystemBackend(root: dir.path, device: nil)
        let seen = try await fetchAll(reader, z)
        #expect(Set(seen.records.map(\.id.name)) == ["first-0", "first-1", "first-2"], "nothing at or after the gap is applied")
        #expect(seen.rejected.count == 1)
        #expect(seen.rejected.first.map { if case .corruptSegment = $0.reason { true } else { false } } == true)
        #expect(FileManager.default.fileExists(atPath: path), "a damaged file is never deleted")
        #expect(try await reader.waitForChanges(in: z, since: seen.token, timeout: .milliseconds(50)) == false)

        // The file-sync tool finishes delivering it: the rest arrives, exactly once.
        try whole.write(to: URL(fileURLWithPath: path))
        #expect(try await reader.waitForChanges(in: z, since: seen.token, timeout: .seconds(5)) == true)
        let rest = try await fetchAll(reader, z, since: seen.token)
        #expect(rest.records.map(\.id.name).sorted() == ["second-0", "second-1", "second-2", "third-0", "third-1", "third-2"])
        #expect(rest.rejected.isEmpty)
    }

    @Test func temporaryFilesAreIgnoredByReaders() async throws {
        let dir = try TemporaryDirectory("fstmp")
        let writer = try FileSystemBackend(root: dir.path, device: "w")
        let z = try zone("z")
        try await writer.createZone(z)
        try await saveAll(writer, [try signed(z, "a", clock: clock.now())])
        let folder = FolderLayout(root: dir.path).deviceFolder(z, 1, device: "w")
        try Data("half a segm".utf8).write(to: URL(fileURLWithPath: folder + "/.000000000002.seg.123.tmp"))
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
        #expect { try FileSystemBackend(root: dir.path + "/nothing", device: nil) } throws: { ($0 as? RecordZoneError)?.code == .zoneNotFound }
    }
}
