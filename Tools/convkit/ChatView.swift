import ConversationKit
import Foundation
import Synchronization
import RecordZone
import ToolSupport

/// `convkit chat ID`: one conversation — with a speaker, or a group (its id, or its name with
/// `--group`) — on a terminal, in plain ANSI. The newest messages with
/// names, times, edits, read state, files, what a reply answers and the reactions; who else is
/// typing and whether they are online (through a zone server); new ones appear as the store's continuous sync (or a
/// daemon writing the same store) brings them; a typed line and Enter sends; unread messages
/// are marked read as they are shown; Ctrl-C leaves and puts the terminal back.
enum ChatView {
    static let command = ToolCommand(Command("convkit chat", "Chat with a speaker or in a group on this terminal (Ctrl-C leaves).",
                                             positionals: [Positional("id", "The speaker to chat with, or a group's id (g-…).")],
                                             options: Targets.storeOptions + [ChatCommands.newRecipient, ChatCommands.groupFlag]),
                                     run: run)

    /// What the screen shows, and the line being typed.
    final class Screen: Sendable {
        struct State {
            var messages: [Message] = []
            var typed: [UInt8] = []
            var status = ""
            /// The others typing now (a zone server's live channel; never over a folder).
            var typing: [String] = []
            /// Whether the others are online, and when last seen (likewise).
            var presence: [Presence] = []
            /// Per message shown: what it answers (a line above it) and its reactions, summed up.
            var parents: [MessageID: String] = [:]
            var reactions: [MessageID: String] = [:]
            /// Speakers' names as shown ("Alice (alice)"), by identifier; looked up again as
            /// profiles arrive.
            var names: [String: String] = [:]
        }
        let state = Mutex(State())
        let title: String

        init(title: String) {
            self.title = title
        }

        /// Redraws everything: header, the messages that fit, the status line and the prompt.
        func draw() {
            let (rows, columns) = Self.size()
            let state = state.withLock { $0 }
            var out = "\u{1B}[H\u{1B}[2J"
            let presence = Self.summary(of: state.presence, names: state.names)
            out += Output.styled(title, .bold) + (presence.isEmpty ? "" : "  " + Output.styled(presence, .dim)) + "  (Enter sends, /quit or Ctrl-C leaves)\r\n"
            let room = max(1, rows - 5)
            // Each reply takes a line more, for what it answers: the newest that fit.
            var shown: [Message] = [], used = 0
            for message in state.messages.reversed() {
                let lines = state.parents[message.id] == nil ? 1 : 2
                guard used + lines <= room else { break }
                shown.insert(message, at: 0)
                used += lines
            }
            for message in shown {
                if let parent = state.parents[message.id] { out += String(DisplayText.safe("  ↪ " + parent).prefix(columns)) + "\r\n" }
                let time = Self.clock.string(from: message.spokenAt)
                var notes = [String]()
                if message.isWaitingForKey { notes.append("waiting for its key") }
                if let file = message.attachment { notes.append("file: \(file.name), \(Output.bytes(file.size)): convkit download \(message.id.reference)") }
                if let reactions = state.reactions[message.id] { notes.append(reactions) }
                if message.editedAt != nil { notes.append("edited") }
                if message.readAt != nil { notes.append("read") } else if message.isDelivered { notes.append("delivered") }
                switch message.syncState {
                case .pending: notes.append("sending")
                case .failed(let reason): notes.append("failed: \(reason)")
                case .synced: break
                }
                // Names, content and reasons come from others: made safe before they reach the
                // terminal (this line's own escape codes are added around them).
                let line = "[\(time)] \(state.names[message.speaker] ?? message.speaker): \(message.isDeleted ? "(a deleted message)" : message.content)" + (notes.isEmpty ? "" : "  (" + notes.joined(separator: ", ") + ")")
                out += String(DisplayText.safe(line).prefix(columns)) + "\r\n"
            }
            if !state.typing.isEmpty {
                let who = state.typing.map { state.names[$0] ?? $0 }
                let line = who.count == 1 ? "\(who[0]) is typing…" : "\(who.joined(separator: ", ")) are typing…"
                out += "\u{1B}[\(rows - 2);1H" + Output.styled(String(DisplayText.safe(line).prefix(columns)), .italic)
            }
            out += "\u{1B}[\(rows - 1);1H" + Output.styled(String(DisplayText.safe(state.status).prefix(columns)), .dim)
            out += "\u{1B}[\(rows);1H> \(DisplayText.safe(String(decoding: state.typed, as: UTF8.self)))"
            FileHandle.standardOutput.write(Data(out.utf8))
        }

