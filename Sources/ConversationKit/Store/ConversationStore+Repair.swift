import Foundation
import RecordZone
import SQLiteKit

/// Checking a store, and rebuilding a damaged one from its backend.
extension ConversationStore {
    /// What ``check()`` found: nothing (`problems` empty) or each problem in words.
    public struct Health: Sendable, Hashable {
        public var problems: [String]
        public var isHealthy: Bool { problems.isEmpty }
    }

    /// Checks the store: SQLite's `quick_check` of the database, the local speaker and its key
    /// file. (A store whose database is missing, empty or without its schema does not open at
    /// all: ``ConversationError/Code/databaseCorrupt``.)
    public func check() throws(ConversationError) -> Health {
        var problems = try read { db in
            try db.rows("PRAGMA quick_check") { $0.text(0) }.filter { $0 != "ok" }.map { "database: \($0)" }
        }
        if let local = database.identity.withLock({ $0 }) {
            let pinned = policy.pins.chain(for: local.identifier)
            if pinned?.allowsNow(local.key.publicKey) != true {
                problems.append("the key file does not speak for '\(local.identifier)' in the store's pins")
            }
        } else if FileManager.default.fileExists(atPath: keyFile) || FileManager.default.fileExists(atPath: deviceKeyFile) {
            problems.append("a key file is here but the database has no local speaker: the database was replaced")
        }
        return Health(problems: problems)
    }

    /// Rebuilds a damaged store of a first device from its backend, with its key: the damaged
    /// database (and its WAL) is moved aside as `store.sqlite.damaged-<time>` (never deleted),
    /// a new one is made, the local speaker `identifier` is restored with the key in
    /// `speaker.key` (no new profile is published), and a whole sync brings back everything
    /// the backend holds: profiles, conversations, messages, receipts. What the damaged store
    /// had not pushed yet is not recovered. A linked device's store is rebuilt by linking it
    /// again (its certificate was in the database).
    /// - Returns: the rebuilt store, synced.
    /// - Throws: ``ConversationError/Code/notIdentityDevice`` without `speaker.key`; a backend error
    ///   when the sync fails (the new store is kept: sync it again).
    public static func rebuild(directory: String, identifier: String, backend: BackendFactory,
                               configuration: StoreConfiguration = StoreConfiguration()) async throws(ConversationError) -> ConversationStore {
        try ChatRecords.validate(identifier: identifier)
        let manager = FileManager.default
        guard manager.fileExists(atPath: directory + "/speaker.key") else {
            throw ConversationError(.notIdentityDevice, "no speaker.key in \(directory): a linked device's store is rebuilt by linking it again")
        }
        let key: SigningKey
        do { key = try KeyFile.load(from: directory + "/speaker.key") } catch {
            throw ConversationError(.storeNotWritable, "cannot read the speaker key: \(error.message)", backendError: error)
        }
        let stamp = Int64(Date().timeIntervalSince1970)
        for suffix in ["", "-wal", "-shm"] where manager.fileExists(atPath: directory + "/store.sqlite" + suffix) {
            do {
                try manager.moveItem(atPath: directory + "/store.sqlite" + suffix, toPath: directory + "/store.sqlite.damaged-\(stamp)" + suffix)
            } catch {
                throw ConversationError(.storeNotWritable, "cannot move the damaged database aside: \(error.localizedDescription)")
            }
        }
        let store = try ConversationStore(directory: directory, backend: backend, configuration: configuration, readOnly: false, rebuilding: true)
        try await store.adoptIdentity(identifier, key: key)
        return store
    }
}
