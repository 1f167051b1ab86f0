import CSQLite
import CSodium
import ConversationKit
import Foundation
import RecordZone
import ZoneServer

/// What a person waits for on a new device: the first sync of a long history, from nothing to
/// every message readable. Bob says `history` messages, sealed, in 50 pair conversations and
/// 5 groups; a new store with his key (``ConversationStore/rebuild(directory:identifier:backend:configuration:)``,
/// the store a lost device's owner starts again from) then syncs everything. Beside it, raw
/// libsodium and SQLite doing the same work for the same records: verify each signature (all
/// cores), open a sealed content, insert the bytes 200 to a transaction.
@MainActor func firstSyncBench(_ reporter: Reporter, seconds: Double, history: Int) async throws {
    reporter.header("First sync of a new device (\(history) sealed messages, 50 pairs and 5 groups)")
    let root = FileManager.default.temporaryDirectory.path + "/convkit-first-sync-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }

    let storage = try SQLiteZoneStorage(directory: root + "/server", policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
    let (server, url, _) = try startBenchServer(storage, access: ChatZoneAccess())
    let overServer = try await firstSync(root: root + "/server-stores", history: history, backend: { _ in .server(url) }, holding: { storage })
    await server.stop()
    try reporter.report(overServer.row(name: "first sync over HTTP (zone server)", seconds: seconds))

    let folder = root + "/folder"
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    let overFolder = try await firstSync(root: root + "/folder-stores", history: history, backend: { .folder(folder, device: $0) },
                                         holding: { try FileSystemBackend(root: folder, device: nil, policy: ConversationStore.recordPolicy()) })
    try reporter.report(overFolder.row(name: "first sync from a folder", seconds: seconds))
}

/// One first sync and the records it read.
private struct FirstSync {
    let elapsed: Double
    let records: [[UInt8]]

    /// Our rate (records a second) beside raw verify + open + insert of the same records.
    func row(name: String, seconds: Double) throws -> Row {
        let key = SigningKey.generate(), sample = Data(repeating: 7, count: 240)
        let publicKey = Array(key.publicKey), message = Array(sample), signature = Array(key.sign(sample))
        let verify = parallelRate(seconds: seconds) {
            precondition(crypto_sign_verify_detached(signature, message, UInt64(message.count), publicKey) == 0)
        }
        let aeadKey = Sodium.randomBytes(Sodium.aeadKeyLength), nonce = Sodium.randomBytes(Sodium.aeadNonceLength)
        let sealed = Sodium.aeadEncrypt(Sodium.pad(Data(repeating: 65, count: 80), block: 256), additionalData: Data(repeating: 1, count: 120), nonce: nonce, key: aeadKey)
        let open = rate(seconds: seconds) { _ = Sodium.aeadDecrypt(sealed, additionalData: Data(repeating: 1, count: 120), nonce: nonce, key: aeadKey) }
        let path = FileManager.default.temporaryDirectory.path + "/convkit-first-sync-raw-\(UUID().uuidString.prefix(8)).sqlite"
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let inserts = try RawSQLite(path: path).insertRate(records, table: "pulled")
        return Row(name: name + ", \(records.count) records", perSecond: Double(records.count) / elapsed,
                   rawName: "verify (all cores) + aead + insert 200/txn", rawPerSecond: 1 / (1 / verify + 1 / open + 1 / inserts))
    }
}

/// Bob's history through one backend, then his new device's first sync of it, timed.
@MainActor private func firstSync(root: String, history: Int, backend: (String) -> BackendFactory,
                                  holding: () throws -> any RecordZoneBackend) async throws -> FirstSync {
    let bob = try ConversationStore(directory: root + "/bob", backend: backend("bob"))
    try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
    try await bob.sync()
    var others = [String]()
    for index in 0..<50 {
        let other = "p\(index)"
        let store = try ConversationStore(directory: root + "/" + other, backend: backend(other))
        try await store.setupLocalSpeaker(identifier: other, name: "Person \(index)")
        try await store.sync()
        store.close()
        guard try await bob.speakerExists(other) else { throw RawError("\(other) was not found") }
        others.append(other)
    }
    var made = [String]()
    for index in 0..<5 { made.append(try await bob.createGroup(name: "Group \(index)", members: Array(others[(index * 10)..<(index * 10 + 10)])).id) }
    let groups = made
    // 20 callers at once (the sends share commits); a push every 5,000.
    let content = "Hello there! This is a message about as long as a chat line usually is."
    var sent = 0
    while sent < history {
        let chunk = min(5_000, history - sent), base = sent
        try await withThrowingTaskGroup(of: Void.self) { group in
            for caller in 0..<20 {
                group.addTask {
                    for index in stride(from: base + caller, to: base + chunk, by: 20) {
                        let conversation = index % 55
                        if conversation < 50 {
                            _ = try await bob.send(content, to: "p\(conversation)")
                        } else {
                            _ = try await bob.send(content, toGroup: groups[conversation - 50])
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        sent += chunk
        try await bob.sync()
    }
    bob.close()

    // The records the backend holds, as a first sync reads them.
    let records = try await encodedRecords(of: try holding())

    // Bob's new device: his key, nothing else.
    let newDevice = root + "/bob-new"
    try FileManager.default.createDirectory(atPath: newDevice, withIntermediateDirectories: true)
    try FileManager.default.copyItem(atPath: root + "/bob/speaker.key", toPath: newDevice + "/speaker.key")
    let start = ContinuousClock.now
    let store = try await ConversationStore.rebuild(directory: newDevice, identifier: "bob", backend: backend("bob-new"))
    let elapsed = secondsIn(ContinuousClock.now - start)
    // Every message there, and readable.
    var readable = 0
    for conversation in try store.conversations(includeArchived: true) {
        var cursor: MessageCursor? = nil
        repeat {
            let page = try store.messages(in: conversation.id, limit: 1000, before: cursor)
            readable += page.messages.filter { !$0.isWaitingForKey && $0.content == content }.count
            cursor = page.olderCursor
        } while cursor != nil
    }
    store.close()
    guard readable == history else { throw RawError("the new device reads \(readable) of \(history) messages") }
    return FirstSync(elapsed: elapsed, records: records)
}
