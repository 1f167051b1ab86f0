import Foundation
import SQLiteKit

/// What this device has read of a zone folder, kept outside it (`<state>/index.sqlite`; in
/// memory for a reader without local state), so that a new process costs what changed since the
/// last look, not the zone's history:
///
/// - per zone generation, how far each device's segments were read (a ``VersionVector``) and the
///   winning version of every record read so far, as its canonical bytes and change tag — written
///   in one transaction, so the two always agree;
/// - per zone generation, the key claims of every readable segment (``KeyClaims``) and which
///   files they come from;
/// - segment files whose every signature verified, by path and full SHA-256 (read again byte
///   for byte the same, they are not verified again);
/// - this device's own segment files found whole in the folder, by path and size-and-time stamp.
///
/// It is a cache of the folder, trusted as a store trusts its own database: losing it (or a
/// damaged one, which is set aside and rebuilt) costs one full read, never a record. Not
/// `Sendable`: its owner (the backend actor) serializes access.
final class FolderIndex {
    static let fileName = "index.sqlite"
    static let schemaVersion = 1
    private let db: Database

    /// Opens the index at `path`, or in memory (`nil`). A file that is not a readable index of
    /// this version is removed and started again (it only ever caches the folder).
    init(path: String?) throws(RecordZoneError) {
        let why: String
        do {
            if let opened = try Self.open(path ?? ":memory:") {
                db = opened
                return
            }
            why = "an index of another version"
        } catch {
            why = "\(error)"
        }
        guard let path else { throw RecordZoneError(.ioError, "local folder index: \(why)") }
        for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
        do {
            guard let opened = try Self.open(path) else { throw SQLiteError(code: ResultCode.error.rawValue, message: "another process wrote an index of another version") }
            db = opened
        } catch {
            throw RecordZoneError(.ioError, "cannot create the local folder index \(path) (\(why) was there): \(error)")
        }
    }

    /// The index at `path`, created if the file is new; nil when it is an index of another
    /// version (the caller starts it again).
    private static func open(_ path: String) throws(SQLiteError) -> Database? {
        let db = try Database(path: path)
        // A cache: a commit need not reach the disk before the call returns (WAL keeps it
        // consistent; a power cut loses at most the last looks, read again from the folder).
        try db.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL")
        let version = try db.userVersion
        if version == schemaVersion { return db }
        guard version == 0 else { return nil }
        try db.execute("""
            BEGIN;
            CREATE TABLE position(zone TEXT NOT NULL, generation INTEGER NOT NULL, vector BLOB NOT NULL,
                                  PRIMARY KEY (zone, generation)) WITHOUT ROWID;
            CREATE TABLE winner(zone TEXT NOT NULL, generation INTEGER NOT NULL, name TEXT NOT NULL,
                                bytes BLOB NOT NULL, change_tag TEXT NOT NULL, PRIMARY KEY (zone, generation, name));
            CREATE TABLE claim_file(zone TEXT NOT NULL, generation INTEGER NOT NULL, file TEXT NOT NULL,
                                    PRIMARY KEY (zone, generation, file)) WITHOUT ROWID;
            CREATE TABLE claim(zone TEXT NOT NULL, generation INTEGER NOT NULL, identity TEXT NOT NULL, key BLOB NOT NULL,
                               rotated INTEGER NOT NULL, PRIMARY KEY (zone, generation, identity, key, rotated)) WITHOUT ROWID;
            CREATE TABLE verified_file(path TEXT PRIMARY KEY, hash BLOB NOT NULL) WITHOUT ROWID;
            CREATE TABLE own_file(path TEXT PRIMARY KEY, stamp TEXT NOT NULL) WITHOUT ROWID;
            PRAGMA user_version = \(schemaVersion);
            COMMIT;
            """)
        return db
    }

    private func run<T>(_ what: String, _ body: () throws(SQLiteError) -> T) throws(RecordZoneError) -> T {
        do { return try body() } catch { throw RecordZoneError(.ioError, "local folder index, \(what): \(error)") }
    }

    // MARK: Winners and position

    /// How far the winners of a zone generation were read; forgets older generations of it.
    func position(_ zone: ZoneName, _ generation: UInt64) throws(RecordZoneError) -> VersionVector {
        try run("reading a position") { () throws(SQLiteError) in
            let stale = try db.first("SELECT 1 FROM position WHERE zone = ? AND generation <> ?", [zone.rawValue, generation]) { _ in true } ?? false
            if stale {
                for table in ["position", "winner", "claim_file", "claim"] {
                    try db.execute("DELETE FROM \(table) WHERE zone = ? AND generation <> ?", [zone.rawValue, generation])
                }
            }
            let data = try db.first("SELECT vector FROM position WHERE zone = ? AND generation = ?", [zone.rawValue, generation]) { $0.blob(0) }
            return data.flatMap(VersionVector.init(encoded:)) ?? VersionVector()
        }
    }

    /// The winning version held of a record, with its change tag.
    func winner(_ id: RecordID, _ generation: UInt64) throws(RecordZoneError) -> Record? {
        try run("reading a record") { () throws(SQLiteError) in try stored(id, generation) }
    }

    private func stored(_ id: RecordID, _ generation: UInt64) throws(SQLiteError) -> Record? {
        try db.first("SELECT bytes, change_tag FROM winner WHERE zone = ? AND generation = ? AND name = ?",
                     [id.zone.rawValue, generation, id.name]) { Self.record($0.blob(0), changeTag: $0.text(1)) } ?? nil
    }

