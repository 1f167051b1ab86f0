@testable import ChatSchema
import ConversationKit
import Foundation
import ImageKit
import RecordZone
import SQLiteKit
import Synchronization
import Testing
import TestSupport

/// Files sent with messages (docs/PROTOCOL.md §3.4): up and down over every backend, encrypted
/// (no backend holds a byte of the plaintext), never shown to anyone before they can fetch it,
/// caught when a byte changes, resumed after a cut, and kept within the cache's budget.
@Suite struct FileTests {
    /// Random bytes (no run of them compresses, so none of them can hide in a backend's files).
    static func randomFile(_ size: Int, in directory: String, name: String) throws -> URL {
        let url = URL(fileURLWithPath: directory + "/" + name)
        try Sodium.randomBytes(size).write(to: url)
        return url
    }

    @Test(arguments: ChatBackend.allCases)
    func aFileGoesUpAndDownEncrypted(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let size = 2 * (1 << 20) + 12345   // three chunks, the last one short
        let url = try Self.randomFile(size, in: fixture.directory.path, name: "report 2026.pdf")
        let original = try Data(contentsOf: url)
        let sent = try await alice.sendFile(url, to: "bob", caption: "the report")
        #expect(sent.content == "the report")
        #expect(sent.attachment == Attachment(name: "report 2026.pdf", mediaType: "application/pdf", size: Int64(size)))
        #expect(sent.syncState == .pending)
        // The sender's own copy is in its store: the original may go.
        try FileManager.default.removeItem(at: url)
        #expect(try alice.fileURL(of: sent.id).map { try Data(contentsOf: $0) } == original)

        try await alice.sync()
        #expect(try alice.message(sent.id)?.syncState == .synced)
        try await bob.sync()
        let received = try #require(try bob.message(sent.id))
        #expect(received.attachment == sent.attachment)
        #expect(try bob.fileURL(of: sent.id) == nil, "on demand: not downloaded by the sync")
        #expect(try bob.thumbnail(of: sent.id) == nil, "not an image")
        let written = Mutex<[Int64]>([])
        let downloaded = try await bob.downloadFile(of: sent.id) { done, total in
            #expect(total == Int64(size))
            written.withLock { $0.append(done) }
        }
        #expect(downloaded.lastPathComponent == "report 2026.pdf")
        #expect(try Data(contentsOf: downloaded) == original)
        #expect(written.withLock { $0 } == [1 << 20, 2 << 20, Int64(size)])
        #expect(try bob.fileURL(of: sent.id) == downloaded)

        // Encrypted: no backend keeps a run of the plaintext.
        if let kept = try await fixture.keptBytes() {
            for probe in [original.prefix(32), original.subdata(in: (1 << 20)..<((1 << 20) + 32)), original.suffix(32)] {
                #expect(!kept.contains { $0.bytes.range(of: probe) != nil }, "a run of the file's bytes is on the backend in the clear")
            }
        }
        // A message with no file has none to give.
        let plain = try await alice.send("no file here", to: "bob")
        #expect(await code { _ = try alice.fileURL(of: plain.id) } == .noFile)
    }

