import Foundation
import RecordZone
import Testing
@testable import ConversationKit

/// The chat model's field rules (ChatSchema): each coded violation is what a record breaking
/// that rule, and only it, gets; the records a store makes break none.
@Suite struct ChatFieldRulesTests {
    static let pair = ChatRecords.conversationZone("alice", "bob")
    static let group = ChatRecords.constantZone("g-" + ChatRecords.identityHash("alice") + "-0123456789abcdef")

    static func message(_ fields: [String: FieldValue], in zone: ZoneName = pair, deleted: Bool = false) throws -> Record {
        let name = ChatRecords.messageName(speaker: "alice", clock: RecordClock(rawValue: 1))
        var record = Record(id: try RecordID(zone: zone, name: name), type: ChatRecords.messageType, fields: fields)
        record.isDeleted = deleted
        return record
    }

    static let messageName = ChatRecords.messageName(speaker: "alice", clock: RecordClock(rawValue: 1))

    static func record(_ type: String, _ name: String, in zone: ZoneName = pair, _ fields: [String: FieldValue], deleted: Bool = false) throws -> Record {
        var record = Record(id: try RecordID(zone: zone, name: name), type: type, fields: fields)
        record.isDeleted = deleted
        return record
    }

    @Test func eachRuleHasItsCode() throws {
        let now = FieldValue.date(milliseconds: 1_700_000_000_000)
        let text = FieldValue.string("hi")
        let broken: [(ChatViolation.Code, Record, String?)] = [
            (.invalidIdentifier, try Self.message(["speaker": .string("Alice"), "listener": .string("bob"), "content": text, "spokenAt": now]), nil),
            (.speakerOutsideItsZones, try Self.record(ChatRecords.speakerType, "alice", in: ChatRecords.speakerZone("bob"), ["name": .string("Alice")]), nil),
            (.memberNotOfItsZone, try Self.record(ChatRecords.memberType, "member-alice", ["speaker": .string("alice"), "participants": .list([.string("alice"), .string("carol")])]), nil),
            (.memberNotOfItsZone, try Self.record(ChatRecords.memberType, "member-alice", ["participants": .list([.string("alice"), .string("bob")])]), nil),
            (.notTheReadersConversation, try ChatRecords.member("alice", with: "bob"), "carol"),
            (.malformedGroupChange, try Self.record(GroupChange.recordType, "gc.x", in: Self.pair, [:]), nil),
            (.malformedGroupChange, try Self.record(GroupChange.recordType, "gc.x", in: Self.group, [:]), nil),
            (.malformedKeyRecord, try Self.record(KeyShare.recordType, "ks.x", [:]), nil),
            (.keyShareOutsideConversation, try KeyShare.record(zone: Self.pair, sender: "alice", recipient: "carol", epoch: Data(repeating: 7, count: Sealing.epochLength),
                                                                boxes: [], device: Data(repeating: 1, count: 32)), nil),
            (.malformedKeyRecord, try Self.record(EncryptionKey.recordType, "ek.x", in: ChatRecords.speakerZone("alice"), [:]), nil),
            (.incompleteMessage, try Self.message(["listener": .string("bob"), "content": text, "spokenAt": now]), nil),
            (.incompleteMessage, try Self.message(["speaker": .string("alice"), "listener": .string("bob"), "spokenAt": now]), nil),
            (.incompleteMessage, try Self.message(["speaker": .string("alice"), "content": text, "spokenAt": now], ), nil),
            (.incompleteMessage, try Self.message(["speaker": .string("alice"), "content": text], in: Self.group), nil),
            (.messageOutsideConversation, try Self.message(["speaker": .string("alice"), "listener": .string("carol"), "content": text, "spokenAt": now]), nil),
            (.messageOutsideConversation, try Self.message(["speaker": .string("carol")], deleted: true), nil),
            (.tooLong, try Self.message(["speaker": .string("alice"), "listener": .string("bob"), "content": .string(String(repeating: "x", count: Message.maximumContentBytes + 1)), "spokenAt": now]), nil),
            (.tooLong, try Self.record(ChatRecords.reactionType, ChatRecords.reactionName(for: Self.messageName, reactor: "bob"), [
                "reactor": .string("bob"), "message": .string(Self.messageName), "emoji": .string(String(repeating: "👍", count: 17)), "reactedAt": now]), nil),
            (.malformedReceipt, try Self.record(ChatRecords.receiptType, ChatRecords.receiptName(for: Self.messageName, reader: "carol"), ["reader": .string("carol"), "message": .string(Self.messageName), "readAt": now]), nil),
            (.malformedReceipt, try Self.record(ChatRecords.receiptType, ChatRecords.receiptName(for: Self.messageName, reader: "bob"), ["reader": .string("bob"), "readAt": now]), nil),
            (.malformedReceipt, try Self.record(ChatRecords.receiptType, ChatRecords.receiptName(for: Self.messageName, reader: "bob"), in: Self.group, ["message": .string(Self.messageName)]), nil),
            (.malformedReaction, try Self.record(ChatRecords.reactionType, ChatRecords.reactionName(for: Self.messageName, reactor: "carol"), [
                "reactor": .string("carol"), "message": .string(Self.messageName), "emoji": .string("👍"), "reactedAt": now]), nil),
            (.malformedReaction, try Self.record(ChatRecords.reactionType, ChatRecords.reactionName(for: Self.messageName, reactor: "bob"), [
                "reactor": .string("bob"), "message": .string("m.other"), "emoji": .string("👍"), "reactedAt": now]), nil),
            (.malformedReaction, try Self.record(ChatRecords.reactionType, "x.nothing", ["reactor": .string("bob")], deleted: true), nil),
            (.malformedDelivery, try Self.record(ChatRecords.deliveryType, "d.x", ["member": .string("carol"), "held": .list([])]), nil),
            (.malformedDelivery, try Self.record(ChatRecords.deliveryType, "d.x", ["member": .string("bob"), "held": .list([.string("0:" + Self.messageName)])]), nil),
            (.malformedBlock, try Self.record(ChatRecords.blockType, "block-carol", ["blocker": .string("carol"), "blocked": .string("alice")]), nil),
            (.malformedBlock, try Self.record(ChatRecords.blockType, "block-bob", ["blocker": .string("bob"), "blocked": .string("bob")]), nil),
        ]
        for (code, record, reader) in broken {
            let violation = ChatSchema.violation(of: record, reader: reader)
            #expect(violation?.code == code, "\(record.recordType) \(record.id.name): \(String(describing: violation))")
            #expect(violation.map { !$0.detail.isEmpty } ?? true)
        }
        // Every code is reached by at least one of the records above.
        #expect(Set(broken.map(\.0)) == Set(ChatViolation.Code.allCases))

        // What the store makes passes, also as tombstones where a tombstone keeps only its owner's field.
        let made: [Record] = try ChatRecords.speaker(identifier: "alice", name: "Alice", tags: []) + [
            ChatRecords.member("alice", with: "bob"),
            ChatRecords.message(name: Self.messageName, speaker: "alice", listener: "bob", content: "hi", spokenAt: 1, editedAt: nil),
            ChatRecords.message(name: Self.messageName, speaker: "alice", listener: nil, in: Self.group, content: "hi", spokenAt: 1, editedAt: nil),
            ChatRecords.reaction(zone: Self.pair, message: Self.messageName, reactor: "bob", emoji: "👍", reactedAt: 1),
            ChatRecords.receipt(zone: Self.pair, message: Self.messageName, reader: "bob", readAt: 1),
            Self.record(ChatRecords.deliveryType, "d.x", ["member": .string("bob"), "held": .list([.string("3:" + Self.messageName)])]),
            Self.record(ChatRecords.blockType, "block-bob", ["blocker": .string("bob"), "blocked": .string("alice")]),
            Self.message(["speaker": .string("alice")], deleted: true),
            KeyShare.record(zone: Self.pair, sender: "alice", recipient: "bob", epoch: Data(repeating: 7, count: Sealing.epochLength), boxes: [], device: Data(repeating: 1, count: 32)),
        ]
        for record in made {
            #expect(ChatSchema.violation(of: record, reader: "alice") == nil, "\(record.recordType) \(record.id.name)")
        }
    }
}