    /// Every winning version of a zone generation.
    func winners(_ zone: ZoneName, _ generation: UInt64) throws(RecordZoneError) -> [Record] {
        try run("reading records") { () throws(SQLiteError) in
            try db.rows("SELECT bytes, change_tag FROM winner WHERE zone = ? AND generation = ?", [zone.rawValue, generation]) {
                Self.record($0.blob(0), changeTag: $0.text(1))
            }
        }.compactMap { $0 }
    }

    private static func record(_ bytes: Data, changeTag: String) -> Record? {
        guard var record = try? Record(canonical: bytes) else { return nil }
        record.serverMetadata = ServerMetadata(changeTag: changeTag)
        return record
    }

    /// Merges versions read or written (each with its change tag and canonical bytes) into the
    /// winners and moves the position, in one transaction. - Parameter decided: the versions are
    /// known to win over what is held (a save decided it): they are stored without comparing.
    /// - Returns: per version, the winner after it.
    @discardableResult
    func apply(_ versions: [(record: Record, bytes: Data)], _ zone: ZoneName, _ generation: UInt64, position: VersionVector,
               decided: Bool = false) throws(RecordZoneError) -> [Record] {
        try run("writing records") { () throws(SQLiteError) in
            try transaction { () throws(SQLiteError) in
                var pending = [String: Record]()
                var winners = [Record]()
                winners.reserveCapacity(versions.count)
                for (record, bytes) in versions {
                    var current = decided ? nil : pending[record.id.name]
                    if current == nil && !decided { current = try stored(record.id, generation) }
                    if let current, !MergeRule.wins(record, over: current) {
                        winners.append(current)
                        continue
                    }
                    try db.execute("INSERT OR REPLACE INTO winner(zone, generation, name, bytes, change_tag) VALUES (?, ?, ?, ?, ?)",
                                   [zone.rawValue, generation, record.id.name, bytes, record.serverMetadata?.changeTag ?? ""])
                    pending[record.id.name] = record
                    winners.append(record)
                }
                try db.execute("INSERT OR REPLACE INTO position(zone, generation, vector) VALUES (?, ?, ?)", [zone.rawValue, generation, position.encoded])
                return winners
            }
        }
    }

    private func transaction<T>(_ body: () throws(SQLiteError) -> T) throws(SQLiteError) -> T {
        try db.execute("BEGIN IMMEDIATE")
        do {
            let result = try body()
            try db.execute("COMMIT")
            return result
        } catch {
            try? db.execute("ROLLBACK")
            throw error
        }
    }

    // MARK: Claims

    /// The claims of a zone generation's segments read so far, and which files they come from.
    func claims(_ zone: ZoneName, _ generation: UInt64) throws(RecordZoneError) -> (claims: KeyClaims, files: Set<String>) {
        try run("reading claims") { () throws(SQLiteError) in
            var claims = KeyClaims()
            for (identity, key, rotated) in try db.rows("SELECT identity, key, rotated FROM claim WHERE zone = ? AND generation = ?",
                                                        [zone.rawValue, generation], { ($0.text(0), $0.blob(1), $0.bool(2)) }) {
                claims.insert(identity: identity, key: key, rotated: rotated)
            }
            let files = try db.rows("SELECT file FROM claim_file WHERE zone = ? AND generation = ?", [zone.rawValue, generation]) { $0.text(0) }
            return (claims, Set(files))
        }
    }

    /// Adds what newly read files claim.
    func addClaims(_ claims: KeyClaims, files: [String], _ zone: ZoneName, _ generation: UInt64) throws(RecordZoneError) {
        try run("writing claims") { () throws(SQLiteError) in
            try transaction { () throws(SQLiteError) in
                for file in files {
                    try db.execute("INSERT OR IGNORE INTO claim_file(zone, generation, file) VALUES (?, ?, ?)", [zone.rawValue, generation, file])
                }
                for (identity, key, rotated) in claims.pairs {
                    try db.execute("INSERT OR IGNORE INTO claim(zone, generation, identity, key, rotated) VALUES (?, ?, ?, ?, ?)",
                                   [zone.rawValue, generation, identity, key, rotated])
                }
            }
        }
    }

    // MARK: Files

    func wasVerified(_ path: String, hash: Data) -> Bool {
        ((try? db.first("SELECT hash FROM verified_file WHERE path = ?", [path]) { $0.blob(0) }) ?? nil) == hash
    }

    /// Records that a file's signatures all verified (a write that fails only costs a check).
    func markVerified(_ path: String, hash: Data) {
        try? db.execute("INSERT OR REPLACE INTO verified_file(path, hash) VALUES (?, ?)", [path, hash])
    }

    /// The stamp an own segment file had when it was last found whole.
    func ownFileStamp(_ path: String) -> String? {
        (try? db.first("SELECT stamp FROM own_file WHERE path = ?", [path]) { $0.text(0) }) ?? nil
    }

    func setOwnFileStamp(_ path: String, _ stamp: String?) {
        if let stamp {
            try? db.execute("INSERT OR REPLACE INTO own_file(path, stamp) VALUES (?, ?)", [path, stamp])
        } else {
            try? db.execute("DELETE FROM own_file WHERE path = ?", [path])
        }
    }
}
