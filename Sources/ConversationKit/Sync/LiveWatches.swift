import Foundation
import RecordZone
import Synchronization

/// The typing and presence of the conversations on screen, carried by the continuous sync's
/// stream where the server offers it (docs/PROTOCOL.md §2.4, "Typing and presence"): one
/// `watch` per conversation however many views show it, asking the presence of everyone any of
/// them shows, and sent again down each new stream. Views read the last state told and wait for
/// the next. Without such a stream (no continuous sync running, an older server, memory, a
/// folder) they long-poll the backend as before.
final class LiveWatches: Sendable {
    private struct Watch {
        /// Each view, with the identities whose presence it shows (none for typing).
        var views: [UUID: [String]] = [:]
        /// The last state the stream told (nil: none yet on this stream).
        var told: Result<LiveState, RecordZoneError>?
        var asked: [String] { Array(Set(views.values.joined())).sorted() }
    }
    private struct State {
        /// The stream, if it carries watches.
        var stream: (any ChangeStream)?
        var watches: [ZoneName: Watch] = [:]
    }
    private let state = Mutex(State())
    /// Moved on per zone at each state told, and for all when the stream comes or goes.
    private let changes = ChangeWaiters()

    /// The continuous sync's stream now (nil: none): every watch is sent down a new one.
    func attach(_ stream: (any ChangeStream)?) {
        let (carrier, watches) = state.withLock { state in
            state.stream = stream?.canWatch == true ? stream : nil
            for zone in state.watches.keys { state.watches[zone]?.told = nil }
            return (state.stream, state.watches.mapValues(\.asked))
        }
        for (zone, asked) in watches { try? carrier?.watch(zone, presenceOf: asked) }
        changes.wakeAll()
    }

    /// Whether a stream carries the watches now.
    var isCarried: Bool { state.withLock { $0.stream != nil } }

    /// A view of `zone` begins, showing the presence of `asking` (none: typing).
    func begin(_ zone: ZoneName, view: UUID, asking: [String]) {
        let (carrier, asked) = state.withLock { state -> ((any ChangeStream)?, [String]?) in
            let before = state.watches[zone].map(\.asked)
            state.watches[zone, default: Watch()].views[view] = asking
            let after = state.watches[zone]?.asked ?? []
            return (state.stream, before == after ? nil : after)
        }
        if let asked { try? carrier?.watch(zone, presenceOf: asked) }
    }

    /// A view of `zone` ends; the last one ends the watch.
    func end(_ zone: ZoneName, view: UUID) {
        let (carrier, asked) = state.withLock { state -> ((any ChangeStream)?, [String]??) in
            guard var watch = state.watches[zone] else { return (nil, nil) }
            let before = watch.asked
            watch.views[view] = nil
            if watch.views.isEmpty {
                state.watches[zone] = nil
                return (state.stream, .some(nil))
            }
            state.watches[zone] = watch
            return (state.stream, watch.asked == before ? nil : .some(watch.asked))
        }
        switch asked {
        case .some(.some(let asked)): try? carrier?.watch(zone, presenceOf: asked)
        case .some(.none): try? carrier?.unwatch(zone)
        case .none: break
        }
    }

    /// What the stream told of `zone`.
    func received(_ zone: ZoneName, _ told: Result<LiveState, RecordZoneError>) {
        let watched = state.withLock { state in
            guard state.watches[zone] != nil else { return false }
            state.watches[zone]?.told = told
            return true
        }
        if watched { changes.wake(zone) }
    }

    /// The last state told of `zone` on this stream (nil: none yet), and the generation to wait past.
    func current(_ zone: ZoneName) -> (told: Result<LiveState, RecordZoneError>?, generation: UInt64) {
        let generation = changes.generation(of: zone)
        return (state.withLock { $0.watches[zone]?.told }, generation)
    }

    /// Waits until `zone` is told something after `generation`, or the stream comes or goes.
    func wait(_ zone: ZoneName, after generation: UInt64) async {
        _ = await changes.wait(for: zone, after: generation, timeout: .seconds(3600))
    }
}
