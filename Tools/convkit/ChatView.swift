import CTerminal
import ConversationKit
import Foundation
import Synchronization
import RecordZone
import ToolSupport

/// `convkit chat ID`: a person's conversations on a terminal, through ncursesw (``ck_terminal_start()``).
///
/// One conversation at a time — with a speaker, or a group — beside the list of them (on a
/// terminal 80 columns or wider; Tab and Shift-Tab go through it), their unread counts, and a
/// line marking where the unread messages start. Messages wrap by display width; each shows its
/// reference, time, speaker, what it answers, its reactions, its file, and for one's own its
/// ticks (✓ delivered, ✓✓ read). PageUp, PageDown and the mouse wheel scroll back through all of
/// it; the typed line edits as a shell's does, with its history on Up and Down; a pasted block is
/// one message. A line starting with `/` is a command, never sent (`/help` lists them). The
/// others typing and being online, the sync's state and errors show on lines of their own.
///
/// Threads: the terminal's thread alone calls curses (keys, drawing); the tasks of the store
/// change ``Shared/state`` and the terminal's thread draws it when it changed; what a key asks
/// for that needs the store goes to the main task as an ``Action``.
enum ChatView {
    static let command = ToolCommand(Command("convkit chat", "Chat with a speaker or in a group on this terminal (/help inside; Ctrl-C leaves).",
                                             discussion: """
                                                 Keys: Enter sends; a pasted block is one message; Left, Right, Home, End, Ctrl-A, Ctrl-E, Ctrl-W, Ctrl-U, Ctrl-K edit; Up and Down go through what you sent; PageUp, PageDown and the mouse wheel scroll; Tab and Shift-Tab go to the next and previous conversation; Ctrl-L redraws; Ctrl-C or Ctrl-D (on an empty line) leave.

                                                 Commands: /reply [ref] text, /react [ref] emoji, /unreact [ref], /edit ref text, /delete ref, /download ref [file], /retry, /open id, /help, /quit. A ref is the short reference shown before each message; left out, /reply and /react take the newest message from someone else.
                                                 """,
                                             positionals: [Positional("id", "The speaker to chat with, or a group's id (g-…).")],
                                             options: Targets.storeOptions + [ChatCommands.newRecipient, ChatCommands.groupFlag]),
                                     run: run)

    /// What the screen shows of the store. Changed by the tasks, drawn by the terminal's thread.
    struct State {
        var conversation: Conversation
        /// The local speaker: whose messages carry ticks.
        var local = ""
        var title = ""
        var messages: [Message] = []
        /// Whether older messages than those loaded exist, and how many the next load asks for.
        var hasOlder = false
        var limit = 200
        /// Per message: what it answers (a line above it), its reactions summed up.
        var parents: [MessageID: String] = [:]
        var reactions: [MessageID: String] = [:]
        /// Speakers' names as shown ("Alice (alice)"), by identifier.
        var names: [String: String] = [:]
        /// The others typing now and whether they are online (a zone server's live channel;
        /// never over a folder).
        var typing: [String] = []
        var presence: [Presence] = []
        /// What the sync does (or why it cannot), and the answer to the last command or
        /// failed send (until the next line is sent).
        var status = ""
        var notice = ""
        /// Every conversation, for the list beside.
        var conversations: [Conversation] = []
        /// The first message that was unread when the conversation opened (a line above it),
        /// and whether that is still to be found.
        var firstUnread: MessageID?
        var lookingForUnread = true
        /// The messages on the screen, for their reactions to be read.
        var visible: [MessageID] = []
        /// Bumped by every change: the terminal's thread draws when it moved.
        var generation = 0
    }

    /// What a key asks the main task to do.
    enum Action: Sendable {
        case send(String)
        case command(String)
        case typing(Bool)
        /// The next (1) or previous (-1) conversation in the list, with what was being typed in
        /// this one (kept as its draft).
        case move(Int, draft: String)
        case loadOlder
        /// The terminal is given back: the view ends, keeping what was being typed as the draft.
        case ended(draft: String)
    }

    final class Shared: Sendable {
        let state: Mutex<State>
        /// Set by the main task (/quit): the terminal's thread gives the terminal back and ends.
        let quit = Atomic<Bool>(false)

        init(_ state: State) { self.state = Mutex(state) }

        func update(_ body: (inout State) -> Void) {
            state.withLock {
                body(&$0)
                $0.generation &+= 1
            }
        }

        /// The sync's state.
        func say(_ status: String) { update { $0.status = status } }
        /// An answer to the person (a command's, a failed send's).
        func tell(_ notice: String) { update { $0.notice = notice } }
    }

