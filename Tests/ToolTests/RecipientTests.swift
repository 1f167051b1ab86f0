import Foundation
import Testing
import TestSupport

/// A recipient must exist or be meant: a typo is refused, `--new` sends to someone new, and a
/// conversation can be removed from the store.
@Suite struct RecipientTests {
    @Test func aTypoIsRefusedANewRecipientIsMeantAndAConversationCanBeRemoved() async throws {
        let dir = try TemporaryDirectory("convkit-recipients")
        let folder = dir.path + "/shared", alice = ["--store", dir.path + "/alice"], bob = ["--store", dir.path + "/bob"]
        func run(_ arguments: [String]) async throws -> ConvkitTests.Run { try await ConvkitTests.convkit(arguments) }
        #expect(try await run(["init", "--id", "alice", "--name", "Alice", "--zone-dir", folder, "--device", "laptop"] + alice).status == 0)
        let bobInit = try await run(["init", "--id", "bob", "--name", "Bob", "--zone-dir", folder, "--device", "phone", "--json"] + bob)
        #expect((bobInit.json as? [String: Any])?["published"] as? Bool == true, "init publishes the profile: \(bobInit.out)")

        let typo = try await run(["send", "nobodyatall", "typo"] + alice)
        #expect(typo.status == 1 && typo.err.contains("nobody called 'nobodyatall'") && typo.err.contains("--new"), "\(typo.err)")
        #expect((try await run(["conversations", "--json"] + alice).json as? [Any])?.isEmpty == true, "no conversation with nobody")
        let chat = try await run(["chat", "nobodyatall"] + alice)
        #expect(chat.status == 1 && chat.err.contains("nobody called 'nobodyatall'"), "\(chat.err)")

        // Bob published his profile when he was set up: found on the folder.
        #expect(try await run(["send", "bob", "hi bob", "--sync"] + alice).out.contains("synced"))
        // Someone who has not published yet, on purpose.
        let carol = try await run(["send", "carol", "welcome", "--new"] + alice)
        #expect(carol.status == 0, "\(carol.err)")
        #expect(try await run(["conversations"] + alice).out.contains("carol"))
        #expect(try await run(["conversations", "remove", "carol"] + alice).out.contains("removed"))
        let left = try await run(["conversations", "--json"] + alice)
        #expect((left.json as? [[String: Any]])?.map { $0["with"] as? String } == ["bob"], "\(left.out)")
        #expect(try await run(["outbox", "--json"] + alice).out.contains("carol") == false)
        let again = try await run(["conversations", "remove", "carol"] + alice)
        #expect(again.status == 1 && again.err.contains("no conversation with 'carol'"))

        // Offline: whether someone exists cannot be known; said so, and --new still sends.
        let offline = ["--store", dir.path + "/offline"]
        let initialized = try await run(["init", "--id", "dave", "--name", "Dave", "--server", "http://127.0.0.1:9", "--offline"] + offline)
        #expect(initialized.status == 0 && initialized.err.contains("not published yet"), "\(initialized.err)")
        let unknown = try await run(["send", "erin", "hello"] + offline)
        #expect(unknown.status == 1 && unknown.err.contains("cannot check whether 'erin' exists"), "\(unknown.err)")
        #expect(try await run(["send", "erin", "hello", "--new"] + offline).status == 0)
    }
}
