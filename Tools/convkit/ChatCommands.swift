import ConversationKit
import Foundation
import ImageKit
import RecordZone
import ToolSupport

/// The chat commands: a store's speaker, its conversations and messages, sync.
enum ChatCommands {
    static let all: [ToolCommand] = [
        ToolCommand(Command("convkit init", "Create a store and set its local speaker up.",
                            discussion: """
                                Remembers the backend (--server or --zone-dir) in <store>/convkit.json for the other commands, and publishes the profile at once: a new store whose backend cannot be reached is not made (exit 1) unless --offline says to set it up without it.

                                Run again on a store, it changes the name and tags: without --tag the tags stay; --tag that leaves one of them out is refused unless --replace-tags says to drop it.
                                """,
                            options: [.valued("id", "identifier", "The speaker's identifier (required)."), .valued("name", "name", "The speaker's name (required)."),
                                      .valued("tag", "tag", "A tag others can find the speaker by.", repeats: true),
                                      .flag("replace-tags", "Let --tag drop the tags the speaker has and it does not name."),
                                      .flag("offline", "Set a new store up even when its backend cannot be reached (the profile waits for the next sync).")]
                                + Targets.storeOptions + [Targets.json]), run: initialize),
        ToolCommand(Command("convkit whoami", "Show the store's local speaker, its fingerprint and backend.", options: [Targets.store, Targets.json]), run: whoami),
        ToolCommand(Command("convkit send", "Send a message (committed locally; pushed by the next sync or a running daemon).",
                            discussion: "<id> must be someone who published a profile (in the store, or on the backend); --new sends to someone who has not yet.",
                            positionals: [Positional("id", "The speaker to send to, or a group's id (g-…)."),
                                          Positional("text", "The message ('-': read it from standard input; with --attach: the file's caption, optional).", optional: true)],
                            options: Targets.storeOptions + [.flag("sync", "Sync right after."), newRecipient, groupFlag,
                                                             .valued("reply-to", "message", "Answer this message (its reference or ID, as listed)."),
                                                             .valued("mention", "id", "Mention this speaker where the text says @<id>.", repeats: true),
                                                             .valued("custom", "type", "An app's own kind of message (com.example.poll); <text> is shown where it is not understood."),
                                                             .valued("data", "text", "With --custom: its data (UTF-8 text, such as JSON)."),
                                                             .valued("file", "path", "Read the message from this file, as one message ('-': standard input)."),
                                                             .valued("attach", "file", "Send this file (up to 1 GiB; encrypted, uploaded in chunks by the sync)."),
                                                             .valued("type", "media-type", "With --attach: the file's media type. (default: guessed from its name and first bytes)"),
                                                             Targets.json]), run: send),
        ToolCommand(Command("convkit download", "Download a message's file (or find it in the store), and print where it is.",
                            discussion: "Resumes a download cut short. Each chunk is checked against its hash and opened with the file's key before it is written; a changed byte fails the download (exit 1) and keeps nothing.",
                            positionals: [Positional("message", "The message: its reference (or 6 or more of its digits) or its ID, as listed.")],
                            options: Targets.storeOptions + [.valued("out", "file", "Copy the file there too."), Targets.json]), run: download),
        ToolCommand(Command("convkit mentions", "List the newest messages that mention you, in every conversation.",
                            options: [Targets.store, Targets.json]), run: mentions),
        ToolCommand(Command("convkit search", "Find messages by their words (every word; best first, with a snippet).",
                            positionals: [Positional("words", "The words to find (matched as words: no search syntax).")],
                            options: [Targets.store, .valued("in", "id", "Only this conversation: the other speaker, or a group's id."),
                                      .valued("from", "id", "Only what this speaker said."), Targets.json]), run: search),
        ToolCommand(Command("convkit messages", "List a conversation's newest messages, oldest first.",
                            positionals: [Positional("id", "The other speaker, or a group's id (g-…).")],
                            options: [Targets.store, .valued("limit", "n", "How many. (default: 20)"), .valued("before", "cursor", "Older than this cursor (printed with each page)."), groupFlag, Targets.json]),
                    run: messages),
        ToolCommand(Command("convkit conversations", "List the conversations, pinned first, with unread counts (not the archived ones, but with --archived).",
                            options: [Targets.store, .flag("archived", "The archived ones too."), Targets.json]), run: conversations),
        ToolCommand(Command("convkit conversations set", "Archive, pin, mute or mark unread a conversation, on this device only (never synced).",
                            positionals: [Positional("id", "The other speaker, or a group's id (g-…).")],
                            options: [Targets.store, groupFlag, .flag("archive", "Archive it."), .flag("unarchive", "Bring it back from the archive."),
                                      .flag("pin", "Pin it (first in the list)."), .flag("unpin", "Unpin it."),
                                      .valued("mute", "seconds", "Mute it for so many seconds, or 'forever'."), .flag("unmute", "Unmute it."),
                                      .flag("unread", "Mark it unread (until it is read)."), .valued("draft", "text", "Keep this draft ('' clears it)."), Targets.json]),
                    run: setConversation),
        ToolCommand(Command("convkit encryption", "Show who a conversation's messages are sealed for: each member's devices, with fingerprints.",
                            discussion: "Every message is sealed (end-to-end encrypted) for the devices listed; a member without one has not published a device yet.",
                            positionals: [Positional("id", "The other speaker, or a group's id (g-…).")], options: [Targets.store, groupFlag, Targets.json]),
                    run: encryption),
        ToolCommand(Command("convkit conversations remove", "Remove a conversation from this store (not from the backend; unsent messages are dropped).",
                            positionals: [Positional("id", "The other speaker.")], options: [Targets.store, Targets.json]), run: removeConversation),
        ToolCommand(Command("convkit read", "Mark a conversation's messages read (a signed receipt each).",
                            positionals: [Positional("id", "The other speaker, or a group's id (g-…).")], options: [Targets.store, groupFlag, Targets.json]), run: read),
        ToolCommand(Command("convkit edit", "Edit one of your messages (each version is kept: 'convkit edits').",
                            positionals: [Positional("message", "The message: its reference (or 6 or more of its digits) or its ID, as listed."), Positional("text", "The new text.")],
                            options: [Targets.store, Targets.json]), run: edit),
        ToolCommand(Command("convkit edits", "List a message's versions, oldest first (the current one last).",
                            positionals: [Positional("message", "The message: its reference (or 6 or more of its digits) or its ID, as listed.")], options: [Targets.store, Targets.json]), run: edits),
        ToolCommand(Command("convkit react", "React to a message with an emoji (replacing your earlier reaction), or take yours back with --remove.",
                            positionals: [Positional("message", "The message: its reference (or 6 or more of its digits) or its ID, as listed."), Positional("emoji", "The emoji (any short text; not with --remove).", optional: true)],
                            options: [Targets.store, Option.flag("remove", "Take your reaction back."), Targets.json]), run: react),
        ToolCommand(Command("convkit delete", "Delete one of your messages (a signed tombstone).",
                            positionals: [Positional("message", "The message: its reference (or 6 or more of its digits) or its ID, as listed.")], options: [Targets.store, Targets.json]), run: delete),
        ToolCommand(Command("convkit block", "Block a speaker: their messages are hidden on all your devices, and a zone server takes nothing more of theirs into your conversation.",
                            discussion: "A signed record in your conversation with them (synced: your other devices block them too; they can tell). 'convkit unblock' shows their messages again.",
                            positionals: [Positional("id", "The speaker.")], options: [Targets.store, Targets.json]), run: block),
        ToolCommand(Command("convkit unblock", "Unblock a speaker: their messages are shown again.",
                            positionals: [Positional("id", "The speaker.")], options: [Targets.store, Targets.json]), run: unblock),
        ToolCommand(Command("convkit blocked", "List the speakers you block.", options: [Targets.store, Targets.json]), run: blocked),
        ToolCommand(Command("convkit speakers", "List the speakers you know.",
                            options: [Targets.store, .valued("tag", "tag", "Only those with this tag."), Targets.json]), run: speakers),
        ToolCommand(Command("convkit find", "Find speakers by tag (the backend's query, then the cache).",
                            options: Targets.storeOptions + [.valued("tag", "tag", "The tag (required)."), Targets.json]), run: find),
        ToolCommand(Command("convkit sync", "Push the outbox and pull every change, once.", options: Targets.storeOptions + [Targets.json]), run: sync),
        ToolCommand(Command("convkit retry", "Put failed messages back into the outbox.", options: [Targets.store, Targets.json]), run: retry),
        ToolCommand(Command("convkit fingerprint", "Show a speaker's key fingerprint, to compare out of band.",
                            positionals: [Positional("id", "The speaker.")], options: [Targets.store, Targets.json]), run: fingerprint),
        ToolCommand(Command("convkit trust", "Pin a speaker's key: after comparing its fingerprint, or from an introduction by someone you trust.",
                            discussion: "With <fingerprint>: the key you compared out of band. With --introduction: the key someone whose key this store holds vouched for ('convkit introduce' on their side).",
                            positionals: [Positional("id", "The speaker."), Positional("fingerprint", "The fingerprint you compared (12 groups of 5 digits).", optional: true)],
                            options: [Targets.store, .valued("introduction", "text", "An introduction (convkit-intro-1:…) instead of a fingerprint."), Targets.json]), run: trust),
        ToolCommand(Command("convkit introduce", "Print an introduction of a speaker, signed by you, for someone who trusts you.",
                            discussion: "The text carries the key this store holds for <id>; whoever holds your key settles who <id> is with 'convkit trust <id> --introduction <text>'.",
                            positionals: [Positional("id", "The speaker to introduce.")], options: [Targets.store, Targets.json]), run: introduce),
        ToolCommand(Command("convkit avatar set", "Set your avatar from a PNG or JPEG file (capped to 100×100).",
                            positionals: [Positional("file", "The image file.")], options: [Targets.store, Targets.json]), run: avatarSet),
        ToolCommand(Command("convkit avatar get", "Get a speaker's avatar (downloading it when needed).",
                            positionals: [Positional("id", "The speaker.")],
                            options: Targets.storeOptions + [.valued("out", "file", "Write the PNG there. (default: print where it is cached)"), Targets.json]), run: avatarGet),
        ToolCommand(Command("convkit device list", "List the local speaker's devices.", options: [Targets.store, Targets.json]), run: deviceList),
        ToolCommand(Command("convkit device link", "On the first device: print a link code for one more device.",
                            options: [Targets.store, .valued("minutes", "n", "How long the code stays valid. (default: 10)"), Targets.json]), run: deviceLink),
        ToolCommand(Command("convkit device join", "Set a new store up as one more device of a speaker, from a link code.",
                            positionals: [Positional("code", "The link code printed by 'convkit device link' on the first device.")],
                            options: Targets.storeOptions + [Targets.json]), run: deviceJoin),
        ToolCommand(Command("convkit doctor", "Check a store; with --rebuild, rebuild a damaged one from its backend with its key.",
                            discussion: "Without --rebuild: checks the database (SQLite's quick_check), the local speaker and its key; exits 1 on a problem. With --rebuild (a first device): moves the damaged database aside (store.sqlite.damaged-<time>), makes a new one with the store's key and pulls everything back from the backend; what had not been pushed is not recovered.",
                            options: Targets.storeOptions + [.flag("rebuild", "Rebuild the store from its backend."),
                                                             .valued("id", "identifier", "The store's speaker. (default: as 'convkit init' recorded it)"), Targets.json]), run: doctor),
        ToolCommand(Command("convkit recovery create", "On the first device: make a recovery code, to write down, that brings this identity back on a new machine.",
                            discussion: "Wraps the identity key with the code (Argon2id + secretbox) in a record of the speaker's zone, and syncs it. Whoever holds the code can become you: keep it as you would a password. A new code replaces the one before.",
                            options: Targets.storeOptions + [Targets.json]), run: recoveryCreate),
        ToolCommand(Command("convkit recovery restore", "Set a new store up as a lost first device, from its recovery code (typed on standard input, or in a file).",
                            discussion: "Fetches the speaker's recovery record from the backend, opens it with the code and syncs: the whole history reads again, and the store sends as the same identity. A wrong code restores nothing.",
                            positionals: [Positional("id", "The speaker whose first device was lost.")],
                            options: Targets.storeOptions + [.valued("code-file", "file", "Read the code from this file. (default: standard input; never an argument, which 'ps' shows)"), Targets.json]),
                    run: recoveryRestore),
        ToolCommand(Command("convkit device revoke", "On the first device: revoke a linked device (by its label or fingerprint).",
                            positionals: [Positional("device", "The device's label or fingerprint, as 'device list' shows it.")], options: [Targets.store, Targets.json]), run: deviceRevoke),
    ]

