import Foundation
import RecordZone
import Testing
import TestSupport

/// Text that came from someone else never reaches a terminal raw: every control, escape, bidi
/// and invisible format character a peer can put into a name, a tag, a message or a record name
/// goes through every `convkit` command that prints it, and the chat view, and comes out
/// visible (`<U+…>`); `--json` keeps it exact.
@Suite struct DisplaySafetyTests {
    /// What a command line can carry (no NUL) of the characters ``DisplayText`` makes visible.
    static let hostile = String(String.UnicodeScalarView(
        (Array(0x01...0x1F) + [0x7F] + Array(0x80...0x9F) + [0x00AD, 0x061C, 0x200B, 0x200E, 0x200F, 0x2028, 0x2029, 0x2060, 0xFEFF, 0xE0041]
            + Array(0x202A...0x202E) + Array(0x2066...0x2069)).compactMap(Unicode.Scalar.init)))
    static let forgedLine = "hi\r\u{1B}[2KBob: I owe Alice 500 EUR\u{1B}[2J"

    /// Whether printed text holds nothing a terminal would act on (line ends aside).
    static func isSafe(_ printed: String) -> Bool {
        !printed.unicodeScalars.contains { $0 != "\n" && DisplayText.isUnsafe($0) }
    }

    @Test func everyCommandThatPrintsPeerTextShowsItSafely() async throws {
        let dir = try TemporaryDirectory("convkit-escapes")
        let folder = dir.path + "/shared", alice = ["--store", dir.path + "/alice"], bob = ["--store", dir.path + "/bob"]
        func ok(_ arguments: [String]) async throws -> ConvkitTests.Run {
            let run = try await ConvkitTests.convkit(arguments)
            #expect(run.status == 0, "\(arguments): \(run.err)")
            return run
        }
        func printsSafely(_ arguments: [String], showing marker: String = "<U+202E>") async throws {
            let run = try await ok(arguments)
            #expect(Self.isSafe(run.out) && Self.isSafe(run.err), "\(arguments) printed raw: \(run.out.debugDescription)")
            #expect(run.out.contains(marker), "\(arguments): \(run.out)")
        }
        _ = try await ok(["init", "--id", "alice", "--name", "Alice" + Self.hostile, "--tag", "t" + Self.hostile, "--zone-dir", folder, "--device", "laptop"] + alice)
        _ = try await ok(["init", "--id", "bob", "--name", "Bob", "--zone-dir", folder, "--device", "phone"] + bob)
        _ = try await ok(["send", "bob", Self.forgedLine + Self.hostile, "--sync"] + alice)
        _ = try await ok(["sync"] + bob)
        let messages = try await ok(["messages", "alice"] + bob)
        #expect(messages.out.contains("hi<U+000D><U+001B>[2KBob: I owe Alice 500 EUR<U+001B>[2J"), "\(messages.out)")
        #expect(!messages.out.split(separator: "\n").contains { $0.hasPrefix("Bob:") })
        try await printsSafely(["messages", "alice"] + bob)
        // With attributes asked for, the only escapes are the tool's own (bold, dim, reset): a
        // peer's text is made safe before a part is styled.
        let styled = try await ok(["messages", "alice", "--color", "always"] + bob).out
        let ours = ["\u{1B}[1m", "\u{1B}[2m", "\u{1B}[0m"]
        #expect(ours.contains { styled.contains($0) }, "attributes were asked for: \(styled.debugDescription)")
        #expect(Self.isSafe(ours.reduce(styled) { $0.replacingOccurrences(of: $1, with: "") }), "\(styled.debugDescription)")
        try await printsSafely(["speakers"] + bob)
        try await printsSafely(["whoami"] + alice)
        try await printsSafely(["find", "--tag", "t" + Self.hostile] + bob)
        // The records themselves: the profile and the message.
        let zones = try #require(try await ok(["zones", "--json"] + bob).json as? [[String: Any]])
        let conversation = try #require(zones.compactMap { $0["zone"] as? String }.first { $0.hasPrefix("c-") })
        let listed = try #require(try await ok(["records", "list", "--zone", conversation, "--json"] + bob).json as? [[String: Any]])
        let name = try #require(listed.compactMap { $0["name"] as? String }.first { $0.hasPrefix("m.") })
        // Its content is sealed: as stored everywhere, opened on bob's store with --decrypt.
        try await printsSafely(["records", "show", "\(conversation)/\(name)"] + bob, showing: "shown as stored; --decrypt opens it")
        try await printsSafely(["records", "show", "\(conversation)/\(name)", "--decrypt"] + bob)
        try await printsSafely(["records", "show", "\(conversation)/\(name)", "--zone-dir", folder], showing: "shown as stored")
        // --json keeps the signed text exact.
        let json = try #require(try await ok(["messages", "alice", "--json"] + bob).json as? [String: Any])
        #expect((json["messages"] as? [[String: Any]])?.first?["content"] as? String == Self.forgedLine + Self.hostile)

        // A hostile folder writer: a forged message whose record name carries bidi and C1
        // characters (allowed in names) lands in the quarantine, which shows it safely.
        let mallory = try FileSystemBackend(root: folder, device: "mallory", policy: RecordPolicy())
        let hostileName = "m.\(OwnershipRule.identityHash("alice")).ffffffffffffffff-\u{202E}\u{9B}2J\u{2066}"
        var forged = Record(id: try RecordID(zone: ZoneName(conversation), name: hostileName), type: "Message",
                            fields: ["speaker": .string("alice"), "listener": .string("bob"), "content": .string(Self.forgedLine), "spokenAt": .date(Date())])
        try forged.sign(with: SigningKey.generate(), clock: HybridLogicalClock().now())
        _ = try await mallory.save([forged])
        _ = try await ok(["sync"] + bob)
        try await printsSafely(["quarantine"] + bob)
        let verify = try await ConvkitTests.convkit(["records", "verify", "--zone-dir", folder])
        #expect(verify.status == 1 && Self.isSafe(verify.out) && Self.isSafe(verify.err) && verify.out.contains("<U+202E>"), "\(verify.out)")
    }

