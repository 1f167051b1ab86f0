import Foundation
import RecordZone
import ImageKit
import SQLiteKit

/// Files sent with messages (docs/PROTOCOL.md §3.4): sent offline like any message (the file
/// is copied into the store's `Files/` cache and its chunks are encrypted and hashed in one
/// pass), uploaded by the sync before the message itself — so no reader ever gets a message
/// whose file it cannot fetch —, and downloaded on demand or during the sync
/// (``StoreConfiguration/fileDownload``). Every step holds one chunk (1 MiB) in memory at a
/// time, and each resumes where a cut left it: an upload at the next chunk the backend did not
/// confirm, a download at the next chunk its partial file lacks.
extension ConversationStore {
    /// Where files live: `Files/<conversation>/<message name>/<file name>` (a partial download
    /// beside it as `.partial`).
    var filesRoot: String { directory + "/Files" }

    /// How many chunk requests a file's upload and download keep in flight: the next ones move
    /// while one is read and encrypted (or checked, opened and written), each in memory.
    package static let fileTransfersInFlight = (upload: 2, download: 4)

    /// Sends a file to a speaker: copied into the store (the original may go), with its
    /// thumbnail when it is an image, and committed with its outbox entry; ``sync()`` uploads
    /// it, then the message. The message's content is the caption, or the file's name.
    /// - Parameter mediaType: as the file's type is said (`image/png`); guessed from its name
    ///   and first bytes when nil.
    /// - Throws: ``ConversationError/Code/fileUnreadable``, ``ConversationError/Code/fileTooLarge``
    ///   (over ``Attachment/maximumSize``), the errors of ``send(_:to:replyingTo:mentions:custom:)``.
    @discardableResult
    public func sendFile(_ url: URL, to listener: String, caption: String? = nil, mediaType: String? = nil,
                         replyingTo parent: MessageID? = nil) async throws(ConversationError) -> Message {
        let staged = try stageFile(url, mediaType: mediaType)
        defer { try? FileManager.default.removeItem(atPath: staged.directory) }
        return try await send(caption ?? staged.manifest.name, to: listener, replyingTo: parent, file: staged)
    }

    /// Sends a file to a group, as ``sendFile(_:to:caption:mediaType:replyingTo:)``.
    @discardableResult
    public func sendFile(_ url: URL, toGroup group: String, caption: String? = nil, mediaType: String? = nil,
                         replyingTo parent: MessageID? = nil) async throws(ConversationError) -> Message {
        let staged = try stageFile(url, mediaType: mediaType)
        defer { try? FileManager.default.removeItem(atPath: staged.directory) }
        return try await send(caption ?? staged.manifest.name, toGroup: group, replyingTo: parent, file: staged)
    }

    /// The file of a message this device holds whole (its own, or downloaded), or nil. The cache
    /// may empty it later: ask again rather than keep the URL.
    /// - Throws: ``ConversationError/Code/unknownMessage``, ``ConversationError/Code/noFile``.
    public func fileURL(of id: MessageID) throws(ConversationError) -> URL? {
        heldFile(id, try read(Self.fileQuery(id)))
    }

    /// ``fileURL(of:)``, read without blocking the caller's thread.
    func loadFileURL(of id: MessageID) async throws(ConversationError) -> URL? {
        heldFile(id, try await read(Self.fileQuery(id)))
    }

    private static func fileQuery(_ id: MessageID) -> @Sendable (Database) throws -> (Attachment, Int64?) {
        { db in (try requireFile(db, id), try heldBytes(db, id)) }
    }

    private func heldFile(_ id: MessageID, _ row: (file: Attachment, held: Int64?)) -> URL? {
        let (file, held) = row
        guard held != nil else { return nil }
        let path = filePath(id, name: file.name)
        return FileManager.default.fileExists(atPath: path) ? URL(fileURLWithPath: path) : nil
    }

    /// An image file's thumbnail, carried in its message (nil for other files).
    public func thumbnail(of id: MessageID) throws(ConversationError) -> AttachmentThumbnail? {
        try read { db in
            _ = try Self.requireFile(db, id)
            return try db.first("SELECT thumbnail, image_width, image_height FROM attachments WHERE zone = ? AND name = ?", [id.conversation, id.name]) { row in
                row.optionalBlob(0).map { jpeg in
                    AttachmentThumbnail(jpeg: jpeg, imageSize: row.optionalInt(1).flatMap { w in row.optionalInt(2).map { PixelSize(width: Int(w), height: Int($0)) } })
                }
            } ?? nil
        }
    }