    static let newRecipient = Option.flag("new", "Send to someone who has not published a profile yet (not a typo).")

    /// Refuses a recipient nobody knows (a typo would make a conversation with nobody), unless
    /// `--new` says it is meant.
    static let groupFlag = Option.flag("group", "<id> is a group, named by its id or its name.")

    static func requireKnown(_ identifier: String, in store: ConversationStore, _ context: Context) async throws {
        if context.arguments.has("new") { return }
        if try store.existingConversation(with: identifier) != nil { return }
        let exists: Bool
        do { exists = try await store.speakerExists(identifier) } catch {
            if error.code == .keyConflict {
                throw ToolFailure("\(error.message) ('convkit fingerprint \(identifier)' lists them, 'convkit trust' settles it); give --new to send anyway")
            }
            throw ToolFailure("cannot check whether '\(identifier)' exists (\(error.message)); give --new to send anyway")
        }
        guard exists else {
            throw ToolFailure("nobody called '\(identifier)' has published a profile, here or on the backend (a typo?); give --new to send to someone new")
        }
    }

    static func initialize(_ context: Context) async throws {
        guard let identifier = context.arguments.value("id"), let name = context.arguments.value("name") else {
            throw UsageError("--id and --name are required")
        }
        let backend = try context.backend()
        // What was in the directory before (nil: no directory), so that a failed set-up takes
        // away only what it made.
        let before = try? FileManager.default.contentsOfDirectory(atPath: context.storePath)
        let store = try ConversationStore(directory: context.storePath, backend: backend)
        let current = try store.localSpeaker
        var tags = context.arguments.all("tag")
        if let current, current.identifier == identifier {
            let dropped = current.tags.filter { !tags.contains($0) }
            if tags.isEmpty {
                tags = current.tags
            } else if !dropped.isEmpty, !context.arguments.has("replace-tags") {
                throw ToolFailure("this would drop \(identifier)'s tags \(dropped.joined(separator: ", ")): name them with --tag too, or give --replace-tags")
            }
        }
        let speaker = try await store.setupLocalSpeaker(identifier: identifier, name: name, tags: tags)
        try context.rememberBackend(identity: speaker.identifier)
        // Published at once, so others can find and write to this speaker. A new store whose
        // backend does not answer is not left behind, unless --offline asks for it (the profile
        // then waits in the outbox for the next sync).
        var published = true
        do { try await store.sync() } catch {
            published = false
            if current == nil, !context.arguments.has("offline") {
                store.close()
                let now = (try? FileManager.default.contentsOfDirectory(atPath: context.storePath)) ?? []
                let made = before.map { kept in now.filter { !kept.contains($0) }.map { context.storePath + "/" + $0 } } ?? [context.storePath]
                for path in made { try? FileManager.default.removeItem(atPath: path) }
                throw ToolFailure("cannot publish the profile (\(error.message)); nothing was set up: check --server or --zone-dir, or give --offline to set the store up without its backend")
            }
            FileHandle.standardError.write(Data("note: the profile is not published yet (\(DisplayText.safe(error.message))); the next sync will\n".utf8))
        }
        if context.json {
            try Output.json(["identifier": speaker.identifier, "name": speaker.name, "tags": speaker.tags, "fingerprint": speaker.fingerprint ?? "", "store": context.storePath,
                             "published": published])
        } else {
            Output.line("\(speaker.identifier) (\(speaker.name)) in \(context.storePath)")
            Output.line("fingerprint \(speaker.fingerprint ?? "-")")
        }
    }

