import RecordZone

/// Zone access for a chat server: the `speakers` directory is readable by every authenticated
/// speaker and each speaker writes only its own profile and key rotations; a conversation zone is readable and
/// writable only by its two participants (its name says who they are), who alone may delete it.
/// Nobody deletes the `speakers` zone. Anything else is closed.
public struct ChatZoneAccess: ZoneAccessPolicy {
    public init() {}

    public func canRead(zone: ZoneName, as identity: String) -> Bool {
        zone == ChatRecords.speakersZone || ChatRecords.isParticipant(identity, in: zone)
    }

    public func canWrite(_ record: Record, as identity: String) -> Bool {
        if record.id.zone == ChatRecords.speakersZone {
            switch record.recordType {
            case ChatRecords.speakerType: return record.id.name == identity
            case KeyRotation.recordType: return record.id.name.hasPrefix(KeyRotation.namePrefix + ChatRecords.identityHash(identity) + ".")
            default: return false
            }
        }
        return ChatRecords.isParticipant(identity, in: record.id.zone)
    }

    public func canCreate(zone: ZoneName, as identity: String) -> Bool {
        zone == ChatRecords.speakersZone || ChatRecords.isParticipant(identity, in: zone)
    }

    public func canDelete(zone: ZoneName, as identity: String) -> Bool {
        ChatRecords.isParticipant(identity, in: zone)
    }
}
