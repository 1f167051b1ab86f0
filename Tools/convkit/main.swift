// convkit: chat from a terminal and inspect records, tokens, outbox and quarantine, on a store,
// a folder zone or a zone server. Every command is declared once (ToolSupport's Command): its
// help and its parser come from the same declaration. Exit 0, 1 (a failure) or 64 (usage).
import ConversationKit
import Foundation
import RecordZone
import ToolSupport

/// A command and what it runs.
struct ToolCommand: Sendable {
    let command: Command
    let run: @Sendable (Context) async throws -> Void

    init(_ command: Command, run: @escaping @Sendable (Context) async throws -> Void) {
        self.command = command
        self.run = run
    }

    /// The words after `convkit`: `["records", "show"]`.
    var words: [String] { command.path.split(separator: " ").dropFirst().map(String.init) }
}

let version = "0.1.0"
/// The options of `convkit` itself; `--color` goes with every command.
let rootOptions: [Option] = [.flag("version", "Show the version."),
                             .valued("color", "when", "auto (on a terminal, unless NO_COLOR is set), always or never. (default: auto)")]
let commands = ChatCommands.all + GroupCommands.all + [ChatView.command] + InspectCommands.all + [DemoCommand.command] + ShellCommands.all

/// The help of `convkit` itself, or of a group (`convkit records`).
func groupHelp(_ prefix: [String]) -> Command? {
    let members = commands.filter { Array($0.words.prefix(prefix.count)) == prefix && $0.words.count > prefix.count }
    guard !members.isEmpty else { return nil }
    var seen = Set<String>()
    var subcommands = [(name: String, abstract: String)]()
    for member in members {
        let name = member.words[prefix.count]
        guard seen.insert(name).inserted else { continue }
        let exact = member.words.count == prefix.count + 1
        var nested = [String]()
        for other in members where other.words[prefix.count] == name {
            nested.append(other.words.dropFirst(prefix.count + 1).joined(separator: " "))
        }
        let abstract: String = exact ? member.command.overview : "Subcommands: \(nested.joined(separator: ", "))."
        subcommands.append((name, abstract))
    }
    let path = (["convkit"] + prefix).joined(separator: " ")
    let overview = prefix.isEmpty ? "Chat from a terminal, and inspect ConversationKit records, tokens, outbox and quarantine." : "The \(prefix.joined(separator: " ")) commands."
    return Command(path, overview, options: prefix.isEmpty ? rootOptions : [], subcommands: subcommands)
}

func usageFailure(_ message: String, _ command: Command) -> Never {
    exitWithError(message, help: command.help, tool: command.path)
}

var words = Array(CommandLine.arguments.dropFirst())
// --color auto|always|never, anywhere before a `--`, for every command (as git's).
var colorChoice = "auto"
while let index = words.prefix(while: { $0 != "--" }).firstIndex(where: { $0 == "--color" || $0.hasPrefix("--color=") }) {
    let inline = words[index].hasPrefix("--color=") ? String(words[index].dropFirst("--color=".count)) : nil
    let value = inline ?? (index + 1 < words.count ? words[index + 1] : "")
    words.removeSubrange(index...(inline == nil ? min(index + 1, words.count - 1) : index))
    guard ["auto", "always", "never"].contains(value) else {
        exitWithError("--color takes auto, always or never, not '\(value)'", help: groupHelp([])?.help, tool: "convkit")
    }
    colorChoice = value
}
Output.chooseColors(colorChoice)
if words.first == "--version" {
    print(version)
    exit(0)
}
// `convkit help <command…>` is `convkit <command…> --help`.
if words.first == "help" { words = Array(words.dropFirst()) + ["--help"] }

// The longest declared command the words start with.
let match = commands.filter { words.starts(with: $0.words) }.max { $0.words.count < $1.words.count }
guard let match else {
    let wantsHelp = words.last == "--help" || words.last == "-h"
    let path = words.filter { $0 != "--help" && $0 != "-h" }
    let root = groupHelp([]) ?? Command("convkit", "Chat and inspect records.")
    if let group = groupHelp(path) {
        if wantsHelp {
            print(group.help, terminator: "")
            exit(0)
        }
        usageFailure("missing subcommand", group)
    }
    var known = path
    while !known.isEmpty && groupHelp(known) == nil { known.removeLast() }
    usageFailure("unknown subcommand '\(path.dropFirst(known.count).first ?? "")'", groupHelp(known) ?? root)
}

let parsed: ParsedArguments
do throws(UsageError) {
    parsed = try match.command.parse(Array(words.dropFirst(match.words.count)))
} catch {
    usageFailure(error.message, match.command)
}
if parsed.has("help") {
    print(match.command.help, terminator: "")
    exit(0)
}
do {
    try await match.run(Context(arguments: parsed))
    exit(0)
} catch let error as UsageError {
    usageFailure(error.message, match.command)
} catch let error as ToolFailure {
    exitWithError(error.message, help: nil, tool: match.command.path)
} catch {
    exitWithError("\(error)", help: nil, tool: match.command.path)
}
