@testable import ChatSchema
import Foundation
import RecordZone
import Testing
import TestSupport

/// The group membership rule (`GroupMembership`, docs/PROTOCOL.md §3.1): each case of the rule,
/// the forgeries it must refuse, the record shape a change must have, and a property test —
/// random changes by random actors (hostile ones and ones without the right among them),
/// delivered to five readers in random orders and batchings: every reader decides exactly what
/// a reader holding them all at once decides, and no membership or role differs from what the
/// accepted, authorized changes set.
@Suite struct GroupMembershipTests {
    static let zone = GroupMembership.zone(creator: "carol", random: "00112233aabbccdd")!

    /// A change by `actor` at millisecond `ms` (names unique by `salt`).
    static func change(_ actor: String, _ ms: UInt64, _ action: GroupChange.Action, _ targets: [String] = [], name: String? = nil, salt: UInt64 = 0) -> GroupChange {
        let clock = RecordClock(milliseconds: ms, counter: 0)
        return GroupChange(name: GroupChange.recordName(actor: actor, clock: clock, random: String(format: "%016llx", salt)), actor: actor,
                           clock: clock, action: action, targets: targets, groupName: name ?? ((action == .create || action == .rename) ? "Trip" : nil),
                           groupDescription: action == .describe ? "about \(salt)" : nil)
    }

    static func decide(_ changes: [GroupChange]) -> GroupMembership {
        GroupMembership(zone: zone, changes: changes)!
    }

    static func decision(of change: GroupChange, in group: GroupMembership) -> GroupMembership.Decision? {
        group.decisions.first { $0.change.name == change.name }?.decision
    }

    @Test func theCreatorCreatesAddsAndTheRolesFollow() {
        let create = Self.change("carol", 100, .create, ["alice", "bob"])
        let add = Self.change("carol", 110, .add, ["dave"])
        let promote = Self.change("carol", 120, .promote, ["alice"])
        let aliceRemoves = Self.change("alice", 130, .remove, ["bob"])
        let daveLeaves = Self.change("dave", 140, .leave)
        let rename = Self.change("alice", 150, .rename, name: "Trip 2027")
        let group = Self.decide([rename, daveLeaves, aliceRemoves, promote, add, create])
        #expect(group.roles == ["carol": .creator, "alice": .admin])
        #expect(group.name == "Trip 2027")
        #expect(group.decisions.allSatisfy { $0.decision == .accepted })
        #expect(group.isMember("bob", at: RecordClock(milliseconds: 125, counter: 0)))
        #expect(!group.isMember("bob", at: RecordClock(milliseconds: 131, counter: 0)))
        #expect(!group.isMember("dave", at: RecordClock(milliseconds: 100, counter: 0)))
        #expect(group.isMember("dave", at: RecordClock(milliseconds: 111, counter: 0)))
    }

    @Test func twoAdminsWhoRemoveEachOtherOfflineTheEarlierRemovalStands() {
        let setup = [Self.change("carol", 100, .create, ["alice", "bob"]), Self.change("carol", 101, .promote, ["alice"]), Self.change("carol", 102, .promote, ["bob"])]
        let aliceRemovesBob = Self.change("alice", 200, .remove, ["bob"])
        let bobRemovesAlice = Self.change("bob", 201, .remove, ["alice"])
        for order in [setup + [aliceRemovesBob, bobRemovesAlice], setup + [bobRemovesAlice, aliceRemovesBob], [bobRemovesAlice] + setup + [aliceRemovesBob]] {
            let group = Self.decide(order)
            #expect(group.roles == ["carol": .creator, "alice": .admin])
            #expect(Self.decision(of: bobRemovesAlice, in: group) == .refused("only an admin may remove"))
        }
    }

    @Test func anAddRacingARemovalAndAChangeBySomeoneJustDemoted() {
        let setup = [Self.change("carol", 100, .create, ["alice"]), Self.change("carol", 101, .promote, ["alice"])]
        // Carol demotes alice at 200; alice, offline, adds mallory at 201 and promotes nobody.
        let demote = Self.change("carol", 200, .demote, ["alice"])
        let late = Self.change("alice", 201, .add, ["mallory"])
        let early = Self.change("alice", 199, .add, ["erin"])
        let group = Self.decide(setup + [late, demote, early])
        #expect(group.roles == ["carol": .creator, "alice": .member, "erin": .member])
        #expect(Self.decision(of: late, in: group) == .refused("only an admin may add"))
        // An add of someone, then their removal, then an add again: both runs are kept.
        let again = Self.decide(setup + [Self.change("alice", 150, .add, ["bob"]), Self.change("carol", 160, .remove, ["bob"]), Self.change("alice", 170, .add, ["bob"])])
        #expect(again.runs["bob"]?.count == 2)
        #expect(again.roles["bob"] == .member)
        #expect(!again.isMember("bob", at: RecordClock(milliseconds: 165, counter: 0)))
    }

