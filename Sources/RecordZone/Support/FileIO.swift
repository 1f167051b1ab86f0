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
        let directory = (path as NSString).deletingLastPathComponent
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
    static func makeDirectory(_ path: String) throws(RecordZoneError) {
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        } catch {
            throw RecordZoneError(.ioError, "cannot create directory \(path): \(error.localizedDescription)")
        }
    }

    /// The names in a directory, or an empty list when it does not exist.
    static func list(_ path: String) throws(RecordZoneError) -> [String] {
        guard let dir = opendir(path) else {
            if errno == ENOENT { return [] }
            throw error("cannot list", path)
        }
        defer { closedir(dir) }
        var names = [String]()
        while let entry = readdir(dir) {
            let name = withUnsafePointer(to: entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: Int(NAME_MAX) + 1) { String(cString: $0) }
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    static func exists(_ path: String) -> Bool {
        access(path, F_OK) == 0
    }
}
