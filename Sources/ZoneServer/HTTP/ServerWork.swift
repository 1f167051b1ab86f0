import Synchronization

/// Work a server must see end before it stops — each request's handler, each stream, each
/// answer on its way out — by id, each perhaps a task. A stop closes it (no work starts after
/// that), waits until none is left (woken as the last ends: no polling), and cancels the tasks
/// still running at its deadline.
///
/// The tasks are tasks of their own, not a task group's children: removing a finished child
/// from a group walks the group's children, which cost O(online) per answer with ten thousand
/// long polls waiting. Their lifetime is bounded here instead: nothing runs after ``close()``
/// and ``waitUntilEmpty(until:)`` but what was already running.
final class ServerWork: Sendable {
    private struct State {
        /// Each piece of work, with its task (nil: none, an answer on its way out).
        var items: [UInt64: Task<Void, Never>?] = [:]
        var nextID: UInt64 = 0
        var closed = false
        /// Set by ``cancelAll()``: a task started after is cancelled at once.
        var cancelled = false
        var emptyWaiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter: UInt64 = 0
        /// Waiters whose deadline passed before they waited.
        var expired: Set<UInt64> = []
    }
    private let state = Mutex(State())

    /// Work not ended.
    var count: Int { state.withLock { $0.items.count } }

    /// Runs `body` (given its id) as a task of this work on `executor`, unless the work is closed;
    /// `prepare` runs first, under the same lock as the close, so that a stop either waits for
    /// this work or refuses it — never neither. - Returns: the id, nil when closed (nothing ran).
    func start(on executor: some TaskExecutor, prepare: () -> Void = {}, _ body: @escaping @Sendable (UInt64) async -> Void) -> UInt64? {
        state.withLock { state in
            guard !state.closed else { return nil }
            prepare()
            state.nextID &+= 1
            let id = state.nextID
            // Stored under the lock the task's own end takes: never removed before it is stored.
            let task = Task(executorPreference: executor) {
                await body(id)
                self.end(id)
            }
            if state.cancelled { task.cancel() }
            state.items[id] = .some(task)
            return id
        }
    }

    /// Counts work without a task (an answer on its way out), closed or not. - Returns: its id.
    func begin() -> UInt64 {
        state.withLock { state in
            state.nextID &+= 1
            state.items[state.nextID] = .some(nil)
            return state.nextID
        }
    }

    /// Work `id` ended (a task's ends by itself).
    func end(_ id: UInt64) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.items[id] = nil
            guard state.items.isEmpty else { return [] }
            defer { state.emptyWaiters = [:] }
            return Array(state.emptyWaiters.values)
        }
        waiters.forEach { $0.resume() }
    }

    /// Cancels work `id`'s task (its client went away). - Returns: whether it was running.
    @discardableResult
    func cancel(_ id: UInt64) -> Bool {
        guard let task = state.withLock({ $0.items[id] ?? nil }) else { return false }
        task.cancel()
        return true
    }

    /// No work starts from now on (``start(on:prepare:_:)`` refuses it).
    func close() {
        state.withLock { $0.closed = true }
    }

    /// Cancels every task, and any started from now on. - Returns: how many were running.
    @discardableResult
    func cancelAll() -> Int {
        let tasks = state.withLock { state in
            state.cancelled = true
            return state.items.values.compactMap { $0 }
        }
        tasks.forEach { $0.cancel() }
        return tasks.count
    }

    /// Waits until no work is left, or until `deadline` (nil: however long it takes).
    /// - Returns: whether none is left.
    @discardableResult
    func waitUntilEmpty(until deadline: ContinuousClock.Instant? = nil) async -> Bool {
        let waiter = state.withLock { state in
            state.nextWaiter &+= 1
            return state.nextWaiter
        }
        let timer = deadline.map { deadline in
            Task {
                try? await Task.sleep(until: deadline, clock: .continuous)
                self.release(waiter)
            }
        }
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.items.isEmpty || state.expired.contains(waiter) { return true }
                state.emptyWaiters[waiter] = continuation
                return false
            }
            if now { continuation.resume() }
        }
        timer?.cancel()
        return state.withLock { state in
            state.expired.remove(waiter)
            return state.items.isEmpty
        }
    }

    /// Lets waiter `id` go (its deadline passed), or, not waiting yet, keeps it from waiting.
    private func release(_ id: UInt64) {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard let waiter = state.emptyWaiters.removeValue(forKey: id) else {
                state.expired.insert(id)
                return nil
            }
            return waiter
        }
        waiter?.resume()
    }
}
