import Foundation

/// How every request to a zone server is signed with the speaker's Ed25519 key.
///
/// ```
/// Authorization: ConvKit-Ed25519 id=<base64 identity>;key=<base64 public key>;ts=<unix ms>;nonce=<base64 16 bytes>;sig=<base64 signature>
/// ```
/// The signature covers, one per line: `convkit-request-v2`, the identity (base64, as in the
/// header), the method, the path, the
/// canonical query (arguments sorted by name then value, each `name=value` percent-encoded
/// with only RFC 3986 unreserved characters left as they are, joined by `&`), the timestamp,
/// the nonce, and the SHA-256 of the body in hex. A server refuses a request whose timestamp is
/// more than ``maximumClockSkew`` seconds away from its clock, and any nonce it has seen.
public enum RequestSignature {
    public static let scheme = "ConvKit-Ed25519"
    /// The header a linked device sends its ``DeviceCertificate`` in (base64 of its canonical
    /// bytes), so a server that has not seen it yet can bind the device's key from it.
    public static let deviceHeader = "ConvKit-Device"
    public static let maximumClockSkew: Double = 300

    /// The parts of an `Authorization` header.
    public struct Credentials: Sendable, Hashable {
        public var identity: String
        public var publicKey: Data
        public var timestamp: Int64
        public var nonce: Data
        public var signature: Data
    }

    /// The header value for a request.
    public static func authorization(method: String, path: String, query: [(String, String)], body: Data,
                                     identity: String, key: SigningKey, now: Date, nonce: Data = Sodium.randomBytes(16)) -> String {
        let timestamp = Int64((now.timeIntervalSince1970 * 1000).rounded())
        let signed = message(identity: identity, method: method, path: path, query: query, timestamp: timestamp, nonce: nonce, body: body)
        let parts = [
            "id=" + Data(identity.utf8).base64EncodedString(), "key=" + key.publicKey.base64EncodedString(),
            "ts=\(timestamp)", "nonce=" + nonce.base64EncodedString(), "sig=" + key.sign(signed).base64EncodedString(),
        ]
        return scheme + " " + parts.joined(separator: ";")
    }

    /// Parses a header; nil when it is not a well-formed ConvKit-Ed25519 header.
    public static func parse(_ header: String) -> Credentials? {
        guard header.hasPrefix(scheme + " ") else { return nil }
        var fields = [String: String]()
        for part in header.dropFirst(scheme.count + 1).split(separator: ";") {
            guard let equals = part.firstIndex(of: "=") else { return nil }
            fields[String(part[..<equals])] = String(part[part.index(after: equals)...])
        }
        // An identity in Unicode NFC only: one spelling per identity (the pins compare text by
        // canonical equivalence, zone hashes by bytes).
        guard let id = fields["id"].flatMap({ Data(base64Encoded: $0) }), let identity = String(data: id, encoding: .utf8), NormalForm.isNFC(identity),
            let key = fields["key"].flatMap({ Data(base64Encoded: $0) }), key.count == Sodium.publicKeyLength,
            let timestamp = fields["ts"].flatMap({ Int64($0) }),
            let nonce = fields["nonce"].flatMap({ Data(base64Encoded: $0) }), nonce.count >= 8, nonce.count <= 64,
            let signature = fields["sig"].flatMap({ Data(base64Encoded: $0) }), signature.count == Sodium.signatureLength
        else { return nil }
        return Credentials(identity: identity, publicKey: key, timestamp: timestamp, nonce: nonce, signature: signature)
    }

    /// Whether the credentials' signature covers this request.
    public static func verify(_ credentials: Credentials, method: String, path: String, query: [(String, String)], body: Data) -> Bool {
        let signed = message(identity: credentials.identity, method: method, path: path, query: query,
                             timestamp: credentials.timestamp, nonce: credentials.nonce, body: body)
        return Sodium.verify(signature: credentials.signature, message: signed, publicKey: credentials.publicKey)
    }

    static func message(identity: String, method: String, path: String, query: [(String, String)], timestamp: Int64, nonce: Data, body: Data) -> Data {
        var lines: [String] = ["convkit-request-v2", Data(identity.utf8).base64EncodedString(), method.uppercased(), path, canonicalQuery(query)]
        lines.append(String(timestamp))
        lines.append(nonce.base64EncodedString())
        lines.append(Sodium.sha256(body).hexString)
        return Data(lines.joined(separator: "\n").utf8)
    }

    /// Query arguments sorted and percent-encoded, as both sides compute them.
    public static func canonicalQuery(_ query: [(String, String)]) -> String {
        let encoded: [(name: String, value: String)] = query.map { (percentEncode($0.0), percentEncode($0.1)) }
        let sorted = encoded.sorted { a, b in a.name == b.name ? a.value < b.value : a.name < b.name }
        return sorted.map { "\($0.name)=\($0.value)" }.joined(separator: "&")
    }

    static func percentEncode(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.append(Character(UnicodeScalar(byte)))
            default:
                out += String(format: "%%%02X", byte)
            }
        }
        return out
    }
}
