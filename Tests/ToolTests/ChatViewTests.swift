import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// The chat view's keys and screen in a real terminal (tmux): scrolling back, editing, pasting,
/// resizing, the conversation list, commands that reply, react and download, and the terminal
/// given back on every way out.
@Suite(.serialized) struct ChatViewTests {
    typealias Session = ConvkitChatTests.Session

    /// Alice and bob (and `others`) on a folder, alice having said `first` to bob; bob synced.
    static func people(_ label: String, others: [String] = []) async throws -> (TemporaryDirectory, alice: [String], bob: [String]) {
        let dir = try TemporaryDirectory(label)
        let folder = dir.path + "/shared"
        for who in ["alice", "bob"] + others {
            let run = try await ConvkitTests.convkit(["init", "--id", who, "--name", who.capitalized, "--zone-dir", folder, "--device", who + "-laptop", "--store", dir.path + "/" + who])
            #expect(run.status == 0, "\(run.err)")
        }
        let alice = ["--store", dir.path + "/alice"], bob = ["--store", dir.path + "/bob"]
        #expect(try await ConvkitTests.convkit(["send", "bob", "first", "--sync"] + alice).status == 0)
        #expect(try await ConvkitTests.convkit(["sync"] + bob).status == 0)
        return (dir, alice, bob)
    }

    /// The contents alice's store holds of her conversation with bob, after a sync.
    static func contents(_ alice: [String]) async throws -> [String] {
        _ = try await ConvkitTests.convkit(["sync"] + alice)
        let listed = try await ConvkitTests.convkit(["messages", "bob", "--limit", "100", "--json"] + alice)
        return ((listed.json as? [String: Any])?["messages"] as? [[String: Any]])?.compactMap { $0["content"] as? String } ?? []
    }

    /// Whether alice's store gets `text` from bob within 10 s.
    static func reaches(_ alice: [String], _ text: String) async throws -> Bool {
        for _ in 0..<40 {
            if try await contents(alice).contains(text) { return true }
            try await Task.sleep(for: .milliseconds(250))
        }
        return false
    }

    /// 500 messages: the newest show; PageUp goes back (older pages are loaded as it goes) to
    /// the very first; the wheel scrolls three lines; End on an empty line comes back down.
    @Test func scrollsBackThroughFiveHundredMessages() async throws {
        let (dir, _, bob) = try await Self.people("convkit-view-scroll")
        // Written through the API (500 processes would take a loaded machine a minute).
        let store = try ConversationStore(directory: dir.path + "/alice", backend: .folder(dir.path + "/shared", device: "alice-laptop"))
        for index in 1...500 { _ = try await store.send(String(format: "m %03d", index), to: "bob") }
        let report = try await store.sync()
        #expect(report.pushed >= 500)
        #expect(try await ConvkitTests.convkit(["sync"] + bob).status == 0)
        let view = try await Session("alice " + bob.joined(separator: " "), in: dir.path)
        defer { view.kill() }
        let opened = try await view.eventually(10) { $0.contains("Alice (alice): m 500") }
        let newest = try await view.screen()
        #expect(opened && !newest.contains("m 001") && !newest.contains("scrolled back"), "\(newest)")
        var pressed = 0
        while pressed < 60, !(try await view.screen().contains("Alice (alice): first")) {
            try await view.type("PPage")
            pressed += 1
            try await Task.sleep(for: .milliseconds(150))
        }
        let top = try await view.screen()
        #expect(top.contains("Alice (alice): first") && top.contains("Alice (alice): m 001") && !top.contains("m 500"), "\(top)")
        #expect(top.contains("scrolled back"), "the status line says so: \(top)")
        #expect(pressed >= 30, "500 messages are more than 30 pages of 15 lines: \(pressed)")
        // The wheel (an X10 mouse report: button 5, down): three lines newer.
        _ = try await ConvkitChatTests.tmux(["send-keys", "-t", view.name, "-H", "1b", "5b", "4d", "61", "30", "30"], server: view.name)
        let wheeled = try await view.eventually(5) { screen in
            let rows = screen.split(separator: "\n")
            return rows.count > 1 && rows[1].contains("Alice (alice): m 003") && !screen.contains("m 001") && !screen.contains("m 002")
        }
        let afterWheel = try await view.screen()
        #expect(wheeled, "\(afterWheel)")
        try await view.type("End")
        let back = try await view.eventually(5) { $0.contains("Alice (alice): m 500") && !$0.contains("scrolled back") }
        let bottom = try await view.screen()
        #expect(back, "\(bottom)")
        #expect(try await view.leave() == "0")
    }

