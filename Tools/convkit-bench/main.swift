// convkit-bench: measures ConversationKit against the raw limits of libsodium and the disk,
// in one run on one machine, and prints each rate beside its raw limit and the ratio.
//
//     swift run -c release convkit-bench [--seconds 1.0] [--json]
import Foundation

struct Options {
    var seconds = 1.0
    var json = false
    var sections: Set<String> = ["records", "store", "server", "registration", "images"]
    var identities = [1_000, 100_000]
    var messages = 1_000_000
}

func parseOptions() -> Options {
    var options = Options()
    var args = CommandLine.arguments.dropFirst()
    while let arg = args.popFirst() {
        switch arg {
        case "--seconds":
            guard let value = args.popFirst().flatMap(Double.init), value > 0 else { usageError("--seconds takes a positive number") }
            options.seconds = value
        case "--json": options.json = true
        case "--only":
            guard let section = args.popFirst(), ["records", "store", "server", "registration", "images"].contains(section) else {
                usageError("--only takes records, store, server, registration or images")
            }
            options.sections = [section]
        case "--messages":
            guard let value = args.popFirst().flatMap(Int.init), value >= 1000 else { usageError("--messages takes a number of at least 1000") }
            options.messages = value
        case "--identities":
            let values = args.popFirst()?.split(separator: ",").compactMap { Int($0) } ?? []
            guard !values.isEmpty, values.allSatisfy({ $0 >= 0 }) else { usageError("--identities takes counts separated by commas, e.g. 1000,100000") }
            options.identities = values
        case "-h", "--help":
            print("""
                OVERVIEW: Measure ConversationKit against raw libsodium and disk limits on this machine.

                USAGE: convkit-bench [--seconds <s>] [--only records|store|server|registration|images] [--messages <n>] [--identities <n,n>] [--json]

                OPTIONS:
                  --seconds <s>     Time spent on each measurement (default 1.0).
                  --only <section>  Run one section: records, store, server, registration or images.
                  --messages <n>    Messages in the store for the newest-50 query (default 1000000).
                  --identities <n,n>
                                    Identities the server holds before registration and a tag query are measured
                                    (default 1000,100000).
                  --json            Print the results as JSON.
                  -h, --help        Show help information.
                """)
            exit(0)
        default: usageError("unknown option '\(arg)'")
        }
    }
    return options
}

func usageError(_ message: String) -> Never {
    FileHandle.standardError.write(Data("Error: \(message)\nUSAGE: convkit-bench [--seconds <s>] [--only records|store|server|registration|images] [--messages <n>] [--identities <n,n>] [--json]\n".utf8))
    exit(64)
}

let options = parseOptions()
let reporter = Reporter(json: options.json)
reporter.note("convkit-bench: \(String(format: "%.1f", options.seconds)) s per measurement, \(ProcessInfo.processInfo.activeProcessorCount) cores")
do {
    if options.sections.contains("records") { try await recordBench(reporter, seconds: options.seconds) }
    if options.sections.contains("store") { try await storeBench(reporter, seconds: options.seconds, messageCount: options.messages) }
    if options.sections.contains("server") {
        try await serverBench(reporter, seconds: options.seconds)
        try await serverMemoryBench(reporter)
        try await liveMessageBench(reporter)
    }
    if options.sections.contains("registration") { try await registrationBench(reporter, seconds: options.seconds, existing: options.identities) }
    if options.sections.contains("images") { try imageBench(reporter, seconds: options.seconds) }
    try reporter.finish()
} catch {
    FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
    exit(1)
}
