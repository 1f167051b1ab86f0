@_exported import ChatSchema
import Foundation
import RecordZone
import SQLiteKit
import Synchronization

/// The embedded chat store: speakers, conversations and messages in a local SQLite cache,
/// usable with no network at all, synced through a record-zone backend.
///
/// ```swift
/// let store = try ConversationStore(directory: "/var/lib/app/alice", backend: .folder("/mnt/shared/chat", device: "alice-laptop"))
/// try await store.setupLocalSpeaker(identifier: "alice", name: "Alice", tags: ["swift"])
/// let message = try await store.send("Hi Bob!", to: "bob")   // committed locally, offline
/// try await store.sync()                                     // push the outbox, pull changes
/// ```
///
/// Every write commits the change and its outbox entry in one SQLite transaction. A store
/// belongs to one local speaker: opening it as another speaker is refused (open that speaker's
/// own directory instead), so nobody's unsent messages are ever dropped by switching identity.
public final class ConversationStore: Sendable {
    public let directory: String
    let database: StoreDatabase
    let backendFactory: BackendFactory
    private let connectedBackend = Mutex<(any RecordZoneBackend)?>(nil)
    /// Whether the backend answered the last sync (nil: none yet).
    let reachability = Mutex<Bool?>(nil)
    /// When "typing" was last said per conversation (absent: not typing), ``setTyping(_:in:)``.
    let typingSaid = Mutex<[String: ContinuousClock.Instant]>([:])
    /// Typing and presence carried by the continuous sync's stream.
    let liveWatches = LiveWatches()
    let configuration: StoreConfiguration
    let clock: HybridLogicalClock
    let engine: SyncEngine
    var policy: RecordPolicy { database.policy }

    struct LocalIdentity: Sendable {
        var identifier: String
        /// What this device signs records and requests with.
        var key: SigningKey
        /// The identity key: on the first device only (it signs links and revocations).
        var identityKey: SigningKey?
        /// On a linked device, its certificate's canonical bytes.
        var certificate: Data?
        /// What this device opens key shares with (``EncryptionKey/boxKeys(forDeviceSeed:)``).
        let boxKeys: (publicKey: Data, secretKey: Data)

        init(identifier: String, key: SigningKey, identityKey: SigningKey? = nil, certificate: Data? = nil) {
            self.identifier = identifier
            self.key = key
            self.identityKey = identityKey
            self.certificate = certificate
            boxKeys = EncryptionKey.boxKeys(forDeviceSeed: key.seed)
        }
    }

    /// The identity key, on the speaker's first device.
    var keyFile: String { directory + "/speaker.key" }
    /// The device key, on a linked device.
    var deviceKeyFile: String { directory + "/device.key" }
    /// The backend's local state (``BackendContext/stateDirectory``).
    var backendStateDirectory: String { directory + "/backend" }

    /// Opens (creating if needed) the store in `directory`.
    /// - Throws: ``ConversationError`` — ``ConversationError/Code/storeNotWritable`` when the
    ///   directory cannot be created or written, ``ConversationError/Code/databaseCorrupt``
    ///   when the database file is damaged. The backend is connected on first use.
    public convenience init(directory: String, backend: BackendFactory, configuration: StoreConfiguration = StoreConfiguration()) throws(ConversationError) {
        try self.init(directory: directory, backend: backend, configuration: configuration, readOnly: false)
    }

    /// Opens an existing store to look at it (`convkit`'s inspection): nothing is created,
    /// migrated or written — every change fails with
    /// ``ConversationError/Code/storeNotWritable`` — and there is no backend (a sync fails).
    /// - Throws: ``ConversationError/Code/storeNotWritable`` when there is no store there,
    ///   ``ConversationError/Code/storeVersionMismatch`` when it needs a migration first (or was
    ///   written by a later version).
    public static func inspecting(directory: String) throws(ConversationError) -> ConversationStore {
        guard FileManager.default.fileExists(atPath: directory + "/store.sqlite") else {
            throw ConversationError(.storeNotWritable, "no store at \(directory)")
        }
        let none = BackendFactory.custom { _ throws(RecordZoneError) in
            throw RecordZoneError(.notAuthorized, "the store was opened for inspection, without a backend")
        }
        return try ConversationStore(directory: directory, backend: none, configuration: StoreConfiguration(), readOnly: true)
    }