    static func defaultDevice() -> String { ProcessInfo.processInfo.hostName.split(separator: ".").first.map(String.init) ?? "device" }

    static func whoami(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        guard let speaker = try store.localSpeaker else { throw ToolFailure("no local speaker") }
        let settings = context.settings()
        let backend = settings.server.map { "server \($0)" } ?? settings.zoneDir.map { "folder \($0) as \(settings.device ?? "?")" } ?? "none"
        let recovery = try store.recoveryCodeCreated()
        if context.json {
            try Output.json(["identifier": speaker.identifier, "name": speaker.name, "tags": speaker.tags, "fingerprint": speaker.fingerprint ?? "",
                             "store": context.storePath, "backend": backend, "recoveryCodeCreated": recovery.map(Output.time) ?? ""])
        } else {
            Output.line("\(speaker.identifier) (\(speaker.name))\(speaker.tags.isEmpty ? "" : " tags: " + speaker.tags.joined(separator: ", "))")
            Output.line("fingerprint \(speaker.fingerprint ?? "-")")
            Output.line("store \(context.storePath), backend \(backend)")
            Output.line(recovery.map { "recovery code made \(Output.time($0))" } ?? "no recovery code ('convkit recovery create' on the first device makes one)")
        }
    }

    static func messageJSON(_ message: Message) -> [String: Any] {
        var value: [String: Any] = ["id": message.id.description, "reference": message.id.reference, "speaker": message.speaker, "listener": message.listener, "content": message.content,
                                    "spokenAt": Output.time(message.spokenAt), "state": state(message.syncState)]
        if let edited = message.editedAt { value["editedAt"] = Output.time(edited) }
        if let read = message.readAt { value["readAt"] = Output.time(read) }
        if message.isWaitingForKey { value["waitingForKey"] = true }
        if let parent = message.replyTo { value["replyTo"] = parent.description }
        if !message.mentions.isEmpty { value["mentions"] = message.mentions.map { ["speaker": $0.speaker, "start": $0.utf8Range.lowerBound, "length": $0.utf8Range.count] as [String: Any] } }
        if let custom = message.custom { value["custom"] = ["type": custom.type, "data": custom.data.base64EncodedString()] }
        if message.isDeleted { value["deleted"] = true }
        if message.isDelivered { value["delivered"] = true }
        if let file = message.attachment { value["file"] = ["name": file.name, "type": file.mediaType, "size": file.size] as [String: Any] }
        if case .failed(let failure) = message.syncState { value["failure"] = failure.backendCode?.rawValue ?? failure.code.rawValue }
        return value
    }

    static func state(_ state: SyncState) -> String {
        switch state {
        case .pending: "pending"
        case .synced: "synced"
        case .failed(let reason): "failed: \(reason)"
        }
    }

