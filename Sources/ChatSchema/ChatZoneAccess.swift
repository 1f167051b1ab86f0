import RecordZone

/// Zone access for a chat server: every authenticated speaker reads the `speakers` directory
/// and every speaker's own zone (`s-<h(identifier)>`: profile, devices, revocations); each
/// speaker writes only its own zone and its own directory entry. A conversation zone is
/// readable and writable only by its two participants (its name says who they are), who alone
/// may delete it. A group's zone is read and written as its membership says (``GroupAccess``);
/// only its creator makes it, and nobody deletes it. In a pair, a participant's block stops the
/// other's writes (``PairBlocks``). Nobody deletes the directory or a speaker's
/// zone. Anything else is closed (but a speaker's recovery record, which anyone may fetch),
/// and everything is to an identity that breaks the identifier rule
/// (``ChatRecords/isValidIdentifier(_:)``): nobody can squat a look-alike of someone.
public struct ChatZoneAccess: ZoneAccessPolicy {
    public init() {}

    public func canRead(zone: ZoneName, as identity: String) -> Bool {
        guard ChatRecords.isValidIdentifier(identity) else { return false }
        return zone == ChatRecords.speakersZone || ChatRecords.isSpeakerZone(zone) || ChatRecords.isParticipant(identity, in: zone) || ChatRecords.isGroupZone(zone)
    }

    public func canWrite(_ record: Record, as identity: String) -> Bool {
        guard ChatRecords.isValidIdentifier(identity) else { return false }
        if record.id.zone == ChatRecords.speakersZone {
            return record.recordType == ChatRecords.speakerType && record.id.name == identity
        }
        return record.id.zone == ChatRecords.speakerZone(identity) || ChatRecords.isParticipant(identity, in: record.id.zone)
            || ChatRecords.isGroupZone(record.id.zone)
    }

    public func canCreate(zone: ZoneName, as identity: String) -> Bool {
        guard ChatRecords.isValidIdentifier(identity) else { return false }
        return zone == ChatRecords.speakersZone || zone == ChatRecords.speakerZone(identity) || ChatRecords.isParticipant(identity, in: zone)
            || GroupMembership.creatorHash(of: zone) == ChatRecords.identityHash(identity)
    }

    public func canDelete(zone: ZoneName, as identity: String) -> Bool {
        ChatRecords.isValidIdentifier(identity) && ChatRecords.isParticipant(identity, in: zone)
    }

    public var governance: (any ZoneGovernance)? { ChatGovernance() }

    /// A pair's two participants (by their speaker zones, which the pair's name holds); a group's
    /// members are told by its governing records (``GroupAccess``), and the directory and the
    /// speakers' zones concern those who follow them already.
    public func audience(of zone: ZoneName) -> [String] {
        ChatRecords.speakerZones(of: zone).map(\.rawValue)
    }

    public func audienceKey(of identity: String) -> String? {
        ChatRecords.isValidIdentifier(identity) ? ChatRecords.speakerZone(identity).rawValue : nil
    }

    /// A speaker's recovery record: fetched before its reader holds any key (without the code,
    /// nothing in it is readable).
    public func isPublic(_ id: RecordID) -> Bool {
        id.name.hasPrefix(Recovery.namePrefix) && ChatRecords.speakerZone(String(id.name.dropFirst(Recovery.namePrefix.count))) == id.zone
    }
}