    init(directory: String, backend: BackendFactory, configuration: StoreConfiguration, readOnly: Bool, rebuilding: Bool = false) throws(ConversationError) {
        self.directory = directory
        self.configuration = configuration
        let now = configuration.now
        clock = configuration.clock ?? HybridLogicalClock(wallMilliseconds: { UInt64(max(0, now().timeIntervalSince1970 * 1000)) })
        if !readOnly {
            // Private to its user: created 0700, its database 0600 (SQLite gives the WAL and
            // shared-memory files the database's mode; the key file is 0600 already).
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            } catch {
                throw ConversationError(.storeNotWritable, "cannot create the store directory \(directory): \(error.localizedDescription)")
            }
            guard FileManager.default.isWritableFile(atPath: directory) else {
                throw ConversationError(.storeNotWritable, "the store directory \(directory) is not writable")
            }
            if !rebuilding { try Self.checkDatabaseIsWhole(in: directory) }
            let descriptor = Glibc.open(directory + "/store.sqlite", O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
            if descriptor >= 0 { Glibc.close(descriptor) }
        } else {
            try Self.checkDatabaseIsWhole(in: directory)
        }
        let queue: DatabaseQueue
        let policy: RecordPolicy
        var loaded: LocalIdentity?
        do {
            // The log synced after each group's commit, not in it: the readers that see a write
            // before it is on disk are this store's own (StoreDatabase.write).
            queue = try DatabaseQueue(path: directory + "/store.sqlite", migrations: StoreSchema.migrations, readOnly: readOnly, syncsAfterCommit: true)
            let (pinned, conflicted) = try queue.readNow { db in
                (try PinTable.load(from: db),
                 try db.rows("SELECT DISTINCT identity FROM ck_quarantine WHERE code = 'identityConflict' AND identity IS NOT NULL") { $0.text(0) })
            }
            policy = ChatRecords.policy(pinnedKeys: pinned)
            policy.pins.markConflicted(conflicted)
            let (local, certificate) = try queue.readNow { db in
                (try db.first("SELECT value FROM ck_meta WHERE key = 'local_speaker'") { $0.text(0) },
                 try db.first("SELECT value FROM ck_meta WHERE key = 'device_certificate'") { $0.blob(0) })
            }
            if let local {
                if let certificate {
                    loaded = LocalIdentity(identifier: local, key: try KeyFile.load(from: directory + "/device.key"), certificate: certificate)
                } else {
                    let key = try KeyFile.load(from: directory + "/speaker.key")
                    loaded = LocalIdentity(identifier: local, key: key, identityKey: key)
                }
            }
        } catch {
            throw ConversationError.wrap(error)
        }
        database = StoreDatabase(queue: queue, policy: policy, hub: EventHub(), clock: clock)
        database.identity.withLock { $0 = loaded }
        backendFactory = backend
        engine = SyncEngine(database: database, configuration: configuration, images: AssetFolder(root: directory + "/Images"), files: directory + "/Files", clock: clock)
    }

    deinit { database.hub.finish() }