    /// `14:05` in the local time zone; with `day`, `2026-11-30 14:05`. (Calendar is a value:
    /// safe from the terminal's thread and the tasks alike, where a shared DateFormatter is not.)
    static func time(_ date: Date, day: Bool = false) -> String {
        let parts = Calendar.current.dateComponents([.year, .month, .day, .hour, .minute], from: date)
        let clock = String(format: "%02d:%02d", parts.hour ?? 0, parts.minute ?? 0)
        return day ? String(format: "%04d-%02d-%02d ", parts.year ?? 0, parts.month ?? 0, parts.day ?? 0) + clock : clock
    }

    /// "online", "last seen 14:05" (a day before: "last seen 2026-11-30 14:05") for one other;
    /// "2 of 5 online: Bob (bob), Carol (carol)" for several; nothing when nobody was seen.
    static func summary(of presence: [Presence], names: [String: String], now: Date = Date()) -> String {
        if presence.count == 1, let one = presence.first {
            if one.isOnline { return "online" }
            guard let seen = one.lastSeen else { return "" }
            return "last seen " + time(seen, day: !Calendar.current.isDate(seen, inSameDayAs: now))
        }
        let online = presence.filter(\.isOnline).map { names[$0.identity] ?? $0.identity }
        return online.isEmpty ? "" : "\(online.count) of \(presence.count) online: " + online.joined(separator: ", ")
    }

    // MARK: The main task

    static func run(_ context: Context) async throws {
        guard let other = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        let store = try context.store()
        let group = try ChatCommands.group(other, store, context)
        if group == nil { try await ChatCommands.requireKnown(other, in: store, context) }
        guard isatty(STDIN_FILENO) == 1, isatty(STDOUT_FILENO) == 1 else { throw ToolFailure("convkit chat needs a terminal") }
        let backend = try? context.backend()
        let first: Conversation
        if let group { first = group } else { first = try await store.conversation(with: other) }
        let local = store.localSpeakerIdentifier ?? ""
        let shared = Shared(State(conversation: first, local: local))
        try describe(first, store: store, local: local, in: shared)
        shared.say(backend == nil ? "no backend: showing the store only" : "syncing")

        // Continuous sync in this process, unless another process (a daemon) already syncs the
        // store: then what it writes is read as it comes.
        let syncing = Task {
            guard backend != nil else { return }
            do { try await store.run() } catch {
                shared.say("not syncing here (\(error)): showing what another process syncs")
            }
        }
        let syncWatcher = Task {
            for await event in store.events() {
                guard case .syncActivity(let activity) = event else { continue }
                switch activity {
                case .synced(let report) where report.failed > 0: shared.say("synced; \(report.failed) failed (/retry sends them again)")
                case .synced: shared.say("synced " + time(Date()))
                case .unreachable(let why): shared.say("offline (\(why)): messages wait in the outbox")
                case .notAccepted(_, let why): shared.say("not accepted: \(why)")
                case .reachable: shared.say("online again")
                }
            }
        }
        let refresher = Task { await refresh(store, local: local, shared) }

        guard ck_terminal_start() == 0 else {
            syncing.cancel()
            throw ToolFailure("convkit chat needs a terminal that terminfo knows (TERM=\(ProcessInfo.processInfo.environment["TERM"] ?? ""))")
        }
        let (actions, continuation) = AsyncStream.makeStream(of: Action.self)
        let thread = Thread { TerminalLoop(shared: shared, actions: continuation).run() }
        thread.stackSize = 1 << 20
        thread.start()

        var watchers = watch(first.id, store, shared)
        for await action in actions {
            let conversation = shared.state.withLock { $0.conversation }
            switch action {
            case .send(let text):
                // What was kept as the draft is sent now.
                if conversation.draft != nil { await keep("", in: conversation) }
                do {
                    if conversation.isGroup { _ = try await store.send(text, toGroup: conversation.id) }
                    else { _ = try await store.send(text, to: conversation.nonLocalSpeaker) }
                } catch {
                    shared.tell("not sent: \(error)")
                }
            case .command(let line):
                if let next = await perform(line, in: conversation, store: store, local: local, shared) {
                    await open(next)
                }
            case .typing(let typing):
                // Said over the network now and then: never in the way of what comes next.
                Task { try? await store.setTyping(typing, in: conversation.id) }
            case .move(let step, let draft):
                await keep(draft, in: conversation)
                let list = shared.state.withLock { $0.conversations }
                guard !list.isEmpty else { break }
                let index = list.firstIndex { $0.id == conversation.id } ?? 0
                await open(list[(index + step + list.count) % list.count])
            case .loadOlder:
                shared.update { $0.limit = $0.messages.count + 200 }
            case .ended(let draft):
                await keep(draft, in: conversation)
                for task in [refresher, syncWatcher] + watchers { task.cancel() }
                syncing.cancel()
                // The sync's last word (that its person went away), for at most 3 s.
                await finish(syncing, within: .seconds(3))
                exit(0)
            }
        }

        /// Keeps what was being typed in `conversation` as its draft (this device only, as
        /// `convkit conversations set --draft`), or clears it.
        func keep(_ draft: String, in conversation: Conversation) async {
            let text = draft.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty ? nil : draft
            guard text != conversation.draft else { return }
            do { try await store.setDraft(text, in: conversation.id) } catch { shared.tell("draft not kept: \(error.message)") }
            shared.update { state in
                if state.conversation.id == conversation.id { state.conversation.draft = text }
            }
        }

        /// Shows `conversation` instead (with its draft, read afresh), the typing of the one
        /// before ended.
        func open(_ listed: Conversation) async {
            let before = shared.state.withLock { $0.conversation.id }
            guard listed.id != before else { return }
            let conversation = (try? store.conversations(includeArchived: true))?.first { $0.id == listed.id } ?? listed
            try? await store.setTyping(false, in: before)
            for task in watchers { task.cancel() }
            shared.update { state in
                state.conversation = conversation
                state.messages = []
                state.parents = [:]
                state.reactions = [:]
                state.typing = []
                state.presence = []
                state.limit = 200
                state.firstUnread = nil
                state.lookingForUnread = true
                state.visible = []
            }
            do { try describe(conversation, store: store, local: local, in: shared) } catch { shared.tell("\(error)") }
            watchers = watch(conversation.id, store, shared)
        }
    }

