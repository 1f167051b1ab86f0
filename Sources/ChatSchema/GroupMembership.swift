import Foundation
import RecordZone

/// One signed change to a group's membership: a `GroupChange` record, read and checked for
/// shape (not yet for authority: that is ``GroupMembership``'s rule).
///
/// A group's zone is `g-<h(creator)>-<16 hex random>`: the creator is named by the zone, so no one
/// can make a group in someone else's name, and the random part keeps one creator's groups apart.
/// A change is named `gc.<h(actor)>.<16 hex of its clock>-<16 hex random>`, owned by `actor`; the
/// clock in its name must be the clock it is signed at, so a change has exactly one valid version:
/// changes are never edited or deleted (a later version or a tombstone is refused), and a removed
/// admin cannot rewrite an old change to mean something else.
public struct GroupChange: Sendable, Hashable {
    public enum Action: String, Sendable, CaseIterable {
        /// The genesis: the creator names the group and may list its first members.
        case create
        /// Adds `targets` as members (an admin's).
        case add
        /// Removes one member or admin, never the creator (an admin's).
        case remove
        /// Makes a member an admin (an admin's).
        case promote
        /// Makes an admin a member again, never the creator (an admin's; an admin may demote
        /// themself).
        case demote
        /// The actor leaves (anyone in the group, the creator included).
        case leave
        /// Names the group anew (an admin's).
        case rename
        /// Sets the group's description and avatar, each absent for none (an admin's).
        case describe
    }

    /// A group's avatar: an asset (a PNG capped as speakers' avatars are) and its pixel size.
    public struct Avatar: Sendable, Hashable {
        public let asset: AssetReference
        public let width: Int
        public let height: Int

        public init(asset: AssetReference, width: Int, height: Int) {
            self.asset = asset
            self.width = width
            self.height = height
        }
    }

    /// The record's name: unique in the zone, the last key of the order changes are decided in.
    public let name: String
    public let actor: String
    public let clock: RecordClock
    public let action: Action
    /// Who the change is about: add and create, any number; remove, promote and demote, one;
    /// leave and rename, none.
    public let targets: [String]
    /// The group's name, for create and rename.
    public let groupName: String?
    /// What members added later may read, for create (nil: ``GroupMembership/History/sinceAdded``).
    public let history: GroupMembership.History?
    /// The group's description, for describe (nil: none).
    public let groupDescription: String?
    /// The group's avatar, for describe (nil: none).
    public let avatar: Avatar?

    public static let recordType = "GroupChange"
    public static let namePrefix = "gc."
    /// The longest group name, in UTF-8 bytes.
    public static let maximumNameBytes = 256
    /// The longest group description, in UTF-8 bytes.
    public static let maximumDescriptionBytes = 1024
    /// The largest side of a group's avatar, in pixels.
    public static let largestAvatarSide = 4096

    public init(name: String, actor: String, clock: RecordClock, action: Action, targets: [String] = [], groupName: String? = nil,
                history: GroupMembership.History? = nil, groupDescription: String? = nil, avatar: Avatar? = nil) {
        self.name = name
        self.actor = actor
        self.clock = clock
        self.action = action
        self.targets = targets
        self.groupName = groupName
        self.history = action == .create ? history : nil
        self.groupDescription = action == .describe ? groupDescription : nil
        self.avatar = action == .describe ? avatar : nil
    }

    /// The record name for a change by `actor` at `clock`, with `random` (16 hex characters)
    /// keeping two changes at one clock apart.
    public static func recordName(actor: String, clock: RecordClock, random: String) -> String {
        namePrefix + ChatRecords.identityHash(actor) + "." + String(format: "%016llx", clock.rawValue) + "-" + random
    }

