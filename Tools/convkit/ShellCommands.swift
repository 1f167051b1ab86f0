import Foundation
import ToolSupport

/// `convkit completions` and `convkit man`: generated from the same declarations as the
/// parser and the help, so they never drift from what the tool accepts.
enum ShellCommands {
    static let all = [
        ToolCommand(Command("convkit completions", "Print a completion script for bash, zsh or fish.",
                            discussion: """
                                bash: source <(convkit completions bash), or save it as
                                ~/.local/share/bash-completion/completions/convkit. zsh: source <(convkit completions zsh).
                                fish: convkit completions fish > ~/.config/fish/completions/convkit.fish.
                                """,
                            positionals: [Positional("shell", "bash, zsh or fish.")]), run: completions),
        ToolCommand(Command("convkit man", "Print convkit's manual page (roff), every command in it.",
                            discussion: "Read it with: convkit man | man -l -   or install it as man1/convkit.1.",
                            options: [.valued("date", "yyyy-mm-dd", "The page's date. (default: today)")]), run: manual),
    ]

    static var set: CommandSet { tool.commandSet }

    static func completions(_ context: Context) async throws {
        let shell = context.arguments.positional(0) ?? ""
        guard let script = set.completionScript(for: shell) else {
            throw UsageError("no completions for '\(shell)': bash, zsh or fish")
        }
        Output.text(script)
    }

    static func manual(_ context: Context) async throws {
        let date = try CommandSet.pageDate(context.arguments.value("date"))
        Output.text(set.manualPage(version: version, date: date, sections: [
            ("Environment", [
                "CONVKIT_STORE: the store a command uses when --store is not given.",
                "NO_COLOR: when set and not empty, no text attributes (bold, dim) unless --color always asks for them (no-color.org).",
                "XDG_DATA_HOME: without either, the store is $XDG_DATA_HOME/convkit/store (~/.local/share/convkit/store).",
            ]),
            ("Files", ["<store>/convkit.json: the backend and speaker 'convkit init' chose (mode 0600). <store>/speaker.key: the speaker's signing key."]),
            ("Exit status", ["0 on success, 1 on a failure (the error on standard error), 64 on a usage error (with the command's usage line)."]),
            ("See also", ["convkitd(1); docs/CLI.md and docs/PROTOCOL.md in the ConversationKit sources."]),
        ]))
    }
}