    static func send(_ context: Context) async throws {
        let store = context.arguments.has("sync") ? try context.syncingStore() : try context.store()
        let attachment = context.arguments.value("attach").map { URL(fileURLWithPath: $0) }
        guard let to = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        let given = context.arguments.positional(1), file = context.arguments.value("file")
        if given != nil, file != nil { throw UsageError("give <text> or --file, not both") }
        let source = file ?? (given == "-" ? "-" : nil)
        guard let text = try source.map({ try readText(from: $0) }) ?? given ?? (attachment == nil ? nil : "") else {
            throw UsageError("missing <text> (or '-' to read it from standard input)")
        }
        if context.arguments.value("type") != nil, attachment == nil { throw UsageError("--type goes with --attach") }
        let parent = try context.arguments.value("reply-to").map { try messageID($0, in: store) }
        let mentioned = context.arguments.all("mention")
        let mentions = Mention.written(mentioned, in: text)
        if let missing = mentioned.first(where: { id in !mentions.contains { $0.speaker == id } }) {
            throw UsageError("--mention \(missing): the text does not say @\(missing)")
        }
        let custom = context.arguments.value("custom").map { CustomPayload(type: $0, data: Data((context.arguments.value("data") ?? "").utf8)) }
        if custom == nil, context.arguments.value("data") != nil { throw UsageError("--data goes with --custom") }
        if attachment != nil, custom != nil || !mentions.isEmpty { throw UsageError("--attach goes without --custom and --mention") }
        let caption = text.isEmpty ? nil : text
        var message: Message
        if let group = try group(to, store, context) {
            if let attachment {
                message = try await store.sendFile(attachment, toGroup: group.id, caption: caption, mediaType: context.arguments.value("type"), replyingTo: parent)
            } else {
                message = try await store.send(text, toGroup: group.id, replyingTo: parent, mentions: mentions, custom: custom)
            }
        } else {
            try await requireKnown(to, in: store, context)
            if let attachment {
                message = try await store.sendFile(attachment, to: to, caption: caption, mediaType: context.arguments.value("type"), replyingTo: parent)
            } else {
                message = try await store.send(text, to: to, replyingTo: parent, mentions: mentions, custom: custom)
            }
        }
        // Committed: from here on the message is reported, whatever the sync says.
        if context.arguments.has("sync") {
            var note: String? = nil
            do { try await store.sync() } catch { note = "not synced yet: \(error.message)" }
            message = try store.message(message.id) ?? message
            if message.syncState == .pending, note == nil {
                // Another process holds this store's device (a running convkitd sync): it
                // pushes the outbox at its next look; wait for it a little.
                let deadline = Date().addingTimeInterval(10)
                while message.syncState == .pending, Date() < deadline {
                    try await Task.sleep(for: .milliseconds(100))
                    message = try store.message(message.id) ?? message
                }
                if message.syncState == .pending { note = "still pending: the process syncing this store (or the next sync) pushes it" }
            }
            if let note { FileHandle.standardError.write(Data("note: \(DisplayText.safe(note))\n".utf8)) }
        }
        if context.json { try Output.json(messageJSON(message)) } else { Output.line("\(message.id.reference) \(state(message.syncState))") }
    }

    static func download(_ context: Context) async throws {
        let store = try context.store()
        guard let text = context.arguments.positional(0) else { throw UsageError("missing <message>") }
        let id = try messageID(text, in: store)
        guard let file = try store.message(id)?.attachment else { throw ToolFailure("\(id.reference) carries no file (or is not in this store: 'convkit sync' first)") }
        let held = try store.fileURL(of: id) != nil
        // Progress on a terminal only, one line rewritten per chunk.
        let showsProgress = !context.json && isatty(STDERR_FILENO) == 1 && !held
        let url = try await store.downloadFile(of: id) { written, size in
            guard showsProgress else { return }
            FileHandle.standardError.write(Data("\r\(Output.bytes(written)) of \(Output.bytes(size))".utf8))
        }
        if showsProgress { FileHandle.standardError.write(Data("\n".utf8)) }
        if let out = context.arguments.value("out") {
            do {
                if FileManager.default.fileExists(atPath: out) { try FileManager.default.removeItem(atPath: out) }
                try FileManager.default.copyItem(atPath: url.path, toPath: out)
            } catch {
                throw ToolFailure("cannot copy the file to \(out): \(error.localizedDescription)")
            }
        }
        if context.json {
            try Output.json(["message": id.description, "name": file.name, "type": file.mediaType, "size": file.size, "path": context.arguments.value("out") ?? url.path,
                             "downloaded": !held])
        } else {
            Output.line(context.arguments.value("out") ?? url.path)
        }
    }

    /// A speaker as people see it: the free-form name with the identity beside it, so that
    /// nobody can pass for someone else by taking their name ("Bob (mallory)").
    static func shown(_ name: String?, _ identifier: String) -> String {
        guard let name, !name.isEmpty, name != identifier else { return identifier }
        return "\(name) (\(identifier))"
    }

    /// The group `text` names, when it names one: a group id (g-…), or with --group a group's
    /// id or name.
    static func group(_ text: String, _ store: ConversationStore, _ context: Context) throws -> Conversation? {
        guard context.arguments.has("group") || ((try? ZoneName(text)).flatMap(GroupMembership.creatorHash(of:)) != nil) else { return nil }
        return try GroupCommands.resolve(text, in: store)
    }

    static func conversation(_ store: ConversationStore, with other: String) throws -> Conversation {
        guard let conversation = try store.existingConversation(with: other) else { throw ToolFailure("no conversation with '\(other)'") }
        return conversation
    }

    static func encryption(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        guard let other = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        let conversation = try group(other, store, context) ?? conversation(store, with: other)
        let devices = try store.encryptionDevices(in: conversation.id)
        let members = conversation.isGroup ? try store.members(of: conversation.id).map(\.speaker) : [store.localSpeakerIdentifier ?? "", conversation.nonLocalSpeaker]
        if context.json {
            try Output.json(["conversation": conversation.id, "sealed": true, "members": members.map { member in
                ["id": member, "devices": devices.filter { $0.speaker == member }.map { ["key": Output.hex($0.deviceKey), "fingerprint": $0.fingerprint, "thisDevice": $0.isThisDevice] as [String: Any] }] as [String: Any]
            }])
            return
        }
        Output.line("\(conversation.id): messages are sealed (end-to-end encrypted) for these devices")
        for member in members {
            let name = shown((try? store.speaker(fromRef: SpeakerRef(identifier: member))?.name) ?? nil, member)
            let own = devices.filter { $0.speaker == member }
            Output.line("\(name): \(own.isEmpty ? "no device published yet (what is sent now waits for one)" : "\(own.count) device\(own.count == 1 ? "" : "s")")")
            for device in own { Output.line("  \(device.fingerprint)\(device.isThisDevice ? "  (this device)" : "")") }
        }
    }