    /// Downloads a message's file into the store's cache (or finds it there) and returns where
    /// it is. Chunk by chunk, each checked against its hash and opened with the file's key
    /// before it is written; a download cut short (a lost connection, a killed process) goes on
    /// from the chunks already written when asked again.
    /// - Parameter progress: told the bytes written so far and the file's size, after each chunk.
    /// - Returns: the file, named as its sender named it.
    /// - Throws: ``ConversationError/Code/fileMissing`` (the backend lacks a chunk),
    ///   ``ConversationError/Code/fileCorrupt`` (a chunk's bytes are not the message's: nothing
    ///   of it is kept), ``ConversationError/Code/backend`` (unreachable: asking again resumes),
    ///   ``ConversationError/Code/noFile``.
    @discardableResult
    public func downloadFile(of id: MessageID, progress: (@Sendable (_ written: Int64, _ size: Int64) -> Void)? = nil) async throws(ConversationError) -> URL {
        if let url = try await loadFileURL(of: id) {
            try await touchFile(id)
            return url
        }
        try await removeDiscardedFiles()
        let (file, key, hashes) = try await read { db in
            let file = try Self.requireFile(db, id)
            let (key, hashes) = try db.first("SELECT file_key, chunks FROM attachments WHERE zone = ? AND name = ?", [id.conversation, id.name]) { ($0.blob(0), $0.blob(1)) }
                ?? (Data(), Data())
            return (file, key, hashes)
        }
        guard let references = AttachmentManifest.chunks(fromHashes: hashes, size: file.size) else {
            throw ConversationError(.noFile, "\(id) names no file this store holds")
        }
        let count = references.count
        let backend = try backend()
        let directory = fileDirectory(id), partial = directory + "/.partial"
        let handle = try Self.openForAppending(partial, directory: directory)
        defer { try? handle.close() }
        // Whole chunks written before go on; a torn last one is written again.
        let kept = Self.fileSize(partial) / Int64(AttachmentManifest.chunkSize)
        do {
            try handle.truncate(atOffset: UInt64(kept * Int64(AttachmentManifest.chunkSize)))
            try handle.seekToEnd()
        } catch {
            throw ConversationError(.storeNotWritable, "cannot write \(partial): \(error)")
        }
        // The next chunks are fetched (and checked against their hashes) while this one is
        // opened and written: at most `window` in flight, so memory stays a few chunks.
        let window = Self.fileTransfersInFlight.download
        var inFlight: [Task<Result<Data, RecordZoneError>, Never>] = []
        defer { inFlight.forEach { $0.cancel() } }
        let first = Int(min(kept, Int64(count)))
        func fetch(_ index: Int) {
            guard index < count else { return }
            let reference = references[index]
            inFlight.append(Task { () async -> Result<Data, RecordZoneError> in
                do throws(RecordZoneError) { return .success(try await backend.asset(reference)) } catch { return .failure(error) }
            })
        }
        for index in first..<min(count, first + window) { fetch(index) }
        for index in first..<count {
            let plainSize = AttachmentManifest.plainSize(ofChunk: index, size: file.size)
            let answer = await inFlight.removeFirst().value
            fetch(index + window)
            let sealed: Data
            do throws(RecordZoneError) {
                sealed = try answer.get()
            } catch where error.code == .unknownItem {
                throw ConversationError(.fileMissing, "the backend does not hold chunk \(index + 1) of \(count) of '\(file.name)' (\(references[index])): its sender has not uploaded it yet, or it was lost")
            } catch where error.code == .assetCorrupt {
                try? FileManager.default.removeItem(atPath: partial)
                throw ConversationError(.fileCorrupt, "chunk \(index + 1) of \(count) of '\(file.name)' does not match its hash: it was changed on the backend or on the way; nothing of it was kept")
            } catch {
                throw ConversationError.backend(error, "cannot download chunk \(index + 1) of \(count) of '\(file.name)' (asking again resumes from it)")
            }
            guard let plain = AttachmentManifest.openChunk(sealed, index: index, key: key), plain.count == plainSize else {
                try? FileManager.default.removeItem(atPath: partial)
                throw ConversationError(.fileCorrupt, "chunk \(index + 1) of \(count) of '\(file.name)' does not open with the file's key; nothing of it was kept")
            }
            do { try handle.write(contentsOf: plain) } catch { throw ConversationError(.storeNotWritable, "cannot write \(partial): \(error)") }
            progress?(min(Int64(index + 1) * Int64(AttachmentManifest.chunkSize), file.size), file.size)
        }
        do { try handle.synchronize() } catch { throw ConversationError(.storeNotWritable, "cannot write \(partial): \(error)") }
        let path = filePath(id, name: file.name)
        guard Glibc.rename(partial, path) == 0 else { throw ConversationError(.storeNotWritable, "cannot move the downloaded file to \(path): \(String(cString: strerror(errno)))") }
        try await keepFile(id, size: file.size)
        return URL(fileURLWithPath: path)
    }