    /// The title and the members' names of `conversation`.
    static func describe(_ conversation: Conversation, store: ConversationStore, local: String, in shared: Shared) throws {
        let speakers = conversation.isGroup ? Set([local] + (try store.members(of: conversation.id).map(\.speaker))) : [local, conversation.nonLocalSpeaker]
        let names = Dictionary(uniqueKeysWithValues: speakers.map { id in (id, name(of: id, store)) })
        let title = conversation.isGroup ? "Group \(conversation.groupName ?? conversation.id) (\(speakers.count) members)"
            : "Chat with \(names[conversation.nonLocalSpeaker] ?? conversation.nonLocalSpeaker)"
        shared.update { state in
            state.title = title
            state.names.merge(names) { _, new in new }
        }
    }

    static func name(of identifier: String, _ store: ConversationStore) -> String {
        ChatCommands.shown((try? store.speaker(fromRef: SpeakerRef(identifier: identifier))?.name) ?? nil, identifier)
    }

    /// Who types and who is online in one conversation, live (nothing over a folder).
    static func watch(_ conversation: String, _ store: ConversationStore, _ shared: Shared) -> [Task<Void, Never>] {
        [Task {
            for await typists in store.typingSpeakers(in: conversation) {
                shared.update { if $0.conversation.id == conversation { $0.typing = typists } }
            }
        }, Task {
            for await presence in store.presence(in: conversation) {
                shared.update { if $0.conversation.id == conversation { $0.presence = presence } }
            }
        }]
    }

