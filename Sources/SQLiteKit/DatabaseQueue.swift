import CSQLite
import Foundation
import Synchronization

/// The serial owner of a store's SQLite file: one writer connection and one reader
/// connection, each with its own serial dispatch queue. In WAL mode a read never waits for a
/// write in progress (a sync applying pages), and writes are serialized.
///
/// The `async` variants run the closure on the connection's queue and resume the caller when it
/// is done (as GRDB's `SerializedDatabase` does): a slow disk, an fsync or another process's
/// lock holds that queue's thread, never Swift's cooperative pool; cancelling the caller's task
/// interrupts its statement (or drops a job not started yet). The synchronous variants
/// block the caller until the queue has run the closure, for the few callers that cannot wait
/// (opening, tests).
public final class DatabaseQueue: Sendable {
    /// A connection and the queue that serializes it. The connection never leaves the queue
    /// except as the parameter of a closure that runs on it.
    private final class Serialized: @unchecked Sendable {
        private let queue: DispatchQueue
        private let database: Database
        init(_ database: Database, label: String) {
            self.database = database
            queue = DispatchQueue(label: label, qos: .userInitiated)
        }

        /// Runs, on the queue, every job waiting in `group` in one transaction. With `log`, and
        /// more than one job, the transaction commits without a sync (`synchronous=NORMAL`) and
        /// its writes' callers are answered once ``LogSync`` has synced the log past it; a lone
        /// job (or without `log`) commits with its sync, as a plain write does.
        func runGroup(_ group: Group, log: LogSync?) {
            queue.async {
                let jobs = group.pending.withLock { pending in
                    defer { pending = [] }
                    return pending
                }
                let log = jobs.count > 1 ? log : nil
                var waiting = [Group.Ran]()
                func fail(_ error: any Error) {
                    waiting.forEach { $0.answer(.failure(error)) }
                    waiting = []
                }
                /// - Parameter more: jobs of this run follow (the writer is not idle after it).
                func commit(more: Bool) {
                    let finishing = self.database.beforeCommit
                    self.database.beforeCommit = []
                    guard !self.database.isAutocommit else { return }
                    do {
                        for work in finishing { try work(self.database) }
                        try self.database.execute("COMMIT")
                    } catch {
                        try? self.database.execute("ROLLBACK")
                        return fail(error)
                    }
                    // Committed: what follows the stored state changes now, in commit order and
                    // before the next write begins; the callers are answered once it is on disk.
                    waiting.forEach { $0.afterCommit() }
                    let answers = waiting.map(\.answer)
                    waiting = []
                    if let log {
                        log.answer(answers, inline: !more && group.pending.withLock { $0.isEmpty })
                    } else {
                        answers.forEach { $0(.success(())) }
                    }
                }
                // The level cannot change inside a transaction: set around the group's.
                if log != nil { try? self.database.execute("PRAGMA synchronous = NORMAL") }
                self.database.isGrouped = true
                defer {
                    self.database.isGrouped = false
                    if log != nil { try? self.database.execute("PRAGMA synchronous = FULL") }
                }
                for (index, job) in jobs.enumerated() {
                    if self.database.isAutocommit {
                        do { try self.database.execute("BEGIN IMMEDIATE") } catch {
                            // Not even a transaction: this job cannot run; the next may.
                            job.refuse(error)
                            continue
                        }
                    }
                    let ran = job.run(self.database)
                    if let ran { waiting.append(ran) }
                    // An error SQLite answers by rolling the whole transaction back (a full
                    // disk, an I/O error) took the jobs before it along: they fail too.
                    if self.database.isAutocommit {
                        self.database.beforeCommit = []
                        fail(SQLiteError(code: 1, message: "the transaction was rolled back by an error of a write grouped with it"))
                    }
                    if ran?.commitNow == true { commit(more: index < jobs.count - 1) }
                }
                commit(more: false)
            }
        }

        func sync<T>(_ body: (Database) throws -> T) rethrows -> T {
            try queue.sync { try body(database) }
        }

