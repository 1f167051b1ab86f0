import Foundation
import Testing
import TestSupport

/// `convkit device revoke` right after a device joined: the first device syncs to learn of it
/// instead of saying there is no such device.
@Suite struct DeviceRevokeTests {
    @Test func aDeviceJustLinkedCanBeRevokedAtOnce() async throws {
        let dir = try TemporaryDirectory("convkit-revoke")
        let folder = dir.path + "/shared", alice = ["--store", dir.path + "/alice"], tablet = ["--store", dir.path + "/tablet"]
        func run(_ arguments: [String]) async throws -> ConvkitTests.Run { try await ConvkitTests.convkit(arguments) }
        #expect(try await run(["init", "--id", "alice", "--name", "Alice", "--zone-dir", folder, "--device", "laptop"] + alice).status == 0)
        // With --json, each says what it did as JSON (the text form is as tested elsewhere).
        let link = try await run(["device", "link", "--json"] + alice)
        let code = try #require((link.json as? [String: Any])?["code"] as? String, "\(link.out)")
        let joined = try await run(["device", "join", code, "--zone-dir", folder, "--device", "tablet", "--json"] + tablet)
        #expect((joined.json as? [String: Any])?["identifier"] as? String == "alice", "\(joined.out) \(joined.err)")
        let revoked = try await run(["device", "revoke", "tablet", "--json"] + alice)
        #expect(revoked.status == 0 && (revoked.json as? [String: Any])?["revoked"] as? String == "tablet", "\(revoked.out)\(revoked.err)")
        let unknown = try await run(["device", "revoke", "phone"] + alice)
        #expect(unknown.status == 1 && unknown.err.contains("no other device 'phone'"), "\(unknown.err)")
    }
}