    /// Downloads during the sync the files of messages no larger than the policy's limit that
    /// are not here yet, newest first. A file found damaged or missing on the backend is left for
    /// an explicit ``downloadFile(of:progress:)`` (never fetched again by each sync); any other
    /// failure ends it quietly (the next sync tries again).
    func downloadFilesDuringSync() async -> Int {
        guard case .duringSync(let limit) = configuration.fileDownload else { return 0 }
        let wanted = (try? await read { db in
            try db.rows("""
                SELECT m.zone, m.name FROM messages m JOIN attachments a ON a.zone = m.zone AND a.name = m.name
                WHERE m.file_size <= ? AND a.held IS NULL AND a.discarded = 0 AND a.problem IS NULL AND m.is_deleted = 0
                ORDER BY m.spoken_at DESC LIMIT 100
                """, [limit]) { MessageID(conversation: $0.text(0), name: $0.text(1)) }
        }) ?? []
        var downloaded = 0
        for id in wanted {
            do {
                try await downloadFile(of: id)
                downloaded += 1
            } catch where error.code == .fileCorrupt || error.code == .fileMissing {
                let problem = error.message
                _ = try? await write { applier in
                    try applier.db.execute("UPDATE attachments SET problem = ? WHERE zone = ? AND name = ?", [problem, id.conversation, id.name])
                }
            } catch {
                break
            }
        }
        return downloaded
    }

    /// Removes the cache directories of files whose message went or changed its file.
    func removeDiscardedFiles() async throws(ConversationError) {
        let discarded = try await read { db in
            try db.rows("SELECT zone, name FROM attachments WHERE discarded = 1") { MessageID(conversation: $0.text(0), name: $0.text(1)) }
        }
        guard !discarded.isEmpty else { return }
        for id in discarded { try? FileManager.default.removeItem(atPath: fileDirectory(id)) }
        try await write { applier in
            for id in discarded {
                try applier.db.execute("""
                    DELETE FROM attachments WHERE zone = ? AND name = ? AND discarded = 1
                        AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.zone = attachments.zone AND m.name = attachments.name AND m.file_name IS NOT NULL)
                    """, [id.conversation, id.name])
                try applier.db.execute("UPDATE attachments SET discarded = 0 WHERE zone = ? AND name = ?", [id.conversation, id.name])
            }
        }
    }

    // MARK: Sending

    /// A file copied into a staging directory of the cache, with its manifest.
    struct StagedFile: Sendable {
        var directory: String
        var manifest: AttachmentManifest
    }

