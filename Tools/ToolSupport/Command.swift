import Foundation

/// One option of a command, declared once: the parser and the help both come from it.
public struct Option: Sendable {
    public let name: String
    /// The value's name in the help (`<dir>`); nil for a flag.
    public let value: String?
    public let help: String
    /// Whether it may be given more than once (`--tag a --tag b`).
    public let repeats: Bool

    public static func valued(_ name: String, _ value: String, _ help: String, repeats: Bool = false) -> Option {
        Option(name: name, value: value, help: help, repeats: repeats)
    }

    public static func flag(_ name: String, _ help: String) -> Option {
        Option(name: name, value: nil, help: help, repeats: false)
    }
}

/// One positional argument.
public struct Positional: Sendable {
    public let name: String
    public let help: String
    public let optional: Bool

    public init(_ name: String, _ help: String, optional: Bool = false) {
        self.name = name
        self.help = help
        self.optional = optional
    }
}

/// A command (or subcommand) declared once: its help is generated in swift-argument-parser's
/// shape (OVERVIEW / USAGE / ARGUMENTS / OPTIONS / SUBCOMMANDS) and its arguments parsed from
/// the same declaration.
public struct Command: Sendable {
    /// The full invocation, e.g. `convkit records show`.
    public let path: String
    public let overview: String
    public let discussion: String?
    public let positionals: [Positional]
    public let options: [Option]
    /// Subcommands' names and one-line abstracts (for a command that only groups others).
    public let subcommands: [(name: String, abstract: String)]
    /// The usage line's arguments, when they say more than the generated ones (which options
    /// go together).
    public let synopsis: String?

    public init(_ path: String, _ overview: String, discussion: String? = nil, synopsis: String? = nil, positionals: [Positional] = [],
                options: [Option] = [], subcommands: [(name: String, abstract: String)] = []) {
        self.path = path
        self.overview = overview
        self.discussion = discussion
        self.synopsis = synopsis
        self.positionals = positionals
        self.options = options
        self.subcommands = subcommands
    }

    public var usage: String {
        if let synopsis { return "USAGE: \(path) \(synopsis)" }
        var parts = [path]
        if !subcommands.isEmpty { parts.append("<subcommand>") }
        for positional in positionals { parts.append(positional.optional ? "[<\(positional.name)>]" : "<\(positional.name)>") }
        if !options.isEmpty { parts.append("[<options>]") }
        return "USAGE: " + parts.joined(separator: " ")
    }

    public var help: String {
        var text = "OVERVIEW: \(overview)\n\n"
        if let discussion { text += discussion + "\n\n" }
        text += usage + "\n"
        if !positionals.isEmpty {
            text += "\nARGUMENTS:\n"
            for positional in positionals { text += Self.row("<\(positional.name)>", positional.help) }
        }
        text += "\nOPTIONS:\n"
        for option in options {
            let name = "--\(option.name)" + (option.value.map { " <\($0)>" } ?? "")
            text += Self.row(name, option.help + (option.repeats ? " (may be repeated)" : ""))
        }
        text += Self.row("-h, --help", "Show help information.")
        if !subcommands.isEmpty {
            text += "\nSUBCOMMANDS:\n"
            for subcommand in subcommands { text += Self.row(subcommand.name, subcommand.abstract) }
            let words = path.split(separator: " ")
            text += "\n  See '\(([words.first ?? ""] + ["help"] + words.dropFirst()).joined(separator: " ")) <subcommand>' for detailed help.\n"
        }
        return text
    }

    /// A help row: the name in a 24-column field (or on its own line when longer), the text after.
    private static func row(_ name: String, _ text: String) -> String {
        let indent = String(repeating: " ", count: 26)
        if name.count <= 22 {
            return "  " + name.padding(toLength: 24, withPad: " ", startingAt: 0) + text + "\n"
        }
        return "  \(name)\n\(indent)\(text)\n"
    }

    /// Parses `arguments` against the declaration.
    public func parse(_ arguments: [String]) throws(UsageError) -> ParsedArguments {
        var parsed = ParsedArguments()
        var rest = arguments[...]
        let byName = Dictionary(options.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        while let argument = rest.popFirst() {
            if argument == "-h" || argument == "--help" {
                parsed.flags.insert("help")
                continue
            }
            if argument == "--" {
                parsed.positionals += rest
                break
            }
            guard argument.hasPrefix("--"), argument.count > 2 else {
                parsed.positionals.append(argument)
                continue
            }
            var name = String(argument.dropFirst(2))
            var inline: String? = nil
            if let equals = name.firstIndex(of: "=") {
                inline = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            guard let option = byName[name] else { throw UsageError("unknown option '--\(name)'") }
            if option.value == nil {
                guard inline == nil else { throw UsageError("--\(name) takes no value") }
                parsed.flags.insert(name)
            } else {
                guard let value = inline ?? rest.popFirst() else { throw UsageError("missing value for --\(name)") }
                if !option.repeats, parsed.values[name] != nil { throw UsageError("--\(name) is given twice") }
                parsed.values[name, default: []].append(value)
            }
        }
        if parsed.flags.contains("help") { return parsed }
        let required = positionals.filter { !$0.optional }.count
        if parsed.positionals.count < required {
            throw UsageError("missing <\(positionals[parsed.positionals.count].name)>")
        }
        if parsed.positionals.count > positionals.count {
            throw UsageError("unexpected argument '\(parsed.positionals[positionals.count])'")
        }
        return parsed
    }
}

/// What ``Command/parse(_:)`` found.
public struct ParsedArguments: Sendable {
    public var positionals: [String] = []
    public var values: [String: [String]] = [:]
    public var flags: Set<String> = []

    public init() {}

    public func value(_ name: String) -> String? { values[name]?.last }
    public func all(_ name: String) -> [String] { values[name] ?? [] }
    public func has(_ name: String) -> Bool { flags.contains(name) }
    public func positional(_ index: Int) -> String? { index < positionals.count ? positionals[index] : nil }

    public func int(_ name: String, default fallback: Int, range: ClosedRange<Int>) throws(UsageError) -> Int {
        guard let text = value(name) else { return fallback }
        guard let value = Int(text), range.contains(value) else {
            throw UsageError("--\(name) must be a whole number in \(range.lowerBound)…\(range.upperBound)")
        }
        return value
    }
}

/// Parses the arguments against a command, or prints its help (for `-h` / `--help`) and exits
/// 0, or reports a usage error and exits 64.
public func parseOrExit(_ arguments: [String], _ command: Command, tool: String) -> ParsedArguments {
    do throws(UsageError) {
        let parsed = try command.parse(arguments)
        if parsed.has("help") {
            print(command.help, terminator: "")
            exit(0)
        }
        return parsed
    } catch {
        exitWithError(error.message, help: command.help, tool: tool)
    }
}
