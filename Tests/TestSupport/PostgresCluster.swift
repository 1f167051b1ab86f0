import Foundation
import PostgresKit
import Synchronization

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
                                     "-o", "-k \(directory.path) -c listen_addresses='' -p \(port) -c fsync=off -c max_connections=300", "start"])
    }

    /// Stops it at once (`immediate`: as a crash would).
    public func stop() async throws {
        try await runTool("pg_ctl", ["-D", directory.path + "/data", "-w", "-m", "immediate", "stop"])
    }

    deinit { stopNow() }

    /// Stops the cluster at once, without waiting for a task (at exit, in deinit); best effort.
    public func stopNow() {
        let arguments = ["-D", directory.path + "/data", "-m", "immediate", "stop"]
        _ = asPostgres ? try? ChildProcess.runToEnd("/usr/sbin/runuser", ["-u", "postgres", "--", bin + "/pg_ctl"] + arguments)
            : try? ChildProcess.runToEnd(bin + "/pg_ctl", arguments)
        try? FileManager.default.removeItem(atPath: directory.path)
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

/// One private cluster for every test in a process; each test gets a database of its own
/// (``freshDatabase()``). `scripts/test.sh` starts the cluster (`scripts/pg-cluster.sh`) and
/// names it in `CONVKIT_TEST_POSTGRES`; without it, the first test to ask starts one, stopped
/// when the process exits.
public enum SharedPostgres {
    /// Whether PostgreSQL is installed here (`scripts/setup.sh` installs it); tests that need it
    /// are left out, with this reason, only when it is not.
    public static let isAvailable = ProcessInfo.processInfo.environment["CONVKIT_TEST_POSTGRES"] != nil || PostgresCluster.binDirectory != nil
    public static let unavailableReason = "PostgreSQL is not installed (scripts/setup.sh installs it)"

    /// The `postgres` database of the cluster, as its superuser.
    private static let server = Task { () throws -> String in
        if let given = ProcessInfo.processInfo.environment["CONVKIT_TEST_POSTGRES"] { return given }
        let cluster = try await PostgresCluster()
        started.withLock { $0 = cluster }
        atexit { SharedPostgres.started.withLock { $0?.stopNow() } }
        return cluster.conninfo
    }
    private static let started = Mutex<PostgresCluster?>(nil)

    /// The connection string of a new, empty database in the shared cluster.
    public static func freshDatabase() async throws -> String {
        let conninfo = try await server.value
        let name = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
        try PostgresConnection(conninfo).execute("CREATE DATABASE \(name)")
        return conninfo.replacingOccurrences(of: "dbname=postgres", with: "dbname=\(name)")
    }
}
