import Foundation

/// The merge rule every replica applies, so that every replica converges: among valid versions
/// of one record the highest (clock, author key) wins; a tombstone is a version like any other.
/// Two versions with the same clock and key (a key that signed twice) are ordered by signature
/// bytes, so even that case ends the same everywhere.
public enum MergeRule {
    /// Whether `candidate` wins over `current`.
    public static func wins(_ candidate: Record, over current: Record) -> Bool {
        if candidate.clock != current.clock { return candidate.clock > current.clock }
        if candidate.authorKey != current.authorKey {
            return current.authorKey.lexicographicallyPrecedes(candidate.authorKey)
        }
        return current.signature.lexicographicallyPrecedes(candidate.signature)
    }

    /// The winner of two versions.
    public static func winner(_ a: Record, _ b: Record) -> Record {
        wins(b, over: a) ? b : a
    }

    /// Merges a version into a map of winners; returns whether it won.
    @discardableResult
    public static func merge(_ record: Record, into winners: inout [RecordID: Record]) -> Bool {
        if let current = winners[record.id], !wins(record, over: current) { return false }
        winners[record.id] = record
        return true
    }
}
