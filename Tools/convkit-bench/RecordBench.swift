import CSodium
import Foundation
import RecordZone

/// A message-sized sample record: about the size of a chat message with its metadata.
func sampleRecord(_ index: Int, key: SigningKey, clock: HybridLogicalClock, zone: ZoneName) throws -> Record {
    var record = Record(id: try RecordID(zone: zone, name: "msg-\(index)"), type: "Message")
    record["content"] = .string("Hello there! This is message number \(index), about as long as a chat line usually is.")
    record["speaker"] = .string("alice")
    record["listener"] = .string("bob")
    record["spokenAt"] = .date(milliseconds: 1_700_000_000_000 + Int64(index))
    try record.sign(with: key, clock: clock.now())
    return record
}

/// Records signed, verified, encoded and decoded, and a filesystem zone written and read,
/// each beside the raw libsodium or disk rate for the same bytes.
@MainActor func recordBench(_ reporter: Reporter, seconds: Double) async throws {
    let key = SigningKey.generate()
    let clock = HybridLogicalClock()
    let zone = try ZoneName("bench")
    let record = try sampleRecord(0, key: key, clock: clock, zone: zone)
    let body = try record.canonicalBytes()
    let encoded = try record.encoded()
    reporter.header("Records (\(body.count)-byte body) and a filesystem zone")

    // Raw libsodium on the same bytes.
    let seed = Array(key.seed)
    var pk = [UInt8](repeating: 0, count: 32), sk = [UInt8](repeating: 0, count: 64)
    crypto_sign_seed_keypair(&pk, &sk, seed)
    let bodyBytes = Array(body)
    var signature = [UInt8](repeating: 0, count: 64)
    let rawSign = rate(seconds: seconds) {
        crypto_sign_detached(&signature, nil, bodyBytes, UInt64(bodyBytes.count), sk)
    }
    let rawVerify = rate(seconds: seconds) {
        precondition(crypto_sign_verify_detached(signature, bodyBytes, UInt64(bodyBytes.count), pk) == 0)
    }
    let signed = signature, publicKey = pk
    let rawVerifyAllCores = parallelRate(seconds: seconds) {
        precondition(crypto_sign_verify_detached(signed, bodyBytes, UInt64(bodyBytes.count), publicKey) == 0)
    }
    var digest = [UInt8](repeating: 0, count: 32)
    let encodedBytes = Array(encoded)
    let rawHash = rate(seconds: seconds) {
        crypto_hash_sha256(&digest, encodedBytes, UInt64(encodedBytes.count))
    }

    var scratch = record
    reporter.report(Row(name: "record sign (encode + sign)", perSecond: try rate(seconds: seconds) {
        try scratch.sign(with: key, clock: RecordClock(rawValue: 1))
    }, rawName: "crypto_sign_detached", rawPerSecond: rawSign))
    let policy = RecordPolicy()
    reporter.report(Row(name: "record verify (decode + verify)", perSecond: rate(seconds: seconds) {
        guard case .success = policy.admit(encoded: encoded, source: "bench") else { preconditionFailure("verify failed") }
    }, rawName: "crypto_sign_verify_detached", rawPerSecond: rawVerify))
    reporter.report(Row(name: "record encode", perSecond: try rate(seconds: seconds) {
        _ = try record.encoded()
    }, rawName: "crypto_hash_sha256", rawPerSecond: rawHash))
    reporter.report(Row(name: "record decode", perSecond: try rate(seconds: seconds) {
        _ = try Record(canonical: encoded)
    }, rawName: "crypto_hash_sha256", rawPerSecond: rawHash))

    // Filesystem zone: write batches of 400 (one fsynced segment each), read back with verify.
    let root = FileManager.default.temporaryDirectory.path + "/convkit-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    let backend = try FileSystemBackend(root: root, device: "bench")
    try await backend.createZone(zone)
    let batchSize = Record.maximumBatchSize
    // Records are signed ahead of time: the write measures save = verify + segment + fsync.
    var next = 0
    let batches = try (0..<max(8, Int(40 * seconds))).map { _ in
        try (0..<batchSize).map { _ in
            defer { next += 1 }
            return try sampleRecord(next, key: key, clock: clock, zone: zone)
        }
    }
    var batchIndex = 0
    let written = try await rateAsync(seconds: seconds, batch: batchSize) {
        guard batchIndex < batches.count else { return false }
        _ = try await backend.save(batches[batchIndex])
        batchIndex += 1
        return true
    }
    // Raw: the same bytes written as a file, fsynced, renamed, directory fsynced.
    let segmentBytes = Data(count: batchSize * (encoded.count + 4) + 41)
    let rawFolder = root + "/raw"
    try FileManager.default.createDirectory(atPath: rawFolder, withIntermediateDirectories: true)
    var rawIndex = 0
    let rawWrite = try rate(seconds: seconds, batch: batchSize) {
        let path = "\(rawFolder)/\(rawIndex)"
        rawIndex += 1
        let fd = open(path + ".tmp", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        guard fd >= 0 else { throw RecordZoneError(.ioError, "open") }
        _ = segmentBytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        fsync(fd)
        close(fd)
        rename(path + ".tmp", path)
        let dir = open(rawFolder, O_RDONLY)
        fsync(dir)
        close(dir)
    }
    let rawWriteLimit = 1 / (1 / rawVerifyAllCores + 1 / rawWrite)
    reporter.report(Row(name: "fs zone write (save, 400/segment)", perSecond: written, rawName: "verify (all cores) + write/fsync", rawPerSecond: rawWriteLimit))

    let reader = try FileSystemBackend(root: root, device: nil)
    var total = 0
    let clockStart = ContinuousClock.now
    var token: ChangeToken? = nil
    repeat {
        let page = try await reader.fetchChanges(in: zone, since: token, limit: 1000)
        total += page.records.count
        token = page.token
        if !page.moreComing { break }
    } while true
    let elapsed = ContinuousClock.now - clockStart
    let readRate = Double(total) / secondsIn(elapsed)
    reporter.report(Row(name: "fs zone read (fetch + verify)", perSecond: readRate, rawName: "verify, all cores", rawPerSecond: rawVerifyAllCores))

    // A new process's first save and sync (opening the backend, a save, then the changes since
    // the token the last process kept), with a zone of 1,000 and of 100,000 records, in a real
    // new process: the local index makes both cost what changed, not the history (issue 10).
    for held in [1_000, 100_000] {
        let folder = root + "/held-\(held)"
        let state = root + "/state-\(held)"
        let writer = try FileSystemBackend(root: folder, device: "bench", stateDirectory: state)
        try await writer.createZone(zone)
        var made = 0
        while made < held {
            let batch = try (made..<min(held, made + batchSize)).map { try sampleRecord($0, key: key, clock: clock, zone: zone) }
            _ = try await writer.save(batch)
            made += batch.count
        }
        var kept: ChangeToken? = nil
        repeat {
            let page = try await writer.fetchChanges(in: zone, since: kept, limit: 1000)
            kept = page.token
            if !page.moreComing { break }
        } while true
        _ = consume writer  // its lock goes; a new process takes the device's state
        let (firstSeconds, steadySeconds) = try firstSyncInNewProcess(folder: folder, state: state, zone: zone, token: kept)
        reporter.report(Row(name: "fs first save+sync, new process, \(held) held", perSecond: 1 / firstSeconds,
                            rawName: "the next one (same process)", rawPerSecond: 1 / steadySeconds))
        reporter.note(String(format: "fs zone with %d records held: a new process's first save and sync %.4f s, the next ones %.4f s", held, firstSeconds, steadySeconds))
    }

}

/// Runs this program again as a new process (`--probe-first-sync`) on a writer's folder and
/// state: its first save and sync, then the next ones. - Returns: both durations in seconds.
func firstSyncInNewProcess(folder: String, state: String, zone: ZoneName, token: ChangeToken?) throws -> (Double, Double) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL
    if !FileManager.default.isExecutableFile(atPath: process.executableURL?.path ?? "") {
        process.executableURL = Bundle.main.executableURL
    }
    process.arguments = ["--probe-first-sync", [folder, state, zone.rawValue, token?.base64 ?? ""].joined(separator: "\n")]
    let output = Pipe()
    process.standardOutput = output
    try process.run()
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    let words = String(decoding: data, as: UTF8.self).split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
    guard process.terminationStatus == 0, words.count == 3, words[0] == "probe", let first = Double(words[1]), let steady = Double(words[2]) else {
        throw RawError("the probe process failed: \(String(decoding: data, as: UTF8.self))")
    }
    return (first, steady)
}

