import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// `convkitd replicate` as a process: two `convkitd serve` replicating both ways converge (same
/// records, same signatures) with no shared folder; a pass with nothing new sends nothing; a
/// server's zones copied into a folder read back the same.
@Suite struct ConvkitdReplicateTests {
    func serve(_ data: String, replicator: String) async throws -> (ChildProcess, URL) {
        let (child, port) = try await startServe(["--data", data, "--replicator", replicator])
        return (child, try #require(URL(string: "http://127.0.0.1:\(port)")))
    }

    func replicate(_ arguments: [String]) async throws -> String {
        let child = try ChildProcess(try builtProduct("convkitd"), ["replicate"] + arguments)
        #expect(await child.wait() == 0, "\(arguments): \(child.standardError)")
        return child.standardError
    }

    /// Every record of every zone, as (zone/name, signature).
    func contents(_ backend: any RecordZoneBackend) async throws -> Set<String> {
        var all = Set<String>()
        for zone in try await backend.zones() {
            var token: ChangeToken? = nil
            repeat {
                let page = try await backend.fetchChanges(in: zone, since: token, limit: 400)
                for record in page.records { all.insert("\(record.id) \(record.signature.hexString)") }
                token = page.token
                if !page.moreComing { break }
            } while true
        }
        return all
    }

    @Test func twoServersReplicatingBothWaysConverge() async throws {
        let dir = try TemporaryDirectory("replicate")
        let key = SigningKey.generate()
        try KeyFile.write(key, to: dir.path + "/replicator.key")
        let replicator = "_peer=\(key.publicKey.hexString)"
        let (serverA, a) = try await serve(dir.path + "/a", replicator: replicator)
        let (serverB, b) = try await serve(dir.path + "/b", replicator: replicator)
        let alice = try ConversationStore(directory: dir.path + "/alice", backend: .server(a))
        let bob = try ConversationStore(directory: dir.path + "/bob", backend: .server(b))
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
        let fromAlice = try await alice.send("hello from server A", to: "bob")
        let fromBob = try await bob.send("hello from server B", to: "alice")
        // A group too: its zone, changes and messages replicate like any other (readers decide them).
        let group = try await alice.createGroup(name: "Both", members: ["bob"])
        let inGroup = try await alice.send("hello group", toGroup: group.id)
        try await alice.sync()
        try await bob.sync()

        let common = ["--key", dir.path + "/replicator.key", "--identity", "_peer"]
        // Twice round: the first brings each side the other's device key (each then shares its
        // sender keys, in the same sync), the second brings the shares.
        for _ in 0..<2 {
            for _ in 0..<2 {
                _ = try await replicate(["--from", a.absoluteString, "--to", b.absoluteString, "--state", dir.path + "/a-to-b.json"] + common)
                _ = try await replicate(["--from", b.absoluteString, "--to", a.absoluteString, "--state", dir.path + "/b-to-a.json"] + common)
            }
            try await alice.sync()
            try await bob.sync()
        }
        #expect(try alice.message(fromBob.id)?.content == "hello from server B")
        #expect(try bob.message(fromAlice.id)?.content == "hello from server A")
        #expect(try bob.message(inGroup.id)?.content == "hello group" && (try bob.members(of: group.id).map(\.speaker)) == ["alice", "bob"])
        let onA = try await contents(HTTPBackend(url: a, identity: "_peer", key: key, policy: ConversationStore.recordPolicy()))
        let onB = try await contents(HTTPBackend(url: b, identity: "_peer", key: key, policy: ConversationStore.recordPolicy()))
        // Two profiles (each in its own zone and the directory), two members, two messages, the
        // group's creation and message; two device keys, and the key shares of the three
        // epochs (alice's and bob's pair, alice's group), each to its sender and the other; the
        // Delivery records of the devices that received a message (both in the pair, bob in the group).
        #expect(onA == onB && onA.count == 21, "same records, same signatures: \(onA.count) \(onA.symmetricDifference(onB))")

        // Resumed from its checkpoints: nothing new, nothing sent.
        let again = try await replicate(["--from", a.absoluteString, "--to", b.absoluteString, "--state", dir.path + "/a-to-b.json"] + common)
        #expect(again.contains("sent 0 records"), "\(again)")

        // Into a folder zone, and read back the same.
        _ = try await replicate(["--from", a.absoluteString, "--to", dir.path + "/folder", "--state", dir.path + "/a-to-folder.json"] + common)
        #expect(try await contents(FileSystemBackend(root: dir.path + "/folder", device: nil, policy: ConversationStore.recordPolicy())) == onA)

        // Continuously: a new message on A reaches bob's server while the replicator runs; SIGTERM stops it.
        let running = try ChildProcess(try builtProduct("convkitd"), ["replicate", "--from", a.absoluteString, "--to", b.absoluteString,
                                                                      "--state", dir.path + "/a-to-b.json", "--continuous", "--interval", "1"] + common)
        let later = try await alice.send("while replicating", to: "bob")
        try await alice.sync()
        var arrived = false
        for _ in 0..<50 where !arrived {
            try await bob.sync()
            arrived = try bob.message(later.id) != nil
            if !arrived { try await Task.sleep(for: .milliseconds(200)) }
        }
        #expect(arrived, "continuous replication carried it: \(running.standardError)")
        running.kill(SIGTERM)
        #expect(await running.wait() == 0)

        // A replicator copies; it cannot forge a record, nor delete a zone.
        let peer = HTTPBackend(url: b, identity: "_peer", key: key, policy: ConversationStore.recordPolicy())
        let conversation = try #require(try await peer.zones().first { $0.rawValue.hasPrefix("c-") })
        var forged = Record(id: try RecordID(zone: conversation, name: "m.\(OwnershipRule.identityHash("bob")).ffffffffffffffff-forged"),
                            type: "Message", fields: ["speaker": .string("bob"), "listener": .string("alice"), "content": .string("forged"), "spokenAt": .date(Date())])
        try forged.sign(with: key, clock: HybridLogicalClock().now())
        let saved = try await peer.save([forged])
        #expect(throws: RecordZoneError.self, "a record signed by the replicator's key for bob is refused") { try saved[0].get() }
        await #expect(throws: RecordZoneError.self, "a replicator deletes nothing") { try await peer.deleteZone(conversation) }
        #expect(try await peer.zones().contains(conversation))

        // Anyone else is refused what the replicator may do; the replicator's name with another key too.
        let stranger = HTTPBackend(url: a, identity: "_peer", key: SigningKey.generate(), policy: ConversationStore.recordPolicy())
        await #expect(throws: RecordZoneError.self) { try await stranger.zones() }
        let usage = try ChildProcess(try builtProduct("convkitd"), ["replicate", "--from", a.absoluteString])
        #expect(await usage.wait() == 64)
        for server in [serverA, serverB] {
            server.kill(SIGTERM)
            _ = await server.wait()
        }
    }
}

extension ConvkitdReplicateTests {
    /// Runs `convkitd replicate` in `directory` (so bare file names are relative to it).
    func replicate(in directory: String, _ arguments: [String]) async throws -> (status: Int32, err: String) {
        let command = "cd '\(directory)' && exec '\(try builtProduct("convkitd"))' replicate " + arguments.map { "'\($0)'" }.joined(separator: " ")
        let child = try ChildProcess("/bin/sh", ["-c", command])
        let status = await child.wait()
        return (status, child.standardError)
    }

