import Foundation
import Testing
import TestSupport
@testable import RecordZone
@testable import ZoneServer

/// The backends the conformance suite runs against. Each test takes a kind as its argument,
/// so the same test definition runs against every backend; HTTP runs in both wire forms
/// (`http`: records as a binary table, the client's default; `httpJSON`: base64 in JSON).
enum BackendKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case memory, filesystem, http, httpJSON
    var testDescription: String { rawValue }
}

/// A backend under test plus the means to reach it as several writers and to plant raw bytes.
final class BackendFixture: @unchecked Sendable {
    let kind: BackendKind
    let policy: RecordPolicy
    private let directory: TemporaryDirectory?
    private let memory: InMemoryBackend?
    private let server: ZoneServer?
    private var opened: [String: any RecordZoneBackend] = [:]
    private var forgerSequence: UInt64 = 0

    init(_ kind: BackendKind) throws {
        self.kind = kind
        policy = makePolicy()
        switch kind {
        case .memory:
            memory = InMemoryBackend(policy: policy)
            directory = nil
            server = nil
        case .filesystem:
            memory = nil
            directory = try TemporaryDirectory("fszone")
            server = nil
        case .http, .httpJSON:
            memory = nil
            let directory = try TemporaryDirectory("httpzone")
            self.directory = directory
            var configuration = ZoneServerConfiguration()
            configuration.requestsPerSecond = 100_000
            configuration.burst = 100_000
            let server = ZoneServer(storage: try SQLiteBackend(directory: directory.path, policy: makePolicy()), configuration: configuration)
            try server.start(host: "127.0.0.1", port: 0)
            self.server = server
        }
    }

    var root: String { directory?.path ?? "" }

    /// The backend as seen by one writer (a device, for the filesystem). Readers get their own
    /// policy, as separate peers would.
    func backend(_ writer: String = "main", pinnedKeys: [String: KeyChain] = [:]) throws -> any RecordZoneBackend {
        if let existing = opened[writer] { return existing }
        let made: any RecordZoneBackend
        switch kind {
        case .memory: made = try #require(memory)
        case .filesystem: made = try FileSystemBackend(root: root, device: writer, policy: makePolicy(pinnedKeys: pinnedKeys), pollInterval: .milliseconds(5))
        case .http, .httpJSON:
            let port = try #require(server?.port)
            made = HTTPBackend(url: try #require(URL(string: "http://127.0.0.1:\(port)")), identity: writer,
                               key: Keys.key(UInt8(truncatingIfNeeded: writer.hashValue) | 0x80), policy: makePolicy(pinnedKeys: pinnedKeys),
                               wireForm: kind == .http ? .binary : .json)
        }
        opened[writer] = made
        return made
    }

    /// Stores bytes as a hostile or broken peer would, bypassing every save check.
    func plant(_ data: Data, in zone: ZoneName) async throws {
        switch kind {
        case .memory:
            try await #require(memory).injectUnchecked(data, into: zone)
        case .filesystem:
            let layout = FolderLayout(root: root)
            let generation = try layout.zoneState(zone).generation
            forgerSequence += 1
            try layout.writeSegment(Segment.encode([data]), zone: zone, generation: generation, device: "forger", sequence: forgerSequence)
        case .http, .httpJSON:
            forgerSequence += 1
            try await #require(server).storage.injectUnchecked(data, into: zone, name: "planted-\(forgerSequence)")
        }
    }
}
