import CSQLite
import CSodium
import ConversationKit
import Foundation
import RecordZone
import ZoneServer

/// The chat store: messages sent, records pulled, and the newest page of one conversation among
/// many messages, each beside raw SQLite (and libsodium) doing the same work in the same run.
@MainActor func storeBench(_ reporter: Reporter, seconds: Double, messageCount: Int) async throws {
    reporter.header("Chat store (SQLite WAL, every local change synced before it returns)")
    let root = FileManager.default.temporaryDirectory.path + "/convkit-store-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    let server = InMemoryBackend(policy: ConversationStore.recordPolicy())
    let content = "Hello there! This is a message about as long as a chat line usually is."
    let rareContent = "Hello there! A zebra crossed the road, in a message as long as a chat line usually is."

    // 1. Sends, each its own durable transaction (sealed for alice's device and bob's), against
    // one-row raw transactions plus a raw seal and sign.
    let (alice, bob) = try await senderPair(root: root, server: server)
    let sends = try await rateAsync(seconds: seconds, batch: 1) {
        try await bob.send(content, to: "alice")
        return true
    }
    let raw = try RawSQLite(path: root + "/raw.sqlite")
    try raw.exec("CREATE TABLE t (zone TEXT NOT NULL, name TEXT NOT NULL, content TEXT NOT NULL, PRIMARY KEY (zone, name)) STRICT")
    let insert = try raw.prepare("INSERT INTO t (zone, name, content) VALUES (?, ?, ?)")
    defer { sqlite3_finalize(insert) }
    var rawIndex = 0
    func rawTransaction() throws {
        try raw.exec("BEGIN IMMEDIATE")
        raw.bind(insert, 1, "zone")
        raw.bind(insert, 2, "m\(rawIndex)")
        raw.bind(insert, 3, content)
        rawIndex += 1
        try raw.run(insert)
        try raw.exec("COMMIT")
    }
    let rawTransactions = try rate(seconds: seconds) { try rawTransaction() }
    // Pages written per send: the frames 60 sends add to an emptied write-ahead log (under
    // SQLite's automatic checkpoint at 1,000 frames, which would start the log again, while a
    // send writes fewer than 16), by table, beside the raw one-row transaction's.
    let bobFile = try RawSQLite(path: root + "/bob/store.sqlite")
    _ = try bobFile.walFrames(truncate: true)
    for _ in 0..<60 { _ = try await bob.send(content, to: "alice") }
    let byTable = try bobFile.walPagesByTable(path: root + "/bob/store.sqlite")
    let sendPages = Double(try bobFile.walFrames()) / 60
    _ = try raw.walFrames(truncate: true)
    for _ in 0..<20 { try rawTransaction() }
    let rawPages = Double(try raw.walFrames()) / 20
    let key = SigningKey.generate()
    let sample = Data(repeating: 7, count: 240)
    let rawSign = rate(seconds: seconds) { _ = key.sign(sample) }
    // The content padded to 256 bytes, sealed with a 24-byte nonce and a context, and opened.
    let aeadKey = Sodium.randomBytes(Sodium.aeadKeyLength), aeadNonce = Sodium.randomBytes(Sodium.aeadNonceLength)
    let padded = Sodium.pad(Data(content.utf8), block: 256), context = Data(repeating: 1, count: 120)
    let sealedSample = Sodium.aeadEncrypt(padded, additionalData: context, nonce: aeadNonce, key: aeadKey)
    let rawSeal = rate(seconds: seconds) { _ = Sodium.aeadEncrypt(padded, additionalData: context, nonce: aeadNonce, key: aeadKey) }
    let rawOpen = rate(seconds: seconds) { _ = Sodium.aeadDecrypt(sealedSample, additionalData: context, nonce: aeadNonce, key: aeadKey) }
    reporter.report(Row(name: "send (durable transaction each, sealed)", perSecond: sends,
                        rawName: "1-row txn + aead + crypto_sign", rawPerSecond: 1 / (1 / rawTransactions + 1 / rawSeal + 1 / rawSign)))
    reporter.note(String(format: "pages written per send: %.1f (WAL frames over 60 sends); the raw one-row transaction: %.1f", sendPages, rawPages))
    reporter.note("  by table: " + byTable.prefix(8).map { "\($0.table) " + String(format: "%.1f", Double($0.pages) / 60) }.joined(separator: ", "))

    // 2. Pull: bob's messages into alice's store (verified, opened, applied), against raw verify +
    // decrypt + batched inserts.
    try await bob.sync()
    let pullStart = ContinuousClock.now
    let report = try await alice.sync()
    let pullRate = Double(report.pulled) / secondsIn(ContinuousClock.now - pullStart)
    let encoded = try await encodedRecords(of: server)
    let publicKey = Array(key.publicKey), message = Array(sample), signature = Array(key.sign(sample))
    let verifyAll = parallelRate(seconds: seconds) {
        precondition(crypto_sign_verify_detached(signature, message, UInt64(message.count), publicKey) == 0)
    }
    let rawInsertRate = try raw.insertRate(encoded, table: "pulled")
    reporter.report(Row(name: "pull \(report.pulled) (verify + open + apply)", perSecond: pullRate,
                        rawName: "verify (all cores) + aead + insert", rawPerSecond: 1 / (1 / verifyAll + 1 / rawOpen + 1 / rawInsertRate)))

    // 2a. 20 callers sending at once into one store (an app's several conversations, a bot): group
    // commit shares each durable commit among the sends waiting for it; against one sender.
    // (After the pull, which reads what the sends above wrote, whatever this row adds.)
    let concurrentSends = try await concurrentRate(seconds: seconds, tasks: 20) { _ = try await bob.send(content, to: "alice") }
    reporter.report(Row(name: "20 concurrent senders, one store", perSecond: concurrentSends, rawName: "1 sender (the send row)", rawPerSecond: sends))

    // 2b. The same over HTTP: a new store pulling 10,000 messages from a zone server.
    let pulledOverHTTP = try await httpPullRate(root: root + "/http", count: 10_000)
    reporter.report(Row(name: "pull 10000 over HTTP (store, new)", perSecond: pulledOverHTTP,
                        rawName: "verify (all cores) + insert 200/txn", rawPerSecond: 1 / (1 / verifyAll + 1 / rawInsertRate)))

    // 3. The newest 50 of one conversation among `messageCount` messages.
    let perConversation = 1000
    let conversations = messageCount / perConversation
    let path = root + "/alice/store.sqlite"
    let bulk = try RawSQLite(path: path)
    try bulk.exec("PRAGMA synchronous = OFF; BEGIN")
    let addConversation = try bulk.prepare("INSERT OR IGNORE INTO conversations (zone, other) VALUES (?, ?)")
    let addMessage = try bulk.prepare("""
        INSERT INTO messages (zone, name, speaker, listener, content, spoken_at, sync_state) VALUES (?, ?, ?, 'alice', ?, ?, 0)
        """)
    // One message in a hundredth of them holds a rare word, for the search below (100 of 1,000,000).
    let rareEvery = max(1, conversations * perConversation / 100)
    for c in 0..<conversations {
        let zone = String(format: "c-%016x-%016x", c, c + 1)
        bulk.bind(addConversation, 1, zone)
        bulk.bind(addConversation, 2, "speaker\(c)")
        try bulk.run(addConversation)
        for m in 0..<perConversation {
            bulk.bind(addMessage, 1, zone)
            bulk.bind(addMessage, 2, String(format: "%08d", m))
            bulk.bind(addMessage, 3, "speaker\(c)")
            bulk.bind(addMessage, 4, (c * perConversation + m) % rareEvery == 0 ? rareContent : content)
            sqlite3_bind_int64(addMessage, 5, 1_700_000_000_000 + Int64(m) * 1000)
            try bulk.run(addMessage)
        }
    }
    // The store feeds its search index in batches as it writes (docs/STORE.md); these went in
    // raw, so the batch's statement runs here.
    try bulk.exec("""
        INSERT INTO message_search (rowid, content) SELECT rowid, content FROM messages
            WHERE rowid > (SELECT value FROM ck_meta WHERE key = 'search_indexed') AND is_deleted = 0;
        UPDATE ck_meta SET value = (SELECT max(rowid) FROM messages) WHERE key = 'search_indexed';
        COMMIT
        """)
    sqlite3_finalize(addConversation)
    sqlite3_finalize(addMessage)
    let target = String(format: "c-%016x-%016x", conversations / 2, conversations / 2 + 1)
    let newest = try rate(seconds: seconds) {
        let page = try alice.messages(in: target, limit: 50)
        precondition(page.messages.count == 50)
    }
    let query = try bulk.prepare("""
        SELECT zone, name, speaker, listener, content, spoken_at, edited_at, read_at, sync_state, sync_error
        FROM messages WHERE zone = ? AND is_deleted = 0 ORDER BY spoken_at DESC, name DESC LIMIT 51
        """)
    defer { sqlite3_finalize(query) }
    let rawNewest = try rate(seconds: seconds) {
        bulk.bind(query, 1, target)
        var rows = 0
        var texts = [String]()
        while sqlite3_step(query) == SQLITE_ROW {
            for column in [0, 1, 2, 3, 4] as [Int32] { texts.append(String(cString: sqlite3_column_text(query, column))) }
            _ = sqlite3_column_int64(query, 5)
            rows += 1
        }
        sqlite3_reset(query)
        guard rows == 51 else { throw RawError("expected 51 rows, got \(rows)") }
    }
    reporter.report(Row(name: "newest 50 of 1 among \(conversations * perConversation)", perSecond: newest,
                        rawName: "same SQL, raw sqlite3_step", rawPerSecond: rawNewest))

    // 4. Search: the best 20 of the messages holding a rare word, among all of them (the FTS5
    // index, filled as the messages above went in).
    // The snippets checked once, outside the timing: Foundation's `contains` over 20 of them
    // cost 8 % of a search, a check the raw loop (a count) does not make.
    let checked = try alice.search("zebra", limit: 20)
    guard checked.count == 20, checked.allSatisfy({ $0.snippet.contains("[zebra]") }) else { throw RawError("search: \(checked.map(\.snippet))") }
    let found = try rate(seconds: seconds) {
        let hits = try alice.search("zebra", limit: 20)
        guard hits.count == 20 else { throw RawError("expected 20 hits, got \(hits.count)") }
    }
    let rawSearch = try bulk.prepare("""
        SELECT m.zone, m.name, m.speaker, m.listener, m.content, snippet(message_search, 0, '[', ']', '…', 12), m.spoken_at FROM message_search
            JOIN messages m ON m.rowid = message_search.rowid
        WHERE message_search MATCH '"zebra"' AND m.is_deleted = 0 ORDER BY bm25(message_search), m.spoken_at DESC LIMIT 20
        """)
    defer { sqlite3_finalize(rawSearch) }
    let rawFound = try rate(seconds: seconds) {
        var texts = [String]()
        while sqlite3_step(rawSearch) == SQLITE_ROW {
            for column in [0, 1, 2, 3, 4, 5] as [Int32] { texts.append(String(cString: sqlite3_column_text(rawSearch, column))) }
            _ = sqlite3_column_int64(rawSearch, 6)
        }
        sqlite3_reset(rawSearch)
        guard texts.count == 120 else { throw RawError("expected 20 hits, got \(texts.count / 6)") }
    }
    reporter.report(Row(name: "search a word in \(conversations * perConversation) (best 20)", perSecond: found,
                        rawName: "same FTS5 query, raw sqlite3_step", rawPerSecond: rawFound))
}

