// convkit-store-sync: opens a store on a folder backend and syncs it once, printing one
// "added <message>" line per message as each pulled page commits. The tests run it as a real
// process and kill it with SIGKILL mid-pull; the folder soak (scripts/soak-folder.sh) also has
// it send messages ("acked <message>" once each is synced) and check a store at the end.
import ConversationKit
import Foundation
import RecordZone
import SQLiteKit
import ToolSupport

let command = Command(
    "convkit-store-sync", "Sync one ConversationKit store with a folder backend, once.",
    synopsis: "--store <dir> --folder <dir> --device <name> --identifier <id> [--page-size <n>] [--send-to <id> --count <n> --prefix <p> [--senders <n>]] [--check] [--avatar-of <id> [--reads <n>]]",
    options: [
        .valued("store", "dir", "The store directory."),
        .valued("folder", "dir", "The shared zone folder."),
        .valued("device", "name", "The device to write to the folder as."),
        .valued("identifier", "id", "The local speaker (set up on first use)."),
        .valued("page-size", "n", "Records per pulled page. (default: 200)"),
        .valued("kill-self-after", "n", "Send itself SIGKILL once n messages were applied (crash tests)."),
        .valued("send-to", "id", "Send --count messages to this speaker, syncing after each, and print \"acked <message>\" for each once it is synced."),
        .valued("count", "n", "How many messages to send."),
        .valued("senders", "n", "Send --count messages from n concurrent callers instead, without syncing, and print \"sent <message>\" for each as its send returns (durable). (default: 0)"),
        .valued("prefix", "p", "The messages' text prefix."),
        .flag("check", "After the sync, print \"message <id> <text>\" per message of every conversation and \"integrity <result>\" from SQLite's integrity check."),
        .valued("avatar-of", "id", "Instead of syncing, read this speaker's avatar --reads times and print \"avatar <width>x<height> <sha256 hex>\" or \"error <code>\" for each."),
        .valued("reads", "n", "How many times. (default: 1)"),
        .valued("pause-ms", "ms", "Wait this long between reads. (default: 0)"),
        .valued("clock-offset", "seconds", "Run with the wall clock this far off (a clock jump, ahead or back). (default: 0)"),
    ])
let usage = command.help

func fail(_ message: String, code: Int32) -> Never {
    exitWithError(message, help: code == 64 ? usage : nil, tool: "convkit-store-sync")
}

let parsed = parseOrExit(Array(CommandLine.arguments.dropFirst()), command, tool: "convkit-store-sync")
let options = parsed
guard let storePath = options.value("store"), let folder = options.value("folder"), let device = options.value("device"), let identifier = options.value("identifier") else {
    fail("--store, --folder, --device and --identifier are required", code: 64)
}
var configuration = StoreConfiguration()
let killAfter = options.value("kill-self-after").flatMap(Int.init)
if let text = options.value("clock-offset") {
    guard let offset = Double(text) else { fail("--clock-offset takes seconds", code: 64) }
    configuration.now = { Date().addingTimeInterval(offset) }
}
if let pageSize = options.value("page-size") {
    guard let value = Int(pageSize), value > 0 else { fail("--page-size must be a positive number", code: 64) }
    configuration.pageSize = value
}

do {
    let store = try ConversationStore(directory: storePath, backend: .folder(folder, device: device), configuration: configuration)
    if store.localSpeakerIdentifier == nil {
        try await store.setupLocalSpeaker(identifier: identifier, name: identifier)
    }
    if let speaker = options.value("avatar-of") {
        // Another process reading a store's image cache (the store's own process keeps the backend).
        var lines = ""
        let pause = options.value("pause-ms").flatMap(Int.init) ?? 0
        for _ in 0..<(options.value("reads").flatMap(Int.init) ?? 1) {
            if pause > 0 { try await Task.sleep(for: .milliseconds(pause)) }
            do {
                if let avatar = try await store.avatarImage(for: speaker) {
                    lines += "avatar \(avatar.size.width)x\(avatar.size.height) \(AssetReference(for: avatar.png).hexHash)\n"
                } else {
                    lines += "none\n"
                }
            } catch {
                lines += "error \(error.code.rawValue)\n"
            }
        }
        FileHandle.standardOutput.write(Data(lines.utf8))
        exit(0)
    }
    let events = store.events()
    let printer = Task {
        var added = 0
        for await event in events {
            guard case .messageAdded(let id) = event else { continue }
            FileHandle.standardOutput.write(Data("added \(id.name)\n".utf8))
            added += 1
            // A crash while the sync goes on pulling and applying the next pages.
            if let killAfter, added >= killAfter { kill(getpid(), SIGKILL) }
        }
    }
    if let listener = options.value("send-to"), let senders = options.value("senders").flatMap(Int.init), senders > 0 {
        // Concurrent sends into one store (group commit), each printed once its send returned.
        let count = options.value("count").flatMap(Int.init) ?? 1, prefix = options.value("prefix") ?? "m"
        try await withThrowingTaskGroup(of: Void.self) { group in
            for sender in 0..<senders {
                group.addTask {
                    for n in stride(from: sender, to: count, by: senders) {
                        let message = try await store.send("\(prefix)-\(n)", to: listener)
                        FileHandle.standardOutput.write(Data("sent \(message.id.name)\n".utf8))
                    }
                }
            }
            try await group.waitForAll()
        }
    } else if let listener = options.value("send-to") {
        let count = options.value("count").flatMap(Int.init) ?? 1
        for n in 0..<count {
            let message = try await store.send("\(options.value("prefix") ?? "m")-\(n)", to: listener)
            try await store.sync()
            let state = try store.messages(in: message.id.conversation, limit: 1000).messages.first { $0.id == message.id }?.syncState
            if state == .synced { FileHandle.standardOutput.write(Data("acked \(message.id.name)\n".utf8)) }
        }
    }
    let report = try await store.sync()
    try await Task.sleep(for: .milliseconds(50))
    printer.cancel()
    if parsed.has("check") {
        var lines = ""
        for conversation in try store.conversations(includeArchived: true) {
            var cursor: MessageCursor? = nil
            repeat {
                let page = try store.messages(in: conversation.id, limit: 500, before: cursor)
                for message in page.messages { lines += "message \(message.id.name) \(message.content)\n" }
                cursor = page.olderCursor
            } while cursor != nil
        }
        let database = try Database(path: storePath + "/store.sqlite")
        let integrity = try database.first("PRAGMA integrity_check") { $0.text(0) } ?? "none"
        lines += "integrity \(integrity)\n"
        FileHandle.standardOutput.write(Data(lines.utf8))
    }
    FileHandle.standardOutput.write(Data("done pulled=\(report.pulled) pushed=\(report.pushed) quarantined=\(report.quarantined)\n".utf8))
} catch {
    fail("\(error)", code: 1)
}
