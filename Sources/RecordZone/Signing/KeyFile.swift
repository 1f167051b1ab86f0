import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Reads and writes a ``SigningKey`` to a file only its owner can read.
///
/// The file is one line: `convkit-ed25519-seed-v1 <base64 seed>`. It is written with mode
/// 0600 (temporary name, fsync, rename), and refused on load when group or others may read it,
/// as ssh does with private keys.
public enum KeyFile {
    static let header = "convkit-ed25519-seed-v1"

    /// Writes the key to `path`, failing if a file is already there.
    /// - Throws: ``RecordZoneError`` (``RecordZoneError/Code/ioError``).
    public static func write(_ key: SigningKey, to path: String) throws(RecordZoneError) {
        let text = Data("\(header) \(key.seed.base64EncodedString())\n".utf8)
        try FileIO.writeAtomically(text, to: path, mode: 0o600, replacing: false)
    }

    /// Loads a key, refusing a file that others can read or that is malformed.
    /// - Throws: ``RecordZoneError`` with ``RecordZoneError/Code/notAuthorized`` for loose
    ///   permissions, ``RecordZoneError/Code/ioError`` when unreadable,
    ///   ``RecordZoneError/Code/invalidArguments`` when malformed.
    public static func load(from path: String) throws(RecordZoneError) -> SigningKey {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw RecordZoneError(.ioError, "cannot read key file \(path): \(String(cString: strerror(errno)))")
        }
        guard info.st_mode & 0o077 == 0 else {
            throw RecordZoneError(.notAuthorized, "key file \(path) has mode \(String(info.st_mode & 0o777, radix: 8)); it must not be readable by group or others (chmod 600)")
        }
        let data = try FileIO.read(path)
        let parts = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).split(separator: " ")
        guard parts.count == 2, parts[0] == header, let seed = Data(base64Encoded: String(parts[1])) else {
            throw RecordZoneError(.invalidArguments, "key file \(path) is not a convkit key file")
        }
        return try SigningKey(seed: seed)
    }

    /// Loads the key at `path`, or creates one there if there is none.
    public static func loadOrCreate(at path: String) throws(RecordZoneError) -> SigningKey {
        if FileManager.default.fileExists(atPath: path) { return try load(from: path) }
        let key = SigningKey.generate()
        try write(key, to: path)
        return key
    }
}
