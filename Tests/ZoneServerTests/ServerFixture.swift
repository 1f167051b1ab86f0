import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// A zone server with chat access rules on 127.0.0.1, port 0, in a temporary directory.
final class ServerFixture: @unchecked Sendable {
    let directory: TemporaryDirectory
    let server: ZoneServer
    var port: Int { server.port }
    var url: URL { URL(string: "http://127.0.0.1:\(port)")! }

    /// `storage`: another than the SQLite one in `directory` (PostgreSQL).
    init(directory: TemporaryDirectory? = nil, access: any ZoneAccessPolicy = ChatZoneAccess(), policy: RecordPolicy = ConversationStore.recordPolicy(),
         storage: (any ZoneStorage)? = nil, configure: (inout ZoneServerConfiguration) -> Void = { _ in }) throws {
        self.directory = try directory ?? TemporaryDirectory("server")
        var configuration = ZoneServerConfiguration()
        configuration.requestsPerSecond = 100_000
        configuration.burst = 100_000
        configure(&configuration)
        let storage = try storage ?? SQLiteZoneStorage(directory: self.directory.path, policy: policy, indexedFields: ConversationStore.queryIndexes)
        server = ZoneServer(storage: storage, access: access, configuration: configuration)
        try server.start(host: "127.0.0.1", port: 0)
    }

    func client(_ identity: String, key: SigningKey) -> HTTPBackend {
        HTTPBackend(url: url, identity: identity, key: key, policy: ConversationStore.recordPolicy())
    }

    /// A signed raw request, with every part of the signature under the test's control.
    func signed(_ method: String, _ path: String, query: [(String, String)] = [], body: Data = Data(), identity: String, key: SigningKey,
                now: Date = Date(), nonce: Data = Sodium.randomBytes(16), signedBody: Data? = nil, device: Data? = nil,
                contentType: String = "application/json") async throws -> RawResponse {
        let authorization = RequestSignature.authorization(method: method, path: path, query: query, body: signedBody ?? body,
                                                           identity: identity, key: key, now: now, nonce: nonce)
        let queryString = RequestSignature.canonicalQuery(query)
        return try await RawConnection.exchange(port: port, method: method, path: path + (queryString.isEmpty ? "" : "?" + queryString),
                                          headers: ["Authorization": authorization, "Content-Type": contentType]
                                              .merging(device.map { [RequestSignature.deviceHeader: $0.base64EncodedString()] } ?? [:]) { $1 }, body: body)
    }
}

enum Keys {
    static func key(_ byte: UInt8) -> SigningKey {
        (try? SigningKey(seed: Data(repeating: byte, count: 32))) ?? SigningKey.generate()
    }
    static let alice = key(1), bob = key(2), carol = key(3), mallory = key(66)
}

/// The conversation zone of two speakers, as ConversationKit derives it.
func conversationZone(_ a: String, _ b: String) throws -> ZoneName {
    let hashes = [a, b].map { Sodium.sha256(Data($0.utf8)).prefix(8).hexString }.sorted()
    return try ZoneName("c-\(hashes[0])-\(hashes[1])")
}

/// A message record named as ConversationKit names them: `m.<h(speaker)>.<name>`.
func message(_ zone: ZoneName, _ name: String, from speaker: String, to listener: String, key: SigningKey, text: String = "hi") throws -> Record {
    var record = Record(id: try RecordID(zone: zone, name: "m.\(OwnershipRule.identityHash(speaker)).\(name)"), type: "Message", fields: [
        "speaker": .string(speaker), "listener": .string(listener), "content": .string(text), "spokenAt": .date(milliseconds: 1_800_000_000_000),
    ])
    try record.sign(with: key, clock: HybridLogicalClock().now())
    return record
}

/// Starts the real `convkitd serve` with `arguments` (its storage, options) on 127.0.0.1 and
/// returns the process with the port it printed (`port` 0: a free one).
func startServe(_ arguments: [String], port: Int = 0) async throws -> (ChildProcess, Int) {
    let child = try ChildProcess(try builtProduct("convkitd"), ["serve", "--listen", "127.0.0.1:\(port)"] + arguments)
    let started = await child.waitUntil(seconds: 30) { $0.standardError.contains("listening on 127.0.0.1:") }
    try #require(started, "convkitd serve did not start: \(child.standardError)")
    let line = try #require(child.standardError.split(separator: "\n").first { $0.contains("listening on 127.0.0.1:") })
    return (child, try #require(line.split(separator: ":").last.flatMap { Int($0) }))
}