    /// The issue's forged line, and a screen clear, in a real terminal: the line stays alice's,
    /// on one row, and the header is still there.
    @Test func theChatViewShowsEscapesInsteadOfObeyingThem() async throws {
        let dir = try TemporaryDirectory("convkit-chat-escapes")
        let folder = dir.path + "/shared", alice = ["--store", dir.path + "/alice"], bob = ["--store", dir.path + "/bob"]
        #expect(try await ConvkitTests.convkit(["init", "--id", "alice", "--name", "Alice\u{202E}", "--zone-dir", folder, "--device", "laptop"] + alice).status == 0)
        #expect(try await ConvkitTests.convkit(["init", "--id", "bob", "--name", "Bob", "--zone-dir", folder, "--device", "phone"] + bob).status == 0)
        #expect(try await ConvkitTests.convkit(["send", "bob", Self.forgedLine, "--sync"] + alice).status == 0)
        // A window title (OSC 2) and a colour: shown, not obeyed.
        #expect(try await ConvkitTests.convkit(["send", "bob", "\u{1B}]2;pwned\u{07}\u{1B}[31mred", "--sync"] + alice).status == 0)
        #expect(try await ConvkitTests.convkit(["sync"] + bob).status == 0)
        let session = "convkit-esc-\(UUID().uuidString.prefix(8))"
        let command = "\(try builtProduct("convkit")) chat alice --store \(dir.path)/bob; sleep 30"
        _ = try await ConvkitChatTests.tmux(["new-session", "-d", "-s", session, "-x", "120", "-y", "20", command], server: session)
        defer { ConvkitChatTests.endTmux(session) }
        var screen = ""
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            screen = try await ConvkitChatTests.tmux(["capture-pane", "-p", "-t", session], server: session)
            if screen.contains("500 EUR") { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(screen.contains("Chat with Alice<U+202E> (alice)"), "the header survives: \(screen)")
        #expect(screen.contains("Alice<U+202E> (alice): hi<U+000D><U+001B>[2KBob: I owe Alice 500 EUR<U+001B>[2J"), "\(screen)")
        #expect(!screen.split(separator: "\n").contains { $0.hasPrefix("Bob: I owe") })
        #expect(screen.contains("<U+001B>]2;pwned<U+0007><U+001B>[31mred"), "\(screen)")
        let title = try await ConvkitChatTests.tmux(["display", "-p", "-t", session, "#{pane_title}"], server: session)
        #expect(!title.contains("pwned"), "\(title)")
        let attributes = try await ConvkitChatTests.tmux(["capture-pane", "-p", "-e", "-t", session], server: session)
        #expect(!attributes.contains("\u{1B}[31m"), "no red: \(attributes.debugDescription)")
        _ = try await ConvkitChatTests.tmux(["send-keys", "-t", session, "C-c"], server: session)
    }
}
