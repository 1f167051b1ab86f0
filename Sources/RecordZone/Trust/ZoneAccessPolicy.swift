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
    /// The zones whose own records decide who may use them (``ZoneGovernance``), beyond what
    /// the methods above allow: nil when there are none.
    var governance: (any ZoneGovernance)? { get }
    /// Whether anyone, unauthenticated, may fetch the record `id` by its ID
    /// (`GET /v1/public/{zone}/{name}`): what a person needs before holding any key, as a
    /// recovery record. False unless a policy says otherwise.
    func isPublic(_ id: RecordID) -> Bool
    /// Who must hear at once that `zone` moved even where they do not follow it yet (a
    /// conversation started with them, a zone of theirs deleted): the audience keys
    /// (``audienceKey(of:)``) of the identities its name alone says may read it. A stream that
    /// asked for the feed is told (docs/PROTOCOL.md §2.4, `feed`); anyone else learns of the zone
    /// from the database feed when it next reads it. None unless a policy says otherwise.
    func audience(of zone: ZoneName) -> [String]
    /// The key under which `identity` hears of zones that concern it (``audience(of:)``, and a
    /// governed zone's readers, ``GovernedZone/readers``); nil: it hears of none.
    func audienceKey(of identity: String) -> String?
}

extension ZoneAccessPolicy {
    public func isPublic(_ id: RecordID) -> Bool { false }
    public func audience(of zone: ZoneName) -> [String] { [] }
    public func audienceKey(of identity: String) -> String? { nil }
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
    /// The base's; replicators pass it (``isReplicator(_:)``): they copy what members signed,
    /// in whatever order it comes, and every reader decides it by the rule.
    public var governance: (any ZoneGovernance)? { base.governance }
    public func isPublic(_ id: RecordID) -> Bool { base.isPublic(id) }
    public func audience(of zone: ZoneName) -> [String] { base.audience(of: zone) }
    public func audienceKey(of identity: String) -> String? { replicators.contains(identity) ? nil : base.audienceKey(of: identity) }
    public func isReplicator(_ identity: String) -> Bool { replicators.contains(identity) }
}

/// Access to zones whose own records say who may use them — a chat group's zone, by its signed
/// membership changes. A server decides it from the zone's **governing records** as it holds
/// them (never from memory alone, so servers sharing a database agree): a write inside the
/// save's transaction, so a removal and the removed member's next message are decided in one
/// order; a read version by version, by type and clock.
public protocol ZoneGovernance: Sendable {
    /// The type of the records that govern `zone`, or nil when nothing in it does.
    func governingType(of zone: ZoneName) -> String?
    /// What the zone's governing records decide (`governing`: every one held, in any order).
    func decide(_ zone: ZoneName, governing: [Record]) -> any GovernedZone
    /// Whether the governing records of `zone` also decide who reads which versions (a group's
    /// do); when not (they decide writes only), a read costs no look at them.
    func governsReads(of zone: ZoneName) -> Bool
}

/// What a governed zone's records decide: who may write what now, and who may read which versions.
public protocol GovernedZone: Sendable {
    /// Nil when `identity` may save `record` (owned by `owner`) now, otherwise why not. A
    /// governing record that may be saved is taken into the state (the caller keeps it only if
    /// the record is stored).
    mutating func admit(_ record: Record, owner: String?, as identity: String) -> String?
    /// Which stored versions `identity` may read, or nil when it may not read the zone at all.
    func readable(by identity: String) -> ReadableVersions?
    /// What the governing records decide, for a person (an operator's console): a label and a
    /// value per line.
    var summary: [(label: String, value: String)] { get }
    /// Everyone who may read some version of the zone (a group's members, past and present):
    /// told when its governing records change, since one of them may have just been let in
    /// (``ZoneAccessPolicy/audienceKey(of:)``). None unless a state says otherwise.
    var readers: [String] { get }
}

extension GovernedZone {
    public var summary: [(label: String, value: String)] { [] }
    public var readers: [String] { [] }
}

/// Which versions of a zone one reader may read, by their type and clock (what a server's rows
/// hold without decoding).
public struct ReadableVersions: Sendable {
    public let allows: @Sendable (_ type: String, _ clock: RecordClock) -> Bool

    public init(_ allows: @escaping @Sendable (_ type: String, _ clock: RecordClock) -> Bool) { self.allows = allows }

    /// Every version.
    public static let all = ReadableVersions { _, _ in true }
}

extension ZoneGovernance {
    /// Every governed zone's records decide its reads too.
    public func governsReads(of zone: ZoneName) -> Bool { governingType(of: zone) != nil }
}

extension ZoneAccessPolicy {
    /// The zones whose own records decide access (none by default).
    public var governance: (any ZoneGovernance)? { nil }
}