    /// Reads a change from a verified record, or says why its shape is wrong (a reader
    /// quarantines it as a schema violation; a server refuses it).
    public init(record: Record) throws(GroupChangeError) {
        guard record.recordType == Self.recordType else { throw .shape("not a \(Self.recordType) record") }
        guard !record.isDeleted else { throw .shape("a group change is never deleted") }
        guard let actor = record.fields["actor"]?.stringValue, ChatRecords.isValidIdentifier(actor) else {
            throw .shape("actor is missing or not a valid identifier")
        }
        let prefix = Self.namePrefix + ChatRecords.identityHash(actor) + "."
        let rest = record.id.name.dropFirst(prefix.count)
        guard record.id.name.hasPrefix(prefix), rest.count == 33, rest.dropFirst(16).first == "-",
              Self.isHex(rest.prefix(16)), Self.isHex(rest.suffix(16)), let named = UInt64(rest.prefix(16), radix: 16)
        else { throw .shape("the name is not gc.<h(actor)>.<16 hex clock>-<16 hex>") }
        guard named == record.clock.rawValue else { throw .shape("the clock in the name is not the clock the change is signed at") }
        guard let raw = record.fields["action"]?.stringValue, let action = Action(rawValue: raw) else {
            throw .shape("action is missing or unknown")
        }
        var targets: [String] = []
        if let field = record.fields["targets"] {
            guard case .list(let items) = field else { throw .shape("targets is not a list") }
            for item in items {
                guard let target = item.stringValue, ChatRecords.isValidIdentifier(target) else { throw .shape("a target is not a valid identifier") }
                targets.append(target)
            }
        }
        switch action {
        case .create, .add: break
        case .remove, .promote, .demote: guard targets.count == 1 else { throw .shape("\(raw) names exactly one target") }
        case .leave, .rename, .describe: guard targets.isEmpty else { throw .shape("\(raw) names no target") }
        }
        if action == .add, targets.isEmpty { throw .shape("add names at least one target") }
        let groupName = record.fields["name"]?.stringValue
        if action == .create || action == .rename {
            guard let groupName, !groupName.isEmpty, groupName.utf8.count <= Self.maximumNameBytes else {
                throw .shape("\(raw) needs a name of 1-\(Self.maximumNameBytes) bytes")
            }
        }
        var history: GroupMembership.History?
        if let field = record.fields["history"] {
            guard action == .create, let raw = field.stringValue, let setting = GroupMembership.History(rawValue: raw) else {
                throw .shape("history is set only by create, to \(GroupMembership.History.allCases.map { "'\($0.rawValue)'" }.joined(separator: " or "))")
            }
            history = setting
        }
        var groupDescription: String?, avatar: Avatar?
        if action == .describe {
            if let field = record.fields["description"] {
                guard let text = field.stringValue, text.utf8.count <= Self.maximumDescriptionBytes else {
                    throw .shape("description is a string of at most \(Self.maximumDescriptionBytes) bytes")
                }
                groupDescription = text.isEmpty ? nil : text
            }
            if let field = record.fields["avatar"] {
                let sides = 1...Int64(Self.largestAvatarSide)
                guard case .asset(let asset) = field, let width = record.fields["avatarWidth"]?.intValue, let height = record.fields["avatarHeight"]?.intValue,
                      sides.contains(width), sides.contains(height) else {
                    throw .shape("avatar is an asset with avatarWidth and avatarHeight of 1-\(Self.largestAvatarSide)")
                }
                avatar = Avatar(asset: asset, width: Int(width), height: Int(height))
            }
        }
        self.init(name: record.id.name, actor: actor, clock: record.clock, action: action, targets: targets,
                  groupName: action == .create || action == .rename ? groupName : nil, history: history, groupDescription: groupDescription, avatar: avatar)
    }

    /// ASCII hex digits only (names compare bytewise in every language: no look-alike digits).
    static func isHex(_ text: Substring) -> Bool {
        text.utf8.allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains($0) }
    }

    /// The record's fields for this change (what ``init(record:)`` reads back).
    public var fields: [String: FieldValue] {
        var fields: [String: FieldValue] = ["actor": .string(actor), "action": .string(action.rawValue)]
        if !targets.isEmpty { fields["targets"] = .list(targets.map { .string($0) }) }
        if let groupName { fields["name"] = .string(groupName) }
        if let history { fields["history"] = .string(history.rawValue) }
        if let groupDescription { fields["description"] = .string(groupDescription) }
        if let avatar {
            fields["avatar"] = .asset(avatar.asset)
            fields["avatarWidth"] = .int(Int64(avatar.width))
            fields["avatarHeight"] = .int(Int64(avatar.height))
        }
        return fields
    }

    /// The change in words, e.g. "alice added carol, dave".
    public var summary: String { Self.summary(actor: actor, action: action, targets: targets, groupName: groupName) }

    /// A change in words, from its parts.
    public static func summary(actor: String, action: Action, targets: [String], groupName: String?) -> String {
        let who = targets.joined(separator: ", ")
        return switch action {
        case .create: "\(actor) created the group \(groupName ?? "")" + (targets.isEmpty ? "" : " with \(who)")
        case .add: "\(actor) added \(who)"
        case .remove: "\(actor) removed \(who)"
        case .promote: "\(actor) made \(who) an admin"
        case .demote: "\(actor) made \(who) a member"
        case .leave: "\(actor) left"
        case .rename: "\(actor) named the group \(groupName ?? "")"
        case .describe: "\(actor) changed the group's description and picture"
        }
    }

    /// The order every reader decides changes in: by clock, then by name.
    public static func precedes(_ a: GroupChange, _ b: GroupChange) -> Bool {
        (a.clock, a.name) < (b.clock, b.name)
    }
}

