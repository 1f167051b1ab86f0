import Foundation
import ImageKit
import RecordZone
import SQLiteKit

/// A speaker's avatar as the store holds it: a PNG capped to ``StoreConfiguration/maxImageSize``.
public struct AvatarImage: Sendable, Hashable {
    public let png: Data
    public let size: PixelSize
}

extension ConversationStore {
    /// The image cache: files named by their SHA-256 under `<store>/Images/`, written
    /// atomically, verified on every read (``AssetFolder``).
    var imageFiles: AssetFolder { AssetFolder(root: directory + "/Images") }

    /// Sets the local speaker's avatar from image bytes (PNG or JPEG): decoded with libpng or
    /// libjpeg-turbo, turned upright (EXIF orientation), scaled down to fit
    /// ``StoreConfiguration/maxImageSize`` and kept as a PNG without metadata. The PNG goes into
    /// the image cache and becomes an asset that the next ``sync()`` uploads before the new
    /// profile version that references it.
    /// - Throws: ``ConversationError/Code/invalidImage`` (with ``ConversationError/imageError``)
    ///   for bytes over the limit, a header claiming too many pixels, anything that is not a
    ///   whole PNG or JPEG; nothing is stored then.
    @discardableResult
    public func setAvatar(imageData: Data) async throws(ConversationError) -> Speaker {
        let local = try requireIdentity()
        let box = configuration.maxImageSize
        let capped: CappedImage
        do { capped = try Images.cap(imageData, maxWidth: box.width, maxHeight: box.height, limits: configuration.imageLimits) } catch {
            throw ConversationError.wrap(error)
        }
        let avatar = AvatarReference(asset: AssetReference(for: capped.png), size: PixelSize(width: capped.width, height: capped.height))
        return try await publishAvatar(avatar, png: capped.png, as: local)
    }

    /// Sets the local speaker's avatar from an image file (see ``setAvatar(imageData:)``); a file
    /// over the byte limit is refused before it is read.
    @discardableResult
    public func setAvatar(contentsOf url: URL) async throws(ConversationError) -> Speaker {
        let path = url.path
        let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? nil
        guard let size else { throw ConversationError(.invalidImage, "cannot read the image file \(path)") }
        guard size <= configuration.imageLimits.maximumBytes else {
            throw ConversationError.wrap(ImageError(.inputTooLarge, "\(path) is \(size) bytes; the limit is \(configuration.imageLimits.maximumBytes)"))
        }
        let data: Data
        do { data = try Data(contentsOf: url) } catch { throw ConversationError(.invalidImage, "cannot read the image file \(path): \(error.localizedDescription)") }
        return try await setAvatar(imageData: data)
    }

    /// Removes the local speaker's avatar (a new profile version without one).
    @discardableResult
    public func removeAvatar() async throws(ConversationError) -> Speaker {
        try await publishAvatar(nil, png: nil, as: try requireIdentity())
    }

    /// A new version of the local speaker's profile with `avatar`, its PNG put in the cache
    /// first, in the same transaction as the profile and its outbox entry.
    private func publishAvatar(_ avatar: AvatarReference?, png: Data?, as local: LocalIdentity) async throws(ConversationError) -> Speaker {
        let files = imageFiles
        let now = SyncEngine.milliseconds(configuration.now())
        let budget = configuration.imageCacheBytes
        try await write { applier in
            let db = applier.db
            guard let current = try db.first("SELECT name FROM speakers WHERE identifier = ?", [local.identifier], { $0.text(0) }) else {
                throw ConversationError(.noLocalSpeaker, "call setupLocalSpeaker(identifier:name:tags:) first")
            }
            let tags = try db.rows("SELECT tag FROM speaker_tags WHERE identifier = ? ORDER BY tag", [local.identifier]) { $0.text(0) }
            if let avatar, let png { try ImageCacheIndex.keep(png, as: avatar.asset, in: files, now: now, budget: budget, db: db) }
            try self.commitProfile(local.identifier, name: current, tags: tags, avatar: avatar, as: local, in: &applier)
        }
        guard let speaker = try await loadSpeaker(local.identifier) else {
            throw ConversationError(.database, "the local speaker's profile was not stored")
        }
        return speaker
    }

