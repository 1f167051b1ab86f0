import ConversationKit
import Foundation
@testable import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// The recovery code (docs/ENCRYPTION.md "Recovery"): a lost first device comes back on a new
/// machine with the code it wrote down, reads the whole history and sends as the same identity;
/// a wrong code restores nothing and says so; only the identity key makes a recovery record.
@Suite struct RecoveryTests {
    @Test(arguments: ChatBackend.allCases)
    func aLostFirstDeviceComesBackWithItsCodeReadsTheWholeHistoryAndSendsAsItself(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        var alice: ConversationStore? = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        try await syncAll([try #require(alice), bob])
        let code = try await #require(alice).createRecoveryCode()
        #expect(code.split(separator: "-").count == 13 && code.split(separator: "-").allSatisfy { $0.count == 4 })
        #expect(try #require(alice).recoveryCodeCreated() != nil)
        let first = try await #require(alice).send("the safe's code is 4711", to: "bob")
        try await syncAll([try #require(alice), bob])
        try await bob.send("and the key is under the mat", to: "alice")
        let group = try await bob.createGroup(name: "the heist", members: ["alice"], history: .all)
        try await bob.send("group plans", toGroup: group.id)
        try await syncAll([try #require(alice), bob])
        #expect(try history(try #require(alice), group.id).map(\.content) == ["group plans"])

        // The first device is lost: its directory is gone.
        alice = nil
        try FileManager.default.removeItem(atPath: fixture.storePath("alice"))
        let directory = fixture.storePath("alice-new")
        let restored = try await ConversationStore.restore(directory: directory, identifier: "alice", code: code.lowercased().replacingOccurrences(of: "-", with: " "),
                                                           backend: fixture.factory(device: "alice-new"))
        #expect(try restored.localSpeaker?.identifier == "alice")
        let pair = try history(restored, first.id.conversation)
        #expect(pair.map(\.content) == ["the safe's code is 4711", "and the key is under the mat"])
        #expect(pair.allSatisfy { !$0.isWaitingForKey })
        #expect(try history(restored, group.id).map(\.content) == ["group plans"])

        // It sends as alice, and bob reads it as hers.
        let back = try await restored.send("I am back", to: "bob")
        try await syncAll([restored, bob])
        let read = try #require(try bob.message(back.id))
        #expect(read.content == "I am back" && !read.isWaitingForKey && read.speaker == "alice")
        try await restored.send("me too", toGroup: group.id)
        try await syncAll([restored, bob])
        #expect(try history(bob, group.id).map(\.content) == ["group plans", "me too"])
    }

    @Test(arguments: [ChatBackend.memory, .http])
    func aWrongCodeRestoresNothingAndSaysSo(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice")
        let written = try await alice.createRecoveryCode()
        try await alice.sync()
        let directory = fixture.storePath("alice-new")
        let wrong = Recovery.text(of: Recovery.newCode())
        #expect(await code { _ = try await ConversationStore.restore(directory: directory, identifier: "alice", code: wrong, backend: fixture.factory(device: "alice-new")) } == .wrongRecoveryCode)
        #expect(!FileManager.default.fileExists(atPath: directory + "/speaker.key"), "a wrong code leaves no key behind")
        #expect(await code { _ = try await ConversationStore.restore(directory: directory, identifier: "alice", code: String(written.dropLast()), backend: fixture.factory(device: "alice-new")) } == .invalidRecoveryCode)
        // Someone who never made one.
        let bob = try await fixture.store("bob")
        try await bob.sync()
        #expect(await code { _ = try await ConversationStore.restore(directory: fixture.storePath("bob-new"), identifier: "bob", code: written, backend: fixture.factory(device: "bob-new")) } == .noRecoveryRecord)
        // A newer code replaces the older one.
        let newer = try await alice.createRecoveryCode()
        try await alice.sync()
        #expect(await code { _ = try await ConversationStore.restore(directory: directory, identifier: "alice", code: written, backend: fixture.factory(device: "alice-new")) } == .wrongRecoveryCode)
        let restored = try await ConversationStore.restore(directory: directory, identifier: "alice", code: newer, backend: fixture.factory(device: "alice-new"))
        #expect(try restored.localSpeaker?.identifier == "alice")
        // A directory that holds a store already is refused.
        #expect(await code { _ = try await ConversationStore.restore(directory: directory, identifier: "alice", code: newer, backend: fixture.factory(device: "alice-new")) } == .storeBelongsToAnotherSpeaker)
    }

    @Test func onlyTheIdentityKeyMakesARecoveryRecord() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        try await alice.sync()
        let tablet = try ConversationStore(directory: fixture.storePath("tablet"), backend: fixture.factory(device: "tablet"))
        try await tablet.setupLocalSpeaker(linking: try alice.linkDevice(), label: "tablet")
        #expect(await code { _ = try await tablet.createRecoveryCode() } == .notIdentityDevice)
        // A device that signs one anyway (to replace the real one with a box of its own key) is refused.
        let deviceKey = try KeyFile.load(from: fixture.storePath("tablet") + "/device.key")
        let reader = try fixture.rawBackend("alice", key: try fixture.key(of: "alice"))
        let zone = try ChatFixture.speakerZone("alice")
        let held = try await reader.fetchChanges(in: zone, since: nil, limit: 500).changedRecords
        #expect(held.contains { $0.recordType == DeviceCertificate.recordType })
        for (key, refused) in [(deviceKey, true), (try fixture.key(of: "alice"), false)] {
            var record = try Recovery.record(identity: "alice", seed: key.seed, code: Recovery.newCode(), opsLimit: 1, memLimit: 8192)
            try record.sign(with: key, clock: RecordClock(rawValue: UInt64.max >> 1))
            let reasons = ConversationStore.recordPolicy().check(held + [record])
            #expect(((reasons.last ?? nil) != nil) == refused, "\(String(describing: reasons.last ?? nil))")
            let saved = try await reader.save([record])[0]
            if refused {
                #expect(throws: RecordZoneError.self) { try saved.get() }
            } else {
                #expect(throws: Never.self) { try saved.get() }
            }
        }
    }

    @Test func theServerServesARecoveryRecordWithoutAuthenticationAndNothingElse() async throws {
        let fixture = try await ChatFixture(.http)
        let alice = try await fixture.store("alice")
        _ = try await alice.createRecoveryCode()
        try await alice.sync()
        let port = try #require(fixture.zoneServer).port
        let id = try Recovery.recordID(identity: "alice")
        let answer = try await RawConnection.exchange(port: port, method: "GET", path: "/v1/public/\(id.zone.rawValue)/\(id.name)")
        #expect(answer.status == 200)
        let outcome = try JSONDecoder().decode(Wire.Outcome.self, from: answer.body)
        #expect(try outcome.record.map { try Record(canonical: $0.bytes).recordType } == Recovery.recordType)
        // The profile in the same zone, and a recovery record's name in another zone, are not public.
        for path in ["/v1/public/\(id.zone.rawValue)/alice", "/v1/public/\(try ChatFixture.speakerZone("bob").rawValue)/\(id.name)", "/v1/public/speakers/alice"] {
            #expect(try await RawConnection.exchange(port: port, method: "GET", path: path).status == 404, "\(path)")
        }
    }

    @Test func theCodeReadsBackAsTyped() {
        for _ in 0..<50 {
            let code = Recovery.newCode()
            let text = Recovery.text(of: code)
            #expect(text.count == 13 * 4 + 12)
            #expect(Recovery.code(from: text) == code)
            #expect(Recovery.code(from: text.lowercased().replacingOccurrences(of: "-", with: " ")) == code)
            #expect(Recovery.code(from: text.replacingOccurrences(of: "O", with: "0").replacingOccurrences(of: "I", with: "1")) == code)
            #expect(Recovery.code(from: String(text.dropLast())) == nil)
            #expect(Recovery.code(from: text + "A") == nil)
        }
        // The last character carries 1 bit of the code and 4 zero bits: any other is not a code.
        let text = Recovery.text(of: Data(repeating: 0, count: 32))
        #expect(text.hasSuffix("AAAA"))
        #expect(Recovery.code(from: String(text.dropLast()) + "B") == nil)
        #expect(Recovery.code(from: String(text.dropLast()) + "Q") != nil)
        #expect(Recovery.code(from: String(text.dropLast()) + "8") == nil)
    }
}
