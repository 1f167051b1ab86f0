import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ConversationKit

/// A revocation read after what it revokes: bob reads the revoked laptop's later message before
/// the revocation reaches him; once it does, he decides that message again by the same rule —
/// it leaves his view (quarantined, with why) — and ends where a reader that read the
/// revocation first ends (his own cache cleared and read again, and alice).
@Suite struct LateRevocationTests {
    @Test(arguments: ChatBackend.allCases)
    func aRevocationReadLateIsAppliedToWhatWasAlreadyAccepted(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        let laptop = try await DeviceTests().linkLaptop(fixture, from: alice)
        let before = try await laptop.send("before", to: "bob")
        try await syncAll([laptop, alice, bob])

        // Alice revokes the laptop on her phone, which does not sync yet; the laptop (a thief's
        // now) sends, and bob reads it before the revocation exists anywhere he can see.
        let device = try #require(try alice.devices().first { $0.label == "laptop" })
        try await alice.revokeDevice(device)
        try await Task.sleep(for: .milliseconds(5))
        _ = try await laptop.send("after the revocation", to: "bob")
        try await laptop.sync()
        try await bob.sync()
        let conversation = before.id.conversation
        #expect(try history(bob, conversation).map(\.content) == ["before", "after the revocation"], "bob read it first")

        // The revocation reaches the backend, then bob.
        try await alice.sync()
        try await bob.sync()
        let shown = try history(bob, conversation).map(\.content)
        #expect(shown == ["before"], "\(kind): \(shown)")
        let quarantine = try bob.quarantine()
        #expect(quarantine.contains { $0.code == .deviceRevoked }, "\(quarantine)")
        // The same view as a reader that reads everything with the revocation already known.
        try await alice.sync()
        #expect(try history(alice, conversation).map(\.content) == shown)
        try await bob.clearAllCachedData()
        try await bob.sync()
        #expect(try history(bob, conversation).map(\.content) == shown)
    }
}

extension LateRevocationTests {
    /// A thief's laptop deletes alice's messages (one written on her phone, one on the laptop
    /// before it was stolen) before the revocation reaches the backend. A server keeps one version
    /// per record, so its tombstones replace the messages there: a reader that never held them
    /// would find nothing, while bob, who did, keeps showing them. Alice's phone, reading the
    /// refused tombstones of her own messages, states her messages again; the server does not let
    /// a version its pins no longer allow win a merge. Every reader ends showing both, as a reader
    /// that read the revocation first does.
    @Test(arguments: ChatBackend.allCases)
    func aRevokedDevicesOverwritesOfOlderVersionsAreUndone(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        let laptop = try await DeviceTests().linkLaptop(fixture, from: alice)
        let fromPhone = try await alice.send("from the phone", to: "bob")
        let fromLaptop = try await laptop.send("from the laptop", to: "bob")
        try await syncAll([laptop, alice, bob])
        let conversation = fromPhone.id.conversation
        #expect(try history(bob, conversation).map(\.content) == ["from the phone", "from the laptop"])

        let device = try #require(try alice.devices().first { $0.label == "laptop" })
        try await alice.revokeDevice(device)
        try await Task.sleep(for: .milliseconds(5))
        try await laptop.delete(fromPhone.id)
        try await laptop.delete(fromLaptop.id)
        try await laptop.sync()
        try await bob.sync()
        #expect(try history(bob, conversation).isEmpty, "bob read the deletions before the revocation")

        try await alice.sync()
        try await alice.sync()
        try await bob.sync()
        let expected = ["from the phone", "from the laptop"]
        #expect(try history(alice, conversation).map(\.content) == expected, "\(kind): alice")
        #expect(try history(bob, conversation).map(\.content) == expected, "\(kind): bob")
        try await bob.clearAllCachedData()
        try await bob.sync()
        #expect(try history(bob, conversation).map(\.content) == expected, "\(kind): bob read again")
    }

    /// A stranger's forged version of alice's message (a later clock, mallory's key) is a key
    /// conflict, not a revoked device's overwrite: alice's store does not sign her message again
    /// for it (a forger could otherwise make her re-sign at will), and her version stays as it was.
    @Test(arguments: [ChatBackend.memory, .filesystem])
    func aStrangersForgeryIsNotAnsweredByStatingAgain(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice")
        let sent = try await alice.send("mine", to: "bob")
        try await alice.sync()
        let held = try #require(try alice.records(in: sent.id.conversation).first { $0.id.name == sent.id.name })
        var forged = held
        forged.fields["content"] = .string("forged")
        try forged.sign(with: try SigningKey(seed: Data(repeating: 66, count: 32)),
                        clock: RecordClock(milliseconds: held.clock.milliseconds + 60_000, counter: 0))
        try await fixture.plant(try forged.encoded(), in: held.id.zone)
        try await alice.sync()
        try await alice.sync()
        #expect(try alice.quarantine().contains { $0.name == sent.id.name && $0.code == .keyConflict })
        let after = try #require(try alice.records(in: sent.id.conversation).first { $0.id.name == sent.id.name })
        #expect(after.signature == held.signature, "\(kind): alice signed her message again for a forgery")
        #expect(try alice.pendingChangeCount() == 0)
    }
}
