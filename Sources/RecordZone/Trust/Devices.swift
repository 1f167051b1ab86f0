import Foundation

/// A short-lived invitation to link one more device to an identity: the identity key signs
/// "whoever holds this enrollment key may certify one device for me until `expires`". The code
/// carries the enrollment key's seed, so it is a secret, like a pairing code: whoever holds it
/// before it expires can link one device (which then shows in the device list and can be revoked).
///
/// ```swift
/// let code = try LinkCode.issue(identity: "alice", identityKey: key, expires: clock).text   // on the first device
/// let invitation = try LinkCode(text: code)                                                  // on the new one
/// ```
public struct LinkCode: Sendable, Hashable {
    public let identity: String
    /// The identity key that signed the invitation.
    public let certifier: Data
    /// The one-time key that signs the new device's certificate.
    public let enrollment: SigningKey
    /// The last clock at which the certificate may be signed.
    public let expires: RecordClock
    /// The identity key's signature over ``DeviceCertificate/invitation(identity:enrollmentKey:expires:)``.
    public let signature: Data

    static let prefix = "convkit-link-1:"

    /// Why a link code is refused.
    public enum Failure: Error, Hashable, Sendable {
        /// Not a link code, or altered: its signature does not verify.
        case invalid(String)
    }

    /// Signs an invitation with the identity key.
    public static func issue(identity: String, identityKey: SigningKey, expires: RecordClock) -> LinkCode {
        let enrollment = SigningKey.generate()
        let signature = identityKey.sign(DeviceCertificate.invitation(identity: identity, enrollmentKey: enrollment.publicKey, expires: expires))
        return LinkCode(identity: identity, certifier: identityKey.publicKey, enrollment: enrollment, expires: expires, signature: signature)
    }

    private init(identity: String, certifier: Data, enrollment: SigningKey, expires: RecordClock, signature: Data) {
        self.identity = identity
        self.certifier = certifier
        self.enrollment = enrollment
        self.expires = expires
        self.signature = signature
    }

    /// The code as text: `convkit-link-1:` and base64url of the identity (length-prefixed), the
    /// certifier (32 bytes), the enrollment seed (32), the signature (64) and the expiry (8).
    public var text: String {
        var w = ByteWriter()
        w.string16(identity)
        for part in [certifier, enrollment.seed, signature] { w.append(part) }
        w.u64(expires.rawValue)
        return Self.prefix + Base64URL.encode(Data(w.bytes))
    }

    /// Reads a code and checks the identity key's signature over it.
    /// - Throws: ``Failure/invalid(_:)`` for anything that is not an intact code.
    public init(text: String) throws(Failure) {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard trimmed.hasPrefix(Self.prefix) else { throw .invalid("a link code starts with \(Self.prefix)") }
        guard let bytes = Base64URL.decode(trimmed.dropFirst(Self.prefix.count)) else { throw .invalid("the link code is not base64url") }
        let parts = bytes.withUnsafeBytes { raw -> (String, Data, Data, Data, RecordClock)? in
            var r = ByteReader(raw)
            guard let identity = try? r.string16(what: "identity"), let certifier = try? r.data(Sodium.publicKeyLength),
                let seed = try? r.data(Sodium.seedLength), let signature = try? r.data(Sodium.signatureLength),
                let expires = try? r.u64(), r.remaining == 0
            else { return nil }
            return (identity, certifier, seed, signature, RecordClock(rawValue: expires))
        }
        guard let (identity, certifier, seed, signature, expires) = parts, let enrollment = try? SigningKey(seed: seed) else {
            throw .invalid("the link code is truncated or malformed")
        }
        guard Sodium.verify(signature: signature, message: DeviceCertificate.invitation(identity: identity, enrollmentKey: enrollment.publicKey, expires: expires),
                            publicKey: certifier)
        else { throw .invalid("the link code's signature does not verify (altered?)") }
        self.init(identity: identity, certifier: certifier, enrollment: enrollment, expires: expires, signature: signature)
    }

    public static func == (a: LinkCode, b: LinkCode) -> Bool { a.text == b.text }
    public func hash(into hasher: inout Hasher) { hasher.combine(text) }
}

/// The record that certifies a device key for an identity: `device.<h(identity)>.<hex(device
/// key)>`, signed by a link code's enrollment key, carrying the identity key's invitation and
/// the device key's acceptance. Records signed by a certified device count as the identity's —
/// except the identity's own key records (rotations, devices, revocations), which only the
/// identity key signs. A certificate is valid only at a clock up to the invitation's expiry, and
/// a link code certifies one device.
public enum DeviceCertificate {
    public static let recordType = "Device"
    public static let namePrefix = "device."
    public static let identityField = "identity"
    public static let keyField = "key"
    public static let labelField = "label"
    public static let certifierField = "certifier"
    public static let expiresField = "expires"
    public static let invitationField = "invitation"
    public static let acceptanceField = "acceptance"

