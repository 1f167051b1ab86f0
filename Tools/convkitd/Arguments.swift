import Foundation

/// A usage error: printed as `Error: …` with the command's usage, exit status 64.
struct UsageError: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// `--name value` options and `--flag`s, parsed in the shape swift-argument-parser users know.
struct Arguments {
    private(set) var values: [String: String] = [:]
    private(set) var flags: Set<String> = []

    /// - Parameters:
    ///   - valued: options that take a value (`--listen 127.0.0.1:8080` or `--listen=…`).
    ///   - flags: options that take none.
    init(_ arguments: [String], valued: Set<String>, flags allowed: Set<String>) throws(UsageError) {
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
            } else {
                throw UsageError("unknown option '--\(name)'")
            }
        }
    }

    func int(_ name: String, default fallback: Int, range: ClosedRange<Int>) throws(UsageError) -> Int {
        guard let text = values[name] else { return fallback }
        guard let value = Int(text), range.contains(value) else {
            throw UsageError("--\(name) must be a whole number in \(range.lowerBound)…\(range.upperBound)")
        }
        return value
    }
}
