import RecordZone

/// A zone server's side of blocking in a pair conversation, decided from the zone's `Block`
/// records as the server holds them: while one participant's block stands (its newest
/// version is not a tombstone), the server stores nothing more of the other's in the zone but
/// tombstones (taking back what they said before stays possible). The blocker's own readers
/// hide the blocked one's messages whatever a server does; this keeps a hostile or stale
/// client from writing on. Reads are not decided here (both participants read the zone).
struct PairBlocks: GovernedZone {
    /// Each participant's newest `Block` version held.
    private var newest: [String: Record] = [:]

    init(governing: [Record]) {
        for record in governing where ChatRecords.blockViolation(record) == nil { takeIn(record) }
    }

    private mutating func takeIn(_ record: Record) {
        guard let blocker = record.string("blocker") else { return }
        if let held = newest[blocker], !MergeRule.wins(record, over: held) { return }
        newest[blocker] = record
    }

    /// Who blocks the other participant now.
    var blockers: [String] { newest.filter { !$0.value.isDeleted }.keys.sorted() }

    var summary: [(label: String, value: String)] { [("blocked by", blockers.isEmpty ? "nobody" : blockers.joined(separator: ", "))] }

    mutating func admit(_ record: Record, owner: String?, as identity: String) -> String? {
        if record.recordType == ChatRecords.blockType {
            if let violation = ChatRecords.blockViolation(record) { return violation.detail }
            takeIn(record)
            return nil
        }
        guard !record.isDeleted, let owner, let blocker = blockers.first(where: { $0 != owner }) else { return nil }
        return "'\(blocker)' blocked '\(owner)' in this conversation"
    }

    func readable(by identity: String) -> ReadableVersions? { .all }
}

/// The chat's governed zones: a group's by its changes (``GroupAccess``), a pair's by its blocks
/// (``PairBlocks``, which decide writes only).
public struct ChatGovernance: ZoneGovernance {
    public init() {}

    public func governingType(of zone: ZoneName) -> String? {
        if ChatRecords.isGroupZone(zone) { return GroupChange.recordType }
        return ChatRecords.isPairZone(zone) ? ChatRecords.blockType : nil
    }

    public func decide(_ zone: ZoneName, governing: [Record]) -> any GovernedZone {
        ChatRecords.isGroupZone(zone) ? GroupAccess().decide(zone, governing: governing) : PairBlocks(governing: governing)
    }

    public func governsReads(of zone: ZoneName) -> Bool { ChatRecords.isGroupZone(zone) }
}