    @Test func forgeriesAndChangesWithoutTheRightChangeNothing() {
        let create = Self.change("carol", 100, .create, ["alice", "bob"])
        let removeBob = Self.change("carol", 110, .remove, ["bob"])
        let cases: [(GroupChange, String)] = [
            // A member (not an admin) adds someone.
            (Self.change("alice", 120, .add, ["mallory"]), "only an admin may add"),
            // A removed member adds themself back.
            (Self.change("bob", 130, .add, ["bob"]), "only an admin may add"),
            // Someone never added adds themself.
            (Self.change("mallory", 140, .add, ["mallory"]), "only an admin may add"),
            // A member grants themself admin.
            (Self.change("alice", 150, .promote, ["alice"]), "only an admin may promote"),
            // A member removes the creator; an admin could not either.
            (Self.change("alice", 160, .remove, ["carol"]), "only an admin may remove"),
            // Someone else creates the group the zone says carol made.
            (Self.change("mallory", 90, .create, ["mallory"]), "only the creator the zone names creates the group"),
            // A change dated before the creation.
            (Self.change("carol", 50, .add, ["mallory"]), "the group is not created yet at this clock"),
            // A second creation.
            (Self.change("carol", 170, .create, ["mallory"]), "the group was created already"),
            // A removed member renames.
            (Self.change("bob", 180, .rename, name: "Bob's"), "only an admin may rename"),
        ]
        for (forged, reason) in cases {
            let group = Self.decide([create, removeBob, forged])
            #expect(group.roles == ["carol": .creator, "alice": .member], "\(forged.action) by \(forged.actor)")
            #expect(Self.decision(of: forged, in: group) == .refused(reason))
            #expect(group.name == "Trip")
        }
        // The creator cannot be removed or demoted, even by an admin.
        let promoted = [create, Self.change("carol", 105, .promote, ["alice"])]
        let group = Self.decide(promoted + [Self.change("alice", 120, .remove, ["carol"]), Self.change("alice", 121, .demote, ["carol"])])
        #expect(group.roles["carol"] == .creator)
        // An old add sent again after the removal is the same change: nothing moves.
        let add = Self.change("carol", 105, .add, ["dave"])
        let remove = Self.change("carol", 110, .remove, ["dave"])
        var replayed = Self.decide([create, add, remove])
        replayed.insert(add)
        #expect(replayed.roles["dave"] == nil)
        #expect(replayed.decisions.count == 3)
    }

    @Test func aChangeHasOneShapeAndOneVersion() throws {
        let key = SigningKey.generate()
        let clock = RecordClock(milliseconds: 1_700_000_000_000, counter: 3)
        func record(_ name: String, clock recordClock: RecordClock = clock, _ fields: [String: FieldValue]) throws -> Record {
            var record = Record(id: try RecordID(zone: Self.zone, name: name), type: GroupChange.recordType, fields: fields)
            try record.sign(with: key, clock: recordClock)
            return record
        }
        let name = GroupChange.recordName(actor: "carol", clock: clock, random: "0123456789abcdef")
        let good = GroupChange(name: name, actor: "carol", clock: clock, action: .add, targets: ["alice", "bob"])
        #expect(try GroupChange(record: record(name, good.fields)) == good)
        let shapes: [(String, RecordClock, [String: FieldValue])] = [
            // Signed at another clock than its name says (a rewritten change).
            (name, RecordClock(milliseconds: 1_700_000_000_001, counter: 0), good.fields),
            // Named for someone else.
            (GroupChange.recordName(actor: "alice", clock: clock, random: "0123456789abcdef"), clock, good.fields),
            (name, clock, ["actor": .string("carol"), "action": .string("ban")]),
            (name, clock, ["actor": .string("carol"), "action": .string("add")]),
            (name, clock, ["actor": .string("carol"), "action": .string("remove"), "targets": .list([.string("a"), .string("b")])]),
            (name, clock, ["actor": .string("carol"), "action": .string("add"), "targets": .list([.string("Alice")])]),
            (name, clock, ["actor": .string("carol"), "action": .string("rename")]),
        ]
        for (recordName, recordClock, fields) in shapes {
            #expect(throws: GroupChangeError.self) { try GroupChange(record: try record(recordName, clock: recordClock, fields)) }
        }
        var tombstone = try record(name, good.fields)
        tombstone.isDeleted = true
        #expect(throws: GroupChangeError.self) { try GroupChange(record: tombstone) }
        #expect(GroupMembership(zone: try ZoneName("c-0123456789abcdef-fedcba9876543210"), changes: []) == nil)
    }