    /// Copies the file into a staging directory under `Files/`, encrypting and hashing each
    /// chunk on the way (the manifest), with a thumbnail for an image within the image limits.
    private func stageFile(_ url: URL, mediaType: String?) throws(ConversationError) -> StagedFile {
        let name = url.lastPathComponent
        guard AttachmentManifest.isValidName(name) else {
            throw ConversationError(.fileUnreadable, "'\(name)' cannot be a file's name: 1-\(AttachmentManifest.maximumNameBytes) bytes, not '.' or '..', "
                                    + "without '/', control or format characters (a bidi override would show it backwards)")
        }
        if let mediaType, !AttachmentManifest.isValidMediaType(mediaType) {
            throw ConversationError(.fileUnreadable, "'\(mediaType)' is not a media type (type/subtype, at most \(AttachmentManifest.maximumTypeBytes) printable characters)")
        }
        var status = stat()
        guard stat(url.path, &status) == 0, status.st_mode & S_IFMT == S_IFREG else {
            throw ConversationError(.fileUnreadable, "cannot read \(url.path): not a regular file (\(String(cString: strerror(errno))))")
        }
        let size = Int64(status.st_size)
        guard size > 0 else { throw ConversationError(.fileUnreadable, "\(url.path) is empty") }
        guard size <= Attachment.maximumSize else {
            throw ConversationError(.fileTooLarge, "\(url.path) is \(size) bytes; a file may be at most \(Attachment.maximumSize) (1 GiB)")
        }
        guard let source = FileHandle(forReadingAtPath: url.path) else { throw ConversationError(.fileUnreadable, "cannot open \(url.path)") }
        defer { try? source.close() }
        let directory = filesRoot + "/.staging-" + Sodium.randomBytes(8).hexString
        let target = try Self.openForAppending(directory + "/" + name, directory: directory)
        defer { try? target.close() }
        let key = Sodium.randomBytes(Sodium.aeadKeyLength)
        var chunks: [AssetReference] = [], first = Data()
        do throws(ConversationError) {
            for index in 0..<AttachmentManifest.chunkCount(size: size) {
                let plainSize = AttachmentManifest.plainSize(ofChunk: index, size: size)
                let plain: Data
                do { plain = try source.read(upToCount: plainSize) ?? Data() } catch { throw ConversationError(.fileUnreadable, "cannot read \(url.path): \(error)") }
                guard plain.count == plainSize else { throw ConversationError(.fileUnreadable, "\(url.path) changed while it was read") }
                if index == 0 { first = plain.prefix(16) }
                do { try target.write(contentsOf: plain) } catch { throw ConversationError(.storeNotWritable, "cannot copy \(url.path) into the store: \(error)") }
                chunks.append(AssetReference(for: AttachmentManifest.sealChunk(plain, index: index, key: key)))
            }
            do { try target.synchronize() } catch { throw ConversationError(.storeNotWritable, "cannot copy \(url.path) into the store: \(error)") }
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        var manifest = AttachmentManifest(name: name, mediaType: mediaType ?? Self.guessMediaType(name: name, firstBytes: first), size: size, key: key, chunks: chunks)
        if ImageFormat(magicOf: first) != nil, size <= configuration.imageLimits.maximumBytes,
           let data = FileManager.default.contents(atPath: directory + "/" + name),
           let thumbnail = try? Images.thumbnail(data, maxSide: 320, maxBytes: AttachmentManifest.maximumThumbnailBytes, limits: configuration.imageLimits) {
            manifest.thumbnail = thumbnail.jpeg
            manifest.pixelWidth = thumbnail.width
            manifest.pixelHeight = thumbnail.height
        }
        return StagedFile(directory: directory, manifest: manifest)
    }

    /// In the send's transaction, after its message is applied: the staged file moves to its
    /// message's place in the cache, whole and this device's to upload.
    func placeStagedFile(_ staged: StagedFile, as id: MessageID, now: Int64, in applier: inout RecordApplier) throws {
        let directory = fileDirectory(id)
        try? FileManager.default.createDirectory(atPath: (directory as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        guard Glibc.rename(staged.directory, directory) == 0 else {
            throw ConversationError(.storeNotWritable, "cannot move the file into \(directory): \(String(cString: strerror(errno)))")
        }
        try applier.db.execute("UPDATE attachments SET held = ?, last_used = ? WHERE zone = ? AND name = ?", [staged.manifest.size, now, id.conversation, id.name])
    }

    /// A guess from the name's extension, then the first bytes.
    static func guessMediaType(name: String, firstBytes: Data) -> String {
        let known = ["png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp", "heic": "image/heic",
                     "pdf": "application/pdf", "txt": "text/plain", "md": "text/markdown", "json": "application/json", "zip": "application/zip",
                     "mp4": "video/mp4", "mov": "video/quicktime", "webm": "video/webm", "mp3": "audio/mpeg", "m4a": "audio/mp4", "ogg": "audio/ogg"]
        if let type = known[(name as NSString).pathExtension.lowercased()] { return type }
        switch ImageFormat(magicOf: firstBytes) {
        case .png?: return "image/png"
        case .jpeg?: return "image/jpeg"
        case nil: return "application/octet-stream"
        }
    }

    // MARK: The cache

    func fileDirectory(ofZone zone: String) -> String { "\(filesRoot)/\(zone)" }
    func fileDirectory(_ id: MessageID) -> String { fileDirectory(ofZone: id.conversation) + "/" + id.name }
    func filePath(_ id: MessageID, name: String) -> String { fileDirectory(id) + "/" + name }

    static func requireFile(_ db: Database, _ id: MessageID) throws -> Attachment {
        guard let file = try message(db, id).attachment else { throw ConversationError(.noFile, "\(id) carries no file") }
        return file
    }

    static func heldBytes(_ db: Database, _ id: MessageID) throws -> Int64? {
        try db.first("SELECT held FROM attachments WHERE zone = ? AND name = ? AND discarded = 0", [id.conversation, id.name]) { $0.optionalInt(0) } ?? nil
    }

    private func touchFile(_ id: MessageID) async throws(ConversationError) {
        let now = Self.milliseconds(configuration.now())
        try await write { applier in
            try applier.db.execute("UPDATE attachments SET last_used = ? WHERE zone = ? AND name = ?", [now, id.conversation, id.name])
        }
    }

    /// Records a downloaded file as held, then empties the cache, least recently used first, to
    /// its budget (``StoreConfiguration/fileCacheBytes``) — never this file, nor one of the
    /// local speaker's not wholly uploaded yet.
    private func keepFile(_ id: MessageID, size: Int64) async throws(ConversationError) {
        let now = Self.milliseconds(configuration.now()), budget = Int64(configuration.fileCacheBytes)
        let evicted = try await write { applier in
            let db = applier.db
            try db.execute("UPDATE attachments SET held = ?, last_used = ? WHERE zone = ? AND name = ?", [size, now, id.conversation, id.name])
            var total = try db.first("SELECT coalesce(sum(held), 0) FROM attachments WHERE held IS NOT NULL") { $0.int(0) } ?? 0
            guard total > budget else { return [(MessageID, String)]() }
            let candidates = try db.rows("""
                SELECT a.zone, a.name, a.held, m.file_name FROM attachments a JOIN messages m ON m.zone = a.zone AND m.name = a.name
                WHERE a.held IS NOT NULL AND (a.uploaded IS NULL OR a.uploaded >= length(a.chunks) / 32) AND NOT (a.zone = ? AND a.name = ?)
                ORDER BY a.last_used, a.zone, a.name
                """, [id.conversation, id.name]) { (MessageID(conversation: $0.text(0), name: $0.text(1)), $0.int(2), $0.optionalText(3) ?? "") }
            var evicted: [(MessageID, String)] = []
            for (candidate, held, name) in candidates where total > budget {
                try db.execute("UPDATE attachments SET held = NULL WHERE zone = ? AND name = ?", [candidate.conversation, candidate.name])
                total -= held
                evicted.append((candidate, name))
            }
            return evicted
        }
        for (candidate, name) in evicted { unlink(filePath(candidate, name: name)) }
    }

    static func openForAppending(_ path: String, directory: String) throws(ConversationError) -> FileHandle {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw ConversationError(.storeNotWritable, "cannot make \(directory): \(error)")
        }
        let fd = Glibc.open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw ConversationError(.storeNotWritable, "cannot open \(path): \(String(cString: strerror(errno)))") }
        return FileHandle(fileDescriptor: fd, closeOnDealloc: true)
    }

    static func fileSize(_ path: String) -> Int64 {
        var status = stat()
        return stat(path, &status) == 0 ? Int64(status.st_size) : 0
    }
}

/// When other speakers' files are downloaded (``StoreConfiguration/fileDownload``).
public enum FileDownload: Sendable, Hashable {
    /// Only when asked (``ConversationStore/downloadFile(of:progress:)``).
    case onDemand
    /// During ``ConversationStore/sync()``, each file of at most this many bytes.
    case duringSync(maximumBytes: Int64)
}

extension SyncEngine {
    /// A file of the local speaker's that one of these messages carries and that is not wholly
    /// uploaded yet: where it is in the cache, and what is left.
    private struct PendingUpload {
        var key: Data
        var chunks: [AssetReference]
        var uploaded: Int
        var size: Int64
        var path: String
    }

