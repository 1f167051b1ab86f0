// convkitd-sync: `convkitd sync` — keeps a store in step with a folder zone or a zone server,
// continuously. Its own executable so that convkitd, the server, does not link the store;
// convkitd runs it (exec) for `convkitd sync`.
import ConversationKit
import Foundation
import RecordZone
import ToolSupport

let syncCommand = DaemonCommands.sync

let syncHelp = syncCommand.help

func fail(_ message: String, usage: String?) -> Never {
    exitWithError(message, help: usage, tool: "convkitd")
}

func sync(_ rawArguments: [String]) async {
    let arguments = parseOrExit(rawArguments, syncCommand, tool: "convkitd")
    let backend: BackendFactory
    let logger: Logger
    let pollInterval: Int
    do throws(UsageError) {
        let levelName = arguments.value("log-level") ?? "info"
        guard let level = Logger.Level(name: levelName) else { throw UsageError("unknown log level '\(levelName)'") }
        logger = Logger(label: "convkitd sync", level: level)
        pollInterval = try arguments.int("poll-interval", default: 1, range: 1...3600)
        guard let store = arguments.value("store") else { throw UsageError("--store is required") }
        // The options' backend, else the one `convkit init` saved in the store.
        let saved = StoreSettings.load(fromStore: store)
        let given = (arguments.value("zone-dir"), arguments.value("server"))
        let (folder, server) = given == (nil, nil) ? (saved.zoneDir, saved.server) : given
        switch (folder, server) {
        case (let folder?, nil):
            let label = arguments.value("device") ?? (given.0 == nil ? saved.device : nil)
                ?? ProcessInfo.processInfo.hostName.split(separator: ".").first.map(String.init) ?? "device"
            backend = .folder(folder, device: label)
        case (nil, let server?):
            guard let url = URL(string: server), url.scheme == "http" || url.scheme == "https", url.host != nil else {
                throw UsageError("--server takes an http:// or https:// URL")
            }
            backend = .server(url)
        case (nil, nil):
            throw UsageError("\(store) has no saved backend ('convkit init' saves one): give --zone-dir or --server")
        default:
            throw UsageError("give one of --zone-dir and --server")
        }
    } catch {
        fail(error.message, usage: syncHelp)
    }
    let storePath = arguments.value("store") ?? ""
    let store: ConversationStore
    do {
        store = try ConversationStore(directory: storePath, backend: backend)
        if store.localSpeakerIdentifier == nil {
            guard let identifier = arguments.value("identifier") else {
                fail("the store \(storePath) has no local speaker: set one up (--identifier)", usage: nil)
            }
            try await store.setupLocalSpeaker(identifier: identifier, name: identifier)
        }
    } catch {
        fail("\(error)", usage: nil)
    }
    logger.info("syncing \(storePath) as \(store.localSpeakerIdentifier ?? "?")")
    let events = store.events()
    let printer = Task {
        for await event in events {
            switch event {
            case .messageAdded(let id): logger.info("message added \(id.conversation)/\(id.name)")
            case .messageChanged(let id): logger.info("message changed \(id.conversation)/\(id.name)")
            case .syncStateChanged(let id): logger.debug("sync state changed \(id.conversation)/\(id.name)")
            case .speakerUpdated(let identifier): logger.info("speaker updated \(identifier)")
            case .speakerFound(let identifier): logger.info("speaker found \(identifier)")
            case .conversationChanged(let zone): logger.debug("conversation changed \(zone)")
            case .syncActivity(.synced(let report)):
                logger.info("synced pushed=\(report.pushed) pulled=\(report.pulled) failed=\(report.failed) deferred=\(report.deferred) quarantined=\(report.quarantined)")
            case .syncActivity(.unreachable(let why)): logger.warning("backend unreachable, backing off: \(why)")
            case .syncActivity(.notAccepted(let code, let why)): logger.error("the backend does not accept this device (\(code.rawValue)): \(why)")
            case .syncActivity(.reachable): logger.info("backend reachable again")
            case .reset: logger.warning("this log fell behind the store's events; some were not logged")
            }
        }
    }
    signal(SIGPIPE, SIG_IGN)
    let running = Task { try await store.run(pollInterval: .seconds(pollInterval)) }
    // SIGINT and SIGTERM stop it cleanly: the round in progress ends, the store is closed.
    let (signals, sources) = stopSignals()
    let stopper = Task {
        for await number in signals {
            logger.info("received \(number == SIGINT ? "SIGINT" : "SIGTERM"), stopping")
            running.cancel()
            break
        }
    }
    let outcome = await running.result
    stopper.cancel()
    printer.cancel()
    sources.forEach { $0.cancel() }
    if case .failure(let error) = outcome {
        logger.error("stopped: \(error)")
        fail("\(error)", usage: nil)
    }
    logger.info("stopped")
    exit(0)
}

let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.contains("-h") || arguments.contains("--help") {
    print(syncHelp, terminator: "")
    exit(0)
}
await sync(arguments)
