import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ConversationKit

/// A server learns an identity's key only from that identity: a participant who sends records
/// owned by someone who never connected cannot squat that identity.
@Suite struct ServerKeyLearningTests {
    @Test(arguments: ChatBackend.allCases.filter(\.isServer))
    func aParticipantCannotBindItsKeyToAnIdentityThatNeverConnected(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice")
        try await alice.sync()
        let aliceKey = try fixture.key(of: "alice")
        let raw = try fixture.rawBackend("alice", key: aliceKey)
        let zone = ChatRecords.conversationZone("alice", "dora")
        try await raw.createZone(zone)

        // A message named and spoken as dora, and dora's directory profile, signed by alice.
        var message = try ChatRecords.message(name: ChatRecords.messageName(speaker: "dora", clock: RecordClock(milliseconds: 1_800_000_000_000, counter: 0)),
                                              speaker: "dora", listener: "alice", content: "I am dora", spokenAt: 1_800_000_000_000, editedAt: nil)
        try message.sign(with: aliceKey, clock: RecordClock(milliseconds: 1_800_000_000_000, counter: 0))
        var profile = try #require(try ChatRecords.speaker(identifier: "dora", name: "Dora", tags: []).last)
        try profile.sign(with: aliceKey, clock: RecordClock(milliseconds: 1_800_000_000_000, counter: 1))
        guard case .failure(let error) = try await raw.save([message])[0] else {
            Issue.record("the server stored alice's message as dora's")
            return
        }
        #expect(error.code == .notAuthorized && error.message.contains("first record of 'dora'"), "\(error)")
        // The directory refuses dora's entry from alice (not hers to write).
        guard case .failure(let directory) = try await raw.save([profile])[0] else {
            Issue.record("the server stored alice's directory entry for dora")
            return
        }
        #expect(directory.code == .notAuthorized, "\(directory)")

        // The real dora then connects with her own key and is served.
        let dora = try await fixture.store("dora")
        try await dora.sync()
        let sent = try await dora.send("the real dora", to: "alice")
        try await dora.sync()
        #expect(try dora.message(sent.id)?.syncState == .synced)
        try await alice.sync()
        #expect(try alice.messages(in: sent.id.conversation).messages.map(\.content) == ["the real dora"])
    }
}
