import ConversationKit
import Foundation
@testable import RecordZone
import Testing
import TestSupport

/// Two machines, each with its own copy of the shared folder and its own stores, kept in step by
/// Unison (from Debian, installed by the setup script) as a user would run it: `unison A B
/// -batch`, ignoring the writers' temporary files.
final class TwoMachines: @unchecked Sendable {
    let directory: TemporaryDirectory
    var copyA: String { directory.path + "/a/shared" }
    var copyB: String { directory.path + "/b/shared" }

    init() throws {
        directory = try TemporaryDirectory("unison")
        try FileManager.default.createDirectory(atPath: copyA, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: copyB, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: directory.path + "/unison-archives", withIntermediateDirectories: true)
    }

    func copy(_ machine: String) -> String { machine == "a" ? copyA : copyB }

    /// A store on one machine, set up and synced once: the first one creates the shared folder
    /// (the others must join it after a Unison run has copied it to their machine).
    func store(_ identifier: String, on machine: String, label: String? = nil) async throws -> ConversationStore {
        let store = try ConversationStore(directory: "\(directory.path)/\(machine)/stores/\(identifier)",
                                          backend: .folder(copy(machine), device: label ?? identifier))
        try await store.setupLocalSpeaker(identifier: identifier, name: identifier.capitalized)
        try await store.sync()
        return store
    }

    /// Alice on machine A creates the folder, Unison copies it, Bob joins on machine B.
    func aliceAndBob(labels: (String, String)? = nil) async throws -> (ConversationStore, ConversationStore) {
        let alice = try await store("alice", on: "a", label: labels?.0)
        #expect(try await unison() == 0)
        return (alice, try await store("bob", on: "b", label: labels?.1))
    }

    var unisonArguments: [String] {
        ["UNISON=\(directory.path)/unison-archives", "unison", copyA, copyB, "-batch", "-silent", "-ignore", "Name .*.tmp", "-perms", "0", "-times"]
    }

    /// One Unison run between the two copies. - Returns: its exit status (0: everything in step).
    @discardableResult
    func unison() async throws -> Int32 {
        let run = try ChildProcess("/usr/bin/env", unisonArguments)
        let status = await run.wait()
        if status != 0 { lastUnisonOutput = run.standardOutput + run.standardError }
        return status
    }

    /// What the last failed Unison run printed.
    nonisolated(unsafe) var lastUnisonOutput = ""

