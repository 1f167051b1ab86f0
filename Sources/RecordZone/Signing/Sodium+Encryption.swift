import CSodium
import Foundation

/// libsodium's encryption constructions, walled in beside its signatures: XChaCha20-Poly1305
/// (IETF) for content, X25519 sealed boxes for sharing keys with a device, Argon2id and
/// secretbox for a recovery code, and ISO/IEC 7816-4 padding (docs/ENCRYPTION.md).
///
/// See <https://doc.libsodium.org/secret-key_cryptography/aead/chacha20-poly1305/xchacha20-poly1305_construction>
/// and <https://doc.libsodium.org/public-key_cryptography/sealed_boxes>.
extension Sodium {
    public static let aeadKeyLength = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
    public static let aeadNonceLength = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    public static let aeadTagLength = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    public static let boxPublicKeyLength = Int(crypto_box_PUBLICKEYBYTES)
    public static let boxSecretKeyLength = Int(crypto_box_SECRETKEYBYTES)
    public static let boxSeedLength = Int(crypto_box_SEEDBYTES)
    public static let sealOverhead = Int(crypto_box_sealbytes())

    /// Encrypts and authenticates `plaintext` and authenticates `additionalData`
    /// (`crypto_aead_xchacha20poly1305_ietf_encrypt`). - Returns: the ciphertext with its tag.
    public static func aeadEncrypt(_ plaintext: Data, additionalData: Data, nonce: Data, key: Data) -> Data {
        ensureInitialized()
        precondition(nonce.count == aeadNonceLength && key.count == aeadKeyLength)
        // Written straight into the Data returned (a file's chunk is a mebibyte: no second copy).
        var out = Data(count: plaintext.count + aeadTagLength)
        var written: UInt64 = 0
        out.withUnsafeMutableBytes { raw in
            guard let c = raw.bindMemory(to: UInt8.self).baseAddress else { return }
            withBytes(plaintext) { m, mCount in
                withBytes(additionalData) { a, aCount in
                    withBytes(nonce) { n, _ in
                        withBytes(key) { k, _ in
                            _ = crypto_aead_xchacha20poly1305_ietf_encrypt(c, &written, m, UInt64(mCount), a, UInt64(aCount), nil, n, k)
                        }
                    }
                }
            }
        }
        return out
    }