    static func messages(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        guard let other = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        let limit = try context.arguments.int("limit", default: 20, range: 1...10_000)
        var cursor: MessageCursor? = nil
        if let text = context.arguments.value("before") {
            let parts = text.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, let time = Int64(parts[0]) else { throw UsageError("--before takes a cursor as printed ('<time>:<name>')") }
            cursor = MessageCursor(spokenAt: time, name: String(parts[1]))
        }
        let group = try group(other, store, context)
        let id = try group?.id ?? conversation(store, with: other).id
        let page = try store.messages(in: id, limit: limit, before: cursor, includeDeleted: true)
        let older = page.olderCursor.map { "\($0.spokenAt):\($0.name)" }
        // A group's membership changes, in the page's span: from its first message (from the
        // start on the oldest page) to its last (to now on the newest).
        let from = page.olderCursor == nil ? Date.distantPast : page.messages.first?.spokenAt ?? .distantPast
        let until = cursor == nil ? Date.distantFuture : page.messages.last?.spokenAt ?? .distantFuture
        var events = try group.map { try store.groupEvents(in: $0.id).filter { $0.at >= from && $0.at <= until } } ?? []
        // In a group, who read each of one's own messages, of the others in it now.
        let local = store.localSpeakerIdentifier ?? ""
        let others = try group.map { try store.members(of: $0.id).filter { $0.speaker != local }.count }
        func readBy(_ message: Message) throws -> [String]? {
            guard group != nil, message.speaker == local else { return nil }
            return try store.readers(of: message.id).map(\.speaker)
        }
        if context.json {
            var value: [String: Any] = ["messages": try page.messages.map { message in
                var entry = messageJSON(message)
                if let readers = try readBy(message) {
                    entry["readBy"] = readers
                    entry["deliveredTo"] = try store.deliveredTo(message.id)
                }
                let reactions = try store.reactions(to: message.id)
                if !reactions.isEmpty { entry["reactions"] = reactions.map(reactionJSON) }
                return entry
            }]
            if group != nil { value["events"] = events.map { ["at": Output.time($0.at), "actor": $0.actor, "action": $0.action.rawValue, "targets": $0.targets, "summary": $0.summary] as [String: Any] } }
            if let older { value["older"] = older }
            try Output.json(value)
            return
        }
        func printEvents(until time: Date) {
            while let event = events.first, event.at <= time {
                Output.line("\(Output.time(event.at)) — \(event.summary)")
                events.removeFirst()
            }
        }
        for message in page.messages {
            printEvents(until: message.spokenAt)
            let name = shown((try? store.speaker(fromRef: SpeakerRef(identifier: message.speaker))?.name) ?? nil, message.speaker)
            if message.isDeleted {
                Output.line([(Output.time(message.spokenAt), .dim), (" ", nil), (name, .bold), (": (a deleted message)  ", nil), (message.id.reference, .dim)])
                continue
            }
            // Ticks: read, else delivered (a group's per member: "delivered to 3, read by 1 of 4").
            let read = try readBy(message).map { readers -> String? in
                let ticks = [try store.deliveredTo(message.id).count, readers.count]
                let said = zip(["delivered to", "read by"], ticks).filter { $0.1 > 0 }.map { "\($0.0) \($0.1)" }
                return said.isEmpty ? nil : said.joined(separator: ", ") + " of \(others ?? 0)"
            } ?? (message.readAt != nil ? "read" : message.isDelivered ? "delivered" : nil)
            let reactions = try store.reactions(to: message.id)
            let flags = [message.isWaitingForKey ? "waiting for its key" : nil, message.custom.map { "custom: \($0.type)" },
                         message.attachment.map { "file: \($0.name), \(Output.bytes($0.size))" }, message.editedAt != nil ? "edited" : nil, read,
                         message.syncState == .synced ? nil : state(message.syncState), reactions.isEmpty ? nil : summary(of: reactions)].compactMap { $0 }
            // Above a reply, what it answers: the start of that message, or a placeholder.
            switch try store.parent(of: message.id) {
            case .message(let parent)?: Output.line("  ↪ \(parent.speaker): \(parent.content.prefix(40))\(parent.content.count > 40 ? "…" : "")")
            case .deleted?: Output.line("  ↪ (a deleted message)")
            case .notHeld?: Output.line("  ↪ (a message not synced yet)")
            case nil: break
            }
            Output.line([(Output.time(message.spokenAt), .dim), (" ", nil), (name, .bold), (": \(message.content)", nil),
                         (flags.isEmpty ? "" : "  [" + flags.joined(separator: ", ") + "]", .dim), ("  ", nil), (message.id.reference, .dim)])
        }
        printEvents(until: .distantFuture)
        if let older { Output.line("older: --before \(older)") }
    }

    static func conversations(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        let list = try store.conversations(includeArchived: context.arguments.has("archived"))
        if context.json { return try Output.json(list.map(conversationJSON)) }
        for conversation in list {
            let title = conversation.groupName.map { "\($0) (group)" } ?? conversation.nonLocalSpeaker
            let flags = [conversation.pinnedAt == nil ? nil : "pinned", conversation.isArchived ? "archived" : nil, conversation.isMuted() ? "muted" : nil,
                         conversation.isMarkedUnread ? "marked unread" : nil, conversation.draft == nil ? nil : "draft",
                         conversation.isBlocked ? "blocked" : nil].compactMap { $0 }
            Output.line("\(title)  \(conversation.unreadCount) unread  \(conversation.lastMessageAt.map(Output.time) ?? "-")"
                        + (flags.isEmpty ? "" : "  [" + flags.joined(separator: ", ") + "]") + "  \(conversation.id)")
        }
    }

    static func conversationJSON(_ conversation: Conversation) -> [String: Any] {
        var value: [String: Any] = ["id": conversation.id, "with": conversation.nonLocalSpeaker, "unread": conversation.unreadCount,
                                    "lastMessageAt": conversation.lastMessageAt.map(Output.time) ?? ""]
        if let name = conversation.groupName { value["group"] = name }
        if conversation.isArchived { value["archived"] = true }
        if let pinned = conversation.pinnedAt { value["pinnedAt"] = Output.time(pinned) }
        if let muted = conversation.mutedUntil, conversation.isMuted() { value["mutedUntil"] = muted == .distantFuture ? "forever" : Output.time(muted) }
        if conversation.isMarkedUnread { value["markedUnread"] = true }
        if let draft = conversation.draft { value["draft"] = draft }
        if conversation.isBlocked { value["blocked"] = true }
        return value
    }

    static func setConversation(_ context: Context) async throws {
        let store = try context.store()
        guard let other = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        let arguments = context.arguments
        for (yes, no) in [("archive", "unarchive"), ("pin", "unpin"), ("mute", "unmute")] where (arguments.has(yes) || arguments.value(yes) != nil) && arguments.has(no) {
            throw UsageError("--\(yes) and --\(no) together")
        }
        var mute: Date?? = arguments.has("unmute") ? .some(nil) : nil
        if let text = arguments.value("mute") {
            guard let until = text == "forever" ? Date.distantFuture : Double(text).flatMap({ $0 > 0 ? Date().addingTimeInterval($0) : nil }) else {
                throw UsageError("--mute takes a number of seconds, or 'forever'")
            }
            mute = until
        }
        let changes = ["archive", "unarchive", "pin", "unpin", "unmute", "unread"].contains(where: arguments.has) || mute != nil || arguments.value("draft") != nil
        guard changes else { throw UsageError("nothing to set: --archive, --unarchive, --pin, --unpin, --mute, --unmute, --unread or --draft") }
        let id = try (group(other, store, context) ?? conversation(store, with: other)).id
        if arguments.has("archive") || arguments.has("unarchive") { try await store.archive(id, arguments.has("archive")) }
        if arguments.has("pin") || arguments.has("unpin") { try await store.pin(id, arguments.has("pin")) }
        if let mute { try await store.mute(id, until: mute) }
        if arguments.has("unread") { try await store.markUnread(id) }
        if let draft = arguments.value("draft") { try await store.setDraft(draft, in: id) }
        guard let now = try store.conversations(includeArchived: true).first(where: { $0.id == id }) else { throw UsageError("no conversation with \(other)") }
        if context.json { return try Output.json(conversationJSON(now)) }
        let flags = [now.isArchived ? "archived" : nil, now.pinnedAt == nil ? nil : "pinned", now.isMuted() ? "muted" : nil,
                     now.isMarkedUnread ? "marked unread" : nil, now.draft == nil ? nil : "draft"].compactMap { $0 }
        Output.line("\(other): \(flags.isEmpty ? "none of archived, pinned, muted, marked unread, draft" : flags.joined(separator: ", "))")
    }