    /// Records refused at the source are named, counted in the summary and give exit status 3
    /// (a pass with nothing refused exits 0); `--state` and `--key` take bare file names.
    @Test func refusedRecordsGiveTheirOwnExitStatusAndBareFileNamesWork() async throws {
        let dir = try TemporaryDirectory("replicate-refused")
        let alice = try ConversationStore(directory: dir.path + "/alice", backend: .folder(dir.path + "/a", device: "laptop"))
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        try await alice.sync()
        // A forged profile of alice's, written into the folder by another device.
        let mallory = try FileSystemBackend(root: dir.path + "/a", device: "mallory", policy: RecordPolicy())
        let zone = try ZoneName("s-" + OwnershipRule.identityHash("alice"))
        var forged = Record(id: try RecordID(zone: zone, name: "alice"), type: "Speaker", fields: ["name": .string("Mallory"), "tags": .list([])])
        try forged.sign(with: Keys.mallory, clock: HybridLogicalClock().now())
        _ = try await mallory.save([forged])

        let first = try await replicate(in: dir.path, ["--from", "./a", "--to", "./b", "--state", "st"])
        #expect(first.status == 3, "\(first.err)")
        // Each refusal named (the fresh reader holds both claims of alice back as a conflict), and
        // the summary counts exactly those.
        let named = first.err.split(separator: "\n").filter { $0.contains("not copied (refused at the source)") }.count
        #expect(named > 0 && first.err.contains("\(named) refused at the source, 0 at the destination"), "\(first.err)")
        #expect(FileManager.default.fileExists(atPath: dir.path + "/st"))
        let again = try await replicate(in: dir.path, ["--from", "./a", "--to", "./b", "--state", "st"])
        #expect(again.status == 0, "\(again.err)")

        // A bare --key is created in the working directory (the server then refuses an unknown
        // replicator: a failure, exit 1, but not an I/O error about a directory named "").
        let (server, port) = try await startServe(["--data", dir.path + "/server"])
        defer { server.kill(SIGTERM) }
        let keyed = try await replicate(in: dir.path, ["--from", "http://127.0.0.1:\(port)", "--to", "./c", "--state", "st2", "--key", "rk"])
        #expect(FileManager.default.fileExists(atPath: dir.path + "/rk"), "\(keyed.err)")
        #expect(!keyed.err.contains("cannot open directory"), "\(keyed.err)")
    }
}