    private nonisolated func pendingUpload(_ record: Record) async -> PendingUpload? {
        guard record.recordType == ChatRecords.messageType, !record.isDeleted else { return nil }
        let zone = record.id.zone.rawValue, name = record.id.name
        let row = try? await database.read { db in
            try db.first("""
                SELECT a.file_key, a.chunks, a.uploaded, m.file_name, m.file_size FROM attachments a JOIN messages m ON m.zone = a.zone AND m.name = a.name
                WHERE a.zone = ? AND a.name = ? AND a.uploaded < length(a.chunks) / 32
                """, [zone, name]) { ($0.blob(0), $0.blob(1), Int($0.int(2)), $0.optionalText(3) ?? "", $0.optionalInt(4) ?? 0) }
        }
        guard let (key, hashes, uploaded, fileName, size) = row ?? nil, let chunks = AttachmentManifest.chunks(fromHashes: hashes, size: size) else { return nil }
        return PendingUpload(key: key, chunks: chunks, uploaded: uploaded, size: size, path: "\(files)/\(zone)/\(name)/\(fileName)")
    }

    /// The messages among `records` whose file is not wholly uploaded and no longer here whole
    /// (the cache emptied by hand): they must never go out, as nobody could download the file.
    nonisolated func filesGone(_ records: [Record]) async -> Set<RecordID> {
        var gone = Set<RecordID>()
        for record in records {
            // A file key damaged in the store cannot seal the file: nobody could read it either.
            if let pending = await pendingUpload(record), ConversationStore.fileSize(pending.path) != pending.size || pending.key.count != Sodium.aeadKeyLength {
                gone.insert(record.id)
            }
        }
        return gone
    }

