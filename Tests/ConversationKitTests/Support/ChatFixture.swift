import ConversationKit
import Foundation
@testable import RecordZone
import StorageTestSupport
import Testing
import TestSupport
@testable import ZoneServer

/// The backends the chat-store tests run through; each test takes one as its argument.
/// `postgres` is a zone server on PostgreSQL storage (left out, with the reason printed, only
/// where PostgreSQL is not installed).
enum ChatBackend: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case memory, filesystem, http, postgres
    var testDescription: String { rawValue }

    static var allCases: [ChatBackend] {
        guard SharedPostgres.isAvailable else {
            print("note: the chat-store tests leave out PostgreSQL storage: \(SharedPostgres.unavailableReason)")
            return [.memory, .filesystem, .http]
        }
        return [.memory, .filesystem, .http, .postgres]
    }

    /// Through a zone server (SQLite or PostgreSQL storage).
    var isServer: Bool { self == .http || self == .postgres }
}

/// Stores for alice, bob and carol, each in its own temporary directory, sharing one backend.
final class ChatFixture: @unchecked Sendable {
    let kind: ChatBackend
    let directory: TemporaryDirectory
    let server: InMemoryBackend
    /// For ``ChatBackend/http``: a real zone server on 127.0.0.1, with chat access rules.
    let zoneServer: ZoneServer?
    /// For ``ChatBackend/postgres``: a second zone server on the same database, as a deployment
    /// of several servers has (``store(_:tags:configuration:onSecondServer:)``).
    let secondServer: ZoneServer?
    /// For ``ChatBackend/postgres``: the database the servers share.
    let conninfo: String?
    var folder: String { directory.path + "/shared" }