    /// Alice and Bob, three messages from Alice synced and copied to B by Unison; her newest
    /// segment in copy B.
    func threeFromAliceCopied() async throws -> (ConversationStore, ConversationStore, String) {
        let (alice, bob) = try await aliceAndBob()
        for n in 0..<3 { _ = try await alice.send("a\(n)", to: "bob") }
        try await alice.sync()
        #expect(try await unison() == 0)
        return (alice, bob, try #require(try segments(of: "alice", in: "b").last))
    }

    /// Alice's segment files in one copy, oldest first.
    func segments(of label: String, in machine: String) throws -> [String] {
        let zones = copy(machine) + "/zones"
        var found = [String]()
        for zone in try FileManager.default.contentsOfDirectory(atPath: zones) where zone.hasPrefix("c-") {
            let generation = "\(zones)/\(zone)/1"
            for device in try FileManager.default.contentsOfDirectory(atPath: generation) where device.hasPrefix(label + "-") {
                found += try FileManager.default.contentsOfDirectory(atPath: "\(generation)/\(device)").filter { $0.hasSuffix(".seg") }.sorted()
                    .map { "\(generation)/\(device)/\($0)" }
            }
        }
        return found
    }
}

/// Every message each side sent and shows `synced` is on the other side, exactly once.
func expectDelivered(_ stores: [ConversationStore], count: Int, _ comment: Comment? = nil) throws {
    for store in stores {
        let conversation = try #require(try store.conversations().first?.id)
        let messages = try history(store, conversation)
        #expect(messages.count == count, comment)
        #expect(Set(messages.map(\.id)).count == messages.count, "no message twice")
    }
    let ids = try stores.map { store in Set(try history(store, try #require(try store.conversations().first?.id)).map(\.id)) }
    #expect(ids.dropFirst().allSatisfy { $0 == ids.first }, "both sides hold the same messages")
}

@Suite struct UnisonTests {
    @Test func twoWaySyncWithWritesInBetweenAndDuringAUnisonRun() async throws {
        let machines = try TwoMachines()
        let (alice, bob) = try await machines.aliceAndBob()
        for n in 0..<5 { _ = try await alice.send("a\(n)", to: "bob") }
        try await alice.sync()
        #expect(try await machines.unison() == 0)
        try await bob.sync()
        for n in 0..<5 { _ = try await bob.send("b\(n)", to: "alice") }
        try await bob.sync()
        // Unison runs while alice writes and syncs.
        let running = try ChildProcess("/usr/bin/env", machines.unisonArguments)
        for n in 5..<15 {
            _ = try await alice.send("a\(n)", to: "bob")
            try await alice.sync()
        }
        _ = await running.wait()
        #expect(try await machines.unison() == 0)
        try await alice.sync()
        try await bob.sync()
        try expectDelivered([alice, bob], count: 20)
        let shownSynced = try history(alice, try #require(try alice.conversations().first?.id)).filter { $0.syncState == .synced }
        #expect(shownSynced.count == 20)
    }

    /// A segment deleted in one copy before the other side read it (a cleanup): the deletion
    /// reaches the writer's copy, and the writer puts its records back.
    @Test func aSegmentDeletedInOneCopyIsPutBackByItsWriter() async throws {
        let machines = try TwoMachines()
        let (alice, bob, victim) = try await machines.threeFromAliceCopied()
        try FileManager.default.removeItem(atPath: victim)
        #expect(try await machines.unison() == 0)
        #expect(try machines.segments(of: "alice", in: "a").count == machines.segments(of: "alice", in: "b").count, "the deletion reached alice's copy")
        try await alice.sync()  // finds its segment gone, republishes it
        #expect(try await machines.unison() == 0)
        try await bob.sync()
        try expectDelivered([alice, bob], count: 3)
    }

    /// A byte flipped in one copy reaches the writer's copy: its sends go on, its records are put
    /// back, and the other side ends with every message and no open quarantine entry.
    @Test func aFlippedByteSyncedBackToItsWriter() async throws {
        let machines = try TwoMachines()
        let (alice, bob, victim) = try await machines.threeFromAliceCopied()
        var bytes = try Data(contentsOf: URL(fileURLWithPath: victim))
        bytes[bytes.count / 2] ^= 0x40
        try bytes.write(to: URL(fileURLWithPath: victim))
        // A later time, so Unison's quick check (size and whole-second time) sees the change.
        try FileManager.default.setAttributes([.modificationDate: Date().addingTimeInterval(5)], ofItemAtPath: victim)
        try await bob.sync()
        #expect(try bob.quarantine().count == 1, "the damaged file is reported once")
        #expect(try await machines.unison() == 0)  // the damaged copy goes back to alice's machine
        _ = try await alice.send("after", to: "bob")
        try await alice.sync()
        #expect(try await machines.unison() == 0)
        try await bob.sync()
        try await alice.sync()
        try expectDelivered([alice, bob], count: 4)
        #expect(try bob.quarantine().isEmpty, "the damaged file is gone; its records came back in a new one")
    }

    /// Alice's copy is an unmounted share (an empty mount point): her store refuses to sync it,
    /// writes nothing into it, and Unison's own check for an emptied replica stays armed.
    @Test func anUnmountedCopyIsRefusedAndNothingIsWritten() async throws {
        let machines = try TwoMachines()
        var alice: ConversationStore?, bob: ConversationStore
        (alice, bob) = try await machines.aliceAndBob()
        _ = try await alice?.send("before", to: "bob")
        try await alice?.sync()
        #expect(try await machines.unison() == 0)
        alice = nil  // the app quits; the share goes away; the app starts again
        try FileManager.default.moveItem(atPath: machines.copyA, toPath: machines.directory.path + "/a/away")
        try FileManager.default.createDirectory(atPath: machines.copyA, withIntermediateDirectories: false)
        let alice2 = try ConversationStore(directory: machines.directory.path + "/a/stores/alice", backend: .folder(machines.copyA, device: "alice"))
        _ = try await alice2.send("while unmounted", to: "bob")
        await #expect { try await alice2.sync() } throws: { error in
            (error as? ConversationError)?.backendError?.code == .folderUnavailable
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: machines.copyA).isEmpty, "nothing was written into the mount point")
        #expect(try await machines.unison() != 0, "Unison refuses to empty the other copy")
        #expect(try machines.segments(of: "alice", in: "b").count == 1, "the other copy is untouched")
        // Mounted again: the message goes out.
        try FileManager.default.removeItem(atPath: machines.copyA)
        try FileManager.default.moveItem(atPath: machines.directory.path + "/a/away", toPath: machines.copyA)
        try await alice2.sync()
        #expect(try await machines.unison() == 0)
        try await bob.sync()
        try expectDelivered([alice2, bob], count: 2)
    }

    /// Two machines with one device label are two devices.
    @Test func twoMachinesUsingOneDeviceLabel() async throws {
        let machines = try TwoMachines()
        let (alice, bob) = try await machines.aliceAndBob(labels: ("phone", "phone"))
        for n in 0..<3 {
            _ = try await alice.send("a\(n)", to: "bob")
            _ = try await bob.send("b\(n)", to: "alice")
            try await alice.sync()
            try await bob.sync()
            #expect(try await machines.unison() == 0, "\(machines.lastUnisonOutput)")
        }
        try await alice.sync()
        try await bob.sync()
        try expectDelivered([alice, bob], count: 6)
    }

    /// A segment exposed half-written under its final name (a tool that copies in place) is
    /// reported once and read when it is complete; the report is then resolved.
    @Test func aSegmentExposedHalfWrittenIsReadWhenComplete() async throws {
        let machines = try TwoMachines()
        let (alice, bob) = try await machines.aliceAndBob()
        _ = try await alice.send("first", to: "bob")
        try await alice.sync()
        #expect(try await machines.unison() == 0)
        try await bob.sync()
        let second = try await alice.send("second", to: "bob")
        try await alice.sync()
        // The segment that holds the message (the sync also wrote one of key shares).
        let source = try #require(try machines.segments(of: "alice", in: "a").last { path in
            (try? Data(contentsOf: URL(fileURLWithPath: path)))?.range(of: Data(second.id.name.utf8)) != nil
        })
        let whole = try Data(contentsOf: URL(fileURLWithPath: source))
        let target = machines.copyB + source.dropFirst(machines.copyA.count)
        try whole.prefix(whole.count / 2).write(to: URL(fileURLWithPath: String(target)))
        try await bob.sync()
        #expect(try bob.quarantine().count == 1)
        try whole.write(to: URL(fileURLWithPath: String(target)))
        try await bob.sync()
        #expect(try bob.quarantine().isEmpty, "the report is resolved once the file is whole")
        try expectDelivered([alice, bob], count: 2)
    }

    /// The share goes away while the app runs: the send stays pending (never shown synced),
    /// nothing is written into the mount point, and it goes out once the share is back.
    @Test func aShareUnmountedWhileTheAppRuns() async throws {
        let machines = try TwoMachines()
        let (alice, bob) = try await machines.aliceAndBob()
        try FileManager.default.moveItem(atPath: machines.copyA, toPath: machines.directory.path + "/a/away")
        try FileManager.default.createDirectory(atPath: machines.copyA, withIntermediateDirectories: false)
        let message = try await alice.send("while unmounted", to: "bob")
        await #expect { try await alice.sync() } throws: { error in
            (error as? ConversationError)?.backendError?.code == .folderUnavailable
        }
        let shown = try history(alice, message.id.conversation).first { $0.id == message.id }
        #expect(shown?.syncState == .pending, "never shown synced while the share is away")
        #expect(try FileManager.default.contentsOfDirectory(atPath: machines.copyA).isEmpty, "nothing was written into the mount point")
        try FileManager.default.removeItem(atPath: machines.copyA)
        try FileManager.default.moveItem(atPath: machines.directory.path + "/a/away", toPath: machines.copyA)
        try await alice.sync()
        #expect(try await machines.unison() == 0)
        try await bob.sync()
        try expectDelivered([alice, bob], count: 1)
    }

