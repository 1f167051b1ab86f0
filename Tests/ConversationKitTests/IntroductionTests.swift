import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ConversationKit

/// One impostor `bob` on a shared folder: a newcomer is told bob is in conflict (not that bob
/// does not exist), sees exactly the two claimed keys, and gets in through an introduction by
/// someone whose key it holds — not through one forged, altered, or signed by a stranger.
@Suite struct IntroductionTests {
    @Test func aNewcomerSettlesAnImpostorConflictThroughAnIntroduction() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        _ = try await alice.send("hi", to: "bob")
        try await syncAll([alice, bob])
        let impostor = try ConversationStore(directory: fixture.storePath("impostor"), backend: fixture.factory(device: "impostor"))
        try await impostor.setupLocalSpeaker(identifier: "bob", name: "Bob")
        try await impostor.sync()
        let dave = try await fixture.store("dave")
        try await dave.sync()

        #expect(try await dave.speakerExists("alice"))
        await #expect { try await dave.speakerExists("bob") } throws: { ($0 as? ConversationError)?.code == .keyConflict }
        let bobFingerprint = try #require(try bob.speaker(fromRef: SpeakerRef(identifier: "bob"))?.fingerprint)
        let impostorFingerprint = try #require(try impostor.speaker(fromRef: SpeakerRef(identifier: "bob"))?.fingerprint)
        #expect(Set(try dave.candidateFingerprints(for: "bob")) == [bobFingerprint, impostorFingerprint])

        // Refused: altered, forged (alice's name, mallory's key), from a stranger.
        let text = try alice.introduction(of: "bob")
        var altered = Array(text)
        altered[altered.count - 5] = altered[altered.count - 5] == "A" ? "B" : "A"
        await #expect { try await dave.trust(introduction: String(altered)) } throws: { ($0 as? ConversationError)?.code == .invalidIntroduction }
        let impostorKey = try KeyFile.load(from: fixture.storePath("impostor") + "/speaker.key")
        let forged = Introduction.issue(of: "bob", key: impostorKey.publicKey, by: "alice", signingKey: SigningKey.generate()).text
        await #expect { try await dave.trust(introduction: forged) } throws: { ($0 as? ConversationError)?.code == .keyConflict }
        let stranger = Introduction.issue(of: "bob", key: impostorKey.publicKey, by: "erin", signingKey: SigningKey.generate()).text
        await #expect { try await dave.trust(introduction: stranger) } throws: { ($0 as? ConversationError)?.code == .keyConflict }
        #expect(try dave.speaker(fromRef: SpeakerRef(identifier: "bob"))?.fingerprint == nil, "nothing pinned by the refused ones")

        // Alice's introduction settles it: bob is the real bob, verified.
        let (introduced, introducer) = try await dave.trust(introduction: text)
        #expect(introduced == "bob" && introducer == "alice")
        let settled = try #require(try dave.speaker(fromRef: SpeakerRef(identifier: "bob")))
        #expect(settled.fingerprint == bobFingerprint && settled.trust == .verified)
        #expect(try await dave.speakerExists("bob"))
        let sent = try await dave.send("hello bob", to: "bob")
        try await syncAll([dave, bob])
        #expect(try bob.messages(in: sent.id.conversation).messages.map(\.content) == ["hello bob"])
    }
}
