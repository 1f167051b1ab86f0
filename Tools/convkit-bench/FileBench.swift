import ChatSchema
import ConversationKit
import CRawLimits
import Foundation
import RecordZone
import ZoneServer

/// A file through a zone server (SQLite) over loopback: the store's upload (the sync that sends
/// a 64 MiB file's message) and download (`downloadFile`) against raw libcurl moving the same
/// number of encrypted chunks of the same sizes to and from the same server, with their signed
/// headers made beforehand and as many requests in flight as ours keep
/// (``ConversationStore/fileTransfersInFlight``, each on its keep-alive connection). Three
/// rounds, interleaved; the median of each.
@MainActor func fileBench(_ reporter: Reporter) async throws {
    let size = 64 << 20, chunk = AttachmentManifest.chunkSize, rounds = 3
    reporter.header("Files (\(size >> 20) MiB in 1 MiB chunks, zone server over loopback)")
    let root = FileManager.default.temporaryDirectory.path + "/convkit-file-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    let storage = try SQLiteZoneStorage(directory: root + "/server", policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
    let (server, url, _) = try startBenchServer(storage, access: ChatZoneAccess())
    defer { Task { await server.stop() } }
    let alice = try ConversationStore(directory: root + "/alice", backend: .server(url))
    try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
    let bob = try ConversationStore(directory: root + "/bob", backend: .server(url))
    try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
    for store in [alice, bob, alice] { try await store.sync() }
    let key = try KeyFile.load(from: root + "/alice/speaker.key")

    func randomFile(_ path: String) throws {
        guard FileManager.default.createFile(atPath: path, contents: nil), let handle = FileHandle(forWritingAtPath: path) else { throw RawError("cannot write \(path)") }
        defer { try? handle.close() }
        for _ in 0..<(size / chunk) { try handle.write(contentsOf: Sodium.randomBytes(chunk)) }
    }
    func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }

    var ourUps: [Double] = [], rawUps: [Double] = [], ourDowns: [Double] = [], rawDowns: [Double] = [], sends: [Double] = []
    var serialDowns: [Double] = []
    var sent: [MessageID] = []
    for round in 0..<rounds {
        // Ours: the file committed (copied, encrypted, hashed: measured apart), then the sync
        // that uploads its chunks and saves its message.
        let path = root + "/file-\(round).bin"
        try randomFile(path)
        var start = ContinuousClock.now
        let message = try await alice.sendFile(URL(fileURLWithPath: path), to: "bob")
        sends.append(Double(size) / secondsIn(ContinuousClock.now - start))
        start = ContinuousClock.now
        let report = try await alice.sync()
        ourUps.append(Double(size) / secondsIn(ContinuousClock.now - start))
        guard report.pushed >= 1 else { throw RawError("the file's message was not pushed") }
        sent.append(message.id)

        // Raw: as many new chunks of the same sizes, encrypted as ours are, PUT with libcurl.
        let fileKey = Sodium.randomBytes(32)
        let bodies = (0..<(size / chunk)).map { AttachmentManifest.sealChunk(Sodium.randomBytes(chunk), index: $0, key: fileKey) }
        let paths = bodies.map { "/v1/assets/" + Sodium.sha256($0).hexString }
        let puts = zip(paths, bodies).map { "Authorization: " + RequestSignature.authorization(method: "PUT", path: $0, query: [], body: $1, identity: "alice", key: key, now: Date()) }
        start = ContinuousClock.now
        let up = try rawTransfer(url, paths: paths, headers: puts, bodies: bodies, upload: true, parallel: ConversationStore.fileTransfersInFlight.upload)
        rawUps.append(Double(up) / secondsIn(ContinuousClock.now - start))

        // Downloads: ours of that message, raw GETs of the raw chunks.
        try await bob.sync()
        start = ContinuousClock.now
        _ = try await bob.downloadFile(of: message.id)
        ourDowns.append(Double(size) / secondsIn(ContinuousClock.now - start))
        let gets = zip(paths, bodies).map { path, body in
            (path + "?size=\(body.count)", "Authorization: " + RequestSignature.authorization(method: "GET", path: path, query: [("size", String(body.count))], body: Data(),
                                                                                           identity: "alice", key: key, now: Date()))
        }
        start = ContinuousClock.now
        let down = try rawTransfer(url, paths: gets.map(\.0), headers: gets.map(\.1), bodies: [Data(count: chunk + 64)], upload: false,
                                   parallel: ConversationStore.fileTransfersInFlight.download)
        rawDowns.append(Double(down) / secondsIn(ContinuousClock.now - start))
        // And one request at a time (as a plain `curl` loop would).
        let serialGets = zip(paths, bodies).map { path, body in
            "Authorization: " + RequestSignature.authorization(method: "GET", path: path, query: [("size", String(body.count))], body: Data(), identity: "alice", key: key, now: Date())
        }
        start = ContinuousClock.now
        let serial = try rawTransfer(url, paths: gets.map(\.0), headers: serialGets, bodies: [Data(count: chunk + 64)], upload: false, parallel: 1)
        serialDowns.append(Double(serial) / secondsIn(ContinuousClock.now - start))
        guard down == Int64(bodies.reduce(0) { $0 + $1.count }) else { throw RawError("raw download moved \(down) bytes") }
    }
    let mib = Double(1 << 20)
    reporter.report(Row(name: "file upload (sync: chunks + message), MiB", perSecond: median(ourUps) / mib,
                        rawName: "raw libcurl PUT same-size chunks", rawPerSecond: median(rawUps) / mib))
    reporter.report(Row(name: "file download (downloadFile), MiB", perSecond: median(ourDowns) / mib,
                        rawName: "raw libcurl GET same-size chunks", rawPerSecond: median(rawDowns) / mib))
    reporter.note(String(format: "raw libcurl GET one request at a time: %.0f MiB/s (ours %.2f of it)", median(serialDowns) / mib, median(ourDowns) / median(serialDowns)))
    reporter.note(String(format: "sendFile (copy into the store, encrypt, hash; no network): %.0f MiB/s", median(sends) / mib))
}

/// ``raw_curl_transfer`` over Swift arrays: the bytes moved.
private func rawTransfer(_ url: URL, paths: [String], headers: [String], bodies: [Data], upload: Bool, parallel: Int) throws -> Int64 {
    let cPaths = paths.map { strdup($0) }, cHeaders = headers.map { strdup($0) }
    defer { (cPaths + cHeaders).forEach { free($0) } }
    let buffers = bodies.map { body -> UnsafeMutablePointer<UInt8> in
        let buffer = UnsafeMutablePointer<UInt8>.allocate(capacity: max(body.count, 1))
        body.copyBytes(to: buffer, count: body.count)
        return buffer
    }
    defer { buffers.forEach { $0.deallocate() } }
    let sizes = bodies.map(\.count)
    let moved = cPaths.map { UnsafePointer($0) }.withUnsafeBufferPointer { pathPointer in
        cHeaders.map { UnsafePointer($0) }.withUnsafeBufferPointer { headerPointer in
            buffers.map { Optional(UnsafePointer($0)) }.withUnsafeBufferPointer { bodyPointer in
                sizes.withUnsafeBufferPointer { sizePointer in
                    raw_curl_transfer(url.absoluteString, Int32(paths.count), pathPointer.baseAddress, headerPointer.baseAddress,
                                      bodyPointer.baseAddress, sizePointer.baseAddress, sizes.first ?? 0, upload ? 1 : 0, Int32(parallel))
                }
            }
        }
    }
    guard moved >= 0 else { throw RawError("a raw libcurl \(upload ? "PUT" : "GET") failed") }
    return Int64(moved)
}