    /// Left, Right, Home, End, Backspace and Ctrl-W edit the line; Up brings back what was sent.
    @Test func editsTheLineAndRemembersWhatWasSent() async throws {
        let (dir, alice, bob) = try await Self.people("convkit-view-edit")
        let view = try await Session("alice " + bob.joined(separator: " "), in: dir.path)
        defer { view.kill() }
        #expect(try await view.eventually(10) { $0.contains("Alice (alice): first") })
        try await view.type("world", "Home", "hello ", "End", "!", "Left", "Left", "BSpace", "Right", "Right", " again")
        let edited = try await view.eventually(5) { $0.contains("> hello word! again") }
        let line = try await view.screen()
        #expect(edited, "\(line)")
        try await view.type("C-w", "Enter")
        #expect(try await view.eventually(5) { $0.contains("Bob (bob): hello word!") })
        try await view.type("Up")
        let recalled = try await view.eventually(5) { $0.contains("> hello word!") && !$0.contains("again") }
        let history = try await view.screen()
        #expect(recalled, "\(history)")
        try await view.type("C-u", "second line", "Enter")
        #expect(try await Self.reaches(alice, "second line"))
        #expect(try await Self.contents(alice) == ["first", "hello word! ", "second line"])
        #expect(try await view.leave() == "0")
    }

    /// A block of five lines pasted (bracketed paste) is one message of five lines.
    @Test func aPastedBlockIsOneMessage() async throws {
        let (dir, alice, bob) = try await Self.people("convkit-view-paste")
        let view = try await Session("alice " + bob.joined(separator: " "), in: dir.path)
        defer { view.kill() }
        #expect(try await view.eventually(10) { $0.contains("Alice (alice): first") })
        let block = (1...5).map { "pasted line \($0)" }.joined(separator: "\n")
        try block.write(toFile: dir.path + "/block", atomically: true, encoding: .utf8)
        let buffer = "convkit-paste-\(UUID().uuidString.prefix(8))"
        _ = try await ConvkitChatTests.tmux(["load-buffer", "-b", buffer, dir.path + "/block"], server: view.name)
        _ = try await ConvkitChatTests.tmux(["paste-buffer", "-p", "-d", "-b", buffer, "-t", view.name], server: view.name)
        let waiting = try await view.eventually(5) { $0.contains("> pasted line 1↵pasted line 2↵") }
        let typed = try await view.screen()
        #expect(waiting, "the block waits for Enter: \(typed)")
        try await view.type("Enter")
        let shown = try await view.eventually(5) { $0.contains("Bob (bob): pasted line 1") && $0.contains("  pasted line 5") }
        let screen = try await view.screen()
        #expect(shown, "\(screen)")
        #expect(try await Self.reaches(alice, block))
        #expect(try await Self.contents(alice) == ["first", block], "one message")
        // 32 KiB in 640 lines: one message too, in one go.
        let large = (1...640).map { String(format: "%03d ", $0) + String(repeating: "x", count: 46) }.joined(separator: "\n")
        try large.write(toFile: dir.path + "/large", atomically: true, encoding: .utf8)
        _ = try await ConvkitChatTests.tmux(["load-buffer", "-b", buffer, dir.path + "/large"], server: view.name)
        _ = try await ConvkitChatTests.tmux(["paste-buffer", "-p", "-d", "-b", buffer, "-t", view.name], server: view.name)
        #expect(try await view.eventually(10) { $0.contains("640 xxxx") })
        try await view.type("Enter")
        #expect(try await view.eventually(10) { $0.contains("  640 xxxx") && !$0.contains("↵") })
        #expect(try await Self.reaches(alice, large))
        #expect(try await Self.contents(alice) == ["first", block, large])
        #expect(try await view.leave() == "0")
    }

