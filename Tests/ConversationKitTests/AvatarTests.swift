import ConversationKit
import Foundation
import ImageKit
@testable import RecordZone
import Testing
import TestSupport

@Suite struct AvatarTests {
    static let red: (UInt8, UInt8, UInt8, UInt8) = (220, 30, 40, 255)
    static let blue: (UInt8, UInt8, UInt8, UInt8) = (20, 60, 200, 255)

    /// Alice sets a photo (a progressive JPEG, stored landscape red over blue, tagged "turn 90°
    /// clockwise"), syncs; Bob receives it capped to fit 100×100, upright (portrait, red on the
    /// right). She changes it to a wide interlaced gray-and-alpha PNG: Bob gets the new one; she
    /// removes it: Bob has none.
    @Test(arguments: ChatBackend.allCases.filter { $0 != .memory })
    func avatarsTravelCappedAndUpright(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob")
        _ = try await alice.send("hi", to: "bob")
        let photo = ImageFixtures.topBottom(width: 800, height: 400, top: (220, 30, 40), bottom: (20, 60, 200))
        let jpeg = ImageFixtures.withOrientation(try Images.encodeJPEG(photo, quality: 90, progressive: true), 6)
        let mine = try await alice.setAvatar(imageData: jpeg)
        #expect(mine.avatarSize == PixelSize(width: 50, height: 100))
        try await syncAll([alice, bob])

        let received = try #require(try await bob.avatarImage(for: "alice"))
        #expect(received.size == PixelSize(width: 50, height: 100))
        let pixels = try Images.decode(received.png)
        #expect(pixels.width == 50 && pixels.height == 100)
        #expect(near(pixels.pixel(45, 50), Self.red, 10) && near(pixels.pixel(4, 50), Self.blue, 10), "upright: red on the right")
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "alice"))?.avatarSize == PixelSize(width: 50, height: 100))
        let url = try #require(try await bob.avatarImageLocalURL(for: "alice"))
        #expect(try Data(contentsOf: url) == received.png)

        // A new avatar replaces the old one.
        let wide = ImageFixtures.split(width: 900, height: 300, left: (200, 200, 200, 255), right: (40, 40, 40, 120))
        try await alice.setAvatar(imageData: try ImageFixtures.png(wide, .grayAlpha8, interlaced: true))
        try await syncAll([alice, bob])
        let changed = try Images.decode(try #require(try await bob.avatarImage(for: "alice")).png)
        #expect(changed.width == 100 && changed.height == 33)
        #expect(near(changed.pixel(10, 16), (200, 200, 200, 255)) && near(changed.pixel(90, 16), (40, 40, 40, 120)))

        // Removed: Bob has none.
        try await alice.removeAvatar()
        try await syncAll([alice, bob])
        #expect(try await bob.avatarImage(for: "alice") == nil)
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "alice"))?.avatarSize == nil)
    }

    /// A missing asset and one whose bytes are not what its hash says leave the speaker without
    /// an avatar, with the reason — never with a wrong image.
    @Test func aMissingOrCorruptAssetLeavesNoAvatarAndSaysWhy() async throws {
        let fixture = try await ChatFixture(.filesystem)
        var configuration = StoreConfiguration()
        configuration.avatarDownload = .onFirstAccess
        let alice = try await fixture.store("alice"), carol = try await fixture.store("carol")
        let bob = try await fixture.store("bob", configuration: configuration)
        _ = try await alice.send("hi", to: "bob")
        _ = try await carol.send("hi", to: "bob")
        let aliceAvatar = try Images.cap(try Images.encodeJPEG(ImageFixtures.split(width: 120, height: 120, left: Self.red, right: Self.blue)), maxWidth: 100, maxHeight: 100)
        try await alice.setAvatar(imageData: try Images.encodeJPEG(ImageFixtures.split(width: 120, height: 120, left: Self.red, right: Self.blue)))
        try await carol.setAvatar(imageData: try Images.encodePNG(RGBAImage(width: 64, height: 64, fill: Self.blue)))
        try await syncAll([alice, carol, bob])
        let assets = AssetFolder(root: fixture.folder + "/assets")
        // Alice's asset goes missing; Carol's is replaced by other bytes (another valid PNG).
        try FileManager.default.removeItem(atPath: assets.path(for: AssetReference(for: aliceAvatar.png)))
        let carolSpeaker = try #require(try bob.speaker(fromRef: SpeakerRef(identifier: "carol")))
        let carolPNG = try Images.cap(try Images.encodePNG(RGBAImage(width: 64, height: 64, fill: Self.blue)), maxWidth: 100, maxHeight: 100).png
        #expect(carolSpeaker.avatarSize == PixelSize(width: 64, height: 64))
        var damaged = carolPNG
        damaged[damaged.count / 2] ^= 0x10
        try damaged.write(to: URL(fileURLWithPath: assets.path(for: AssetReference(for: carolPNG))))

        #expect(try await bob.avatarImage(for: "alice") == nil)
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "alice"))?.avatarProblem?.contains("missing") == true)
        #expect(try await bob.avatarImage(for: "carol") == nil)
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "carol"))?.avatarProblem?.contains("does not match its hash") == true)
        // Carol sets a new avatar: the problem is gone with the old one.
        try await carol.setAvatar(imageData: try Images.encodePNG(RGBAImage(width: 30, height: 60, fill: Self.blue)))
        try await syncAll([carol, bob])
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "carol"))?.avatarProblem == nil)
        #expect(try await bob.avatarImage(for: "carol")?.size == PixelSize(width: 30, height: 60))
    }

    /// Hostile images given to setAvatar: each its typed error, nothing stored or queued.
    @Test func hostileImagesAreRefusedAndNothingIsStored() async throws {
        let fixture = try await ChatFixture(.memory)
        var configuration = StoreConfiguration()
        configuration.imageLimits = ImageLimits(maximumBytes: 1 << 20, maximumPixels: 4_000_000)
        let alice = try await fixture.store("alice", configuration: configuration)
        let pending = try alice.pendingChangeCount()
        let png = try Images.encodePNG(ImageFixtures.split(width: 300, height: 200, left: Self.red, right: Self.blue))
        let jpeg = try Images.encodeJPEG(ImageFixtures.split(width: 300, height: 200, left: Self.red, right: Self.blue))
        let cases: [(String, Data, ImageError.Code)] = [
            ("a JPEG claiming 3000×3000", try ImageFixtures.claiming(jpeg, width: 3000, height: 3000), .tooManyPixels),
            ("a truncated PNG", png.prefix(png.count / 2), .corrupt),
            ("a truncated JPEG", jpeg.prefix(jpeg.count / 2), .corrupt),
            ("wrong magic", Data("GIF89a".utf8) + png.dropFirst(6), .notAnImage),
            ("random bytes", Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 7) }), .notAnImage),
            ("2 MiB over a 1 MiB limit", png + Data(count: 2 << 20), .inputTooLarge),
        ]
        for (name, data, code) in cases {
            await #expect(throws: ConversationError.self, "\(name)") { try await alice.setAvatar(imageData: data) }
            do { try await alice.setAvatar(imageData: data) } catch {
                #expect(error.code == .invalidImage && error.imageError?.code == code, "\(name): \(error)")
            }
        }
        // A file over the limit is refused before it is read.
        let big = fixture.directory.path + "/big.png"
        try (png + Data(count: 2 << 20)).write(to: URL(fileURLWithPath: big))
        do { try await alice.setAvatar(contentsOf: URL(fileURLWithPath: big)); Issue.record("a 2 MiB file was taken") } catch {
            #expect(error.imageError?.code == .inputTooLarge)
        }
        #expect(try alice.localSpeaker?.avatarSize == nil)
        #expect(try alice.pendingChangeCount() == pending, "nothing queued")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: fixture.storePath("alice") + "/Images")) ?? [] == [])
    }

    /// The image cache keeps its byte budget by evicting the least recently used image first,
    /// never the local speaker's own avatar; it survives a restart (served with the backend
    /// gone), and clearAllCachedData empties it (the next sync fills it again).
    @Test func theCacheEvictsLeastRecentlyUsedKeepsItsOwnAndSurvivesRestarts() async throws {
        let fixture = try await ChatFixture(.filesystem)
        let colours: [(String, (UInt8, UInt8, UInt8, UInt8))] = [("alice", (250, 0, 0, 255)), ("carol", (0, 250, 0, 255)), ("dave", (0, 0, 250, 255))]
        var others = [String: ConversationStore]()
        for (name, colour) in colours {
            let store = try await fixture.store(name)
            try await store.setAvatar(imageData: try Images.encodePNG(RGBAImage(width: 80, height: 80, fill: colour)))
            _ = try await store.send("hi", to: "bob")
            try await store.sync()
            others[name] = store
        }
        let own = try Images.encodePNG(RGBAImage(width: 90, height: 90, fill: (9, 9, 9, 255)))
        let sizes = try colours.map { try Images.cap(Images.encodePNG(RGBAImage(width: 80, height: 80, fill: $0.1)), maxWidth: 100, maxHeight: 100).png.count }
        let ownSize = try Images.cap(own, maxWidth: 100, maxHeight: 100).png.count
        var configuration = StoreConfiguration()
        configuration.avatarDownload = .onFirstAccess
        configuration.imageCacheBytes = ownSize + 2 * (sizes.max() ?? 0)  // its own and two others
        var bob: ConversationStore? = try await fixture.store("bob", configuration: configuration)
        try await bob?.setAvatar(imageData: own)
        try await bob?.sync()
        let images = fixture.storePath("bob") + "/Images"
        func held() throws -> Int { try FileManager.default.subpathsOfDirectory(atPath: images).filter { $0.count > 60 }.count }
        #expect(try held() == 1, "only its own before anything is asked for")
        _ = try #require(try await bob?.avatarImage(for: "alice"))
        _ = try #require(try await bob?.avatarImage(for: "carol"))
        _ = try #require(try await bob?.avatarImage(for: "alice"))  // alice used again: carol is now the least recent
        _ = try #require(try await bob?.avatarImage(for: "dave"))
        #expect(try held() == 3, "the budget holds three")
        // Restarted, with the shared folder gone: what is cached is served; carol was evicted.
        bob = nil
        try FileManager.default.moveItem(atPath: fixture.folder, toPath: fixture.folder + "-away")
        let again = try ConversationStore(directory: fixture.storePath("bob"), backend: fixture.factory(device: "bob"), configuration: configuration)
        #expect(try await again.avatarImage(for: "alice")?.size == PixelSize(width: 80, height: 80))
        #expect(try await again.avatarImage(for: "dave")?.size == PixelSize(width: 80, height: 80))
        #expect(try await again.avatarImage(for: "bob")?.size == PixelSize(width: 90, height: 90), "its own is never evicted")
        await #expect(throws: ConversationError.self, "carol's was evicted: it must be downloaded, and the folder is away") {
            try await again.avatarImage(for: "carol")
        }
        try FileManager.default.moveItem(atPath: fixture.folder + "-away", toPath: fixture.folder)
        // Cleared: only its own stays; a sync (downloading during sync) fills the cache again.
        try await again.clearAllCachedData()
        #expect(try held() == 1)
        var syncing = configuration
        syncing.avatarDownload = .duringSync
        syncing.imageCacheBytes = 50 << 20
        let refilled = try ConversationStore(directory: fixture.storePath("bob"), backend: fixture.factory(device: "bob-2"), configuration: syncing)
        let report = try await refilled.sync()
        let after = try held()
        #expect(report.avatarsDownloaded == 3 && after == 4, "\(report)")
        withExtendedLifetime(others) {}
    }

    /// Alice (red) and Carol (blue) with 70×50 avatars, each in a conversation with Bob, synced.
    static func aliceAndCarolWithAvatars() async throws -> (ChatFixture, [ConversationStore]) {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice"), carol = try await fixture.store("carol")
        for (store, colour) in [(alice, red), (carol, blue)] {
            try await store.setAvatar(imageData: try Images.encodePNG(RGBAImage(width: 70, height: 50, fill: colour)))
            _ = try await store.send("hi", to: "bob")
            try await store.sync()
        }
        return (fixture, [alice, carol])
    }

    /// Many readers at once, from two store instances on one directory (as two processes of one
    /// app would share it), while one of them keeps evicting and downloading again: every answer
    /// is a whole image of the right speaker, or (for the instance that cannot reach the backend,
    /// whose device state the other holds) a backend error — never a torn or wrong image.
    @Test func concurrentReadersAlwaysGetWholeImages() async throws {
        let (fixture, _) = try await Self.aliceAndCarolWithAvatars()
        var configuration = StoreConfiguration()
        configuration.avatarDownload = .onFirstAccess
        configuration.imageCacheBytes = 1  // every new image evicts the others
        let bob = try await fixture.store("bob", configuration: configuration)
        try await bob.sync()
        _ = try await bob.avatarImage(for: "alice")
        let twin = try ConversationStore(directory: fixture.storePath("bob"), backend: fixture.factory(device: "bob"), configuration: configuration)
        let answers = try await withThrowingTaskGroup(of: (String, AvatarImage?, Bool).self) { group in
            for n in 0..<60 {
                let store = n % 2 == 0 ? bob : twin, who = n % 3 == 0 ? "carol" : "alice"
                group.addTask {
                    do { return (who, try await store.avatarImage(for: who), false) } catch {
                        #expect(store === twin && (error as? ConversationError)?.code == .backend, "\(error)")
                        return (who, nil, true)
                    }
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(answers.count == 60)
        for (who, image, failed) in answers where !failed {
            let image = try #require(image)
            let pixels = try Images.decode(image.png)
            #expect(pixels.width == 70 && pixels.height == 50)
            #expect(near(pixels.pixel(35, 25), who == "alice" ? Self.red : Self.blue, 2), "\(who)")
        }
    }

    /// Another process (`convkit-store-sync --avatar-of`) reads the store's image cache while
    /// the store's own process keeps evicting and downloading again: each of its reads is the
    /// whole image of the right speaker, or a backend error (the backend is the other process's).
    @Test func anotherProcessReadsTheCacheWhileTheStoreEvicts() async throws {
        let (fixture, _) = try await Self.aliceAndCarolWithAvatars()
        let aliceHash = AssetReference(for: try Images.cap(try Images.encodePNG(RGBAImage(width: 70, height: 50, fill: Self.red)), maxWidth: 100, maxHeight: 100).png).hexHash
        var configuration = StoreConfiguration()
        configuration.avatarDownload = .onFirstAccess
        configuration.imageCacheBytes = 1
        let bob = try await fixture.store("bob", configuration: configuration)
        try await bob.sync()
        _ = try await bob.avatarImage(for: "alice")
        let reader = try ChildProcess(try builtProduct("convkit-store-sync"), ["--store", fixture.storePath("bob"), "--folder", fixture.folder, "--device", "bob",
                                                                               "--identifier", "bob", "--avatar-of", "alice", "--reads", "200", "--pause-ms", "10"])
        var rounds = 0
        // Carol's evicts Alice's and back; Alice's then stays a while, and the reader's reads are
        // spread over two seconds, so it meets both states on a loaded machine too (its 200
        // reads done at once could all fall in one of Carol's turns).
        while reader.isRunning && rounds < 2000 {
            _ = try await bob.avatarImage(for: rounds % 2 == 0 ? "carol" : "alice")
            if rounds % 2 == 1 { try await Task.sleep(for: .milliseconds(30)) }
            rounds += 1
        }
        #expect(await reader.wait() == 0, "\(reader.standardError)")
        let lines = reader.lines
        #expect(lines.count == 200)
        #expect(lines.allSatisfy { $0 == "avatar 70x50 \(aliceHash)" || $0 == "error backend" }, "\(Set(lines))")
        #expect(lines.contains("avatar 70x50 \(aliceHash)"), "some reads found it cached")
    }
}
