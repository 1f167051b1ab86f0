// convkitd: the ConversationKit daemon. `serve` hosts record zones over HTTP.
import ConversationKit
import Foundation
import RecordZone
import ToolSupport
import ZoneServer

let version = "0.1.0"

let mainHelp = """
    OVERVIEW: The ConversationKit daemon: serves record zones over HTTP.

    USAGE: convkitd <subcommand>

    OPTIONS:
      --version               Show the version.
      -h, --help              Show help information.

    SUBCOMMANDS:
      serve                   Serve record zones over HTTP from a data directory.

      See 'convkitd help <subcommand>' for detailed help.

    """

let serveHelp = """
    OVERVIEW: Serve record zones over HTTP (API v1) from a data directory.

    Requests are signed with the speaker's Ed25519 key; the speakers zone is readable by every
    speaker and each conversation zone by its participants only. Stops cleanly on SIGINT or
    SIGTERM: in-flight requests finish, the database is closed.

    USAGE: convkitd serve --data <dir> [--listen <host:port>] [options]

    OPTIONS:
      --data <dir>            The data directory: the SQLite database and assets (required).
      --listen <host:port>    The address (IPv4, [IPv6] or a host name) and port to listen
                              on; port 0 picks a free port. (default: 127.0.0.1:8080)
      --log-level <level>     trace, debug, info, notice, warning, error or critical; debug
                              logs one line per request. (default: info)
      --max-body-bytes <n>    The largest request body. (default: 50331648)
      --max-connections <n>   The most connections at once. (default: 512)
      --connection-timeout <seconds>
                              Close a connection idle this long. (default: 15)
      --rate-limit <n>        Requests per second per key, sustained; bursts of ten times
                              that. (default: 1000)
      --max-wait <seconds>    The longest long poll a client may ask for. (default: 60)
      --tls-cert <file>       Serve HTTPS with this certificate (PEM; with --tls-key).
      --tls-key <file>        The certificate's private key (PEM).
      -h, --help              Show help information.

    """

func fail(_ message: String, usage: String?) -> Never {
    exitWithError(message, help: usage, tool: "convkitd")
}

func serve(_ rawArguments: [String]) async {
    let arguments: Arguments
    let listen: (host: String, port: Int)
    let configuration: ZoneServerConfiguration
    let data: String
    do throws(UsageError) {
        arguments = try Arguments(rawArguments, valued: ["data", "listen", "log-level", "max-body-bytes", "max-connections", "connection-timeout", "rate-limit", "max-wait",
                                                                   "tls-cert", "tls-key"], flags: [])
        if arguments.flags.contains("help") {
            print(serveHelp, terminator: "")
            exit(0)
        }
        guard let directory = arguments.values["data"] else { throw UsageError("--data is required") }
        data = directory
        let address = arguments.values["listen"] ?? "127.0.0.1:8080"
        guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]), (0...65535).contains(port) else {
            throw UsageError("--listen takes <host:port>, e.g. 127.0.0.1:8080, [::]:8443 or example.org:8080")
        }
        var host = String(address[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }  // [::]:8443
        listen = (host, port)
        var settings = ZoneServerConfiguration()
        let levelName = arguments.values["log-level"] ?? "info"
        guard let level = Logger.Level(name: levelName) else { throw UsageError("unknown log level '\(levelName)'") }
        settings.logger = Logger(label: "convkitd", level: level)
        settings.limits.maximumBodyBytes = try arguments.int("max-body-bytes", default: settings.limits.maximumBodyBytes, range: 1024...(1 << 30))
        settings.limits.maximumConnections = UInt32(try arguments.int("max-connections", default: Int(settings.limits.maximumConnections), range: 1...100_000))
        settings.limits.connectionTimeoutSeconds = UInt32(try arguments.int("connection-timeout", default: Int(settings.limits.connectionTimeoutSeconds), range: 1...3600))
        settings.requestsPerSecond = Double(try arguments.int("rate-limit", default: Int(settings.requestsPerSecond), range: 1...1_000_000))
        settings.burst = settings.requestsPerSecond * 10
        settings.maximumWait = .seconds(try arguments.int("max-wait", default: 60, range: 0...3600))
        guard (arguments.values["tls-cert"] == nil) == (arguments.values["tls-key"] == nil) else {
            throw UsageError("--tls-cert and --tls-key go together")
        }
        configuration = settings
    } catch {
        fail(error.message, usage: serveHelp)
    }

    let logger = configuration.logger
    signal(SIGPIPE, SIG_IGN)  // a client that goes away mid-answer must not stop the server
    let server: ZoneServer
    do {
        let storage = try SQLiteBackend(directory: data, policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
        server = ZoneServer(storage: storage, access: ChatZoneAccess(), configuration: configuration)
        let tls = try arguments.values["tls-cert"].map { certificate throws(RecordZoneError) in
            try TLSIdentity(certificateFile: certificate, keyFile: arguments.values["tls-key"] ?? "")
        }
        try server.start(host: listen.host, port: listen.port, tls: tls)
    } catch {
        logger.error("cannot start: \(error)")
        fail("\(error)", usage: nil)
    }

    // SIGINT and SIGTERM stop the server cleanly.
    let (signals, continuation) = AsyncStream<Int32>.makeStream()
    var sources = [DispatchSourceSignal]()
    for number in [SIGINT, SIGTERM] {
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler { continuation.yield(number) }
        source.resume()
        sources.append(source)
    }
    for await number in signals {
        logger.info("received \(number == SIGINT ? "SIGINT" : "SIGTERM"), stopping")
        break
    }
    await server.stop()
    sources.forEach { $0.cancel() }
    exit(0)
}

var arguments = Array(CommandLine.arguments.dropFirst())
switch arguments.first {
case nil:
    FileHandle.standardError.write(Data("Error: missing subcommand\n\n\(mainHelp)".utf8))
    exit(64)
case "-h", "--help":
    print(mainHelp, terminator: "")
case "--version":
    print(version)
case "help":
    switch arguments.dropFirst().first {
    case nil: print(mainHelp, terminator: "")
    case "serve": print(serveHelp, terminator: "")
    case let other?: fail("unknown subcommand '\(other)'", usage: mainHelp)
    }
case "serve":
    await serve(Array(arguments.dropFirst()))
case let other?:
    fail("unknown subcommand '\(other)'", usage: mainHelp)
}
