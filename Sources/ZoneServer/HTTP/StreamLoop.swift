import CMicroHTTPD
import Foundation
import RecordZone
import Synchronization

/// The upgraded connections of one server (its streams, docs/PROTOCOL.md §2, "The stream"): after
/// the `101`, libmicrohttpd hands each socket over, and one epoll thread of this loop reads and
/// writes them all. A push to a stream touches only that stream's socket — nothing walks the
/// other connections, which suspended long polls cost on every answer (libmicrohttpd resumes a
/// connection by walking every suspended one).
///
/// Framing: every frame, both ways, is a 4-byte big-endian length and that many bytes.
final class StreamLoop: Sendable {
    /// The largest frame a client may send (its frames are small: follow lists, pings).
    static let maximumIncomingFrame = 1 << 20
    /// Frames read and not yet taken by the stream's handler at which the socket is no longer
    /// read (a client sending faster than its stream is served waits: TCP holds it back), until
    /// half of them are taken.
    static let maximumQueuedFrames = 256

    private let epoll: Int32
    /// Written to wake the thread for a stop.
    private let wakeup: Int32
    private let connections = Mutex<[Int32: StreamConnection]>([:])
    private let running = Atomic(false)
    /// Set by ``stop()``: a socket upgraded after it is closed at once.
    private let stopped = Atomic(false)
    /// Ends when the thread has.
    private let ended = Mutex<(done: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    init?() {
        let epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epoll >= 0 else { return nil }
        let wakeup = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        guard wakeup >= 0 else {
            close(epoll)
            return nil
        }
        var event = epoll_event(events: EPOLLIN.rawValue, data: epoll_data_t(fd: wakeup))
        guard epoll_ctl(epoll, EPOLL_CTL_ADD, wakeup, &event) == 0 else {
            close(epoll)
            close(wakeup)
            return nil
        }
        self.epoll = epoll
        self.wakeup = wakeup
    }

    /// Streams open now.
    var count: Int { connections.withLock { $0.count } }

    /// Takes over an upgraded socket: `extra` is what libmicrohttpd read past the request.
    /// - Returns: nil when the loop cannot watch it (the connection is then closed).
    func adopt(socket fd: Int32, handle: OpaquePointer, extra: Data) -> StreamConnection? {
        startIfNeeded()
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        let connection = StreamConnection(fd: fd, handle: handle, loop: self)
        connections.withLock { $0[fd] = connection }
        // Checked after the connection is listed: either the stop's sweep finds it, or it sees the stop here.
        var event = epoll_event(events: Self.reading, data: epoll_data_t(fd: fd))
        guard !stopped.load(ordering: .sequentiallyConsistent), epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event) == 0 else {
            connection.close()
            return nil
        }
        if !extra.isEmpty { connection.received(extra) }
        return connection
    }

    /// Closes every stream and ends the thread; returns once it has ended.
    func stop() async {
        stopped.store(true, ordering: .sequentiallyConsistent)
        for connection in connections.withLock({ Array($0.values) }) { connection.close() }
        guard running.load(ordering: .acquiring) else { return }
        var one: UInt64 = 1
        _ = write(wakeup, &one, 8)
        await withCheckedContinuation { continuation in
            let done = ended.withLock { state in
                if !state.done { state.waiters.append(continuation) }
                return state.done
            }
            if done { continuation.resume() }
        }
    }

    deinit {
        close(epoll)
        close(wakeup)
    }

    static let reading = EPOLLIN.rawValue | EPOLLRDHUP.rawValue

    /// Watches `fd` for reading (unless its connection holds as many frames as it takes) and
    /// for writing (while it holds bytes the socket did not take).
    func watch(_ fd: Int32, reading: Bool, writing: Bool) {
        var event = epoll_event(events: (reading ? Self.reading : 0) | (writing ? EPOLLOUT.rawValue : 0), data: epoll_data_t(fd: fd))
        _ = epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &event)
    }

    /// Forgets a closed connection's socket, before libmicrohttpd closes it (its number may be
    /// the next connection's at once).
    func forget(_ fd: Int32) {
        _ = epoll_ctl(epoll, EPOLL_CTL_DEL, fd, nil)
        connections.withLock { _ = $0.removeValue(forKey: fd) }
    }

    private func startIfNeeded() {
        guard running.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        let thread = Thread { [self] in loop() }
        thread.name = "convkit.streams"
        thread.start()
    }

    private func loop() {
        var events = [epoll_event](repeating: epoll_event(), count: 256)
        var stopping = false
        while !stopping {
            let count = epoll_wait(epoll, &events, Int32(events.count), -1)
            if count < 0 {
                if errno == EINTR { continue }
                break
            }
            for event in events.prefix(Int(count)) {
                let fd = event.data.fd
                if fd == wakeup {
                    stopping = true
                    continue
                }
                guard let connection = connections.withLock({ $0[fd] }) else { continue }
                if event.events & (EPOLLERR.rawValue | EPOLLHUP.rawValue) != 0 {
                    connection.close()
                    continue
                }
                if event.events & EPOLLOUT.rawValue != 0 { connection.writable() }
                if event.events & (EPOLLIN.rawValue | EPOLLRDHUP.rawValue) != 0 { connection.readable() }
            }
        }
        let waiters = ended.withLock { state in
            state.done = true
            defer { state.waiters = [] }
            return state.waiters
        }
        waiters.forEach { $0.resume() }
    }
}

