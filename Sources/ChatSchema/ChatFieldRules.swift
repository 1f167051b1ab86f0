import Foundation
import RecordZone

/// A chat record that breaks one of the chat model's field rules (docs/PROTOCOL.md §3): what a
/// reader refuses (quarantines as `schemaViolation`) beyond signature and ownership, which the
/// record policy already checked. Each rule has its code, so a caller (a store, a test, a
/// client's tool) can tell which one failed without reading the sentence.
public struct ChatViolation: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable, CaseIterable {
        /// An identifier the record names breaks the identifier rule (``ChatSchema/isValidIdentifier(_:)``).
        case invalidIdentifier
        /// A `Speaker` outside the directory and its speaker's own zone.
        case speakerOutsideItsZones
        /// A `ConversationMember` without `speaker`, whose participants are not its zone's, or
        /// whose speaker is not one of them.
        case memberNotOfItsZone
        /// A pair conversation the reader is not in.
        case notTheReadersConversation
        /// A `GroupChange` outside a group's zone, or one that does not parse.
        case malformedGroupChange
        /// An `EncryptionKey`, `HistoryShare` or `KeyShare` that does not parse.
        case malformedKeyRecord
        /// A `KeyShare` in a pair's zone between speakers other than its two participants.
        case keyShareOutsideConversation
        /// A message without `speaker`, or (not a tombstone) without content or `spokenAt`, or
        /// in a pair without `listener`.
        case incompleteMessage
        /// A message whose speaker and listener are not its pair's two participants.
        case messageOutsideConversation
        /// Content, or a reaction's emoji, over its limit.
        case tooLong
        /// A receipt from outside the conversation, or (not a tombstone) without `message` or `readAt`.
        case malformedReceipt
        /// A reaction from outside the conversation, whose name names no message or another
        /// message than its `message`, or (not a tombstone) without emoji or `reactedAt`.
        case malformedReaction
        /// A delivery from outside the conversation, or whose held list is malformed.
        case malformedDelivery
        /// A block from outside the conversation, or whose blocked speaker is not the other participant.
        case malformedBlock
    }

    public let code: Code
    /// The rule broken, in a sentence (what a quarantine entry shows).
    public let detail: String

    public init(_ code: Code, _ detail: String) {
        self.code = code
        self.detail = detail
    }

    public var description: String { detail }
}

extension ChatSchema {
    /// The field rule `record` breaks, or nil. `reader` is the local speaker, when there is one:
    /// a pair conversation it is not in is refused.
    public static func violation(of record: Record, reader: String?) -> ChatViolation? {
        ChatRecords.violation(of: record, reader: reader)
    }
}

extension ChatRecords {
    /// The longest message content, in UTF-8 bytes.
    package static let maximumContentBytes = 64 * 1024
    /// The longest reaction, in UTF-8 bytes.
    package static let maximumEmojiBytes = 64
    /// The most senders a Delivery record lists (a group's active speakers).
    package static let maximumDeliverySenders = 1000

    /// A Delivery's held-list entry, `"<count>:<message name>"`, when well formed.
    package static func heldEntry(_ entry: String) -> (count: Int64, newest: String)? {
        guard let colon = entry.firstIndex(of: ":"), let count = Int64(entry[..<colon]), count > 0 else { return nil }
        let newest = String(entry[entry.index(after: colon)...])
        return senderPrefix(ofMessage: newest) == nil ? nil : (count, newest)
    }

    /// Whether a message carries its content: in the clear (`content`) or sealed (`sealed`).
    package static func hasContent(_ record: Record) -> Bool {
        record.string("content") != nil || record[Sealing.sealedField]?.bytesValue != nil
    }

