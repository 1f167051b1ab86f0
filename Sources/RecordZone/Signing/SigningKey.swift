import Foundation

/// An Ed25519 key pair that signs records and requests.
///
/// ```swift
/// let key = SigningKey.generate()
/// let signature = key.sign(Data("hello".utf8))
/// Sodium.verify(signature: signature, message: Data("hello".utf8), publicKey: key.publicKey) // true
/// ```
public struct SigningKey: Sendable {
    /// The 32-byte seed the pair derives from; what a key file stores.
    public let seed: Data
    /// The 32-byte public key.
    public let publicKey: Data
    private let secretKey: [UInt8]

    /// Derives the key pair from a 32-byte seed.
    /// - Throws: ``RecordZoneError`` (``RecordZoneError/Code/invalidArguments``) for a wrong length.
    public init(seed: Data) throws(RecordZoneError) {
        guard seed.count == Sodium.seedLength else {
            throw RecordZoneError(.invalidArguments, "an Ed25519 seed is \(Sodium.seedLength) bytes, got \(seed.count)")
        }
        let pair = Sodium.keyPair(seed: seed)
        self.seed = Data(seed)
        self.publicKey = pair.publicKey
        self.secretKey = Array(pair.secretKey)
    }

    /// A new key pair from libsodium's random source.
    public static func generate() -> SigningKey {
        let seed = Sodium.randomBytes(Sodium.seedLength)
        // A seed of the right length cannot fail.
        guard let key = try? SigningKey(seed: seed) else { preconditionFailure("seed length") }
        return key
    }

    /// A detached Ed25519 signature over the bytes.
    public func sign(_ message: some ContiguousBytes) -> Data {
        Sodium.sign(message, secretKey: secretKey)
    }

    /// A short printable form of the public key: the first 8 bytes in hex.
    public var keyID: String { publicKey.prefix(8).hexString }
}