    static func removeConversation(_ context: Context) async throws {
        let store = try context.store()
        guard let other = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        try await store.removeConversation(with: other)
        try Output.result(context, ["removed": other], "the conversation with \(other) is removed from this store")
    }

    static func read(_ context: Context) async throws {
        let store = try context.store()
        guard let other = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        let conversation = try group(other, store, context) ?? conversation(store, with: other)
        let unread = conversation.unreadCount
        try await store.markAllAsRead(in: conversation.id)
        try Output.result(context, ["conversation": conversation.id, "markedRead": unread], "\(unread) marked read")
    }

    /// A message's text from a file or, for `-`, standard input — all of it, as one message,
    /// less one final newline (as `echo` and editors leave one).
    static func readText(from path: String) throws -> String {
        let what = path == "-" ? "standard input" : path
        guard let handle = path == "-" ? FileHandle.standardInput : FileHandle(forReadingAtPath: path) else { throw ToolFailure("cannot read \(path)") }
        defer { if path != "-" { try? handle.close() } }
        // Read no more than a message may hold (and a final newline), whatever comes down a pipe.
        let limit = Message.maximumContentBytes + 2
        var data = Data()
        while data.count < limit, let chunk = try handle.read(upToCount: limit - data.count), !chunk.isEmpty { data.append(chunk) }
        guard data.count < limit else { throw ToolFailure("\(what) holds more than a message may (\(Message.maximumContentBytes / 1024) KiB)") }
        guard var text = String(validating: data, as: UTF8.self) else { throw ToolFailure("\(what) is not UTF-8 text") }
        if text.hasSuffix("\n") || text.hasSuffix("\r\n") { text.removeLast() }
        guard !text.isEmpty else { throw ToolFailure("\(what) holds no text to send") }
        return text
    }

    /// A message as a person gives it: its full ID (`<conversation>/<name>`, as `--json`
    /// prints it) or the start of its reference (6 or more of the hex digits listings print),
    /// which must name one message of the store.
    static func messageID(_ text: String?, in store: ConversationStore) throws -> MessageID {
        guard let text, !text.isEmpty else { throw UsageError("missing <message>: its reference or ID, as 'convkit messages' lists it") }
        if let slash = text.firstIndex(of: "/") {
            return MessageID(conversation: String(text[..<slash]), name: String(text[text.index(after: slash)...]))
        }
        guard (MessageID.shortestReference...16).contains(text.count), text.allSatisfy(\.isHexDigit) else {
            throw UsageError("'\(text)' is not a message: give its reference (6 or more hex digits) or its ID, as 'convkit messages' lists them")
        }
        let found = try store.messages(referencedBy: text, limit: 5)
        guard let first = found.first else { throw ToolFailure("no message of this store has the reference '\(text)' ('convkit sync' first, or check it)") }
        guard found.count == 1 else {
            throw ToolFailure("'\(text)' is ambiguous: \(found.map(\.description).joined(separator: ", "))\(found.count == 5 ? ", …" : ""); give more of it, or the full ID")
        }
        return first
    }

    static func edit(_ context: Context) async throws {
        let store = try context.store()
        let id = try messageID(context.arguments.positional(0), in: store)
        guard let text = context.arguments.positional(1) else { throw UsageError("missing <text>") }
        let message = try await store.edit(id, content: text)
        if context.json { return try Output.json(messageJSON(message)) }
        Output.line("\(message.id.reference) edited, \(state(message.syncState))")
    }

    static func edits(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        let versions = try store.editHistory(of: try messageID(context.arguments.positional(0), in: store))
        if context.json { return try Output.json(versions.map { ["content": $0.content, "at": Output.time($0.at)] }) }
        for version in versions { Output.line("\(Output.time(version.at)) \(version.content)") }
    }

    static func search(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        guard let words = context.arguments.positional(0) else { throw UsageError("missing <words>") }
        var conversation: String?
        if let other = context.arguments.value("in") {
            conversation = try group(other, store, context)?.id ?? Self.conversation(store, with: other).id
        }
        let hits = try store.search(words, in: conversation, from: context.arguments.value("from"))
        if context.json { return try Output.json(hits.map { hit in var value = messageJSON(hit.message); value["snippet"] = hit.snippet; return value }) }
        if hits.isEmpty { Output.line("no message holds \(words)") }
        for hit in hits {
            Output.line([(Output.time(hit.message.spokenAt), .dim), (" ", nil), (hit.message.speaker, .bold), (": \(hit.snippet)  ", nil), (hit.message.id.reference, .dim)])
        }
    }

    static func mentions(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        let messages = try store.messagesMentioningMe()
        if context.json { return try Output.json(messages.map(messageJSON)) }
        if messages.isEmpty { Output.line("no messages mention you") }
        for message in messages {
            Output.line([(Output.time(message.spokenAt), .dim), (" ", nil), (message.speaker, .bold), (": \(message.content)  ", nil), (message.id.reference, .dim)])
        }
    }

    static func react(_ context: Context) async throws {
        let store = try context.store()
        let id = try messageID(context.arguments.positional(0), in: store)
        let emoji = context.arguments.positional(1)
        if context.arguments.has("remove") {
            guard emoji == nil else { throw UsageError("--remove takes no <emoji>") }
            try await store.removeReaction(from: id)
        } else {
            guard let emoji else { throw UsageError("missing <emoji> (or --remove)") }
            try await store.react(to: id, with: emoji)
        }
        let reactions = try store.reactions(to: id)
        if context.json { return try Output.json(["message": id.description, "reactions": reactions.map(reactionJSON)]) }
        Output.line(reactions.isEmpty ? "\(id.reference): no reactions" : "\(id.reference): \(summary(of: reactions))")
    }

    static func block(_ context: Context) async throws { try await setBlocked(context, true) }
    static func unblock(_ context: Context) async throws { try await setBlocked(context, false) }

    static func setBlocked(_ context: Context, _ blocking: Bool) async throws {
        let store = try context.store()
        guard let speaker = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        if blocking { try await store.block(speaker) } else { try await store.unblock(speaker) }
        if context.json { return try Output.json(["speaker": speaker, "blocked": blocking]) }
        Output.line(blocking ? "\(speaker) is blocked (their messages are hidden; sync to tell your other devices and the server)" : "\(speaker) is unblocked")
    }

    static func blocked(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        let speakers = try store.blockedSpeakers()
        if context.json { return try Output.json(speakers) }
        if speakers.isEmpty { Output.line("nobody is blocked") }
        for speaker in speakers { Output.line(speaker) }
    }

