import Foundation
@testable import RecordZone
import StorageTestSupport
import Testing
import TestSupport
@testable import ConversationKit

/// Strong eventual consistency, as a property: a history from alice's phone and laptop (a device
/// certificate, messages, edits, deletions, read receipts of bob's messages, sometimes a rotation
/// of her identity key that an old-key message after it breaks, a revocation of the laptop that
/// its later versions break — among them rewrites and deletions of her earlier messages), from
/// bob (messages, edits, deletions, his receipts of hers: his own records coming back, as after a
/// restore) and from a hostile mallory (a forged message, receipt and profile of alice's),
/// delivered to a reader in a random order and random batches — the reader syncing at random
/// points, restarting, clearing its cache — ends with exactly the view of a reader that received
/// it all at once: the same messages in the same order with the same edits and read states, the
/// same profile, the same quarantine. Fixed seeds: `CONVKIT_CONVERGENCE_SCHEDULES` sets how many
/// (the suite runs 1,000; `scripts/convergence.sh` the long form).
@Suite struct ConvergenceTests {
    /// SplitMix64: a seeded generator, the same schedule for the same seed on every machine.
    struct SeededRandom: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    static func key(_ byte: UInt8) -> SigningKey { (try? SigningKey(seed: Data(repeating: byte, count: 32))) ?? SigningKey.generate() }
    static let alice = key(1), laptop = key(11), mallory = key(66), aliceNext = key(2), bob = key(7)

    /// A history: every record, in the order it was written, with its zone.
    static func records(seed: UInt64) throws -> [(zone: ZoneName, bytes: Data)] {
        var random = SeededRandom(state: seed)
        var milliseconds: UInt64 = 1_800_000_000_000
        func tick() -> RecordClock {
            milliseconds += random.next() % 1000 + 1
            return RecordClock(milliseconds: milliseconds, counter: 0)
        }
        let policy = ConversationStore.recordPolicy()
        let aliceZone = ChatRecords.speakerZone("alice")
        var out = [(zone: ZoneName, bytes: Data)]()
        func add(_ record: Record) throws { out.append((record.id.zone, try record.encoded())) }
        func signed(_ record: Record, _ key: SigningKey, _ clock: RecordClock) throws -> Record {
            var record = record
            try record.sign(with: key, clock: clock)
            return record
        }
        let profileClock = tick()
        for record in try ChatRecords.speaker(identifier: "alice", name: "Alice", tags: []) { try add(try signed(record, alice, profileClock)) }
        try add(try signed(try ChatRecords.member("alice", with: "bob"), alice, tick()))
        let code = LinkCode.issue(identity: "alice", identityKey: alice, expires: RecordClock(milliseconds: milliseconds + 86_400_000, counter: 0))
        try add(try DeviceCertificate.record(code: code, device: laptop, label: "laptop", zone: aliceZone, clock: tick()))
        var revokedAfter: RecordClock? = nil
        // Midway, alice may rotate her identity key: later phone messages are signed with the
        // new key, and one more with the old key after the rotation (which breaks) is written too.
        var phone = alice
        var bobsMessages = [String](), alicesMessages = [Record]()
        let rotateAt = random.next() % 2 == 0 ? Int(2 + random.next() % 3) : -1
        for index in 0..<Int(4 + random.next() % 6) {
            if index == rotateAt {
                try add(try KeyRotation.record(identity: "alice", zone: aliceZone, from: alice, to: aliceNext, clock: tick()))
                phone = aliceNext
                let late = tick()
                let stale = try ChatRecords.message(name: "m.\(ChatRecords.identityHash("alice")).\(String(late.rawValue, radix: 16))-stale", speaker: "alice",
                                                    listener: "bob", content: "old key after the rotation", spokenAt: Int64(late.milliseconds), editedAt: nil)
                try add(try signed(stale, alice, late))
            }
            // Alice's message, or bob's (every third on average).
            let fromBob = random.next() % 3 == 0
            let (speaker, listener) = fromBob ? ("bob", "alice") : ("alice", "bob")
            let key = fromBob ? bob : random.next() % 2 == 0 ? phone : laptop
            let clock = tick()
            let message = try ChatRecords.message(name: "m.\(ChatRecords.identityHash(speaker)).\(String(clock.rawValue, radix: 16))-\(index)", speaker: speaker,
                                                  listener: listener, content: "message \(index)", spokenAt: Int64(clock.milliseconds), editedAt: nil)
            let version = try signed(message, key, clock)
            try add(version)
            if fromBob { bobsMessages.append(message.id.name) } else { alicesMessages.append(message) }
            switch random.next() % 5 {
            case 0:  // an edit, by the same device
                var edited = version
                edited.fields["content"] = .string("message \(index), edited")
                let at = tick()
                edited.fields["editedAt"] = .date(milliseconds: Int64(at.milliseconds))
                try add(try signed(edited, key, at))
            case 1:  // deleted
                try add(try policy.tombstone(for: version, signedWith: key, clock: tick()))
            case 2:  // read: alice's receipt (from her phone or laptop) of bob's, bob's of hers
                let at = tick()
                let reader = fromBob ? (random.next() % 2 == 0 ? phone : laptop) : bob
                try add(try signed(try ChatRecords.receipt(zone: message.id.zone, message: message.id.name, reader: listener, readAt: Int64(at.milliseconds)), reader, at))
            default: break
            }
            if revokedAfter == nil, index >= 2, random.next() % 3 == 0 { revokedAfter = tick() }
            // After the revocation's clock, the laptop (a thief's now) sometimes rewrites or
            // deletes one of alice's earlier messages: readers keep the version it replaced.
            if revokedAfter != nil, let target = alicesMessages.randomElement(using: &random), random.next() % 3 == 0 {
                let at = tick()
                if random.next() % 2 == 0 {
                    var rewritten = target
                    rewritten.fields["content"] = .string("rewritten by the thief")
                    try add(try signed(rewritten, laptop, at))
                } else {
                    try add(try policy.tombstone(for: target, signedWith: laptop, clock: at))
                }
            }
        }
        // The revocation of the laptop (its versions after `revokedAfter` break), written last.
        try add(try DeviceRevocation.record(identity: "alice", device: laptop.publicKey, revokedAfter: revokedAfter ?? tick(), zone: aliceZone,
                                            identityKey: phone, clock: tick()))
        // Mallory: a message and a profile of alice's, with her own key.
        let forgedClock = tick()
        let forged = try ChatRecords.message(name: "m.\(ChatRecords.identityHash("alice")).\(String(forgedClock.rawValue, radix: 16))-forged", speaker: "alice",
                                             listener: "bob", content: "forged", spokenAt: Int64(forgedClock.milliseconds), editedAt: nil)
        try add(try signed(forged, mallory, forgedClock))
        if let read = bobsMessages.last {
            let at = tick()
            try add(try signed(try ChatRecords.receipt(zone: ChatRecords.conversationZone("alice", "bob"), message: read, reader: "alice", readAt: Int64(at.milliseconds)), mallory, at))
        }
        try add(try signed(try ChatRecords.speaker(identifier: "alice", name: "Mallory", tags: [])[0], mallory, tick()))
        return out
    }

