// convkit: chat from a terminal and inspect records, tokens, outbox and quarantine, on a store,
// a folder zone or a zone server. Every command is declared once (ToolSupport's Command): its
// help and its parser come from the same declaration, and ToolSupport's Dispatcher (convkitd's
// too) runs it. Exit 0, 1 (a failure) or 64 (usage).
import ConversationKit
import Foundation
import RecordZone
import ToolSupport

/// A convkit command: what it runs takes the ``Context`` its parsed arguments make.
typealias ToolCommand = Subcommand

extension Subcommand {
    init(_ command: Command, run: @escaping @Sendable (Context) async throws -> Void) {
        self.init(command) { (arguments: ParsedArguments) in try await run(Context(arguments: arguments)) }
    }
}

let version = "0.1.0"
let tool = Dispatcher(tool: "convkit", overview: "chat from a terminal, and inspect ConversationKit records, tokens, outbox and quarantine",
                      version: version,
                      subcommands: ChatCommands.all + GroupCommands.all + [ChatView.command] + InspectCommands.all + [DemoCommand.command] + ShellCommands.all,
                      rootOptions: [.valued("color", "when", "auto (on a terminal, unless NO_COLOR is set), always or never. (default: auto)")])

var words = Array(CommandLine.arguments.dropFirst())
// --color auto|always|never, anywhere before a `--`, for every command (as git's).
var colorChoice = "auto"
while let index = words.prefix(while: { $0 != "--" }).firstIndex(where: { $0 == "--color" || $0.hasPrefix("--color=") }) {
    let inline = words[index].hasPrefix("--color=") ? String(words[index].dropFirst("--color=".count)) : nil
    let value = inline ?? (index + 1 < words.count ? words[index + 1] : "")
    words.removeSubrange(index...(inline == nil ? min(index + 1, words.count - 1) : index))
    guard ["auto", "always", "never"].contains(value) else {
        exitWithError("--color takes auto, always or never, not '\(value)'", help: tool.groupHelp([])?.help, tool: "convkit")
    }
    colorChoice = value
}
Output.chooseColors(colorChoice)
await tool.run(words)