        /// Runs `body` on the queue. Cancelling the waiting task reaches SQLite, as GRDB's
        /// does: a job not started yet never runs (`CancellationError`); one running has its
        /// statement interrupted (`sqlite3_interrupt`: it fails with ``ResultCode/interrupted``
        /// and its transaction rolls back), and every statement it starts after that too (the
        /// connection's stop flag). Both are made under the job's lock, while the job runs, and
        /// the flag is cleared under it when the job ends, so neither reaches the next job.
        func async<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
            let job = Mutex(JobState.waiting)
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { continuation in
                    queue.async {
                        let start = job.withLock { state -> Bool in
                            guard state == .waiting else { return false }
                            state = .running
                            return true
                        }
                        guard start else { return continuation.resume(throwing: CancellationError()) }
                        let result = Result { try body(self.database) }
                        job.withLock { state in
                            state = .done
                            self.database.stopRequested.value.store(false, ordering: .relaxed)
                        }
                        continuation.resume(with: result)
                    }
                }
            } onCancel: {
                job.withLock { state in
                    switch state {
                    case .waiting: state = .cancelled
                    case .running:
                        // The statement running now, and any the job starts after (the flag,
                        // cleared under this lock when the job ends, never reaches the next).
                        self.database.stopRequested.value.store(true, ordering: .relaxed)
                        sqlite3_interrupt(self.database.handle)  // thread-safe, by design
                    case .done, .cancelled: break
                    }
                }
            }
        }
    }

    private enum JobState { case waiting, running, done, cancelled }

    /// Writes waiting to share the writer's next transaction (``writeGrouped(_:afterCommit:)``).
    private final class Group: Sendable {
        /// A job runs its body (in a savepoint) and returns what to do once the transaction's
        /// fate is known, or nil when it failed or was cancelled (and has answered already);
        /// or it is refused without running.
        struct Job: Sendable {
            let run: @Sendable (Database) -> Ran?
            let refuse: @Sendable (any Error) -> Void
        }
        /// A job that ran: what follows its commit (on the writer, in commit order), its
        /// caller's answer (once the commit is on disk, or the transaction failed), and whether
        /// the transaction commits right after it.
        struct Ran: Sendable {
            let afterCommit: @Sendable () -> Void
            let answer: @Sendable (Result<Void, any Error>) -> Void
            let commitNow: Bool
        }
        let pending = Mutex<[Job]>([])
    }
    private let group = Group()

    private let writer: Serialized
    private let reader: Serialized
    private let log: LogSync?
    public let path: String
    /// The log's syncs apart from the commits (``LogSync``): begun, the number of the last one
    /// done, and commits answered before a sync begun after them was done; nil without them.
    var logSyncs: (begun: Int, done: Int, early: Int)? { log?.counts }

    /// Opens the file, sets WAL mode and durable commits, and runs `migrations` on the writer.
    /// - Parameter readOnly: open an existing file without write access (both connections):
    ///   nothing is created or migrated, and every write fails (`SQLITE_READONLY`).
    /// - Parameter syncsAfterCommit: grouped writes (``writeGrouped(_:afterCommit:commitsAlone:)``)
    ///   commit without a sync, and their callers resume once ``LogSync`` synced the log past
    ///   them: the writer runs the next group while this one's log reaches the disk. What they
    ///   wrote is then seen by readers before it is on disk (a power loss in between loses it
    ///   and no caller was told it was kept): for a store, whose readers are its own; not for a
    ///   server, whose readers would be told of versions a power loss can take back.
    /// - Throws: ``SQLiteError``; read-only, also for a file whose schema is not the newest.
    public init(path: String, migrations: [Migration], readOnly: Bool = false, syncsAfterCommit: Bool = false) throws(SQLiteError) {
        let writer = try Database(path: path, readOnly: readOnly)
        if readOnly {
            let current = try writer.userVersion
            if let newest = migrations.map(\.version).max(), current != newest {
                throw SQLiteError(code: ResultCode.error.rawValue,
                                  message: current > newest ? "the database has schema version \(current); this version knows up to \(newest)"
                                                            : "the database has schema version \(current), not \(newest): open it once for writing to migrate it",
                                  schema: SQLiteError.SchemaMismatch(found: current, known: newest))
            }
        } else {
            try writer.execute("PRAGMA journal_mode = WAL")
            try writer.execute("PRAGMA synchronous = FULL")
            try writer.execute("PRAGMA foreign_keys = ON")
            try Migration.run(migrations, on: writer)
        }
        let reader = try Database(path: path, readOnly: true)
        self.writer = Serialized(writer, label: "convkit.sqlite.writer")
        self.reader = Serialized(reader, label: "convkit.sqlite.reader")
        self.log = syncsAfterCommit && !readOnly ? LogSync(databasePath: path) : nil
        self.path = path
    }

    /// Runs `body` in a write transaction on the writer's queue: all of it commits, or none of it.
    public func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await writer.async { db in try db.transaction { try body(db) } }
    }

    /// How a write transaction reaches the disk.
    public enum Durability: Sendable {
        /// On disk before the call returns (`synchronous=FULL`: the log is synced at the commit).
        case synced
        /// Committed without a sync of its own (`synchronous=NORMAL` for this commit; WAL mode):
        /// a crash of the process loses nothing, a power loss may lose it — only together with
        /// every commit after it, since the next synced commit or checkpoint syncs the log up to
        /// it. For what can be had again (what a server holds, and the token that says so).
        case deferred
    }

    /// ``write(_:)`` with a chosen durability.
    public func write<T: Sendable>(_ durability: Durability, _ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        guard durability == .deferred else { return try await write(body) }
        return try await writer.async { db in
            // The level cannot change inside a transaction: set around it.
            try db.execute("PRAGMA synchronous = NORMAL")
            defer { try? db.execute("PRAGMA synchronous = FULL") }
            return try db.transaction { try body(db) }
        }
    }

    /// Runs `body` in a write transaction, then, once it committed and before the next write
    /// begins, `afterCommit` with its result: shared state that must follow what is stored
    /// (key pins) changes only after the commit, and in commit order.
    public func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T, afterCommit: @escaping @Sendable (T) -> Void) async throws -> T {
        try await writer.async { db in
            let result = try db.transaction { try body(db) }
            afterCommit(result)
            return result
        }
    }

    /// ``write(_:afterCommit:)``, sharing its transaction — and so its commit and fsync — with
    /// the other grouped writes that arrived while the writer was busy (group commit: under many
    /// concurrent writers, one sync serves them all instead of each waiting for its own). Each
    /// runs in a savepoint: one that throws is undone alone and gets its error; the others
    /// commit together, in arrival order, each seeing what those before it wrote, and each
    /// `afterCommit` runs after the commit, in that order — so a job whose `afterCommit` changes
    /// what the next job must see (key pins it binds) says so with `commitsAlone`: the
    /// transaction commits right after it, its `afterCommit` runs, and the jobs after it go into
    /// the next transaction. When the commit fails, all fail. A
    /// cancelled job not started yet never runs; one running is not interrupted (an interrupt
    /// would roll back the jobs before it too).
    public func writeGrouped<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T, afterCommit: @escaping @Sendable (T) -> Void,
                                          commitsAlone: @escaping @Sendable (T) -> Bool) async throws -> T {
        let job = Mutex(JobState.waiting)
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                let run: @Sendable (Database) -> Group.Ran? = { db in
                    let start = job.withLock { state -> Bool in
                        guard state == .waiting else { return false }
                        state = .running
                        return true
                    }
                    guard start else {
                        continuation.resume(throwing: CancellationError())
                        return nil
                    }
                    let result = Result { try db.savepoint { try body(db) } }
                    job.withLock { $0 = .done }
                    switch result {
                    case .failure(let error):
                        continuation.resume(throwing: error)
                        return nil
                    case .success(let value):
                        return Group.Ran(afterCommit: { afterCommit(value) }, answer: { durable in
                            switch durable {
                            case .success: continuation.resume(returning: value)
                            case .failure(let error): continuation.resume(throwing: error)
                            }
                        }, commitNow: commitsAlone(value))
                    }
                }
                let first = group.pending.withLock { pending in
                    pending.append(Group.Job(run: run, refuse: { error in
                        job.withLock { $0 = .done }
                        continuation.resume(throwing: error)
                    }))
                    return pending.count == 1
                }
                if first { writer.runGroup(group, log: log) }
            }
        } onCancel: {
            job.withLock { if $0 == .waiting { $0 = .cancelled } }
        }
    }

    /// Grouped writes waiting for the writer's next transaction.
    public var groupedWaitingCount: Int { group.pending.withLock { $0.count } }

    /// Runs `body` in a read transaction on the reader's queue: one consistent snapshot.
    public func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await reader.async { db in try Self.snapshot(db, body) }
    }

    /// ``write(_:)``, blocking the caller until it is done.
    public func writeNow<T>(_ body: (Database) throws -> T) throws -> T {
        try writer.sync { db in try db.transaction { try body(db) } }
    }

    /// ``read(_:)``, blocking the caller until it is done (reads are short and never wait for
    /// a writer in WAL mode).
    public func readNow<T>(_ body: (Database) throws -> T) throws -> T {
        try reader.sync { db in try Self.snapshot(db, body) }
    }

    private static func snapshot<T>(_ db: Database, _ body: (Database) throws -> T) throws -> T {
        try db.execute("BEGIN DEFERRED")
        defer { try? db.execute("COMMIT") }
        return try body(db)
    }
}