    /// Makes the certificate of `device` from a link code, signed by its enrollment key.
    public static func record(code: LinkCode, device: SigningKey, label: String, zone: ZoneName, clock: RecordClock) throws(RecordZoneError) -> Record {
        let name = namePrefix + OwnershipRule.identityHash(code.identity) + "." + device.publicKey.hexString
        var record = Record(id: try RecordID(zone: zone, name: name), type: recordType, fields: [
            identityField: .string(code.identity), keyField: .bytes(device.publicKey), labelField: .string(label),
            certifierField: .bytes(code.certifier), expiresField: .int(Int64(bitPattern: code.expires.rawValue)),
            invitationField: .bytes(code.signature),
            acceptanceField: .bytes(device.sign(acceptance(identity: code.identity, certifier: code.certifier, device: device.publicKey))),
        ])
        try record.sign(with: code.enrollment, clock: clock)
        return record
    }

    /// What the identity key signs in a link code.
    static func invitation(identity: String, enrollmentKey: Data, expires: RecordClock) -> Data {
        Data("convkit-link-v1\n\(identity)\n\(expires.rawValue)\n".utf8) + enrollmentKey
    }

    /// What the device key signs to accept being the identity's (so nobody can certify someone
    /// else's key as a device of their own claim).
    static func acceptance(identity: String, certifier: Data, device: Data) -> Data {
        Data("convkit-device-v1\n\(identity)\n".utf8) + certifier + device
    }

    /// The parts of a certificate, once its invitation and acceptance verify.
    public struct Parts: Sendable {
        public var device: Data
        public var certifier: Data
        public var expires: RecordClock
    }

    /// Checks what a certificate can show by itself: its fields, the name, the invitation, the
    /// acceptance, and that it was signed before the invitation expired.
    public static func verify(_ record: Record, identity: String) -> Result<Parts, RejectionReason> {
        if record.isDeleted { return .failure(.malformed("a device certificate cannot be deleted (revoke the device)")) }
        guard let device = record[keyField]?.bytesValue, device.count == Sodium.publicKeyLength else { return .failure(.ownerFieldMissing(field: keyField)) }
        guard record.id.name.hasSuffix("." + device.hexString) else { return .failure(.ownerFieldMismatch(field: keyField)) }
        guard let certifier = record[certifierField]?.bytesValue, certifier.count == Sodium.publicKeyLength,
            let expiresValue = record[expiresField]?.intValue, let invitation = record[invitationField]?.bytesValue,
            let accepted = record[acceptanceField]?.bytesValue
        else { return .failure(.deviceNotCertified("certifier, expires, invitation or acceptance is missing")) }
        let expires = RecordClock(rawValue: UInt64(bitPattern: expiresValue))
        guard Sodium.verify(signature: invitation, message: Self.invitation(identity: identity, enrollmentKey: record.authorKey, expires: expires), publicKey: certifier) else {
            return .failure(.deviceNotCertified("the invitation is not signed by the certifier"))
        }
        guard Sodium.verify(signature: accepted, message: acceptance(identity: identity, certifier: certifier, device: device), publicKey: device) else {
            return .failure(.deviceNotCertified("the device key did not accept the certificate"))
        }
        guard record.clock <= expires else { return .failure(.deviceNotCertified("signed after its link code expired")) }
        return .success(Parts(device: device, certifier: certifier, expires: expires))
    }

    /// The expiry a certificate claims, for a server that checks it against its own clock.
    public static func expiry(of record: Record) -> RecordClock? {
        guard record.recordType == recordType, let value = record[expiresField]?.intValue else { return nil }
        return RecordClock(rawValue: UInt64(bitPattern: value))
    }
}

/// The record that revokes a device: `revoke.<h(identity)>.<hex(device key)>`, signed by the
/// identity key, with the last clock the device may sign at (`revokedAfter`). Versions the device
/// signed up to that clock stay valid; later ones are refused by every reader, and a server
/// refuses anything the device saves once it holds the revocation, whatever its clock says.
/// Revocations only ever narrow: the earliest `revokedAfter` seen wins, and nothing undoes one.
public enum DeviceRevocation {
    public static let recordType = "DeviceRevocation"
    public static let namePrefix = "revoke."
    public static let identityField = "identity"
    public static let keyField = "key"
    public static let revokedAfterField = "revokedAfter"

    /// Makes and signs a revocation with the identity key.
    public static func record(identity: String, device: Data, revokedAfter: RecordClock, zone: ZoneName, identityKey: SigningKey, clock: RecordClock) throws(RecordZoneError) -> Record {
        let name = namePrefix + OwnershipRule.identityHash(identity) + "." + device.hexString
        var record = Record(id: try RecordID(zone: zone, name: name), type: recordType, fields: [
            identityField: .string(identity), keyField: .bytes(device), revokedAfterField: .int(Int64(bitPattern: revokedAfter.rawValue)),
        ])
        try record.sign(with: identityKey, clock: clock)
        return record
    }

    static func parts(_ record: Record) -> Result<(device: Data, revokedAfter: RecordClock), RejectionReason> {
        if record.isDeleted { return .failure(.malformed("a device revocation cannot be deleted")) }
        guard let device = record[keyField]?.bytesValue, device.count == Sodium.publicKeyLength else { return .failure(.ownerFieldMissing(field: keyField)) }
        guard record.id.name.hasSuffix("." + device.hexString) else { return .failure(.ownerFieldMismatch(field: keyField)) }
        guard let after = record[revokedAfterField]?.intValue else { return .failure(.ownerFieldMissing(field: revokedAfterField)) }
        return .success((device, RecordClock(rawValue: UInt64(bitPattern: after))))
    }
}
