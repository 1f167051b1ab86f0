import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// POSIX file operations with the durability the filesystem zone needs: write to a temporary
/// name, fsync, rename, fsync the directory. Errors carry `errno`'s text.
enum FileIO {
    static func error(_ what: String, _ path: String, errno code: Int32 = errno) -> RecordZoneError {
        RecordZoneError(.ioError, "\(what) \(path): \(String(cString: strerror(code)))")
    }

    /// Writes `data` to `path` durably: a temporary file beside it, fsync, rename, fsync of the
    /// directory. With `replacing: false` the call fails when `path` exists (link, not rename).
    static func writeAtomically(_ data: Data, to path: String, mode: mode_t = 0o644, replacing: Bool = true) throws(RecordZoneError) {
        let directory = Self.directory(of: path)
        let name = (path as NSString).lastPathComponent
        let temporary = "\(directory)/.\(name).\(getpid()).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { throw error("cannot create", temporary) }
        var closed = false
        defer { if !closed { close(fd) } }
        try writeAll(fd, data, path: temporary)
        guard fsync(fd) == 0 else { throw error("cannot fsync", temporary) }
        closed = true
        guard close(fd) == 0 else { throw error("cannot close", temporary) }
        if replacing {
            guard rename(temporary, path) == 0 else {
                let code = errno
                unlink(temporary)
                throw error("cannot rename onto", path, errno: code)
            }
        } else {
            guard link(temporary, path) == 0 else {
                let code = errno
                unlink(temporary)
                throw error("cannot create", path, errno: code)
            }
            unlink(temporary)
        }
        try syncDirectory(directory)
    }

    /// The directory a path's file is in: `.` for a bare file name (`--state st`).
    static func directory(of path: String) -> String {
        let directory = (path as NSString).deletingLastPathComponent
        return directory.isEmpty ? "." : directory
    }

    static func writeAll(_ fd: Int32, _ data: Data, path: String) throws(RecordZoneError) {
        let failure: Int32? = data.withUnsafeBytes { raw -> Int32? in
            var offset = 0
            while offset < raw.count {
                let n = Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
                if n < 0 {
                    if errno == EINTR { continue }
                    return errno
                }
                offset += n
            }
            return nil
        }
        if let code = failure { throw error("cannot write", path, errno: code) }
    }

    static func syncDirectory(_ directory: String) throws(RecordZoneError) {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw error("cannot open directory", directory) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw error("cannot fsync directory", directory) }
    }

    static func read(_ path: String) throws(RecordZoneError) -> Data {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw error("cannot open", path) }
        defer { close(fd) }
        var result = Data()
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = Glibc.read(fd, &buffer, buffer.count)
            if n < 0 {
                if errno == EINTR { continue }
                throw error("cannot read", path)
            }
            if n == 0 { break }
            result.append(buffer, count: n)
        }
        return result
    }

    /// Creates the directory and its parents; an existing directory is fine.
    /// Creates a folder and its missing parents; a part of the path that is a file, or any other
    /// failure, is a plain-text ``RecordZoneError/Code/ioError``.
    static func makeDirectory(_ path: String) throws(RecordZoneError) {
        var prefix = path.hasPrefix("/") ? "" : "."
        for part in path.split(separator: "/", omittingEmptySubsequences: true) {
            prefix += "/" + part
            if mkdir(prefix, 0o755) == 0 { continue }
            let code = errno
            var info = stat()
            guard code == EEXIST, stat(prefix, &info) == 0 else { throw error("cannot create the folder", prefix, errno: code) }
            guard info.st_mode & S_IFMT == S_IFDIR else {
                throw RecordZoneError(.ioError, "\(prefix) is a file, not a folder")
            }
        }
    }

    /// The names in a directory, or an empty list when it does not exist.
    static func list(_ path: String) throws(RecordZoneError) -> [String] {
        guard let dir = opendir(path) else {
            if errno == ENOENT { return [] }
            if errno == ENOTDIR { throw RecordZoneError(.ioError, "\(path) is not a folder (it, or a folder above it, is a file)") }
            throw error("cannot list", path)
        }
        defer { closedir(dir) }
        var names = [String]()
        while let entry = readdir(dir) {
            // d_name is read in place: a dirent is only as long as its name, so copying the
            // whole 256-byte field could read past the end of readdir's buffer.
            let name = String(cString: UnsafeRawPointer(entry).advanced(by: direntNameOffset).assumingMemoryBound(to: CChar.self))
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    private static let direntNameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name) ?? 19

    /// A file's size and modification time as text, to tell whether it changed; nil when absent.
    static func stamp(_ path: String) -> String? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return "\(info.st_size):\(info.st_mtim.tv_sec).\(info.st_mtim.tv_nsec)"
    }

    static func exists(_ path: String) -> Bool {
        access(path, F_OK) == 0
    }
}