        /// "online", "last seen 14:05" (a day before: "last seen 2026-11-30 14:05") for one other;
        /// "2 of 5 online: Bob (bob), Carol (carol)" for several; nothing when nobody was seen.
        static func summary(of presence: [Presence], names: [String: String], now: Date = Date()) -> String {
            if presence.count == 1, let one = presence.first {
                if one.isOnline { return "online" }
                guard let seen = one.lastSeen else { return "" }
                return "last seen " + (Calendar.current.isDate(seen, inSameDayAs: now) ? clock : day).string(from: seen)
            }
            let online = presence.filter(\.isOnline).map { names[$0.identity] ?? $0.identity }
            return online.isEmpty ? "" : "\(online.count) of \(presence.count) online: " + online.joined(separator: ", ")
        }

        static let day: DateFormatter = {
            let formatter = DateFormatter()
            formatter.dateFormat = "yyyy-MM-dd HH:mm"
            return formatter
        }()

        static let clock: DateFormatter = {
            let formatter = DateFormatter()
            formatter.dateFormat = "HH:mm"
            return formatter
        }()

        static func size() -> (rows: Int, columns: Int) {
            var size = winsize()
            guard ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0, size.ws_row > 0 else { return (24, 80) }
            return (Int(size.ws_row), Int(size.ws_col))
        }
    }

    /// Waits for `task` to end, or for `limit` (the process exits next: nothing outlives it).
    static func finish(_ task: Task<String, Never>, within limit: Duration) async {
        let (ended, continuation) = AsyncStream.makeStream(of: Void.self)
        Task { _ = await task.value; continuation.yield() }
        Task { try? await Task.sleep(for: limit); continuation.yield() }
        for await _ in ended { break }
    }

