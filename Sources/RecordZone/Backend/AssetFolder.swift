import Foundation

/// Assets stored as files named by their SHA-256: `<root>/<first 2 hex>/<64 hex>`, written once
/// (temporary name, fsync, rename), verified on every read. Used by the filesystem backend and
/// the zone server.
public struct AssetFolder: Sendable {
    public let root: String

    public init(root: String) { self.root = root }

    public func path(for reference: AssetReference) -> String {
        let hex = reference.hexHash
        return "\(root)/\(hex.prefix(2))/\(hex)"
    }

    /// Stores the bytes (checked against `expected` when given) and returns their reference.
    /// A damaged copy already there is replaced whole.
    public func put(_ data: Data, expected: AssetReference?) throws(RecordZoneError) -> AssetReference {
        let reference = try AssetChecks.reference(for: data, expected: expected)
        let path = path(for: reference)
        if FileIO.exists(path), let existing = try? FileIO.read(path), AssetReference(for: existing) == reference {
            return reference
        }
        try FileIO.makeDirectory((path as NSString).deletingLastPathComponent)
        try FileIO.writeAtomically(data, to: path)
        return reference
    }

    /// The bytes, verified against their hash.
    /// - Throws: ``RecordZoneError/Code/unknownItem``, ``RecordZoneError/Code/assetCorrupt``.
    public func get(_ reference: AssetReference) throws(RecordZoneError) -> Data {
        let path = path(for: reference)
        guard FileIO.exists(path) else { throw RecordZoneError(.unknownItem, "no asset \(reference)") }
        let data = try FileIO.read(path)
        // A size other than the stored one is the asker's mistake (no such asset), not damage.
        guard data.count == reference.size else { throw RecordZoneError(.unknownItem, "no asset \(reference) (the stored one has another size)") }
        try AssetChecks.verify(data, against: reference)
        return data
    }
}
