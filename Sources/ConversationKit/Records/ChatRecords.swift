import Foundation
import RecordZone

/// Building chat records, and the identifier rule's typed error (the schema itself: ChatSchema).
extension ChatRecords {
    /// Checks a speaker identifier against ``isValidIdentifier(_:)``.
    static func validate(identifier: String) throws(ConversationError) {
        guard !identifier.isEmpty else { throw ConversationError(.invalidIdentifier, "a speaker identifier may not be empty") }
        guard isValidIdentifier(identifier) else {
            throw ConversationError(.invalidIdentifier, "speaker identifier '\(identifier)' breaks the identifier rule: 1–\(maximumIdentifierBytes) characters of a–z 0–9 . - _, "
                                    + "starting with a letter or digit, not with \(reservedPrefixes.joined(separator: ", ")) (no capitals, look-alike letters or spaces)")
        }
    }

    // MARK: Building records

    /// A profile: the version in the speaker's own zone, and its copy in the directory. The
    /// avatar is an asset (a capped PNG) with its pixel size: `avatar`, `avatarWidth`,
    /// `avatarHeight`.
    static func speaker(identifier: String, name: String, tags: [String], avatar: AvatarReference? = nil) throws(RecordZoneError) -> [Record] {
        var fields: [String: FieldValue] = ["name": .string(name), "tags": .list(tags.map { .string($0) })]
        if let avatar {
            fields["avatar"] = .asset(avatar.asset)
            fields["avatarWidth"] = .int(Int64(avatar.size.width))
            fields["avatarHeight"] = .int(Int64(avatar.size.height))
        }
        return [Record(id: try RecordID(zone: speakerZone(identifier), name: identifier), type: speakerType, fields: fields),
                Record(id: try RecordID(zone: speakersZone, name: identifier), type: speakerType, fields: fields)]
    }

    static func member(_ speaker: String, with other: String) throws(RecordZoneError) -> Record {
        let zone = conversationZone(speaker, other)
        return Record(id: try RecordID(zone: zone, name: "member-\(speaker)"), type: memberType, fields: [
            "speaker": .string(speaker), "participants": .list([speaker, other].sorted().map { .string($0) }),
        ])
    }

    /// Where `blocker`'s block of `blocked` lives: their pair conversation's zone.
    static func blockID(blocker: String, blocked: String) throws(ConversationError) -> RecordID {
        do { return try RecordID(zone: conversationZone(blocker, blocked), name: blockPrefix + blocker) } catch { throw ConversationError(.invalidIdentifier, "\(error)") }
    }

    /// A message's record, in the pair zone of `speaker` and `listener`, or in `zone` (a group's:
    /// no listener). `history`: the versions before this one, oldest first (docs/PROTOCOL.md §3).
    static func message(name: String, speaker: String, listener: String?, in zone: ZoneName? = nil, content: String, spokenAt: Int64, editedAt: Int64?,
                        replyTo: String? = nil, mentions: [Mention] = [], custom: CustomPayload? = nil, history: [MessageVersion] = [],
                        file: AttachmentManifest? = nil) throws(RecordZoneError) -> Record {
        var fields: [String: FieldValue] = ["speaker": .string(speaker), "content": .string(content), "spokenAt": .date(milliseconds: spokenAt)]
        if let listener { fields["listener"] = .string(listener) }
        if let editedAt { fields["editedAt"] = .date(milliseconds: editedAt) }
        if let replyTo { fields["replyTo"] = .string(replyTo) }
        if !mentions.isEmpty { fields["mentions"] = .list(mentions.map { .string($0.field) }) }
        if let custom {
            fields["customType"] = .string(custom.type)
            fields["customData"] = .bytes(custom.data)
        }
        if let file { fields.merge(file.recordFields) { $1 } }
        if !history.isEmpty {
            fields["history"] = .list(history.map { .string($0.content) })
            fields["historyTimes"] = .list(history.map { .date(milliseconds: Int64(($0.at.timeIntervalSince1970 * 1000).rounded())) })
        }
        return Record(id: try RecordID(zone: zone ?? conversationZone(speaker, listener ?? ""), name: name), type: messageType, fields: fields)
    }