    /// A store whose key is here but whose database is gone, empty or without its schema was
    /// damaged (truncated, replaced, half copied): it is reported, never migrated afresh behind
    /// the user's back (which would lose its unsent messages and its pins for good).
    static func checkDatabaseIsWhole(in directory: String) throws(ConversationError) {
        let manager = FileManager.default
        guard manager.fileExists(atPath: directory + "/speaker.key") || manager.fileExists(atPath: directory + "/device.key") else { return }
        let path = directory + "/store.sqlite"
        let damaged = { (why: String) in
            ConversationError(.databaseCorrupt, "the store's database \(path) \(why), but the store's key is there: it was damaged or replaced. "
                              + "Nothing was changed; 'convkit doctor --rebuild' (ConversationStore.rebuild) rebuilds it from the backend")
        }
        let size = (try? manager.attributesOfItem(atPath: path)[.size] as? Int) ?? nil
        guard let size else { throw damaged("is missing") }
        guard size > 0 else { throw damaged("is empty") }
        do {
            let db = try Database(path: path, readOnly: true)
            let version = try db.first("PRAGMA user_version") { $0.int(0) } ?? 0
            guard version > 0 else { throw damaged("has no schema") }
        } catch let error as ConversationError {
            throw error
        } catch let error as SQLiteError {
            throw error.isAccessProblem && !error.isCorruption ? ConversationError.wrap(error) : damaged("cannot be read (\(error.message))")
        } catch {
            throw ConversationError.wrap(error)
        }
    }

    /// Opens the store of one speaker under `root`: `<root>/<first 8 bytes of SHA-256 of the
    /// identifier, hex>`. Each speaker has a store of their own; switching identity is opening
    /// another one, and nobody's unsent messages are touched. Set the speaker up with
    /// ``setupLocalSpeaker(identifier:name:tags:)`` on first use.
    public static func open(speaker identifier: String, in root: String, backend: BackendFactory,
                            configuration: StoreConfiguration = StoreConfiguration()) throws(ConversationError) -> ConversationStore {
        try ChatRecords.validate(identifier: identifier)
        let store = try ConversationStore(directory: root + "/" + ChatRecords.identityHash(identifier), backend: backend, configuration: configuration)
        if let owner = store.localSpeakerIdentifier, owner != identifier {
            throw ConversationError(.storeBelongsToAnotherSpeaker, "the store for '\(identifier)' belongs to '\(owner)'")
        }
        return store
    }

    /// ``ChatSchema/readingOrder(_:)``.
    public static func readingOrder(_ zones: [ZoneName]) -> [ZoneName] { ChatSchema.readingOrder(zones) }

    /// ``ChatSchema/isSpeakerZone(_:)``.
    public static func isSpeakerZone(_ zone: ZoneName) -> Bool { ChatSchema.isSpeakerZone(zone) }

    /// ``ChatSchema/ownershipRules``.
    public static var ownershipRules: [OwnershipRule] { ChatSchema.ownershipRules }

    /// ``ChatSchema/queryIndexes``.
    public static var queryIndexes: [String: Set<String>] { ChatSchema.queryIndexes }

    /// ``ChatSchema/recordPolicy()``.
    public static func recordPolicy() -> RecordPolicy { ChatSchema.recordPolicy() }

    /// The local speaker's identifier, once set up.
    public var localSpeakerIdentifier: String? { database.identity.withLock { $0?.identifier } }

    /// The public key this device signs with, once set up: the identity key on the speaker's
    /// first device, the device key on a linked one.
    public var localPublicKey: Data? { database.identity.withLock { $0?.key.publicKey } }

    /// Every event from now on: new and changed messages, speakers, conversations, sync states.
    public func events() -> AsyncStream<StoreEvent> { database.hub.stream() }

    func write<T: Sendable>(_ body: @escaping @Sendable (inout RecordApplier) throws -> T) async throws(ConversationError) -> T {
        try await database.write(.synced, body)
    }