    /// A group of five across two copies kept in step by Unison (carol and alice on one machine,
    /// bob, dave and erin on the other): created, messages from all, alice promoted, erin added
    /// (who reads from then on), dave removed (his later message held back by every reader,
    /// shown failed to him), bob leaving — and every store ending with the same members and the
    /// same messages.
    @Test func aGroupOfFiveOverTwoCopies() async throws {
        let machines = try TwoMachines()
        let carol = try await machines.store("carol", on: "a"), alice = try await machines.store("alice", on: "a")
        #expect(try await machines.unison() == 0)
        let bob = try await machines.store("bob", on: "b"), dave = try await machines.store("dave", on: "b"), erin = try await machines.store("erin", on: "b")
        let all = [carol, alice, bob, dave, erin]
        func round() async throws {
            for store in all { try await store.sync() }
            #expect(try await machines.unison() == 0, "\(machines.lastUnisonOutput)")
            for store in all { try await store.sync() }
            #expect(try await machines.unison() == 0, "\(machines.lastUnisonOutput)")
            for store in all { try await store.sync() }
        }
        func view(_ store: ConversationStore, _ group: String) throws -> Set<String> {
            Set(try history(store, group).map { "\($0.speaker): \($0.content)" })
        }
        let trip = try await carol.createGroup(name: "Trip", members: ["alice", "bob", "dave"])
        try await carol.send("Who brings the tent?", toGroup: trip.id)
        try await round()
        try await alice.send("I do", toGroup: trip.id)
        try await bob.send("I bring food", toGroup: trip.id)
        try await dave.send("Count me in", toGroup: trip.id)
        try await carol.setRole(.admin, of: "alice", in: trip.id)
        try await round()
        try await alice.addMembers(["erin"], to: trip.id)
        try await round()
        try await erin.send("Hello all", toGroup: trip.id)
        try await round()
        // Carol removes dave; dave, on the other machine and not yet knowing, says something.
        try await carol.removeMember("dave", from: trip.id)
        try await carol.sync()
        try await dave.send("Am I still here?", toGroup: trip.id)
        try await bob.leave(trip.id)
        try await round()
        let said = ["carol: Who brings the tent?", "alice: I do", "bob: I bring food", "dave: Count me in", "erin: Hello all"]
        for store in all {
            #expect(try store.members(of: trip.id).map(\.speaker) == ["carol", "alice", "erin"])
            #expect(try store.members(of: trip.id).map(\.role) == [.creator, .admin, .member])
        }
        for store in [carol, alice] { #expect(try view(store, trip.id) == Set(said)) }
        #expect(try view(erin, trip.id) == ["erin: Hello all"])
        for store in [carol, alice, erin] {
            #expect(try store.quarantine().contains { $0.code == .notAMember && $0.zone == trip.id })
        }
        let late = try #require(try history(dave, trip.id).first { $0.content == "Am I still here?" })
        guard case .failed(let failure) = late.syncState else {
            Issue.record("dave's message after his removal is \(late.syncState)")
            return
        }
        #expect(failure.code == .notInGroup)
    }
}
