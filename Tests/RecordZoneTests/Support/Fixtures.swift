import Foundation
import Testing
@testable import RecordZone

/// Keys with fixed seeds, so failures reproduce.
enum Keys {
    static func key(_ byte: UInt8) -> SigningKey {
        // A 32-byte seed always makes a key.
        (try? SigningKey(seed: Data(repeating: byte, count: 32))) ?? SigningKey.generate()
    }
    static let alice = key(1)
    static let bob = key(2)
    static let carol = key(3)
    static let mallory = key(66)
}

/// The ownership rules the tests use: a "Profile" is owned by the identity in its name, a
/// "Note" by the identity in its `owner` field, and "Shared" records need only a signature.
func makePolicy(pinnedKeys: [String: KeyChain] = [:]) -> RecordPolicy {
    RecordPolicy(rules: [
        OwnershipRule(recordType: "Profile", owner: .recordName),
        OwnershipRule(recordType: "Note", owner: .field("owner")),
        OwnershipRule(recordType: "Thread", owner: .field("author", memberOf: "members")),
    ], pinnedKeys: pinnedKeys)
}

func zone(_ name: String) throws -> ZoneName { try ZoneName(name) }

/// A signed record with the given fields.
func signed(_ zone: ZoneName, _ name: String, type: String = "Shared", fields: [String: FieldValue] = [:],
            key: SigningKey = Keys.alice, clock: RecordClock) throws -> Record {
    var record = Record(id: try RecordID(zone: zone, name: name), type: type, fields: fields)
    try record.sign(with: key, clock: clock)
    return record
}

/// A note owned by `owner`, signed by `key`.
func note(_ zone: ZoneName, _ name: String, owner: String = "alice", key: SigningKey = Keys.alice,
          clock: RecordClock, text: String = "hello") throws -> Record {
    try signed(zone, name, type: "Note", fields: ["owner": .string(owner), "text": .string(text)], key: key, clock: clock)
}

/// A temporary directory removed when the value goes away.
final class TemporaryDirectory: @unchecked Sendable {
    let path: String

    init(_ label: String = "convkit") throws {
        let base = FileManager.default.temporaryDirectory.path
        path = "\(base)/\(label)-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// A small deterministic random source (SplitMix64) for property-style tests.
struct SeededRandom: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Reads every change of a zone from a token, page by page.
func fetchAll(_ backend: any RecordZoneBackend, _ zone: ZoneName, since token: ChangeToken? = nil, limit: Int = 100)
    async throws -> (records: [Record], rejected: [RejectedRecord], token: ChangeToken)
{
    var records = [Record](), rejected = [RejectedRecord]()
    var token = token
    var pages = 0
    while true {
        let page = try await backend.fetchChanges(in: zone, since: token, limit: limit)
        records += page.records
        rejected += page.rejected
        token = page.token
        pages += 1
        #expect(page.records.count + page.rejected.count <= limit)
        if !page.moreComing { break }
        try #require(pages < 10_000, "paging does not end")
    }
    return (records, rejected, try #require(token))
}

/// Saves and requires every record to be accepted.
@discardableResult
func saveAll(_ backend: any RecordZoneBackend, _ records: [Record]) async throws -> [Record] {
    let results = try await backend.save(records)
    return try results.map { try $0.get() }
}

/// The path of a tool built beside the tests.
func builtProduct(_ name: String) throws -> String {
    var candidates = [String]()
    if let executable = Bundle.main.executableURL?.deletingLastPathComponent().path {
        candidates.append("\(executable)/\(name)")
    }
    candidates.append(URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path + "/\(name)")
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().path
    candidates.append("\(root)/.build/debug/\(name)")
    return try #require(candidates.first { FileManager.default.isExecutableFile(atPath: $0) }, "no built \(name) in \(candidates)")
}