    // MARK: The property

    static let people = ["carol", "alice", "bob", "dave", "erin", "frank", "mallory", "trudy"]

    /// A history: the creation (sometimes late, sometimes missing), then changes by random people,
    /// clocks drawn from a narrow range so that many are concurrent (equal clocks too), in bursts
    /// by several admins, as in a raid.
    static func history(seed: UInt64) -> [GroupChange] {
        var random = SeededRandom(seed: seed)
        var changes: [GroupChange] = []
        var salt: UInt64 = 0
        func next(_ actor: String, _ ms: UInt64, _ action: GroupChange.Action, _ targets: [String]) {
            salt += 1
            changes.append(change(actor, ms, action, targets, name: action == .rename ? "name \(salt)" : nil, salt: salt))
        }
        if random.next() % 10 != 0 {
            next("carol", 100 + random.next() % 5, .create, people.filter { $0 != "carol" && random.next() % 2 == 0 })
        }
        // Usually admins besides the creator, made early (who may not be members yet then).
        for admin in ["alice", "bob"] where random.next() % 3 != 0 {
            next("carol", 102 + random.next() % 6, .add, [admin])
            next("carol", 104 + random.next() % 6, .promote, [admin])
        }
        for _ in 0..<(20 + Int(random.next() % 40)) {
            // Mostly the creator and the people it tends to promote, as the admins of a raid.
            let actors = ["carol", "carol", "carol", "alice", "alice", "bob"] + people
            let actor = actors[Int(random.next() % UInt64(actors.count))]
            let targets = ["alice", "bob", "alice", "bob"] + people
            let target = targets[Int(random.next() % UInt64(targets.count))]
            let ms = 95 + random.next() % 60
            let actions = GroupChange.Action.allCases
            switch actions[Int(random.next() % UInt64(actions.count))] {
            case .create: next(actor, ms, .create, [target])
            case .add: next(actor, ms, .add, random.next() % 3 == 0 ? [target, people[Int(random.next() % UInt64(people.count))]] : [target])
            case .remove: next(actor, ms, .remove, [target])
            case .promote: next(actor, ms, .promote, [target])
            case .demote: next(actor, ms, .demote, [target])
            case .leave: next(actor, ms, .leave, [])
            case .rename: next(actor, ms, .rename, [])
            case .describe: next(actor, ms, .describe, [])
            }
        }
        return changes
    }

    /// An independent account of the rule, the slow way: each change against the roles the
    /// accepted changes before it made, recomputed from scratch every time.
    static func audit(_ group: GroupMembership) -> [String] {
        var problems: [String] = []
        let decided = group.decisions
        func roles(before index: Int) -> [String: GroupMembership.Role] {
            var roles: [String: GroupMembership.Role] = [:]
            for (change, decision) in decided[..<index] where decision == .accepted {
                switch change.action {
                case .create: roles[change.actor] = .creator; for t in change.targets where roles[t] == nil { roles[t] = .member }
                case .add: for t in change.targets where roles[t] == nil { roles[t] = .member }
                case .remove: roles[change.targets[0]] = nil
                case .leave: roles[change.actor] = nil
                case .promote: roles[change.targets[0]] = .admin
                case .demote: roles[change.targets[0]] = .member
                case .rename, .describe: break
                }
            }
            return roles
        }
        for (index, (change, decision)) in decided.enumerated() {
            if index > 0, GroupChange.precedes(change, decided[index - 1].change) { problems.append("out of order at \(change.name)") }
            let before = roles(before: index)
            let actorRole = before[change.actor]
            let created = decided[..<index].contains { $0.change.action == .create && $0.decision == .accepted }
            let allowed: Bool = switch change.action {
            case .create: !created && ChatRecords.identityHash(change.actor) == group.creatorHash
            case .leave: created && actorRole != nil
            case .add, .rename, .describe: created && (actorRole ?? .member) >= .admin && actorRole != nil
            case .remove: created && actorRole.map { $0 >= .admin } == true && before[change.targets[0]].map { $0 != .creator } == true && change.targets[0] != change.actor
            case .promote: created && actorRole.map { $0 >= .admin } == true && before[change.targets[0]] == .member
            case .demote: created && actorRole.map { $0 >= .admin } == true && before[change.targets[0]] == .admin
            }
            if allowed != (decision == .accepted) { problems.append("\(change.action) by \(change.actor) at \(change.clock): \(decision), the rule says \(allowed)") }
        }
        if roles(before: decided.count) != group.roles { problems.append("roles \(group.roles) are not what the accepted changes set: \(roles(before: decided.count))") }
        return problems
    }

