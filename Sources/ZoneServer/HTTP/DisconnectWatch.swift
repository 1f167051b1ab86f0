import CLibMicroHTTPD
import CMicroHTTPD
import Synchronization

/// Tells of clients that went away while their request waited. libmicrohttpd does not look at a
/// suspended connection's socket, so a long poll whose client closed its connection would wait
/// out its whole timeout, holding its descriptor and memory: a crowd of clients that vanish (a
/// network change, a restart) would be kept as long as they had asked to wait. The watch (the
/// shim's own epoll thread) learns of the peer's close or reset at once and calls `gone` with
/// the request's id; the server cancels its handler, and the connection, resumed, is closed by
/// libmicrohttpd.
final class DisconnectWatch: Sendable {
    private struct Watch: @unchecked Sendable { let pointer: OpaquePointer }
    private let watch: Watch
    private let gone: @Sendable (UInt64) -> Void
    private let stopped = Atomic(false)

    /// nil when the watch cannot start (no descriptor or thread left): requests are then not
    /// watched. Its thread runs until ``stop()`` (or the watch is freed).
    init?(gone: @escaping @Sendable (UInt64) -> Void) {
        guard let made = cmhd_watch_new() else { return nil }
        watch = Watch(pointer: made)
        self.gone = gone
        let started = cmhd_watch_run(made, { context, id in
            guard let context else { return }
            Unmanaged<DisconnectWatch>.fromOpaque(context).takeUnretainedValue().gone(id)
        }, Unmanaged.passUnretained(self).toOpaque())
        if started != 0 { return nil }
    }

    deinit { stop() }

    /// A watched connection, for ``remove(_:)``.
    struct Watched { fileprivate let fd: Int32 }

    /// Watches a suspended connection; nil when it cannot be watched. Remove the watch before
    /// the connection is resumed.
    func add(_ connection: OpaquePointer, id: UInt64) -> Watched? {
        let fd = cmhd_watch_add(watch.pointer, connection, id)
        return fd >= 0 ? Watched(fd: fd) : nil
    }

    func remove(_ watched: Watched) {
        cmhd_watch_remove(watch.pointer, watched.fd)
    }

    /// Stops the watch's thread (no callback runs after this returns) and frees it. Its owner
    /// stops it: the thread refers to the watch without keeping it.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        cmhd_watch_stop(watch.pointer)
    }
}