    static func reactionJSON(_ reaction: MessageReaction) -> [String: Any] {
        var value: [String: Any] = ["reactor": reaction.reactor, "emoji": reaction.emoji, "reactedAt": Output.time(reaction.reactedAt)]
        if reaction.isWaitingForKey { value["waitingForKey"] = true }
        return value
    }

    /// "👍 2 (alice, bob), ❤️ 1 (carol)": each emoji with its count and who, most first.
    static func summary(of reactions: [MessageReaction]) -> String {
        let shown = reactions.filter { !$0.isWaitingForKey }
        let groups = Dictionary(grouping: shown, by: \.emoji).sorted { ($0.value.count, $1.key) > ($1.value.count, $0.key) }
        var parts = groups.map { "\($0.key) \($0.value.count) (\($0.value.map(\.reactor).joined(separator: ", ")))" }
        if shown.count < reactions.count { parts.append("\(reactions.count - shown.count) waiting for its key") }
        return parts.joined(separator: ", ")
    }

    static func delete(_ context: Context) async throws {
        let store = try context.store()
        let id = try messageID(context.arguments.positional(0), in: store)
        try await store.delete(id)
        try Output.result(context, ["id": id.description, "reference": id.reference, "deleted": true], "\(id.reference) deleted")
    }

    static func speakerJSON(_ speaker: Speaker) -> [String: Any] {
        var value: [String: Any] = ["identifier": speaker.identifier, "name": speaker.name, "tags": speaker.tags, "trust": speaker.trust.rawValue]
        if let fingerprint = speaker.fingerprint { value["fingerprint"] = fingerprint }
        if let size = speaker.avatarSize { value["avatar"] = "\(size.width)x\(size.height)" }
        if let problem = speaker.avatarProblem { value["avatarProblem"] = problem }
        return value
    }

    static func printSpeakers(_ speakers: [Speaker], json: Bool) throws {
        if json { return try Output.json(speakers.map(speakerJSON)) }
        for speaker in speakers {
            Output.line("\(speaker.identifier) (\(speaker.name))\(speaker.tags.isEmpty ? "" : " tags: " + speaker.tags.joined(separator: ", "))  \(speaker.trust.rawValue)")
        }
    }

    static func speakers(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        var list = try store.allKnownSpeakers()
        if let tag = context.arguments.value("tag") { list = list.filter { $0.tags.contains(tag) } }
        try printSpeakers(list, json: context.json)
    }

    static func find(_ context: Context) async throws {
        guard let tag = context.arguments.value("tag") else { throw UsageError("--tag is required") }
        let store = try context.syncingStore()
        try printSpeakers(try await store.speakers(matching: SpeakerQuery(tag: tag)), json: context.json)
    }

    static func sync(_ context: Context) async throws {
        let store = try context.syncingStore()
        let bar = Output.Progress("syncing", total: 1)
        let report = try await store.sync { progress in bar.update(progress.zonesDone, of: progress.zones, note: "\(progress.pulled) records") }
        bar.finish()
        if context.json {
            try Output.json(["pushed": report.pushed, "pulled": report.pulled, "failed": report.failed, "deferred": report.deferred,
                             "quarantined": report.quarantined, "refetchedZones": report.refetchedZones, "avatarsDownloaded": report.avatarsDownloaded])
        } else {
            Output.line("pushed \(report.pushed), pulled \(report.pulled), failed \(report.failed), deferred \(report.deferred), quarantined \(report.quarantined)")
        }
    }

    static func retry(_ context: Context) async throws {
        let count = try await context.store().retryFailedMessages()
        try Output.result(context, ["retried": count], "\(count) failed message\(count == 1 ? "" : "s") back in the outbox")
    }

    static func fingerprint(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        guard let identifier = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        guard let speaker = try store.speaker(fromRef: SpeakerRef(identifier: identifier)) else {
            // Held back for a conflict: the keys that claim it, to compare.
            let candidates = try store.candidateFingerprints(for: identifier)
            guard !candidates.isEmpty else { throw ToolFailure("no speaker '\(identifier)' in the store") }
            if context.json { return try Output.json(["identifier": identifier, "fingerprint": "", "trust": "conflict", "candidates": candidates]) }
            Output.line("no key pinned: '\(identifier)' is claimed by \(candidates.count) unrelated keys; compare with them and 'convkit trust \(identifier) <fingerprint>':")
            for candidate in candidates { Output.line("  \(candidate)") }
            return
        }
        if context.json {
            try Output.json(["identifier": identifier, "fingerprint": speaker.fingerprint ?? "", "trust": speaker.trust.rawValue,
                             "candidates": try store.candidateFingerprints(for: identifier)])
        } else if let fingerprint = speaker.fingerprint {
            Output.line("\(fingerprint)  (\(speaker.trust.rawValue))")
        } else {
            Output.line("no key pinned; claimed by: \(try store.candidateFingerprints(for: identifier).joined(separator: " | "))")
        }
    }

    static func trust(_ context: Context) async throws {
        let store = try context.store()
        guard let identifier = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        if let text = context.arguments.value("introduction") {
            if let introduction = try? Introduction(text: text), introduction.introduced != identifier {
                throw ToolFailure("the introduction is of '\(introduction.introduced)', not '\(identifier)'")
            }
            let (_, introducer) = try await store.trust(introduction: text)
            try Output.result(context, ["verified": identifier, "introducedBy": introducer], "\(identifier) verified (introduced by \(introducer))")
            return
        }
        guard let fingerprint = context.arguments.positional(1) else { throw UsageError("missing <fingerprint> (or --introduction)") }
        try await store.trust(identifier, fingerprint: fingerprint)
        try Output.result(context, ["verified": identifier], "\(identifier) verified")
    }

    static func introduce(_ context: Context) async throws {
        guard let identifier = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        let introduction = try context.store(readOnly: true).introduction(of: identifier)
        try Output.result(context, ["introduction": introduction], introduction)
    }

    static func avatarSet(_ context: Context) async throws {
        let store = try context.store()
        guard let file = context.arguments.positional(0) else { throw UsageError("missing <file>") }
        let speaker = try await store.setAvatar(contentsOf: URL(fileURLWithPath: file))
        if context.json {
            try Output.json(["width": speaker.avatarSize?.width ?? 0, "height": speaker.avatarSize?.height ?? 0])
        } else {
            Output.line("avatar set: \(speaker.avatarSize?.description ?? "-") (pushed by the next sync)")
        }
    }

    static func avatarGet(_ context: Context) async throws {
        let store = try context.store()
        guard let identifier = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        guard let avatar = try await store.avatarImage(for: identifier) else {
            let problem = try store.speaker(fromRef: SpeakerRef(identifier: identifier))?.avatarProblem
            throw ToolFailure("\(identifier) has no avatar\(problem.map { ": \($0)" } ?? "")")
        }
        var path = try await store.avatarImageLocalURL(for: identifier)?.path ?? ""
        if let out = context.arguments.value("out") {
            try avatar.png.write(to: URL(fileURLWithPath: out))
            path = out
        }
        if context.json { try Output.json(["width": avatar.size.width, "height": avatar.size.height, "bytes": avatar.png.count, "file": path]) }
        else { Output.line("\(avatar.size) PNG, \(avatar.png.count) bytes: \(path)") }
    }

