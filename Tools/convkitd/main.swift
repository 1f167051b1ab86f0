// convkitd: the ConversationKit daemon. `serve` hosts record zones over HTTP; `replicate` copies
// zones between two backends; `migrate` moves a SQLite server into PostgreSQL; `sync` (a store kept
// in step, continuously) runs convkitd-sync, so that this executable does not link the store.
import ChatSchema
import Foundation
import RecordZone
import ToolSupport
import ZoneServer

let version = "0.1.0"

let serveCommand = Command(
    "convkitd serve", "Serve record zones over HTTP (API v1) from a data directory or a PostgreSQL database.",
    discussion: """
        Requests are signed with the speaker's Ed25519 key; the speakers zone is readable by every
        speaker and each conversation zone by its participants only. Stops cleanly on SIGINT or
        SIGTERM: in-flight requests finish, the database is closed.

        With --storage, any number of servers on one PostgreSQL database serve as one: tokens,
        key bindings and replay protection are shared, and a long poll on one server wakes when a
        write lands through another. Rate limits are kept per server.
        """,
    synopsis: "(--data <dir> | --storage <postgres-url>) [--listen <host:port>] [<options>]",
    options: [
        .valued("data", "dir", "The data directory: the SQLite database and assets (one server)."),
        .valued("storage", "url", "A PostgreSQL database (postgres://user@host/db, or libpq's key=value form) shared by several servers."),
        .valued("pool-size", "n", "Connections to PostgreSQL this server opens at most (with --storage). (default: 8)"),
        .valued("listen", "host:port", "The address (IPv4, [IPv6] or a host name) and port to listen on; port 0 picks a free port. (default: 127.0.0.1:8080)"),
        .valued("operator-listen", "host:port", "Also serve GET /healthz and GET /metrics, and nothing else, on this address (loopback or a management network), with connections of its own that clients cannot take."),
        .valued("log-level", "level", "trace, debug, info, notice, warning, error or critical; debug logs one line per request. (default: info)"),
        .valued("max-body-bytes", "n", "The largest request body. (default: 50331648)"),
        .valued("max-connections", "n", "The most connections at once (the descriptor limit is raised to fit, up to the hard limit). (default: 16384)"),
        .valued("connection-timeout", "seconds", "Close a connection idle this long. (default: 15)"),
        .valued("rate-limit", "n", "Requests per second per key, sustained; bursts of ten times that. (default: 1000)"),
        .valued("max-wait", "seconds", "The longest long poll a client may ask for. (default: 60)"),
        .valued("tls-cert", "file", "Serve HTTPS with this certificate (PEM; with --tls-key)."),
        .valued("tls-key", "file", "The certificate's private key (PEM)."),
        .flag("console", "Serve the operator's console at /console/ (a sign-in token is printed at start, unless --console-token-file gives it)."),
        .valued("console-token-file", "file", "With --console: the sign-in token, read from this file (at least 32 characters; not printed)."),
        .valued("replicator", "identity=key", "A peer's replicator (convkitd replicate; the identity starts with _, the public key in hex) that may read and write every zone — every record it saves is still checked.", repeats: true),
    ])

let completionsCommand = Command("convkitd completions", "Print a completion script for bash, zsh or fish.",
                                 discussion: "bash: source <(convkitd completions bash); zsh: source <(convkitd completions zsh); fish: convkitd completions fish | source.",
                                 positionals: [Positional("shell", "bash, zsh or fish.")])
let manCommand = Command("convkitd man", "Print convkitd's manual page (roff), every command in it.",
                         options: [.valued("date", "yyyy-mm-dd", "The page's date. (default: today)")])

func printCompletions(_ arguments: ParsedArguments) throws {
    let shell = arguments.positional(0) ?? ""
    guard let script = tool.commandSet.completionScript(for: shell) else { throw UsageError("no completions for '\(shell)': bash, zsh or fish") }
    FileHandle.standardOutput.write(Data(script.utf8))
}

func printManual(_ arguments: ParsedArguments) throws {
    let date = try CommandSet.pageDate(arguments.value("date"))
    FileHandle.standardOutput.write(Data(tool.commandSet.manualPage(version: version, date: date, sections: [
        ("Signals", ["SIGINT and SIGTERM stop a server or a sync daemon cleanly: requests in flight finish, long polls are answered, the database is closed."]),
        ("Exit status", ["0 on success, 1 on a failure (the error on standard error), 64 on a usage error (with the command's usage line)."]),
        ("See also", ["convkit(1); docs/SERVER.md and docs/PROTOCOL.md in the ConversationKit sources."]),
    ]).utf8))
}

let serveHelp = serveCommand.help

func fail(_ message: String, usage: String?) -> Never {
    exitWithError(message, help: usage, tool: "convkitd")
}

/// `host:port`, `[IPv6]:port` or `name:port`.
func hostAndPort(_ address: String, option: String) throws(UsageError) -> (host: String, port: Int) {
    guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]), (0...65535).contains(port) else {
        throw UsageError("--\(option) takes <host:port>, e.g. 127.0.0.1:8080, [::]:8443 or example.org:8080")
    }
    var host = String(address[..<colon])
    if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }  // [::]:8443
    return (host, port)
}

