import ConversationKit
import Foundation
import Testing
import TestSupport

/// The README's embedded-store example, run as a test; a second test keeps the README's copy
/// identical to the code between the markers below.
@Suite struct ReadmeExampleTests {
    @Test func theReadmeExampleRuns() async throws {
        let directory = try TemporaryDirectory("readme")
        let root = directory.path
        // README-BEGIN
        let alice = try ConversationStore(directory: "\(root)/alice", backend: .folder("\(root)/shared", device: "alice-laptop"))
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice", tags: ["swift"])
        let bob = try ConversationStore(directory: "\(root)/bob", backend: .folder("\(root)/shared", device: "bob-phone"))
        try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob", tags: ["swift", "linux"])
        try await bob.sync()                                  // publishes his profile and device key

        guard try await alice.speakerExists("bob") else { return }  // looks bob up, his device key too
        let sent = try await alice.send("Hi Bob!", to: "bob")  // offline: sealed, committed with its outbox entry
        try await alice.sync()                                // pushes the outbox
        try await bob.sync()                                  // pulls, verifies, applies

        guard let conversation = try bob.existingConversation(with: "alice") else { return }
        let page = try bob.messages(in: conversation.id, limit: 50)
        print(page.messages.map(\.content))                   // ["Hi Bob!"]
        try await bob.markAllAsRead(in: conversation.id)      // a signed receipt for alice
        try await bob.react(to: sent.id, with: "👋")          // one reaction per person per message, sealed
        try await bob.sync()
        try await alice.sync()
        print(try alice.message(sent.id)?.isDelivered as Any) // true: bob's store holds it ("synced" only says the backend does)
        print(try alice.message(sent.id)?.readAt as Any)      // when bob read it
        print(try alice.reactions(to: sent.id).map(\.emoji))  // ["👋"]

        let swifties = try await alice.speakers(matching: SpeakerQuery(tag: "linux"))
        print(swifties.map(\.name))                           // ["Bob"]
        // README-END
        #expect(page.messages.map(\.content) == ["Hi Bob!"])
        #expect(try alice.message(sent.id)?.readAt != nil)
        #expect(try alice.message(sent.id)?.isDelivered == true)
        #expect(try alice.reactions(to: sent.id).map(\.emoji) == ["👋"])
        #expect(swifties.map(\.name) == ["Bob"])
        #expect(conversation.id == sent.id.conversation)
    }

    @Test func theReadmeShowsExactlyThisExample() throws {
        let here = URL(fileURLWithPath: #filePath)
        let root = here.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        let source = try String(contentsOf: here, encoding: .utf8)
        let lines = source.components(separatedBy: "\n")
        let begin = try #require(lines.firstIndex { $0.hasSuffix("// README-BEGIN") })
        let end = try #require(lines.firstIndex { $0.hasSuffix("// README-END") })
        let example = lines[(begin + 1)..<end].map { $0.hasPrefix("        ") ? String($0.dropFirst(8)) : $0 }.joined(separator: "\n")
        #expect(readme.contains(example), "README.md's embedded-store example differs from ReadmeExampleTests.swift")
    }

    /// The README is a front door: short, and every relative link in it and in `docs/` names a
    /// file that exists.
    @Test func theReadmeIsShortAndEveryDocumentLinkResolves() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        #expect(readme.components(separatedBy: "\n").count <= 250)
        let docs = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("docs").path).filter { $0.hasSuffix(".md") }
        #expect(docs.count >= 8, "\(docs)")
        let link = /\]\(([^)\s]+)\)/
        for document in ["README.md"] + docs.map({ "docs/" + $0 }) {
            let text = try String(contentsOf: root.appendingPathComponent(document), encoding: .utf8)
            let folder = root.appendingPathComponent(document).deletingLastPathComponent()
            for match in text.matches(of: link) {
                let target = String(match.1)
                guard !target.hasPrefix("http"), !target.hasPrefix("#") else { continue }
                let path = folder.appendingPathComponent(String(target.split(separator: "#", maxSplits: 1)[0])).standardized.path
                #expect(FileManager.default.fileExists(atPath: path), "\(document) links to \(target), which does not exist")
            }
        }
    }
}
