import Foundation

/// Which keys claim which identities in a set of records, and which rotations (accepted by their
/// new key) and device certificates (accepted by the device) relate them: what a reader with no pin looks at to tell one identity's keys from a
/// conflict. Two keys not related by a rotation claim one identity: a conflict.
struct KeyClaims {
    private var keys: [String: Set<Data>] = [:]
    private var rotatedTo: [String: Set<Data>] = [:]

    /// Counts a record whose signature is verified (a rotation relates keys only then). A device
    /// certificate claims the identity with its certifier and relates the device to it.
    mutating func add(_ record: Record, owner identity: String) {
        if record.recordType == DeviceCertificate.recordType {
            guard case .success(let parts) = DeviceCertificate.verify(record, identity: identity) else { return }
            keys[identity, default: []].insert(parts.certifier)
            rotatedTo[identity, default: []].insert(parts.device)
            return
        }
        keys[identity, default: []].insert(record.authorKey)
        if record.recordType == KeyRotation.recordType, KeyRotation.isAccepted(record, identity: identity),
            let newKey = record[KeyRotation.newKeyField]?.bytesValue {
            rotatedTo[identity, default: []].insert(newKey)
        }
    }

    mutating func merge(_ other: KeyClaims) {
        keys.merge(other.keys) { $0.union($1) }
        rotatedTo.merge(other.rotatedTo) { $0.union($1) }
    }

    var identities: Dictionary<String, Set<Data>>.Keys { keys.keys }

    /// Every claim as (identity, key, whether a rotation or certificate leads to the key): what
    /// a reader keeps to take up again later with ``insert(identity:key:rotated:)``.
    var pairs: [(identity: String, key: Data, rotated: Bool)] {
        keys.flatMap { identity, keys in keys.map { (identity, $0, false) } }
            + rotatedTo.flatMap { identity, keys in keys.map { (identity, $0, true) } }
    }

    mutating func insert(identity: String, key: Data, rotated: Bool) {
        if rotated { rotatedTo[identity, default: []].insert(key) } else { keys[identity, default: []].insert(key) }
    }

    /// The keys that claim `identity` and that no rotation or certificate leads to.
    func rootKeys(of identity: String) -> Set<Data> {
        (keys[identity] ?? []).subtracting(rotatedTo[identity] ?? [])
    }

    /// Whether `identity` is claimed by more than one key that no rotation leads to.
    func isConflicted(_ identity: String) -> Bool { rootKeys(of: identity).count > 1 }
}
