import Foundation

/// A private PostgreSQL cluster for one test: `initdb` in a temporary directory, started with
/// `pg_ctl` on a Unix socket in that directory (no TCP), stopped and removed after. PostgreSQL
/// refuses to run as root: as root (CI), the cluster belongs to the `postgres` user Debian's
/// package creates, and its programs run through `runuser`.
public final class PostgresCluster: @unchecked Sendable {
    public let directory: TemporaryDirectory
    public let port: Int
    private let bin: String
    private let asPostgres: Bool

    /// Where PostgreSQL's programs are (the newest installed major version), or nil.
    public static var binDirectory: String? {
        let base = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: base)) ?? []).compactMap(Int.init).sorted()
        return versions.last.map { "\(base)/\($0)/bin" }.flatMap { FileManager.default.isExecutableFile(atPath: $0 + "/initdb") ? $0 : nil }
    }

    /// The connection string of the cluster's `postgres` database as the `convkit` superuser.
    public var conninfo: String { "host=\(directory.path) port=\(port) user=convkit dbname=postgres" }

    public init() async throws {
        guard let bin = Self.binDirectory else { throw ClusterError("PostgreSQL is not installed (scripts/setup.sh installs it)") }
        self.bin = bin
        directory = try TemporaryDirectory("pgcluster")
        asPostgres = getuid() == 0
        port = 20_000 + Int.random(in: 0..<20_000)
        if asPostgres {
            _ = try await Self.run("/usr/bin/chown", ["postgres:postgres", directory.path])
        }
        try await runTool("initdb", ["-D", directory.path + "/data", "-A", "trust", "-U", "convkit", "--no-sync", "-E", "UTF8"])
        try await start()
    }

    /// Starts the cluster (again, after ``stop()``).
    public func start() async throws {
        try await runTool("pg_ctl", ["-D", directory.path + "/data", "-w", "-t", "30", "-l", directory.path + "/log",
                                     "-o", "-k \(directory.path) -c listen_addresses='' -p \(port) -c fsync=off", "start"])
    }

    /// Stops it at once (`immediate`: as a crash would).
    public func stop() async throws {
        try await runTool("pg_ctl", ["-D", directory.path + "/data", "-w", "-m", "immediate", "stop"])
    }

    deinit {
        // Best effort: the directory goes with it.
        let arguments = ["-D", directory.path + "/data", "-m", "immediate", "stop"]
        _ = asPostgres ? try? ChildProcess.runToEnd("/usr/sbin/runuser", ["-u", "postgres", "--", bin + "/pg_ctl"] + arguments)
            : try? ChildProcess.runToEnd(bin + "/pg_ctl", arguments)
    }

    private func runTool(_ name: String, _ arguments: [String]) async throws {
        if asPostgres {
            try await Self.run("/usr/sbin/runuser", ["-u", "postgres", "--", bin + "/" + name] + arguments)
        } else {
            try await Self.run(bin + "/" + name, arguments)
        }
    }

    @discardableResult
    private static func run(_ executable: String, _ arguments: [String]) async throws -> String {
        let child = try ChildProcess(executable, arguments)
        let status = await child.wait()
        guard status == 0 else { throw ClusterError("\(executable) \(arguments.joined(separator: " ")) exited \(status): \(child.standardError)\(child.standardOutput)") }
        return child.standardOutput
    }

    public struct ClusterError: Error, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }
}
