import ChatSchema
import Foundation
import RecordZone
import ToolSupport

let replicateCommand = Command(
    "convkitd replicate", "Copy signed records zone to zone from one backend to another.",
    discussion: """
        A backend is a zone server (an http:// or https:// URL) or a folder zone (a path). Every
        record read is verified (signature and owner, speakers' own zones first), saved to the other
        side with its own signature (which checks it again), and the assets it references go first.
        Idempotent, and resumable from its own checkpoints (a token per zone in the --state file,
        written after each page is saved), never from state kept in either backend. Against a
        server it signs as --identity with --key: the server must list it (convkitd serve
        --replicator <identity>=<public key hex>, printed at start) to read and write every zone.
        Exit status: 0 when everything read was copied; 3 when some records were not (refused at
        the source as forged or unreadable, or at the destination), each named on stderr and
        counted in the summary; 1 on a failure; 64 on a usage error.
        """,
    synopsis: "--from <url|dir> --to <url|dir> --state <file> [<options>]",
    options: [
        .valued("from", "url|dir", "Where records are read."),
        .valued("to", "url|dir", "Where they are saved."),
        .valued("state", "file", "The checkpoints of this copy (created when missing)."),
        .valued("key", "file", "The replicator's key (created when missing; needed with a server)."),
        .valued("identity", "name", "The replicator's identity on servers, starting with _. (default: _replicator)"),
        .valued("zones", "zone,...", "Only these zones. (default: every zone of --from)"),
        .valued("device", "label", "The device to write to a --to folder as. (default: replicator)"),
        .flag("continuous", "Keep copying: look again every --interval."),
        .valued("interval", "seconds", "How often, with --continuous. (default: 1)"),
        .valued("log-level", "level", "trace, debug, info, notice, warning, error or critical. (default: info)"),
    ])

let replicateHelp = replicateCommand.help

/// The checkpoints of one copy: which source and destination, and a token per zone.
struct ReplicationState: Codable {
    var from: String
    var to: String
    var tokens: [String: String] = [:]
}

func replicate(_ arguments: ParsedArguments) async {
    let logger: Logger
    let interval: Int
    let identity = arguments.value("identity") ?? "_replicator"
    do throws(UsageError) {
        let levelName = arguments.value("log-level") ?? "info"
        guard let level = Logger.Level(name: levelName) else { throw UsageError("unknown log level '\(levelName)'") }
        logger = Logger(label: "convkitd replicate", level: level)
        interval = try arguments.int("interval", default: 1, range: 1...3600)
        guard arguments.value("from") != nil, arguments.value("to") != nil, arguments.value("state") != nil else {
            throw UsageError("--from, --to and --state are required")
        }
        guard identity.hasPrefix("_"), identity.count > 1 else { throw UsageError("--identity must start with _ (no speaker can take such a name)") }
    } catch {
        fail(error.message, usage: replicateHelp)
    }
    let from = arguments.value("from") ?? "", to = arguments.value("to") ?? "", statePath = arguments.value("state") ?? ""
    let only = arguments.value("zones").map { Set($0.split(separator: ",").map(String.init)) }
    do {
        let isServer = { (text: String) in text.hasPrefix("http://") || text.hasPrefix("https://") }
        var key: SigningKey? = nil
        if isServer(from) || isServer(to) {
            guard let keyPath = arguments.value("key") else { fail("--key is required with a server", usage: replicateHelp) }
            let loaded = try KeyFile.loadOrCreate(at: keyPath)
            logger.info("replicator \(identity)=\(loaded.publicKey.hexString) (give this to convkitd serve --replicator)")
            key = loaded
        }
        func backend(_ text: String, writing: Bool) throws -> any RecordZoneBackend {
            let policy = ChatSchema.recordPolicy()
            if isServer(text) {
                guard let url = URL(string: text), url.host != nil, let key else { throw UsageError("'\(text)' is not a server URL") }
                return HTTPBackend(url: url, identity: identity, key: key, policy: policy)
            }
            guard writing else { return try FileSystemBackend(root: text, device: nil, policy: policy) }
            return try FileSystemBackend(root: text, device: arguments.value("device") ?? "replicator", policy: policy, stateDirectory: statePath + ".folder")
        }
        let source = try backend(from, writing: false)
        let destination = try backend(to, writing: true)
        var state = ReplicationState(from: from, to: to)
        if let data = FileManager.default.contents(atPath: statePath) {
            let saved = try JSONDecoder().decode(ReplicationState.self, from: data)
            guard saved.from == from, saved.to == to else {
                fail("\(statePath) holds the checkpoints of a copy from \(saved.from) to \(saved.to), not this one", usage: nil)
            }
            state = saved
        }
        signal(SIGPIPE, SIG_IGN)
        let stopping = StopFlag()
        let (signals, sources) = stopSignals()
        Task {
            for await number in signals {
                logger.info("received \(number == SIGINT ? "SIGINT" : "SIGTERM"), stopping after this page")
                stopping.set()
            }
        }
        defer { withExtendedLifetime(sources) {} }
        var refusedInAll = 0
        repeat {
            do {
                let pass = try await replicateOnce(source, destination, state: &state, statePath: statePath, only: only, logger: logger, stopping: stopping)
                refusedInAll += pass.refusedAtSource + pass.refusedAtDestination
                if pass.copied > 0 || pass.refusedAtSource + pass.refusedAtDestination > 0 || !arguments.has("continuous") {
                    let refused = pass.refusedAtSource + pass.refusedAtDestination == 0 ? ""
                        : "; not copied: \(pass.refusedAtSource) refused at the source, \(pass.refusedAtDestination) at the destination"
                    logger.info("sent \(pass.copied) records (new there, or already there)\(refused)")
                }
            } catch let error as RecordZoneError where error.isTransient && arguments.has("continuous") {
                logger.warning("backend unreachable, trying again: \(error)")
            }
            if !arguments.has("continuous") || stopping.isSet { break }
            for _ in 0..<(interval * 10) where !stopping.isSet { try await Task.sleep(for: .milliseconds(100)) }
        } while !stopping.isSet
        exit(refusedInAll > 0 ? 3 : 0)
    } catch let error as UsageError {
        fail(error.message, usage: replicateHelp)
    } catch {
        logger.error("\(error)")
        fail("\(error)", usage: nil)
    }
}