    /// An image carries a thumbnail in its message: shown before the file is downloaded.
    @Test func anImageCarriesAThumbnailInItsMessageAndAGroupGetsItToo() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        let group = try await alice.createGroup(name: "Photos", members: ["bob", "carol"])
        try await syncAll([alice, bob, carol])
        let url = URL(fileURLWithPath: fixture.directory.path + "/sunset.png")
        try ImageFixtures.png(ImageFixtures.topBottom(width: 1200, height: 800, top: (250, 120, 30), bottom: (20, 30, 90)), .rgb8).write(to: url)
        let sent = try await alice.sendFile(url, toGroup: group.id)
        #expect(sent.content == "sunset.png", "no caption: the file's name")
        #expect(sent.attachment?.mediaType == "image/png")
        try await syncAll([alice, bob, carol])
        for reader in [bob, carol] {
            let thumbnail = try #require(try reader.thumbnail(of: sent.id))
            #expect(thumbnail.imageSize == PixelSize(width: 1200, height: 800))
            let decoded = try Images.decode(thumbnail.jpeg)
            #expect(decoded.width == 320 && decoded.height == 213)
            let top = decoded.pixel(160, 10), bottom = decoded.pixel(160, 200)
            #expect(top.r > 200 && bottom.b > 60, "the thumbnail is the image: \(top), \(bottom)")
            #expect(try Data(contentsOf: try await reader.downloadFile(of: sent.id)) == (try Data(contentsOf: url)))
        }
    }

    /// A byte changed in a stored chunk is caught: the download fails with `fileCorrupt` and
    /// keeps nothing as the file.
    @Test(arguments: [ChatBackend.filesystem, .http])
    func aFlippedByteInAStoredChunkIsCaught(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let url = try Self.randomFile(3 << 20, in: fixture.directory.path, name: "data.bin")
        let sent = try await alice.sendFile(url, to: "bob")
        try await syncAll([alice, bob])
        // One of the three chunks on the backend.
        let assets = kind == .filesystem ? fixture.folder + "/assets" : fixture.directory.path + "/server/assets"
        let files = (FileManager.default.enumerator(atPath: assets)?.compactMap { $0 as? String } ?? []).filter { $0.count > 60 }.map { assets + "/" + $0 }
        #expect(files.count == 3)
        let victim = try #require(files.first)
        var bytes = try Data(contentsOf: URL(fileURLWithPath: victim))
        bytes[bytes.count / 2] ^= 0x01
        try bytes.write(to: URL(fileURLWithPath: victim))
        #expect(await code { _ = try await bob.downloadFile(of: sent.id) } == .fileCorrupt)
        #expect(try bob.fileURL(of: sent.id) == nil)
        let kept = (FileManager.default.enumerator(atPath: fixture.storePath("bob") + "/Files")?.compactMap { $0 as? String } ?? []).filter { !$0.hasSuffix("/") }
        #expect(!kept.contains { $0.hasSuffix("data.bin") || $0.hasSuffix(".partial") }, "\(kept)")
    }

    /// A connection cut halfway through an upload, then halfway through a download: each goes on
    /// from where it stopped (a real server behind a proxy that cuts the link), and the message
    /// is not shown to its listener before its file can be fetched.
    @Test func anUploadAndADownloadCutHalfwayResume() async throws {
        let fixture = try await ChatFixture(.http)
        let server = try #require(fixture.zoneServer)
        let proxy = try FaultProxy(tcpPort: server.port)
        let viaProxy = BackendFactory.server(try #require(URL(string: "http://127.0.0.1:\(proxy.port)")))
        var configuration = StoreConfiguration()
        configuration.retryBaseDelay = 0.001   // the next sync retries at once
        let alice = try ConversationStore(directory: fixture.storePath("alice"), backend: viaProxy, configuration: configuration)
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        let bob = try ConversationStore(directory: fixture.storePath("bob"), backend: viaProxy)
        try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
        try await syncAll([alice, bob])
        let size = 16 << 20
        let url = try Self.randomFile(size, in: fixture.directory.path, name: "video.mp4")
        let sent = try await alice.sendFile(url, to: "bob")

        proxy.cut(after: size / 2, sent: true)
        #expect(await code { try await alice.sync() } == .backend)
        #expect(try alice.message(sent.id)?.syncState == .pending)
        proxy.restore()
        try await bob.sync()
        #expect(try bob.message(sent.id) == nil, "a message is never out before its file")
        let before = proxy.forwarded.sent
        try await alice.sync()
        #expect(try alice.message(sent.id)?.syncState == .synced)
        let resent = proxy.forwarded.sent - before
        // What was left, and the chunks the cut interrupted (those in flight, 1 MiB each), with
        // the requests' headers: not the whole file again.
        let overhead = 64 << 10
        let upBound = size / 2 + ConversationStore.fileTransfersInFlight.upload * (1 << 20) + overhead
        #expect(resent < upBound, "the upload went on from the cut: \(resent) bytes sent again of \(size)")

        try await bob.sync()
        proxy.cut(after: size / 2, sent: false)
        #expect(await code { _ = try await bob.downloadFile(of: sent.id) } == .backend)
        #expect(try bob.fileURL(of: sent.id) == nil)
        proxy.restore()
        let received = proxy.forwarded.received
        let file = try await bob.downloadFile(of: sent.id)
        #expect(try Data(contentsOf: file) == (try Data(contentsOf: url)))
        let again = proxy.forwarded.received - received
        let downBound = size / 2 + ConversationStore.fileTransfersInFlight.download * (1 << 20) + overhead
        #expect(again < downBound, "the download went on from the cut: \(again) bytes received again of \(size)")
    }

    /// A store copied to a second machine while its file's upload stood cut halfway: either
    /// copy finishes it, the other pushes the same chunks and the same version (nothing new),
    /// and the listener gets one message whose file is the one sent.
    @Test func aStoreCopiedMidUploadSendsItsFileOnceFromEitherCopy() async throws {
        let fixture = try await ChatFixture(.http)
        let server = try #require(fixture.zoneServer)
        let proxy = try FaultProxy(tcpPort: server.port)
        let direct = BackendFactory.server(try #require(fixture.serverURL))
        let viaProxy = BackendFactory.server(try #require(URL(string: "http://127.0.0.1:\(proxy.port)")))
        var configuration = StoreConfiguration()
        configuration.retryBaseDelay = 0.001
        var alice = try ConversationStore(directory: fixture.storePath("alice"), backend: viaProxy, configuration: configuration)
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        let bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let size = 6 << 20
        let url = try Self.randomFile(size, in: fixture.directory.path, name: "talk.pdf")
        let sent = try await alice.sendFile(url, to: "bob")
        proxy.cut(after: size / 2, sent: true)
        #expect(await code { try await alice.sync() } == .backend)
        proxy.restore()

        // The move: the store as it stands (closed first, as a copy by hand would find it).
        alice.close()
        try FileManager.default.copyItem(atPath: fixture.storePath("alice"), toPath: fixture.storePath("alice-copy"))
        alice = try ConversationStore(directory: fixture.storePath("alice"), backend: viaProxy, configuration: configuration)
        let copy = try ConversationStore(directory: fixture.storePath("alice-copy"), backend: direct, configuration: configuration)
        try await copy.sync()
        #expect(try copy.message(sent.id)?.syncState == .synced)
        try await alice.sync()
        #expect(try alice.message(sent.id)?.syncState == .synced)
        try await bob.sync()
        #expect(try history(bob, sent.id.conversation).filter { $0.attachment != nil }.map(\.id) == [sent.id])
        let file = try await bob.downloadFile(of: sent.id)
        #expect(try Data(contentsOf: file) == (try Data(contentsOf: url)))
    }

    /// A file gone from the sender's cache before it was uploaded: its message fails
    /// (`fileMissing`) rather than go out with a file nobody could fetch.
    @Test func aMessageWhoseFileLeftTheCacheBeforeItsUploadFails() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let sent = try await alice.sendFile(try Self.randomFile(1000, in: fixture.directory.path, name: "notes.txt"), to: "bob")
        try FileManager.default.removeItem(at: try #require(try alice.fileURL(of: sent.id)))
        try await syncAll([alice, bob])
        guard case .failed(let failure)? = try alice.message(sent.id)?.syncState else {
            Issue.record("the message should have failed: \(String(describing: try alice.message(sent.id)?.syncState))")
            return
        }
        #expect(failure.code == .fileMissing)
        #expect(try bob.message(sent.id) == nil)
    }

    /// The cache holds at most its budget: the least recently used file goes first, and a
    /// file the sync downloads by the policy is there without asking.
    @Test func theCacheKeepsItsBudgetAndTheSyncDownloadsByPolicy() async throws {
        let fixture = try await ChatFixture(.memory)
        var configuration = StoreConfiguration()
        configuration.fileCacheBytes = 3 << 20
        configuration.fileDownload = .duringSync(maximumBytes: 1 << 20)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob", configuration: configuration)
        try await syncAll([alice, bob])
        let small = try await alice.sendFile(try Self.randomFile(500_000, in: fixture.directory.path, name: "small.bin"), to: "bob")
        let first = try await alice.sendFile(try Self.randomFile(1_500_000, in: fixture.directory.path, name: "first.bin"), to: "bob")
        let second = try await alice.sendFile(try Self.randomFile(1_500_000, in: fixture.directory.path, name: "second.bin"), to: "bob")
        try await alice.sync()
        let report = try await bob.sync()
        #expect(report.filesDownloaded == 1)
        #expect(try bob.fileURL(of: small.id) != nil, "under the policy's size: downloaded by the sync")
        #expect(try bob.fileURL(of: first.id) == nil && bob.fileURL(of: second.id) == nil)
        try await bob.downloadFile(of: first.id)
        try await bob.downloadFile(of: second.id)
        // 0.5 + 1.5 + 1.5 MB is over 3 MiB: the least recently used (small) went.
        #expect(try bob.fileURL(of: small.id) == nil)
        #expect(try bob.fileURL(of: first.id) != nil && bob.fileURL(of: second.id) != nil)
        // Evicted is not lost: it downloads again.
        #expect(try Data(contentsOf: try await bob.downloadFile(of: small.id)).count == 500_000)
    }

    /// A file damaged on the backend does not keep the sync from downloading the others, and is
    /// not fetched again by every sync (an explicit download still tries, and fails).
    @Test func aDamagedFileDoesNotHoldUpTheSyncsDownloads() async throws {
        let fixture = try await ChatFixture(.filesystem)
        var configuration = StoreConfiguration()
        configuration.fileDownload = .duringSync(maximumBytes: 1 << 20)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob", configuration: configuration)
        try await syncAll([alice, bob])
        let fine = try await alice.sendFile(try Self.randomFile(1000, in: fixture.directory.path, name: "fine.bin"), to: "bob")
        let damaged = try await alice.sendFile(try Self.randomFile(2000, in: fixture.directory.path, name: "damaged.bin"), to: "bob")
        try await alice.sync()
        // The newer one's only chunk (2,016 bytes) changed on the folder.
        let assets = fixture.folder + "/assets"
        let chunk = try #require((FileManager.default.enumerator(atPath: assets)?.compactMap { $0 as? String } ?? []).first { name in
            ((try? FileManager.default.attributesOfItem(atPath: assets + "/" + name)[.size]) as? Int) == 2016
        })
        var bytes = try Data(contentsOf: URL(fileURLWithPath: assets + "/" + chunk))
        bytes[10] ^= 0x01
        try bytes.write(to: URL(fileURLWithPath: assets + "/" + chunk))
        #expect(try await bob.sync().filesDownloaded == 1)
        #expect(try bob.fileURL(of: fine.id) != nil && bob.fileURL(of: damaged.id) == nil)
        let db = try Database(path: fixture.storePath("bob") + "/store.sqlite", readOnly: true)
        let problem = try db.first("SELECT problem FROM attachments WHERE name = ?", [damaged.id.name]) { $0.optionalText(0) } ?? nil
        #expect(problem?.contains("does not match its hash") == true, "\(String(describing: problem))")
        #expect(try await bob.sync().filesDownloaded == 0)
        #expect(await code { _ = try await bob.downloadFile(of: damaged.id) } == .fileCorrupt)
    }

    /// A file message's edit keeps its file; its deletion takes the file out of every cache.
    @Test func anEditKeepsTheFileAndADeletionTakesItAway() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        try await syncAll([alice, bob])
        let url = try Self.randomFile(1 << 20, in: fixture.directory.path, name: "plan.bin")
        let sent = try await alice.sendFile(url, to: "bob", caption: "the plan")
        try await syncAll([alice, bob])
        let file = try await bob.downloadFile(of: sent.id)
        _ = try await alice.edit(sent.id, content: "the plan, final")
        try await syncAll([alice, bob])
        #expect(try bob.message(sent.id)?.content == "the plan, final")
        #expect(try bob.message(sent.id)?.attachment == sent.attachment)
        #expect(try bob.fileURL(of: sent.id) == file, "the same file: not downloaded again")
        let aliceCopy = try #require(try alice.fileURL(of: sent.id))
        try await alice.delete(sent.id)
        try await syncAll([alice, bob])
        #expect(!FileManager.default.fileExists(atPath: aliceCopy.path))
        #expect(!FileManager.default.fileExists(atPath: file.path))
        #expect(try bob.messages(in: sent.id.conversation, includeDeleted: true).messages.first { $0.id == sent.id }?.attachment == nil)
    }

    /// What cannot be sent is refused with a typed error, and nothing is committed.
    @Test func filesThatCannotBeSentAreRefused() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        let directory = fixture.directory.path
        let huge = URL(fileURLWithPath: directory + "/huge.bin")
        #expect(FileManager.default.createFile(atPath: huge.path, contents: nil))
        let handle = try FileHandle(forWritingTo: huge)
        try handle.truncate(atOffset: UInt64(Attachment.maximumSize) + 1)   // sparse: no disk used
        try handle.close()
        #expect(await code { try await alice.sendFile(huge, to: "bob") } == .fileTooLarge)
        #expect(await code { try await alice.sendFile(URL(fileURLWithPath: directory + "/absent"), to: "bob") } == .fileUnreadable)
        #expect(await code { try await alice.sendFile(URL(fileURLWithPath: directory), to: "bob") } == .fileUnreadable)
        let empty = URL(fileURLWithPath: directory + "/empty")
        #expect(FileManager.default.createFile(atPath: empty.path, contents: Data()))
        #expect(await code { try await alice.sendFile(empty, to: "bob") } == .fileUnreadable)
        #expect(await code { try await alice.sendFile(try Self.randomFile(10, in: directory, name: "x"), to: "bob", mediaType: "not a type") } == .fileUnreadable)
        // A name that a bidi override would show backwards ("photo<RLO>gpj.exe" shows as photoexe.jpg).
        #expect(await code { try await alice.sendFile(try Self.randomFile(10, in: directory, name: "photo\u{202E}gpj.exe"), to: "bob") } == .fileUnreadable)
        #expect(try alice.conversations().isEmpty)
        let staged = (try? FileManager.default.contentsOfDirectory(atPath: fixture.storePath("alice") + "/Files")) ?? []
        #expect(staged.isEmpty, "nothing left staged: \(staged)")
    }

    /// A reader takes a manifest only as PROTOCOL.md §3.4 says; anything else is no file.
    @Test func aManifestBreakingTheRulesIsNoFile() throws {
        let size = Int64(AttachmentManifest.chunkSize) + 10, key = Sodium.randomBytes(32)
        let chunks = [try AssetReference(hash: Data(repeating: 1, count: 32), size: UInt64(AttachmentManifest.chunkSize + 16)),
                      try AssetReference(hash: Data(repeating: 2, count: 32), size: 26)]
        let good = AttachmentManifest(name: "a.bin", mediaType: "application/octet-stream", size: size, key: key, chunks: chunks)
        func record(_ fields: [String: FieldValue]) throws -> Record {
            Record(id: try RecordID(zone: try ZoneName("c-0123456789abcdef-fedcba9876543210"), name: "m.x"), type: "Message", fields: fields)
        }
        #expect(AttachmentManifest(record: try record(good.recordFields)) == good)
        var broken: [(String, [String: FieldValue])] = []
        for (why, field, value) in [("a bidi override", "fileName", FieldValue.string("a\u{202E}nib.exe")), ("a path", "fileName", .string("../a")),
                                    ("no type", "fileType", .string("binary")), ("too large", "fileSize", .int(AttachmentManifest.maximumSize + 1)),
                                    ("a short key", "fileKey", .bytes(Data(count: 16))), ("a chunk missing", "fileChunks", .list([.asset(chunks[0])])),
                                    ("a chunk of another size", "fileChunks", .list([.asset(chunks[0]), .asset(try AssetReference(hash: Data(count: 32), size: 27))])),
                                    ("a size that makes three chunks", "fileSize", .int(Int64(AttachmentManifest.chunkSize) * 2 + 1))] {
            var fields = good.recordFields
            fields[field] = value
            broken.append((why, fields))
        }
        for (why, fields) in broken { #expect(AttachmentManifest(record: try record(fields)) == nil, "\(why)") }
        // A thumbnail over its limit is dropped, the file kept.
        var big = good.recordFields
        big["thumbnail"] = .bytes(Data(count: AttachmentManifest.maximumThumbnailBytes + 1))
        #expect(AttachmentManifest(record: try record(big))?.thumbnail == nil)
    }
}
