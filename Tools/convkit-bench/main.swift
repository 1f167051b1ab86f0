// convkit-bench: measures ConversationKit against the raw limits of libsodium and the disk,
// in one run on one machine, and prints each rate beside its raw limit and the ratio.
//
//     swift run -c release convkit-bench [--seconds 1.0] [--json]
import Foundation
import ToolSupport

struct Options {
    var seconds = 1.0
    var json = false
    var sections: Set<String> = ["records", "encryption", "store", "files", "groups", "server", "registration", "images", "console"]
    var identities = [1_000, 100_000]
    var messages = 1_000_000
    var history = 100_000
    /// A PostgreSQL cluster for the `postgres` section (scripts/bench.sh starts a private one).
    var postgres: String?
    var largeZone = 1_000_000
    var capacity = CapacityOptions()
}

let command = Command(
    "convkit-bench", "Measure ConversationKit against raw libsodium and disk limits on this machine.",
    options: [
        .valued("seconds", "s", "Time spent on each measurement. (default: 1.0)"),
        .valued("only", "section", "Run one section: records, encryption, store, files, groups, server, registration, images, console, postgres, or capacity, firstsync or senders (these three run only when asked for)."),
        .valued("clients", "n", "capacity: clients online, each holding a stream. (default: 10000)"),
        .flag("long-polls", "capacity: each client holds long polls instead of a stream (as stores before streams did)."),
        .valued("rate", "n", "capacity: messages per second, all senders together. (default: 1000)"),
        .valued("senders", "n", "capacity: senders, each sending one message at a time. (default: 10)"),
        .valued("churn", "share", "capacity: the share of clients (0 to 1) that reconnect every 2-4 s. (default: 0)"),
        .valued("window", "s", "capacity: how long the senders send. (default: 30)"),
        .valued("postgres", "conninfo", "A PostgreSQL cluster whose role may create databases: adds the postgres section (scripts/bench.sh starts one)."),
        .valued("large-zone", "n", "Records in the large zone of the postgres section. (default: 1000000)"),
        .valued("messages", "n", "Messages in the store for the newest-50 query. (default: 1000000)"),
        .valued("history", "n", "firstsync: messages in the history a new device syncs. (default: 100000)"),
        .valued("identities", "n,n", "Identities the server holds before registration and a tag query are measured. (default: 1000,100000)"),
        .flag("json", "Print the results as JSON."),
        .valued("probe-first-sync", "spec", "Used by the bench itself: time a new process's first save and sync on a folder."),
    ])

func parseOptions() -> Options {
    let parsed = parseOrExit(Array(CommandLine.arguments.dropFirst()), command, tool: "convkit-bench")
    var options = Options()
    do throws(UsageError) {
        if let text = parsed.value("seconds") {
            guard let value = Double(text), value > 0 else { throw UsageError("--seconds takes a positive number") }
            options.seconds = value
        }
        options.json = parsed.has("json")
        options.postgres = parsed.value("postgres")
        if options.postgres != nil { options.sections.insert("postgres") }
        options.largeZone = try parsed.int("large-zone", default: options.largeZone, range: 10_000...100_000_000)
        if let section = parsed.value("only") {
            guard ["records", "encryption", "store", "files", "groups", "server", "registration", "images", "console", "postgres", "capacity", "firstsync", "senders"].contains(section) else {
                throw UsageError("--only takes records, encryption, store, files, groups, server, registration, images, console, postgres, capacity, firstsync or senders")
            }
            guard section != "postgres" || options.postgres != nil else { throw UsageError("--only postgres needs --postgres <conninfo>") }
            options.sections = [section]
        }
        options.capacity.streams = !parsed.has("long-polls")
        options.capacity.clients = try parsed.int("clients", default: options.capacity.clients, range: 10...100_000)
        options.capacity.rate = try parsed.int("rate", default: options.capacity.rate, range: 1...100_000)
        options.capacity.senders = try parsed.int("senders", default: options.capacity.senders, range: 1...1_000)
        if let text = parsed.value("churn") {
            guard let value = Double(text), (0...1).contains(value) else { throw UsageError("--churn takes a share from 0 to 1, e.g. 0.2") }
            options.capacity.churn = value
        }
        if let text = parsed.value("window") {
            guard let value = Double(text), value > 0 else { throw UsageError("--window takes a positive number of seconds") }
            options.capacity.window = value
        }
        options.messages = try parsed.int("messages", default: options.messages, range: 1000...Int.max)
        options.history = try parsed.int("history", default: options.history, range: 55...10_000_000)
        if let text = parsed.value("identities") {
            let values = text.split(separator: ",").compactMap { Int($0) }
            guard !values.isEmpty, values.allSatisfy({ $0 >= 0 }) else { throw UsageError("--identities takes counts separated by commas, e.g. 1000,100000") }
            options.identities = values
        }
    } catch {
        exitWithError(error.message, help: command.help, tool: "convkit-bench")
    }
    return options
}

if let index = CommandLine.arguments.firstIndex(of: "--probe-first-sync"), index + 1 < CommandLine.arguments.count {
    do {
        try await probeFirstSync(CommandLine.arguments[index + 1])
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
        exit(1)
    }
}
let options = parseOptions()
let reporter = Reporter(json: options.json)
reporter.note("convkit-bench: \(String(format: "%.1f", options.seconds)) s per measurement, \(ProcessInfo.processInfo.activeProcessorCount) cores")
do {
    if options.sections.contains("records") { try await recordBench(reporter, seconds: options.seconds) }
    if options.sections.contains("encryption") { try encryptionBench(reporter, seconds: options.seconds) }
    if options.sections.contains("store") { try await storeBench(reporter, seconds: options.seconds, messageCount: options.messages) }
    if options.sections.contains("files") { try await fileBench(reporter) }
    if options.sections.contains("server") {
        try await serverBench(reporter, seconds: options.seconds)
        try await serverMemoryBench(reporter)
        try await liveMessageBench(reporter)
    }
    if options.sections.contains("registration") { try await registrationBench(reporter, seconds: options.seconds, existing: options.identities) }
    if options.sections.contains("capacity") { try await capacityBench(reporter, options.capacity) }
    if options.sections.contains("firstsync") { try await firstSyncBench(reporter, seconds: options.seconds, history: options.history) }
    if options.sections.contains("senders") { try await sendersBench(reporter, seconds: options.seconds) }
    if options.sections.contains("groups") { try await groupBench(reporter, seconds: options.seconds) }
    if options.sections.contains("images") { try imageBench(reporter, seconds: options.seconds) }
    if options.sections.contains("console") { try await consoleBench(reporter, seconds: options.seconds) }
    if options.sections.contains("postgres"), let conninfo = options.postgres {
        try await postgresBench(reporter, seconds: options.seconds, conninfo: conninfo, largeZone: options.largeZone)
    }
    try reporter.finish()
} catch {
    FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
    exit(1)
}
