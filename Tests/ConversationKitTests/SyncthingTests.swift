import ConversationKit
import Foundation
import Testing
import TestSupport

/// Two machines, each with its own copy of the shared folder and its own stores, kept in step
/// continuously by two Syncthing instances (from Debian, installed by the setup script) on
/// loopback, configured as docs/RECORDS.md says: the folder's `.stignore` holds `(?d).*.tmp`, the
/// file-system watcher on with a short delay; no discovery, relays or NAT.
final class SyncthingPair: @unchecked Sendable {
    let directory: TemporaryDirectory
    private var instances: [ChildProcess] = []
    private var guiPorts: [Int] = []
    var copyA: String { directory.path + "/a/shared" }
    var copyB: String { directory.path + "/b/shared" }

    init() async throws {
        directory = try TemporaryDirectory("syncthing")
        var ids = [String]()
        for machine in ["a", "b"] {
            let copy = "\(directory.path)/\(machine)/shared"
            try FileManager.default.createDirectory(atPath: copy + "/.stfolder", withIntermediateDirectories: true)
            try Data("(?d).*.tmp\n".utf8).write(to: URL(fileURLWithPath: copy + "/.stignore"))
            let generate = try ChildProcess("/usr/bin/env", ["syncthing", "generate", "--home=\(directory.path)/\(machine)/home", "--no-default-folder"])
            #expect(await generate.wait() == 0, "\(generate.standardError)")
            let id = (generate.standardOutput + generate.standardError).split(separator: "\n")
                .compactMap { line in line.range(of: "Device ID: ").map { String(line[$0.upperBound...]).trimmingCharacters(in: .whitespaces) } }.first
            ids.append(try #require(id, "syncthing generate printed no device ID"))
        }
        let ports = try (0..<4).map { _ in try freeLoopbackPort() }
        guiPorts = Array(ports[2...])
        for (n, machine) in ["a", "b"].enumerated() {
            let config = Self.config(me: ids[n], peer: ids[1 - n], listen: ports[n], peerPort: ports[1 - n], gui: ports[2 + n],
                                     folder: "\(directory.path)/\(machine)/shared")
            try Data(config.utf8).write(to: URL(fileURLWithPath: "\(directory.path)/\(machine)/home/config.xml"))
            instances.append(try ChildProcess("/usr/bin/env", ["syncthing", "serve", "--home=\(directory.path)/\(machine)/home", "--no-browser", "--no-restart"]))
        }
    }

    deinit {
        for instance in instances where instance.isRunning { instance.kill(SIGKILL) }
    }

    /// Stops both instances and waits for them (Syncthing's monitor stops its child).
    func stop() async {
        for instance in instances where instance.isRunning {
            instance.kill(SIGTERM)
            _ = await instance.wait()
        }
    }

    /// Asks machine `machine` ("a" or "b") to scan its copy now, through Syncthing's REST API:
    /// the file-system watcher is a shortcut Syncthing may lose (a busy machine out of inotify
    /// instances), and the scan is what it would otherwise do only at the next rescan interval.
    /// - Returns: whether Syncthing answered 200.
    func scan(_ machine: String) async throws -> Bool {
        let port = guiPorts[machine == "a" ? 0 : 1]
        let answer = try await offPool {
            let connection = try RawConnection(port: port)
            connection.write("POST /rest/db/scan?folder=convkit HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: convkit-test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return connection.readToEnd()
        }
        return String(decoding: answer.prefix(12), as: UTF8.self) == "HTTP/1.1 200"
    }

    static func config(me: String, peer: String, listen: Int, peerPort: Int, gui: Int, folder: String) -> String {
        """
        <configuration version="36">
          <folder id="convkit" label="convkit" path="\(folder)" type="sendreceive" rescanIntervalS="3600" fsWatcherEnabled="true" fsWatcherDelayS="1" ignorePerms="true">
            <device id="\(me)"></device><device id="\(peer)"></device>
          </folder>
          <device id="\(me)" name="me"><address>dynamic</address></device>
          <device id="\(peer)" name="peer"><address>tcp://127.0.0.1:\(peerPort)</address></device>
          <gui enabled="true" tls="false"><address>127.0.0.1:\(gui)</address><apikey>convkit-test</apikey></gui>
          <options>
            <listenAddress>tcp://127.0.0.1:\(listen)</listenAddress>
            <globalAnnounceEnabled>false</globalAnnounceEnabled>
            <localAnnounceEnabled>false</localAnnounceEnabled>
            <relaysEnabled>false</relaysEnabled>
            <natEnabled>false</natEnabled>
            <startBrowser>false</startBrowser>
            <urAccepted>-1</urAccepted>
            <autoUpgradeIntervalH>0</autoUpgradeIntervalH>
            <crashReportingEnabled>false</crashReportingEnabled>
            <reconnectionIntervalS>1</reconnectionIntervalS>
          </options>
        </configuration>
        """
    }

    /// Waits until `condition` holds, syncing the stores each time round (Syncthing copies in
    /// the background). - Returns: whether it held within `seconds`.
    func eventually(seconds: Double = 60, syncing stores: [ConversationStore], _ condition: () throws -> Bool) async throws -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            for store in stores { _ = try? await store.sync() }
            if try condition() { return true }
            try await Task.sleep(for: .milliseconds(250))
        }
        return false
    }

