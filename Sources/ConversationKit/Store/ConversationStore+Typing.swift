import Foundation
import RecordZone
import Synchronization

/// Typing indicators (docs/PROTOCOL.md §2, "Typing"): never stored, carried live by a zone
/// server (and the in-memory backend); a folder carries none — nothing in it is live, so a store
/// on a folder says nothing and sees nobody typing.
extension ConversationStore {
    /// Says the local speaker is typing in a conversation (a pair's or a group's), or stopped.
    /// Call it as the person types — the store sends "typing" at most every 3 seconds
    /// (``TypingBoard/refreshInterval``), which keeps it shown; without it, it is gone within
    /// 4.5 seconds (``TypingBoard/lifetime``) — and with false when the draft is cleared. A send
    /// stops it by itself. Best effort: offline or refused for the rate, nothing is said and
    /// nothing throws.
    /// - Throws: ``ConversationError/Code/unknownConversation``.
    public func setTyping(_ typing: Bool, in conversation: String) async throws(ConversationError) {
        let local = try requireIdentity()
        try await read { db in try Self.requireConversation(db, conversation) }
        let now = ContinuousClock.now
        let due = typingSaid.withLock { said -> Bool in
            if typing {
                if let last = said[conversation], now - last < TypingBoard.refreshInterval { return false }
                said[conversation] = now
                return true
            }
            return said.removeValue(forKey: conversation) != nil
        }
        guard due, let zone = try? ZoneName(conversation), let backend = try? backend(), backend.carriesTyping else { return }
        do {
            try await backend.setTyping(typing, in: zone, as: local.identifier)
        } catch {
            configuration.logger.info("typing in \(conversation) not said: \(error)")
        }
    }

    /// The others typing in a conversation, sorted (but those the local speaker blocks): now,
    /// then at every change — told down the continuous sync's stream while ``run(pollInterval:longPolls:)``
    /// holds one that carries it, otherwise by a long poll of the backend's live channel. One
    /// empty list and the end for a backend that carries no typing (a folder). The stream ends
    /// when its consumer stops.
    public func typingSpeakers(in conversation: String) -> AsyncStream<[String]> {
        AsyncStream { continuation in
            let task = Task {
                guard let local = try? requireIdentity(), let zone = try? ZoneName(conversation), let backend = try? backend(), backend.carriesTyping else {
                    continuation.yield([])
                    continuation.finish()
                    return
                }
                var version: UInt64?, shown: [String]?
                func show(_ typing: [String]) async {
                    let hidden = Set((try? await loadBlockedSpeakers()) ?? []).union([local.identifier])
                    let others = typing.filter { !hidden.contains($0) }
                    if others != shown {
                        continuation.yield(others)
                        shown = others
                    }
                }
                while !Task.isCancelled {
                    if liveWatches.isCarried {
                        await followLive(zone, asking: []) { told in await show((try? told.get())?.typing ?? []) }
                        version = nil
                        continue
                    }
                    do {
                        let state = try await backend.typing(in: zone, since: version, timeout: .seconds(25))
                        await show(state.identities)
                        version = state.version
                    } catch {
                        // Unreachable for now: nobody is shown typing, and it asks again.
                        if shown != [] {
                            continuation.yield([])
                            shown = []
                        }
                        version = nil
                        try? await Task.sleep(for: .seconds(1))
                    }
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// Shows what the stream tells of `zone` (`show`, at once with what it told last, then at
    /// each change) until the stream goes or the task is cancelled.
    func followLive(_ zone: ZoneName, asking: [String], _ show: (Result<LiveState, RecordZoneError>) async -> Void) async {
        let view = UUID()
        liveWatches.begin(zone, view: view, asking: asking)
        while !Task.isCancelled, liveWatches.isCarried {
            let (told, generation) = liveWatches.current(zone)
            if let told { await show(told) }
            await liveWatches.wait(zone, after: generation)
        }
        liveWatches.end(zone, view: view)
    }

    /// A send ends the local speaker's typing in its conversation.
    func stopTypingAfterSend(in conversation: String) {
        guard typingSaid.withLock({ $0[conversation] != nil }) else { return }
        Task { try? await setTyping(false, in: conversation) }
    }
}
