import ConversationKit
import Foundation
@testable import RecordZone
import Testing
import TestSupport

/// "Never unable to decrypt", as a property (docs/ENCRYPTION.md): random schedules of real
/// stores on one backend — alice's phone, bob, carol, alice's laptop linked midway and sometimes
/// revoked — sending in their pair and
/// group conversations, carol added to and removed from the group (whose history setting is
/// drawn too), stores going offline for long stretches and syncing at random points. Once every
/// store has synced, every message a store shows it can read: none waits for its key. Fixed
/// seeds: `CONVKIT_ENCRYPTION_SCHEDULES` sets how many (the suite runs 1,000;
/// `scripts/convergence.sh` the long form); `CONVKIT_ENCRYPTION_SEED` runs one.
///
/// Not in the schedules yet: a store copied to a second machine and used beside the original.
/// With it, seed 103 ended with the original store missing the other side's messages
/// altogether (not waiting: never pulled) after the copy had pushed — a sync finding open in
/// LIMITS.md, not an encryption one.
@Suite struct EncryptionPropertyTests {
    static var scheduleCount: Int { Int(ProcessInfo.processInfo.environment["CONVKIT_ENCRYPTION_SCHEDULES"] ?? "") ?? 1000 }

    /// What went wrong in one schedule (empty: nothing), and how many messages it checked.
    static func run(seed: UInt64, in directory: String) async throws -> (problems: [String], checked: Int) {
        var random = ConvergenceTests.SeededRandom(state: seed)
        func draw(_ n: Int) -> Int { Int(random.next() % UInt64(n)) }
        let root = directory + "/\(seed)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let backend = InMemoryBackend(policy: ConversationStore.recordPolicy())
        func open(_ name: String) throws -> ConversationStore { try ConversationStore(directory: root + "/" + name, backend: .memory(backend)) }
        var stores: [String: ConversationStore] = [:]
        for name in ["alice", "bob", "carol"] {
            let store = try open(name)
            try await store.setupLocalSpeaker(identifier: name, name: name.capitalized)
            // Some publish their device at once, some only when they first sync below.
            if draw(2) == 0 { try await store.sync() }
            stores[name] = store
        }
        func store(_ name: String) throws -> ConversationStore { try #require(stores[name]) }
        let carolFirst = draw(2) == 0
        let setting: GroupMembership.History = draw(2) == 0 ? .sinceAdded : .all
        let group = try await store("alice").createGroup(name: "Group", members: carolFirst ? ["bob", "carol"] : ["bob"], history: setting)
        var carolIn = carolFirst, revoked = false
        var trace = ["group \(setting.rawValue) with carol: \(carolFirst)"]
        var offline = Set<String>()
        let speaker = ["alice": "alice", "laptop": "alice", "bob": "bob", "carol": "carol"]
        for step in 0..<18 {
            let names = stores.keys.sorted()
            switch draw(10) {
            case 0, 1, 2:
                // A message in the pair, from one of its two speakers' stores.
                let from = names.filter { ["alice", "bob"].contains(speaker[$0]) && !($0 == "laptop" && revoked) }
                let name = from[draw(from.count)]
                let sent = try await store(name).send("pair \(step) from \(name)", to: speaker[name] == "alice" ? "bob" : "alice")
                trace.append("\(name) says \(sent.id.name) in the pair")
            case 3, 4:
                let from = names.filter { $0 != "carol" || carolIn }.filter { !($0 == "laptop" && revoked) }
                let name = from[draw(from.count)]
                do {
                    let sent = try await store(name).send("group \(step) from \(name)", toGroup: group.id)
                    trace.append("\(name) says \(sent.id.name) in the group")
                } catch let error as ConversationError where error.code == .notAllowedInGroup {
                    // Its store has not synced the change that added it yet.
                }
            case 5, 6:
                let online = names.filter { !offline.contains($0) }
                if !online.isEmpty {
                    let name = online[draw(online.count)]
                    try await store(name).sync()
                    trace.append("\(name) syncs")
                }
            case 7:
                // Offline for a stretch, or back.
                let name = names[draw(names.count)]
                if offline.contains(name) { offline.remove(name) } else { offline.insert(name) }
                trace.append("\(name) \(offline.contains(name) ? "goes offline" : "is back")")
            case 8:
                if carolIn { try await store("alice").removeMember("carol", from: group.id) } else { try await store("alice").addMembers(["carol"], to: group.id) }
                carolIn.toggle()
                trace.append(carolIn ? "alice adds carol" : "alice removes carol")
            default:
                if stores["laptop"] == nil {
                    // A first device links another once it has been online: the new device then
                    // knows its key. (One that never synced and links a device that sends and is
                    // revoked before either sees the other's key leaves those messages unreadable
                    // on it: LIMITS.md.)
                    try await store("alice").sync()
                    let laptop = try open("laptop")
                    try await laptop.setupLocalSpeaker(linking: try store("alice").linkDevice(), label: "laptop")
                    stores["laptop"] = laptop
                    trace.append("alice links her laptop")
                } else if !revoked, let laptop = try store("alice").devices().first(where: { $0.label == "laptop" }) {
                    try await store("alice").revokeDevice(laptop)
                    revoked = true
                    trace.append("alice revokes her laptop")
                }
            }
        }
        // Everyone back online, syncing until nothing moves.
        for _ in 0..<4 { for name in stores.keys.sorted() { try await store(name).sync() } }
        var problems = [String](), checked = 0
        for name in stores.keys.sorted() where !(name == "laptop" && revoked) {
            let store = try store(name)
            for conversation in try store.conversations() {
                for message in try history(store, conversation.id) {
                    checked += 1
                    if message.isWaitingForKey { problems.append("\(name) cannot read \(message.speaker)'s message in \(conversation.isGroup ? "the group" : "the pair") (\(message.id.name))") }
                }
            }
        }
        for store in stores.values { store.close() }
        return (problems.isEmpty ? [] : problems + ["schedule: " + trace.joined(separator: ", ")], checked)
    }

    @Test(arguments: 0..<8)
    func everyMessageAMemberDeviceMayReadItReadsOnceSynced(_ part: Int) async throws {
        let directory = try TemporaryDirectory("encryption-property")
        var failures = 0, checked = 0
        let only = ProcessInfo.processInfo.environment["CONVKIT_ENCRYPTION_SEED"].flatMap { UInt64($0) }
        for seed in stride(from: UInt64(part), to: UInt64(Self.scheduleCount), by: 8) where only == nil || only == seed {
            let (problems, count) = try await Self.run(seed: seed, in: directory.path)
            checked += count
            if !problems.isEmpty {
                failures += 1
                if failures <= 3 { Issue.record("seed \(seed): \(problems.joined(separator: "; "))") }
            }
        }
        #expect(failures == 0, "\(failures) schedules left messages unreadable")
        #expect(checked > Self.scheduleCount, "the schedules show messages")
    }
}
