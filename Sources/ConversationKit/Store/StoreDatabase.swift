import Foundation
import RecordZone
import SQLiteKit

/// The store's database with what every transaction needs: the policy whose pins are saved
/// with the records that pinned them, and the hub that publishes events after each commit.
/// Shared by the store's API and its sync engine, so both write the same way.
final class StoreDatabase: Sendable {
    let queue: DatabaseQueue
    let policy: RecordPolicy
    let hub: EventHub

    init(queue: DatabaseQueue, policy: RecordPolicy, hub: EventHub) {
        self.queue = queue
        self.policy = policy
        self.hub = hub
    }

    func read<T: Sendable>(_ body: (Database) throws -> T) throws(ConversationError) -> T {
        do { return try queue.read(body) } catch { throw ConversationError.wrap(error) }
    }

    /// Runs a write transaction with a record applier; publishes its events after the commit.
    func write<T: Sendable>(_ body: (inout RecordApplier) throws -> T) throws(ConversationError) -> T {
        let policy = self.policy
        do {
            let (result, events) = try queue.write { db in
                let local = try db.first("SELECT value FROM ck_meta WHERE key = 'local_speaker'") { $0.text(0) }
                var applier = RecordApplier(db: db, localSpeaker: local)
                let result = try body(&applier)
                try applier.finish()
                try PinStore.saveIfChanged(policy, in: db)
                return (result, applier.events)
            }
            hub.publish(events)
            return result
        } catch {
            throw ConversationError.wrap(error)
        }
    }
}

/// Persists the policy's pinned keys in the same transaction as the records that pinned them.
enum PinStore {
    /// Tells this process's pin counts from an earlier process's.
    private static let processToken = UUID().uuidString

    static func load(from db: Database) throws -> [String: KeyChain] {
        var pinned = [String: KeyChain]()
        for (identity, chain) in try db.rows("SELECT identity, chain FROM ck_pins", [], { row in (row.text(0), row.blob(1)) }) {
            if let decoded = try? JSONDecoder().decode(KeyChain.self, from: chain) { pinned[identity] = decoded }
        }
        return pinned
    }

    static func saveIfChanged(_ policy: RecordPolicy, in db: Database) throws {
        let marker = "\(processToken)/\(ObjectIdentifier(policy).hashValue)/\(policy.pinChangeCount)"
        let saved = try db.first("SELECT value FROM ck_meta WHERE key = 'pin_changes'") { $0.text(0) }
        guard saved != marker else { return }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        for (identity, chain) in policy.pinnedKeys {
            try db.execute("INSERT INTO ck_pins (identity, chain) VALUES (?, ?) ON CONFLICT (identity) DO UPDATE SET chain = excluded.chain",
                           [identity, try encoder.encode(chain)])
        }
        try db.execute("INSERT INTO ck_meta (key, value) VALUES ('pin_changes', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", [marker])
    }
}
