import Foundation
import RecordZone
import Synchronization

/// A save's identity with the rule its governed zones' records decide (``ZoneGovernance``),
/// applied inside the save's transaction, after signatures and owners are checked and before
/// each version is merged.
public struct SaveGate: Sendable {
    public let governance: any ZoneGovernance
    public let identity: String

    public init(governance: any ZoneGovernance, identity: String) {
        self.governance = governance
        self.identity = identity
    }

    /// The governed zones among `records`, with the type that governs each.
    func governedZones(of records: [Record]) -> [ZoneName: String] {
        var zones = [ZoneName: String]()
        for zone in Set(records.map(\.id.zone)) { if let type = governance.governingType(of: zone) { zones[zone] = type } }
        return zones
    }

    /// The governed zones among `records` whose state the batch may move (it holds governing
    /// records): their states are taken out of memory for the save, so they change in place.
    func zonesChangingGovernance(of records: [Record]) -> Set<ZoneName> {
        Set(records.filter { governance.governingType(of: $0.id.zone) == $0.recordType }.map(\.id.zone))
    }

    /// Refuses (`notAuthorized`) each admitted version of a governed zone that its state does
    /// not let the identity save now, in the batch's order; a governing version that passes
    /// moves its zone's state for the versions after it.
    /// - Returns: the outcomes, each zone's state after the batch, and the indices of the
    ///   governing versions taken in (the state holds only if all of them are stored).
    func apply(_ records: [Record], outcomes: [Result<Data, RecordZoneError>], states: [ZoneName: any GovernedZone],
               owner: (Record) -> String?) -> (outcomes: [Result<Data, RecordZoneError>], states: [ZoneName: any GovernedZone], takenIn: [Int]) {
        var outcomes = outcomes, states = states, takenIn = [Int]()
        for (index, record) in records.enumerated() {
            // Out of the dictionary while it is decided: the only copy, changed in place.
            guard case .success = outcomes[index], var state = states.removeValue(forKey: record.id.zone) else { continue }
            defer { states[record.id.zone] = state }
            if let refusal = state.admit(record, owner: owner(record), as: identity) {
                outcomes[index] = .failure(RecordZoneError(.notAuthorized, "'\(identity)' may not write \(record.id): \(refusal)", recordID: record.id))
                continue
            }
            if record.recordType == governance.governingType(of: record.id.zone) { takenIn.append(index) }
        }
        return (outcomes, states, takenIn)
    }
}

/// Where a governed zone's governing records stand: the zone's incarnation and the highest
/// sequence among them. Governing records are added, never edited in place by the rule that
/// governs them, so a state decided at one mark holds until the mark moves.
struct GoverningMark: Hashable, Sendable {
    var incarnation: String
    var sequence: Int64
}

/// The states a server decided for governed zones, each kept with the mark it was decided at:
/// used while the zone's mark is the same (one indexed read tells), decided again from the
/// records when it moved — another server sharing the database saved a change, or the zone
/// was made anew. So a state is never trusted from memory alone.
final class GovernedZoneCache: Sendable {
    private let entries = Mutex<[ZoneName: (mark: GoverningMark, state: any GovernedZone)]>([:])

    /// The state kept for `zone` at `mark`, if any. - Parameter taking: take it out (a save
    /// that may change it: it changes in place, and is kept again after the commit).
    func state(of zone: ZoneName, at mark: GoverningMark, taking: Bool = false) -> (any GovernedZone)? {
        entries.withLock { entries in
            guard let entry = entries[zone], entry.mark == mark else { return nil }
            if taking { entries[zone] = nil }
            return entry.state
        }
    }

    func keep(_ state: any GovernedZone, of zone: ZoneName, at mark: GoverningMark) {
        entries.withLock { $0[zone] = (mark, state) }
    }

    func forget(_ zone: ZoneName) {
        _ = entries.withLock { $0.removeValue(forKey: zone) }
    }

    /// After a save stored `stored` (indices into its records, with their sequences): each
    /// governed zone's state is kept at its new mark when the governing versions stored are
    /// exactly those the gate took in, and forgotten otherwise (decided again from the records
    /// next time).
    func settle(_ records: [Record], gate: SaveGate, states: [ZoneName: any GovernedZone], marks: [ZoneName: GoverningMark],
                takenIn: [Int], stored: [Int: Int64]) {
        for (zone, state) in states {
            guard var mark = marks[zone] else { continue }
            let taken = Set(takenIn.filter { records[$0].id.zone == zone })
            let storedGoverning = stored.filter { records[$0.key].id.zone == zone && records[$0.key].recordType == gate.governance.governingType(of: zone) }
            guard Set(storedGoverning.keys) == taken else { forget(zone); continue }
            mark.sequence = storedGoverning.values.reduce(mark.sequence, max)
            keep(state, of: zone, at: mark)
        }
    }
}
