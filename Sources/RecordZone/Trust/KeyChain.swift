import Foundation

/// The keys that speak for one identity: the identity key in force, the keys it replaced (each
/// valid for versions up to the clock of the rotation that retired it), and how the reader came
/// to trust them, and the device keys it certified (``DeviceCertificate``), each valid until a
/// revocation's clock. Chains are kept whole — a reader restarted after a rotation still accepts what
/// the retired key signed before it.
public struct KeyChain: Hashable, Sendable, Codable {
    /// A key the identity used before a ``KeyRotation``.
    public struct RetiredKey: Hashable, Sendable, Codable {
        public var key: Data
        /// The last clock this key may sign at.
        public var until: RecordClock
    }

    /// A device key the identity certified: it signs the identity's records (not its keys,
    /// devices or revocations) up to `revokedAfter`, when a revocation set it.
    public struct DeviceKey: Hashable, Sendable, Codable {
        public var key: Data
        /// The last clock this device may sign at; nil while it is not revoked.
        public var revokedAfter: RecordClock?
        /// The enrollment key of the link code that certified it: one code certifies one device.
        public var enrollment: Data?
    }

    public var current: Data
    public var retired: [RetiredKey]
    public var devices: [DeviceKey]
    /// Whether the pin was settled by someone (a ref carrying the key, or the app comparing
    /// fingerprints) rather than taken on first use.
    public var isVerified: Bool

    public init(current: Data, retired: [RetiredKey] = [], devices: [DeviceKey] = [], isVerified: Bool = false) {
        self.current = current
        self.retired = retired
        self.devices = devices
        self.isVerified = isVerified
    }

    /// A short, human-comparable form of an identity and its key: 12 groups of 5 digits (60
    /// digits, like a safety number), from SHA-256 of the identity and key. Two people who
    /// read out the same digits hold the same key for the same identity.
    public static func fingerprint(identity: String, key: Data) -> String {
        let input = Data("convkit-fingerprint-v1\n\(identity)\n".utf8) + key
        let digest = Sodium.sha256(input + Data([0])) + Sodium.sha256(input + Data([1]))
        return (0..<12).map { group in
            let value = digest[(group * 5)..<(group * 5 + 5)].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            let digits = String(value % 100_000)
            return String(repeating: "0", count: 5 - digits.count) + digits
        }.joined(separator: " ")
    }

    /// Whether this chain is only `key` pinned on first use: no verification, rotation or device
    /// has been seen for it (what a reader pins from a device's records read before its
    /// identity's key records).
    public func isFirstUseOf(_ key: Data) -> Bool {
        current == key && !isVerified && retired.isEmpty && devices.isEmpty
    }

    /// Whether `key` may sign one of the identity's records at `clock`: an identity key, or a
    /// certified device not revoked before `clock`.
    public func allows(_ key: Data, at clock: RecordClock) -> Bool {
        allowsIdentityKey(key, at: clock) || devices.contains { $0.key == key && $0.revokedAfter.map { clock <= $0 } ?? true }
    }

    /// Whether `key` may sign at `clock` as the identity itself (its rotations, devices and
    /// revocations): the current identity key, or a retired one up to its rotation.
    public func allowsIdentityKey(_ key: Data, at clock: RecordClock) -> Bool {
        key == current || retired.contains { $0.key == key && clock <= $0.until }
    }

    /// Whether `key` may sign a request now: the current identity key or a device not revoked.
    public func allowsNow(_ key: Data) -> Bool {
        key == current || devices.contains { $0.key == key && $0.revokedAfter == nil }
    }

    /// This chain with what `other` (the same identity's chain, decided elsewhere) adds: retired
    /// keys, devices and the earliest revocation of each, verification. The current key is the
    /// one the other chain retired in favour of its own, or certified this chain's first-use key
    /// as its device, else this chain's (a pin never switches silently).
    public func merging(_ other: KeyChain) -> KeyChain {
        var merged = self
        if other.current != current, other.retired.contains(where: { $0.key == current }) || isFirstUseOf(current) && other.device(current) != nil {
            merged.current = other.current
        }
        for retired in other.retired where !merged.retired.contains(where: { $0.key == retired.key }) && retired.key != merged.current {
            merged.retired.append(retired)
        }
        for device in other.devices {
            if let index = merged.devices.firstIndex(where: { $0.key == device.key }) {
                let mine = merged.devices[index]
                merged.devices[index].revokedAfter = [mine.revokedAfter, device.revokedAfter].compactMap { $0 }.min()
                merged.devices[index].enrollment = mine.enrollment ?? device.enrollment
            } else {
                merged.devices.append(device)
            }
        }
        merged.isVerified = isVerified || (other.isVerified && other.current == merged.current)
        return merged
    }

    /// The device entry for `key`.
    public func device(_ key: Data) -> DeviceKey? { devices.first { $0.key == key } }

    private enum Keys: String, CodingKey { case current, retired, devices, isVerified }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        current = try c.decode(Data.self, forKey: .current)
        retired = try c.decodeIfPresent([RetiredKey].self, forKey: .retired) ?? []
        devices = try c.decodeIfPresent([DeviceKey].self, forKey: .devices) ?? []
        isVerified = try c.decodeIfPresent(Bool.self, forKey: .isVerified) ?? false
    }
}
