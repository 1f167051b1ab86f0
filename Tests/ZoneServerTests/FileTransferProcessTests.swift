import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// A 200 MiB file through the real binaries (`convkit` against `convkitd serve`, behind a proxy
/// that cuts the link): up and down with each process's resident memory growing by less than
/// 32 MiB over the same command moving a 1 KiB file, resumed after a cut at half way, and a
/// byte changed on the server caught. Each `convkit` runs under GNU time, which reports its
/// peak resident size (`wait4`'s `ru_maxrss`: the tests' own process would count its own size,
/// as the spawned child's high-water mark starts from its parent's memory).
@Suite(.enabled(if: ProcessInfo.processInfo.environment["CONVKIT_TIMING_TESTS"] == "1", "runs alone: CONVKIT_TIMING_TESTS=1 (scripts/test.sh)"))
struct FileTransferProcessTests {
    struct Run {
        let status: Int32
        let out: String
        let err: String
        let peakKiB: Int
    }

    static func convkit(_ arguments: [String]) async throws -> Run {
        let child = try ChildProcess("/usr/bin/time", ["-f", "peak-rss-kib %M", try builtProduct("convkit")] + arguments)
        let status = await child.wait()
        // GNU time's line is the last of stderr.
        var lines = child.standardError.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        while lines.last == "" { lines.removeLast() }
        let peak = lines.last.flatMap { $0.hasPrefix("peak-rss-kib ") ? Int($0.dropFirst(13)) : nil }
        if peak != nil { lines.removeLast() }
        // GNU time reports a non-zero exit on a line of its own too.
        if status != 0, lines.last?.hasPrefix("Command exited with non-zero status") == true { lines.removeLast() }
        return Run(status: status, out: child.standardOutput, err: lines.joined(separator: "\n"), peakKiB: try #require(peak, "GNU time reported no peak: \(child.standardError)"))
    }

    /// `size` random bytes written a mebibyte at a time.
    static func randomFile(_ path: String, size: Int) throws {
        #expect(FileManager.default.createFile(atPath: path, contents: nil))
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        var left = size
        while left > 0 {
            let piece = min(left, 1 << 20)
            try handle.write(contentsOf: Sodium.randomBytes(piece))
            left -= piece
        }
    }

    @Test func twoHundredMebibytesGoUpAndDownInBoundedMemoryAndResumeAfterACut() async throws {
        let dir = try TemporaryDirectory("convkit-files")
        let (server, port) = try await startServe(["--data", dir.path + "/server"])
        defer { server.kill(SIGTERM) }
        let proxy = try FaultProxy(tcpPort: port)
        let url = "http://127.0.0.1:\(proxy.port)"
        let alice = ["--store", dir.path + "/alice"], bob = ["--store", dir.path + "/bob"]
        func ok(_ arguments: [String]) async throws -> Run {
            let run = try await Self.convkit(arguments)
            #expect(run.status == 0, "\(arguments): \(run.err)")
            return run
        }
        _ = try await ok(["init", "--id", "alice", "--name", "Alice", "--server", url] + alice)
        _ = try await ok(["init", "--id", "bob", "--name", "Bob", "--server", url] + bob)
        _ = try await ok(["sync"] + bob)
        _ = try await ok(["sync"] + alice)

        // The yardstick: the same commands moving 1 KiB.
        let small = dir.path + "/small.bin", big = dir.path + "/big.bin"
        try Self.randomFile(small, size: 1024)
        let size = 200 << 20
        try Self.randomFile(big, size: size)
        let smallSent = try await ok(["send", "bob", "--attach", small, "--json"] + alice)
        let smallSync = try await ok(["sync"] + alice)
        _ = try await ok(["sync"] + bob)
        let smallID = try #require((try JSONSerialization.jsonObject(with: Data(smallSent.out.utf8)) as? [String: Any])?["id"] as? String)
        let smallDownload = try await ok(["download", smallID] + bob)
        let limitKiB = 32 << 10
        func bounded(_ run: Run, over baseline: Run, _ what: String) {
            #expect(run.peakKiB - baseline.peakKiB < limitKiB,
                    "\(what): \(run.peakKiB / 1024) MiB resident at its peak, \(baseline.peakKiB / 1024) MiB for 1 KiB")
        }

        // Sent: copied into the store and encrypted chunk by chunk.
        let sent = try await ok(["send", "bob", "the whole archive", "--attach", big, "--json"] + alice)
        bounded(sent, over: smallSent, "send --attach")
        let id = try #require((try JSONSerialization.jsonObject(with: Data(sent.out.utf8)) as? [String: Any])?["id"] as? String)

        // The upload, cut at half way: the sync fails, the message is still pending.
        proxy.cut(after: size / 2, sent: true)
        let cut = try await Self.convkit(["sync"] + alice)
        #expect(cut.status == 1, "the cut sync: \(cut.err)")
        bounded(cut, over: smallSync, "sync cut at half way")
        proxy.restore()
        try await Task.sleep(for: .seconds(1))   // past the retry's backoff
        let before = proxy.forwarded.sent
        let resumed = try await ok(["sync"] + alice)
        bounded(resumed, over: smallSync, "sync resumed")
        let again = proxy.forwarded.sent - before
        // What was left and the chunks in flight at the cut (1 MiB each), not the whole file.
        #expect(again < size / 2 + (ConversationStore.fileTransfersInFlight.upload + 1) << 20, "the upload went on from the cut: \(again) bytes sent again of \(size)")
        #expect(try await ok(["messages", "bob"] + alice).out.contains("the whole archive  [file: big.bin, 200.0 MiB]"))

        // The download, cut at half way, then resumed.
        _ = try await ok(["sync"] + bob)
        proxy.cut(after: size / 2, sent: false)
        let cutDownload = try await Self.convkit(["download", id] + bob)
        #expect(cutDownload.status == 1 && cutDownload.err.contains("asking again resumes"), "\(cutDownload.err)")
        proxy.restore()
        let received = proxy.forwarded.received
        let out = dir.path + "/received.bin"
        let downloaded = try await ok(["download", id, "--out", out, "--json"] + bob)
        bounded(downloaded, over: smallDownload, "download resumed")
        let fetched = proxy.forwarded.received - received
        #expect(fetched < size / 2 + (ConversationStore.fileTransfersInFlight.download + 1) << 20, "the download went on from the cut: \(fetched) bytes received again of \(size)")
        #expect(try ChildProcess.runToEnd("/usr/bin/cmp", [big, out]) == 0, "the file received is the file sent")
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(downloaded.out.utf8)) as? [String: Any])
        #expect(answer["size"] as? Int == size && answer["name"] as? String == "big.bin")

        // A byte changed in one chunk on the server: a fresh download fails and keeps nothing.
        let cached = try #require(answer["path"] as? String)
        #expect(cached == out)
        let assets = dir.path + "/server/assets"
        let chunk = try #require((FileManager.default.enumerator(atPath: assets)?.compactMap { $0 as? String } ?? []).first { name in
            ((try? FileManager.default.attributesOfItem(atPath: assets + "/" + name)[.size]) as? Int) == (1 << 20) + 16   // one of big.bin's chunks
        })
        let handle = try FileHandle(forUpdating: URL(fileURLWithPath: assets + "/" + chunk))
        try handle.seek(toOffset: 1000)
        let byte = try #require(try handle.read(upToCount: 1)?.first)
        try handle.seek(toOffset: 1000)
        try handle.write(contentsOf: Data([byte ^ 0x40]))
        try handle.close()
        let files = dir.path + "/bob/Files"
        for case let file as String in FileManager.default.enumerator(atPath: files)?.allObjects ?? [] where file.hasSuffix("big.bin") {
            try FileManager.default.removeItem(atPath: files + "/" + file)
        }
        let corrupt = try await Self.convkit(["download", id] + bob)
        #expect(corrupt.status == 1 && corrupt.err.contains("does not match its hash"), "\(corrupt.err)")
        let left = (FileManager.default.enumerator(atPath: files)?.allObjects as? [String] ?? []).filter { $0.hasSuffix("big.bin") || $0.hasSuffix(".partial") }
        #expect(left.isEmpty, "\(left)")
    }
}