    /// Reads the store into the state as it changes: on each of its events, and every half
    /// second for what another process (a daemon) writes into it.
    static func refresh(_ store: ConversationStore, local: String, _ shared: Shared) async {
        let (wake, poke) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let events = Task {
            for await event in store.events() {
                if case .syncActivity = event { continue }
                poke.yield()
            }
        }
        let ticker = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(500))
                poke.yield()
            }
        }
        defer {
            events.cancel()
            ticker.cancel()
        }
        poke.yield()
        for await _ in wake {
            if Task.isCancelled { return }
            let (conversation, limit, visible, known) = shared.state.withLock { ($0.conversation.id, $0.limit, $0.visible, $0.names) }
            guard let page = try? store.messages(in: conversation, limit: limit, includeDeleted: true) else { continue }
            let byID = Dictionary(page.messages.map { ($0.id, $0) }) { first, _ in first }
            // What each reply answers; the reactions of those on the screen and the newest.
            var parents: [MessageID: String] = [:], reactions: [MessageID: String] = [:]
            for message in page.messages where !message.isDeleted {
                guard let parentID = message.replyTo else { continue }
                let parent: Message?
                if let held = byID[parentID] { parent = held.isDeleted ? nil : held }
                else if case .message(let held)? = try? store.parent(of: message.id) { parent = held }
                else { parent = nil }
                if let parent {
                    let text = parent.content.split(whereSeparator: \.isNewline).first.map(String.init) ?? ""
                    parents[message.id] = "\(known[parent.speaker] ?? parent.speaker): \(text.prefix(60))\(text.count > 60 || parent.content.contains(where: \.isNewline) ? "…" : "")"
                } else {
                    parents[message.id] = byID[parentID]?.isDeleted == true ? "(a deleted message)" : "(a message not here)"
                }
            }
            let watched = Set(visible + page.messages.suffix(50).map(\.id))
            for id in watched where byID[id].map({ !$0.isDeleted }) ?? false {
                if let held = try? store.reactions(to: id), !held.isEmpty { reactions[id] = ChatCommands.summary(of: held) }
            }
            // Names of those without one yet (a profile that arrived since, a new member).
            var names = known
            let conversations = (try? store.conversations()) ?? []
            for id in Set(page.messages.map(\.speaker) + conversations.filter { !$0.isGroup }.map(\.nonLocalSpeaker)) where known[id].map({ $0 == id }) ?? true {
                names[id] = name(of: id, store)
            }
            var markRead = false
            shared.state.withLock { state in
                guard state.conversation.id == conversation else { return }
                var changed = state.messages != page.messages || state.parents != parents || state.names != names || state.conversations != conversations
                // Reactions: those read now replace theirs; the others' stay as they were.
                for (id, summary) in reactions where state.reactions[id] != summary {
                    state.reactions[id] = summary
                    changed = true
                }
                for id in watched where reactions[id] == nil && state.reactions[id] != nil {
                    state.reactions[id] = nil
                    changed = true
                }
                if state.lookingForUnread {
                    state.firstUnread = page.messages.first { $0.speaker != local && $0.readAt == nil && !$0.isDeleted }?.id
                    state.lookingForUnread = false
                    changed = true
                }
                guard changed else { return }
                state.messages = page.messages
                state.hasOlder = page.olderCursor != nil
                state.parents = parents
                state.names = names
                state.conversations = conversations
                state.generation &+= 1
                // Shown means read.
                markRead = page.messages.contains { $0.speaker != local && $0.readAt == nil && !$0.isDeleted }
            }
            if markRead { try? await store.markAllAsRead(in: conversation) }
        }
    }

    /// Waits for `task` to end, or for `limit` (the process exits next: nothing outlives it).
    static func finish(_ task: Task<Void, Never>, within limit: Duration) async {
        let (ended, continuation) = AsyncStream.makeStream(of: Void.self)
        Task { _ = await task.value; continuation.yield() }
        Task { try? await Task.sleep(for: limit); continuation.yield() }
        for await _ in ended { break }
    }

    // MARK: Commands

    static let help = "/reply [ref] text · /react [ref] emoji · /unreact [ref] · /edit ref text · /delete ref · /download ref [file] · /retry · /open id · /quit"

    /// Runs a `/command`; returns a conversation to open instead (`/open`).
    static func perform(_ line: String, in conversation: Conversation, store: ConversationStore, local: String, _ shared: Shared) async -> Conversation? {
        var words = line.dropFirst().split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true).map(String.init)
        let name = words.isEmpty ? "" : words.removeFirst()
        var rest = words.first ?? ""
        let messages = shared.state.withLock { $0.messages }

        /// The message the first word of `rest` refers to (taking it off), or `fallback`.
        func target(_ fallback: Message?) throws -> Message {
            let first = String(rest.prefix { !$0.isWhitespace })
            if (MessageID.shortestReference...16).contains(first.count), first.allSatisfy(\.isHexDigit) {
                let digits = first.lowercased()
                // Among those loaded here; a longer one than they show, through the store.
                let found = digits.count <= MessageID.referenceLength ? messages.filter { $0.id.reference.hasPrefix(digits) }
                    : try store.messages(referencedBy: digits).filter { $0.conversation == conversation.id }.compactMap { id in messages.first { $0.id == id } }
                if found.count > 1 { throw ToolFailure("'\(first)' is ambiguous here: give more of it") }
                guard let message = found.first else { throw ToolFailure("no message '\(first)' here: give the reference shown before it") }
                rest = String(rest.dropFirst(first.count).drop { $0.isWhitespace })
                return message
            }
            guard let fallback else { throw ToolFailure("'\(first)' is not a reference: give the one shown before the message") }
            return fallback
        }
        let newestFromOthers = messages.last { $0.speaker != local && !$0.isDeleted }

        do {
            switch name {
            case "quit", "exit", "q":
                shared.quit.store(true, ordering: .relaxed)
            case "help", "?":
                shared.tell(help)
            case "reply":
                let parent = try target(newestFromOthers)
                guard !rest.trimmingCharacters(in: .whitespaces).isEmpty else { throw ToolFailure("/reply [ref] text: the text is missing") }
                if conversation.isGroup { _ = try await store.send(rest, toGroup: conversation.id, replyingTo: parent.id) }
                else { _ = try await store.send(rest, to: conversation.nonLocalSpeaker, replyingTo: parent.id) }
            case "react":
                let message = try target(newestFromOthers)
                let emoji = rest.trimmingCharacters(in: .whitespaces)
                guard !emoji.isEmpty else { throw ToolFailure("/react [ref] emoji: the emoji is missing") }
                try await store.react(to: message.id, with: emoji)
                shared.tell("reacted \(emoji) to \(message.id.reference)")
            case "unreact":
                let message = try target(newestFromOthers)
                try await store.removeReaction(from: message.id)
                shared.tell("reaction to \(message.id.reference) taken back")
            case "edit":
                let message = try target(nil)
                guard !rest.isEmpty else { throw ToolFailure("/edit ref text: the text is missing") }
                _ = try await store.edit(message.id, content: rest)
            case "delete":
                let message = try target(nil)
                try await store.delete(message.id)
                shared.tell("\(message.id.reference) deleted")
            case "download":
                let message = try target(nil)
                guard let file = message.attachment else { throw ToolFailure("\(message.id.reference) has no file") }
                let out = rest.isEmpty ? nil : URL(fileURLWithPath: (rest as NSString).expandingTildeInPath)
                shared.tell("downloading \(file.name)…")
                // However long it takes, the view goes on.
                Task {
                    do {
                        let url = try await store.downloadFile(of: message.id) { written, size in
                            shared.tell("downloading \(file.name): \(size > 0 ? written * 100 / size : 100) %")
                        }
                        if let out {
                            try? FileManager.default.removeItem(at: out)
                            try FileManager.default.copyItem(at: url, to: out)
                        }
                        shared.tell("\(file.name): \((out ?? url).path)")
                    } catch let error as ConversationError {
                        shared.tell("/download: \(error.message)")
                    } catch {
                        shared.tell("/download: \(error)")
                    }
                }
            case "retry":
                let count = try await store.retryFailedMessages()
                shared.tell("\(count) failed message\(count == 1 ? "" : "s") back in the outbox")
            case "open":
                let id = rest.trimmingCharacters(in: .whitespaces)
                guard !id.isEmpty else { throw ToolFailure("/open id: whom (a speaker) or which group") }
                let groups = try store.conversations(includeArchived: true).filter(\.isGroup)
                if let group = groups.first(where: { $0.id == id || $0.groupName == id }) { return group }
                guard let existing = try store.existingConversation(with: id) else {
                    throw ToolFailure("no conversation with '\(id)' here ('convkit send \(id) …' starts one)")
                }
                return existing
            default:
                shared.tell("unknown command /\(name.prefix(40)): /help lists them; //text sends /text")
            }
        } catch let error as ConversationError {
            shared.tell("/\(name): \(error.message)")
        } catch let error as ToolFailure {
            shared.tell("/\(name): \(error.message)")
        } catch {
            shared.tell("/\(name): \(error)")
        }
        return nil
    }
}

