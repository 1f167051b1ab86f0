import CCrowd
import Foundation
import RecordZone
import Synchronization

/// A crowd of online clients, as a zone server sees them, on one raw connection per client, from
/// many loopback addresses: each holds a stream (`streams`: what a continuously syncing store
/// of this version does, docs/PROTOCOL.md §2.4) following its zone and asking for the feed, and
/// takes the pages pushed down it (and the `feed` frame each stream gets when it asks, after
/// which a store would read the feed once: the crowd does not), pinging every 15 s; or, as older stores did, a long poll on its zone
/// (`GET /v1/zones/{zone}/wait`), and when it answers `changed` fetches what changed and waits
/// again from the new token. One thread and one epoll instance run them all, so that ten
/// thousand clients cost the machine little besides the server.
///
/// Used by `convkit-bench --only capacity` and by the tests of a server under a crowd.
public final class Crowd: @unchecked Sendable {
    /// One client: who it is, the zone it follows, the address it connects from.
    public struct Member: Sendable {
        public var identity: String
        public var key: SigningKey
        public var zone: ZoneName
        public var source: String
        public init(identity: String, key: SigningKey, zone: ZoneName, source: String) {
            self.identity = identity
            self.key = key
            self.zone = zone
            self.source = source
        }
    }

    /// Reconnecting clients: `share` of them (0...1) close their connection every 2–4 s and open
    /// a new one, resuming their wait.
    public struct Churn: Sendable {
        public var share: Double
        public var every: ClosedRange<Double>
        public init(share: Double, every: ClosedRange<Double> = 2...4) {
            self.share = share
            self.every = every
        }
    }

    /// What the crowd saw so far.
    public struct Stats: Sendable {
        /// Clients with a poll sent and not yet answered, or a stream open.
        public var waiting = 0
        /// Polls answered `changed` (pages pushed down streams), and records fetched after them
        /// (pushed).
        public var wakes = 0
        public var fetched = 0
        /// Connections opened (first ones and reconnections).
        public var connections = 0
        /// Failures an honest client would see: a refused or reset connection, a connection
        /// closed before its answer, an answer other than 200.
        public var errors = 0
        /// The first few failures, described.
        public var firstErrors: [String] = []
    }

    private enum Phase { case connecting, sending, reading, idle }
    private final class Client {
        let member: Member
        let index: Int
        var fd: Int32 = -1
        var phase = Phase.idle
        var token: String?
        var out = [UInt8]()
        var sent = 0
        var buffer = [UInt8]()
        /// The request in flight is a fetch of changes (else a wait).
        var fetching = false
        /// A wait sent (or being sent) and not answered.
        var waiting = false
        /// The stream was opened (its `101` read).
        var upgraded = false
        var lastSent = ContinuousClock.now
        var churnAt: ContinuousClock.Instant?
        init(member: Member, index: Int) {
            self.member = member
            self.index = index
        }
    }

    private let port: UInt16
    private let streams: Bool
    private let waitSeconds: Int
    private let churn: Churn?
    private let clients: [Client]
    private let epoll: Int32
    /// What `recv` reads into (the crowd's thread only).
    private var chunk = [UInt8](repeating: 0, count: 16 << 10)
    private let stats = Mutex(Stats())
    private let stopping = Atomic(0)  // 1: stop; 2: vanish (reset every connection) and stop
    private let finished = Mutex<CheckedContinuation<Void, Never>?>(nil)
    private let done = Atomic(false)
    /// Called on the crowd's thread when a client fetched records after a wake: which client,
    /// how many records.
    private let onFetched: @Sendable (Int, Int) -> Void