/// Why a record is not a well-formed group change.
public enum GroupChangeError: Error, Sendable, Equatable, CustomStringConvertible {
    case shape(String)
    public var description: String {
        switch self { case .shape(let why): "not a valid group change: \(why)" }
    }
}

/// A group's membership as every reader and every server decides it: a function of the set of
/// valid changes held, never of the order they arrived in.
///
/// **The rule.** Changes are taken in one order — by clock, then by record name — and each is
/// decided against the state the changes before it made: it takes effect only if its actor then
/// held the role it needs, and otherwise is refused with a reason, and changes nothing. Nothing
/// else changes anyone's membership or role: no default, no reset, no fallback when changes
/// conflict. Concurrent changes are ordered by their clocks like any others: of two admins who
/// remove each other offline, the earlier removal takes effect and the later one is refused
/// (its actor is no longer an admin); a change by an admin demoted at an earlier clock is
/// refused.
/// - Nothing counts before the group's `create` (by the creator the zone names, the earliest
///   one); changes at earlier clocks are refused, later `create`s too.
/// - Admins (the creator is one) add, remove, promote, demote and rename; the creator cannot be
///   removed or demoted by anyone; anyone in the group may leave (the creator too, who comes back,
///   if added again, as a plain member).
/// - A membership runs from the clock of the change that made it to the clock of the change that
///   ended it: a record by a speaker counts as written in the group if its clock falls strictly
///   inside one of the speaker's runs (``isMember(_:at:)``).
///
/// A signer chooses its clock: on a folder, an admin removed while offline can still date changes
/// before the removal, and they count, as they would have had they come sooner (a zone server
/// refuses changes from anyone who is not an admin when they arrive, so there it cannot).
public struct GroupMembership: Sendable, Equatable {
    public enum Role: String, Sendable, Comparable {
        case member, admin, creator
        public static func < (a: Role, b: Role) -> Bool { a.rank < b.rank }
        private var rank: Int { switch self { case .member: 0; case .admin: 1; case .creator: 2 } }
    }

    /// What a member reads of what was said outside their membership, set once by the group's
    /// `create`: a reader (a store showing messages, a server serving them) applies it alike.
    public enum History: String, Sendable, CaseIterable {
        /// What was said while they were in the group: from the change that added them to the
        /// one that ended their membership (the default).
        case sinceAdded = "since-added"
        /// Everything said before their membership ended, from the group's start.
        case all
    }

    /// How a change was decided.
    public enum Decision: Sendable, Equatable {
        case accepted
        case refused(String)
    }

    /// A run of membership: from the clock of the change that made it, to the clock of the one
    /// that ended it (nil: still a member).
    public struct Run: Sendable, Equatable {
        public let from: RecordClock
        public let until: RecordClock?

        public init(from: RecordClock, until: RecordClock?) {
            self.from = from
            self.until = until
        }
    }

    /// h(creator), from the zone's name.
    public let creatorHash: String
    /// Whether the creator's `create` has been taken.
    public private(set) var isCreated = false
    /// Everyone in the group now, with their role.
    public private(set) var roles: [String: Role] = [:]
    /// The group's name now (nil before its creation).
    public private(set) var name: String?
    /// What members read of what was said outside their membership (set by the `create`).
    public private(set) var history: History = .sinceAdded
    /// The group's description now (the last `describe` that took effect).
    public private(set) var groupDescription: String?
    /// The group's avatar now (the last `describe` that took effect).
    public private(set) var avatar: GroupChange.Avatar?
    /// Every change held, in the order decided, with its decision.
    public private(set) var decisions: [(change: GroupChange, decision: Decision)] = []
    /// Each speaker's runs of membership, in order.
    public private(set) var runs: [String: [Run]] = [:]
    /// The names of the changes held.
    private var held = Set<String>()

