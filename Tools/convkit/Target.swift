import ConversationKit
import Foundation
import RecordZone
import Synchronization
import ToolSupport

/// A failure (exit 1), printed as `Error: …`.
/// The options that choose what a command works on.
enum Targets {
    static let store = Option.valued("store", "dir", "The local store. (default: $CONVKIT_STORE, else $XDG_DATA_HOME/convkit/store)")
    static let zoneDir = Option.valued("zone-dir", "dir", "A folder zone: sync through it, or inspect it directly.")
    static let server = Option.valued("server", "url", "A zone server: sync through it, or inspect it directly.")
    static let key = Option.valued("key", "file", "The key to sign requests to a server with. (default: the store's)")
    static let device = Option.valued("device", "label", "This device's name: what a folder's files and the speaker's device list call it. (default: the host name)")
    static let json = Option.flag("json", "Print JSON.")

    /// The options of a command that works on the store (and syncs through its backend).
    static let storeOptions = [store, zoneDir, server, device]
    /// The options of an inspection command: a store, a folder zone or a server.
    static let inspectOptions = [store, zoneDir, server, key, json]
}

/// The parsed arguments of one command, with what the targets resolve to.
struct Context {
    let arguments: ParsedArguments

    var json: Bool { arguments.has("json") }

    var storePath: String {
        if let path = arguments.value("store") ?? ProcessInfo.processInfo.environment["CONVKIT_STORE"].flatMap({ $0.isEmpty ? nil : $0 }) { return path }
        let base = ProcessInfo.processInfo.environment["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? (NSHomeDirectory() + "/.local/share")
        return base + "/convkit/store"
    }

    var settingsPath: String { StoreSettings.path(inStore: storePath) }

    func settings() -> StoreSettings { StoreSettings.load(fromStore: storePath) }

    /// Records the backend the options name (`--server`, or `--zone-dir` with `--device`) and the
    /// store's speaker in the store's convkit.json (mode 0600), for the other commands; what the
    /// options do not name stays.
    func rememberBackend(identity: String? = nil) throws {
        let folder = arguments.value("zone-dir").map(Self.absolute), server = arguments.value("server")
        var settings = settings()
        if folder != nil || server != nil {
            settings.server = server
            settings.zoneDir = folder
            settings.device = folder == nil ? nil : arguments.value("device") ?? settings.device ?? ChatCommands.defaultDevice()
        }
        settings.identity = identity ?? settings.identity
        let data = try JSONEncoder().encode(settings)
        guard FileManager.default.createFile(atPath: settingsPath, contents: data, attributes: [.posixPermissions: 0o600]) else {
            throw ToolFailure("cannot write \(settingsPath)")
        }
    }

    /// The backend the store syncs through: the options, or what `init` recorded.
    func backend() throws -> BackendFactory {
        if arguments.value("zone-dir") != nil, arguments.value("server") != nil { throw UsageError("give one of --zone-dir and --server") }
        if let label = arguments.value("device") {
            do throws(RecordZoneError) { try FileSystemBackend.checkLabel(label) } catch { throw UsageError("--device: \(error.message)") }
        }
        let saved = settings()
        let label = arguments.value("device") ?? saved.device ?? ChatCommands.defaultDevice()
        // Beside a daemon that syncs the same store (and holds its folder device), read the
        // folder as an observer: the daemon pushes what this process commits.
        if let folder = arguments.value("zone-dir") { return .folder(Self.absolute(folder), device: label, observingWhileInUse: true) }
        if let server = arguments.value("server") { return .server(try Self.url(server)) }
        if let folder = saved.zoneDir { return .folder(folder, device: saved.device ?? label, observingWhileInUse: true) }
        if let server = saved.server { return .server(try Self.url(server)) }
        throw ToolFailure("no backend for \(storePath): give --server or --zone-dir (or set one with 'convkit init')")
    }

    /// A path made absolute against the working directory (kept in convkit.json).
    static func absolute(_ path: String) -> String {
        path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
    }

    static func url(_ text: String) throws -> URL {
        guard let url = URL(string: text), url.scheme == "http" || url.scheme == "https", url.host != nil else {
            throw UsageError("--server takes an http:// or https:// URL, not '\(text)'")
        }
        return url
    }

    /// The store, which must exist and have a local speaker; `readOnly` for a command that only
    /// looks (nothing is created, migrated or written).
    func store(readOnly: Bool = false) throws -> ConversationStore {
        guard FileManager.default.fileExists(atPath: storePath + "/store.sqlite") else {
            throw ToolFailure("no store at \(storePath) (create one with 'convkit init')")
        }
        let store: ConversationStore
        if readOnly {
            store = try ConversationStore.inspecting(directory: storePath)
        } else {
            store = try ConversationStore(directory: storePath, backend: (try? backend()) ?? .memory(InMemoryBackend()))
        }
        guard store.localSpeakerIdentifier != nil else { throw ToolFailure("the store at \(storePath) has no local speaker (run 'convkit init')") }
        return store
    }

    /// The store, with the backend it syncs through (an error when it has none).
    func syncingStore() throws -> ConversationStore {
        _ = try backend()
        return try store()
    }

    /// What an inspection reads: a folder zone or a server when one is given, else the store.
    enum Source {
        case store(ConversationStore)
        case backend(any RecordZoneBackend, name: String)
    }

    func inspectionSource() throws -> Source {
        let policy = ConversationStore.recordPolicy()
        if let folder = arguments.value("zone-dir") {
            return .backend(try FileSystemBackend(root: folder, device: nil, policy: policy), name: folder)
        }
        if let server = arguments.value("server") {
            let url = try Self.url(server)
            let keyPath = arguments.value("key") ?? [storePath + "/device.key", storePath + "/speaker.key"].first { FileManager.default.fileExists(atPath: $0) }
            guard let keyPath else { throw ToolFailure("a server needs a key to sign with: give --key (or a --store with one)") }
            let key = try KeyFile.load(from: keyPath)
            let identity = (try? store().localSpeakerIdentifier) ?? nil
            guard let identity = identity ?? arguments.value("identity") else {
                throw ToolFailure("a server needs the identity the key belongs to: use a --store set up with it")
            }
            return .backend(HTTPBackend(url: url, identity: identity, key: key, policy: policy), name: server)
        }
        return .store(try store(readOnly: true))
    }
}

/// Output: text for people, or JSON with `--json`.
enum Output {
    /// One line for a person. Everything it prints may hold text from someone else (names,
    /// content, tags, zone and record names), so the whole line passes ``DisplayText/safe(_:)``:
    /// no control, escape or bidi character reaches the terminal. `--json` is exact instead.
    static func line(_ text: String) { FileHandle.standardOutput.write(Data((DisplayText.safe(text) + "\n").utf8)) }

