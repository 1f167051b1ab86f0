import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An exclusive `flock` on a device's lock file, held for as long as this value lives, so two
/// processes never write as the same device (which would fork its sequence).
final class DeviceLock: Sendable {
    private let fd: Int32

    /// - Throws: ``RecordZoneError/Code/deviceInUse`` when another process holds the lock.
    init(path: String, device: String) throws(RecordZoneError) {
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw FileIO.error("cannot open lock file", path) }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            close(fd)
            if code == EWOULDBLOCK {
                throw RecordZoneError(.deviceInUse, "device '\(device)' is already writing to this folder in another process (lock \(path))")
            }
            throw FileIO.error("cannot lock", path, errno: code)
        }
        let pid = Data("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        try? FileIO.writeAll(fd, pid, path: path)
        self.fd = fd
    }

    deinit {
        flock(fd, LOCK_UN)
        close(fd)
    }
}
