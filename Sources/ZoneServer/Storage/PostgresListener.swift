import Foundation
import PostgresKit
import RecordZone
import Synchronization

/// The connection that listens for other servers' notifications (`ck_changes` with a zone's
/// name, or `+` and the name of one whose readers moved; `ck_pins`, `ck_typing`, `ck_presence`), on a thread of its own, reconnecting with a short pause when it fails.
/// It listens only while ``run(_:)`` runs: the thread starts with it and has ended when it
/// returns.
final class Listener: Sendable {
    enum Event: Sendable {
        case zone(String)
        case pins
        /// A server's typing state (`ck_typing`: `"<1|0> <server> <zone> <identity>"`).
        case typing(String)
        /// A server's client's presence (`ck_presence`: `"<1|0> <server> <milliseconds> <identity>"`).
        case presence(String)
        /// Listening (at first, or again after a failure): notifications may have been missed.
        case connected
    }

    let conninfo: String
    private struct State {
        var stopped = false
        var connected = false
        /// Resumed by the thread as it ends.
        var ended: CheckedContinuation<Void, Never>?
        var hasEnded = false
    }
    private let state = Mutex(State())

    init(conninfo: String) { self.conninfo = conninfo }

    var isConnected: Bool { state.withLock { $0.connected } }

    /// Listens until the calling task is cancelled (or ``stop()``), handing each notification to
    /// `handler`, one at a time, in the caller's task. Returns once the thread has ended.
    func run(_ handler: (Event) async -> Void) async {
        let (events, continuation) = AsyncStream.makeStream(of: Event.self)
        state.withLock { $0 = State() }
        let thread = Thread { [self] in
            while !state.withLock({ $0.stopped }) {
                do {
                    let connection = try PostgresConnection(conninfo)
                    try connection.listen("ck_changes")
                    try connection.listen("ck_pins")
                    try connection.listen("ck_typing")
                    try connection.listen("ck_presence")
                    state.withLock { $0.connected = true }
                    continuation.yield(.connected)
                    while !state.withLock({ $0.stopped }) {
                        guard let note = try connection.waitForNotification(timeout: 0.25) else { continue }
                        switch note.channel {
                        case "ck_pins": continuation.yield(.pins)
                        case "ck_typing": continuation.yield(.typing(note.payload))
                        case "ck_presence": continuation.yield(.presence(note.payload))
                        default: continuation.yield(.zone(note.payload))
                        }
                    }
                } catch {
                    state.withLock { $0.connected = false }
                    Thread.sleep(forTimeInterval: 0.25)
                }
            }
            continuation.finish()
            let ended = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.connected = false
                state.hasEnded = true
                defer { state.ended = nil }
                return state.ended
            }
            ended?.resume()
        }
        thread.name = "convkit.postgres.listen"
        thread.start()
        await withTaskCancellationHandler {
            for await event in events { await handler(event) }
        } onCancel: {
            stop()
        }
        stop()
        await withCheckedContinuation { (ended: CheckedContinuation<Void, Never>) in
            let done = state.withLock { state -> Bool in
                if state.hasEnded { return true }
                state.ended = ended
                return false
            }
            if done { ended.resume() }
        }
    }

    func stop() { state.withLock { $0.stopped = true } }
}
