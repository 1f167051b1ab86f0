import Foundation

/// One speaker vouching for another's key: "the key of `introduced` is `key`", signed by the
/// introducer with a key of theirs. Given to someone who already holds the introducer's key, it
/// settles who `introduced` is without comparing fingerprints — the way a friend passes on a
/// contact (a `SpeakerRef` carries a key the same way, inside an app).
///
/// ```swift
/// let text = Introduction.issue(of: "bob", key: bobsKey, by: "alice", signingKey: aliceKey).text
/// let introduction = try Introduction(text: text)   // checks the signature; the reader then checks
///                                                    // that `signer` speaks for `introducer`
/// ```
public struct Introduction: Sendable, Hashable {
    public let introduced: String
    /// The introduced speaker's identity key.
    public let key: Data
    public let introducer: String
    /// The key the introducer signed with (its identity key or one of its devices).
    public let signer: Data
    public let signature: Data

    static let prefix = "convkit-intro-1:"

    /// Why an introduction is refused.
    public enum Failure: Error, Hashable, Sendable {
        /// Not an introduction, or altered: its signature does not verify.
        case invalid(String)
    }

    /// What the introducer signs.
    static func signed(introduced: String, key: Data, introducer: String) -> Data {
        Data("convkit-introduction-v1\n\(introducer)\n\(introduced)\n".utf8) + key
    }

    /// Signs an introduction.
    public static func issue(of introduced: String, key: Data, by introducer: String, signingKey: SigningKey) -> Introduction {
        Introduction(introduced: introduced, key: key, introducer: introducer, signer: signingKey.publicKey,
                     signature: signingKey.sign(signed(introduced: introduced, key: key, introducer: introducer)))
    }

    private init(introduced: String, key: Data, introducer: String, signer: Data, signature: Data) {
        self.introduced = introduced
        self.key = key
        self.introducer = introducer
        self.signer = signer
        self.signature = signature
    }

    /// The introduction as text: `convkit-intro-1:` and base64url (no padding) of the introduced
    /// identity and the introducer (each u16 length + UTF-8), the introduced key (32 bytes), the
    /// signer (32) and the signature (64).
    public var text: String {
        var w = ByteWriter()
        w.string16(introduced)
        w.string16(introducer)
        for part in [key, signer, signature] { w.append(part) }
        return Self.prefix + Base64URL.encode(Data(w.bytes))
    }

    /// Reads an introduction and checks its signature (not yet who signed it: the reader's pins
    /// decide whether `signer` speaks for `introducer`).
    public init(text: String) throws(Failure) {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard trimmed.hasPrefix(Self.prefix) else { throw .invalid("an introduction starts with \(Self.prefix)") }
        guard let bytes = Base64URL.decode(trimmed.dropFirst(Self.prefix.count)) else { throw .invalid("the introduction is not base64url") }
        let parts = bytes.withUnsafeBytes { raw -> (String, String, Data, Data, Data)? in
            var r = ByteReader(raw)
            guard let introduced = try? r.string16(what: "introduced"), let introducer = try? r.string16(what: "introducer"),
                let key = try? r.data(Sodium.publicKeyLength), let signer = try? r.data(Sodium.publicKeyLength),
                let signature = try? r.data(Sodium.signatureLength), r.remaining == 0
            else { return nil }
            return (introduced, introducer, key, signer, signature)
        }
        guard let (introduced, introducer, key, signer, signature) = parts else { throw .invalid("the introduction is truncated or malformed") }
        guard Sodium.verify(signature: signature, message: Self.signed(introduced: introduced, key: key, introducer: introducer), publicKey: signer) else {
            throw .invalid("the introduction's signature does not verify (altered?)")
        }
        self.init(introduced: introduced, key: key, introducer: introducer, signer: signer, signature: signature)
    }
}