func serve(_ arguments: ParsedArguments) async {
    let listen: (host: String, port: Int)
    let operatorListen: (host: String, port: Int)?
    let configuration: ZoneServerConfiguration
    let storageChoice: StorageChoice
    do throws(UsageError) {
        storageChoice = try StorageChoice(arguments)
        listen = try hostAndPort(arguments.value("listen") ?? "127.0.0.1:8080", option: "listen")
        operatorListen = try arguments.value("operator-listen").map { address throws(UsageError) in try hostAndPort(address, option: "operator-listen") }
        var settings = ZoneServerConfiguration()
        let levelName = arguments.value("log-level") ?? "info"
        guard let level = Logger.Level(name: levelName) else { throw UsageError("unknown log level '\(levelName)'") }
        settings.logger = Logger(label: "convkitd", level: level)
        settings.limits.maximumBodyBytes = try arguments.int("max-body-bytes", default: settings.limits.maximumBodyBytes, range: 1024...(1 << 30))
        settings.limits.maximumConnections = UInt32(try arguments.int("max-connections", default: Int(settings.limits.maximumConnections), range: 1...100_000))
        settings.limits.connectionTimeoutSeconds = UInt32(try arguments.int("connection-timeout", default: Int(settings.limits.connectionTimeoutSeconds), range: 1...3600))
        settings.requestsPerSecond = Double(try arguments.int("rate-limit", default: Int(settings.requestsPerSecond), range: 1...1_000_000))
        settings.burst = settings.requestsPerSecond * 10
        settings.maximumWait = .seconds(try arguments.int("max-wait", default: 60, range: 0...3600))
        guard (arguments.value("tls-cert") == nil) == (arguments.value("tls-key") == nil) else {
            throw UsageError("--tls-cert and --tls-key go together")
        }
        for entry in arguments.all("replicator") {
            let parts = entry.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, parts[0].hasPrefix("_"), parts[0].count > 1, let key = Data(hexString: parts[1]), key.count == 32 else {
                throw UsageError("--replicator takes <identity>=<public key hex>, the identity starting with _ (as convkitd replicate prints it)")
            }
            settings.replicators[parts[0]] = key
        }
        if arguments.has("console") {
            var console = ConsoleSettings(token: ConsoleSettings.randomToken())
            if let file = arguments.value("console-token-file") {
                guard let data = FileManager.default.contents(atPath: file) else { throw UsageError("--console-token-file: cannot read \(file)") }
                console.token = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
                guard console.token.count >= 32 else { throw UsageError("--console-token-file: the token is at least 32 characters") }
            }
            console.secure = arguments.value("tls-cert") != nil
            settings.console = console
        } else if arguments.value("console-token-file") != nil {
            throw UsageError("--console-token-file goes with --console")
        }
        configuration = settings
    } catch {
        fail(error.message, usage: serveHelp)
    }

    let logger = configuration.logger
    signal(SIGPIPE, SIG_IGN)  // a client that goes away mid-answer must not stop the server
    let server: ZoneServer
    do {
        let storage = try await storageChoice.open()
        server = ZoneServer(storage: storage, access: ChatZoneAccess(), configuration: configuration)
        let tls = try arguments.value("tls-cert").map { certificate throws(RecordZoneError) in
            try TLSIdentity(certificateFile: certificate, keyFile: arguments.value("tls-key") ?? "")
        }
        try server.start(host: listen.host, port: listen.port, tls: tls)
        if let operatorListen { try server.startOperator(host: operatorListen.host, port: operatorListen.port) }
        if let console = configuration.console {
            let scheme = console.secure ? "https" : "http"
            let shown = listen.host.contains(":") ? "[\(listen.host)]" : listen.host
            let token = arguments.value("console-token-file") == nil ? ", sign in with the token \(console.token)" : ", sign in with the token in \(arguments.value("console-token-file") ?? "")"
            FileHandle.standardError.write(Data("console: \(scheme)://\(shown):\(server.port)/console/\(token)\n".utf8))
        }
    } catch {
        logger.error("cannot start: \(error)")
        fail("\(error)", usage: nil)
    }

    // SIGINT and SIGTERM stop the server cleanly.
    let (signals, sources) = stopSignals()
    for await number in signals {
        logger.info("received \(number == SIGINT ? "SIGINT" : "SIGTERM"), stopping")
        break
    }
    await server.stop()
    sources.forEach { $0.cancel() }
    exit(0)
}

/// `convkitd sync` is convkitd-sync, beside this executable: the store it needs is not linked
/// into the server. Replaces this process with it (exec), so signals and the exit status are its.
func runSyncDaemon(_ rawArguments: [String]) -> Never {
    let here = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
    let path = here.deletingLastPathComponent().appendingPathComponent("convkitd-sync").path
    guard FileManager.default.isExecutableFile(atPath: path) else {
        fail("convkitd sync runs convkitd-sync, which is not beside convkitd (\(path)): install both (scripts/install.sh)", usage: nil)
    }
    let argv = ([path] + rawArguments).map { strdup($0) } + [nil]
    execv(path, argv)
    fail("cannot run \(path): \(String(cString: strerror(errno)))", usage: nil)
}

/// The commands, run by ToolSupport's Dispatcher (convkit's too).
let tool = Dispatcher(tool: "convkitd", overview: "the ConversationKit daemon: serves record zones over HTTP, keeps stores in step", version: version,
                      subcommands: [Subcommand(serveCommand) { await serve($0) },
                                    Subcommand(DaemonCommands.sync, words: { runSyncDaemon($0) }),
                                    Subcommand(replicateCommand) { await replicate($0) },
                                    Subcommand(migrateCommand) { await migrate($0) },
                                    Subcommand(completionsCommand) { try printCompletions($0) },
                                    Subcommand(manCommand) { try printManual($0) }])
await tool.run(Array(CommandLine.arguments.dropFirst()))