/// The write-ahead log synced apart from the commits
/// (``DatabaseQueue/init(path:migrations:readOnly:syncsAfterCommit:)``): a grouped transaction
/// commits without a sync, and its callers are answered after the next `fdatasync` of the log —
/// on the writer at once when nothing else waits (one writer keeps its latency), otherwise on
/// a queue of its own while the writer goes on, one sync answering every commit made before
/// it (as PostgreSQL's and InnoDB's group commit flush the log once for many).
final class LogSync: Sendable {
    typealias Answer = @Sendable (Result<Void, any Error>) -> Void
    /// The callers of one commit, and the syncs begun before it (one of them does not cover it).
    private struct Commit {
        let answers: [Answer]
        let syncsBefore: Int
    }
    private struct State {
        var waiting: [Commit] = []
        var running = false
        /// The directory is synced once, with the first sync (the log's name in it).
        var directorySynced = false
        /// Syncs begun, and the number of the last one done; commits answered before a sync
        /// begun after them was done (none: what a test holds the answers to).
        var begun = 0, done = 0, early = 0
    }
    private let log: String
    private let directory: String
    private let queue = DispatchQueue(label: "convkit.sqlite.log-sync", qos: .userInitiated)
    private let state = Mutex(State())

    init(databasePath: String) {
        log = databasePath + "-wal"
        directory = (databasePath as NSString).deletingLastPathComponent
    }

