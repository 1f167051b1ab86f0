import ConversationKit
import Foundation
@testable import RecordZone
@testable import SQLiteKit
import Synchronization
import Testing
import TestSupport

/// SQLite work runs on each connection's own queue, never on Swift's cooperative pool: writes
/// that wait for another process's lock hold no task thread.
private struct GroupedJobFailed: Error {}

@Suite struct StorageQueueTests {
    /// Cancelling a task that waits on the database reaches SQLite: the statement it runs (minutes
    /// of work) fails as interrupted (its transaction rolls back), a job queued behind it and cancelled
    /// before it started never runs, and the connection serves the next job as before.
    @Test func cancellingATaskInterruptsItsStatementAndDropsAJobNotStarted() async throws {
        let directory = try TemporaryDirectory("interrupt")
        let queue = try DatabaseQueue(path: directory.path + "/db.sqlite", migrations: [Migration(version: 1, sql: "CREATE TABLE t (x INTEGER) STRICT;")])
        let running = Mutex(false)
        let long = Task {
            try await queue.write { db in
                try db.execute("INSERT INTO t VALUES (1)")
                running.withLock { $0 = true }
                // Minutes of work if nothing stops it.
                return try db.first("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000000000) SELECT count(*) FROM n") { $0.int(0) }
            }
        }
        let ran = Mutex(false)
        let queued = Task {
            try await queue.write { db in
                ran.withLock { $0 = true }
                try db.execute("INSERT INTO t VALUES (2)")
            }
        }
        // Cancelled once it runs (a loaded machine may take a while to start it).
        while !running.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(20)) }
        queued.cancel()
        long.cancel()
        do {
            _ = try await long.value
            Issue.record("the statement ran to its end")
        } catch let error as SQLiteError {
            #expect(error.resultCode == .interrupted, "\(error)")
        }
        await #expect(throws: CancellationError.self) { try await queued.value }
        #expect(!ran.withLock { $0 }, "a job cancelled before it started ran")
        #expect(try await queue.read { db in try db.first("SELECT count(*) FROM t") { $0.int(0) } } == 0, "the interrupted transaction was kept")
        try await queue.write { db in try db.execute("INSERT INTO t VALUES (3)") }
        #expect(try await queue.read { db in try db.first("SELECT count(*) FROM t") { $0.int(0) } } == 1)
    }

    /// A cancellation that comes between two statements of a job stops the next one: SQLite's
    /// interrupt reaches only a statement running at that moment, so the job's next statement
    /// ran on (for minutes: a test run once hung at exit on it).
    @Test func aCancellationBetweenTwoStatementsStopsTheNextOne() async throws {
        let directory = try TemporaryDirectory("interrupt-between")
        let queue = try DatabaseQueue(path: directory.path + "/db.sqlite", migrations: [Migration(version: 1, sql: "CREATE TABLE t (x INTEGER) STRICT;")])
        let between = Mutex(false), cancelled = Mutex(false)
        let job = Task {
            try await queue.write { db in
                try db.execute("INSERT INTO t VALUES (1)")
                between.withLock { $0 = true }
                while !cancelled.withLock({ $0 }) { usleep(1_000) }
                // Tens of seconds of work if nothing stops it.
                return try db.first("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000000) SELECT count(*) FROM n") { $0.int(0) }
            }
        }
        while !between.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
        job.cancel()  // its handler has run when this returns: no statement was running
        cancelled.withLock { $0 = true }
        do {
            _ = try await job.value
            Issue.record("the statement after the cancellation ran to its end")
        } catch let error as SQLiteError {
            #expect(error.resultCode == .interrupted, "\(error)")
        }
        // The next job is not stopped by what was meant for this one.
        try await queue.write { db in try db.execute("INSERT INTO t VALUES (2)") }
        #expect(try await queue.read { db in try db.first("SELECT count(*) FROM t") { $0.int(0) } } == 1)
    }

    /// Grouped writes that arrive while the writer is busy share one transaction (one commit,
    /// one sync): each sees what those before it wrote, one that throws is undone alone, and one
    /// that says it commits alone ends its group, so its `afterCommit` runs before the next
    /// job's body.
    @Test(arguments: [false, true]) func groupedWritesShareACommitAndOneThatFailsIsUndoneAlone(syncsAfterCommit: Bool) async throws {
        let directory = try TemporaryDirectory("grouped")
        let queue = try DatabaseQueue(path: directory.path + "/db.sqlite", migrations: [Migration(version: 1, sql: "CREATE TABLE t (x INTEGER) STRICT;")], syncsAfterCommit: syncsAfterCommit)
        final class Shared: Sendable {
            let log = Mutex([String]())
            let release = Mutex(false)
        }
        let shared = Shared()
        let blocker = Task {
            try await queue.write { _ in
                while !shared.release.withLock({ $0 }) { usleep(1000) }
            }
        }
        var jobs = [Task<Int64, any Error>]()
        for i in 1...40 {
            jobs.append(Task {
                try await queue.writeGrouped({ db in
                    let seen = try db.first("SELECT count(*) FROM t") { $0.int(0) } ?? -1
                    shared.log.withLock { $0.append("body \(i) saw \(seen)") }
                    try db.execute("INSERT INTO t VALUES (?)", [Int64(i)])
                    if i == 7 { throw GroupedJobFailed() }
                    return Int64(i)
                }, afterCommit: { i in shared.log.withLock { $0.append("after \(i)") } }, commitsAlone: { $0 == 20 })
            })
            // In order: each job is queued before the next one starts.
            while queue.groupedWaitingCount < i { try await Task.sleep(for: .milliseconds(1)) }
        }
        shared.release.withLock { $0 = true }
        try await blocker.value
        for (index, job) in jobs.enumerated() {
            if index + 1 == 7 {
                await #expect(throws: GroupedJobFailed.self) { try await job.value }
            } else {
                #expect(try await job.value == Int64(index + 1))
            }
        }
        let bodies = { (range: ClosedRange<Int>) in range.map { "body \($0) saw \($0 <= 7 ? $0 - 1 : $0 - 2)" } }
        let afters = { (range: ClosedRange<Int>) in range.filter { $0 != 7 }.map { "after \($0)" } }
        #expect(shared.log.withLock { $0 } == bodies(1...20) + afters(1...20) + bodies(21...40) + afters(21...40))
        #expect(try queue.readNow { db in try db.rows("SELECT x FROM t ORDER BY x") { $0.int(0) } } == (1...40).filter { $0 != 7 }.map(Int64.init))
    }

    /// A group whose commit fails (here a deferred constraint, checked only at the commit) fails
    /// every write in it: none is acknowledged, none's `afterCommit` runs, nothing is stored —
    /// and the next write goes on as before.
    @Test(arguments: [false, true]) func aGroupWhoseCommitFailsFailsEveryWriteInIt(syncsAfterCommit: Bool) async throws {
        let directory = try TemporaryDirectory("grouped-commit")
        let queue = try DatabaseQueue(path: directory.path + "/db.sqlite", migrations: [Migration(version: 1, sql: """
            CREATE TABLE t (x INTEGER) STRICT;
            CREATE TABLE parent (id INTEGER PRIMARY KEY) STRICT;
            CREATE TABLE child (parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED) STRICT;
            """)], syncsAfterCommit: syncsAfterCommit)
        final class Shared: Sendable {
            let committed = Mutex([Int]())
            let release = Mutex(false)
        }
        let shared = Shared()
        let blocker = Task { try await queue.write { _ in while !shared.release.withLock({ $0 }) { usleep(1000) } } }
        let valid = Task {
            try await queue.writeGrouped({ db in try db.execute("INSERT INTO t VALUES (1)"); return 1 },
                                         afterCommit: { i in shared.committed.withLock { $0.append(i) } }, commitsAlone: { _ in false })
        }
        while queue.groupedWaitingCount < 1 { try await Task.sleep(for: .milliseconds(1)) }
        let orphan = Task {
            try await queue.writeGrouped({ db in try db.execute("INSERT INTO child VALUES (42)"); return 2 },
                                         afterCommit: { i in shared.committed.withLock { $0.append(i) } }, commitsAlone: { _ in false })
        }
        while queue.groupedWaitingCount < 2 { try await Task.sleep(for: .milliseconds(1)) }
        shared.release.withLock { $0 = true }
        try await blocker.value
        await #expect(throws: SQLiteError.self) { try await valid.value }
        await #expect(throws: SQLiteError.self) { try await orphan.value }
        #expect(shared.committed.withLock { $0 }.isEmpty)
        #expect(try queue.readNow { db in try db.first("SELECT count(*) FROM t") { $0.int(0) } } == 0)
        try await queue.write { db in try db.execute("INSERT INTO t VALUES (3)") }
        #expect(try queue.readNow { db in try db.rows("SELECT x FROM t") { $0.int(0) } } == [3])
    }

    /// Work a grouped write leaves for before the commit (``Database/beforeCommit``) runs in the
    /// grouped transaction, in order, before anything is acknowledged; work left by a write that
    /// failed runs too and finds its rows undone; work that throws fails every write of the group.
    /// Grouped writes are told so (``Database/isGrouped``), a plain write is not.
    @Test(arguments: [false, true]) func workLeftForTheCommitRunsInTheSharedTransactionBeforeTheAcknowledgement(syncsAfterCommit: Bool) async throws {
        let directory = try TemporaryDirectory("before-commit")
        let queue = try DatabaseQueue(path: directory.path + "/db.sqlite", migrations: [Migration(version: 1, sql: "CREATE TABLE t (x INTEGER, done INTEGER NOT NULL DEFAULT 0) STRICT;")], syncsAfterCommit: syncsAfterCommit)
        final class Shared: Sendable {
            let release = Mutex(false)
            let order = Mutex([Int64]())
        }
        let shared = Shared()
        func group(_ range: ClosedRange<Int64>, failing: Int64?, failingWork: Int64?) async throws -> [Task<Bool, any Error>] {
            shared.release.withLock { $0 = false }
            let blocker = Task { try await queue.write { _ in while !shared.release.withLock({ $0 }) { usleep(1000) } } }
            var jobs = [Task<Bool, any Error>]()
            for (index, i) in range.enumerated() {
                jobs.append(Task {
                    try await queue.writeGrouped({ db in
                        try db.execute("INSERT INTO t (x) VALUES (?)", [i])
                        db.beforeCommit.append { db in
                            shared.order.withLock { $0.append(i) }
                            if i == failingWork { throw GroupedJobFailed() }
                            try db.execute("UPDATE t SET done = 1 WHERE x = ?", [i])
                        }
                        if i == failing { throw GroupedJobFailed() }
                        return db.isGrouped
                    }, afterCommit: { _ in }, commitsAlone: { _ in false })
                })
                while queue.groupedWaitingCount < index + 1 { try await Task.sleep(for: .milliseconds(1)) }
            }
            shared.release.withLock { $0 = true }
            try await blocker.value
            return jobs
        }
        let first = try await group(1...3, failing: 2, failingWork: nil)
        let told = [try await first[0].value, try await first[2].value]
        #expect(told == [true, true], "grouped writes are told so")
        await #expect(throws: GroupedJobFailed.self) { try await first[1].value }
        #expect(shared.order.withLock { $0 } == [1, 2, 3])
        #expect(try queue.readNow { db in try db.rows("SELECT x, done FROM t ORDER BY x") { [$0.int(0), $0.int(1)] } } == [[1, 1], [3, 1]])
        // Work that throws: the whole group fails, nothing of it is stored.
        let second = try await group(4...5, failing: nil, failingWork: 5)
        for job in second { await #expect(throws: GroupedJobFailed.self) { try await job.value } }
        #expect(try queue.readNow { db in try db.first("SELECT count(*) FROM t WHERE x >= 4") { $0.int(0) } } == 0)
        // A plain write is not grouped; a grouped write alone in its transaction is.
        #expect(try await queue.write { db in db.isGrouped } == false)
        let alone = try await queue.writeGrouped({ db in db.isGrouped }, afterCommit: { _ in }, commitsAlone: { _ in false })
        #expect(alone)
    }

    /// With the log synced apart from the commits (the store's queue), a grouped write's caller
    /// resumes only after a sync of the log begun after its commit: the writer commits the next
    /// group meanwhile (here four commits in one run of the writer, the first three handed to the
    /// log's queue, the last synced on the writer), one sync answers the commits made before it,
    /// and a lone write commits with its own sync. The commits' `afterCommit` still run in order
    /// before the next begins,
    /// and the connection is back to `synchronous=FULL` for the plain writes after.
    @Test func aGroupedWriteIsAnsweredAfterASyncOfTheLogBegunAfterItsCommit() async throws {
        let directory = try TemporaryDirectory("log-sync")
        let queue = try DatabaseQueue(path: directory.path + "/db.sqlite", migrations: [Migration(version: 1, sql: "CREATE TABLE t (x INTEGER) STRICT;")],
                                      syncsAfterCommit: true)
        final class Shared: Sendable {
            let release = Mutex(false)
            /// Per write: the syncs begun when it committed; the order of the `afterCommit`s.
            let begunAtCommit = Mutex([Int64: Int]())
            let committed = Mutex([Int64]())
        }
        let shared = Shared()
        @Sendable func syncs() throws -> (begun: Int, done: Int, early: Int) {
            guard let syncs = queue.logSyncs else { throw GroupedJobFailed() }
            return syncs
        }
        let blocker = Task { try await queue.write { _ in while !shared.release.withLock({ $0 }) { usleep(1000) } } }
        var jobs = [Task<(Int64, Int), any Error>]()
        for i in Int64(1)...40 {
            jobs.append(Task {
                let value = try await queue.writeGrouped({ db in
                    try db.execute("INSERT INTO t VALUES (?)", [i])
                    return i
                }, afterCommit: { i in
                    shared.committed.withLock { $0.append(i) }
                    shared.begunAtCommit.withLock { $0[i] = (try? syncs().begun) ?? -1 }
                }, commitsAlone: { $0 % 10 == 0 })
                return (value, try syncs().done)
            })
            while queue.groupedWaitingCount < Int(i) { try await Task.sleep(for: .milliseconds(1)) }
        }
        shared.release.withLock { $0 = true }
        try await blocker.value
        for job in jobs {
            let (i, doneWhenAnswered) = try await job.value
            let begun = try #require(shared.begunAtCommit.withLock { $0[i] })
            #expect(doneWhenAnswered > begun, "write \(i) was answered when sync \(doneWhenAnswered) was done, begun before its commit (\(begun) begun)")
        }
        #expect(shared.committed.withLock { $0 } == Array(1...40))
        let after = try syncs()
        #expect(after.early == 0, "commits answered before a sync begun after them was done")
        #expect((1...4).contains(after.begun), "four commits, at most one sync each: \(after.begun)")
        #expect(after.done == after.begun)
        // A lone write commits with its own sync, as a plain write does: no sync apart.
        try await queue.writeGrouped({ db in try db.execute("INSERT INTO t VALUES (41)") }, afterCommit: { _ in }, commitsAlone: { _ in false })
        #expect(try syncs().begun == after.begun)
        #expect(try queue.readNow { db in try db.first("SELECT count(*) FROM t") { $0.int(0) } } == 41)
        // A plain write after the groups commits with its own sync, as before.
        #expect(try queue.writeNow { db in try db.first("PRAGMA synchronous") { $0.int(0) } } == 2)
    }

    /// A log that cannot be synced (here removed under the store) fails the writes waiting for
    /// it with an I/O error that says they are written but not known to be on disk: no caller
    /// is told a write is kept that a power loss could take back.
    @Test func aLogThatCannotBeSyncedFailsTheWritesWaitingForIt() async throws {
        let directory = try TemporaryDirectory("log-sync-fails")
        let path = directory.path + "/db.sqlite"
        let queue = try DatabaseQueue(path: path, migrations: [Migration(version: 1, sql: "CREATE TABLE t (x INTEGER) STRICT;")], syncsAfterCommit: true)
        try await queue.writeGrouped({ db in try db.execute("INSERT INTO t VALUES (1)") }, afterCommit: { _ in }, commitsAlone: { _ in false })
        try FileManager.default.removeItem(atPath: path + "-wal")
        // Two writes queued behind a plain one share a group (a lone one syncs in its commit).
        let release = Mutex(false)
        let blocker = Task { try await queue.write { _ in while !release.withLock({ $0 }) { usleep(1000) } } }
        var writes = [Task<Void, any Error>]()
        for i in Int64(2)...3 {
            writes.append(Task {
                try await queue.writeGrouped({ db in try db.execute("INSERT INTO t VALUES (?)", [i]) }, afterCommit: { _ in }, commitsAlone: { _ in false })
            })
            while queue.groupedWaitingCount < Int(i - 1) { try await Task.sleep(for: .milliseconds(1)) }
        }
        release.withLock { $0 = true }
        try await blocker.value
        for write in writes {
            do {
                try await write.value
                Issue.record("a write whose log could not be synced was answered as kept")
            } catch let error as SQLiteError {
                #expect(error.resultCode == .ioError, "\(error)")
                #expect(error.message.contains("to sync it"), "\(error)")
            }
        }
    }

    /// Another process holds the write lock of the store's and the server's databases. Writes
    /// to both — more than the pool has threads — wait for it; meanwhile 20 concurrent store
    /// reads and server requests complete, before the lock is let go. Then the writes land.
    /// A deferred write commits (its rows are there for every reader) without changing how
    /// the writes after it reach the disk: the connection is back to `synchronous=FULL` after
    /// it, whether it committed or failed.
    @Test func aDeferredWriteCommitsAndLeavesTheNextWritesSynced() async throws {
        let directory = try TemporaryDirectory("deferred")
        let queue = try DatabaseQueue(path: directory.path + "/db.sqlite", migrations: [Migration(version: 1, sql: "CREATE TABLE t (x INTEGER) STRICT;")])
        func level() throws -> Int64? { try queue.writeNow { db in try db.first("PRAGMA synchronous") { $0.int(0) } } }
        #expect(try level() == 2)
        try await queue.write(.deferred) { db in try db.execute("INSERT INTO t (x) VALUES (1)") }
        #expect(try level() == 2)
        await #expect(throws: (any Error).self) {
            try await queue.write(.deferred) { db in
                try db.execute("INSERT INTO t (x) VALUES (2)")
                try db.execute("INSERT INTO missing (x) VALUES (3)")
            }
        }
        #expect(try level() == 2)
        #expect(try queue.readNow { db in try db.rows("SELECT x FROM t") { $0.int(0) } } == [1])
    }

    /// The store's sync writes what the backend can give again without a sync of its own; a
    /// pull that pinned a key is synced after all (a key first seen is never forgotten).
    @Test func aPullThatPinsAKeyIsSynced() async throws {
        let fixture = try await ChatFixture(.http)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await bob.send("hello", to: "alice")
        try await bob.sync()
        let path = fixture.storePath("alice") + "/store.sqlite"
        func marker() throws -> Int64? {
            let db = try Database(path: path, readOnly: true)
            return try db.first("SELECT value FROM ck_meta WHERE key = 'pins_synced_at'") { $0.int(0) }
        }
        #expect(try marker() == nil)
        try await alice.sync()
        #expect(try marker() != nil, "bob's key, pinned by the pull, was synced")
    }

    @Test func readsAndRequestsGoOnWhileAnotherProcessHoldsTheWriteLock() async throws {
        let fixture = try await ChatFixture(.http)
        let alice = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        let first = try await alice.send("before the lock", to: "bob")
        try await syncAll([alice, bob])
        let zone = try ZoneName(first.id.conversation)
        let url = try #require(fixture.serverURL)
        let reader = HTTPBackend(url: url, identity: "bob", key: try fixture.key(of: "bob"), policy: ConversationStore.recordPolicy())
        let writer = HTTPBackend(url: url, identity: "alice", key: try fixture.key(of: "alice"), policy: ConversationStore.recordPolicy())
        // The member record, the message and its key shares.
        let held = try await reader.fetchChanges(in: zone, since: nil, limit: 10).records.count
        #expect(held >= 3)

        // Held until the reads are done (or 20 s: reads that waited for the lock would end only
        // then, after "released"). A fixed 3 s was shorter than 20 reads on a loaded machine.
        let release = fixture.directory.path + "/release-the-lock"
        let holder = try ChildProcess(try builtProduct("convkit-lock-holder"), [
            "--seconds", "20", "--until-file", release, "--database", fixture.storePath("alice") + "/store.sqlite",
            "--second-database", fixture.directory.path + "/server/zones.sqlite",
        ])
        #expect(await holder.waitUntil(seconds: 30) { $0.lines.contains("locked") }, "\(holder.standardError)")

        let landed = Counter()
        let aliceKey = try fixture.key(of: "alice")
        let writes = Task {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<3 {
                    group.addTask {
                        _ = try await alice.send("during the lock \(index)", to: "bob")
                        landed.value.add(1, ordering: .relaxed)
                    }
                    group.addTask {
                        var record = try ChatRecordsFixture.message(zone: zone, from: "alice", to: "bob", text: "saved during the lock \(index)")
                        try record.sign(with: aliceKey, clock: HybridLogicalClock().now())
                        _ = try await writer.save([record])[0].get()
                        landed.value.add(1, ordering: .relaxed)
                    }
                }
                try await group.waitForAll()
            }
        }
        try await Task.sleep(for: .milliseconds(100))  // the writes are waiting for the lock now

        let conversation = first.id.conversation
        let answered = try await withThrowingTaskGroup(of: Bool.self) { group in
            for index in 0..<20 {
                group.addTask {
                    if index % 2 == 0 {
                        return try alice.messages(in: conversation).messages.first?.content == "before the lock"
                    }
                    return try await reader.fetchChanges(in: zone, since: nil, limit: 10).records.count == held
                }
            }
            return try await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(answered == Array(repeating: true, count: 20))
        #expect(landed.value.load(ordering: .relaxed) == 0, "no write can land while the lock is held")
        #expect(!holder.lines.contains("released"), "the reads finished while the lock was held")
        #expect(FileManager.default.createFile(atPath: release, contents: nil))

        try await writes.value
        #expect(landed.value.load(ordering: .relaxed) == 6)
        #expect(await holder.wait() == 0)
        #expect(try alice.messages(in: conversation).messages.count == 4)
    }
}

final class Counter: Sendable {
    let value = Atomic<Int>(0)
}

/// Message records as ConversationKit names them, for tests that write past the store.
enum ChatRecordsFixture {
    static func message(zone: ZoneName, from speaker: String, to listener: String, text: String) throws -> Record {
        Record(id: try RecordID(zone: zone, name: "m.\(OwnershipRule.identityHash(speaker)).\(UUID().uuidString)"), type: "Message", fields: [
            "speaker": .string(speaker), "listener": .string(listener), "content": .string(text), "spokenAt": .date(milliseconds: 1_800_000_000_000),
        ])
    }
}
