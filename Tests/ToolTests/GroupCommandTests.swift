import Foundation
import ImageKit
import Testing
import TestSupport

/// Groups from the terminal, with the real `convkit` over a shared folder: carol creates one
/// with alice and bob, everyone talks, carol makes alice an admin, alice adds dave, bob leaves,
/// and a plain member's add is refused with the rule's reason (exit 1).
@Suite struct GroupCommandTests {
    @Test func aGroupFromCreationToALeave() async throws {
        let dir = try TemporaryDirectory("convkit-group")
        let folder = dir.path + "/shared"
        func store(_ name: String) -> [String] { ["--store", dir.path + "/" + name] }
        func ok(_ arguments: [String]) async throws -> ConvkitTests.Run {
            let run = try await ConvkitTests.convkit(arguments)
            #expect(run.status == 0, "\(arguments): \(run.err)")
            return run
        }
        for name in ["carol", "alice", "bob", "dave"] {
            _ = try await ok(["init", "--id", name, "--name", name.capitalized, "--zone-dir", folder] + store(name))
        }
        let created = try await ok(["group", "create", "--name", "Trip", "--member", "alice", "--member", "bob", "--sync", "--json"] + store("carol"))
        let id = try #require((created.json as? [String: Any])?["id"] as? String)
        #expect(id.hasPrefix("g-"))
        for name in ["alice", "bob", "dave"] { _ = try await ok(["sync"] + store(name)) }
        #expect(try await ok(["group", "list"] + store("alice")).out.contains("Trip  0 unread  \(id)"))
        #expect(try await ok(["group", "list"] + store("dave")).out.isEmpty)
        _ = try await ok(["send", id, "Who brings the tent?", "--sync"] + store("carol"))
        _ = try await ok(["sync"] + store("alice"))
        _ = try await ok(["send", "Trip", "I do", "--group", "--sync"] + store("alice"))
        // Read receipts per member: carol sees who of the others read hers.
        _ = try await ok(["read", "Trip", "--group"] + store("alice"))
        _ = try await ok(["sync"] + store("alice"))
        _ = try await ok(["sync"] + store("carol"))
        let read = try await ok(["messages", id] + store("carol")).out
        #expect(read.contains("Who brings the tent?  [delivered to 1, read by 1 of 2]"), "\(read)")
        // A plain member cannot add anyone: the rule's reason, exit 1.
        let refused = try await ConvkitTests.convkit(["group", "add", "Trip", "--member", "dave"] + store("alice"))
        #expect(refused.status == 1 && refused.err.contains("only an admin may add"), "\(refused.err)")
        _ = try await ok(["group", "role", id, "alice", "admin", "--sync"] + store("carol"))
        _ = try await ok(["sync"] + store("alice"))
        let addedDave = try await ok(["group", "add", "Trip", "--member", "dave", "--sync", "--json"] + store("alice"))
        #expect((addedDave.json as? [String: Any])?["id"] as? String == id, "\(addedDave.out)")
        #expect(((addedDave.json as? [String: Any])?["members"] as? [[String: Any]])?.contains { $0["id"] as? String == "dave" && $0["role"] as? String == "member" } == true,
                "the group as the change left it: \(addedDave.out)")
        _ = try await ok(["sync"] + store("bob"))
        _ = try await ok(["group", "leave", "Trip", "--sync"] + store("bob"))
        for name in ["carol", "alice", "dave"] { _ = try await ok(["sync"] + store(name)) }
        let members = try await ok(["group", "members", "Trip", "--json"] + store("dave"))
        let roles = (members.json as? [[String: Any]])?.compactMap { member in (member["id"] as? String).map { "\($0) \(member["role"] as? String ?? "")" } }
        #expect(roles == ["carol creator", "alice admin", "dave member"])
        // The records, with each change decoded and decided, and who is in the group.
        let listed = try await ok(["records", "list", "--zone", id] + store("carol")).out
        #expect(listed.contains("GroupChange") && listed.contains("carol created the group Trip with alice, bob — accepted")
                && listed.contains("bob left — accepted") && listed.contains("members: carol (creator), alice (admin), dave (member)"), "\(listed)")
        let entries = try #require(try await ok(["records", "list", "--zone", id, "--json"] + store("carol")).json as? [[String: Any]])
        let added = try #require(entries.first { ($0["change"] as? [String: Any])?["summary"] as? String == "alice added dave" }?["name"] as? String)
        #expect(try await ok(["records", "show", "\(id)/\(added)"] + store("dave")).out.contains("change     alice added dave — accepted"))
        let history = try await ok(["messages", id] + store("carol")).out
        #expect(history.contains("Carol (carol): Who brings the tent?") && history.contains("Alice (alice): I do"), "\(history)")
        // Membership in the timeline, in order with the messages; the refused add is not there.
        let lines = history.split(separator: "\n").map { $0.split(separator: " ", maxSplits: 1).last.map(String.init) ?? "" }
        let timeline = lines.filter { $0.hasPrefix("— ") || $0.contains(": ") }.map { $0.components(separatedBy: "  ").first ?? $0 }
        #expect(timeline == ["— carol created the group Trip with alice, bob", "Carol (carol): Who brings the tent?", "Alice (alice): I do",
                             "— carol made alice an admin", "— alice added dave", "— bob left"], "\(history)")
        // Dave joined after both: from when he was added, he sees nothing of before.
        #expect(!(try await ok(["messages", id] + store("dave")).out.contains("tent")))
        #expect(try await ok(["conversations"] + store("carol")).out.contains("Trip (group)"))
        // A description and a picture, by an admin; a usage error without either.
        let empty = try await ConvkitTests.convkit(["group", "describe", "Trip"] + store("carol"))
        #expect(empty.status == 64, "\(empty.err)")
        let picture = dir.path + "/trip.jpg"
        try Images.encodeJPEG(RGBAImage(width: 300, height: 200, fill: (40, 160, 40, 255)), quality: 90).write(to: URL(fileURLWithPath: picture))
        _ = try await ok(["group", "describe", "Trip", "--description", "Hiking in May", "--avatar", picture, "--sync"] + store("carol"))
        _ = try await ok(["sync"] + store("dave"))
        let groups = try #require(try await ok(["group", "list", "--json"] + store("dave")).json as? [[String: Any]])
        #expect(groups.first { $0["id"] as? String == id }?["description"] as? String == "Hiking in May", "\(groups)")
        #expect(groups.first { $0["id"] as? String == id }?["avatar"] as? String == "100x67", "\(groups)")
        // A group that keeps its history: dave, added later, reads what was said before.
        let wrong = try await ConvkitTests.convkit(["group", "create", "--name", "Club", "--history", "some"] + store("carol"))
        #expect(wrong.status == 64 && wrong.err.contains("--history is since-added or all"), "\(wrong.err)")
        let club = try await ok(["group", "create", "--name", "Club", "--member", "alice", "--history", "all"] + store("carol")).out
            .trimmingCharacters(in: .whitespacesAndNewlines)
        _ = try await ok(["send", club, "Before dave", "--sync"] + store("carol"))
        _ = try await ok(["group", "add", "Club", "--member", "dave", "--sync"] + store("carol"))
        _ = try await ok(["sync"] + store("dave"))
        #expect(try await ok(["messages", club] + store("dave")).out.contains("Carol (carol): Before dave"))
    }
}
