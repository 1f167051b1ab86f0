import Foundation
import Synchronization

/// Tells when a zone folder's tree changes, through Linux inotify: every folder under
/// `<root>/zones` is watched (a new one as soon as it appears) for files created, completed,
/// renamed into place or deleted. Where inotify is not available (some network file systems
/// never report remote changes; a kernel without it), ``start(root:)`` gives nil and the caller
/// polls. Events are coalesced: a burst of writes is one notification.
final class FolderWatcher: Sendable {
    private let descriptor: Int32
    private let root: String
    /// Watched folders by watch descriptor.
    private let watched = Mutex<[Int32: String]>([:])
    private let stopped = Atomic<Bool>(false)

    private static let mask = UInt32(IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_DELETE_SELF)

    private init(descriptor: Int32, root: String) {
        self.descriptor = descriptor
        self.root = root
    }

    /// Watches `root` and everything under its `zones` folder; nil when inotify cannot.
    static func start(root: String) -> (FolderWatcher, AsyncStream<Void>)? {
        let fd = inotify_init1(Int32(IN_CLOEXEC))
        guard fd >= 0 else { return nil }
        let watcher = FolderWatcher(descriptor: fd, root: root)
        guard watcher.add(root), watcher.addTree(root + "/zones") || !FileManager.default.fileExists(atPath: root + "/zones") else {
            close(fd)
            return nil
        }
        let (stream, continuation) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        let thread = Thread { watcher.readEvents(continuation) }
        thread.name = "convkit.folder-watcher"
        thread.start()
        return (watcher, stream)
    }

    /// Stops watching: within 200 ms the reading thread ends, closes the descriptor, and the
    /// stream finishes.
    func stop() {
        stopped.store(true, ordering: .relaxed)
    }

    @discardableResult
    private func add(_ path: String) -> Bool {
        let wd = inotify_add_watch(descriptor, path, Self.mask)
        guard wd >= 0 else { return false }
        watched.withLock { $0[wd] = path }
        return true
    }

    /// Watches a folder and every folder below it.
    @discardableResult
    private func addTree(_ path: String) -> Bool {
        guard add(path) else { return false }
        for name in (try? FileIO.list(path)) ?? [] where !name.hasPrefix(".") {
            var info = stat()
            let child = path + "/" + name
            if stat(child, &info) == 0, info.st_mode & S_IFMT == S_IFDIR { addTree(child) }
        }
        return true
    }

    private func readEvents(_ continuation: AsyncStream<Void>.Continuation) {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        defer {
            close(descriptor)
            continuation.finish()
        }
        while !stopped.load(ordering: .relaxed) {
            var waiting = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            let ready = poll(&waiting, 1, 200)
            if ready == 0 || (ready < 0 && errno == EINTR) { continue }
            guard ready > 0 else { break }
            let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            var offset = 0
            var changed = false
            while offset + MemoryLayout<inotify_event>.size <= count {
                let (wd, mask, length) = buffer.withUnsafeBytes { raw in
                    let event = raw.loadUnaligned(fromByteOffset: offset, as: inotify_event.self)
                    return (event.wd, event.mask, Int(event.len))
                }
                let nameStart = offset + MemoryLayout<inotify_event>.size
                let name = String(decoding: buffer[nameStart..<min(count, nameStart + length)].prefix { $0 != 0 }, as: UTF8.self)
                offset = nameStart + length
                // Temporary files (dot-files) come and go with every write: only what readers see counts.
                if name.hasPrefix(".") { continue }
                changed = true
                if mask & UInt32(IN_ISDIR) != 0, mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0,
                    let parent = watched.withLock({ $0[wd] }) {
                    addTree(parent + "/" + name)
                }
                if mask & UInt32(IN_IGNORED) != 0 { watched.withLock { _ = $0.removeValue(forKey: wd) } }
                if wd >= 0, watched.withLock({ $0[wd] }) == root, name == "zones", mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0 {
                    addTree(root + "/zones")
                }
            }
            if changed { continuation.yield() }
        }
    }
}

extension FileSystemBackend: LiveChanges {
    /// The folder's notifications as a stream: any change in the tree is
    /// ``LiveChange/moved(_:)`` of any zone (nil), and the reader looks at the whole folder.
    /// - Throws: ``RecordZoneError/Code/routeNotFound`` where the file system gives none
    ///   (the reader polls instead).
    /// Isolated: the walk of the tree that sets the watches runs on the folder's own queue.
    public func openChangeStream() async throws(RecordZoneError) -> any ChangeStream {
        guard let (watcher, events) = FolderWatcher.start(root: layout.root) else {
            throw RecordZoneError(.routeNotFound, "the file system of \(layout.root) gives no change notifications")
        }
        let stream = MovedZones(closing: { watcher.stop() })
        Task { [weak stream] in
            for await _ in events { stream?.moved(nil) }
        }
        return stream
    }
}
