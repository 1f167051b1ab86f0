import Foundation
import SQLiteKit
import Testing
import TestSupport

/// `Database.changeCount(watching:)`, what the store's epoch cache trusts: it moves for every
/// way a watched table's rows can change under the connection, and only then.
@Suite struct ChangeCountTests {
    private static let watched: Set<String> = ["plain", "keyed"]

    /// A WAL database with two watched tables (one WITHOUT ROWID) and one not; the directory
    /// lives as long as the caller holds it.
    private func open(_ name: String) throws -> (Database, String, TemporaryDirectory) {
        let directory = try TemporaryDirectory(name)
        let path = directory.path + "/db.sqlite"
        let db = try Database(path: path)
        try db.execute("PRAGMA journal_mode = WAL")
        try db.execute("""
            CREATE TABLE plain (x INTEGER) STRICT;
            CREATE TABLE keyed (k TEXT PRIMARY KEY, v INTEGER) STRICT, WITHOUT ROWID;
            CREATE TABLE other (x INTEGER) STRICT;
            """)
        return (db, path, directory)
    }

    @Test func writesToWatchedTablesMoveItAndOthersDoNot() throws {
        let (db, _, directory) = try open("change-count-writes")
        defer { withExtendedLifetime(directory) {} }
        var count = try db.changeCount(watching: Self.watched)
        #expect(try db.changeCount(watching: Self.watched) == count, "it moved with nothing written")
        func moves(_ sql: String, _ expected: Bool) throws {
            try db.execute(sql)
            let now = try db.changeCount(watching: Self.watched)
            #expect((now != count) == expected, "\(sql): \(expected ? "did not move" : "moved")")
            count = now
        }
        try moves("INSERT INTO other VALUES (1)", false)
        try moves("UPDATE other SET x = 2", false)
        try moves("INSERT INTO plain VALUES (1)", true)
        try moves("UPDATE plain SET x = 2", true)
        try moves("INSERT INTO keyed VALUES ('a', 1)", true)                                  // WITHOUT ROWID
        try moves("INSERT INTO keyed VALUES ('a', 2) ON CONFLICT (k) DO UPDATE SET v = excluded.v", true)
        try moves("INSERT INTO keyed VALUES ('a', 3) ON CONFLICT (k) DO NOTHING", false)       // nothing written
        try moves("UPDATE plain SET x = 3 WHERE x = 99", false)
        try moves("DELETE FROM keyed", true)
        try moves("DELETE FROM plain", true)                                                 // a whole table at once
        try moves("CREATE TEMP TABLE scratch (x INTEGER); INSERT INTO scratch VALUES (1)", false)
    }

    @Test func aRollbackMovesIt() throws {
        let (db, _, directory) = try open("change-count-rollback")
        defer { withExtendedLifetime(directory) {} }
        try db.execute("INSERT INTO plain VALUES (1)")
        var count = try db.changeCount(watching: Self.watched)
        struct Undo: Error {}
        // A whole transaction undone: what a cache took from inside it is gone.
        #expect(throws: Undo.self) { try db.transaction { try db.execute("INSERT INTO other VALUES (1)"); throw Undo() } }
        #expect(try db.changeCount(watching: Self.watched) != count, "a rollback left it where it was")
        count = try db.changeCount(watching: Self.watched)
        // A savepoint undone inside a transaction that commits.
        let inside = try db.transaction { () throws -> UInt64 in
            #expect(throws: Undo.self) { try db.savepoint { try db.execute("INSERT INTO other VALUES (2)"); throw Undo() } }
            return try db.changeCount(watching: Self.watched)
        }
        #expect(inside != count, "a savepoint's rollback left it where it was")
    }

    @Test func anotherConnectionsCommitMovesIt() throws {
        let (db, path, directory) = try open("change-count-other")
        defer { withExtendedLifetime(directory) {} }
        let count = try db.changeCount(watching: Self.watched)
        let other = try Database(path: path)
        try other.execute("INSERT INTO other VALUES (1)")
        // Another connection's tables are not watched here: any commit of its counts.
        #expect(try db.changeCount(watching: Self.watched) != count, "another connection's commit was not seen")
        let after = try db.changeCount(watching: Self.watched)
        #expect(try db.changeCount(watching: Self.watched) == after)
    }

    @Test func aTableAddedLaterIsWatchedToo() throws {
        let (db, _, directory) = try open("change-count-added")
        defer { withExtendedLifetime(directory) {} }
        _ = try db.changeCount(watching: ["plain"])
        let count = try db.changeCount(watching: ["plain", "other"])
        try db.execute("INSERT INTO other VALUES (1)")
        #expect(try db.changeCount(watching: ["plain", "other"]) != count)
    }
}
