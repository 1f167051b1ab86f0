import RecordZone

/// What a chat server needs of the chat and nothing more: the rules that say who owns which
/// record, the fields it indexes, the order to read zones in, and who may read and write which
/// zone (``ChatZoneAccess``). `convkitd serve` links this module, not the store;
/// ConversationKit re-exports it.
public enum ChatSchema {
    /// A fresh policy with the chat's rules, for a backend or server that checks chat records:
    /// every record must be owned by the identity its ID names.
    public static func recordPolicy() -> RecordPolicy { ChatRecords.policy() }

    /// The ownership rules of chat records (which record IDs belong to whom).
    public static var ownershipRules: [OwnershipRule] { ChatRecords.rules }

    /// The fields a chat server indexes for queries: Speaker `tags` (discovery by tag).
    public static let queryIndexes: [String: Set<String>] = [ChatRecords.speakerType: ["tags"]]

    /// Zones in the order a reader must take them: every speaker's own zone first (who holds
    /// which keys and devices), then the rest, each by name — as a store pulls, so that a linked
    /// device's messages are not taken for another key's.
    public static func readingOrder(_ zones: [ZoneName]) -> [ZoneName] {
        zones.sorted { (isSpeakerZone($0) ? 0 : 1, $0.rawValue) < (isSpeakerZone($1) ? 0 : 1, $1.rawValue) }
    }

    /// Whether a zone is a speaker's own (`s-<h(identifier)>`: profile, devices, revocations).
    public static func isSpeakerZone(_ zone: ZoneName) -> Bool { ChatRecords.isSpeakerZone(zone) }

    /// Whether an identifier follows the identifier rule (``ChatRecords``).
    public static func isValidIdentifier(_ identifier: String) -> Bool { ChatRecords.isValidIdentifier(identifier) }
}
