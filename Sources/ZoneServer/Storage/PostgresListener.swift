import Foundation
import PostgresKit
import RecordZone
import Synchronization

/// The connection that listens for other servers' notifications (`ck_changes` with a zone's
/// name, `ck_pins`), on a thread of its own, reconnecting with a short pause when it fails.
final class Listener: Sendable {
    enum Event {
        case zone(String)
        case pins
        /// Listening (at first, or again after a failure): notifications may have been missed.
        case connected
    }

    let conninfo: String
    private let state = Mutex((stopped: false, connected: false))

    init(conninfo: String) { self.conninfo = conninfo }

    var isConnected: Bool { state.withLock { $0.connected } }

    func start(_ handler: @escaping @Sendable (Event) -> Void) {
        let thread = Thread { [self] in
            while !state.withLock({ $0.stopped }) {
                do {
                    let connection = try PostgresConnection(conninfo)
                    try connection.listen("ck_changes")
                    try connection.listen("ck_pins")
                    state.withLock { $0.connected = true }
                    handler(.connected)
                    while !state.withLock({ $0.stopped }) {
                        guard let note = try connection.waitForNotification(timeout: 0.25) else { continue }
                        handler(note.channel == "ck_pins" ? .pins : .zone(note.payload))
                    }
                } catch {
                    state.withLock { $0.connected = false }
                    Thread.sleep(forTimeInterval: 0.25)
                }
            }
        }
        thread.name = "convkit.postgres.listen"
        thread.start()
    }

    func stop() { state.withLock { $0.stopped = true } }
}
