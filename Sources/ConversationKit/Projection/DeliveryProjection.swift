import Foundation
import RecordZone
import SQLiteKit

/// Delivered ticks (docs/PROTOCOL.md §3, "Delivery"): each device says, in one record per zone,
/// how many messages of each sender it holds and the newest one's name; a sender whose own count
/// up to that name is the same knows the device holds every one of them — no record per message,
/// and no tick for a message the device lacks (a later one arriving first does not count).
extension RecordApplier {
    /// The local speaker's messages' prefix, and the first string after all of them (hashed
    /// once per transaction and speaker, not once per message applied).
    private mutating func ownRange() -> (prefix: String, end: String)? {
        guard let local = localSpeaker else { return nil }
        if deliveries.ownPrefix?.speaker != local { deliveries.ownPrefix = (local, ChatRecords.messagePrefix + ChatRecords.identityHash(local) + ".") }
        guard let prefix = deliveries.ownPrefix?.prefix else { return nil }
        return (prefix, prefix.dropLast() + "/")
    }

    /// Counts again the Message records held, by zone and sender (after records were dropped).
    static func recountHeld(where filter: String, _ values: [any DatabaseValueConvertible], in db: Database) throws {
        try db.execute("DELETE FROM held_messages WHERE \(filter)", values)
        try db.execute("""
            INSERT INTO held_messages (zone, sender, count, newest)
                SELECT zone, substr(name, 1, 19), count(*), max(name) FROM ck_records
                WHERE \(filter) AND type = ? AND length(name) > 19 AND substr(name, 1, 2) = 'm.' AND substr(name, 19, 1) = '.' GROUP BY zone, substr(name, 1, 19)
            """, values + [ChatRecords.messageType])
    }

    /// A Message record new to this store: counted under its sender.
    ///
    /// A row of `held_messages` says how many of a sender's Message records the store holds
    /// with a name up to its `newest`. Others' rows take every arrival (a pull's page writes
    /// each once). The local speaker's row lags: a record named past its `newest` — every
    /// send, as the names grow with the clock — is not written there (a send writes no page of
    /// it) but counted by name range when a Delivery record is weighed (``ownHeld(upTo:in:own:)``),
    /// which moves the row on; only one named before it (from another of the speaker's devices,
    /// its clock behind) is added to it.
    mutating func countHeld(_ record: Record, origin: Origin) throws {
        let zone = record.id.zone.rawValue
        guard let sender = ChatRecords.senderPrefix(ofMessage: record.id.name) else { return }
        if let own = ownRange(), String(sender) == own.prefix {
            if origin == .remote { deliveries.reweighed.insert(zone) }
            try db.execute("UPDATE held_messages SET count = count + 1 WHERE zone = ? AND sender = ? AND newest >= ?", [zone, own.prefix, record.id.name])
            return
        }
        let key = HeldSender(zone: zone, sender: String(sender))
        let pending = deliveries.held[key]
        deliveries.held[key] = ((pending?.count ?? 0) + 1, max(pending?.newest ?? "", record.id.name))
        if origin == .remote { deliveries.zones.insert(zone) }
    }

    /// How many of the local speaker's Message records in `zone` the store holds named up to
    /// `newest`: its `held_messages` row (exact up to the row's own `newest`) and the records
    /// named between the two; the row is moved on to `newest` when that is past it.
    private func ownHeld(upTo newest: String, in zone: String, own: (prefix: String, end: String)) throws -> Int64 {
        let row = try db.first("SELECT count, newest FROM held_messages WHERE zone = ? AND sender = ?", [zone, own.prefix]) { ($0.int(0), $0.text(1)) }
        let (count, through) = row ?? (0, own.prefix)
        let (low, high) = newest < through ? (newest, through) : (through, newest)
        let between = try db.first("SELECT count(*) FROM ck_records WHERE zone = ? AND name > ? AND name <= ? AND type = ?",
                                   [zone, low, high, ChatRecords.messageType]) { $0.int(0) } ?? 0
        guard newest > through else { return count - between }
        try db.execute("""
            INSERT INTO held_messages (zone, sender, count, newest) VALUES (?, ?, ?, ?)
            ON CONFLICT (zone, sender) DO UPDATE SET count = excluded.count, newest = excluded.newest
            """, [zone, own.prefix, count + between, newest])
        return count + between
    }

    /// Writes the counts of this transaction's new Message records (once per transaction, not
    /// once per message).
    mutating func flushHeld() throws {
        for (key, held) in deliveries.held {
            try db.execute("""
                INSERT INTO held_messages (zone, sender, count, newest) VALUES (?, ?, ?, ?)
                ON CONFLICT (zone, sender) DO UPDATE SET count = count + excluded.count, newest = max(newest, excluded.newest)
                """, [key.zone, key.sender, held.count, held.newest])
        }
        deliveries.held.removeAll()
    }