    /// - Parameters:
    ///   - streams: each client holds a stream, rather than long polls.
    ///   - waitSeconds: each poll's `timeout`.
    ///   - onFetched: told (on the crowd's thread) of each fetch (push) that brought records.
    public init(port: Int, members: [Member], streams: Bool = false, waitSeconds: Int = 30, churn: Churn? = nil, onFetched: @escaping @Sendable (Int, Int) -> Void = { _, _ in }) throws {
        let epoll = ccrowd_epoll()
        guard epoll >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: -epoll) ?? .EIO) }
        self.epoll = epoll
        self.port = UInt16(port)
        self.streams = streams
        self.waitSeconds = waitSeconds
        self.churn = churn
        self.onFetched = onFetched
        clients = members.enumerated().map { Client(member: $0.element, index: $0.offset) }
        if let churn {
            let now = ContinuousClock.now
            for client in clients where Double.random(in: 0..<1) < churn.share {
                client.churnAt = now + .seconds(Double.random(in: churn.every))
            }
        }
    }

    deinit { close(epoll) }

    public var snapshot: Stats { stats.withLock { $0 } }

    /// Connects every client (a few hundred at a time) and runs the crowd on a thread of its own
    /// until ``stop()`` or ``vanish()``.
    public func start() {
        let thread = Thread { [self] in
            run()
            done.store(true, ordering: .releasing)
            finished.withLock { $0 }?.resume()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// Closes every connection, each with a reset, without a word to the server (clients whose
    /// network went away), and stops.
    public func vanish() async { await end(2) }

    /// Closes every connection and stops.
    public func stop() async { await end(1) }

    private func end(_ how: Int) async {
        stopping.store(how, ordering: .releasing)
        await withCheckedContinuation { continuation in
            let already = finished.withLock { waiting -> Bool in
                if done.load(ordering: .acquiring) { return true }
                waiting = continuation
                return false
            }
            if already { continuation.resume() }
        }
    }

    // MARK: The loop (the crowd's thread only)

    private func run() {
        var pending = clients[...]
        var data = [UInt64](repeating: 0, count: 256)
        var ready = [UInt32](repeating: 0, count: 256)
        var nextChurnLook = ContinuousClock.now
        while stopping.load(ordering: .acquiring) == 0 {
            // Connect in steps, so that the server's accept queue is not flooded.
            var opened = 0
            while opened < 200, let client = pending.popFirst() {
                connect(client)
                opened += 1
            }
            let n = Int(ccrowd_wait(epoll, &data, &ready, 256, pending.isEmpty ? 20 : 1))
            for i in 0..<max(0, n) {
                let client = clients[Int(data[i])]
                step(client, ready[i])
            }
            // Reconnections and pings are due every few seconds: a look at every client ten
            // times a second is enough (not at each of the loop's thousands of turns).
            if (streams || churn.map { $0.share > 0 } == true), ContinuousClock.now >= nextChurnLook {
                let now = ContinuousClock.now
                nextChurnLook = now + .milliseconds(100)
                for client in clients {
                    if let churn, let due = client.churnAt, due <= now {
                        client.churnAt = now + .seconds(Double.random(in: churn.every))
                        reconnect(client)
                    } else if streams, client.upgraded, client.phase == .reading, now - client.lastSent >= .seconds(Wire.StreamFrame.heartbeatSeconds) {
                        sendFrame(client, Wire.StreamFrame(type: .ping))
                    }
                }
            }
        }
        let reset = stopping.load(ordering: .acquiring) == 2
        for client in clients where client.fd >= 0 {
            if reset { ccrowd_reset(client.fd) } else { close(client.fd) }
            client.fd = -1
            setWaiting(client, false)
        }
    }

    private func connect(_ client: Client) {
        let fd = ccrowd_connect(client.member.source, port)
        guard fd >= 0 else {
            fail(client, "connect from \(client.member.source): \(String(cString: strerror(-fd)))")
            return
        }
        client.fd = fd
        client.phase = .connecting
        client.upgraded = false
        client.buffer.removeAll(keepingCapacity: true)
        stats.withLock { $0.connections += 1 }
        prepare(client, fetching: client.fetching)
        setWaiting(client, !client.fetching && !streams)
        _ = ccrowd_watch(epoll, fd, 0, 2, UInt64(client.index))
    }

    private func reconnect(_ client: Client) {
        if client.fd >= 0 {
            _ = ccrowd_watch(epoll, client.fd, 2, 0, 0)
            close(client.fd)
            client.fd = -1
        }
        connect(client)
    }

    /// The next request's bytes: the stream's opening, a wait from the client's token, or a
    /// fetch of what changed.
    private func prepare(_ client: Client, fetching: Bool) {
        client.lastSent = .now
        if streams {
            let authorization = RequestSignature.authorization(method: "GET", path: "/v1/stream", query: [], body: Data(),
                                                               identity: client.member.identity, key: client.member.key, now: Date())
            let text = "GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: \(Wire.StreamFrame.protocolName)\r\nAuthorization: \(authorization)\r\n\r\n"
            client.out = Array(text.utf8)
            client.sent = 0
            return
        }
        client.fetching = fetching
        let path = "/v1/zones/\(client.member.zone.rawValue)/" + (fetching ? "changes" : "wait")
        var query = fetching ? [("limit", "200")] : [("timeout", String(waitSeconds))]
        if let token = client.token { query.append(("token", token)) }
        let authorization = RequestSignature.authorization(method: "GET", path: path, query: query, body: Data(),
                                                           identity: client.member.identity, key: client.member.key, now: Date())
        // Changes in the binary form, as the store's own client asks for them.
        let text = "GET \(path)?\(RequestSignature.canonicalQuery(query)) HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: \(Wire.recordsType)\r\nAuthorization: \(authorization)\r\n\r\n"
        client.out = Array(text.utf8)
        client.sent = 0
    }

    private func step(_ client: Client, _ ready: UInt32) {
        guard client.fd >= 0 else { return }
        if client.phase == .connecting || client.phase == .sending {
            if ready & 4 != 0 && ready & 2 == 0 {
                fail(client, "the connection closed before the request was sent")
                return
            }
            guard ready & 2 != 0 else { return }
            client.phase = .sending
            let written = client.out[client.sent...].withUnsafeBytes { send(client.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if written < 0 {
                if errno == EAGAIN { return }
                fail(client, "send: \(String(cString: strerror(errno)))")
                return
            }
            client.sent += written
            if client.sent == client.out.count {
                client.phase = .reading
                _ = ccrowd_watch(epoll, client.fd, 1, 1, UInt64(client.index))
            }
            return
        }
        guard client.phase == .reading else { return }
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(client.fd, $0.baseAddress, $0.count, 0) }
            if n > 0 {
                client.buffer.append(contentsOf: chunk[..<n])
                continue
            }
            if n < 0 && errno == EAGAIN { break }
            fail(client, n == 0 ? "the server closed the connection before its answer" : "recv: \(String(cString: strerror(errno)))")
            return
        }
        if streams { return readStream(client) }
        guard let (status, body) = Self.response(in: client.buffer) else { return }
        client.buffer.removeAll(keepingCapacity: true)
        setWaiting(client, false)
        guard status == 200 else {
            fail(client, "HTTP \(status): \(String(decoding: body.prefix(200), as: UTF8.self))", reconnect: false)
            // The client waits again (a refused request is not a reason to give up).
            ask(client, fetching: false)
            return
        }
        if client.fetching {
            guard let changes = try? Wire.decode(Wire.Changes.self, from: Data(body), binary: true) else {
                fail(client, "an unreadable page of changes", reconnect: false)
                ask(client, fetching: false)
                return
            }
            client.token = changes.token.base64
            stats.withLock { $0.fetched += changes.records.count }
            if !changes.records.isEmpty { onFetched(client.index, changes.records.count) }
            ask(client, fetching: changes.moreComing)
        } else {
            let object = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any]
            let changed = object?["changed"] as? Bool == true
            if changed { stats.withLock { $0.wakes += 1 } }
            ask(client, fetching: changed)
        }
    }

    /// A stream's bytes: its `101` (then the client follows its zone from its token), then frames.
    private func readStream(_ client: Client) {
        if !client.upgraded {
            guard let end = client.buffer.firstRange(of: [13, 10, 13, 10]) else { return }
            let statusLine = String(decoding: client.buffer[..<end.lowerBound], as: UTF8.self).split(separator: "\r\n").first ?? ""
            guard statusLine.split(separator: " ").dropFirst().first == "101" else {
                fail(client, "the stream was answered \(statusLine)")
                return
            }
            client.buffer.removeFirst(end.upperBound)
            client.upgraded = true
            setWaiting(client, true)
            let token = client.token.flatMap { Data(base64Encoded: $0) }.map(ChangeToken.init(data:))
            sendFrame(client, Wire.StreamFrame(type: .follow, zones: [client.member.zone.rawValue: token], feed: true))
        }
        var offset = 0
        while client.buffer.count - offset >= 4 {
            let length = client.buffer[offset..<offset + 4].reduce(0) { $0 << 8 | Int($1) }
            guard client.buffer.count - offset - 4 >= length else { break }
            let payload = Data(client.buffer[offset + 4..<offset + 4 + length])
            offset += 4 + length
            guard let frame = try? JSONDecoder().decode(Wire.StreamFrame.self, from: payload) else {
                fail(client, "an unreadable frame")
                return
            }
            switch frame.type {
            case .changes:
                guard let changes = frame.changes else { continue }
                client.token = changes.token.base64
                stats.withLock {
                    $0.wakes += 1
                    $0.fetched += changes.records.count
                }
                if !changes.records.isEmpty { onFetched(client.index, changes.records.count) }
            case .failed:
                fail(client, "failed: \(frame.error?.message ?? "")", reconnect: frame.zone == nil)
                if frame.zone == nil { return }
            case .ping, .follow, .feed, .watch, .unwatch, .live: continue
            }
        }
        client.buffer.removeFirst(offset)
    }

    /// Writes a frame down a client's stream (a few bytes: the socket takes them at once).
    private func sendFrame(_ client: Client, _ frame: Wire.StreamFrame) {
        guard let payload = try? frame.encoded() else { return }
        let bytes = Array(Wire.StreamFrame.framed(payload))
        let written = bytes.withUnsafeBytes { Glibc.send(client.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if written != bytes.count { fail(client, "the stream took only \(written) of \(bytes.count) bytes") }
        client.lastSent = .now
    }

    private func ask(_ client: Client, fetching: Bool) {
        prepare(client, fetching: fetching)
        client.phase = .sending
        setWaiting(client, !fetching)
        _ = ccrowd_watch(epoll, client.fd, 1, 2, UInt64(client.index))
    }

    /// Counts a failure; the client reconnects (unless told not to) and carries on.
    private func fail(_ client: Client, _ why: String, reconnect again: Bool = true) {
        stats.withLock { stats in
            stats.errors += 1
            if stats.firstErrors.count < 10 { stats.firstErrors.append("client \(client.index) (\(client.member.source)): \(why)") }
        }
        guard again else { return }
        setWaiting(client, false)
        if client.fd >= 0 {
            _ = ccrowd_watch(epoll, client.fd, 2, 0, 0)
            close(client.fd)
            client.fd = -1
        }
        client.phase = .idle
        if stopping.load(ordering: .acquiring) == 0 { connect(client) }
    }

    private func setWaiting(_ client: Client, _ waiting: Bool) {
        guard client.waiting != waiting else { return }
        client.waiting = waiting
        stats.withLock { $0.waiting += waiting ? 1 : -1 }
    }

    /// A complete HTTP/1.1 answer at the start of `buffer`: its status and body (by
    /// Content-Length), or nil while it is incomplete.
    static func response(in buffer: [UInt8]) -> (Int, ArraySlice<UInt8>)? {
        guard let end = buffer.firstRange(of: [13, 10, 13, 10]) else { return nil }
        let head = String(decoding: buffer[..<end.lowerBound], as: UTF8.self)
        let lines = head.split(separator: "\r\n")
        guard let statusLine = lines.first, let status = statusLine.split(separator: " ").dropFirst().first.flatMap({ Int($0) }) else { return (0, []) }
        let length = lines.dropFirst().lazy.compactMap { line -> Int? in
            guard line.lowercased().hasPrefix("content-length:") else { return nil }
            return Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
        }.first ?? 0
        guard buffer.count >= end.upperBound + length else { return nil }
        return (status, buffer[end.upperBound..<(end.upperBound + length)])
    }
}