    /// The versions before a message's current one, as its record carries them: nil when the
    /// two lists do not match or hold more than ``Message/maximumEdits`` (a reader then shows none).
    static func history(of record: Record) -> [MessageVersion]? {
        guard let texts = record["history"]?.listValue else { return record["historyTimes"] == nil ? [] : nil }
        guard let times = record["historyTimes"]?.listValue, texts.count == times.count, texts.count <= Message.maximumEdits else { return nil }
        var versions: [MessageVersion] = []
        for (text, time) in zip(texts, times) {
            guard let content = text.stringValue, let at = time.dateValue, content.utf8.count <= Message.maximumContentBytes else { return nil }
            versions.append(MessageVersion(content: content, at: at))
        }
        return versions
    }

    /// The app payload a message's record carries, when it carries a valid one.
    static func custom(of record: Record) -> CustomPayload? {
        guard let type = record.string("customType"), let data = record["customData"]?.bytesValue else { return nil }
        let payload = CustomPayload(type: type, data: data)
        return payload.isValid ? payload : nil
    }

    /// The clock in a message's name (`m.<h(speaker)>.<16 hex clock>-<random>`): the time a
    /// deleted message's placeholder stands at, the same for every reader.
    static func messageClock(ofName name: String) -> RecordClock? {
        let parts = name.split(separator: ".", maxSplits: 2)
        guard parts.count == 3, parts[0] == "m", let dash = parts[2].firstIndex(of: "-") else { return nil }
        let hex = parts[2][..<dash]
        return hex.count == 16 ? UInt64(hex, radix: 16).map(RecordClock.init(rawValue:)) : nil
    }

    /// A new message's name: the sender's hash, then the version clock (so one sender's
    /// messages in the same millisecond keep their order everywhere), then random bits.
    static func messageName(speaker: String, clock: RecordClock) -> String {
        messagePrefix + identityHash(speaker) + "." + String(clock.rawValue, radix: 16).leftPadded(to: 16) + "-" + Sodium.randomBytes(8).hexString
    }

    static func reactionName(for message: String, reactor: String) -> String { reactionPrefix + identityHash(reactor) + "." + message }

    static func reaction(zone: ZoneName, message: String, reactor: String, emoji: String, reactedAt: Int64) throws(RecordZoneError) -> Record {
        Record(id: try RecordID(zone: zone, name: reactionName(for: message, reactor: reactor)), type: reactionType, fields: [
            "reactor": .string(reactor), "message": .string(message), "emoji": .string(emoji), "reactedAt": .date(milliseconds: reactedAt),
        ])
    }

    static func receiptName(for message: String, reader: String) -> String { receiptPrefix + identityHash(reader) + "." + message }

    static func receipt(zone: ZoneName, message: String, reader: String, readAt: Int64) throws(RecordZoneError) -> Record {
        Record(id: try RecordID(zone: zone, name: receiptName(for: message, reader: reader)), type: receiptType, fields: [
            "reader": .string(reader), "message": .string(message), "readAt": .date(milliseconds: readAt),
        ])
    }
}

/// A profile's avatar: the asset holding the PNG, and its pixel size.
struct AvatarReference: Sendable, Hashable {
    var asset: AssetReference
    var size: PixelSize

    /// The avatar a Speaker record names, if it names a well-formed one.
    init?(_ record: Record) {
        guard !record.isDeleted, let asset = record["avatar"]?.assetValue,
            let width = record["avatarWidth"]?.intValue, let height = record["avatarHeight"]?.intValue,
            (1...Int64(PixelSize.largestAvatarSide)).contains(width), (1...Int64(PixelSize.largestAvatarSide)).contains(height)
        else { return nil }
        self.init(asset: asset, size: PixelSize(width: Int(width), height: Int(height)))
    }

    init(asset: AssetReference, size: PixelSize) {
        self.asset = asset
        self.size = size
    }
}