    static func deviceList(_ context: Context) async throws {
        let devices = try context.store(readOnly: true).devices()
        if context.json {
            try Output.json(devices.map { ["label": $0.label, "fingerprint": $0.fingerprint, "identityKey": $0.holdsIdentityKey, "thisDevice": $0.isThisDevice,
                                           "revokedAfter": $0.revokedAfter.map(Output.time) ?? ""] as [String: Any] })
            return
        }
        for device in devices {
            let notes = [device.isThisDevice ? "this device" : nil, device.holdsIdentityKey ? "identity key" : nil,
                         device.revokedAfter.map { "revoked after \(Output.time($0))" }].compactMap { $0 }
            Output.line("\(device.label)  \(device.fingerprint)\(notes.isEmpty ? "" : "  (" + notes.joined(separator: ", ") + ")")")
        }
    }

    static func doctor(_ context: Context) async throws {
        guard FileManager.default.fileExists(atPath: context.storePath) else { throw ToolFailure("no store at \(context.storePath)") }
        if context.arguments.has("rebuild") {
            guard let identifier = context.arguments.value("id") ?? context.settings().identity else {
                throw UsageError("--rebuild needs --id (the store does not say whose it is)")
            }
            let store = try await ConversationStore.rebuild(directory: context.storePath, identifier: identifier, backend: try context.backend())
            try context.rememberBackend(identity: identifier)
            let stats = try store.statistics()
            if context.json {
                try Output.json(["rebuilt": true, "identifier": identifier, "records": stats.records, "conversations": stats.conversations, "messages": stats.messages])
            } else {
                Output.line("rebuilt \(identifier)'s store from its backend: \(stats.records) records, \(stats.conversations) conversations, \(stats.messages) messages")
                Output.line("the damaged database was moved aside (store.sqlite.damaged-*)")
            }
            return
        }
        let problems = try storeProblems(context.storePath)
        if context.json { try Output.json(["healthy": problems.isEmpty, "problems": problems]) }
        else if problems.isEmpty { Output.line("the store at \(context.storePath) is healthy") }
        else { for problem in problems { Output.line("PROBLEM \(problem)") } }
        if !problems.isEmpty { throw ToolFailure("the store is damaged: 'convkit doctor --rebuild' rebuilds it from its backend") }
    }

    /// What ``ConversationStore/check()`` finds, or why the store does not even open as damaged.
    static func storeProblems(_ path: String) throws -> [String] {
        let result = Result { () throws(ConversationError) in try ConversationStore.inspecting(directory: path).check().problems }
        switch result {
        case .success(let problems): return problems
        case .failure(let error):
            guard error.code == .databaseCorrupt else { throw error }
            return [error.message]
        }
    }

    static func deviceJoin(_ context: Context) async throws {
        guard let code = context.arguments.positional(0) else { throw UsageError("missing <code>") }
        let store = try ConversationStore(directory: context.storePath, backend: try context.backend())
        let speaker = try await store.setupLocalSpeaker(linking: code, label: context.arguments.value("device") ?? defaultDevice())
        try context.rememberBackend(identity: speaker.identifier)
        try Output.result(context, ["identifier": speaker.identifier, "name": speaker.name, "store": context.storePath],
                          "this store is now a device of \(speaker.identifier) (\(speaker.name))")
    }

    static func deviceRevoke(_ context: Context) async throws {
        guard let which = context.arguments.positional(0) else { throw UsageError("missing <device>") }
        let store = try context.store()
        var matches = try store.devices().filter { ($0.label == which || $0.fingerprint == which) && !$0.isThisDevice }
        if matches.isEmpty, (try? context.backend()) != nil {
            // A device that joined since the last sync is known once its certificate is pulled.
            do { try await store.sync() } catch {
                throw ToolFailure("no other device '\(which)' in this store, and it cannot sync to look for one just linked: \(error.message)")
            }
            matches = try store.devices().filter { ($0.label == which || $0.fingerprint == which) && !$0.isThisDevice }
        }
        guard let device = matches.first else { throw ToolFailure("no other device '\(which)' (see 'convkit device list')") }
        guard matches.count == 1 else { throw ToolFailure("'\(which)' names \(matches.count) devices: give its fingerprint") }
        try await store.revokeDevice(device)
        try Output.result(context, ["revoked": device.label, "fingerprint": device.fingerprint], "\(device.label) revoked (pushed by the next sync)")
    }

    static func recoveryCreate(_ context: Context) async throws {
        let store = try context.store()
        let code = try await store.createRecoveryCode()
        var synced = true
        do { try await store.sync() } catch {
            synced = false
            FileHandle.standardError.write(Data("note: the recovery record is not on the backend yet (\(DisplayText.safe(error.message))); the next sync pushes it\n".utf8))
        }
        if context.json {
            try Output.json(["code": code, "synced": synced])
            return
        }
        Output.line(code)
        Output.line("Write this code down and keep it as you would a password: with it, 'convkit recovery restore' makes a new machine this identity.")
        Output.line("It replaces any code made before.")
    }

    static func recoveryRestore(_ context: Context) async throws {
        guard let identifier = context.arguments.positional(0) else { throw UsageError("missing <id>") }
        let text: String
        if let file = context.arguments.value("code-file") {
            guard let data = FileManager.default.contents(atPath: file) else { throw ToolFailure("cannot read \(file)") }
            text = String(decoding: data, as: UTF8.self)
        } else {
            if isatty(STDIN_FILENO) == 1 { FileHandle.standardError.write(Data("recovery code: ".utf8)) }
            text = readLine(strippingNewline: true) ?? ""
        }
        guard !text.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else { throw ToolFailure("no recovery code given (type it on standard input, or give --code-file)") }
        let store = try await ConversationStore.restore(directory: context.storePath, identifier: identifier, code: text, backend: try context.backend())
        try context.rememberBackend(identity: identifier)
        let stats = try store.statistics()
        if context.json {
            try Output.json(["restored": true, "identifier": identifier, "conversations": stats.conversations, "messages": stats.messages])
        } else {
            Output.line("this store is \(identifier)'s first device again: \(stats.conversations) conversations, \(stats.messages) messages")
        }
    }

    static func deviceLink(_ context: Context) async throws {
        let minutes = try context.arguments.int("minutes", default: 10, range: 1...1440)
        let code = try context.store().linkDevice(lifetime: TimeInterval(minutes * 60))
        try Output.result(context, ["code": code, "validMinutes": minutes], code)
    }
}
