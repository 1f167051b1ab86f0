import Foundation
import StorageTestSupport
import Testing
import TestSupport
@testable import RecordZone
@testable import ZoneServer

/// The backends the conformance suite runs against. Each test takes a kind as its argument,
/// so the same test definition runs against every backend; HTTP runs in both wire forms
/// (`http`: records as a binary table, the client's default; `httpJSON`: base64 in JSON) and
/// over HTTPS (`https`: a certificate the test makes, trusted through the client's `caFile`),
/// and through a zone server on PostgreSQL storage (`postgres`: a database of its own in the
/// test process's private cluster; left out, with the reason printed, only where PostgreSQL is
/// not installed).
enum BackendKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case memory, filesystem, http, httpJSON, https, postgres
    var testDescription: String { rawValue }

    static var allCases: [BackendKind] {
        guard SharedPostgres.isAvailable else {
            print("note: the conformance suite leaves out PostgreSQL storage: \(SharedPostgres.unavailableReason)")
            return [.memory, .filesystem, .http, .httpJSON, .https]
        }
        return [.memory, .filesystem, .http, .httpJSON, .https, .postgres]
    }
}

/// A backend under test plus the means to reach it as several writers and to plant raw bytes.
final class BackendFixture: @unchecked Sendable {
    let kind: BackendKind
    let policy: RecordPolicy
    private let directory: TemporaryDirectory?
    private let memory: InMemoryBackend?
    private let server: ZoneServer?
    private let certificate: TestCertificate?
    private var opened: [String: any RecordZoneBackend] = [:]
    private var forgerSequence: UInt64 = 0

    init(_ kind: BackendKind) async throws {
        self.kind = kind
        policy = makePolicy()
        switch kind {
        case .memory:
            memory = InMemoryBackend(policy: policy)
            directory = nil
            server = nil
            certificate = nil
        case .filesystem:
            memory = nil
            directory = try TemporaryDirectory("fszone")
            server = nil
            certificate = nil
        case .http, .httpJSON, .https, .postgres:
            memory = nil
            let directory = try TemporaryDirectory("httpzone")
            self.directory = directory
            var configuration = ZoneServerConfiguration()
            configuration.requestsPerSecond = 100_000
            configuration.burst = 100_000
            let storage: any ZoneStorage = kind == .postgres
                ? try await PostgresZoneStorage(conninfo: try await SharedPostgres.freshDatabase(), poolSize: 4, policy: makePolicy())
                : try SQLiteZoneStorage(directory: directory.path, policy: makePolicy())
            let server = ZoneServer(storage: storage, configuration: configuration)
            let certificate = kind == .https ? try TestCertificate(in: directory.path) : nil
            try server.start(host: "127.0.0.1", port: 0,
                             tls: try certificate.map { try TLSIdentity(certificateFile: $0.certificateFile, keyFile: $0.keyFile) })
            self.server = server
            self.certificate = certificate
            // The owners of the suite's records connect first, with their own keys: a server
            // learns an identity's key only from that identity (docs/PROTOCOL.md §4.5), never
            // from a record another writer sends.
            let url = try #require(URL(string: "\(kind == .https ? "https" : "http")://127.0.0.1:\(server.port)"))
            for (identity, key) in [("alice", Keys.alice), ("bob", Keys.bob)] {
                _ = try await HTTPBackend(url: url, identity: identity, key: key, caFile: certificate?.certificateFile).zones()
            }
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
        case .http, .httpJSON, .https, .postgres:
            let port = try #require(server?.port)
            made = HTTPBackend(url: try #require(URL(string: "\(kind == .https ? "https" : "http")://127.0.0.1:\(port)")), identity: writer,
                               key: Keys.key(UInt8(truncatingIfNeeded: writer.hashValue) | 0x80), policy: makePolicy(pinnedKeys: pinnedKeys),
                               wireForm: kind == .httpJSON ? .json : .binary, caFile: certificate?.certificateFile)
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
        case .http, .httpJSON, .https, .postgres:
            forgerSequence += 1
            try await #require(server).storage.injectUnchecked(data, into: zone, name: "planted-\(forgerSequence)")
        }
    }
}