    /// `m.<h(sender)>.`: the part of a message's name that names its sender (what a Delivery
    /// record counts by).
    package static func senderPrefix(ofMessage name: String) -> Substring? {
        // Counted in bytes: the prefix is ASCII (`m.`, 16 hex digits, a dot), and a name's
        // length in characters costs a walk over it.
        let bytes = name.utf8, prefixLength = messagePrefix.utf8.count + 17
        guard bytes.count > prefixLength, name.hasPrefix(messagePrefix) else { return nil }
        let end = bytes.index(bytes.startIndex, offsetBy: prefixLength)
        guard bytes[bytes.index(before: end)] == UInt8(ascii: "."), bytes[..<end].allSatisfy({ $0 < 0x80 }) else { return nil }
        return name[..<end]
    }

    /// The message a reaction's name is for (`x.<h(reactor)>.<message name>`): what a tombstone,
    /// which keeps only its owner's field, still says.
    package static func reactionMessage(ofName name: String) -> String? {
        guard name.hasPrefix(reactionPrefix) else { return nil }
        let rest = name.dropFirst(reactionPrefix.count)
        guard let dot = rest.firstIndex(of: "."), rest.distance(from: rest.startIndex, to: dot) == 16 else { return nil }
        let message = rest[rest.index(after: dot)...]
        return message.isEmpty ? nil : String(message)
    }

