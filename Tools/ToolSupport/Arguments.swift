import Foundation

/// A usage error: printed as `Error: …` with the command's usage line, exit status 64.
public struct UsageError: Error {
    public let message: String
    public init(_ message: String) { self.message = message }
}

/// `--name value` options and `--flag`s, parsed in the shape swift-argument-parser users know
/// (`-h` / `--help` set the `help` flag).
public struct Arguments {
    public private(set) var values: [String: String] = [:]
    public private(set) var flags: Set<String> = []
    /// Every value of each option, in order (for options that may be repeated).
    private var lists: [String: [String]] = [:]

    public func all(_ name: String) -> [String] { lists[name] ?? [] }

    /// - Parameters:
    ///   - valued: options that take a value (`--listen 127.0.0.1:8080` or `--listen=…`).
    ///   - flags: options that take none.
    public init(_ arguments: [String], valued: Set<String>, flags allowed: Set<String> = []) throws(UsageError) {
        var rest = arguments[...]
        while let argument = rest.popFirst() {
            if argument == "-h" { flags.insert("help"); continue }
            guard argument.hasPrefix("--") else { throw UsageError("unexpected argument '\(argument)'") }
            var name = String(argument.dropFirst(2))
            var inline: String? = nil
            if let equals = name.firstIndex(of: "=") {
                inline = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            if allowed.contains(name) || name == "help" {
                guard inline == nil else { throw UsageError("--\(name) takes no value") }
                flags.insert(name)
            } else if valued.contains(name) {
                guard let value = inline ?? rest.popFirst() else { throw UsageError("missing value for --\(name)") }
                values[name] = value
                lists[name, default: []].append(value)
            } else {
                throw UsageError("unknown option '--\(name)'")
            }
        }
    }

    public func int(_ name: String, default fallback: Int, range: ClosedRange<Int>) throws(UsageError) -> Int {
        guard let text = values[name] else { return fallback }
        guard let value = Int(text), range.contains(value) else {
            throw UsageError("--\(name) must be a whole number in \(range.lowerBound)…\(range.upperBound)")
        }
        return value
    }
}

/// Prints `Error: …` to stderr. With a help text, its USAGE line follows and the process exits
/// 64 (a usage error); without, it exits 1 (a failure).
public func exitWithError(_ message: String, help: String?, tool: String) -> Never {
    var text = "Error: \(message)\n"
    if let help, let line = help.split(separator: "\n").first(where: { $0.hasPrefix("USAGE") }) {
        text += "\(line)\n  See '\(tool) --help' for more.\n"
    }
    FileHandle.standardError.write(Data(text.utf8))
    exit(help == nil ? 1 : 64)
}

/// Parses the arguments, or prints the help (for `-h` / `--help`) and exits 0, or reports a
/// usage error and exits 64.
public func parseOrExit(_ arguments: [String], valued: Set<String>, flags: Set<String> = [], help: String, tool: String) -> Arguments {
    do throws(UsageError) {
        let parsed = try Arguments(arguments, valued: valued, flags: flags)
        if parsed.flags.contains("help") {
            print(help, terminator: "")
            exit(0)
        }
        return parsed
    } catch {
        exitWithError(error.message, help: help, tool: tool)
    }
}
