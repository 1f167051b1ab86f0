import Foundation
import Synchronization
import PostgresKit
import Testing
import TestSupport

/// libpq through PostgresKit against a real, private PostgreSQL cluster.
@Suite struct PostgresConnectionTests {
    @Test func statementsBytesErrorsNotificationsAndARestart() async throws {
        let cluster = try await PostgresCluster()
        let db = try PostgresConnection(cluster.conninfo)
        try db.execute("CREATE TABLE records (zone text NOT NULL, name text NOT NULL, sequence bigint NOT NULL, bytes bytea NOT NULL, PRIMARY KEY (zone, name))")
        // Bytes go in binary, whatever they hold (zero bytes, quotes, backslashes), and come back the same.
        let awkward = Data([0, 1, 0x27, 0x5C, 0xFF, 0]) + Data("'); DROP TABLE records; --".utf8)
        let inserted = try db.execute("INSERT INTO records VALUES ($1, $2, $3, $4)", [.text("z"), .text("m'1"), .int(42), .bytes(awkward)])
        #expect(inserted.affected == 1)
        try db.execute("INSERT INTO records VALUES ($1, $2, $3, $4)", [.text("z"), .text("empty"), .int(43), .bytes(Data())])
        let rows = try db.execute("SELECT name, sequence, bytes FROM records WHERE zone = $1 ORDER BY sequence", [.text("z")])
        #expect(rows.columns == ["name", "sequence", "bytes"])
        #expect(rows.rows.count == 2 && rows.text(0, 0) == "m'1" && rows.int(0, 1) == 42)
        #expect(rows.bytes(0, 2) == awkward && rows.bytes(1, 2) == Data())
        // A typed error with its SQLSTATE; the transaction rolls back whole.
        #expect { try db.execute("INSERT INTO records VALUES ('z', 'm''1', 1, '')") } throws: { ($0 as? PostgresError)?.code == .uniqueViolation }
        #expect { try db.execute("SELEC nonsense") } throws: { ($0 as? PostgresError)?.code == .syntaxError }
        #expect(throws: PostgresError.self) {
            try db.transaction { () throws(PostgresError) in
                try db.execute("INSERT INTO records VALUES ('y', 'n', 1, '')")
                try db.execute("INSERT INTO records VALUES ('z', 'empty', 2, '')")
            }
        }
        #expect(try db.execute("SELECT count(*) FROM records WHERE zone = 'y'").int(0, 0) == 0)
        // LISTEN / NOTIFY between two connections.
        let listener = try PostgresConnection(cluster.conninfo)
        try listener.listen("zone changed")
        #expect(try listener.waitForNotification(timeout: 0.2) == nil)
        try db.execute("SELECT pg_notify('zone changed', 'z')")
        let start = Date()
        let note = try listener.waitForNotification(timeout: 5)
        #expect(note?.channel == "zone changed" && note?.payload == "z" && Date().timeIntervalSince(start) < 1)
        // The server goes away: a connection failure, told apart from SQL errors; a new connection
        // works once it is back.
        try await cluster.stop()
        #expect { try db.execute("SELECT 1") } throws: { ($0 as? PostgresError)?.isConnectionFailure == true }
        #expect { try PostgresConnection(cluster.conninfo) } throws: { ($0 as? PostgresError)?.isConnectionFailure == true }
        try await cluster.start()
        #expect(try PostgresConnection(cluster.conninfo).execute("SELECT count(*) FROM records").int(0, 0) == 2)
    }

    /// A pipeline runs its statements in order in one round trip; the first failure is the
    /// error, the rest are not run, and the connection is usable after.
    @Test func aPipelineRunsInOrderAndStopsAtTheFirstFailure() async throws {
        let cluster = try await PostgresCluster()
        let db = try PostgresConnection(cluster.conninfo)
        try db.execute("CREATE TABLE t (k integer PRIMARY KEY, v bytea NOT NULL)")
        let results = try db.pipeline([("BEGIN", []), ("INSERT INTO t VALUES (1, $1)", [.bytes(Data([0, 1]))]),
                                       ("SELECT k, v FROM t WHERE k = $1", [.int(1)]), ("COMMIT", [])])
        #expect(results.count == 4 && results[2].int(0, 0) == 1 && results[2].bytes(0, 1) == Data([0, 1]))
        #expect { try db.pipeline([("BEGIN", []), ("INSERT INTO t VALUES (2, '')", []), ("INSERT INTO t VALUES (1, '')", []), ("INSERT INTO t VALUES (3, '')", []), ("COMMIT", [])]) }
            throws: { ($0 as? PostgresError)?.code == .uniqueViolation }
        try db.execute("ROLLBACK")
        #expect(try db.execute("SELECT count(*) FROM t").int(0, 0) == 1, "the failed pipeline's transaction left nothing")
        #expect(try db.pipeline([("SELECT 1", []), ("SELECT 2", [])]).map { $0.int(0, 0) } == [1, 2])
    }

    /// The pool lends at most its size, queues the rest, and heals once the server is back.
    /// Deadlines on every wait for the database: a connection finds a silent link dead within
    /// about 5 s (TCP keepalives, unacknowledged data) unless its connection string says
    /// otherwise; a caller waiting for a pooled connection gives up after the pool's
    /// `borrowTimeout`, and the pool serves as before once one is free.
    @Test func waitsOnTheDatabaseHaveDeadlines() async throws {
        let cluster = try await PostgresCluster()
        let db = try PostgresConnection(cluster.conninfo)
        #expect(db.option("keepalives") == "1" && db.option("keepalives_idle") == "2" && db.option("keepalives_interval") == "1")
        #expect(db.option("keepalives_count") == "3" && db.option("tcp_user_timeout") == "5000")
        let chosen = try PostgresConnection(cluster.conninfo + " keepalives_idle=30")
        #expect(chosen.option("keepalives_idle") == "30", "the connection string's own value wins")

        let pool = PostgresPool(conninfo: cluster.conninfo, size: 1, borrowTimeout: .milliseconds(300))
        // The only connection stays lent until the test lets it go.
        let release = DispatchSemaphore(value: 0)
        defer { release.signal() }  // a failed expectation never leaves it blocked
        let holding = Task { try await pool.withConnection { db in release.wait(); return try db.execute("SELECT 1") } }
        for _ in 0..<1000 where pool.statistics.inUse == 0 { try await Task.sleep(for: .milliseconds(10)) }
        try #require(pool.statistics.inUse == 1)
        await #expect { try await pool.withConnection { db in try db.execute("SELECT 1") } } throws: { error in
            (error as? PostgresError)?.isConnectionFailure == true && "\(error)".contains("no connection to the database was free")
        }
        #expect(pool.statistics.waiting == 0)
        release.signal()
        _ = try await holding.value
        #expect(try await pool.withConnection { db in try db.execute("SELECT 1").int(0, 0) } == 1)
    }

    @Test func thePoolLendsAtMostItsSizeAndHealsAfterARestart() async throws {
        let cluster = try await PostgresCluster()
        // The waiters may queue for as long as the holders hold (up to 10 s below): lending, not
        // the borrow deadline (waitsOnTheDatabaseHaveDeadlines), is what this test checks.
        let pool = PostgresPool(conninfo: cluster.conninfo, size: 2, borrowTimeout: .seconds(60))
        let counts = Counts()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<12 {
                group.addTask {
                    counts.asking.add(1, ordering: .relaxed)
                    try await pool.withConnection { db in
                        let now = counts.lent.add(1, ordering: .relaxed).newValue
                        counts.busiest.max(now, ordering: .relaxed)
                        defer { counts.lent.subtract(1, ordering: .relaxed) }
                        let order = counts.entered.add(1, ordering: .relaxed).newValue
                        // The first two borrowers hold on until every caller is asking and
                        // both are lent (or 10 s pass), so the others queue however slowly the
                        // tasks start or a connection opens (a loaded machine).
                        let deadline = ContinuousClock.now + .seconds(10)
                        while order <= 2, counts.asking.load(ordering: .relaxed) < 12 || counts.lent.load(ordering: .relaxed) < 2,
                              ContinuousClock.now < deadline { usleep(1_000) }
                        try db.execute("SELECT pg_sleep(0.05)")
                    }
                }
            }
            try await group.waitForAll()
        }
        let before = pool.statistics
        #expect(counts.busiest.load(ordering: .relaxed) == 2 && before.open == 2 && before.inUse == 0 && before.waiting == 0)
        // Twelve callers at once on two connections: the others queued.
        #expect(before.acquired == 12 && before.waited >= 1)
        // The server goes away: a connection failure; back again, the pool replaces the
        // connections the restart closed before using them: the first call answers.
        try await cluster.stop()
        await #expect { try await pool.withConnection { db in try db.execute("SELECT 1") } } throws: { ($0 as? PostgresError)?.isConnectionFailure == true }
        try await cluster.start()
        #expect(try await pool.withConnection { db in try db.execute("SELECT 41 + 1").int(0, 0) } == 42)
        #expect(try await pool.withConnection { db in try db.execute("SELECT 1").int(0, 0) } == 1)
        #expect(pool.statistics.broken >= 1 && pool.statistics.inUse == 0)
    }

    final class Counts: Sendable {
        let busiest = Atomic<Int>(0), lent = Atomic<Int>(0), asking = Atomic<Int>(0), entered = Atomic<Int>(0)
    }
}