    /// A text attribute (SGR), used only where ``colors`` says so.
    enum Style: String { case bold = "1", dim = "2", italic = "3" }

    /// Whether output carries attributes: `--color always|never`, or (auto) when standard output
    /// is a terminal, `NO_COLOR` is unset or empty (no-color.org) and `TERM` is not `dumb`.
    static let colors = Atomic<Bool>(false)

    static func chooseColors(_ choice: String) {
        let environment = ProcessInfo.processInfo.environment
        let auto = isatty(STDOUT_FILENO) == 1 && (environment["NO_COLOR"] ?? "").isEmpty && environment["TERM"] != "dumb"
        colors.store(choice == "always" || (choice == "auto" && auto), ordering: .relaxed)
    }

    /// `text` (made safe first) in `style`, when output carries attributes.
    static func styled(_ text: String, _ style: Style) -> String {
        let safe = DisplayText.safe(text)
        guard colors.load(ordering: .relaxed), !safe.isEmpty else { return safe }
        return "\u{1B}[\(style.rawValue)m\(safe)\u{1B}[0m"
    }

    /// One line of parts, each made safe on its own and styled where it says.
    static func line(_ parts: [(text: String, style: Style?)]) {
        let text = parts.map { part in part.style.map { styled(part.text, $0) } ?? DisplayText.safe(part.text) }.joined()
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    /// What a command that changes something did: `json` with --json, else `line`.
    static func result(_ context: Context, _ json: [String: Any], _ line: String) throws {
        if context.json { try Output.json(json) } else { Output.line(line) }
    }

    /// Text the tool made itself from its own declarations (a script, a manual page), nothing
    /// of a record's or a peer's in it: written as it is.
    static func text(_ text: String) { FileHandle.standardOutput.write(Data(text.utf8)) }

    static func json(_ value: Any) throws {
        let data = try JSONSerialization.data(withJSONObject: value, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }

    static func time(_ date: Date) -> String { date.formatted(.iso8601) }

    /// A size for people: `512 B`, `1.5 KiB`, `200.0 MiB`, `1.0 GiB`.
    static func bytes(_ count: Int64) -> String {
        guard count >= 1024 else { return "\(count) B" }
        var value = Double(count) / 1024, unit = 0
        while value >= 1024, unit < 2 {
            value /= 1024
            unit += 1
        }
        return String(format: "%.1f", value) + " " + ["KiB", "MiB", "GiB"][unit]
    }

    static func hex(_ data: Data) -> String { data.map { String(format: "%02x", $0) }.joined() }

    /// A progress bar on a terminal (standard error), nothing when it is not one.
    final class Progress: @unchecked Sendable {
        private let lock = NSLock()
        private var total: Int
        private let label: String
        private let enabled = isatty(STDERR_FILENO) == 1
        private var shown = ""

        init(_ label: String, total: Int) {
            self.label = label
            self.total = max(total, 1)
        }

        func update(_ done: Int) { update(done, of: nil, note: "") }

        func update(_ done: Int, of total: Int?, note: String) {
            guard enabled else { return }
            lock.withLock {
                if let total { self.total = max(total, 1) }
                let percent = min(100, done * 100 / self.total)
                let filled = percent / 5
                let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: 20 - filled)
                let line = "\(label) [\(bar)] \(percent)%\(note.isEmpty ? "" : " " + DisplayText.safe(note))"
                guard line != shown else { return }
                shown = line
                FileHandle.standardError.write(Data("\r\u{1B}[K\(line)".utf8))
            }
        }

        func finish() {
            guard enabled else { return }
            lock.withLock {
                guard !shown.isEmpty else { return }
                FileHandle.standardError.write(Data("\r\u{1B}[K".utf8))
            }
        }
    }
}