    /// `header ‖ nonce ‖ aeadEncrypt(pad(plaintext, block), additionalData, nonce, key)`, built
    /// in the one buffer it is returned in: the nonce drawn into it (`randombytes_buf`) unless
    /// given, the plaintext copied in, padded (as ``pad(_:block:)``) and encrypted where it lies — what a
    /// sealed envelope is, without a copy for each step.
    public static func aeadEncryptPadded(_ plaintext: some ContiguousBytes, block: Int, header: Data, additionalData: Data, key: Data, nonce: Data? = nil) -> Data {
        ensureInitialized()
        precondition(nonce.map { $0.count == aeadNonceLength } ?? true && key.count == aeadKeyLength && block > 0)
        // ISO/IEC 7816-4 always adds at least one byte: the next multiple of the block.
        let plaintextCount = plaintext.withUnsafeBytes { $0.count }
        let paddedLength = (plaintextCount / block + 1) * block
        let bodyAt = header.count + aeadNonceLength
        var out = Data(count: bodyAt + paddedLength + aeadTagLength)
        out.withUnsafeMutableBytes { raw in
            guard let base = raw.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return }
            header.copyBytes(to: base, count: header.count)
            let noncePointer = base + header.count, body = base + bodyAt
            if let nonce { nonce.copyBytes(to: noncePointer, count: aeadNonceLength) } else { randombytes_buf(noncePointer, aeadNonceLength) }
            plaintext.withUnsafeBytes { UnsafeMutableRawBufferPointer(start: body, count: plaintextCount).copyMemory(from: $0) }
            // ISO/IEC 7816-4 into a zeroed buffer is one byte: 0x80 after the plaintext
            // (`sodium_pad`'s layout, tested against it). `sodium_pad` spends half a microsecond
            // walking the block in constant time, which hides nothing here: the plaintext was
            // just copied in time proportional to its length.
            body[plaintextCount] = 0x80
            var written: UInt64 = 0
            withBytes(additionalData) { a, aCount in
                withBytes(key) { k, _ in
                    // In place: libsodium's AEADs accept the ciphertext over the message.
                    _ = crypto_aead_xchacha20poly1305_ietf_encrypt(body, &written, body, UInt64(paddedLength), a, UInt64(aCount), nil, noncePointer, k)
                }
            }
        }
        return out
    }

    /// Checks and decrypts (`crypto_aead_xchacha20poly1305_ietf_decrypt`). - Returns: nil when
    /// the tag does not verify (another key, other additional data, a changed byte).
    public static func aeadDecrypt(_ ciphertext: Data, additionalData: Data, nonce: Data, key: Data) -> Data? {
        ensureInitialized()
        guard nonce.count == aeadNonceLength, key.count == aeadKeyLength, ciphertext.count >= aeadTagLength else { return nil }
        var out = Data(count: ciphertext.count - aeadTagLength)
        var written: UInt64 = 0
        var empty: UInt8 = 0
        let status = out.withUnsafeMutableBytes { raw -> Int32 in
            // An empty plaintext still needs a valid pointer.
            withUnsafeMutablePointer(to: &empty) { emptyPointer in
                let m = raw.bindMemory(to: UInt8.self).baseAddress ?? emptyPointer
                return withBytes(ciphertext) { c, cCount in
                    withBytes(additionalData) { a, aCount in
                        withBytes(nonce) { n, _ in
                            withBytes(key) { k, _ in
                                crypto_aead_xchacha20poly1305_ietf_decrypt(m, &written, nil, c, UInt64(cCount), a, UInt64(aCount), n, k)
                            }
                        }
                    }
                }
            }
        }
        return status == 0 ? out : nil
    }

    /// A 32-byte subkey of a 32-byte master key (`crypto_kdf_derive_from_key`, BLAKE2b): the
    /// subkey numbered `id` in an 8-character `context`. Different ids or contexts give
    /// independent keys; none reveals the master.
    public static func deriveKey(from master: Data, id: UInt64, context: String) -> Data {
        ensureInitialized()
        precondition(master.count == Int(crypto_kdf_KEYBYTES) && context.utf8.count == Int(crypto_kdf_CONTEXTBYTES))
        var subkey = [UInt8](repeating: 0, count: 32)
        let contextBytes = Array(context.utf8).map { CChar(bitPattern: $0) }
        withBytes(master) { m, _ in _ = crypto_kdf_derive_from_key(&subkey, 32, id, contextBytes, m) }
        return Data(subkey)
    }

    /// An X25519 key pair from a 32-byte seed (`crypto_box_seed_keypair`).
    public static func boxKeyPair(seed: Data) -> (publicKey: Data, secretKey: Data) {
        ensureInitialized()
        precondition(seed.count == boxSeedLength)
        var pk = [UInt8](repeating: 0, count: boxPublicKeyLength)
        var sk = [UInt8](repeating: 0, count: boxSecretKeyLength)
        withBytes(seed) { s, _ in _ = crypto_box_seed_keypair(&pk, &sk, s) }
        return (Data(pk), Data(sk))
    }

    /// Encrypts `message` to an X25519 public key, anonymously (`crypto_box_seal`).
    public static func seal(_ message: Data, to publicKey: Data) -> Data {
        ensureInitialized()
        precondition(publicKey.count == boxPublicKeyLength)
        var out = [UInt8](repeating: 0, count: message.count + sealOverhead)
        withBytes(message) { m, count in withBytes(publicKey) { k, _ in _ = crypto_box_seal(&out, m, UInt64(count), k) } }
        return Data(out)
    }

    /// Opens a sealed box with the recipient's key pair (`crypto_box_seal_open`). - Returns: nil
    /// when it was not sealed to this key, or was changed.
    public static func openSealed(_ box: Data, publicKey: Data, secretKey: Data) -> Data? {
        ensureInitialized()
        guard box.count >= sealOverhead, publicKey.count == boxPublicKeyLength, secretKey.count == boxSecretKeyLength else { return nil }
        var out = [UInt8](repeating: 0, count: box.count - sealOverhead)
        let status = withBytes(box) { c, count in
            withBytes(publicKey) { pk, _ in withBytes(secretKey) { sk, _ in crypto_box_seal_open(&out, c, UInt64(count), pk, sk) } }
        }
        return status == 0 ? Data(out) : nil
    }

    public static let secretboxKeyLength = Int(crypto_secretbox_KEYBYTES)
    public static let secretboxNonceLength = Int(crypto_secretbox_NONCEBYTES)
    public static let secretboxOverhead = Int(crypto_secretbox_MACBYTES)
    public static let passwordSaltLength = Int(crypto_pwhash_SALTBYTES)
    /// Argon2id's "moderate" cost (`crypto_pwhash_OPSLIMIT_MODERATE`, `MEMLIMIT_MODERATE`: 3
    /// passes over 256 MiB), for a secret typed once on a new machine.
    public static let passwordOpsLimitModerate = UInt64(crypto_pwhash_OPSLIMIT_MODERATE)
    public static let passwordMemLimitModerate = UInt64(crypto_pwhash_MEMLIMIT_MODERATE)
    /// The highest cost a stored record may ask for (`..._SENSITIVE`: 4 passes over 1 GiB).
    public static let passwordOpsLimitMaximum = UInt64(crypto_pwhash_OPSLIMIT_SENSITIVE)
    public static let passwordMemLimitMaximum = UInt64(crypto_pwhash_MEMLIMIT_SENSITIVE)

    /// A 32-byte key from a password and a 16-byte salt (`crypto_pwhash`, Argon2id v1.3).
    /// - Returns: nil when the limits are out of libsodium's range or memory runs out.
    public static func passwordKey(_ password: Data, salt: Data, opsLimit: UInt64, memLimit: UInt64) -> Data? {
        ensureInitialized()
        guard salt.count == passwordSaltLength, opsLimit >= UInt64(crypto_pwhash_OPSLIMIT_MIN), opsLimit <= passwordOpsLimitMaximum,
              memLimit >= UInt64(crypto_pwhash_MEMLIMIT_MIN), memLimit <= passwordMemLimitMaximum else { return nil }
        var key = [UInt8](repeating: 0, count: secretboxKeyLength)
        let status = withBytes(password) { p, count in
            withBytes(salt) { s, _ in
                p.withMemoryRebound(to: CChar.self, capacity: max(count, 1)) { chars in
                    crypto_pwhash(&key, UInt64(key.count), chars, UInt64(count), s, opsLimit, Int(memLimit), crypto_pwhash_ALG_ARGON2ID13)
                }
            }
        }
        return status == 0 ? Data(key) : nil
    }

    /// Encrypts and authenticates with a secret key (`crypto_secretbox_easy`, XSalsa20-Poly1305).
    /// - Returns: the tag and ciphertext (the nonce is the caller's to keep beside them).
    public static func secretbox(_ message: Data, nonce: Data, key: Data) -> Data {
        ensureInitialized()
        precondition(nonce.count == secretboxNonceLength && key.count == secretboxKeyLength)
        var out = [UInt8](repeating: 0, count: message.count + secretboxOverhead)
        withBytes(message) { m, count in withBytes(nonce) { n, _ in withBytes(key) { k, _ in _ = crypto_secretbox_easy(&out, m, UInt64(count), n, k) } } }
        return Data(out)
    }

    /// Checks and decrypts ``secretbox(_:nonce:key:)``'s output (`crypto_secretbox_open_easy`).
    /// - Returns: nil for another key or a changed byte.
    public static func secretboxOpen(_ box: Data, nonce: Data, key: Data) -> Data? {
        ensureInitialized()
        guard box.count >= secretboxOverhead, nonce.count == secretboxNonceLength, key.count == secretboxKeyLength else { return nil }
        var out = [UInt8](repeating: 0, count: box.count - secretboxOverhead)
        let status = withBytes(box) { c, count in withBytes(nonce) { n, _ in withBytes(key) { k, _ in crypto_secretbox_open_easy(&out, c, UInt64(count), n, k) } } }
        return status == 0 ? Data(out) : nil
    }

    /// Pads to a multiple of `block` bytes (`sodium_pad`, ISO/IEC 7816-4: a 0x80, then zeros;
    /// always at least one byte added).
    public static func pad(_ data: Data, block: Int) -> Data {
        ensureInitialized()
        var buffer = [UInt8](data) + [UInt8](repeating: 0, count: block)
        var padded = 0
        _ = sodium_pad(&padded, &buffer, data.count, block, buffer.count)
        return Data(buffer.prefix(padded))
    }

    /// Removes ``pad(_:block:)``'s padding (`sodium_unpad`). - Returns: nil when it is not padded so.
    public static func unpad(_ data: Data, block: Int) -> Data? {
        ensureInitialized()
        var buffer = [UInt8](data)
        var length = 0
        guard !buffer.isEmpty, sodium_unpad(&length, &buffer, buffer.count, block) == 0 else { return nil }
        return Data(buffer.prefix(length))
    }
}