    /// - Parameter configure: changes the servers' configuration (a server backend).
    init(_ kind: ChatBackend, configure: (inout ZoneServerConfiguration) -> Void = { _ in }) async throws {
        self.kind = kind
        directory = try TemporaryDirectory("chat")
        server = InMemoryBackend(policy: ConversationStore.recordPolicy())
        var secondServer: ZoneServer?
        let conninfo = kind == .postgres ? try await SharedPostgres.freshDatabase() : nil
        self.conninfo = conninfo
        var configuration = ZoneServerConfiguration()
        configure(&configuration)
        if kind.isServer {
            let storage: any ZoneStorage
            if let conninfo {
                storage = try await PostgresZoneStorage(conninfo: conninfo, poolSize: 4, policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
            } else {
                storage = try SQLiteZoneStorage(directory: directory.path + "/server", policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
            }
            let zoneServer = ZoneServer(storage: storage, access: ChatZoneAccess(), configuration: configuration)
            try zoneServer.start(host: "127.0.0.1", port: 0)
            self.zoneServer = zoneServer
            if let conninfo {
                let second = ZoneServer(storage: try await PostgresZoneStorage(conninfo: conninfo, poolSize: 4, policy: ConversationStore.recordPolicy(),
                                                                               indexedFields: ConversationStore.queryIndexes), access: ChatZoneAccess(),
                                        configuration: configuration)
                try second.start(host: "127.0.0.1", port: 0)
                secondServer = second
            }
        } else {
            zoneServer = nil
        }
        self.secondServer = secondServer
    }

    /// Everything the backend keeps, as bytes to search: the folder's files, the SQLite
    /// server's files, or a `pg_dump` of the PostgreSQL database (nil in memory).
    func keptBytes() async throws -> [(place: String, bytes: Data)]? {
        switch kind {
        case .memory: return nil
        case .filesystem, .http:
            let path = kind == .filesystem ? folder : directory.path + "/server"
            return (FileManager.default.enumerator(atPath: path)?.compactMap { $0 as? String } ?? []).compactMap { file in
                (try? Data(contentsOf: URL(fileURLWithPath: path + "/" + file))).map { (path + "/" + file, $0) }
            }
        case .postgres:
            let bin = try #require(PostgresCluster.binDirectory, "pg_dump is installed with PostgreSQL")
            let dump = try ChildProcess(bin + "/pg_dump", ["--dbname", try #require(conninfo), "--data-only"])
            let status = await dump.wait()
            #expect(status == 0, "pg_dump: \(dump.standardError)")
            return [("pg_dump", Data(dump.standardOutput.utf8))]
        }
    }

    /// Every record of `type` the backend holds in `zone`, as a raw reader (alice) fetches it.
    func backendRecords(of type: String, in zone: String) async throws -> [Record] {
        let reader = try rawBackend("alice", key: try key(of: "alice"))
        var records: [Record] = [], token: ChangeToken? = nil
        while true {
            let page = try await reader.fetchChanges(in: try ZoneName(zone), since: token, limit: 200)
            records += page.changedRecords.filter { $0.recordType == type }
            token = page.token
            if !page.moreComing { break }
        }
        return records
    }

    var serverURL: URL? { zoneServer.flatMap { URL(string: "http://127.0.0.1:\($0.port)") } }

    func storePath(_ identifier: String) -> String { "\(directory.path)/stores/\(identifier)" }

    func factory(device: String, onSecondServer: Bool = false) -> BackendFactory {
        switch kind {
        case .memory: .memory(server)
        case .filesystem: .folder(folder, device: device)
        case .http, .postgres:
            ((onSecondServer ? secondServer ?? zoneServer : zoneServer).flatMap { URL(string: "http://127.0.0.1:\($0.port)") }).map { .server($0) } ?? .memory(server)
        }
    }

    /// A backend that writes as `identity` with `key`, checking saves as the real thing does:
    /// how a hostile participant reaches the shared backend without its store's checks.
    func rawBackend(_ identity: String, key: SigningKey) throws -> any RecordZoneBackend {
        switch kind {
        case .memory: return server.connection(policy: ConversationStore.recordPolicy())
        case .filesystem: return try FileSystemBackend(root: folder, device: "\(identity)-raw", policy: ConversationStore.recordPolicy())
        case .http, .postgres: return HTTPBackend(url: try #require(serverURL), identity: identity, key: key, policy: ConversationStore.recordPolicy())
        }
    }

    private var plantedSegments: UInt64 = 0

    /// Stores bytes as a hostile or broken writer would, past every save check.
    func plant(_ data: Data, in zone: ZoneName) async throws {
        plantedSegments += 1
        switch kind {
        case .memory: try await server.injectUnchecked(data, into: zone)
        case .filesystem:
            let layout = FolderLayout(root: folder)
            try layout.writeSegment(Segment.encode([data]), zone: zone, generation: try layout.zoneState(zone).generation, device: "forger", sequence: plantedSegments)
        case .http, .postgres: try await #require(zoneServer).storage.injectUnchecked(data, into: zone, name: "planted-\(plantedSegments)")
        }
    }

    /// A speaker's own zone: profile, devices, revocations.
    static func speakerZone(_ identifier: String) throws -> ZoneName {
        try ZoneName("s-" + OwnershipRule.identityHash(identifier))
    }

    /// The key of a store's local speaker, as its key file holds it.
    func key(of identifier: String) throws -> SigningKey { try KeyFile.load(from: storePath(identifier) + "/speaker.key") }

    /// Opens the store of `identifier` and sets up its local speaker.
    /// - Parameter onSecondServer: with ``ChatBackend/postgres``, through the second server.
    func store(_ identifier: String, tags: [String] = [], configuration: StoreConfiguration = StoreConfiguration(),
               onSecondServer: Bool = false) async throws -> ConversationStore {
        let store = try ConversationStore(directory: storePath(identifier), backend: factory(device: identifier, onSecondServer: onSecondServer), configuration: configuration)
        try await store.setupLocalSpeaker(identifier: identifier, name: identifier.capitalized, tags: tags)
        return store
    }
}

/// The code of the ``ConversationError`` `body` throws (nil: it throws nothing, or another error).
func code(_ body: () async throws -> Void) async -> ConversationError.Code? {
    do {
        try await body()
        return nil
    } catch let error as ConversationError {
        return error.code
    } catch {
        return nil
    }
}

/// Syncs the stores in turn, twice round, so every change reaches every store.
func syncAll(_ stores: [ConversationStore]) async throws {
    for _ in 0..<2 {
        for store in stores { try await store.sync() }
    }
}

/// A conversation's whole history, oldest first, page by page.
func history(_ store: ConversationStore, _ conversation: String, pageSize: Int = 50) throws -> [Message] {
    var all = [Message]()
    var cursor: MessageCursor? = nil
    repeat {
        let page = try store.messages(in: conversation, limit: pageSize, before: cursor)
        all = page.messages + all
        cursor = page.olderCursor
    } while cursor != nil
    return all
}

/// A clock the test moves by hand.
final class ManualClock: @unchecked Sendable {
    private let lock = NSLock()
    private var current: Date
    init(_ start: Date = Date(timeIntervalSince1970: 1_800_000_000)) { current = start }
    var now: Date { lock.withLock { current } }
    func advance(_ seconds: Double) { lock.withLock { current = current.addingTimeInterval(seconds) } }
}

/// The first element of `stream` that `matches`, or nil if the stream ends or `seconds` pass
/// first: a missing element fails the test instead of hanging it.
func firstElement<T: Sendable>(of stream: AsyncStream<T>, seconds: Double = 30, where matches: @escaping @Sendable (T) -> Bool) async -> T? {
    await withTaskGroup(of: T?.self) { group in
        group.addTask {
            for await element in stream where matches(element) { return element }
            return nil
        }
        group.addTask {
            try? await Task.sleep(for: .seconds(seconds))
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
}

/// Whether events arrive until `isDone` says so, within `seconds`.
func awaitEvents(_ events: AsyncStream<StoreEvent>, seconds: Double = 30, until isDone: @escaping @Sendable (StoreEvent) -> Bool) async -> Bool {
    await firstElement(of: events, seconds: seconds, where: isDone) != nil
}

/// A convergence schedule: delivers `order` into `backend` in random batches of one to four,
/// the store at `path` (reopened over `backend`) syncing, restarting or clearing its cache at
/// random in between, then syncing twice. Returns the store as it ends.
func deliverAtRandom(_ order: [(zone: ZoneName, bytes: Data)], into backend: InMemoryBackend, store: ConversationStore, path: String,
                     random: inout some RandomNumberGenerator) async throws -> ConversationStore {
    var store = store
    var index = 0
    while index < order.count {
        let batch = Int(1 + random.next() % 4)
        for record in order[index..<min(order.count, index + batch)] { try await backend.injectUnchecked(record.bytes, into: record.zone) }
        index += batch
        switch random.next() % 8 {
        case 0: break  // no sync this time
        case 1:  // a restart
            store.close()
            store = try ConversationStore(directory: path, backend: .memory(backend))
            try await store.sync()
        case 2:
            try await store.clearAllCachedData()
            try await store.sync()
        default: try await store.sync()
        }
    }
    try await store.sync()
    try await store.sync()
    return store
}
