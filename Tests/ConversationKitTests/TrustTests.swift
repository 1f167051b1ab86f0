import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// The trust model as a hostile participant tries it: owners come from record IDs.
@Suite struct TrustTests {
    /// Bob, a participant, signs versions of alice's message, member and receipt records with
    /// his own key — rewritten to name himself, or tombstones with the largest clock. The backend
    /// refuses them; planted past it anyway, every store refuses them and the originals stay.
    @Test(arguments: ChatBackend.allCases)
    func aParticipantCannotRewriteOrEraseTheOthersRecords(_ kind: ChatBackend) async throws {
        let fixture = try ChatFixture(kind)
        let alice = try fixture.store("alice"), bob = try fixture.store("bob")
        let sent = try alice.send("the original", to: "bob")
        try await syncAll([alice, bob])
        let reply = try bob.send("a reply", to: "alice")
        try await syncAll([alice, bob])
        try alice.markAsRead(reply.id)
        try await syncAll([alice, bob])
        #expect(try bob.message(reply.id)?.readAt != nil)

        let bobKey = try fixture.key(of: "bob")
        let zone = try ZoneName(sent.id.conversation)
        let top = RecordClock(rawValue: .max - 1)
        func hostile(_ name: String, _ type: String, _ fields: [String: FieldValue], deleted: Bool = false) throws -> Record {
            var record = Record(id: try RecordID(zone: zone, name: name), type: type, fields: fields)
            record.isDeleted = deleted
            try record.sign(with: bobKey, clock: top)
            return record
        }
        let spokenAt = FieldValue.date(milliseconds: 1_800_000_000_000)
        let receiptName = "r.\(OwnershipRule.identityHash("alice")).\(reply.id.name)"
        let forged = [
            try hostile(sent.id.name, "Message", ["speaker": .string("bob"), "listener": .string("alice"), "content": .string("bob was here"), "spokenAt": spokenAt]),
            try hostile(sent.id.name, "Message", ["speaker": .string("alice")], deleted: true),
            try hostile(sent.id.name, "Message", ["speaker": .string("bob")], deleted: true),
            try hostile("member-alice", "ConversationMember", ["speaker": .string("alice"), "participants": .list([.string("alice"), .string("bob")])], deleted: true),
            try hostile(receiptName, "Receipt", ["reader": .string("alice"), "message": .string(reply.id.name), "readAt": .date(milliseconds: 0)]),
            try hostile(receiptName, "Receipt", ["reader": .string("alice")], deleted: true),
        ]
        let results = try await fixture.rawBackend("bob", key: bobKey).save(forged)
        for (record, result) in zip(forged, results) {
            guard case .failure(let error) = result else {
                Issue.record("the backend accepted bob's version of \(record.id)")
                continue
            }
            #expect(error.code == .notAuthorized, "\(record.id): \(error)")
        }

        for record in forged { try await fixture.plant(try record.encoded(), in: zone) }
        try await syncAll([alice, bob])
        for store in [alice, bob] {
            #expect(try store.message(sent.id)?.content == "the original")
            #expect(try store.message(reply.id)?.readAt != nil)
            let conversation = try #require(try store.conversations().first)
            #expect(conversation.startedBy == "alice")
            #expect(try store.quarantine().count == forged.count)
        }
    }
}
