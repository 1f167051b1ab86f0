// convkit-bench: measures ConversationKit against the raw limits of libsodium and the disk,
// in one run on one machine, and prints each rate beside its raw limit and the ratio.
//
//     swift run -c release convkit-bench [--seconds 1.0] [--json]
import CSodium
import Foundation
import RecordZone

struct Options {
    var seconds = 1.0
    var json = false
}

func parseOptions() -> Options {
    var options = Options()
    var args = CommandLine.arguments.dropFirst()
    while let arg = args.popFirst() {
        switch arg {
        case "--seconds":
            guard let value = args.popFirst().flatMap(Double.init), value > 0 else { usageError("--seconds takes a positive number") }
            options.seconds = value
        case "--json": options.json = true
        case "-h", "--help":
            print("""
                OVERVIEW: Measure ConversationKit against raw libsodium and disk limits on this machine.

                USAGE: convkit-bench [--seconds <s>] [--json]

                OPTIONS:
                  --seconds <s>   Time spent on each measurement (default 1.0).
                  --json          Print the results as JSON.
                  -h, --help      Show help information.
                """)
            exit(0)
        default: usageError("unknown option '\(arg)'")
        }
    }
    return options
}

func usageError(_ message: String) -> Never {
    FileHandle.standardError.write(Data("Error: \(message)\nUSAGE: convkit-bench [--seconds <s>] [--json]\n".utf8))
    exit(64)
}

/// Runs `body` (which does `batch` operations) repeatedly for about `seconds`; returns ops/s.
func rate(seconds: Double, batch: Int = 1, _ body: () throws -> Void) rethrows -> Double {
    let clock = ContinuousClock()
    try body()  // warm up
    var operations = 0
    let start = clock.now
    var elapsed = Duration.zero
    repeat {
        try body()
        operations += batch
        elapsed = clock.now - start
    } while elapsed < .seconds(seconds)
    return Double(operations) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
}

/// Runs `body` on every core at once for about `seconds`; returns total ops/s.
func parallelRate(seconds: Double, _ body: @escaping @Sendable () -> Void) -> Double {
    let cores = ProcessInfo.processInfo.activeProcessorCount
    let counts = UnsafeMutableBufferPointer<Int>.allocate(capacity: cores)
    counts.initialize(repeating: 0)
    defer { counts.deallocate() }
    nonisolated(unsafe) let shared = counts
    let start = ContinuousClock.now
    DispatchQueue.concurrentPerform(iterations: cores) { core in
        var n = 0
        repeat {
            body()
            n += 1
        } while ContinuousClock.now - start < .seconds(seconds)
        shared[core] = n
    }
    let elapsed = ContinuousClock.now - start
    return Double(counts.reduce(0, +)) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
}

/// Like ``rate(seconds:batch:_:)`` for async work; `body` returns false when it has no more to do.
func rateAsync(seconds: Double, batch: Int, _ body: () async throws -> Bool) async throws -> Double {
    let clock = ContinuousClock()
    var operations = 0
    let start = clock.now
    var elapsed = Duration.zero
    repeat {
        guard try await body() else { break }
        operations += batch
        elapsed = clock.now - start
    } while elapsed < .seconds(seconds)
    return Double(operations) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
}

struct Row: Encodable {
    var name: String
    var perSecond: Double
    var rawName: String
    var rawPerSecond: Double
    var ratio: Double { perSecond / rawPerSecond }

    enum CodingKeys: String, CodingKey { case name, perSecond, rawName, rawPerSecond, ratio }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(name, forKey: .name)
        try c.encode(perSecond, forKey: .perSecond)
        try c.encode(rawName, forKey: .rawName)
        try c.encode(rawPerSecond, forKey: .rawPerSecond)
        try c.encode(ratio, forKey: .ratio)
    }
}

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

let options = parseOptions()
let seconds = options.seconds
var rows = [Row]()
func columns(_ name: String, _ rate: String, _ rawName: String, _ rawRate: String, _ ratio: String) -> String {
    func pad(_ s: String, _ width: Int, left: Bool = false) -> String {
        let fill = String(repeating: " ", count: max(0, width - s.count))
        return left ? fill + s : s + fill
    }
    return pad(name, 36) + pad(rate, 12, left: true) + "   " + pad(rawName, 34) + pad(rawRate, 12, left: true) + pad(ratio, 8, left: true)
}

@MainActor func report(_ row: Row) {
    rows.append(row)
    if !options.json {
        print(columns(row.name, String(format: "%.0f/s", row.perSecond), row.rawName, String(format: "%.0f/s", row.rawPerSecond), String(format: "%.2f", row.ratio)))
    }
}

do {
    let key = SigningKey.generate()
    let clock = HybridLogicalClock()
    let zone = try ZoneName("bench")
    let record = try sampleRecord(0, key: key, clock: clock, zone: zone)
    let body = try record.canonicalBytes()
    let encoded = try record.encoded()
    if !options.json {
        print("convkit-bench: \(body.count)-byte record body, \(String(format: "%.1f", seconds)) s per measurement, \(ProcessInfo.processInfo.activeProcessorCount) cores")
        print(columns("operation", "rate", "raw limit (same bytes, same run)", "rate", "ratio"))
    }

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
    report(Row(name: "record sign (encode + sign)", perSecond: try rate(seconds: seconds) {
        try scratch.sign(with: key, clock: RecordClock(rawValue: 1))
    }, rawName: "crypto_sign_detached", rawPerSecond: rawSign))
    let policy = RecordPolicy()
    report(Row(name: "record verify (decode + verify)", perSecond: rate(seconds: seconds) {
        guard case .success = policy.admit(encoded: encoded, source: "bench") else { preconditionFailure("verify failed") }
    }, rawName: "crypto_sign_verify_detached", rawPerSecond: rawVerify))
    report(Row(name: "record encode", perSecond: try rate(seconds: seconds) {
        _ = try record.encoded()
    }, rawName: "crypto_hash_sha256", rawPerSecond: rawHash))
    report(Row(name: "record decode", perSecond: try rate(seconds: seconds) {
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
    report(Row(name: "fs zone write (save, 400/segment)", perSecond: written, rawName: "verify (all cores) + write/fsync", rawPerSecond: rawWriteLimit))

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
    let readRate = Double(total) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
    report(Row(name: "fs zone read (fetch + verify)", perSecond: readRate, rawName: "verify, all cores", rawPerSecond: rawVerifyAllCores))

    if options.json {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        print(String(decoding: try encoder.encode(rows), as: UTF8.self))
    }
} catch {
    FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
    exit(1)
}
