import ConversationKit
import Foundation
import RecordZone
import StorageTestSupport
import Testing
import TestSupport
@testable import ZoneServer

/// The console in a real browser: Debian's chromium, headless, driven through chromedriver by
/// Selenium (`Browser/console_browser.py`, which says what it checks). Screenshots of each step
/// go to `.build/console-screenshots/`.
@Suite(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/chromedriver"), "chromium-driver is not installed (scripts/setup.sh installs it)"))
struct ConsoleBrowserTests {
    @Test func anOperatorSignsInPagesThroughTenThousandRecordsAndSeesWhatIsWrong() async throws {
        let fixture = try ConsoleTests.fixture()
        let alice = fixture.client("alice", key: Keys.alice)
        let zone = try conversationZone("alice", "bob")
        _ = try await alice.createZone(zone)
        // 10,000 messages, and one whose text is hostile markup.
        for batch in 0..<25 {
            let records = try (0..<400).map { index in
                try message(zone, String(format: "%016x-%04d", batch * 400 + index, 0), from: "alice", to: "bob", key: Keys.alice, text: "message \(batch * 400 + index)")
            }
            let saved = try await alice.save(records)
            #expect(saved.allSatisfy { (try? $0.get()) != nil })
        }
        let hostile = try message(zone, "ffffffffffffffff-0000", from: "alice", to: "bob", key: Keys.alice,
                                  text: "<script>alert(1)</script>\"><img src=x onerror=alert(2)>\u{202E}")
        #expect((try? await alice.save([hostile]).first?.get()) != nil)
        // A forged record planted past every check, and a save the server refuses.
        var bytes = try hostile.encoded()
        bytes[bytes.count - 1] ^= 0x01
        let forgedName = "m.\(OwnershipRule.identityHash("alice")).forged"
        try await fixture.server.storage.injectUnchecked(bytes, into: zone, name: forgedName)
        let refused = try message(zone, "0000000000000000-9999", from: "alice", to: "bob", key: Keys.mallory, text: "it was me")
        #expect((try? await alice.save([refused]).first?.get()) == nil)

        let here = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        let shots = here.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent(".build/console-screenshots").path
        try FileManager.default.createDirectory(atPath: shots, withIntermediateDirectories: true)
        // A client syncing while the browser watches the metrics.
        let traffic = Task {
            while !Task.isCancelled {
                _ = try? await alice.fetchChanges(in: zone, since: nil, limit: 10)
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
        defer { traffic.cancel() }
        let browser = try ChildProcess("/usr/bin/python3", [here.appendingPathComponent("Browser/console_browser.py").path, fixture.url.absoluteString,
                                                           ConsoleTests.token, zone.rawValue, hostile.id.name, forgedName, refused.id.description, shots, "10002"])
        let status = await browser.wait()
        #expect(status == 0, "\(browser.standardOutput)\n\(browser.standardError)")
        for step in ["signed in", "zone opened", "paged through 10002 records in 21 pages", "record verified, hostile text inert", "forged record marked",
                     "refused save listed", "request chart moved", "signed out"] {
            #expect(browser.standardOutput.contains("ok " + step), "\(step): \(browser.standardOutput)")
        }
        for shot in ["1-overview", "2-zone", "3-record", "4-forged", "5-refused", "6-metrics"] {
            #expect(((try? FileManager.default.attributesOfItem(atPath: "\(shots)/\(shot).png")[.size] as? Int) ?? 0) > 1000, "\(shot).png")
        }
    }
}