// MARK: The terminal's thread

/// Keys in, frames out: the only code that calls curses, on one thread. What it cannot do
/// alone (send, commands, typing) goes to the main task as an ``ChatView/Action``.
final class TerminalLoop {
    typealias Action = ChatView.Action
    let shared: ChatView.Shared
    let actions: AsyncStream<Action>.Continuation
    var editor = LineEditor()
    /// Rows scrolled back from the newest (0: following what comes).
    var scroll = 0
    /// Inside a bracketed paste, and what it brought so far.
    var pasting = false
    var pasted = ""
    var drawn = -1
    /// The rows of the messages at the last draw, kept while nothing changed.
    var laidOut: (generation: Int, width: Int, lines: [[Cell]], owners: [MessageID?])?
    /// The newest message and the rows of everything at the last draw: new messages at the
    /// bottom keep a scrolled-back view where it is.
    var newest: MessageID?
    var totalRows = 0
    var askedOlderAt = -1
    var shownConversation = ""
    /// Whether "typing" was said last, and the line it was said of.
    var typing = false
    var lastTyped = ""
    var size = (rows: 0, columns: 0)

    init(shared: ChatView.Shared, actions: AsyncStream<Action>.Continuation) {
        self.shared = shared
        self.actions = actions
    }

    func run() {
        while !shared.quit.load(ordering: .relaxed) {
            // Every key already there (a paste is thousands) before one frame.
            var wait: Int32 = 100
            while true {
                var value: UInt32 = 0
                let kind = ck_terminal_key(wait, &value)
                wait = 0
                if kind == Int32(CK_READ_CHARACTER), let scalar = Unicode.Scalar(value) {
                    if !character(scalar) { return end() }
                } else if kind == Int32(CK_READ_KEY) {
                    key(Int32(value))
                } else {
                    break
                }
            }
            var rows: Int32 = 0, columns: Int32 = 0
            ck_terminal_size(&rows, &columns)
            let generation = shared.state.withLock { $0.generation }
            if generation != drawn || (Int(rows), Int(columns)) != size {
                draw()
            }
        }
        end()
    }