    static func run(_ context: Context) async throws {
        guard let other = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        let store = try context.store()
        let group = try ChatCommands.group(other, store, context)
        if group == nil { try await ChatCommands.requireKnown(other, in: store, context) }
        guard isatty(STDIN_FILENO) == 1 else { throw ToolFailure("convkit chat needs a terminal") }
        let backend = try? context.backend()
        let conversation: Conversation
        if let group { conversation = group } else { conversation = try await store.conversation(with: other) }
        let local = store.localSpeakerIdentifier ?? ""
        // Everyone who may speak here: the other speaker, or the group's members now.
        let speakers = Set([local] + (try group.map { try store.members(of: $0.id).map(\.speaker) } ?? [other]))
        let names = Dictionary(uniqueKeysWithValues: speakers.map { id in
            (id, ChatCommands.shown((try? store.speaker(fromRef: SpeakerRef(identifier: id))?.name) ?? nil, id))
        })
        let title = group.map { "Group \($0.groupName ?? $0.id) (\(speakers.count) members)" } ?? "Chat with \(names[other] ?? other)"
        let screen = Screen(title: title)
        screen.state.withLock { $0.names = names }

        // Continuous sync in this process, unless another process (a daemon) already syncs the
        // store: then what it writes is read every half second.
        let syncing = Task {
            guard backend != nil else { return "no backend: showing the store only" }
            do { try await store.run() } catch { return "not syncing here (\(error)): showing what another process syncs" }
            return ""
        }
        let terminal = RawTerminal()
        defer { terminal.restore() }
        screen.state.withLock { $0.status = backend == nil ? "no backend" : "syncing" }

        let refresher = Task {
            var lastShown: [Message] = [], lastNotes: [[MessageID: String]] = []
            while !Task.isCancelled {
                // What each message answers and its reactions (a reaction changes no message).
                let page = try? store.messages(in: conversation.id, limit: 200, includeDeleted: true)
                var parents: [MessageID: String] = [:], reactions: [MessageID: String] = [:]
                for message in page?.messages ?? [] where !message.isDeleted {
                    switch try? store.parent(of: message.id) {
                    case .message(let parent)?:
                        parents[message.id] = "\(screen.state.withLock { $0.names[parent.speaker] } ?? parent.speaker): \(parent.content.prefix(60))\(parent.content.count > 60 ? "…" : "")"
                    case .deleted?: parents[message.id] = "(a deleted message)"
                    case .notHeld?: parents[message.id] = "(a message not synced yet)"
                    default: break
                    }
                    if let held = try? store.reactions(to: message.id), !held.isEmpty { reactions[message.id] = ChatCommands.summary(of: held) }
                }
                if let page, page.messages != lastShown || [parents, reactions] != lastNotes {
                    lastShown = page.messages
                    lastNotes = [parents, reactions]
                    // Names of those without one yet (a profile that arrived since, a new member).
                    let known = screen.state.withLock { $0.names }
                    var names = known
                    for id in Set(page.messages.map(\.speaker)) where known[id].map({ $0 == id }) ?? true {
                        names[id] = ChatCommands.shown((try? store.speaker(fromRef: SpeakerRef(identifier: id))?.name) ?? nil, id)
                    }
                    screen.state.withLock {
                        $0.messages = page.messages
                        $0.names = names
                        $0.parents = parents
                        $0.reactions = reactions
                    }
                    screen.draw()
                    if page.messages.contains(where: { $0.speaker != local && $0.readAt == nil }) {
                        try? await store.markAllAsRead(in: conversation.id)
                    }
                }
                try? await Task.sleep(for: .milliseconds(200))
            }
        }
        // Who else types here, live (nothing over a folder).
        let typingWatcher = Task {
            for await typists in store.typingSpeakers(in: conversation.id) {
                screen.state.withLock { $0.typing = typists }
                screen.draw()
            }
        }
        // Whether the others are online (nothing over a folder).
        let presenceWatcher = Task {
            for await presence in store.presence(in: conversation.id) {
                screen.state.withLock { $0.presence = presence }
                screen.draw()
            }
        }
        let statusWatcher = Task {
            let status = await syncing.value
            if !status.isEmpty {
                screen.state.withLock { $0.status = status }
                screen.draw()
            }
        }
        screen.draw()
        // Keys, one byte at a time, off the cooperative pool.
        let keys = AsyncStream<UInt8> { continuation in
            let thread = Thread {
                var byte: UInt8 = 0
                while read(STDIN_FILENO, &byte, 1) == 1 { continuation.yield(byte) }
                continuation.finish()
            }
            thread.start()
        }
        func leave() async -> Never {
            refresher.cancel()
            statusWatcher.cancel()
            typingWatcher.cancel()
            presenceWatcher.cancel()
            syncing.cancel()
            // The sync's last word (that its person went away), for at most 3 s.
            await finish(syncing, within: .seconds(3))
            terminal.restore()
            exit(0)
        }
        for await key in keys {
            switch key {
            case 3, 4:  // Ctrl-C, Ctrl-D
                await leave()
            case 13, 10:  // Enter
                var line = screen.state.withLock { state -> String in
                    defer { state.typed = [] }
                    return String(decoding: state.typed, as: UTF8.self)
                }
                // A line starting with / is a command, never sent; // sends a line that starts with /.
                if line.hasPrefix("/"), !line.hasPrefix("//") {
                    switch line.trimmingCharacters(in: .whitespaces) {
                    case "/quit", "/exit", "/q": await leave()
                    default: screen.state.withLock { $0.status = "unknown command \(line.prefix(40)): /quit leaves; //text sends /text" }
                    }
                    let id = conversation.id
                    Task { try? await store.setTyping(false, in: id) }
                    screen.draw()
                    continue
                }
                if line.hasPrefix("//") { line.removeFirst() }
                if !line.trimmingCharacters(in: .whitespaces).isEmpty {
                    do {
                        if let group { _ = try await store.send(line, toGroup: group.id) } else { _ = try await store.send(line, to: other) }
                    } catch {
                        screen.state.withLock { $0.status = "not sent: \(error)" }
                    }
                }
            case 127, 8:  // Backspace
                // One character: its UTF-8 continuation bytes, then its first byte.
                screen.state.withLock { state in
                    while let last = state.typed.last, last & 0xC0 == 0x80 { state.typed.removeLast() }
                    if !state.typed.isEmpty { state.typed.removeLast() }
                }
            case 32...126, 128...255:
                screen.state.withLock { $0.typed.append(key) }
            default:
                continue
            }
            // Typing said as the line changes (the store sends it at most every 3 s; a send or
            // an emptied line stops it).
            if key != 13, key != 10 {
                // A command being typed is not a message being typed.
                let typing = screen.state.withLock { state in
                    !state.typed.isEmpty && (state.typed[0] != UInt8(ascii: "/") || state.typed.starts(with: [UInt8(ascii: "/"), UInt8(ascii: "/")]))
                }
                let id = conversation.id
                Task { try? await store.setTyping(typing, in: id) }
            }
            screen.draw()
        }
        terminal.restore()
    }
}

/// The terminal in raw mode (no echo, byte by byte, no signals from Ctrl-C) on its alternate
/// screen, put back by ``restore()`` (also at exit).
final class RawTerminal: Sendable {
    private let saved: Mutex<termios?>

    init() {
        var original = termios()
        guard tcgetattr(STDIN_FILENO, &original) == 0 else {
            saved = Mutex(nil)
            return
        }
        var raw = original
        raw.c_lflag &= ~tcflag_t(ECHO | ICANON | ISIG | IEXTEN)
        raw.c_iflag &= ~tcflag_t(IXON | ICRNL)
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw)
        saved = Mutex(original)
        // The alternate screen: what the terminal showed comes back when the view leaves.
        FileHandle.standardOutput.write(Data("\u{1B}[?1049h".utf8))
    }

    func restore() {
        guard var original = saved.withLock({ state -> termios? in
            defer { state = nil }
            return state
        }) else { return }
        FileHandle.standardOutput.write(Data("\u{1B}[?1049l".utf8))
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &original)
    }
}
