import Foundation
import Testing
import TestSupport

/// `convkit` beside a running `convkitd sync` on the same folder store: commands that sync,
/// query or send work (reading the folder as an observer; the daemon pushes), and `send --sync`
/// reports the committed message with its ID.
@Suite struct DaemonBesideCLITests {
    @Test func sendFindAndSyncWorkWhileTheDaemonHoldsTheFolderDevice() async throws {
        let dir = try TemporaryDirectory("convkit-beside")
        let folder = dir.path + "/shared", alice = ["--store", dir.path + "/alice"], bob = ["--store", dir.path + "/bob"]
        func run(_ arguments: [String]) async throws -> ConvkitTests.Run { try await ConvkitTests.convkit(arguments) }
        #expect(try await run(["init", "--id", "alice", "--name", "Alice", "--zone-dir", folder, "--device", "laptop"] + alice).status == 0)
        #expect(try await run(["init", "--id", "bob", "--name", "Bob", "--tag", "linux", "--zone-dir", folder, "--device", "phone"] + bob).status == 0)
        let daemon = try ChildProcess(try builtProduct("convkitd"), ["sync", "--zone-dir", folder, "--device", "laptop", "--poll-interval", "1"] + alice)
        defer { daemon.kill(SIGTERM) }
        #expect(await daemon.waitUntil(seconds: 30) { $0.standardError.contains("syncing") }, "\(daemon.standardError)")

        let sent = try await run(["send", "bob", "while the daemon runs", "--sync", "--json"] + alice)
        #expect(sent.status == 0, "\(sent.err)")
        let message = try #require(sent.json as? [String: Any], "\(sent.out)")
        let id = try #require(message["id"] as? String)
        #expect(message["state"] as? String == "synced", "the daemon pushed it: \(sent.out) \(sent.err)")
        let found = try await run(["find", "--tag", "linux", "--json"] + alice)
        #expect(found.status == 0 && (found.json as? [[String: Any]])?.map { $0["identifier"] as? String } == ["bob"], "\(found.out)\(found.err)")
        let synced = try await run(["sync"] + alice)
        #expect(synced.status == 0, "\(synced.err)")

        #expect(try await run(["sync"] + bob).status == 0)
        let shown = try await run(["messages", "alice", "--json"] + bob)
        #expect(((shown.json as? [String: Any])?["messages"] as? [[String: Any]])?.contains { $0["id"] as? String == id } == true, "\(shown.out)")
        daemon.kill(SIGTERM)
        #expect(await daemon.wait() == 0, "\(daemon.standardError)")
    }
}