    /// Answers the callers of a commit just made (on the writer) once the log is on disk.
    /// - Parameter inline: nothing else waits for the writer: sync here, unless a sync is
    ///   running already (whose callers are answered first).
    func answer(_ answers: [Answer], inline: Bool) {
        enum Next { case syncHere(Commit), start, queued }
        let next = state.withLock { state -> Next in
            let commit = Commit(answers: answers, syncsBefore: state.begun)
            if inline, !state.running { return .syncHere(commit) }
            state.waiting.append(commit)
            if state.running { return .queued }
            state.running = true
            return .start
        }
        switch next {
        case .syncHere(let commit): syncAndAnswer([commit])
        case .start: queue.async { self.drain() }
        case .queued: break
        }
    }

    /// Syncs for every commit waiting, until none is.
    private func drain() {
        while let commits = state.withLock({ state -> [Commit]? in
            guard !state.waiting.isEmpty else {
                state.running = false
                return nil
            }
            defer { state.waiting = [] }
            return state.waiting
        }) {
            syncAndAnswer(commits)
        }
    }

    /// `fdatasync` of the log (any descriptor of the file syncs it), and of the directory the
    /// first time; then the commits' callers. A failure is an error for every commit it
    /// answers: written, not known to be on disk.
    private func syncAndAnswer(_ commits: [Commit]) {
        let (number, directorySynced) = state.withLock { state in
            state.begun += 1
            return (state.begun, state.directorySynced)
        }
        let synced = Result {
            try Self.sync(log, data: true)
            if !directorySynced { try Self.sync(directory, data: false) }
        }
        state.withLock { state in
            if case .success = synced { state.directorySynced = true }
            state.done = number
            state.early += commits.count { state.done <= $0.syncsBefore }
        }
        for commit in commits { commit.answers.forEach { $0(synced) } }
    }

    private static func sync(_ path: String, data: Bool) throws {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw SQLiteError(code: SQLITE_IOERR, message: "cannot open \(path) to sync it: \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        guard (data ? fdatasync(fd) : fsync(fd)) == 0 else {
            throw SQLiteError(code: SQLITE_IOERR, message: "cannot sync \(path): \(String(cString: strerror(errno))) (the transaction is written, not known to be on disk)")
        }
    }

    /// Syncs begun, the number of the last one done, and commits answered early.
    var counts: (begun: Int, done: Int, early: Int) { state.withLock { ($0.begun, $0.done, $0.early) } }
}

/// One step of the schema, keyed by `PRAGMA user_version`: migration N moves the schema from
/// version N-1 to N, inside a transaction.
public struct Migration: Sendable {
    public let version: Int
    public let sql: String

    public init(version: Int, sql: String) {
        self.version = version
        self.sql = sql
    }

    static func run(_ migrations: [Migration], on db: Database) throws(SQLiteError) {
        let current = try db.userVersion
        if let newest = migrations.map(\.version).max(), current > newest {
            throw SQLiteError(code: ResultCode.error.rawValue, message: "the database has schema version \(current); this version of ConversationKit knows up to \(newest)",
                              schema: SQLiteError.SchemaMismatch(found: current, known: newest))
        }
        for migration in migrations.sorted(by: { $0.version < $1.version }) where migration.version > current {
            do {
                try db.transaction {
                    try db.execute(migration.sql)
                    try db.execute("PRAGMA user_version = \(migration.version)")
                }
            } catch let error as SQLiteError {
                throw error
            } catch {
                throw SQLiteError(code: 1, message: "\(error)")
            }
        }
    }
}