    /// Another member's device's Delivery record: how far it holds the local speaker's messages.
    mutating func projectDelivery(_ record: Record) throws {
        try flushHeld()
        let zone = record.id.zone.rawValue, name = record.id.name
        guard !record.isDeleted else {
            try db.execute("DELETE FROM deliveries WHERE zone = ? AND name = ?", [zone, name])
            return
        }
        guard let member = record.string("member"), member != localSpeaker, let own = ownRange(),
              let held = (record["held"]?.listValue ?? []).lazy.compactMap({ $0.stringValue.flatMap(ChatRecords.heldEntry) }).first(where: { $0.newest.hasPrefix(own.prefix) })
        else { return }
        // Every one of the local speaker's messages up to `newest` that a backend took, counted
        // here: what the device must hold for its count to match.
        let total = try ownHeld(upTo: held.newest, in: zone, own: own)
        let refused = try db.first("""
            SELECT count(*) FROM messages WHERE zone = ? AND sync_state = ? AND coalesce(sync_error_code, '') != ? AND name >= ? AND name <= ?
            """, [zone, SyncStateColumn.failed.rawValue, SyncFailure.Code.notInGroup.rawValue, own.prefix, held.newest]) { $0.int(0) } ?? 0
        guard held.count == total - refused else { return }
        let through = try db.first("SELECT through FROM deliveries WHERE zone = ? AND name = ?", [zone, name]) { $0.text(0) }
        guard through.map({ held.newest > $0 }) ?? true else { return }
        try db.execute("INSERT INTO deliveries (zone, name, member, through) VALUES (?, ?, ?, ?) ON CONFLICT (zone, name) DO UPDATE SET through = excluded.through",
                       [zone, name, member, held.newest])
        for message in try db.rows("SELECT name FROM messages WHERE zone = ? AND name > ? AND name <= ?", [zone, through ?? own.prefix, held.newest], { $0.text(0) }) {
            note(.messageChanged(MessageID(conversation: zone, name: message)))
        }
    }

    /// Writes this device's Delivery record where others' messages arrived, and weighs again the
    /// records held where the local speaker's own arrived from its other devices (a count that
    /// did not match for want of them may match now).
    mutating func finishDeliveries() throws {
        try flushHeld()
        for zone in deliveries.reweighed.sorted() {
            let records = try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ? AND is_deleted = 0", [zone, ChatRecords.deliveryType]) {
                try? Record(canonical: $0.blob(0))
            }
            for case let record? in records { try projectDelivery(record) }
        }
        deliveries.reweighed.removeAll()
        let zones = deliveries.zones
        deliveries.zones.removeAll()
        guard let device, let local = localSpeaker, let own = ownRange() else { return }
        for zone in zones.sorted() {
            guard let zoneName = try? ZoneName(zone) else { continue }
            // Not in a group any more: nothing to say there (a server would refuse it).
            if ChatRecords.isGroupZone(zoneName), !(try isGroupMember(local, zone: zone, at: clock.now())) { continue }
            let held = try db.rows("SELECT count, newest FROM held_messages WHERE zone = ? AND sender != ? ORDER BY sender LIMIT ?",
                                   [zone, own.prefix, ChatRecords.maximumDeliverySenders]) { FieldValue.string("\($0.int(0)):\($0.text(1))") }
            guard !held.isEmpty else { continue }
            let id = try RecordID(zone: zoneName, name: ChatRecords.deliveryPrefix + ChatRecords.identityHash(local) + "." + device.key.publicKey.prefix(8).hexString)
            let current = try db.first("SELECT record FROM ck_records WHERE zone = ? AND name = ?", [zone, id.name]) { try? Record(canonical: $0.blob(0)) } ?? nil
            if current?.isDeleted == false, current?["held"] == .list(held) { continue }
            try commitLocal([Record(id: id, type: ChatRecords.deliveryType, fields: ["member": .string(local), "held": .list(held)])], signedWith: device.key)
        }
    }
}

/// A zone and a sender's name prefix (`m.<h(sender)>.`).
struct HeldSender: Hashable {
    var zone: String
    var sender: String
}

/// What the delivery projection gathers over a transaction (``RecordApplier/finishDeliveries()``).
struct DeliveryWork {
    /// Zones where messages of others arrived: this device's Delivery record is written again.
    var zones = Set<String>()
    /// Zones where the local speaker's own arrived from another of its devices: the Delivery
    /// records held there are weighed again.
    var reweighed = Set<String>()
    /// Message records new in this transaction, by zone and sender, not yet in `held_messages`.
    var held: [HeldSender: (count: Int64, newest: String)] = [:]
    /// The local speaker's message-name prefix, `m.<h(speaker)>.`.
    var ownPrefix: (speaker: String, prefix: String)?
}