final class StopFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    var isSet: Bool { lock.withLock { value } }
    func set() { lock.withLock { value = true } }
}

/// What one pass did: records the destination holds as sent (stored now, or there already),
/// and records not copied because the source's reader or the destination refused them.
struct ReplicationPass {
    var copied = 0
    var refusedAtSource = 0
    var refusedAtDestination = 0
}

/// One pass: every zone of the source (speakers' own zones first, so keys and devices are known
/// before conversations are judged), each from its checkpoint, page by page: assets, then the
/// records, then the checkpoint.
func replicateOnce(_ source: any RecordZoneBackend, _ destination: any RecordZoneBackend, state: inout ReplicationState, statePath: String,
                   only: Set<String>?, logger: Logger, stopping: StopFlag) async throws -> ReplicationPass {
    let zones = ChatSchema.readingOrder(try await source.zones().filter { only?.contains($0.rawValue) ?? true })
    var pass = ReplicationPass()
    for zone in zones where !stopping.isSet {
        var token = state.tokens[zone.rawValue].flatMap(ChangeToken.init(base64:))
        var created = false
        while !stopping.isSet {
            guard let page = try await fetchPage(source, zone, since: token, logger: logger) else {
                token = nil
                continue
            }
            for rejection in page.rejected { logger.warning("not copied (refused at the source): \(rejection.source): \(rejection.reason)") }
            pass.refusedAtSource += page.rejected.count
            if !page.records.isEmpty {
                if !created {
                    try await destination.createZone(zone)
                    created = true
                }
                try await copyAssets(of: page.records, from: source, to: destination, logger: logger)
                for (record, result) in zip(page.records, try await destination.save(page.records)) {
                    switch result {
                    case .success(let winner) where winner.signature == record.signature: pass.copied += 1
                    case .success: break  // the destination holds a newer version
                    case .failure(let error) where error.isTransient: throw error
                    case .failure(let error):
                        logger.warning("not copied (refused at the destination): \(record.id): \(error)")
                        pass.refusedAtDestination += 1
                    }
                }
            }
            token = page.token
            state.tokens[zone.rawValue] = page.token.base64
            try JSONEncoder().encode(state).write(to: URL(fileURLWithPath: statePath), options: .atomic)
            if !page.moreComing { break }
        }
    }
    return pass
}

/// One page of a zone's changes; nil when the token expired (the zone was recreated at the
/// source: it is copied again from the start).
func fetchPage(_ source: any RecordZoneBackend, _ zone: ZoneName, since token: ChangeToken?, logger: Logger) async throws(RecordZoneError) -> ZoneChanges? {
    do throws(RecordZoneError) {
        return try await source.fetchChanges(in: zone, since: token, limit: 400)
    } catch {
        guard error.code == .changeTokenExpired, token != nil else { throw error }
        logger.info("\(zone) was recreated at the source: copying it again from the start")
        return nil
    }
}

/// Copies the assets the records reference (once each) before the records themselves.
func copyAssets(of records: [Record], from source: any RecordZoneBackend, to destination: any RecordZoneBackend, logger: Logger) async throws(RecordZoneError) {
    var references = [AssetReference]()
    for record in records {
        for value in record.fields.values {
            if let reference = value.assetValue, !references.contains(reference) { references.append(reference) }
        }
    }
    for reference in references {
        do throws(RecordZoneError) {
            let data = try await source.asset(reference)
            _ = try await destination.putAsset(data, expected: reference)
        } catch {
            if error.isTransient { throw error }
            logger.warning("asset \(reference) not copied: \(error)")
        }
    }
}
