import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ConversationKit

/// One spelling per person: identifiers are `a–z 0–9 . - _`, so `Ａlice` (fullwidth), `аlice`
/// (Cyrillic а), `Alice` or `a b` cannot pass for `alice` — refused at setup, by every reader
/// and by a chat server.
@Suite struct IdentifierRuleTests {
    static let lookalikes = ["\u{FF21}lice", "\u{430}lice", "Alice", "a b", "alice\u{200B}", "-alice", ".alice", "_alice", "device.x", String(repeating: "a", count: 65)]

    @Test func lookAlikeIdentifiersAreRefusedAtSetup() async throws {
        let fixture = try await ChatFixture(.memory)
        for (index, identifier) in Self.lookalikes.enumerated() {
            let store = try ConversationStore(directory: fixture.storePath("s\(index)"), backend: fixture.factory(device: "d"))
            await #expect { try await store.setupLocalSpeaker(identifier: identifier, name: "Alice") } throws: {
                ($0 as? ConversationError)?.code == .invalidIdentifier
            }
        }
        for identifier in ["alice", "alice.smith-2", "bob_99", "7of9"] { #expect(ChatRecords.isValidIdentifier(identifier), "\(identifier)") }
    }

    /// A hostile writer's profile and message under a look-alike identifier: quarantined by a
    /// reader as breaking the rule.
    @Test func aReaderRefusesRecordsOfALookAlikeIdentifier() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let bob = try await fixture.store("bob")
        try await bob.sync()
        let fake = "\u{FF41}lice"  // fullwidth small a
        let key = SigningKey.generate()
        var profile = Record(id: try RecordID(zone: ChatRecords.speakersZone, name: fake), type: ChatRecords.speakerType,
                             fields: ["name": .string("Alice"), "tags": .list([.string("x")])])
        try profile.sign(with: key, clock: RecordClock(milliseconds: 1_800_000_000_000, counter: 0))
        try await fixture.plant(try profile.encoded(), in: ChatRecords.speakersZone)
        _ = try await bob.speakers(matching: SpeakerQuery(tag: "x"))
        try await bob.sync()
        #expect(try bob.allKnownSpeakers().contains { $0.identifier == fake } == false)
        let refusals = try bob.quarantine().filter { $0.code == .schemaViolation }
        #expect(refusals.contains { $0.reason.contains("identifier rule") }, "\(refusals)")
    }

    /// A chat server gives an identity that breaks the rule nothing: not even its own zone.
    @Test(arguments: ChatBackend.allCases.filter(\.isServer))
    func aChatServerRefusesALookAlikeIdentity(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let fake = "\u{FF41}lice"
        let backend = HTTPBackend(url: try #require(fixture.serverURL), identity: fake, key: SigningKey.generate(), policy: ConversationStore.recordPolicy())
        await #expect { try await backend.createZone(ChatRecords.speakerZone(fake)) } throws: { ($0 as? RecordZoneError)?.code == .notAuthorized }
        await #expect { try await backend.fetchChanges(in: ChatRecords.speakersZone, since: nil, limit: 10) } throws: {
            ($0 as? RecordZoneError)?.code == .notAuthorized
        }
    }
}
