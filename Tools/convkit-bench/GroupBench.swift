import ConversationKit
import Foundation
import RecordZone
import ZoneServer

/// Groups, each figure beside the same work in the same run where the group is small or a pair:
/// a message sent in a 1,000-member group against one in a pair; a member pulling 2,000 new
/// group messages against a pair's 2,000; one member added to a 10,000-member group against one added
/// to a 10-member group. Ratios near 1 mean the group's size costs nothing on that path. Twice:
/// in the store over an in-memory backend (the store's own cost), and through a zone server on
/// SQLite (each send and add synced: the server decides access from the group's membership in
/// the save's transaction, and stores a group message once).
@MainActor func groupBench(_ reporter: Reporter, seconds: Double) async throws {
    let root = FileManager.default.temporaryDirectory.path + "/convkit-group-bench-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }

    reporter.header("Groups (the store, in-memory backend)")
    let memory = InMemoryBackend(policy: ConversationStore.recordPolicy())
    // A pull through a backend of its own: a store reads every group an in-memory backend shows.
    try await groupRows(reporter, seconds: seconds, root: root + "/memory", synced: false, backend: { .memory(memory) },
                        pullBackend: { .memory(InMemoryBackend(policy: ConversationStore.recordPolicy())) })

    reporter.header("Groups (through a zone server on SQLite)")
    let storage = try SQLiteZoneStorage(directory: root + "/server", policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
    let (server, url, _) = try startBenchServer(storage, access: ChatZoneAccess())
    // One server for all: it shows a store only the groups its speaker is in.
    try await groupRows(reporter, seconds: seconds, root: root + "/http", synced: true, backend: { .server(url) }, pullBackend: { .server(url) })
    await server.stop()
}

/// The three comparisons over stores made by `backend`. - Parameter synced: each send and add
/// is synced before the next (through a server: what it costs to get there).
@MainActor private func groupRows(_ reporter: Reporter, seconds: Double, root: String, synced: Bool, backend: () -> BackendFactory,
                                   pullBackend: () -> BackendFactory) async throws {
    let content = "Hello there! This is a message about as long as a chat line usually is."
    let carol = try ConversationStore(directory: root + "/carol", backend: backend())
    try await carol.setupLocalSpeaker(identifier: "carol", name: "Carol")
    func settle() async throws { if synced { try await carol.sync() } }

    // 1. Sends: a 1,000-member group against a pair.
    let big = try await carol.createGroup(name: "Big", members: ["bob"] + (0..<999).map { "m\($0)" })
    try await settle()
    let (groupSends, pairSends) = try await ratesInTurns(seconds: seconds, {
        try await carol.send(content, toGroup: big.id)
        try await settle()
    }, {
        try await carol.send(content, to: "bob")
        try await settle()
    })
    reporter.report(Row(name: "send in a 1,000-member group", perSecond: groupSends, rawName: "send in a pair", rawPerSecond: pairSends))

    // 2. A member's pull: 2,000 new messages of a 1,000-member group they are in (its members'
    // profiles looked for when they joined, as a store does once), and 2,000 of a pair; three
    // rounds each, in turns.
    let pull = 2_000
    func reader(_ identifier: String, start: (ConversationStore) async throws -> String) async throws -> (sender: ConversationStore, store: ConversationStore, conversation: String) {
        let shared = pullBackend()
        let sender = try ConversationStore(directory: root + "/sender-\(identifier)", backend: shared)
        try await sender.setupLocalSpeaker(identifier: "sender-\(identifier)", name: "Sender")
        let store = try ConversationStore(directory: root + "/\(identifier)", backend: shared)
        try await store.setupLocalSpeaker(identifier: identifier, name: identifier)
        try await store.sync()
        let conversation = try await start(sender)
        try await sender.sync()
        try await store.sync()
        return (sender, store, conversation)
    }
    /// Seconds to pull `pull` new messages, and how many records the pull applied.
    func pulled(_ reader: (sender: ConversationStore, store: ConversationStore, conversation: String), group: Bool) async throws -> (Double, Int) {
        for _ in 0..<pull {
            if group { _ = try await reader.sender.send(content, toGroup: reader.conversation) } else { _ = try await reader.sender.send(content, to: "erin") }
        }
        try await reader.sender.sync()
        let begin = ContinuousClock.now
        let report = try await reader.store.sync()
        return (secondsIn(ContinuousClock.now - begin), report.pulled)
    }
    let dave = try await reader("dave") { sender in try await sender.createGroup(name: "Pull", members: ["dave"] + (0..<999).map { "p\($0)" }).id }
    let erin = try await reader("erin") { sender in try await sender.send("Hello", to: "erin").id.conversation }
    var groupPull = (0.0, 0), pairPull = (0.0, 0)
    for _ in 0..<3 {
        let a = try await pulled(dave, group: true), b = try await pulled(erin, group: false)
        groupPull = (groupPull.0 + a.0, groupPull.1 + a.1)
        pairPull = (pairPull.0 + b.0, pairPull.1 + b.1)
    }
    reporter.report(Row(name: "a member's pull of 2,000 group messages (records/s)", perSecond: Double(groupPull.1) / groupPull.0,
                        rawName: "of a pair's", rawPerSecond: Double(pairPull.1) / pairPull.0))

    // 3. One member added: to a 10,000-member group, against a 10-member group.
    let huge = try await carol.createGroup(name: "Huge", members: (0..<9_999).map { "h\($0)" })
    let small = try await carol.createGroup(name: "Small", members: (0..<9).map { "s\($0)" })
    try await settle()
    var next = 0
    let (addHuge, addSmall) = try await ratesInTurns(seconds: seconds, {
        next += 1
        try await carol.addMembers(["x\(next)"], to: huge.id)
        try await settle()
    }, {
        next += 1
        try await carol.addMembers(["y\(next)"], to: small.id)
        try await settle()
    })
    reporter.report(Row(name: "add one member to a 10,000-member group", perSecond: addHuge, rawName: "to a 10-member group", rawPerSecond: addSmall))
}

/// Two workloads measured in turns — four slices each, alternating — so that neither gains
/// from going first (a store and a server grow as the bench runs). - Returns: each one's rate.
@MainActor private func ratesInTurns(seconds: Double, _ first: () async throws -> Void, _ second: () async throws -> Void) async throws -> (Double, Double) {
    var counts = (0, 0), spent = (0.0, 0.0)
    func slice(_ body: () async throws -> Void) async throws -> (Int, Double) {
        let start = ContinuousClock.now
        var done = 0
        repeat {
            try await body()
            done += 1
        } while secondsIn(ContinuousClock.now - start) < seconds / 4
        return (done, secondsIn(ContinuousClock.now - start))
    }
    for _ in 0..<4 {
        let a = try await slice(first), b = try await slice(second)
        counts = (counts.0 + a.0, counts.1 + b.0)
        spent = (spent.0 + a.1, spent.1 + b.1)
    }
    return (Double(counts.0) / spent.0, Double(counts.1) / spent.1)
}
