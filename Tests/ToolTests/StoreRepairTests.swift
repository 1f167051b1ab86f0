import Foundation
import Testing
import TestSupport

/// A store whose database was damaged is reported as damaged, kept as it is (never replaced by a
/// fresh empty one), checked by `convkit doctor` and rebuilt from its backend by
/// `convkit doctor --rebuild`.
@Suite struct StoreRepairTests {
    static func size(_ path: String) -> Int? { (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? nil }

    @Test func aDamagedStoreIsReportedKeptAndRebuiltFromItsBackend() async throws {
        let dir = try TemporaryDirectory("convkit-repair")
        let folder = dir.path + "/shared", alice = ["--store", dir.path + "/alice"], bob = ["--store", dir.path + "/bob"]
        let database = dir.path + "/alice/store.sqlite"
        func run(_ arguments: [String]) async throws -> ConvkitTests.Run { try await ConvkitTests.convkit(arguments) }
        #expect(try await run(["init", "--id", "alice", "--name", "Alice", "--zone-dir", folder, "--device", "laptop"] + alice).status == 0)
        #expect(try await run(["init", "--id", "bob", "--name", "Bob", "--zone-dir", folder, "--device", "phone"] + bob).status == 0)
        #expect(try await run(["send", "bob", "from alice", "--sync"] + alice).status == 0)
        #expect(try await run(["send", "alice", "from bob", "--sync"] + bob).status == 0)
        #expect(try await run(["doctor"] + alice).out.contains("is healthy"))
        let settings = try #require(try FileManager.default.attributesOfItem(atPath: dir.path + "/alice/convkit.json")[.posixPermissions] as? Int)
        #expect(settings & 0o777 == 0o600)

        // Truncated to its first page, its WAL gone: reported as damaged, and left as it is.
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: database))
        try handle.truncate(atOffset: 4096)
        try handle.close()
        for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: database + suffix) }
        let send = try await run(["send", "bob", "into the void"] + alice)
        #expect(send.status == 1 && send.err.contains("databaseCorrupt") && send.err.contains("damaged"), "\(send.err)")
        #expect(Self.size(database) == 4096, "the damaged database was replaced")
        let checked = try await run(["doctor"] + alice)
        #expect(checked.status == 1 && checked.out.contains("PROBLEM") && checked.out.contains("has no schema"), "\(checked.out)")

        // Emptied: the same.
        try Data().write(to: URL(fileURLWithPath: database))
        let messages = try await run(["messages", "bob"] + alice)
        #expect(messages.status == 1 && messages.err.contains("is empty"), "\(messages.err)")
        #expect(Self.size(database) == 0, "the empty database was migrated afresh")

        // Rebuilt from the folder with alice's key: both messages back, the damaged file kept.
        let rebuilt = try await run(["doctor", "--rebuild"] + alice)
        #expect(rebuilt.status == 0 && rebuilt.out.contains("rebuilt alice's store"), "\(rebuilt.out)\(rebuilt.err)")
        let shown = try await run(["messages", "bob"] + alice)
        #expect(shown.out.contains("Alice (alice): from alice") && shown.out.contains("Bob (bob): from bob"), "\(shown.out)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path + "/alice").contains { $0.hasPrefix("store.sqlite.damaged-") })
        #expect(try await run(["doctor"] + alice).status == 0)
        let after = try await run(["send", "bob", "after the rebuild", "--sync"] + alice)
        #expect(after.status == 0 && after.out.contains("synced"), "\(after.out)\(after.err)")
        #expect(try await run(["sync"] + bob).status == 0)
        #expect(try await run(["messages", "alice"] + bob).out.contains("Alice (alice): after the rebuild"))
    }

    /// `convkit recovery create` on the first device, the device lost, `convkit recovery restore`
    /// on a new machine with the code: the history is back and the store sends as the same
    /// speaker; a wrong code restores nothing.
    @Test func aLostFirstDeviceIsRestoredFromItsRecoveryCode() async throws {
        let dir = try TemporaryDirectory("convkit-recovery")
        let folder = dir.path + "/shared", alice = ["--store", dir.path + "/alice"], bob = ["--store", dir.path + "/bob"]
        func run(_ arguments: [String]) async throws -> ConvkitTests.Run { try await ConvkitTests.convkit(arguments) }
        #expect(try await run(["init", "--id", "alice", "--name", "Alice", "--zone-dir", folder, "--device", "laptop"] + alice).status == 0)
        #expect(try await run(["init", "--id", "bob", "--name", "Bob", "--zone-dir", folder, "--device", "phone"] + bob).status == 0)
        #expect(try await run(["whoami"] + alice).out.contains("no recovery code"))
        let created = try await run(["recovery", "create", "--json"] + alice)
        #expect(created.status == 0, "\(created.err)")
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(created.out.utf8)) as? [String: Any])
        let code = try #require(answer["code"] as? String)
        #expect(answer["synced"] as? Bool == true)
        #expect(try await run(["whoami"] + alice).out.contains("recovery code made"))
        #expect(try await run(["send", "bob", "before the loss", "--sync"] + alice).status == 0)
        #expect(try await run(["send", "alice", "reply before the loss", "--sync"] + bob).status == 0)
        try FileManager.default.removeItem(atPath: dir.path + "/alice")

        let wrongFile = dir.path + "/wrong", codeFile = dir.path + "/code"
        try Data((String(code.prefix(4) == "AAAA" ? "BBBB" : "AAAA") + code.dropFirst(4) + "\n").utf8).write(to: URL(fileURLWithPath: wrongFile))
        try Data((code + "\n").utf8).write(to: URL(fileURLWithPath: codeFile))
        let newAlice = ["--store", dir.path + "/alice-new"]
        let wrong = try await run(["recovery", "restore", "alice", "--code-file", wrongFile, "--zone-dir", folder, "--device", "desktop"] + newAlice)
        #expect(wrong.status == 1 && wrong.err.contains("wrongRecoveryCode") && wrong.err.contains("nothing was restored"), "\(wrong.err)")
        let restored = try await run(["recovery", "restore", "alice", "--code-file", codeFile, "--zone-dir", folder, "--device", "desktop"] + newAlice)
        #expect(restored.status == 0 && restored.out.contains("alice's first device again"), "\(restored.out)\(restored.err)")
        let shown = try await run(["messages", "bob"] + newAlice)
        #expect(shown.out.contains("Alice (alice): before the loss") && shown.out.contains("Bob (bob): reply before the loss"), "\(shown.out)")
        #expect(try await run(["send", "bob", "back again", "--sync"] + newAlice).status == 0)
        #expect(try await run(["sync"] + bob).status == 0)
        #expect(try await run(["messages", "alice"] + bob).out.contains("Alice (alice): back again"))
    }
}
