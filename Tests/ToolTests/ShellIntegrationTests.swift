import Foundation
import Testing
import TestSupport

/// `convkit completions` and `convkit man` in the real programs that read them: an interactive
/// bash in a real terminal (tmux) completing on Tab, fish's and zsh's completion systems, and
/// man and groff.
@Suite(.serialized) struct ShellIntegrationTests {
    static func run(_ executable: String, _ arguments: [String]) async throws -> ConvkitTests.Run {
        let child = try ChildProcess(executable, arguments)
        let status = await child.wait()
        return ConvkitTests.Run(status: status, out: child.standardOutput, err: child.standardError)
    }

    static var toolDirectory: String { get throws { URL(fileURLWithPath: try builtProduct("convkit")).deletingLastPathComponent().path } }

    /// Tab in an interactive bash: `convkit gro` becomes `convkit group`, a nested command and
    /// an option complete too, and a path option completes file names.
    @Test func bashCompletesOnTab() async throws {
        let dir = try TemporaryDirectory("convkit-bash")
        try Data().write(to: URL(fileURLWithPath: dir.path + "/notes.txt"))
        let session = "convkit-bash-\(UUID().uuidString.prefix(8))"
        _ = try await ConvkitChatTests.tmux(["new-session", "-d", "-s", session, "-x", "120", "-y", "20", "-c", dir.path,
                                             "env -i HOME=\(dir.path) TERM=xterm PATH=\(try Self.toolDirectory):/usr/bin:/bin bash --norc --noprofile -i"], server: session)
        defer { ConvkitChatTests.endTmux(session) }
        func type(_ keys: String...) async throws { _ = try await ConvkitChatTests.tmux(["send-keys", "-t", session] + keys, server: session) }
        /// Whether a line of the screen is `line` (tmux drops the space a completion leaves).
        func screen(shows line: String) async throws -> Bool {
            let wanted = line.trimmingCharacters(in: .whitespaces)
            for _ in 0..<50 {
                let lines = try await ConvkitChatTests.tmux(["capture-pane", "-p", "-t", session], server: session).split(separator: "\n")
                if lines.contains(where: { $0.trimmingCharacters(in: .whitespaces) == wanted }) { return true }
                try await Task.sleep(for: .milliseconds(100))
            }
            return false
        }
        try await type("PS1='$ '; source <(convkit completions bash) && source <(convkitd completions bash) && echo loaded", "Enter")
        #expect(try await screen(shows: "loaded"), "the script loads")
        for (typed, completed) in [("convkit gro", "convkit group "), ("convkit records sh", "convkit records show "),
                                   ("convkit send bob --atta", "convkit send bob --attach "), ("convkit send bob --attach no", "convkit send bob --attach notes.txt "),
                                   ("convkitd se", "convkitd serve "), ("convkitd sync --poll", "convkitd sync --poll-interval ")] {
            try await type(typed, "Tab")
            let shown = try await screen(shows: "$ " + completed)
            let pane = try await ConvkitChatTests.tmux(["capture-pane", "-p", "-t", session], server: session)
            #expect(shown, "\(typed)<Tab>: \(pane)")
            try await type("C-u")
        }
    }

