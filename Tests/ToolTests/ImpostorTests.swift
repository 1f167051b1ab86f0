import Foundation
import Testing
import TestSupport

/// One impostor `init --id bob` on a shared folder, as a newcomer meets it: `records verify`
/// names each bad record once and the conflict with exactly the two claimed keys, `send` says
/// bob is in conflict (not that bob does not exist), `fingerprint` lists the two keys, and an
/// introduction by alice lets the newcomer in.
@Suite struct ImpostorTests {
    @Test func aNewcomerMeetsAnImpostorAndGetsInThroughAnIntroduction() async throws {
        let dir = try TemporaryDirectory("convkit-impostor")
        let folder = dir.path + "/shared"
        func store(_ name: String) -> [String] { ["--store", dir.path + "/" + name] }
        func run(_ arguments: [String]) async throws -> ConvkitTests.Run { try await ConvkitTests.convkit(arguments) }
        func fingerprint(_ name: String) async throws -> String {
            try #require((try await run(["whoami", "--json"] + store(name)).json as? [String: Any])?["fingerprint"] as? String)
        }
        #expect(try await run(["init", "--id", "alice", "--name", "Alice", "--zone-dir", folder, "--device", "laptop"] + store("alice")).status == 0)
        #expect(try await run(["init", "--id", "bob", "--name", "Bob", "--zone-dir", folder, "--device", "phone"] + store("bob")).status == 0)
        #expect(try await run(["send", "bob", "hi", "--sync"] + store("alice")).status == 0)
        #expect(try await run(["send", "alice", "hi alice", "--sync"] + store("bob")).status == 0)
        #expect(try await run(["init", "--id", "bob", "--name", "Bob", "--zone-dir", folder, "--device", "evil"] + store("impostor")).status == 0)
        #expect(try await run(["init", "--id", "carol", "--name", "Carol", "--zone-dir", folder, "--device", "c"] + store("carol")).status == 0)
        let real = try await fingerprint("bob"), fake = try await fingerprint("impostor")

        let verify = try await run(["records", "verify", "--zone-dir", folder])
        let lines = verify.out.split(separator: "\n").map(String.init)
        #expect(verify.status == 1 && Set(lines).count == lines.count, "no line twice: \(verify.out)")
        let conflict = try #require(lines.first { $0.hasPrefix("CONFLICT bob: claimed by 2 unrelated keys") }, "\(verify.out)")
        #expect(conflict.contains(real) && conflict.contains(fake))

        let send = try await run(["send", "bob", "hello?"] + store("carol"))
        #expect(send.status == 1 && send.err.contains("claimed with unrelated keys"), "\(send.err)")
        let candidates = try #require((try await run(["fingerprint", "bob", "--json"] + store("carol")).json as? [String: Any])?["candidates"] as? [String])
        #expect(Set(candidates) == [real, fake], "exactly the claimed keys: \(candidates)")

        #expect(try await run(["send", "alice", "hi, carol here", "--sync"] + store("carol")).status == 0)
        let introduction = try await run(["introduce", "bob"] + store("alice")).out.trimmingCharacters(in: .whitespacesAndNewlines)
        let trusted = try await run(["trust", "bob", "--introduction", introduction] + store("carol"))
        #expect(trusted.status == 0 && trusted.out.contains("bob verified (introduced by alice)"), "\(trusted.out)\(trusted.err)")
        #expect(try await run(["fingerprint", "bob"] + store("carol")).out.contains("\(real)  (verified)"))
        #expect(try await run(["send", "bob", "hello bob", "--sync"] + store("carol")).out.contains("synced"))
    }
}
