import Foundation

/// A record that moves an identity's pinned key to a new key. It must be signed by a key the
/// identity's chain allows, and carry the new key's signature accepting the move (so nobody can
/// claim to be an identity's earlier key by "rotating" to the real one); versions signed by the
/// old key up to the rotation's clock stay valid. Its name is `rotation.<h(identity)>.<clock>`,
/// so it is the identity's by its ID.
public enum KeyRotation {
    public static let recordType = "KeyRotation"
    public static let namePrefix = "rotation."
    public static let identityField = "identity"
    public static let newKeyField = "newKey"
    /// The new key's signature over ``acceptance(identity:oldKey:newKey:clock:)``.
    public static let acceptanceField = "acceptance"

    /// Makes and signs a rotation of `identity` from `oldKey` to `newKey`, accepted by `newKey`.
    public static func record(identity: String, zone: ZoneName, from oldKey: SigningKey, to newKey: SigningKey, clock: RecordClock) throws(RecordZoneError) -> Record {
        let name = namePrefix + OwnershipRule.identityHash(identity) + ".\(clock.rawValue)"
        let accepted = newKey.sign(acceptance(identity: identity, oldKey: oldKey.publicKey, newKey: newKey.publicKey, clock: clock))
        var record = Record(id: try RecordID(zone: zone, name: name), type: recordType,
                            fields: [identityField: .string(identity), newKeyField: .bytes(newKey.publicKey), acceptanceField: .bytes(accepted)])
        try record.sign(with: oldKey, clock: clock)
        return record
    }

    /// Whether the rotation's new key signed its acceptance of this move.
    static func isAccepted(_ record: Record, identity: String) -> Bool {
        guard let newKey = record[newKeyField]?.bytesValue, let accepted = record[acceptanceField]?.bytesValue else { return false }
        return Sodium.verify(signature: accepted, message: acceptance(identity: identity, oldKey: record.authorKey, newKey: newKey, clock: record.clock),
                             publicKey: newKey)
    }

    static func acceptance(identity: String, oldKey: Data, newKey: Data, clock: RecordClock) -> Data {
        Data("convkit-rotation-v1\n\(identity)\n\(clock.rawValue)\n".utf8) + oldKey + newKey
    }
}
