import Foundation
import RecordZone

/// A recovery code and the record it opens (docs/PROTOCOL.md §3.3): the identity's Ed25519 seed,
/// wrapped with a key that Argon2id (`crypto_pwhash`) makes from a code the person writes down,
/// in a `Recovery` record of the speaker's zone named `recovery.<identity>`, signed by the
/// identity key (its devices may not sign one). Anyone may fetch it (a zone server serves it
/// without authentication): without the code, nothing in it is readable.
public enum Recovery {
    public static let recordType = "Recovery"
    public static let namePrefix = "recovery."
    public static let identityField = "identity"
    public static let saltField = "salt"
    public static let opsLimitField = "opsLimit"
    public static let memLimitField = "memLimit"
    public static let nonceField = "nonce"
    public static let boxField = "box"

    /// The code's random bytes: 256 bits, as many as the key it stands for.
    public static let codeLength = 32
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".utf8)
    static let header = Data("convkit-recovery-v1\n".utf8)

    public static func recordID(identity: String) throws(RecordZoneError) -> RecordID {
        try RecordID(zone: ChatRecords.speakerZone(identity), name: namePrefix + identity)
    }

    /// A new code's bytes.
    public static func newCode() -> Data { Sodium.randomBytes(codeLength) }

    /// The code as a person writes it: base32 (RFC 4648, no padding) in 13 groups of 4,
    /// `ABCD-EFGH-…`.
    public static func text(of code: Data) -> String {
        var characters = [UInt8](), buffer = 0, bits = 0
        for byte in code {
            buffer = (buffer << 8) | Int(byte)
            bits += 8
            while bits >= 5 {
                characters.append(alphabet[(buffer >> (bits - 5)) & 31])
                bits -= 5
            }
        }
        if bits > 0 { characters.append(alphabet[(buffer << (5 - bits)) & 31]) }
        let text = String(decoding: characters, as: UTF8.self)
        return stride(from: 0, to: text.count, by: 4).map { start in
            String(text.dropFirst(start).prefix(4))
        }.joined(separator: "-")
    }

    /// A code as typed back: letters of either case, `0` and `1` read as `O` and `I`, spaces
    /// and dashes ignored. - Returns: nil when it is not 52 base32 characters of 32 bytes.
    public static func code(from text: String) -> Data? {
        var buffer = 0, bits = 0
        var bytes = Data()
        var count = 0
        for scalar in text.uppercased().unicodeScalars where scalar != "-" && scalar != " " && scalar != "\t" && scalar != "\n" {
            let character: UInt8 = switch scalar { case "0": UInt8(ascii: "O"); case "1": UInt8(ascii: "I"); default: scalar.isASCII ? UInt8(scalar.value) : 0 }
            guard let value = alphabet.firstIndex(of: character) else { return nil }
            buffer = ((buffer << 5) | value) & 0xFFFF
            bits += 5
            count += 1
            if bits >= 8 {
                bytes.append(UInt8((buffer >> (bits - 8)) & 0xFF))
                bits -= 8
            }
        }
        // 52 characters hold 260 bits: the 4 past the code's 256 are zero.
        guard count == (codeLength * 8 + 4) / 5, bytes.count == codeLength, buffer & ((1 << bits) - 1) == 0 else { return nil }
        return bytes
    }

    /// The record wrapping `seed` (the identity key's) for `identity` with `code` (unsigned: the
    /// identity key signs it). Fresh salt and nonce each time; Argon2id at libsodium's moderate cost.
    public static func record(identity: String, seed: Data, code: Data,
                              opsLimit: UInt64 = Sodium.passwordOpsLimitModerate, memLimit: UInt64 = Sodium.passwordMemLimitModerate,
                              salt: Data = Sodium.randomBytes(Sodium.passwordSaltLength),
                              nonce: Data = Sodium.randomBytes(Sodium.secretboxNonceLength)) throws(RecordZoneError) -> Record {
        guard let key = Sodium.passwordKey(code, salt: salt, opsLimit: opsLimit, memLimit: memLimit) else {
            throw RecordZoneError(.ioError, "Argon2id could not run (out of memory?)")
        }
        let box = Sodium.secretbox(plaintext(identity: identity, seed: seed), nonce: nonce, key: key)
        return Record(id: try recordID(identity: identity), type: recordType, fields: [
            identityField: .string(identity), saltField: .bytes(salt), opsLimitField: .int(Int64(opsLimit)),
            memLimitField: .int(Int64(memLimit)), nonceField: .bytes(nonce), boxField: .bytes(box),
        ])
    }

    /// What the box holds: `"convkit-recovery-v1\n" ‖ identity ‖ "\n" ‖ seed (32)`.
    public static func plaintext(identity: String, seed: Data) -> Data { header + Data(identity.utf8) + Data("\n".utf8) + seed }

    /// Why a recovery record does not give back its identity's key.
    public enum OpenError: Error, Sendable, Equatable, CustomStringConvertible {
        /// Not a well-formed recovery record (or costs past libsodium's sensitive limits).
        case shape(String)
        /// The code does not open the box: another code, or a typo.
        case wrongCode
        /// The box opens but what it holds is not the key that signed the record.
        case notTheIdentityKey

        public var description: String {
            switch self {
            case .shape(let why): why
            case .wrongCode: "the recovery code does not open the recovery record"
            case .notTheIdentityKey: "the recovery record holds another key than the one that signed it"
            }
        }
    }

    /// The identity key a (signature-checked) recovery record holds for `code`.
    public static func open(_ record: Record, code: Data) throws(OpenError) -> SigningKey {
        guard !record.isDeleted, let identity = record.string(identityField), let salt = record[saltField]?.bytesValue,
              let ops = record[opsLimitField]?.intValue, let mem = record[memLimitField]?.intValue,
              let nonce = record[nonceField]?.bytesValue, let box = record[boxField]?.bytesValue,
              record.id == (try? recordID(identity: identity))
        else { throw .shape("not a recovery record of its speaker's zone") }
        guard ops > 0, mem > 0, UInt64(ops) <= Sodium.passwordOpsLimitMaximum, UInt64(mem) <= Sodium.passwordMemLimitMaximum else {
            throw .shape("the recovery record asks for Argon2id costs past libsodium's sensitive limits")
        }
        guard let key = Sodium.passwordKey(code, salt: salt, opsLimit: UInt64(ops), memLimit: UInt64(mem)) else {
            throw .shape("the recovery record's salt or costs are out of range")
        }
        guard let opened = Sodium.secretboxOpen(box, nonce: nonce, key: key) else { throw .wrongCode }
        let seed = Data(opened.suffix(Sodium.seedLength))
        guard opened == plaintext(identity: identity, seed: seed), let signingKey = try? SigningKey(seed: seed), signingKey.publicKey == record.authorKey
        else { throw .notTheIdentityKey }
        return signingKey
    }
}
