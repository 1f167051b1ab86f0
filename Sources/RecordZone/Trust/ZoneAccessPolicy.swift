/// Who may read and write which zones on a server, by authenticated identity. Record
/// ownership (who may sign what) is the ``RecordPolicy``'s; this decides access to zones.
public protocol ZoneAccessPolicy: Sendable {
    /// Whether `identity` may fetch changes, records and queries of `zone`.
    func canRead(zone: ZoneName, as identity: String) -> Bool
    /// Whether `identity` may save this record (its signature and owner are checked apart).
    func canWrite(_ record: Record, as identity: String) -> Bool
    /// Whether `identity` may create `zone` (creating one that exists does nothing).
    func canCreate(zone: ZoneName, as identity: String) -> Bool
    /// Whether `identity` may delete `zone` and everything in it.
    func canDelete(zone: ZoneName, as identity: String) -> Bool
}

/// Any authenticated identity may read and write any zone; only record ownership limits writes.
public struct OpenZoneAccess: ZoneAccessPolicy {
    public init() {}
    public func canRead(zone: ZoneName, as identity: String) -> Bool { true }
    public func canWrite(_ record: Record, as identity: String) -> Bool { true }
    public func canCreate(zone: ZoneName, as identity: String) -> Bool { true }
    public func canDelete(zone: ZoneName, as identity: String) -> Bool { true }
}

/// Another policy, plus replicators: identities (of a peer server's `convkitd replicate`) that
/// may read and create every zone and save any record — whose signature and owner the storage
/// still checks, so a replicator copies what others signed and can forge nothing. They delete
/// nothing. Their names start with `_`, which no speaker identifier may.
public struct ReplicatingZoneAccess: ZoneAccessPolicy {
    public let base: any ZoneAccessPolicy
    public let replicators: Set<String>

    public init(_ base: any ZoneAccessPolicy, replicators: Set<String>) {
        self.base = base
        self.replicators = replicators
    }

    public func canRead(zone: ZoneName, as identity: String) -> Bool { replicators.contains(identity) || base.canRead(zone: zone, as: identity) }
    public func canWrite(_ record: Record, as identity: String) -> Bool { replicators.contains(identity) || base.canWrite(record, as: identity) }
    public func canCreate(zone: ZoneName, as identity: String) -> Bool { replicators.contains(identity) || base.canCreate(zone: zone, as: identity) }
    public func canDelete(zone: ZoneName, as identity: String) -> Bool { !replicators.contains(identity) && base.canDelete(zone: zone, as: identity) }
}
