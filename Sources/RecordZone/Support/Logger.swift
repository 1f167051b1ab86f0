import Foundation

/// A small logger: a label, levels from trace to critical, messages built only when they will
/// be written, one line per entry to stderr. Libraries take one as a parameter and are silent
/// by default (``Logger/silent``).
public struct Logger: Sendable {
    public enum Level: Int, Sendable, Comparable, CaseIterable, CustomStringConvertible {
        case trace, debug, info, notice, warning, error, critical

        public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }
        public var description: String {
            switch self {
            case .trace: "trace"
            case .debug: "debug"
            case .info: "info"
            case .notice: "notice"
            case .warning: "warning"
            case .error: "error"
            case .critical: "critical"
            }
        }
        public init?(name: String) {
            guard let level = Level.allCases.first(where: { $0.description == name.lowercased() }) else { return nil }
            self = level
        }
    }

    public let label: String
    /// Entries below this level are dropped; nil drops everything.
    public let minimumLevel: Level?
    /// Where a line goes (default: stderr).
    private let write: @Sendable (String) -> Void

    public init(label: String, level: Level?) {
        self.init(label: label, level: level) { FileHandle.standardError.write(Data($0.utf8)) }
    }

    /// A logger whose lines (each ending in a newline) go to `write`: an app's own log, a test.
    public init(label: String, level: Level?, write: @escaping @Sendable (String) -> Void) {
        self.label = label
        self.minimumLevel = level
        self.write = write
    }

    /// A logger that writes nothing: the default for libraries.
    public static let silent = Logger(label: "silent", level: nil)

    public func isEnabled(_ level: Level) -> Bool { minimumLevel.map { level >= $0 } ?? false }

    public func log(_ level: Level, _ message: @autoclosure () -> String) {
        guard isEnabled(level) else { return }
        let stamp = Date().formatted(.iso8601)
        // One line per entry, whatever the message holds (names and IDs come from peers).
        write("\(stamp) \(level) \(label): \(DisplayText.safe(message()))\n")
    }

    public func trace(_ message: @autoclosure () -> String) { log(.trace, message()) }
    public func debug(_ message: @autoclosure () -> String) { log(.debug, message()) }
    public func info(_ message: @autoclosure () -> String) { log(.info, message()) }
    public func notice(_ message: @autoclosure () -> String) { log(.notice, message()) }
    public func warning(_ message: @autoclosure () -> String) { log(.warning, message()) }
    public func error(_ message: @autoclosure () -> String) { log(.error, message()) }
}
