import Foundation
import Synchronization

/// Who owns the records whose IDs match a pattern: a function of the record ID alone, so every
/// reader — a server, a folder reader, a store — decides the same owner with no history, and no
/// version can move a record to another owner by changing a field.
///
/// ```swift
/// // m.<h(speaker)>.<id> in any conversation zone is the speaker's, whatever a version says.
/// OwnershipRule(recordType: "Message", zones: .prefixed("c-"), owner: .hashedName(prefix: "m.", field: "speaker"))
/// ```
public struct OwnershipRule: Sendable, Hashable {
    /// The zones a rule covers.
    public enum Zones: Sendable, Hashable {
        case any
        case named(String)
        case prefixed(String)
        /// Zones named `<prefix><h(owner)>`: each identity's own zone. A record of the rule's
        /// type in another identity's zone is owned by nobody.
        case ownersZone(prefix: String)

        func matches(_ zone: ZoneName) -> Bool {
            switch self {
            case .any: true
            case .named(let name): zone.rawValue == name
            case .prefixed(let prefix), .ownersZone(let prefix): zone.rawValue.hasPrefix(prefix)
            }
        }
    }

    /// How a record name names its owner.
    public enum Owner: Sendable, Hashable {
        /// The name is `<prefix><identity>` (a profile: `prefix` empty; a member: `member-alice`).
        /// With `field`, that string field must hold the same identity.
        case name(prefix: String, field: String? = nil)
        /// The name is `<prefix><h(identity)>.<anything>` (``OwnershipRule/identityHash(_:)``);
        /// the string field `field` names the identity and must hash to h. Tombstones keep it.
        case hashedName(prefix: String, field: String)

        var prefix: String {
            switch self {
            case .name(let prefix, _), .hashedName(let prefix, _): prefix
            }
        }
    }

    public var recordType: String
    public var zones: Zones
    public var owner: Owner
    /// Whether only the owner's identity key may sign the records (its devices may not): what
    /// a linked device must not replace, as a recovery record.
    public var identityKeyOnly: Bool

    public init(recordType: String, zones: Zones = .any, owner: Owner, identityKeyOnly: Bool = false) {
        self.recordType = recordType
        self.zones = zones
        self.owner = owner
        self.identityKeyOnly = identityKeyOnly
    }

    /// Whether the rule covers this ID.
    func matches(_ id: RecordID) -> Bool {
        zones.matches(id.zone) && id.name.hasPrefix(owner.prefix) && id.name.utf8.count > owner.prefix.utf8.count
    }

    /// The fields a tombstone of this type keeps, so that its owner can still be checked.
    public var tombstoneFields: Set<String> {
        switch owner {
        case .name(_, let field): field.map { [$0] } ?? []
        case .hashedName(_, let field): [field]
        }
    }

    /// The owner of a record this rule covers, or why the record does not name one consistently.
    func owner(of record: Record) -> Result<String, RejectionReason> {
        let found = owner(named: record)
        if case .ownersZone(let prefix) = zones, case .success(let identity) = found, record.id.zone.rawValue != prefix + Self.identityHash(identity) {
            return .failure(.notOwnedByID(recordType: record.recordType))
        }
        return found
    }

    private func owner(named record: Record) -> Result<String, RejectionReason> {
        let suffix = String(record.id.name.dropFirst(owner.prefix.count))
        switch owner {
        case .name(_, let field):
            if let field {
                guard let named = record[field]?.stringValue else { return .failure(.ownerFieldMissing(field: field)) }
                guard named == suffix else { return .failure(.ownerFieldMismatch(field: field)) }
            }
            return .success(suffix)
        case .hashedName(_, let field):
            guard let named = record[field]?.stringValue else { return .failure(.ownerFieldMissing(field: field)) }
            guard let dot = suffix.firstIndex(of: "."), suffix[..<dot] == Self.identityHash(named) else {
                return .failure(.ownerFieldMismatch(field: field))
            }
            return .success(named)
        }
    }

    /// The short hash of an identity that record and zone names carry: the first 8 bytes of its
    /// SHA-256, in hex.
    public static func identityHash(_ identity: String) -> String {
        if let known = hashes.withLock({ $0[identity] }) { return known }
        let hash = Sodium.sha256(Data(identity.utf8)).prefix(8).hexString
        hashes.withLock { cache in
            if cache.count >= 4096 { cache.removeAll(keepingCapacity: true) }  // bounded: a hostile page cannot grow it
            cache[identity] = hash
        }
        return hash
    }

    /// Recent identities' hashes: every record of a page names one of a few identities.
    private static let hashes = Mutex<[String: String]>([:])
}