/// One stream's socket: frames in (``nextFrame()``), frames out (``send(_:)``), and what is
/// still to be written (``buffered``), held in memory until the socket takes it.
final class StreamConnection: Sendable {
    private struct State {
        var closed = false
        var outgoing = Data()
        var incoming = Data()
        var writing = false
        /// The client's frames not yet taken, and the taker waiting for one.
        var frames: [Data] = []
        var frameWaiter: CheckedContinuation<Data?, Never>?
        /// The socket is not read: ``StreamLoop/maximumQueuedFrames`` wait to be taken.
        var paused = false
        /// The stream is ending: what the client sends is read and dropped (``discardIncoming()``).
        var discarding = false
        var drainWaiters: [(limit: Int, continuation: CheckedContinuation<Void, Never>)] = []
        var closeWaiters: [CheckedContinuation<Void, Never>] = []
    }
    private let fd: Int32
    private struct Handle: @unchecked Sendable { let pointer: OpaquePointer }
    private let handle: Handle
    private unowned let loop: StreamLoop
    private let state = Mutex(State())

    fileprivate init(fd: Int32, handle: OpaquePointer, loop: StreamLoop) {
        self.fd = fd
        self.handle = Handle(pointer: handle)
        self.loop = loop
    }

    /// The client's next frame, in order; nil once the connection is closed, the stream ending
    /// (``discardIncoming()``) or the caller cancelled.
    func nextFrame() async -> Data? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let now = state.withLock { state -> Data?? in
                    if !state.frames.isEmpty {
                        let frame = state.frames.removeFirst()
                        if state.paused, state.frames.count <= StreamLoop.maximumQueuedFrames / 2 {
                            state.paused = false
                            loop.watch(fd, reading: true, writing: state.writing)
                        }
                        return .some(frame)
                    }
                    if state.closed || state.discarding || Task.isCancelled { return .some(nil) }
                    state.frameWaiter = continuation
                    return nil
                }
                if let now { continuation.resume(returning: now) }
            }
        } onCancel: {
            let waiter = state.withLock { state in
                defer { state.frameWaiter = nil }
                return state.frameWaiter
            }
            waiter?.resume(returning: nil)
        }
    }

    /// Whether the connection is closed.
    var isClosed: Bool { state.withLock { $0.closed } }

    /// Bytes queued and not yet taken by the socket.
    var buffered: Int { state.withLock { $0.outgoing.count } }

    /// Queues a frame (`payload` behind its length) and writes what the socket takes now.
    /// - Returns: false when the connection is closed.
    @discardableResult
    func send(_ payload: Data) -> Bool {
        let frame = Wire.StreamFrame.framed(payload)
        let (open, failed) = state.withLock { state -> (Bool, Bool) in
            guard !state.closed else { return (false, false) }
            state.outgoing.append(frame)
            return (true, !flush(&state))
        }
        if failed { close() }
        return open && !failed
    }

    /// Waits until fewer than `limit` bytes wait to be written, or the connection closes.
    func drained(below limit: Int) async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.closed || state.outgoing.count < limit { return true }
                state.drainWaiters.append((limit, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// From now on what the client sends is read and dropped, not queued for ``nextFrame()``: the
    /// stream is ending, and a socket closed with unread bytes sends a reset, which may destroy
    /// the last frames before the client reads them.
    func discardIncoming() {
        let waiter = state.withLock { state in
            state.discarding = true
            state.frames = []
            if state.paused, !state.closed {
                state.paused = false
                loop.watch(fd, reading: true, writing: state.writing)
            }
            defer { state.frameWaiter = nil }
            return state.frameWaiter
        }
        waiter?.resume(returning: nil)
    }

    /// Ends the connection so that what was said last reaches the client: incoming bytes are
    /// dropped, the queue is written out, the sending side is shut (the client reads the end
    /// after the last frame), and the socket is closed once the client has closed its side — or
    /// at `deadline` at the latest.
    func finish(by deadline: ContinuousClock.Instant) async {
        discardIncoming()
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await self.drained(below: 1)
                self.state.withLock { state in
                    if !state.closed { _ = shutdown(self.fd, Int32(SHUT_WR)) }
                }
                await self.closedByEitherSide()
            }
            group.addTask {
                try? await Task.sleep(until: deadline, clock: .continuous)
                self.close()
            }
            await group.next()
            group.cancelAll()
        }
        close()
    }

    /// Returns once the connection is closed (by the client's end or by ``close()``).
    private func closedByEitherSide() async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.closed { return true }
                state.closeWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Closes the connection (once): libmicrohttpd closes the socket.
    func close() {
        let woken = state.withLock { state -> (waiters: [CheckedContinuation<Void, Never>], taker: CheckedContinuation<Data?, Never>?)? in
            guard !state.closed else { return nil }
            state.closed = true
            state.outgoing = Data()
            state.frames = []
            defer {
                state.drainWaiters = []
                state.closeWaiters = []
                state.frameWaiter = nil
            }
            return (state.drainWaiters.map(\.continuation) + state.closeWaiters, state.frameWaiter)
        }
        guard let woken else { return }
        loop.forget(fd)
        _ = cmhd_upgrade_close(handle.pointer)
        woken.taker?.resume(returning: nil)
        woken.waiters.forEach { $0.resume() }
    }

    /// Writes what it can of the queue (under the lock, so a closed socket's number is never
    /// written to). - Returns: false when the socket failed.
    private func flush(_ state: inout State) -> Bool {
        while !state.outgoing.isEmpty {
            let written = state.outgoing.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
            if written > 0 {
                state.outgoing.removeFirst(written)
                continue
            }
            if written < 0, errno == EINTR { continue }
            if written < 0, errno == EAGAIN || errno == EWOULDBLOCK { break }
            return false
        }
        let writing = !state.outgoing.isEmpty
        if writing != state.writing {
            state.writing = writing
            loop.watch(fd, reading: !state.paused, writing: writing)
        }
        if state.outgoing.isEmpty { state.outgoing = Data() }
        return true
    }

    /// The socket can take more (on the loop's thread).
    fileprivate func writable() {
        let (failed, ready) = state.withLock { state -> (Bool, [CheckedContinuation<Void, Never>]) in
            guard !state.closed else { return (false, []) }
            let failed = !flush(&state)
            let count = state.outgoing.count
            let ready = state.drainWaiters.filter { count < $0.limit }.map(\.continuation)
            state.drainWaiters.removeAll { count < $0.limit }
            return (failed, ready)
        }
        ready.forEach { $0.resume() }
        if failed { close() }
    }

    /// The socket has bytes, or its peer closed (on the loop's thread).
    fileprivate func readable() {
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let read = state.withLock { state -> Int? in
                guard !state.closed, !state.paused else { return nil }
                return buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            }
            guard let read else { return }  // closed, or holding as many frames as it takes
            if read > 0 {
                received(Data(buffer[0..<read]))
                if read < buffer.count { return }
                continue
            }
            if read < 0, errno == EINTR { continue }
            if read < 0, errno == EAGAIN || errno == EWOULDBLOCK { return }
            close()  // the peer closed (0), or the socket failed
            return
        }
    }

    /// Bytes from the client: every complete frame is queued for ``nextFrame()`` (or handed to
    /// its waiting taker); with as many queued as it takes, the socket is no longer read.
    fileprivate func received(_ bytes: Data) {
        let (taker, first, violation) = state.withLock { state -> (CheckedContinuation<Data?, Never>?, Data?, Bool) in
            guard !state.closed, !state.discarding else { return (nil, nil, false) }
            state.incoming.append(bytes)
            var violation = false
            while state.incoming.count >= 4 {
                let start = state.incoming.startIndex
                let length = state.incoming[start..<start + 4].reduce(0) { $0 << 8 | Int($1) }
                guard length <= StreamLoop.maximumIncomingFrame else {
                    violation = true
                    break
                }
                guard state.incoming.count >= 4 + length else { break }
                state.frames.append(Data(state.incoming[start + 4..<start + 4 + length]))
                state.incoming.removeFirst(4 + length)
            }
            if state.incoming.isEmpty { state.incoming = Data() }
            var handed: (CheckedContinuation<Data?, Never>, Data)?
            if let waiter = state.frameWaiter, !state.frames.isEmpty {
                state.frameWaiter = nil
                handed = (waiter, state.frames.removeFirst())
            }
            if !state.paused, state.frames.count >= StreamLoop.maximumQueuedFrames {
                state.paused = true
                loop.watch(fd, reading: false, writing: state.writing)
            }
            return (handed?.0, handed?.1, violation)
        }
        taker?.resume(returning: first)
        if violation { close() }
    }
}