    @available(*, noasync, message: "await the read: it answers through a continuation")
    func read<T: Sendable>(_ body: (Database) throws -> T) throws(ConversationError) -> T {
        try database.read(body)
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws(ConversationError) -> T {
        try await database.read(body)
    }

    /// The local speaker and key, or ``ConversationError/Code/noLocalSpeaker``.
    func requireIdentity() throws(ConversationError) -> LocalIdentity {
        guard let local = database.identity.withLock({ $0 }) else {
            throw ConversationError(.noLocalSpeaker, "call setupLocalSpeaker(identifier:name:tags:) first")
        }
        return local
    }

    /// Signs a local version, applies it and queues it in the outbox, in the caller's transaction.
    /// A new version always wins over the one it replaces: it is signed past the version held,
    /// even one from a clock hours ahead (a rename after a fast tablet's profile).
    func commitLocal(_ record: Record, as local: LocalIdentity, in applier: inout RecordApplier) throws {
        try commitLocal([record], as: local, in: &applier)
    }

    /// Versions of one thing (a profile's two copies: its zone and the directory), signed with
    /// one clock past every version held of any of them and past `after` (the clock the shown
    /// profile came from): together they win over whatever they replace.
    func commitLocal(_ records: [Record], as local: LocalIdentity, after: RecordClock? = nil, in applier: inout RecordApplier) throws {
        try applier.commitLocal(records, signedWith: local.key, after: after)
    }

    /// States again the local speaker's versions that a refused one would replace where a
    /// backend keeps one version per record (a zone server): when a version of one of its records
    /// signed by its own revoked device or retired key (saved before the revocation or rotation
    /// reached the backend) is quarantined, and it would have beaten the valid version this store
    /// holds, the held version is signed again by this device (same fields, a clock past it) and
    /// pushed. The server lets no version its pins no longer allow win a merge, so every reader —
    /// one that held the old version, one that read the refused one first, one that reads from
    /// scratch — ends with it. Each quarantined version is answered once (`restated`).
    /// - Returns: how many records were stated again.
    func restateShadowed(as local: LocalIdentity) async throws(ConversationError) -> Int {
        guard let chain = policy.pins.chain(for: local.identifier), chain.allowsNow(local.key.publicKey) else { return 0 }
        let unanswered = "q.identity = ? AND q.code IN ('deviceRevoked', 'keyConflict') AND q.restated = 0 AND q.record IS NOT NULL"
        // A look on the reader connection first: a sync with nothing to answer writes nothing.
        guard try await read({ db in try db.first("SELECT 1 FROM ck_quarantine q WHERE \(unanswered) LIMIT 1", [local.identifier]) { _ in true } }) != nil else {
            return 0
        }
        return try await write { applier in
            let rows = try applier.db.rows("""
                SELECT q.id, q.record, r.record FROM ck_quarantine q LEFT JOIN ck_records r ON r.zone = q.zone AND r.name = q.name
                WHERE \(unanswered) ORDER BY q.id
                """, [local.identifier]) { ($0.int(0), $0.blob(1), $0.optionalBlob(2)) }
            var restated = Set<RecordID>()
            for (id, refusedBytes, heldBytes) in rows {
                try applier.db.execute("UPDATE ck_quarantine SET restated = 1 WHERE id = ?", [id])
                // Only a key of the local speaker's own chain (not a stranger's forgery), and
                // only where the refused version would have replaced one held.
                guard let heldBytes, let refused = try? Record(canonical: refusedBytes), let held = try? Record(canonical: heldBytes),
                      chain.device(refused.authorKey) != nil || chain.retired.contains(where: { $0.key == refused.authorKey }),
                      MergeRule.wins(refused, over: held), restated.insert(held.id).inserted
                else { continue }
                // Sealed content is bound to the device that signs it: sealed again by this one.
                var restatement = held
                if held[Sealing.sealedField] != nil {
                    guard case .opened(let opened) = try applier.unseal(held) else { continue }
                    restatement = try applier.seal(opened)
                }
                try self.commitLocal(restatement, as: local, in: &applier)
            }
            return restated.count
        }
    }

    /// Applies an already signed local version and queues it in the outbox.
    func applyLocal(_ record: Record, in applier: inout RecordApplier) throws {
        try applier.applyLocal(record)
    }

    /// The backend, connected on first use with the local speaker's identity and key.
    /// - Throws: ``ConversationError/Code/noLocalSpeaker``; ``ConversationError/Code/backend``
    ///   when it cannot be opened (a folder locked by another process, say).
    func backend() throws(ConversationError) -> any RecordZoneBackend {
        let local = try requireIdentity()
        return try connectedBackend.withLock { (connected: inout (any RecordZoneBackend)?) throws(ConversationError) -> any RecordZoneBackend in
            if let connected { return connected }
            let made: any RecordZoneBackend
            do throws(RecordZoneError) {
                made = try backendFactory.make(BackendContext(policy: policy, identity: local.identifier, key: local.key, deviceCertificate: local.certificate, stateDirectory: backendStateDirectory))
            } catch {
                throw ConversationError.backend(error, "cannot open the backend")
            }
            connected = made
            return made
        }
    }

    // MARK: Sync

    /// Pushes the outbox and pulls every changed zone the local speaker takes part in.
    /// - Throws: ``ConversationError`` with ``ConversationError/Code/backend`` when the backend
    ///   cannot be reached; whatever was pushed or pulled before that stays committed.
    @discardableResult
    public func sync() async throws(ConversationError) -> SyncReport {
        try await sync(progress: nil)
    }

    /// ``sync()``, telling `progress` of each zone it pulls (a progress bar for a long first sync).
    @discardableResult
    public func sync(progress: (@Sendable (SyncProgress) -> Void)?) async throws(ConversationError) -> SyncReport {
        let local = try requireIdentity()
        let backend = try backend()
        try await publishEncryptionKeyIfNeeded(local)
        var report: SyncReport
        do {
            report = try await engine.sync(localSpeaker: local.identifier, deviceKey: local.key.publicKey, backend: backend, progress: progress)
        } catch {
            if error.backendError?.isTransient == true { reachability.withLock { $0 = false } }
            throw error
        }
        reachability.withLock { $0 = true }
        let settled = try await settleResolvedConflicts()
        if try await restateShadowed(as: local) > 0 || settled > 0 {
            let pushed = try await engine.pushOnly(localSpeaker: local.identifier, backend: backend)
            report.pushed += pushed.pushed
            report.failed += pushed.failed
            report.deferred += pushed.deferred
        }
        if configuration.avatarDownload == .duringSync {
            report.avatarsDownloaded = await downloadMissingAvatars(from: backend)
        }
        try await removeDiscardedFiles()
        report.filesDownloaded = await downloadFilesDuringSync()
        return report
    }

    /// A store set up before encryption publishes its device's key once, before it syncs.
    private func publishEncryptionKeyIfNeeded(_ local: LocalIdentity) async throws(ConversationError) {
        let held = try await read { db in
            try db.first("SELECT 1 FROM encryption_keys WHERE identity = ? AND device = ? AND key = ?",
                         [local.identifier, local.key.publicKey, local.boxKeys.publicKey]) { _ in true } ?? false
        }
        guard !held else { return }
        try await write { applier in try applier.publishEncryptionKey() }
    }

    /// Whether the backend answered the last time the store synced (ConversationKit's
    /// `cloudAvailable`); nil before the first sync. ``StoreEvent/syncActivity(_:)`` reports
    /// each change while ``run(pollInterval:longPolls:)`` runs.
    public var isBackendReachable: Bool? { reachability.withLock { $0 } }

    /// Lets go of the backend — a folder device's lock, a server's connections — and ends every
    /// ``events()`` stream. The store stays usable: a later sync connects again.
    public func close() {
        connectedBackend.withLock { $0 = nil }
        database.hub.finish()
    }

    /// How many local changes wait in the outbox.
    public func pendingChangeCount() throws(ConversationError) -> Int {
        try read { db in try Outbox.count(in: db) }
    }

    /// ``pendingChangeCount()``, read without blocking the caller's thread.
    func loadPendingChangeCount() async throws(ConversationError) -> Int {
        try await read { db in try Outbox.count(in: db) }
    }

    /// Records refused on the way in, with their reasons: never applied, never shown.
    public func quarantine() throws(ConversationError) -> [QuarantinedRecord] {
        try read { db in
            try db.rows("SELECT zone, name, reason, source, received_at, id, code FROM ck_quarantine ORDER BY id") { row in
                QuarantinedRecord(id: row.int(5), zone: row.optionalText(0), name: row.optionalText(1),
                                  code: row.optionalText(6).flatMap(RejectionReason.Code.init(rawValue:)), reason: row.text(2), source: row.text(3),
                                  receivedAt: Date(timeIntervalSince1970: Double(row.int(4)) / 1000))
            }
        }
    }

    /// Drops everything that can be fetched again — synced records, tokens, the quarantine, the
    /// image cache — and keeps the local speaker, its key, its avatar, pinned keys and every
    /// unsent change. The next
    /// ``sync()`` fetches everything again.
    public func clearAllCachedData() async throws(ConversationError) {
        let local = try requireIdentity()
        let files = imageFiles
        try await write { applier in
            try CacheReset.drop(zone: nil, keeping: local.identifier, in: applier.db)
            for hash in try ImageCacheIndex.clear(in: applier.db) { files.remove(hash) }
        }
    }
}

/// Drops cached data that can be fetched again, for one zone or for all, table by table as
/// ``ZoneTables/reset`` says.
enum CacheReset {
    /// Keeps every unsent change (outbox rows and their records), the local speaker's profile
    /// and its member records; forgets the zone's token so the next pull starts from scratch.
    static func drop(zone: String?, keeping local: String, in db: Database) throws {
        let filter = zone == nil ? "1" : "zone = ?"
        let values: [any DatabaseValueConvertible] = zone.map { [$0] } ?? []
        for (table, rule) in ZoneTables.reset {
            switch rule {
            case .kept: continue
            case .deleted(let keeping):
                let locals: [any DatabaseValueConvertible] = Array(repeating: local, count: keeping?.filter { $0 == "?" }.count ?? 0)
                try db.execute("DELETE FROM \(table) WHERE \(filter)" + (keeping.map { " AND NOT (\($0))" } ?? ""), values + locals)
            case .own:
                switch table {
                case "ck_records":
                    try db.execute("""
                        DELETE FROM ck_records WHERE \(filter)
                            AND NOT \(Outbox.isQueued("ck_records"))
                            AND NOT (zone = ? AND name = ?) AND zone != ?
                        """, values + [ChatRecords.speakersZone.rawValue, local, ChatRecords.speakerZone(local).rawValue])
                case "ck_zone_state": try db.execute("UPDATE ck_zone_state SET token = NULL WHERE \(filter)", values)
                case "ck_quarantine": if zone == nil { try db.execute("DELETE FROM ck_quarantine") }
                case "held_messages": try RecordApplier.recountHeld(where: filter, values, in: db)
                default: throw ConversationError(.database, "no cache reset rule of its own for \(table)")
                }
            }
        }
        if zone == nil {
            try db.execute("DELETE FROM speaker_tags WHERE identifier != ?", [local])
            try db.execute("DELETE FROM speakers WHERE identifier != ?", [local])
            try db.execute("DELETE FROM ck_meta WHERE key = 'database_token'")
        }
    }
}

/// A record the store refused, as ``ConversationStore/quarantine()`` lists it.
public struct QuarantinedRecord: Sendable, Hashable {
    /// The entry's number (``ConversationStore/clearQuarantine(id:)``).
    public let id: Int64
    public let zone: String?
    public let name: String?
    /// Why, as a code to decide on (nil for entries from before codes were kept).
    public let code: RejectionReason.Code?
    /// Why, for people.
    public let reason: String
    public let source: String
    public let receivedAt: Date
}
