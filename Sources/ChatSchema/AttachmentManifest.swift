import Foundation
import RecordZone

/// A file sent with a message (docs/PROTOCOL.md §3.4): cut into chunks of ``chunkSize`` bytes,
/// each encrypted on its own with the file's random key (XChaCha20-Poly1305, the chunk's index
/// as its nonce) and stored as an asset named by the ciphertext's SHA-256. The message carries,
/// sealed with its content, what a reader needs to fetch and open it: this manifest.
///
/// Chunks make every step bounded in memory (one chunk at a time) and resumable (a chunk is
/// uploaded or downloaded whole, or again); the asset names make the server check each
/// chunk's bytes as it stores them and the reader as it fetches them; the key, known only to
/// the conversation, makes them unreadable to the backend; the AEAD tag with the index as nonce
/// makes a chunk from another file, or from another place in this one, fail to open.
package struct AttachmentManifest: Sendable, Hashable {
    /// The bytes of plaintext in every chunk but the last.
    package static let chunkSize = 1 << 20
    /// The largest file: 1 GiB (1,024 chunks, whose references fit a message record many times).
    package static let maximumSize: Int64 = 1 << 30
    package static let maximumNameBytes = 255
    package static let maximumTypeBytes = 127
    /// A thumbnail is a small JPEG carried in the message itself, as WhatsApp's and Signal's.
    package static let maximumThumbnailBytes = 64 * 1024

    /// The record fields a manifest uses (all sealed with the message's content).
    package static let fields = ["fileName", "fileType", "fileSize", "fileKey", "fileChunks", "thumbnail", "imageWidth", "imageHeight"]

    /// The file's name as the sender had it (no directory: a reader never uses it as a path as it is).
    package var name: String
    /// A media type (`image/png`, `application/pdf`), as the sender said.
    package var mediaType: String
    package var size: Int64
    /// 32 random bytes, this file's only.
    package var key: Data
    /// The encrypted chunks, in order.
    package var chunks: [AssetReference]
    /// A JPEG at most ``maximumThumbnailBytes`` long, for an image.
    package var thumbnail: Data?
    /// An image's full size in pixels.
    package var pixelWidth: Int?
    package var pixelHeight: Int?

    package init(name: String, mediaType: String, size: Int64, key: Data, chunks: [AssetReference], thumbnail: Data? = nil,
                 pixelWidth: Int? = nil, pixelHeight: Int? = nil) {
        self.name = name
        self.mediaType = mediaType
        self.size = size
        self.key = key
        self.chunks = chunks
        self.thumbnail = thumbnail
        self.pixelWidth = pixelWidth
        self.pixelHeight = pixelHeight
    }

    /// How many chunks a file of `size` bytes has (an empty file has none).
    package static func chunkCount(size: Int64) -> Int { Int((size + Int64(chunkSize) - 1) / Int64(chunkSize)) }

    /// The plaintext bytes of chunk `index` of a file of `size` bytes.
    package static func plainSize(ofChunk index: Int, size: Int64) -> Int {
        Int(min(Int64(chunkSize), size - Int64(index) * Int64(chunkSize)))
    }

    /// The chunks' hashes, one after another (how a store keeps them).
    package static func hashes(of chunks: [AssetReference]) -> Data {
        chunks.reduce(into: Data(capacity: chunks.count * 32)) { $0.append($1.hash) }
    }

    /// The chunks of a file of `size` bytes from their hashes one after another (their sizes
    /// follow from the size); nil when the count does not match.
    package static func chunks(fromHashes hashes: Data, size: Int64) -> [AssetReference]? {
        let count = chunkCount(size: size)
        guard hashes.count == count * 32 else { return nil }
        return (0..<count).compactMap { index in
            let from = hashes.startIndex + index * 32
            return try? AssetReference(hash: Data(hashes[from ..< from + 32]), size: UInt64(plainSize(ofChunk: index, size: size) + Sodium.aeadTagLength))
        }
    }

    /// Whether a name may be sent: 1–255 bytes, not `.` or `..`, no `/`, no control, format
    /// (bidi overrides: "gpj.exe" shown backwards) or line-separating character — but the
    /// zero-width joiner and non-joiner, which emoji and several scripts need.
    package static func isValidName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= maximumNameBytes && name != "." && name != ".."
            && !name.unicodeScalars.contains { scalar in
                switch scalar.properties.generalCategory {
                case .control, .lineSeparator, .paragraphSeparator: true
                case .format: scalar != "\u{200C}" && scalar != "\u{200D}"
                default: scalar == "/"
                }
            }
    }

    /// Whether a media type looks like one: `type/subtype`, printable ASCII without spaces.
    package static func isValidMediaType(_ type: String) -> Bool {
        let bytes = Array(type.utf8)
        return bytes.count <= maximumTypeBytes && bytes.filter { $0 == UInt8(ascii: "/") }.count == 1 && bytes.first != UInt8(ascii: "/")
            && bytes.last != UInt8(ascii: "/") && bytes.allSatisfy { $0 > 0x20 && $0 < 0x7F }
    }

    /// The fields it is written as.
    package var recordFields: [String: FieldValue] {
        var fields: [String: FieldValue] = [
            "fileName": .string(name), "fileType": .string(mediaType), "fileSize": .int(size), "fileKey": .bytes(key),
            "fileChunks": .list(chunks.map { .asset($0) }),
        ]
        if let thumbnail { fields["thumbnail"] = .bytes(thumbnail) }
        if let pixelWidth, let pixelHeight {
            fields["imageWidth"] = .int(Int64(pixelWidth))
            fields["imageHeight"] = .int(Int64(pixelHeight))
        }
        return fields
    }

    /// The manifest a (opened) message record carries: nil when it carries none, or one that
    /// breaks the rules (a reader then shows the message without a file): a valid name and type,
    /// a size within the limit, a 32-byte key, exactly the chunks the size makes, each of its
    /// plaintext's size plus the tag.
    package init?(record: Record) {
        guard let name = record.string("fileName"), Self.isValidName(name), let type = record.string("fileType"), Self.isValidMediaType(type),
              let size = record["fileSize"]?.intValue, (1...Self.maximumSize).contains(size),
              let key = record["fileKey"]?.bytesValue, key.count == Sodium.aeadKeyLength,
              let list = record["fileChunks"]?.listValue, list.count == Self.chunkCount(size: size) else { return nil }
        var chunks: [AssetReference] = []
        chunks.reserveCapacity(list.count)
        for (index, value) in list.enumerated() {
            guard let chunk = value.assetValue, chunk.size == UInt64(Self.plainSize(ofChunk: index, size: size) + Sodium.aeadTagLength) else { return nil }
            chunks.append(chunk)
        }
        let thumbnail = record["thumbnail"]?.bytesValue.flatMap { $0.count <= Self.maximumThumbnailBytes ? $0 : nil }
        let width = record["imageWidth"]?.intValue, height = record["imageHeight"]?.intValue
        let sized = width.flatMap { w in height.map { (w, $0) } }.flatMap { (1...65535).contains($0.0) && (1...65535).contains($0.1) ? $0 : nil }
        self.init(name: name, mediaType: type, size: size, key: key, chunks: chunks, thumbnail: thumbnail,
                  pixelWidth: sized.map { Int($0.0) }, pixelHeight: sized.map { Int($0.1) })
    }

    /// Chunk `index`'s nonce: 24 bytes, the index big-endian in the last eight.
    private static func nonce(_ index: Int) -> Data {
        var nonce = Data(count: Sodium.aeadNonceLength)
        withUnsafeBytes(of: UInt64(index).bigEndian) { nonce.replaceSubrange((Sodium.aeadNonceLength - 8)..., with: $0) }
        return nonce
    }

    private static let label = Data("convkit-attachment-v1".utf8)

    /// Chunk `index` encrypted: the ciphertext with its tag (what its asset holds).
    package static func sealChunk(_ plaintext: Data, index: Int, key: Data) -> Data {
        Sodium.aeadEncrypt(plaintext, additionalData: label, nonce: nonce(index), key: key)
    }

    /// Chunk `index` decrypted, or nil when it does not open (another file's, another place's, a changed byte).
    package static func openChunk(_ ciphertext: Data, index: Int, key: Data) -> Data? {
        Sodium.aeadDecrypt(ciphertext, additionalData: label, nonce: nonce(index), key: key)
    }
}
