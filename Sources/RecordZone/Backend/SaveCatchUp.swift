/// On the wire (a modify's answer, `catchUp`): `{"database": <the feed's answer>, "zones": [{"zone", "from", "to"}]}`.
///
/// What a save tells besides its records' outcomes: how each zone it stored versions in moved,
/// and — when the caller gave its database token — the database feed since that token, both
/// read in the save's own transaction. A client that pushes learns in the same round trip what
/// else changed, so it needs no feed request and never fetches back what it just pushed.
///
/// A backend that cannot tell (a folder, memory) answers an empty catch-up: the client then
/// pulls as usual. Nothing in it is required for a save to be correct.
public struct SaveCatchUp: Sendable, Hashable, Codable {
    /// The database feed since the token the save was given, as it stood when the save
    /// committed (its ``DatabaseChanges/changedZones`` include the save's own zones). Nil when the
    /// save was given no token, or the token is no longer valid (the client pulls as usual).
    public var database: DatabaseChanges?
    /// Each zone the save stored versions in, once.
    public var zones: [ZoneAdvance]

    public init(database: DatabaseChanges? = nil, zones: [ZoneAdvance] = []) {
        self.database = database
        self.zones = zones
    }

    /// The catch-up of a backend that cannot tell.
    public static let none = SaveCatchUp()

    /// Whether it tells nothing (no feed, no zone moved).
    public var isEmpty: Bool { database == nil && zones.isEmpty }
}

/// How one zone moved in a save: between ``from`` and ``to`` lie exactly the versions the save
/// stored in it, nothing else. A reader whose token for the zone is ``from`` holds everything up
/// to ``to`` once it holds those versions.
public struct ZoneAdvance: Sendable, Hashable, Codable {
    public let zone: ZoneName
    /// The zone's token just before the save's first version; nil when the zone had no change
    /// before it (a reader that never pulled the zone starts there).
    public let from: ChangeToken?
    /// The zone's token just after the save's last version.
    public let to: ChangeToken

    public init(zone: ZoneName, from: ChangeToken?, to: ChangeToken) {
        self.zone = zone
        self.from = from
        self.to = to
    }
}

/// A save's answer with its catch-up: ``RecordZoneBackend/save(_:policy:catchingUpFrom:)``.
public struct SaveAnswer: Sendable {
    /// One result per record, in order, as ``RecordZoneBackend/save(_:policy:)`` answers.
    public var results: [Result<Record, RecordZoneError>]
    public var catchUp: SaveCatchUp

    public init(results: [Result<Record, RecordZoneError>], catchUp: SaveCatchUp = .none) {
        self.results = results
        self.catchUp = catchUp
    }
}