    /// A speaker's avatar: from the image cache, or downloaded from the backend (verified
    /// against its hash, and decoded to check it is the PNG its profile says) and cached.
    /// - Returns: nil when the speaker has no avatar, or its asset is missing or damaged
    ///   (``Speaker/avatarProblem`` says which) — never another image.
    /// - Throws: ``ConversationError/Code/backend`` when it must be downloaded and the backend
    ///   cannot be reached.
    public func avatarImage(for identifier: String) async throws(ConversationError) -> AvatarImage? {
        let (held, problem) = try await read { db in
            (try Self.avatar(of: identifier, in: db),
             try db.first("SELECT avatar_error FROM speakers WHERE identifier = ?", [identifier]) { $0.optionalText(0) } ?? nil)
        }
        guard let avatar = held else { return nil }
        if let png = try? imageFiles.get(avatar.asset) {
            let now = SyncEngine.milliseconds(configuration.now())
            try await write { applier in try ImageCacheIndex.touch(avatar.asset.hash, now: now, in: applier.db) }
            return AvatarImage(png: png, size: avatar.size)
        }
        if problem != nil { return nil }
        return try await downloadAvatar(identifier, avatar, from: try backend())
    }

    /// The avatar's file in the image cache (downloaded first when needed), or nil as for
    /// ``avatarImage(for:)``. The file may be evicted later: ask again rather than keep the URL.
    public func avatarImageLocalURL(for identifier: String) async throws(ConversationError) -> URL? {
        guard let avatar = try await avatarImage(for: identifier) else { return nil }
        return URL(fileURLWithPath: imageFiles.path(for: AssetReference(for: avatar.png)))
    }

    /// Downloads the avatars of known speakers that the cache does not hold and that have no
    /// recorded problem. A transient failure ends it quietly (the next sync tries again).
    /// - Returns: how many were downloaded.
    func downloadMissingAvatars(from backend: any RecordZoneBackend) async -> Int {
        let missing = (try? await read { db in
            try db.rows("""
                SELECT identifier FROM speakers
                WHERE avatar_hash IS NOT NULL AND avatar_error IS NULL AND avatar_hash NOT IN (SELECT hash FROM image_cache)
                ORDER BY identifier
                """) { $0.text(0) }
        }) ?? []
        var downloaded = 0
        for identifier in missing {
            guard let avatar = try? await read({ db in try Self.avatar(of: identifier, in: db) }) else { continue }
            do {
                if try await downloadAvatar(identifier, avatar, from: backend) != nil { downloaded += 1 }
            } catch {
                break
            }
        }
        return downloaded
    }

    /// Downloads one avatar into the cache. A missing or corrupt asset, or one that is not the
    /// PNG the profile describes, is recorded as the speaker's avatar problem (nil returned);
    /// a transient failure throws and records nothing.
    func downloadAvatar(_ identifier: String, _ avatar: AvatarReference, from backend: any RecordZoneBackend) async throws(ConversationError) -> AvatarImage? {
        let problem: String
        switch try await verifiedAvatar(avatar, from: backend) {
        case .success(let image): return image
        case .failure(let why): problem = why.description
        }
        try await write { applier in
            try applier.db.execute("UPDATE speakers SET avatar_error = ? WHERE identifier = ? AND avatar_hash = ?", [problem, identifier, avatar.asset.hash])
            applier.note(.speakerUpdated(identifier))
        }
        return nil
    }
}

/// Why an avatar's asset cannot be shown (recorded as a speaker's avatar problem).
struct AvatarProblem: Error, CustomStringConvertible {
    let description: String
}

