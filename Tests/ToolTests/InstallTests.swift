import Foundation
import Testing
import TestSupport

/// `scripts/install.sh --prefix`: everything lands under the prefix, the units run the binaries
/// there, systemd-analyze finds nothing wrong in them and the system units' exposure stays under
/// 3.0, and what it installed works (the manual page, the completions).
@Suite struct InstallTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

    static func run(_ executable: String, _ arguments: [String]) async throws -> ConvkitTests.Run {
        let child = try ChildProcess(executable, arguments)
        let status = await child.wait()
        return ConvkitTests.Run(status: status, out: child.standardOutput, err: child.standardError)
    }

    @Test func anInstallIntoAPrefixPointsIntoIt() async throws {
        let dir = try TemporaryDirectory("convkit-install")
        let prefix = dir.path + "/x", binaries = URL(fileURLWithPath: try builtProduct("convkit")).deletingLastPathComponent().path
        // --binaries relative to where it is called from (here /).
        let installed = try await Self.run("/bin/sh", ["-c", "cd / && bash '\(Self.root)/scripts/install.sh' --prefix '\(prefix)' --binaries '\(binaries.dropFirst())'"])
        #expect(installed.status == 0, "\(installed.err)")
        for file in ["bin/convkit", "bin/convkitd", "bin/convkitd-sync", "share/man/man1/convkit.1", "share/bash-completion/completions/convkit",
                     "share/zsh/site-functions/_convkit", "share/fish/vendor_completions.d/convkit.fish", "share/man/man1/convkitd.1",
                     "share/bash-completion/completions/convkitd", "share/zsh/site-functions/_convkitd", "share/fish/vendor_completions.d/convkitd.fish",
                     "lib/systemd/system/convkitd-serve.service", "lib/systemd/system/convkitd-sync@.service", "lib/systemd/user/convkitd-sync.service"] {
            #expect(FileManager.default.fileExists(atPath: "\(prefix)/\(file)"), "\(file)")
        }
        let units = ["system/convkitd-serve.service", "system/convkitd-sync@.service", "user/convkitd-sync.service"]
        for unit in units {
            let text = try String(contentsOfFile: "\(prefix)/lib/systemd/\(unit)", encoding: .utf8)
            let starts = text.split(separator: "\n").filter { $0.hasPrefix("ExecStart=") }
            #expect(!starts.isEmpty && starts.allSatisfy { $0.hasPrefix("ExecStart=\(prefix)/bin/convkitd ") }, "\(unit): \(starts)")
            #expect(!text.contains("/usr/local"), "\(unit) still names /usr/local")
        }
        // The sync@ template: each instance its own state directory and store.
        let template = try String(contentsOfFile: "\(prefix)/lib/systemd/system/convkitd-sync@.service", encoding: .utf8)
        #expect(template.contains("StateDirectory=convkitd-sync/%i\n") && template.contains("--store ${STATE_DIRECTORY} "), "\(template)")

        // systemd-analyze: no error in any unit (it checks the binaries exist, too); an instance of
        // each system unit exposed under 3.0 (its threshold is in tenths).
        let runtime = dir.path + "/runtime"
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.copyItem(atPath: "\(prefix)/lib/systemd/system/convkitd-sync@.service", toPath: dir.path + "/convkitd-sync@alice.service")
        for unit in ["\(prefix)/lib/systemd/system/convkitd-serve.service", dir.path + "/convkitd-sync@alice.service"] {
            let verified = try await Self.run("/usr/bin/systemd-analyze", ["verify", unit])
            #expect(verified.status == 0 && verified.err.isEmpty, "\(unit): \(verified.err)")
            let security = try await Self.run("/usr/bin/systemd-analyze", ["security", "--offline=yes", "--threshold=29", unit])
            #expect(security.status == 0, "\(unit): \(security.out.split(separator: "\n").last ?? "")")
        }
        let user = try await Self.run("/usr/bin/env", ["XDG_RUNTIME_DIR=\(runtime)", "systemd-analyze", "verify", "--user", "\(prefix)/lib/systemd/user/convkitd-sync.service"])
        #expect(user.status == 0 && user.err.isEmpty, "\(user.err)")

        // What was installed works from there.
        let version = try await Self.run("\(prefix)/bin/convkit", ["--version"])
        #expect(version.status == 0)
        let page = try await Self.run("/usr/bin/env", ["MANWIDTH=80", "man", "-l", "\(prefix)/share/man/man1/convkit.1"])
        #expect(page.status == 0 && page.out.contains("convkit completions"), "\(page.err)")
        // Not a relative prefix, nor an unknown option.
        #expect(try await Self.run("/bin/bash", [Self.root + "/scripts/install.sh", "--prefix", "x", "--binaries", binaries]).status == 64)
        #expect(try await Self.run("/bin/bash", [Self.root + "/scripts/install.sh", "--frobnicate"]).status == 64)
    }
}
