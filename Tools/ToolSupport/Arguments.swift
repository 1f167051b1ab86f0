import Foundation
import RecordZone

/// A usage error: printed as `Error: …` with the command's usage line, exit status 64.
public struct UsageError: Error {
    public let message: String
    public init(_ message: String) { self.message = message }
}

/// Prints `Error: …` to stderr. With a help text, its USAGE line follows and the process exits
/// 64 (a usage error); without, it exits 1 (a failure).
public func exitWithError(_ message: String, help: String?, tool: String) -> Never {
    var text = "Error: \(DisplayText.safe(message))\n"
    if let help, let line = help.split(separator: "\n").first(where: { $0.hasPrefix("USAGE") }) {
        text += "\(line)\n  See '\(tool) --help' for more.\n"
    }
    FileHandle.standardError.write(Data(text.utf8))
    exit(help == nil ? 1 : 64)
}
