import Foundation
import RecordZone

/// Presence (docs/PROTOCOL.md §2, "Presence"): whether the others of a conversation are online
/// and when they were last seen, through a zone server's live channel (in its memory only);
/// nothing over a folder. The continuous sync says the local speaker is online while it runs.
extension ConversationStore {
    /// Says the local speaker is online every ``PresenceBoard/refreshInterval`` until cancelled,
    /// then that it went away (once more a second later if refused for the rate; waiting at most
    /// 2.5 s for that). The continuous sync's.
    func sayOnline(_ local: LocalIdentity, _ backend: any RecordZoneBackend) async {
        while !Task.isCancelled {
            do {
                try await backend.setPresence(true, as: local.identifier)
            } catch {
                configuration.logger.info("presence not said: \(error)")
            }
            do { try await Task.sleep(for: PresenceBoard.refreshInterval) } catch { break }
        }
        // Away: said outside the cancelled task, and not waited for past 2.5 s.
        let away = Task.detached { () async -> Void in
            do throws(RecordZoneError) {
                try await backend.setPresence(false, as: local.identifier)
            } catch where error.code == .requestRateLimited {
                try? await Task.sleep(for: PresenceBoard.minimumInterval)
                try? await backend.setPresence(false, as: local.identifier)
            } catch {}
        }
        let deadline = Task.detached { try? await Task.sleep(for: .milliseconds(2500)) }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await away.value }
            group.addTask { await deadline.value }
            await group.next()
            away.cancel()
            deadline.cancel()
        }
    }

    /// Whether the others in a conversation are online and when each was last seen: now, then
    /// at every change (down the continuous sync's stream while it holds one that carries it,
    /// otherwise a long poll of the backend's live channel) — a pair's other speaker, a
    /// group's members now, but the local speaker and those it blocks. One empty list and the
    /// end for a backend that carries none (a folder). The stream ends when its consumer stops.
    public func presence(in conversation: String) -> AsyncStream<[Presence]> {
        AsyncStream { continuation in
            let task = Task {
                guard let local = try? requireIdentity(), let zone = try? ZoneName(conversation), let backend = try? backend(), backend.carriesTyping,
                      let others = try? await presenceSubjects(in: conversation, local: local.identifier), !others.isEmpty else {
                    continuation.yield([])
                    continuation.finish()
                    return
                }
                var version: UInt64?, shown: [Presence]?
                while !Task.isCancelled {
                    if liveWatches.isCarried {
                        // What was shown stays while a refused watch says nothing new; the watch
                        // may ask about more (another view's), this view shows its own.
                        await followLive(zone, asking: others) { told in
                            guard case .success(let state) = told else { return }
                            let presence = state.presence.filter { others.contains($0.identity) }
                            guard presence != shown else { return }
                            continuation.yield(presence)
                            shown = presence
                        }
                        version = nil
                        continue
                    }
                    do {
                        let state = try await backend.presence(of: others, in: zone, since: version, timeout: .seconds(25))
                        if state.presence != shown {
                            continuation.yield(state.presence)
                            shown = state.presence
                        }
                        version = state.version
                    } catch {
                        // Unreachable for now: asked again in a second, what was shown stays.
                        version = nil
                        try? await Task.sleep(for: .seconds(1))
                    }
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// Whose presence a conversation shows: a pair's other speaker, a group's members (at most
    /// the 256 a server answers for), but the local speaker and those it blocks.
    private func presenceSubjects(in conversation: String, local: String) async throws(ConversationError) -> [String] {
        try await read { db in
            try db.rows("""
                SELECT other FROM conversations WHERE zone = ? AND other != ''
                UNION SELECT speaker FROM group_members WHERE zone = ?
                EXCEPT SELECT identity FROM blocked_speakers
                ORDER BY 1 LIMIT 257
                """, [conversation, conversation]) { $0.text(0) }.filter { $0 != local }.prefix(PresenceBoard.maximumAsked).map { $0 }
        }
    }
}
