import Foundation
import Testing

/// A real child process with its output collected, for tests that run the built tools.
public final class ChildProcess: @unchecked Sendable {
    public let process = Process()
    private let output = Pipe()
    private let errors = Pipe()
    private let lock = NSLock()
    private var stdoutData = Data()
    private var stderrData = Data()

    public init(_ executable: String, _ arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardOutput = output
        process.standardError = errors
        output.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let chunk = handle.availableData
            self?.lock.withLock { self?.stdoutData.append(chunk) }
        }
        errors.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let chunk = handle.availableData
            self?.lock.withLock { self?.stderrData.append(chunk) }
        }
        try process.run()
    }

    public var standardOutput: String { lock.withLock { String(decoding: stdoutData, as: UTF8.self) } }
    public var standardError: String { lock.withLock { String(decoding: stderrData, as: UTF8.self) } }

    /// Complete lines written to stdout so far.
    public var lines: [String] {
        let text = standardOutput
        guard let lastNewline = text.lastIndex(of: "\n") else { return [] }
        return text[..<lastNewline].split(separator: "\n").map(String.init)
    }

    /// Waits for the process to exit and returns its status; drains the pipes first.
    public func wait() async -> Int32 {
        while process.isRunning { try? await Task.sleep(for: .milliseconds(10)) }
        output.fileHandleForReading.readabilityHandler = nil
        errors.fileHandleForReading.readabilityHandler = nil
        let restOut = output.fileHandleForReading.readDataToEndOfFile()
        let restErr = errors.fileHandleForReading.readDataToEndOfFile()
        lock.withLock {
            stdoutData.append(restOut)
            stderrData.append(restErr)
        }
        return process.terminationStatus
    }

    /// Polls until `condition` holds or the deadline passes.
    public func waitUntil(seconds: Double = 60, _ condition: (ChildProcess) -> Bool) async -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition(self) { return true }
            if !process.isRunning { return condition(self) }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return false
    }

    public func kill(_ signal: Int32) { Foundation.kill(process.processIdentifier, signal) }
}