    static var scheduleCount: Int { ProcessInfo.processInfo.environment["CONVKIT_GROUP_SCHEDULES"].flatMap(Int.init) ?? 1_000 }

    @Test func everyReaderDecidesAlikeWhateverTheOrderAndNoRoleMovesWithoutAnAuthorizedChange() {
        var accepted: [GroupChange.Action: Int] = [:]
        for seed in 0..<UInt64(Self.scheduleCount) {
            let changes = Self.history(seed: seed)
            let reference = Self.decide(changes)
            for (change, decision) in reference.decisions where decision == .accepted { accepted[change.action, default: 0] += 1 }
            let problems = Self.audit(reference)
            #expect(problems.isEmpty, "seed \(seed): \(problems)")
            var random = SeededRandom(seed: seed ^ 0x5EED)
            for reader in 0..<5 {
                // Random order, random batches; a batch is decided at once, the rest one by one,
                // and some changes come twice.
                var arriving = changes.shuffled(using: &random)
                arriving += arriving.prefix(Int(random.next() % 3))
                var group: GroupMembership?
                while !arriving.isEmpty {
                    let size = 1 + Int(random.next() % 6)
                    let batch = Array(arriving.prefix(size))
                    arriving.removeFirst(batch.count)
                    if var held = group {
                        for change in batch { held.insert(change) }
                        group = held
                    } else {
                        group = GroupMembership(zone: Self.zone, changes: batch)
                    }
                }
                #expect(group == reference, "seed \(seed), reader \(reader)")
            }
        }
        // The histories are not all refusals: every kind of change takes effect in many of them.
        for action in GroupChange.Action.allCases {
            #expect(accepted[action, default: 0] > Self.scheduleCount / 10, "\(action): \(accepted)")
        }
    }

    /// A zone server's side of the property: the same histories sent to a server in a random
    /// order, each change by its actor (``GroupAccess``: stored only if the group as the server
    /// holds it allows it now and the rule accepts it at its clock). The server's membership is
    /// exactly what a reader holding the changes it stored decides, whatever order they are
    /// read in; no role moves without an authorized change; and the server never stores a
    /// change by someone who was not then allowed to make it (no admin removed or demoted
    /// dates a change back past that).
    @Test func aServerStoresOnlyWhatTheGroupAllowsWhenItArrivesAndReadersAgreeWithIt() throws {
        var stored = 0, refused = 0
        for seed in 0..<UInt64(Self.scheduleCount) {
            var random = SeededRandom(seed: seed ^ 0x5E4E4)
            var server = GroupAccess().decide(Self.zone, governing: [])
            var kept: [GroupChange] = []
            // Mostly in clock order, as devices online send them; a third held back by devices
            // that were offline and sent late, in any order.
            var arriving = Self.history(seed: seed).sorted(by: GroupChange.precedes)
            var late: [GroupChange] = []
            arriving.removeAll { change in
                guard random.next() % 3 == 0 else { return false }
                late.append(change)
                return true
            }
            for change in late.shuffled(using: &random) { arriving.insert(change, at: Int(random.next() % UInt64(arriving.count + 1))) }
            for change in arriving {
                var record = Record(id: try RecordID(zone: Self.zone, name: change.name), type: GroupChange.recordType, fields: change.fields)
                record.clock = change.clock
                let before = try #require(server as? GroupAccess.State).group
                if server.admit(record, owner: change.actor, as: change.actor) == nil {
                    stored += 1
                    kept.append(change)
                    #expect(before?.decisionNow(change) == .accepted, "seed \(seed): \(change.name) stored though the group did not allow it then")
                    let after = try #require(server as? GroupAccess.State).group
                    #expect(after?.decisions.first { $0.change.name == change.name }?.decision == .accepted,
                            "seed \(seed): \(change.name) stored though the rule at its clock refused it")
                } else {
                    refused += 1
                }
            }
            let state = try #require(server as? GroupAccess.State)
            let group = try #require(state.group)
            #expect(group == Self.decide(kept.shuffled(using: &random)), "seed \(seed)")
            let problems = Self.audit(group)
            #expect(problems.isEmpty, "seed \(seed): \(problems)")
        }
        // Both happen, many times (histories hold 20-60 changes, many without the right).
        #expect(stored > Self.scheduleCount * 5 && refused > Self.scheduleCount * 5, "stored \(stored), refused \(refused)")
    }
}
