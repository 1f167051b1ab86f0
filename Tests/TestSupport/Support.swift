import Foundation
import Testing

/// A temporary directory removed when the value goes away.
public final class TemporaryDirectory: @unchecked Sendable {
    public let path: String

    public init(_ label: String = "convkit") throws {
        let base = FileManager.default.temporaryDirectory.path
        path = "\(base)/\(label)-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// A small deterministic random source (SplitMix64) for property-style tests.
public struct SeededRandom: RandomNumberGenerator {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The path of a tool built beside the tests.
public func builtProduct(_ name: String) throws -> String {
    var candidates = [String]()
    if let executable = Bundle.main.executableURL?.deletingLastPathComponent().path {
        candidates.append("\(executable)/\(name)")
    }
    candidates.append(URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path + "/\(name)")
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
    candidates.append("\(root)/.build/debug/\(name)")
    return try #require(candidates.first { FileManager.default.isExecutableFile(atPath: $0) }, "no built \(name) in \(candidates)")
}

/// Waits until `condition` holds (up to `seconds`). - Returns: whether it did.
public func until(seconds: Double = 10, _ condition: () async -> Bool) async -> Bool {
    let deadline = ContinuousClock.now.advanced(by: .milliseconds(Int(seconds * 1000)))
    while ContinuousClock.now < deadline {
        if await condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return await condition()
}