/// The probe (a new process): opens the writer's folder and state, saves one record and fetches
/// the changes since the kept token, then does it again; prints `probe <first s> <next s>`.
func probeFirstSync(_ argument: String) async throws {
    let parts = argument.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    guard parts.count == 4 else { throw RawError("--probe-first-sync takes folder, state, zone and token") }
    let zone = try ZoneName(parts[2])
    let token = parts[3].isEmpty ? nil : ChangeToken(base64: parts[3])
    let key = SigningKey.generate(), clock = HybridLogicalClock()
    let later = try sampleRecord(10_000_001, key: key, clock: clock, zone: zone)
    let again = try sampleRecord(10_000_002, key: key, clock: clock, zone: zone)
    let start = ContinuousClock.now
    let backend = try FileSystemBackend(root: parts[0], device: "bench", stateDirectory: parts[1])
    _ = try await backend.save([later])
    let synced = try await backend.fetchChanges(in: zone, since: token, limit: 1000)
    let first = secondsIn(ContinuousClock.now - start)
    guard synced.records.map(\.id) == [later.id] else { throw RawError("the first sync got \(synced.records.count) records, not the one saved") }
    let steady = ContinuousClock.now
    _ = try await backend.save([again])
    _ = try await backend.fetchChanges(in: zone, since: synced.token, limit: 1000)
    print("probe \(first) \(secondsIn(ContinuousClock.now - steady))")
}
