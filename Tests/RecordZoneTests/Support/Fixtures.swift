import Foundation
import Testing
import TestSupport
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

/// The ownership rules the tests use, each a rule on the record ID: a "Profile" `p.<identity>`,
/// a "Note" `n.<h(owner)>.<name>` whose `owner` field names the identity, a "Thread"
/// `t.<identity>` whose `author` field repeats it; other names are "Shared" records that need
/// only a signature.
func makePolicy(pinnedKeys: [String: KeyChain] = [:]) -> RecordPolicy {
    RecordPolicy(rules: [
        OwnershipRule(recordType: "Profile", owner: .name(prefix: "p.")),
        OwnershipRule(recordType: "Note", owner: .hashedName(prefix: "n.", field: "owner")),
        OwnershipRule(recordType: "Thread", owner: .name(prefix: "t.", field: "author")),
    ], pinnedKeys: pinnedKeys)
}

/// The name of `owner`'s note called `name`.
func noteName(_ name: String, owner: String = "alice") -> String { "n.\(OwnershipRule.identityHash(owner)).\(name)" }

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
    try signed(zone, noteName(name, owner: owner), type: "Note", fields: ["owner": .string(owner), "text": .string(text)], key: key, clock: clock)
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