    /// Attributes (bold names, dim times) on a terminal, none with NO_COLOR or `--color never`,
    /// none into a pipe unless `--color always`.
    @Test func colorsFollowTheTerminalNoColorAndTheOption() async throws {
        let dir = try TemporaryDirectory("convkit-color")
        let convkit = try builtProduct("convkit"), folder = dir.path + "/shared"
        for (who, device) in [("alice", "laptop"), ("bob", "phone")] {
            #expect(try await Self.run(convkit, ["init", "--id", who, "--name", who, "--zone-dir", folder, "--device", device, "--store", dir.path + "/" + who]).status == 0)
        }
        #expect(try await Self.run(convkit, ["send", "bob", "hello", "--sync", "--store", dir.path + "/alice"]).status == 0)
        #expect(try await Self.run(convkit, ["sync", "--store", dir.path + "/bob"]).status == 0)
        let list = "'\(convkit)' messages alice --store '\(dir.path)/bob'"
        // Into a pipe: plain, unless asked.
        #expect(try await Self.run("/bin/sh", ["-c", list]).out.contains("\u{1B}") == false)
        let always = try await Self.run("/bin/sh", ["-c", list + " --color always"]).out
        #expect(always.contains("\u{1B}[1malice\u{1B}[0m: hello"), "\(always.debugDescription)")
        #expect(try await Self.run("/bin/sh", ["-c", list + " --color=sometimes"]).status == 64)
        // On a terminal (tmux, its screen with attributes), in an environment of the test's own:
        // bold by default; not with NO_COLOR or never.
        for (prefix, suffix, bold) in [("", "", true), ("NO_COLOR=1 ", "", false), ("", " --color never", false), ("NO_COLOR=1 ", " --color always", true)] {
            let session = "convkit-color-\(UUID().uuidString.prefix(8))"
            _ = try await ConvkitChatTests.tmux(["new-session", "-d", "-s", session, "-x", "120", "-y", "10", "env -i HOME=\(dir.path) TERM=xterm-256color \(prefix)\(list)\(suffix); sleep 30"], server: session)
            defer { ConvkitChatTests.endTmux(session) }
            var screen = ""
            for _ in 0..<50 {
                screen = try await ConvkitChatTests.tmux(["capture-pane", "-e", "-p", "-t", session], server: session)
                if screen.contains("hello") { break }
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(screen.contains("hello") && screen.contains("\u{1B}[1m") == bold, "\(prefix)…\(suffix): \(screen.debugDescription)")
        }
    }

    /// fish lists the completions its script declares; zsh registers the function with its
    /// completion system; an unknown shell is a usage error.
    @Test func fishAndZshTakeTheirScripts() async throws {
        let dir = try TemporaryDirectory("convkit-shells")
        let convkit = try builtProduct("convkit")
        for shell in ["fish", "zsh"] {
            let script = try await Self.run(convkit, ["completions", shell])
            #expect(script.status == 0)
            try script.out.write(toFile: dir.path + "/convkit.\(shell)", atomically: true, encoding: .utf8)
        }
        let fish = try await Self.run("/usr/bin/fish", ["--no-config", "-c", "source \(dir.path)/convkit.fish; complete -C 'convkit gro'; complete -C 'convkit records show --'"])
        #expect(fish.status == 0, "\(fish.err)")
        #expect(fish.out.split(separator: "\n").contains { $0.hasPrefix("group\t") }, "\(fish.out)")
        #expect(fish.out.contains("--decrypt\t") && fish.out.contains("--json\t"), "records show's own options: \(fish.out)")
        #expect(!fish.out.contains("--attach"), "not another command's options: \(fish.out)")
        let zsh = try await Self.run("/usr/bin/zsh", ["-fc", "autoload -U compinit && compinit -u -d \(dir.path)/zcompdump; source \(dir.path)/convkit.zsh; print -r -- ${_comps[convkit]}"])
        #expect(zsh.status == 0 && zsh.out.contains("_convkit"), "\(zsh.out) \(zsh.err)")
        let unknown = try await Self.run(convkit, ["completions", "tcsh"])
        #expect(unknown.status == 64 && unknown.err.contains("bash, zsh or fish"), "\(unknown.err)")
    }

    /// `man -l` renders the page with every command in it; groff finds nothing to warn about.
    @Test func theManualPageRenders() async throws {
        let dir = try TemporaryDirectory("convkit-man")
        let convkit = try builtProduct("convkit")
        let page = try await Self.run(convkit, ["man", "--date", "2026-12-03"])
        #expect(page.status == 0)
        try page.out.write(toFile: dir.path + "/convkit.1", atomically: true, encoding: .utf8)
        let groff = try await Self.run("/usr/bin/groff", ["-man", "-ww", "-z", dir.path + "/convkit.1"])
        #expect(groff.status == 0 && groff.err.isEmpty, "groff warns: \(groff.err)")
        let shown = try await Self.run("/usr/bin/env", ["MANWIDTH=100", "man", "-l", dir.path + "/convkit.1"])
        #expect(shown.status == 0, "\(shown.err)")
        let text = shown.out.replacingOccurrences(of: "‐\n", with: "")  // man's hyphenation
        for heading in ["NAME", "SYNOPSIS", "COMMANDS", "ENVIRONMENT", "EXIT STATUS"] { #expect(text.contains("\n\(heading)\n"), "\(heading)") }
        for command in ConvkitTests.commands { #expect(text.contains("convkit \(command)\n"), "\(command) is in the page") }
        #expect(text.contains("CONVKIT_STORE") && text.contains("--attach <file>") && text.contains("2026-12-03"))
        let bad = try await Self.run(convkit, ["man", "--date", "yesterday"])
        #expect(bad.status == 64, "\(bad.err)")

        // convkitd's, with convkitd sync's options though convkitd-sync runs it.
        let daemonPage = try await Self.run(try builtProduct("convkitd"), ["man"])
        try daemonPage.out.write(toFile: dir.path + "/convkitd.1", atomically: true, encoding: .utf8)
        let daemonGroff = try await Self.run("/usr/bin/groff", ["-man", "-ww", "-z", dir.path + "/convkitd.1"])
        #expect(daemonPage.status == 0 && daemonGroff.err.isEmpty, "\(daemonGroff.err)")
        let daemonShown = try await Self.run("/usr/bin/env", ["MANWIDTH=100", "man", "-l", dir.path + "/convkitd.1"])
        let daemonText = daemonShown.out.replacingOccurrences(of: "‐\n", with: "")
        for command in ["serve", "sync", "replicate", "migrate", "completions", "man"] { #expect(daemonText.contains("convkitd \(command)\n"), "\(command)") }
        #expect(daemonText.contains("--poll-interval <seconds>") && daemonText.contains("--operator-listen <host:port>"))
    }
}
