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
        let code = try await run(["device", "link"] + alice).out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try await run(["device", "join", code, "--zone-dir", folder, "--device", "tablet"] + tablet).status == 0)
        let revoked = try await run(["device", "revoke", "tablet"] + alice)
        #expect(revoked.status == 0 && revoked.out.contains("tablet revoked"), "\(revoked.out)\(revoked.err)")
        let unknown = try await run(["device", "revoke", "phone"] + alice)
        #expect(unknown.status == 1 && unknown.err.contains("no other device 'phone'"), "\(unknown.err)")
    }
}