    /// From 120×40 to 60×20: the list beside goes, and a long message is wrapped again at the
    /// new width (every word whole), CJK and emoji counted two columns.
    @Test func aResizeWrapsAgain() async throws {
        let (dir, alice, bob) = try await Self.people("convkit-view-resize")
        let words = (1...16).map { String(format: "word%02d", $0) }
        #expect(try await ConvkitTests.convkit(["send", "bob", (words + ["中文字符", "😀😀", "end."]).joined(separator: " "), "--sync"] + alice).status == 0)
        #expect(try await ConvkitTests.convkit(["sync"] + bob).status == 0)
        let view = try await Session("alice " + bob.joined(separator: " "), in: dir.path, width: 120, height: 40)
        defer { view.kill() }
        #expect(try await view.eventually(10) { $0.contains("end.") })
        func rows(_ screen: String) -> [String] { screen.split(separator: "\n").map(String.init).filter { $0.contains("word") || $0.contains("end.") || $0.contains("中文") } }
        let wide = try await view.screen()
        #expect(wide.contains("▸ Alice (alice)") && wide.contains("│"), "the list beside: \(wide)")
        _ = try await ConvkitChatTests.tmux(["resize-window", "-t", view.name, "-x", "60", "-y", "20"], server: view.name)
        let narrowed = try await view.eventually(5) { !$0.contains("│") && $0.contains("end.") }
        let narrow = try await view.screen()
        #expect(narrowed, "\(narrow)")
        #expect(rows(narrow).count > rows(wide).count, "wrapped again: \(rows(wide)) → \(rows(narrow))")
        let text = rows(narrow).joined(separator: " ")
        for word in words + ["中文字符", "😀😀", "end."] { #expect(text.contains(word), "\(word) whole in \(rows(narrow))") }
        // tmux counts a wide character two columns: no row is wider than the terminal.
        for row in narrow.split(separator: "\n") {
            let columns = row.unicodeScalars.reduce(0) { $0 + (($1.value >= 0x1100 && $1.properties.isEmojiPresentation) || (0x4E00...0x9FFF).contains($1.value) ? 2 : 1) }
            #expect(columns <= 60, "\(row)")
        }
        #expect(try await view.leave() == "0")
    }

    /// Ctrl-C, SIGTERM and a crash (SIGSEGV) each give the terminal back: its settings (`stty
    /// -a`) and what it showed before.
    @Test(arguments: ["C-c", "TERM", "SEGV"]) func everyWayOutGivesTheTerminalBack(_ way: String) async throws {
        let (dir, _, bob) = try await Self.people("convkit-view-restore")
        let view = try await Session("alice " + bob.joined(separator: " "), in: dir.path, before: "echo BEFORE THE CHAT; stty -a > \(dir.path)/before; ",
                                     after: "stty -a > \(dir.path)/after; ")
        defer { view.kill() }
        let opened = try await view.eventually(10) { $0.contains("Alice (alice): first") }
        let during = try await view.screen()
        #expect(opened && !during.contains("BEFORE THE CHAT"), "\(during)")
        if way == "C-c" { try await view.type("C-c") } else { try await view.signal(way) }
        let status = try await view.status()
        #expect(status == ["C-c": "0", "TERM": "143", "SEGV": "139"][way], "\(String(describing: status))")
        let before = try String(contentsOfFile: dir.path + "/before", encoding: .utf8)
        let after = try String(contentsOfFile: dir.path + "/after", encoding: .utf8)
        #expect(before == after && before.contains("icanon") && before.contains(" echo "), "\(before)\n\(after)")
        let screen = try await view.screen()
        #expect(screen.contains("BEFORE THE CHAT") && !screen.contains("Alice (alice): first"), "\(screen)")
    }

    /// /reply and /react (the newest from alice when no reference is given), /download by
    /// reference: each reaches alice's store, or the file is there.
    @Test func repliesReactsAndDownloadsFromInside() async throws {
        let (dir, alice, bob) = try await Self.people("convkit-view-commands")
        let payload = Data((0..<3000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        try payload.write(to: URL(fileURLWithPath: dir.path + "/notes.bin"))
        let attached = try await ConvkitTests.convkit(["send", "bob", "the notes", "--attach", dir.path + "/notes.bin", "--sync", "--json"] + alice)
        let reference = try #require((attached.json as? [String: Any])?["reference"] as? String, "\(attached.out) \(attached.err)")
        #expect(try await ConvkitTests.convkit(["send", "bob", "how are you?", "--sync"] + alice).status == 0)
        #expect(try await ConvkitTests.convkit(["sync"] + bob).status == 0)
        let view = try await Session("alice " + bob.joined(separator: " "), in: dir.path)
        defer { view.kill() }
        let opened = try await view.eventually(10) { $0.contains("Alice (alice): how are you?") && $0.contains("/download \(reference.prefix(6))") }
        let first = try await view.screen()
        #expect(opened, "the file and its command: \(first)")
        try await view.type("/react 👍", "Enter")
        #expect(try await view.eventually(5) { $0.contains("how are you?  (👍 1 (bob))") })
        try await view.type("/reply fine, thanks", "Enter")
        let replied = try await view.eventually(5) { $0.contains("↪ Alice (alice): how are you?") && $0.contains("Bob (bob): fine, thanks") }
        let reply = try await view.screen()
        #expect(replied, "\(reply)")
        try await view.type("/download \(reference.prefix(6)) \(dir.path)/got.bin", "Enter")
        let downloaded = try await view.eventually(10) { $0.contains("notes.bin: \(dir.path)/got.bin") }
        let saved = try await view.screen()
        #expect(downloaded, "\(saved)")
        #expect(FileManager.default.contents(atPath: dir.path + "/got.bin") == payload)
        // A reference that names nothing here is refused, not taken for the emoji.
        try await view.type("/react abcdef01 👍", "Enter")
        let refused = try await view.eventually(5) { $0.contains("/react: no message 'abcdef01' here") }
        let refusal = try await view.screen()
        #expect(refused, "\(refusal)")
        // On alice's side: the reply answers her question, the reaction is bob's.
        #expect(try await Self.reaches(alice, "fine, thanks"))
        let listed = try await ConvkitTests.convkit(["messages", "bob", "--json"] + alice)
        let messages = ((listed.json as? [String: Any])?["messages"] as? [[String: Any]]) ?? []
        let question = try #require(messages.first { $0["content"] as? String == "how are you?" })
        let answer = try #require(messages.first { $0["content"] as? String == "fine, thanks" })
        #expect(answer["replyTo"] as? String == question["id"] as? String, "\(answer)")
        let shown = try await ConvkitTests.convkit(["messages", "bob"] + alice).out
        #expect(shown.split(separator: "\n").contains { $0.contains("how are you?") && $0.contains("👍 1 (bob)") }, "\(shown)")
        #expect(try await view.leave() == "0")
    }

    /// Another conversation's new message shows in the list with its count; Tab opens it, with
    /// a line above what was unread; what was being typed stays as the draft of the conversation
    /// it was typed in (Shift-Tab back shows it, and the store keeps it after the view ends).
    @Test func theListShowsUnreadAndTabOpensIt() async throws {
        let (dir, _, bob) = try await Self.people("convkit-view-list", others: ["carol"])
        let carol = ["--store", dir.path + "/carol"]
        let view = try await Session("alice " + bob.joined(separator: " "), in: dir.path)
        defer { view.kill() }
        #expect(try await view.eventually(10) { $0.contains("Alice (alice): first") })
        #expect(try await ConvkitTests.convkit(["send", "bob", "hi from carol", "--sync"] + carol).status == 0)
        #expect(try await ConvkitTests.convkit(["send", "bob", "are you there?", "--sync"] + carol).status == 0)
        let counted = try await view.eventually(10) { $0.contains("Carol (carol) (2)") }
        let list = try await view.screen()
        #expect(counted, "\(list)")
        try await view.type("half a thought")
        #expect(try await view.eventually(5) { $0.contains("> half a thought") })
        try await view.type("Tab")
        let opened = try await view.eventually(5) { $0.contains("Chat with Carol (carol)") && $0.contains("Carol (carol): are you there?") }
        let carolsView = try await view.screen()
        #expect(opened, "\(carolsView)")
        let lines = carolsView.split(separator: "\n").map(String.init)
        let rule = lines.firstIndex { $0.contains("─ new ─") }, message = lines.firstIndex { $0.contains("Carol (carol): hi from carol") }
        #expect(rule != nil && message != nil && rule! + 1 == message!, "the line above the first unread: \(carolsView)")
        #expect(!carolsView.contains("Carol (carol) (2)"), "read once shown: \(carolsView)")
        #expect(!carolsView.contains("half a thought"), "the line was alice's conversation's: \(carolsView)")
        try await view.type("BTab")
        let back = try await view.eventually(5) { $0.contains("Chat with Alice (alice)") && $0.contains("> half a thought") }
        let alicesView = try await view.screen()
        #expect(back, "its draft again: \(alicesView)")
        try await view.type(" and more")
        #expect(try await view.leave() == "0")
        let listed = try await ConvkitTests.convkit(["conversations", "--json"] + bob)
        let drafts = ((listed.json as? [[String: Any]]) ?? []).compactMap { $0["draft"] as? String }
        #expect(drafts == ["half a thought and more"], "kept on leaving: \(listed.out)")
    }
}
