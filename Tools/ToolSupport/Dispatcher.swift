import Foundation

/// What a command does when the tool fails it for a reason that is not the caller's usage: exit
/// 1 with the message (the usage line is not shown).
public struct ToolFailure: Error {
    public let message: String
    public init(_ message: String) { self.message = message }
}

/// One command of a tool and what it runs.
public struct Subcommand: Sendable {
    public enum Run: Sendable {
        /// Runs with the arguments parsed from the declaration (`--help` already answered).
        case parsed(@Sendable (ParsedArguments) async throws -> Void)
        /// Runs with the words as given (a command another executable parses: `convkitd sync`).
        case words(@Sendable ([String]) async -> Void)
    }

    public let command: Command
    public let run: Run

    public init(_ command: Command, run: @escaping @Sendable (ParsedArguments) async throws -> Void) {
        self.command = command
        self.run = .parsed(run)
    }

    public init(_ command: Command, words run: @escaping @Sendable ([String]) async -> Void) {
        self.command = command
        self.run = .words(run)
    }

    /// The words after the tool's name: `["records", "show"]`.
    public var words: [String] { command.path.split(separator: " ").dropFirst().map(String.init) }
}

/// The one dispatcher of `convkit` and `convkitd`: `--version`, `--help`, `help <command…>`, the
/// longest declared command the words start with, a group's help for a prefix (`convkit
/// records`), and the exit statuses: 0, 1 with the message for a failure, 64 with the command's
/// usage line for a usage error — swift-argument-parser's shape, without its package.
public struct Dispatcher: Sendable {
    public let tool: String
    public let overview: String
    public let version: String
    public let subcommands: [Subcommand]
    /// The options of the tool itself (shown in its help and manual page).
    public let rootOptions: [Option]

    public init(tool: String, overview: String, version: String, subcommands: [Subcommand], rootOptions: [Option] = []) {
        self.tool = tool
        self.overview = overview
        self.version = version
        self.subcommands = subcommands
        self.rootOptions = [.flag("version", "Show the version.")] + rootOptions
    }

    /// Every command, for completions and the manual page.
    public var commandSet: CommandSet {
        CommandSet(tool: tool, overview: overview, commands: subcommands.map(\.command), rootOptions: rootOptions)
    }

    /// The help of the tool itself (no prefix), or of a group of commands (`["records"]`).
    public func groupHelp(_ prefix: [String]) -> Command? {
        let members = subcommands.filter { Array($0.words.prefix(prefix.count)) == prefix && $0.words.count > prefix.count }
        guard !members.isEmpty else { return nil }
        var seen = Set<String>()
        var listed = [(name: String, abstract: String)]()
        for member in members {
            let name = member.words[prefix.count]
            guard seen.insert(name).inserted else { continue }
            let exact = member.words.count == prefix.count + 1
            let nested = members.filter { $0.words[prefix.count] == name }.map { $0.words.dropFirst(prefix.count + 1).joined(separator: " ") }
            listed.append((name, exact ? member.command.overview : "Subcommands: \(nested.joined(separator: ", "))."))
        }
        let path = ([tool] + prefix).joined(separator: " ")
        let overview = prefix.isEmpty ? overview.prefix(1).uppercased() + overview.dropFirst() + "." : "The \(prefix.joined(separator: " ")) commands."
        return Command(path, overview, options: prefix.isEmpty ? rootOptions : [], subcommands: listed)
    }

    /// Runs the command `words` name, and exits.
    public func run(_ words: [String]) async -> Never {
        var words = words
        if words.first == "--version" {
            print(version)
            exit(0)
        }
        // `help <command…>` is `<command…> --help`.
        if words.first == "help" { words = Array(words.dropFirst()) + ["--help"] }
        guard let match = subcommands.filter({ words.starts(with: $0.words) }).max(by: { $0.words.count < $1.words.count }) else {
            let wantsHelp = words.last == "--help" || words.last == "-h"
            let path = words.filter { $0 != "--help" && $0 != "-h" }
            let root = groupHelp([]) ?? Command(tool, overview)
            if let group = groupHelp(path) {
                if wantsHelp {
                    print(group.help, terminator: "")
                    exit(0)
                }
                exitWithError("missing subcommand", help: group.help, tool: group.path)
            }
            var known = path
            while !known.isEmpty && groupHelp(known) == nil { known.removeLast() }
            let group = groupHelp(known) ?? root
            exitWithError("unknown subcommand '\(path.dropFirst(known.count).first ?? "")'", help: group.help, tool: group.path)
        }
        let rest = Array(words.dropFirst(match.words.count))
        let command = match.command
        switch match.run {
        case .words(let run):
            await run(rest)
            exit(0)
        case .parsed(let run):
            let parsed: ParsedArguments
            do throws(UsageError) { parsed = try command.parse(rest) } catch { exitWithError(error.message, help: command.help, tool: command.path) }
            if parsed.has("help") {
                print(command.help, terminator: "")
                exit(0)
            }
            do {
                try await run(parsed)
                exit(0)
            } catch let error as UsageError {
                exitWithError(error.message, help: command.help, tool: command.path)
            } catch let error as ToolFailure {
                exitWithError(error.message, help: nil, tool: command.path)
            } catch {
                exitWithError("\(error)", help: nil, tool: command.path)
            }
        }
    }
}