/// alice and bob, set up on `server`, bob knowing alice (so his first send reads no directory).
@MainActor private func senderPair(root: String, server: InMemoryBackend) async throws -> (alice: ConversationStore, bob: ConversationStore) {
    let alice = try ConversationStore(directory: root + "/alice", backend: .memory(server))
    try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
    try await alice.sync()
    let bob = try ConversationStore(directory: root + "/bob", backend: .memory(server))
    try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
    guard try await bob.speakerExists("alice") else { throw ConversationError(.unknownSpeaker, "alice was not found") }
    return (alice, bob)
}

/// Group commit alone: one sender, then 20 concurrent senders, into the same fresh store, each
/// for `seconds`, `rounds` times in turn — the store section runs its 20 senders after a pull,
/// in a store four times as big, where this machine's spread hides a change of a fifth.
@MainActor func sendersBench(_ reporter: Reporter, seconds: Double, rounds: Int = 3) async throws {
    reporter.header("Senders into one store (group commit), \(rounds) rounds in turn")
    let root = FileManager.default.temporaryDirectory.path + "/convkit-senders-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    let server = InMemoryBackend(policy: ConversationStore.recordPolicy())
    let content = "Hello there! This is a message about as long as a chat line usually is."
    let (_, bob) = try await senderPair(root: root, server: server)
    for round in 1...rounds {
        let one = try await rateAsync(seconds: seconds, batch: 1) {
            try await bob.send(content, to: "alice")
            return true
        }
        let twenty = try await concurrentRate(seconds: seconds, tasks: 20) { _ = try await bob.send(content, to: "alice") }
        reporter.report(Row(name: "round \(round): 20 concurrent senders", perSecond: twenty, rawName: "1 sender", rawPerSecond: one))
    }
}

