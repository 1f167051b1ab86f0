import CLibMicroHTTPD
import CMicroHTTPD
import Synchronization

/// Ends the handlers of requests whose client has gone. libmicrohttpd does not look at a
/// suspended connection's socket, so a long poll whose client closed its connection would wait
/// out its whole timeout, holding its descriptor and memory: a crowd of clients that vanish
/// (a network change, a restart) would be kept as long as they had asked to wait. The watch
/// (the shim's own epoll thread) is told of the peer's close or reset at once; the handler is
/// cancelled, and its connection, resumed, is closed by libmicrohttpd.
final class DisconnectWatch: Sendable {
    private struct Watch: @unchecked Sendable { let pointer: OpaquePointer }
    private let watch: Watch
    private struct State {
        var next: UInt64 = 0
        var running: [UInt64: Task<HTTPResponse, Never>] = [:]
    }
    private let state = Mutex(State())
    private let counters: HTTPCounters

    private let stopped = Atomic(false)

    /// nil when the watch cannot start (no descriptor or thread left): requests are then
    /// handled without it. Its thread runs until ``stop()`` (or the watch is freed).
    init?(counters: HTTPCounters) {
        guard let made = cmhd_watch_new() else { return nil }
        watch = Watch(pointer: made)
        self.counters = counters
        let started = cmhd_watch_run(made, { context, cookie in
            guard let context else { return }
            Unmanaged<DisconnectWatch>.fromOpaque(context).takeUnretainedValue().gone(cookie)
        }, Unmanaged.passUnretained(self).toOpaque())
        if started != 0 { return nil }
    }

    deinit { stop() }

    /// Runs `work` (in a task of its own, which a disconnect cancels) while the suspended
    /// `connection`'s socket is watched; the watch is removed before this returns, so before the
    /// connection is resumed.
    func respond(on connection: OpaquePointer, executor: any TaskExecutor, _ work: @escaping @Sendable () async -> HTTPResponse) async -> HTTPResponse {
        let task = Task(executorPreference: executor) { await work() }
        let cookie = state.withLock { state in
            state.next &+= 1
            state.running[state.next] = task
            return state.next
        }
        let fd = cmhd_watch_add(watch.pointer, connection, cookie)
        let response = await withTaskCancellationHandler { await task.value } onCancel: { task.cancel() }
        state.withLock { _ = $0.running.removeValue(forKey: cookie) }
        if fd >= 0 { cmhd_watch_remove(watch.pointer, fd) }
        return response
    }

    private func gone(_ cookie: UInt64) {
        guard let task = state.withLock({ $0.running.removeValue(forKey: cookie) }) else { return }
        counters.abandoned.add(1, ordering: .relaxed)
        task.cancel()
    }

    /// Stops the watch's thread (no callback runs after this returns) and frees it. Its owner
    /// stops it: the thread refers to the watch without keeping it.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        cmhd_watch_stop(watch.pointer)
    }
}