extension ConversationStore {
    /// Downloads an avatar's asset into the cache when it is the PNG its reference names. - Returns:
    /// the image, or why not (missing, corrupt, not that PNG); a transient failure throws.
    func verifiedAvatar(_ avatar: AvatarReference, from backend: any RecordZoneBackend) async throws(ConversationError) -> Result<AvatarImage, AvatarProblem> {
        do {
            let png = try await backend.asset(avatar.asset)
            let decoded = try Images.decode(png, limits: ImageLimits(maximumBytes: Int(avatar.asset.size), maximumPixels: PixelSize.largestAvatarSide * PixelSize.largestAvatarSide))
            if ImageFormat(magicOf: png) == .png, decoded.width == avatar.size.width, decoded.height == avatar.size.height {
                let files = imageFiles, now = SyncEngine.milliseconds(configuration.now()), budget = configuration.imageCacheBytes
                try await write { applier in try ImageCacheIndex.keep(png, as: avatar.asset, in: files, now: now, budget: budget, db: applier.db) }
                return .success(AvatarImage(png: png, size: avatar.size))
            }
            return .failure(AvatarProblem(description: "the avatar asset is not the \(avatar.size) PNG the profile names (it is a \(decoded.width)×\(decoded.height) image)"))
        } catch let error as RecordZoneError where error.isTransient {
            throw ConversationError.backend(error, "cannot download the avatar \(avatar.asset.hexHash)")
        } catch let error as RecordZoneError {
            return .failure(AvatarProblem(description: error.code == .unknownItem ? "the avatar asset is missing from the backend"
                : error.code == .assetCorrupt ? "the avatar asset does not match its hash" : "the avatar asset cannot be had: \(error)"))
        } catch let error as ImageError {
            return .failure(AvatarProblem(description: "the avatar asset is not a valid image: \(error)"))
        } catch {
            throw ConversationError.wrap(error)
        }
    }
}

/// The image cache's bookkeeping in the store's database: which files it holds, their sizes and
/// last use. Eviction goes least recently used first and never takes the local speaker's own
/// avatar.
enum ImageCacheIndex {
    /// The local speaker's own avatar's hash, which nothing evicts (SQL).
    private static let ownAvatar = "(SELECT s.avatar_hash FROM speakers s JOIN ck_meta m ON m.key = 'local_speaker' AND s.identifier = m.value)"

    /// Puts an image into the cache (its file, written atomically, and its row), then evicts
    /// what the budget requires — never this image.
    static func keep(_ png: Data, as reference: AssetReference, in files: AssetFolder, now: Int64, budget: Int, db: Database) throws {
        _ = try files.put(png, expected: reference)
        try db.execute("""
            INSERT INTO image_cache (hash, size, last_used) VALUES (?, ?, ?)
            ON CONFLICT (hash) DO UPDATE SET last_used = excluded.last_used
            """, [reference.hash, Int64(reference.size), now])
        for hash in try evict(toFit: budget, keeping: reference.hash, in: db) { files.remove(hash) }
    }

    static func touch(_ hash: Data, now: Int64, in db: Database) throws {
        try db.execute("UPDATE image_cache SET last_used = ? WHERE hash = ?", [now, hash])
    }

    /// Forgets the least recently used images until the cache holds at most `budget` bytes,
    /// but not `kept` (the image just added: it is being used).
    /// - Returns: the hashes whose files the caller removes.
    private static func evict(toFit budget: Int, keeping kept: Data?, in db: Database) throws -> [Data] {
        var total = try db.first("SELECT coalesce(sum(size), 0) FROM image_cache") { $0.int(0) } ?? 0
        guard total > budget else { return [] }
        let candidates = try db.rows("SELECT hash, size FROM image_cache WHERE hash IS NOT \(ownAvatar) ORDER BY last_used, hash") { ($0.blob(0), $0.int(1)) }
        var evicted = [Data]()
        for (hash, size) in candidates where total > budget && hash != kept {
            try db.execute("DELETE FROM image_cache WHERE hash = ?", [hash])
            total -= size
            evicted.append(hash)
        }
        return evicted
    }

    /// Forgets every image but the local speaker's own avatar. - Returns: the hashes forgotten.
    static func clear(in db: Database) throws -> [Data] {
        let hashes = try db.rows("SELECT hash FROM image_cache WHERE hash IS NOT \(ownAvatar)") { $0.blob(0) }
        try db.execute("DELETE FROM image_cache WHERE hash IS NOT \(ownAvatar)")
        return hashes
    }
}

extension AssetFolder {
    /// Removes a file (gone already is fine).
    func remove(_ hash: Data) {
        guard let reference = try? AssetReference(hash: hash, size: 0) else { return }
        unlink(path(for: reference))
    }
}