    /// Uploads what is left of the local speaker's files that these records' messages carry,
    /// chunk by chunk from the cache — the next one read and encrypted while one goes
    /// (``ConversationStore/fileTransfersInFlight``) —, noting how far the backend took them (at least every half second, and
    /// at the end), so a cut resumes about where it happened.
    /// - Throws: the backend's error; ``RecordZoneError/Code/ioError`` when the cached file
    ///   cannot be read or changed since it was sent.
    func uploadFiles(of records: [Record]) async throws(RecordZoneError) {
        for record in records {
            guard let pending = await pendingUpload(record) else { continue }
            guard pending.key.count == Sodium.aeadKeyLength else { throw RecordZoneError(.ioError, "the file key of \(pending.path) is damaged in the store") }
            let zone = record.id.zone.rawValue, name = record.id.name
            guard let source = FileHandle(forReadingAtPath: pending.path) else { throw RecordZoneError(.ioError, "cannot read \(pending.path)") }
            defer { try? source.close() }
            do {
                try source.seek(toOffset: UInt64(pending.uploaded) * UInt64(AttachmentManifest.chunkSize))
            } catch {
                throw RecordZoneError(.ioError, "cannot read \(pending.path): \(error)")
            }
            let count = AttachmentManifest.chunkCount(size: pending.size), backend = self.backend
            var inFlight: [Task<Result<Void, RecordZoneError>, Never>] = []
            defer { inFlight.forEach { $0.cancel() } }
            var done = pending.uploaded, lastNote = ContinuousClock.now, next = pending.uploaded
            while done < count {
                if next < count, inFlight.count < ConversationStore.fileTransfersInFlight.upload {
                    let plainSize = AttachmentManifest.plainSize(ofChunk: next, size: pending.size)
                    guard let plain = try? source.read(upToCount: plainSize), plain.count == plainSize else {
                        throw RecordZoneError(.ioError, "cannot read chunk \(next + 1) of \(pending.path)")
                    }
                    let expected = pending.chunks[next]
                    let sealed = AttachmentManifest.sealChunk(plain, index: next, key: pending.key)
                    inFlight.append(Task { () async -> Result<Void, RecordZoneError> in
                        do throws(RecordZoneError) {
                            _ = try await backend.putAsset(sealed, expected: expected)
                            return .success(())
                        } catch {
                            return .failure(error)
                        }
                    })
                    next += 1
                    continue
                }
                // The oldest upload in flight, answered: one more chunk done, in order.
                let failure: RecordZoneError?
                switch await inFlight.removeFirst().value {
                case .success:
                    done += 1
                    failure = nil
                case .failure(let error) where error.code == .assetCorrupt:
                    failure = RecordZoneError(.ioError, "\(pending.path) changed since it was sent (chunk \(done + 1))")
                case .failure(let error):
                    failure = error
                }
                if failure != nil || done == count || ContinuousClock.now - lastNote > .milliseconds(500) {
                    let uploaded = Int64(done)
                    do {
                        try await database.write(.synced) { applier in
                            try applier.db.execute("UPDATE attachments SET uploaded = max(uploaded, ?) WHERE zone = ? AND name = ?", [uploaded, zone, name])
                        }
                    } catch {
                        throw RecordZoneError(.ioError, "cannot note an uploaded chunk: \(error)")
                    }
                    lastNote = .now
                }
                if let failure { throw failure }
            }
        }
    }
}