/// A zone server holding `count` messages from dave to erin (saved in-process, 400 per
/// transaction); erin's new store syncs over HTTP. - Returns: messages pulled per second.
@MainActor private func httpPullRate(root: String, count: Int) async throws -> Double {
    let storage = try SQLiteZoneStorage(directory: root + "/server", policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
    let (server, url, _) = try startBenchServer(storage, access: ChatZoneAccess())
    let dave = SigningKey.generate()
    let clock = HybridLogicalClock()
    let zone = try chatZone("dave", "erin")
    try await storage.createZone(zone)
    for start in stride(from: 0, to: count, by: Record.maximumBatchSize) {
        let batch = try (start..<min(count, start + Record.maximumBatchSize)).map { index in
            var message = Record(id: try RecordID(zone: zone, name: "m.\(OwnershipRule.identityHash("dave")).\(String(format: "%08d", index))"), type: "Message", fields: [
                "speaker": .string("dave"), "listener": .string("erin"),
                "content": .string("Hello there! This is message \(index), about as long as a chat line usually is."),
                "spokenAt": .date(milliseconds: 1_800_000_000_000 + Int64(index)),
            ])
            try message.sign(with: dave, clock: clock.now())
            return message
        }
        for result in try await storage.save(batch, policy: .merge) { _ = try result.get() }
    }
    let erin = try ConversationStore(directory: root + "/erin", backend: .server(url))
    try await erin.setupLocalSpeaker(identifier: "erin", name: "Erin")
    let start = ContinuousClock.now
    let report = try await erin.sync()
    let elapsed = secondsIn(ContinuousClock.now - start)
    await server.stop()
    guard report.pulled >= count else { throw RawError("pulled \(report.pulled) of \(count)") }
    return Double(report.pulled) / elapsed
}