    func end() {
        ck_terminal_stop()
        actions.yield(.ended(draft: editor.text))
        actions.finish()
    }

    /// To another conversation: what is typed here goes with it, as this one's draft.
    func move(_ step: Int) {
        guard shared.state.withLock({ $0.conversations.count }) > 1 else { return }
        actions.yield(.move(step, draft: editor.text))
        // Opening the other one ends the typing said in this one.
        editor.show("")
        lastTyped = ""
        typing = false
    }

    /// A typed character; false to leave.
    func character(_ scalar: Unicode.Scalar) -> Bool {
        // A pasted block goes into the line whole when it ends (its newlines kept, a tab a space).
        if pasting {
            pasted.unicodeScalars.append(scalar.value == 13 ? "\n" : scalar.value == 9 ? " " : scalar)
            return true
        }
        switch scalar.value {
        case 3: return false  // Ctrl-C
        case 4:  // Ctrl-D: leaves on an empty line, else deletes forward
            if editor.isEmpty { return false }
            editor.deleteForward()
        case 13, 10: submit()
        case 127, 8: editor.backspace()
        case 1: editor.home()
        case 5: editor.end()
        case 2: editor.left()
        case 6: editor.right()
        case 11: editor.deleteToEnd()
        case 21: editor.deleteToStart()
        case 23: editor.deleteWordBack()
        case 9: move(1)
        case 12: ck_terminal_repaint()  // Ctrl-L
        case 0..<32: return true
        default: editor.insert(String(Character(scalar)))
        }
        edited()
        drawn = -1
        return true
    }

    func key(_ code: Int32) {
        // Inside a paste only its end and its newlines count (curses reads a pasted escape
        // sequence as a key: it is dropped, not obeyed).
        if pasting, code != Int32(CK_KEY_PASTE_END) {
            if code == Int32(CK_KEY_ENTER) { pasted += "\n" }
            return
        }
        let page = max(1, size.rows - 5)
        switch code {
        case Int32(CK_KEY_LEFT): editor.left()
        case Int32(CK_KEY_RIGHT): editor.right()
        case Int32(CK_KEY_HOME): editor.home()
        case Int32(CK_KEY_END):
            // At the end of the line already: to the newest message.
            if editor.cursor == editor.characters.count { scroll = 0 }
            editor.end()
        case Int32(CK_KEY_WORD_LEFT): editor.wordLeft()
        case Int32(CK_KEY_WORD_RIGHT): editor.wordRight()
        case Int32(CK_KEY_BACKSPACE): editor.backspace()
        case Int32(CK_KEY_DELETE): editor.deleteForward()
        case Int32(CK_KEY_UP): editor.previous()
        case Int32(CK_KEY_DOWN): editor.next()
        case Int32(CK_KEY_ENTER): submit()
        case Int32(CK_KEY_PAGE_UP): scroll += page
        case Int32(CK_KEY_PAGE_DOWN): scroll = max(0, scroll - page)
        case Int32(CK_KEY_WHEEL_UP): scroll += 3
        case Int32(CK_KEY_WHEEL_DOWN): scroll = max(0, scroll - 3)
        case Int32(CK_KEY_TAB_BACK): move(-1)
        case Int32(CK_KEY_PASTE_BEGIN): pasting = true
        case Int32(CK_KEY_PASTE_END):
            pasting = false
            editor.insert(pasted)
            pasted = ""
        default: break
        }
        edited()
        drawn = -1
    }

    /// Says "typing" while a message (not a command) is being typed, and when it stops: after
    /// any key, when the line changed.
    func edited() {
        let text = editor.text
        guard text != lastTyped else { return }
        lastTyped = text
        let now = !text.isEmpty && (!text.hasPrefix("/") || text.hasPrefix("//"))
        // The store says it again every 3 s while it lasts; a change is said at once.
        if now || typing { actions.yield(.typing(now)) }
        typing = now
    }

    func submit() {
        var line = editor.take()
        scroll = 0
        shared.update { $0.notice = "" }
        if line.hasPrefix("/"), !line.hasPrefix("//") {
            actions.yield(.command(line.trimmingCharacters(in: .whitespaces)))
            return
        }
        if line.hasPrefix("//") { line.removeFirst() }
        guard !line.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else { return }
        actions.yield(.send(line))
    }