    /// What a reader shows: the conversation in order (deleted ones gone), alice's name, the quarantine.
    struct View: Equatable, CustomStringConvertible {
        var messages: [String]
        var name: String
        var quarantine: Set<String>
        var description: String { "\(messages) \(name) \(quarantine.sorted())" }
    }

    static func view(_ store: ConversationStore) throws -> View {
        let conversation = ChatRecords.conversationZone("alice", "bob").rawValue
        let messages = try history(store, conversation).map { "\($0.id.name) \($0.content)\($0.editedAt == nil ? "" : " (edited)")\($0.readAt.map { " read \(Int64($0.timeIntervalSince1970 * 1000))" } ?? "")" }
        return View(messages: messages, name: try store.speaker(fromRef: SpeakerRef(identifier: "alice"))?.name ?? "-",
                    quarantine: Set(try store.quarantine().map { "\($0.zone ?? "-")/\($0.name ?? "-") \($0.code?.rawValue ?? "-")" }))
    }

    /// Bob, restoring his store with his key (his own records come back from the backend), who
    /// holds alice's key (from a ref), reading `records` through a fresh backend.
    static func reader(_ directory: String, _ backend: InMemoryBackend) async throws -> ConversationStore {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try KeyFile.write(bob, to: directory + "/speaker.key")
        let reader = try await ConversationStore.rebuild(directory: directory, identifier: "bob", backend: .memory(backend))
        _ = try await reader.conversation(with: SpeakerRef(identifier: "alice", publicKey: alice.publicKey))
        return reader
    }

    static func backend(for records: [(zone: ZoneName, bytes: Data)]) async throws -> InMemoryBackend {
        let backend = InMemoryBackend(policy: ConversationStore.recordPolicy())
        for zone in Set(records.map(\.zone)) { try await backend.createZone(zone) }
        return backend
    }

    /// One seed: the reference reader (everything at once), then a scheduled one.
    static func check(seed: UInt64, in directory: String) async throws -> (reference: View, scheduled: View) {
        let records = try records(seed: seed)
        let all = try await backend(for: records)
        for record in records { try await all.injectUnchecked(record.bytes, into: record.zone) }
        let reference = try await reader(directory + "/reference-\(seed)", all)
        try await reference.sync()
        try await reference.sync()

        var random = SeededRandom(state: seed ^ 0xDEAD_BEEF)
        var order = records
        order.shuffle(using: &random)
        let backend = try await backend(for: records)
        let path = directory + "/scheduled-\(seed)"
        let bob = try await deliverAtRandom(order, into: backend, store: try await reader(path, backend), path: path, random: &random)
        let views = (try view(reference), try view(bob))
        // Each seed's two stores go once compared: 100,000 seeds' would fill the disk.
        reference.close()
        bob.close()
        try? FileManager.default.removeItem(atPath: directory + "/reference-\(seed)")
        try? FileManager.default.removeItem(atPath: path)
        return views
    }

    static var scheduleCount: Int { Int(ProcessInfo.processInfo.environment["CONVKIT_CONVERGENCE_SCHEDULES"] ?? "") ?? 1000 }

    /// The seeds in four parts (run side by side).
    @Test(arguments: 0..<4)
    func everyDeliveryOrderEndsInTheSameView(_ part: Int) async throws {
        let directory = try TemporaryDirectory("convergence")
        var failures = 0
        for seed in stride(from: UInt64(part), to: UInt64(Self.scheduleCount), by: 4) {
            let (reference, scheduled) = try await Self.check(seed: seed, in: directory.path)
            if reference != scheduled {
                failures += 1
                if failures <= 3 { Issue.record("seed \(seed):\nreference \(reference)\nscheduled \(scheduled)") }
            }
        }
        #expect(failures == 0, "\(failures) of the schedules diverged")
    }
}
