import CSodium
import Foundation
import Synchronization

/// The thin wall around libsodium: Ed25519 (`crypto_sign_*`) and SHA-256 (`crypto_hash_sha256`).
///
/// See <https://doc.libsodium.org/public-key_cryptography/public-key_signatures>.
public enum Sodium {
    public static let publicKeyLength = Int(crypto_sign_PUBLICKEYBYTES)
    public static let secretKeyLength = Int(crypto_sign_SECRETKEYBYTES)
    public static let seedLength = Int(crypto_sign_SEEDBYTES)
    public static let signatureLength = Int(crypto_sign_BYTES)

    /// `sodium_init` runs once, before the first use.
    private static let initialized: Bool = sodium_init() >= 0

    static func ensureInitialized() {
        precondition(initialized, "libsodium failed to initialise")
    }

    /// A key pair from a 32-byte seed (`crypto_sign_seed_keypair`).
    static func keyPair(seed: Data) -> (publicKey: Data, secretKey: Data) {
        ensureInitialized()
        precondition(seed.count == seedLength)
        var pk = [UInt8](repeating: 0, count: publicKeyLength)
        var sk = [UInt8](repeating: 0, count: secretKeyLength)
        withBytes(seed) { s, _ in _ = crypto_sign_seed_keypair(&pk, &sk, s) }
        return (Data(pk), Data(sk))
    }

    /// Cryptographically secure random bytes (`randombytes_buf`).
    public static func randomBytes(_ count: Int) -> Data {
        ensureInitialized()
        var bytes = [UInt8](repeating: 0, count: count)
        randombytes_buf(&bytes, count)
        return Data(bytes)
    }

    /// A detached signature (`crypto_sign_detached`).
    static func sign(_ message: some ContiguousBytes, secretKey: [UInt8]) -> Data {
        var signature = Data(count: signatureLength)
        signature.withUnsafeMutableBytes { out in
            message.withUnsafeBytes { raw in
                var empty: UInt8 = 0
                let m = raw.bindMemory(to: UInt8.self)
                guard let s = out.bindMemory(to: UInt8.self).baseAddress else { return }
                if let base = m.baseAddress {
                    _ = crypto_sign_detached(s, nil, base, UInt64(m.count), secretKey)
                } else {
                    _ = crypto_sign_detached(s, nil, &empty, 0, secretKey)
                }
            }
        }
        return signature
    }

    private static let verifications = Atomic<Int>(0)

    /// How many signatures this process has verified so far (the bench counts a server's
    /// verifications per record with it).
    public static var verificationCount: Int { verifications.load(ordering: .relaxed) }

    /// Checks a detached signature (`crypto_sign_verify_detached`).
    public static func verify(signature: Data, message: Data, publicKey: Data) -> Bool {
        ensureInitialized()
        verifications.add(1, ordering: .relaxed)
        guard signature.count == signatureLength, publicKey.count == publicKeyLength else { return false }
        return withBytes(signature) { s, _ in
            withBytes(message) { m, count in
                withBytes(publicKey) { k, _ in crypto_sign_verify_detached(s, m, UInt64(count), k) == 0 }
            }
        }
    }

    /// SHA-256 of the bytes (`crypto_hash_sha256`).
    public static func sha256(_ data: Data) -> Data {
        ensureInitialized()
        var out = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
        withBytes(data) { d, count in _ = crypto_hash_sha256(&out, d, UInt64(count)) }
        return Data(out)
    }

    /// Compares in constant time (`sodium_memcmp`).
    package static func constantTimeEqual(_ a: Data, _ b: Data) -> Bool {
        guard a.count == b.count else { return false }
        return a.withUnsafeBytes { x in b.withUnsafeBytes { y in sodium_memcmp(x.baseAddress, y.baseAddress, a.count) == 0 } }
    }

    /// Calls `body` with a pointer to the bytes that is never nil, even for empty data
    /// (libsodium takes a valid pointer with a zero length).
    static func withBytes<R>(_ data: Data, _ body: (UnsafePointer<UInt8>, Int) -> R) -> R {
        data.withUnsafeBytes { raw in
            if let base = raw.bindMemory(to: UInt8.self).baseAddress { return body(base, raw.count) }
            var empty: UInt8 = 0
            return body(&empty, 0)
        }
    }
}