    // MARK: Drawing

    func draw() {
        var rows: Int32 = 0, columns: Int32 = 0
        ck_terminal_size(&rows, &columns)
        size = (Int(rows), Int(columns))
        let state = shared.state.withLock { $0 }
        drawn = state.generation
        // Another conversation (Tab, /open): from its newest message.
        if state.conversation.id != shownConversation {
            shownConversation = state.conversation.id
            // Its draft, to go on with (what was typed before it opened stays, when there is none).
            if let draft = state.conversation.draft, editor.isEmpty { editor.show(draft) }
            scroll = 0
            newest = nil
            totalRows = 0
            askedOlderAt = -1
        }
        ck_terminal_erase()
        let height = size.rows, width = size.columns
        guard height >= 4, width >= 10 else {
            TerminalText.draw(TerminalText.clip(TerminalText.cells("too small"), to: width), at: 0, column: 0)
            ck_terminal_show()
            return
        }
        // The list beside, on a terminal wide enough.
        let side = width >= 80 ? min(26, width / 4) : 0
        if side > 0 { drawList(state, width: side - 1, height: height - 1) }
        let x = side, pane = width - side
        // Header, messages, the typing line, the status line; the typed line at the bottom.
        let presence = ChatView.summary(of: state.presence, names: state.names)
        let header = TerminalText.cells(state.title, Int32(CK_BOLD)) + (presence.isEmpty ? [] : TerminalText.cells("  " + presence, Int32(CK_DIM)))
            + TerminalText.cells("  (/help, Ctrl-C leaves)", Int32(CK_DIM))
        TerminalText.draw(TerminalText.clip(header, to: pane), at: 0, column: x)
        let room = height - 4
        if laidOut?.generation != state.generation || laidOut?.width != pane {
            let (lines, owners) = layout(state, width: pane)
            laidOut = (state.generation, pane, lines, owners)
        }
        let lines = laidOut?.lines ?? [], owners = laidOut?.owners ?? []
        // A view scrolled back stays on what it shows when new messages come below.
        if scroll > 0, let newest, newest != state.messages.last?.id, lines.count > totalRows { scroll += lines.count - totalRows }
        newest = state.messages.last?.id
        totalRows = lines.count
        scroll = min(scroll, max(0, lines.count - room))
        let end = lines.count - scroll, start = max(0, end - room)
        // The newest just above the typing line, as in every chat.
        let top = 1 + room - (end - start)
        for (offset, line) in lines[start..<end].enumerated() {
            TerminalText.draw(TerminalText.clip(line, to: pane), at: top + offset, column: x)
        }
        let visible = Array(Set(owners[start..<end].compactMap { $0 }))
        if Set(visible) != Set(state.visible) { shared.state.withLock { $0.visible = visible } }
        // Near the top of what is loaded: the older ones.
        if start < room, state.hasOlder, askedOlderAt != state.messages.count {
            askedOlderAt = state.messages.count
            actions.yield(.loadOlder)
        }
        if !state.typing.isEmpty {
            let who = state.typing.map { state.names[$0] ?? $0 }
            let line = who.count == 1 ? "\(who[0]) is typing…" : "\(who.joined(separator: ", ")) are typing…"
            TerminalText.draw(TerminalText.clip(TerminalText.cells(line, Int32(CK_ITALIC)), to: pane), at: height - 3, column: x)
        }
        var status = [state.notice, state.status].filter { !$0.isEmpty }.joined(separator: " · ")
        if scroll > 0 { status = "↑ scrolled back \(scroll) line\(scroll == 1 ? "" : "s") (PageDown for newer) · " + status }
        TerminalText.draw(TerminalText.clip(TerminalText.cells(status, Int32(CK_DIM)), to: pane), at: height - 2, column: x)
        drawInput(row: height - 1, width: width)
        ck_terminal_show()
    }

    /// The conversations, the one shown marked, with their unread counts.
    func drawList(_ state: ChatView.State, width: Int, height: Int) {
        for (row, conversation) in state.conversations.prefix(height).enumerated() {
            let current = conversation.id == state.conversation.id
            let title = conversation.groupName.map { "# " + $0 } ?? (state.names[conversation.nonLocalSpeaker] ?? conversation.nonLocalSpeaker)
            let unread = current ? 0 : conversation.unreadCount
            let count = unread > 0 ? " (\(unread))" : ""
            var cells = TerminalText.cells((current ? "▸ " : "  "), Int32(current ? CK_REVERSE : 0))
            let counted = TerminalText.cells(count, Int32(CK_BOLD))
            cells += TerminalText.clip(TerminalText.cells(title, Int32(current ? CK_REVERSE : (unread > 0 ? CK_BOLD : 0))), to: max(1, width - TerminalText.width(cells) - TerminalText.width(counted)))
            cells += counted
            TerminalText.draw(TerminalText.clip(cells, to: width), at: row, column: 0)
        }
        for row in 0..<height { ck_terminal_put(Int32(row), Int32(width), "│", 0) }
    }