    /// Alice on machine A creates the folder; once Syncthing has copied it, Bob joins on B.
    func aliceAndBob() async throws -> (ConversationStore, ConversationStore) {
        let alice = try ConversationStore(directory: directory.path + "/a/stores/alice", backend: .folder(copyA, device: "alice"))
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        try await alice.sync()
        #expect(try await eventually(syncing: []) { FileManager.default.fileExists(atPath: copyB + "/FORMAT") }, "Syncthing copied the folder")
        let bob = try ConversationStore(directory: directory.path + "/b/stores/bob", backend: .folder(copyB, device: "bob"))
        try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
        try await bob.sync()
        return (alice, bob)
    }
}

/// A port free on 127.0.0.1 right now (Syncthing's addresses cannot be port 0).
func freeLoopbackPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    try #require(bound, "cannot bind a loopback port")
    return Int(UInt16(bigEndian: address.sin_port))
}

@Suite struct SyncthingTests {
    func count(_ store: ConversationStore) throws -> Int {
        guard let conversation = try store.conversations().first?.id else { return 0 }
        return try history(store, conversation).count
    }

    /// Both sides write and sync while Syncthing runs: every message arrives exactly once on
    /// both sides, and nothing is shown synced that the other side did not get.
    @Test func twoWaySyncWhileSyncthingRuns() async throws {
        let pair = try await SyncthingPair()
        let (alice, bob) = try await pair.aliceAndBob()
        for n in 0..<10 {
            _ = try await alice.send("a\(n)", to: "bob")
            _ = try await bob.send("b\(n)", to: "alice")
            if n % 3 == 0 {
                try await alice.sync()
                try await bob.sync()
            }
        }
        #expect(try await pair.eventually(syncing: [alice, bob]) { try count(alice) == 20 && count(bob) == 20 })
        try expectDelivered([alice, bob], count: 20)
        let conversation = try #require(try alice.conversations().first?.id)
        #expect(try history(alice, conversation).allSatisfy { $0.syncState == .synced })
        await pair.stop()
    }

    /// A segment deleted in one copy: Syncthing deletes it in the writer's copy too, and the
    /// writer puts its records back in a new segment.
    @Test func aSegmentDeletedInOneCopyIsPutBackByItsWriter() async throws {
        let pair = try await SyncthingPair()
        let (alice, bob) = try await pair.aliceAndBob()
        for n in 0..<3 { _ = try await alice.send("a\(n)", to: "bob") }
        try await alice.sync()
        let segments = { (copy: String) throws -> [String] in
            try FileManager.default.subpathsOfDirectory(atPath: copy + "/zones").filter { $0.hasSuffix(".seg") && $0.contains("/alice-") && $0.hasPrefix("c-") }.sorted()
        }
        let mine = try segments(pair.copyA)
        #expect(try await pair.eventually(syncing: []) { try segments(pair.copyB) == mine }, "Syncthing copied alice's segments")
        let victim = try #require(mine.last)
        try FileManager.default.removeItem(atPath: pair.copyB + "/zones/" + victim)
        #expect(try await pair.scan("b"), "Syncthing on machine B scans on request")
        #expect(try await pair.eventually(syncing: []) { !FileManager.default.fileExists(atPath: pair.copyA + "/zones/" + victim) }, "the deletion reached alice's copy")
        #expect(try await pair.eventually(syncing: [alice, bob]) { try count(bob) == 3 })
        try expectDelivered([alice, bob], count: 3)
        #expect(try bob.quarantine().isEmpty)
        await pair.stop()
    }
}