    public static func == (a: GroupMembership, b: GroupMembership) -> Bool {
        a.creatorHash == b.creatorHash && a.isCreated == b.isCreated && a.roles == b.roles && a.name == b.name && a.history == b.history && a.runs == b.runs
            && a.groupDescription == b.groupDescription && a.avatar == b.avatar
            && a.decisions.map(\.change) == b.decisions.map(\.change) && a.decisions.map(\.decision) == b.decisions.map(\.decision)
    }

    /// The zone prefix of groups.
    public static let zonePrefix = "g-"

    /// A new group's zone: `g-<h(creator)>-<16 hex random>`.
    public static func zone(creator: String, random: String) -> ZoneName? {
        try? ZoneName(zonePrefix + ChatRecords.identityHash(creator) + "-" + random)
    }

    /// The hash of the creator a group zone names, or nil when `zone` is not a group's.
    public static func creatorHash(of zone: ZoneName) -> String? {
        guard isGroupZone(zone) else { return nil }
        let text = zone.rawValue.utf8
        return String(decoding: text.dropFirst(2).prefix(16), as: UTF8.self)
    }

    /// Whether `zone` is named as a group's, `g-<16 hex>-<16 hex>` (read byte by byte: every
    /// applied record asks).
    public static func isGroupZone(_ zone: ZoneName) -> Bool {
        let text = zone.rawValue.utf8
        guard text.count == 35 else { return false }
        for (index, byte) in text.enumerated() {
            switch index {
            case 0: guard byte == UInt8(ascii: "g") else { return false }
            case 1, 18: guard byte == UInt8(ascii: "-") else { return false }
            default: guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(byte) else { return false }
            }
        }
        return true
    }

    /// The membership the changes in `changes` decide, for the group zone `zone` (nil when the
    /// zone is not a group's). Duplicates (one name twice) count once.
    public init?(zone: ZoneName, changes: some Sequence<GroupChange>) {
        guard let creatorHash = Self.creatorHash(of: zone) else { return nil }
        var seen = Set<String>()
        self.init(creatorHash: creatorHash, ordered: changes.filter { seen.insert($0.name).inserted }.sorted(by: GroupChange.precedes))
    }

    /// The state after some changes, taken up again without them (a store that kept the roles,
    /// whether the group was created and its name): ``insert(_:)`` then decides changes that
    /// come after those in the order. Runs and decisions start empty.
    public init?(zone: ZoneName, resumingWith roles: [String: Role], isCreated: Bool, name: String?, history: History = .sinceAdded) {
        guard let creatorHash = Self.creatorHash(of: zone) else { return nil }
        self.creatorHash = creatorHash
        self.roles = roles
        self.isCreated = isCreated
        self.name = name
        self.history = history
    }

    /// Takes one more change: decided at once when it comes after every change held (the usual
    /// case: O(1)), otherwise everything is decided again in the order (O(changes)). A change
    /// held already (by name) changes nothing.
    public mutating func insert(_ change: GroupChange) {
        guard !held.contains(change.name) else { return }
        if let last = decisions.last?.change, GroupChange.precedes(change, last) {
            let all = decisions.map(\.change) + [change]
            self = Self(creatorHash: creatorHash, ordered: all.sorted(by: GroupChange.precedes))
        } else {
            decide(change)
        }
    }

    private init(creatorHash: String, ordered: [GroupChange]) {
        self.creatorHash = creatorHash
        for change in ordered { decide(change) }
    }

    /// Whether `speaker` was in the group at `clock`: inside one of its runs (after the change
    /// that made the run, before the one that ended it).
    public func isMember(_ speaker: String, at clock: RecordClock) -> Bool {
        runs[speaker]?.contains { $0.from < clock && ($0.until.map { clock < $0 } ?? true) } ?? false
    }