    /// The typed line, scrolled sideways to keep the cursor on the screen; a newline shows as ↵.
    func drawInput(row: Int, width: Int) {
        let prompt = TerminalText.cells(pasting ? "paste> " : "> ", Int32(CK_BOLD))
        var cells: [Cell] = [], cursorColumn = 0
        for (index, character) in editor.characters.enumerated() {
            if index == editor.cursor { cursorColumn = TerminalText.width(cells) }
            cells += character == "\n" || character == "\r\n" ? TerminalText.cells("↵", Int32(CK_DIM)) : TerminalText.cells(String(character))
        }
        if editor.cursor >= editor.characters.count { cursorColumn = TerminalText.width(cells) }
        let room = max(1, width - TerminalText.width(prompt) - 1)
        // Drop cells from the left until the cursor fits.
        var skipped = 0, dropped = 0
        while cursorColumn - skipped >= room, dropped < cells.count {
            skipped += cells[dropped].width
            dropped += 1
        }
        let shown = TerminalText.clip(Array(cells.dropFirst(dropped)), to: room)
        TerminalText.draw(prompt + shown, at: row, column: 0)
        ck_terminal_cursor(Int32(row), Int32(TerminalText.width(prompt) + cursorColumn - skipped), 1)
    }

    /// Every message as rows of `width` columns, oldest first, and which message each row shows.
    func layout(_ state: ChatView.State, width: Int) -> ([[Cell]], [MessageID?]) {
        let dim = Int32(CK_DIM), bold = Int32(CK_BOLD)
        // References as short as they can be among those shown (6 digits, or more to tell two apart).
        let references = state.messages.map(\.id.reference)
        var length = MessageID.shortestReference
        while length < MessageID.referenceLength, Set(references.map { $0.prefix(length) }).count < references.count { length += 1 }
        var lines: [[Cell]] = [], owners: [MessageID?] = []
        for message in state.messages {
            if message.id == state.firstUnread {
                let rule = String(repeating: "─", count: max(0, (width - 7) / 2))
                lines.append(TerminalText.cells("\(rule) new \(rule)", bold))
                owners.append(nil)
            }
            if let parent = state.parents[message.id] {
                for row in TerminalText.wrap(TerminalText.cells("  ↪ " + parent, dim), width: width, indent: 4).prefix(2) {
                    lines.append(row)
                    owners.append(message.id)
                }
            }
            let own = message.speaker == state.local
            var notes = [String]()
            if message.isWaitingForKey { notes.append("waiting for its key") }
            if let file = message.attachment { notes.append("file: \(file.name), \(Output.bytes(file.size)): /download \(message.id.reference.prefix(length))") }
            if let reactions = state.reactions[message.id] { notes.append(reactions) }
            if message.editedAt != nil && !message.isDeleted { notes.append("edited") }
            if own {
                switch message.syncState {
                case .pending: notes.append("sending…")
                case .failed(let reason): notes.append("failed: \(reason) (/retry)")
                case .synced: if message.readAt != nil { notes.append("✓✓") } else if message.isDelivered { notes.append("✓") }
                }
            }
            let speaker = state.names[message.speaker] ?? message.speaker
            // Names, content and notes come from others: each part is made safe (TerminalText.cells).
            var head = TerminalText.cells(String(message.id.reference.prefix(length)) + " ", dim)
                + TerminalText.cells(ChatView.time(message.spokenAt, day: !Calendar.current.isDateInToday(message.spokenAt)) + " ", dim)
                + TerminalText.cells(speaker, bold) + TerminalText.cells(": ")
            let paragraphs = message.isDeleted ? ["(a deleted message)"]
                : message.content.split(omittingEmptySubsequences: false) { $0 == "\n" || $0 == "\r\n" }.map(String.init)
            for (index, paragraph) in paragraphs.enumerated() {
                var cells = head + TerminalText.cells(paragraph, message.isDeleted ? Int32(CK_ITALIC) : 0)
                if index == paragraphs.count - 1, !notes.isEmpty { cells += TerminalText.cells("  (" + notes.joined(separator: ", ") + ")", dim) }
                for row in TerminalText.wrap(cells, width: width, indent: 2) {
                    lines.append(row)
                    owners.append(message.id)
                }
                head = TerminalText.cells("  ")
            }
        }
        return (lines, owners)
    }
}