    package static func violation(of record: Record, reader: String?) -> ChatViolation? {
        let zone = record.id.zone
        // Every identity a record names follows the identifier rule: no look-alike of anyone.
        let named = [record.recordType == speakerType ? record.id.name : nil, record.string("speaker"), record.string("listener"), record.string("reader")]
        if let bad = named.compactMap({ $0 }).first(where: { !isValidIdentifier($0) }) {
            return ChatViolation(.invalidIdentifier, "the identifier '\(bad)' breaks the identifier rule (a–z 0–9 . - _)")
        }
        switch record.recordType {
        case speakerType:
            let home = zone == speakersZone || zone == speakerZone(record.id.name)
            return home ? nil : ChatViolation(.speakerOutsideItsZones, "a Speaker record outside the directory and its speaker's zone")
        case memberType:
            guard let speaker = record.string("speaker") else { return ChatViolation(.memberNotOfItsZone, "member record without a speaker") }
            let participants = record["participants"]?.listValue?.compactMap(\.stringValue) ?? []
            guard participants.count == 2, participants[0] < participants[1], conversationZone(participants[0], participants[1]) == zone else {
                return ChatViolation(.memberNotOfItsZone, "member record whose participants do not match its zone")
            }
            guard participants.contains(speaker) else { return ChatViolation(.memberNotOfItsZone, "member is not a participant") }
            if let reader, !participants.contains(reader) { return ChatViolation(.notTheReadersConversation, "a conversation the local speaker is not in") }
            return nil
        case GroupChange.recordType:
            guard isGroupZone(zone) else { return ChatViolation(.malformedGroupChange, "a group change outside a group's zone") }
            do { _ = try GroupChange(record: record) } catch { return ChatViolation(.malformedGroupChange, error.description) }
            return nil
        case EncryptionKey.recordType:
            do { _ = try EncryptionKey.parts(record) } catch { return ChatViolation(.malformedKeyRecord, error.description) }
            return nil
        case HistoryShare.recordType:
            do { _ = try HistoryShare.parts(record) } catch { return ChatViolation(.malformedKeyRecord, error.description) }
            return nil
        case KeyShare.recordType:
            let parts: KeyShare.Parts
            do { parts = try KeyShare.parts(record) } catch { return ChatViolation(.malformedKeyRecord, error.description) }
            if !isGroupZone(zone), !isParticipant(parts.sender, in: zone) || !isParticipant(parts.recipient, in: zone) {
                return ChatViolation(.keyShareOutsideConversation, "a key share between speakers outside the conversation")
            }
            return nil
        case messageType where isGroupZone(zone):
            // Whether its speaker was in the group at its clock is decided when it is shown.
            guard record.string("speaker") != nil else { return ChatViolation(.incompleteMessage, "message without a speaker") }
            if record.isDeleted { return nil }
            guard hasContent(record), record.milliseconds("spokenAt") != nil else { return ChatViolation(.incompleteMessage, "message without content or spokenAt") }
            return contentTooLong(record)
        case messageType:
            guard let speaker = record.string("speaker") else { return ChatViolation(.incompleteMessage, "message without a speaker") }
            if record.isDeleted {
                return isParticipant(speaker, in: zone) ? nil : ChatViolation(.messageOutsideConversation, "message tombstone from outside the conversation")
            }
            guard let listener = record.string("listener"), hasContent(record), record.milliseconds("spokenAt") != nil else {
                return ChatViolation(.incompleteMessage, "message without listener, content or spokenAt")
            }
            guard isConversationZone(zone, of: speaker, listener), speaker != listener else {
                return ChatViolation(.messageOutsideConversation, "message whose speaker and listener do not match its conversation")
            }
            return contentTooLong(record)
        case receiptType:
            guard let reader = record.string("reader"), isGroupZone(zone) || isParticipant(reader, in: zone) else {
                return ChatViolation(.malformedReceipt, isGroupZone(zone) ? "receipt without a reader" : "receipt from outside the conversation")
            }
            if !record.isDeleted, record.string("message") == nil || record.milliseconds("readAt") == nil {
                return ChatViolation(.malformedReceipt, "receipt without message or readAt")
            }
            return nil
        case reactionType:
            guard let reactor = record.string("reactor"), isGroupZone(zone) || isParticipant(reactor, in: zone) else {
                return ChatViolation(.malformedReaction, "reaction from outside the conversation")
            }
            guard let message = reactionMessage(ofName: record.id.name) else { return ChatViolation(.malformedReaction, "a reaction's name that names no message") }
            if record.isDeleted { return nil }
            guard record.string("message") == message, record.milliseconds("reactedAt") != nil,
                  record[Sealing.sealedField]?.bytesValue != nil || !(record.string("emoji") ?? "").isEmpty
            else { return ChatViolation(.malformedReaction, "reaction without its message, emoji or reactedAt") }
            guard (record.string("emoji")?.utf8.count ?? 0) <= maximumEmojiBytes else { return ChatViolation(.tooLong, "a reaction over \(maximumEmojiBytes) bytes") }
            return nil
        case deliveryType:
            guard let member = record.string("member"), isValidIdentifier(member), isGroupZone(zone) || isParticipant(member, in: zone) else {
                return ChatViolation(.malformedDelivery, "delivery from outside the conversation")
            }
            if record.isDeleted { return nil }
            guard let held = record["held"]?.listValue, held.count <= maximumDeliverySenders,
                  held.allSatisfy({ $0.stringValue.flatMap(heldEntry) != nil }) else {
                return ChatViolation(.malformedDelivery, "a delivery whose held list is not up to \(maximumDeliverySenders) \"<count>:<message name>\" entries")
            }
            return nil
        case blockType:
            return blockViolation(record)
        default:
            return nil
        }
    }

    /// What is wrong with a `Block` record, or nil: it is in a pair's zone, its `blocker` is one
    /// participant and (but in a tombstone) its `blocked` the other.
    package static func blockViolation(_ record: Record) -> ChatViolation? {
        guard let blocker = record.string("blocker"), isParticipant(blocker, in: record.id.zone) else { return ChatViolation(.malformedBlock, "a block from outside the conversation") }
        if record.isDeleted { return nil }
        guard let blocked = record.string("blocked"), blocked != blocker, conversationZone(blocker, blocked) == record.id.zone else {
            return ChatViolation(.malformedBlock, "a block whose blocked speaker is not the conversation's other participant")
        }
        return nil
    }

    private static func contentTooLong(_ record: Record) -> ChatViolation? {
        (record.string("content")?.utf8.count ?? 0) <= maximumContentBytes ? nil : ChatViolation(.tooLong, "message content over 64 KiB")
    }
}

extension Record {
    /// A date field in milliseconds since 1970, rounded.
    package func milliseconds(_ field: String) -> Int64? {
        self[field]?.dateValue.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) }
    }
}