    /// Whether `reader` reads a version of the group's (not a change: every change is read by
    /// anyone who was ever in the group) at `clock`: inside one of its runs; or, when the group
    /// keeps ``History/all``, at any clock before its last run ended. Nobody never in the group
    /// reads anything.
    public func mayRead(_ reader: String, at clock: RecordClock) -> Bool {
        Self.mayRead(runs: runs[reader] ?? [], history: history, between: clock, and: clock)
    }

    /// Whether a reader whose runs are `runs` (oldest first) reads a version of the group's at
    /// some clock from `first` to `last` (``mayRead(_:at:)`` over a span: a sender's epoch, say).
    public static func mayRead(runs: [Run], history: History, between first: RecordClock, and last: RecordClock) -> Bool {
        guard let latest = runs.last else { return false }
        switch history {
        case .sinceAdded: return runs.contains { $0.from < last && ($0.until.map { first < $0 } ?? true) }
        case .all: return latest.until.map { first < $0 } ?? true
        }
    }

    /// Whether a change of this name is held.
    public func holds(_ changeName: String) -> Bool { held.contains(changeName) }

    /// How `change` would be decided against the group as it stands after every change held —
    /// what a server asks of a change when it arrives, beside the rule at its clock.
    public func decisionNow(_ change: GroupChange) -> Decision { judge(change) }

    /// Admins now, the creator included.
    public var admins: Set<String> { Set(roles.filter { $0.value >= .admin }.keys) }

    /// Decides `change` against the state so far (the changes before it in the order).
    private mutating func decide(_ change: GroupChange) {
        let verdict = judge(change)
        held.insert(change.name)
        decisions.append((change, verdict))
        guard verdict == .accepted else { return }
        switch change.action {
        case .create:
            isCreated = true
            name = change.groupName
            history = change.history ?? .sinceAdded
            join(change.actor, as: .creator, at: change.clock)
            for target in change.targets where roles[target] == nil { join(target, as: .member, at: change.clock) }
        case .add:
            for target in change.targets where roles[target] == nil { join(target, as: .member, at: change.clock) }
        case .remove:
            part(change.targets[0], at: change.clock)
        case .leave:
            part(change.actor, at: change.clock)
        case .promote:
            roles[change.targets[0]] = .admin
        case .demote:
            roles[change.targets[0]] = .member
        case .rename:
            name = change.groupName
        case .describe:
            groupDescription = change.groupDescription
            avatar = change.avatar
        }
    }

    /// Whether the state so far lets `change` take effect, and if not, why.
    private func judge(_ change: GroupChange) -> Decision {
        if change.action == .create {
            guard ChatRecords.identityHash(change.actor) == creatorHash else { return .refused("only the creator the zone names creates the group") }
            return isCreated ? .refused("the group was created already") : .accepted
        }
        guard isCreated else { return .refused("the group is not created yet at this clock") }
        let role = roles[change.actor]
        switch change.action {
        case .create:
            return .accepted  // decided above
        case .leave:
            return role == nil ? .refused("\(change.actor) is not in the group") : .accepted
        case .rename, .add, .describe:
            guard let role, role >= .admin else { return .refused("only an admin may \(change.action.rawValue)") }
            return .accepted
        case .remove, .promote, .demote:
            guard let role, role >= .admin else { return .refused("only an admin may \(change.action.rawValue)") }
            let target = change.targets[0]
            guard let targetRole = roles[target] else { return .refused("\(target) is not in the group") }
            switch change.action {
            case .remove:
                if targetRole == .creator { return .refused("nobody removes the creator") }
                if target == change.actor { return .refused("one leaves rather than removes oneself") }
                return .accepted
            case .promote:
                return targetRole == .member ? .accepted : .refused("\(target) is an admin already")
            default:
                if targetRole == .creator { return .refused("nobody demotes the creator") }
                return targetRole == .admin ? .accepted : .refused("\(target) is not an admin")
            }
        }
    }

    private mutating func join(_ speaker: String, as role: Role, at clock: RecordClock) {
        roles[speaker] = role
        runs[speaker, default: []].append(Run(from: clock, until: nil))
    }

    private mutating func part(_ speaker: String, at clock: RecordClock) {
        roles[speaker] = nil
        if var list = runs[speaker], let last = list.last, last.until == nil {
            list[list.count - 1] = Run(from: last.from, until: clock)
            runs[speaker] = list
        }
    }
}
