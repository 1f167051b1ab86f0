import RecordZone

/// A zone server's side of groups: who may read and write a group's zone, decided from the
/// group's `GroupChange` records as the server holds them (``GroupMembership``'s rule), beside
/// the rule every reader applies.
///
/// - **Writes.** A change is stored only when its actor sends it, the group as it stands now
///   allows it (``GroupMembership/decisionNow(_:)``: an admin removed or demoted since cannot
///   date a change before that), and the rule at its clock accepts it; the same change again
///   is stored as it is (nothing new). Anything else (a message, a receipt) only from someone
///   in the group now, and only when its owner was a member at its clock: a removed member's
///   next message is refused (403), whatever clock it claims.
/// - **Reads.** Anyone who was ever in the group reads every change (so a removed member
///   learns of the removal); other versions by the group's history setting
///   (``GroupMembership/mayRead(_:at:)``): what was said while they were in it, or everything
///   before their membership ended. The creator reads the zone before its first change.
public struct GroupAccess: ZoneGovernance {
    public init() {}

    public func governingType(of zone: ZoneName) -> String? {
        ChatRecords.isGroupZone(zone) ? GroupChange.recordType : nil
    }

    public func decide(_ zone: ZoneName, governing: [Record]) -> any GovernedZone {
        let changes = governing.compactMap { try? GroupChange(record: $0) }
        return State(group: GroupMembership(zone: zone, changes: changes))
    }

    struct State: GovernedZone {
        /// Nil for a zone that is not a group's (never asked: ``governingType(of:)``).
        var group: GroupMembership?

        var summary: [(label: String, value: String)] {
            guard let group else { return [] }
            let members = group.roles.sorted { ($0.value, $1.key) > ($1.value, $0.key) }.map { "\($0.key) (\($0.value.rawValue))" }
            let refused = group.decisions.filter { if case .refused = $0.decision { true } else { false } }.count
            return [("members now", members.isEmpty ? "nobody" : members.joined(separator: ", ")),
                    ("changes held", "\(group.decisions.count), of which the rule refused \(refused)")]
        }

        mutating func admit(_ record: Record, owner: String?, as identity: String) -> String? {
            // Read through `group` in place (no copy held): a change after every one decided is
            // then taken in without copying a 10,000-member group.
            guard group != nil else { return "not a group's zone" }
            guard record.recordType == GroupChange.recordType else {
                guard group?.roles[identity] != nil else { return "'\(identity)' is not in the group" }
                guard let owner, group?.isMember(owner, at: record.clock) == true else { return "its owner was not in the group at its clock" }
                return nil
            }
            let change: GroupChange
            do { change = try GroupChange(record: record) } catch { return error.description }
            if group?.holds(change.name) == true { return nil }
            guard change.actor == identity else { return "a change is sent by its actor" }
            if case .refused(let why)? = group?.decisionNow(change) { return why }
            // After every change decided (the usual case), the rule at its clock decides it
            // against the group as it stands now: just decided. Otherwise, on a copy.
            if group?.decisions.last.map({ GroupChange.precedes($0.change, change) }) ?? true {
                group?.insert(change)
                return nil
            }
            guard var trial = group else { return "not a group's zone" }
            trial.insert(change)
            if case .refused(let why)? = trial.decisions.first(where: { $0.change.name == change.name })?.decision { return why }
            group = trial
            return nil
        }

        /// Every member, past and present (each reads the versions of its time in the group).
        var readers: [String] { group.map { Array($0.runs.keys) } ?? [] }

        func readable(by identity: String) -> ReadableVersions? {
            guard let group else { return nil }
            guard group.runs[identity] != nil else {
                // The creator, before the group's first change: its zone, empty.
                return !group.isCreated && ChatRecords.identityHash(identity) == group.creatorHash ? ReadableVersions { type, _ in type == GroupChange.recordType } : nil
            }
            return ReadableVersions { type, clock in type == GroupChange.recordType || group.mayRead(identity, at: clock) }
        }
    }
}
