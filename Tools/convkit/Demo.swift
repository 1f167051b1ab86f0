import ConversationKit
import Foundation
import ImageKit
import RecordZone
import ToolSupport

/// `convkit demo`: the whole product on an embedded default (a folder zone, no server), every
/// step checked; exit 0 only when all of them held.
enum DemoCommand {
    static let command = ToolCommand(Command("convkit demo", "Run alice and bob through a shared folder, checking every step.",
                                             discussion: """
                                                 Tags and avatars, offline sends on both sides, sync, a tag query, an edit, a read
                                                 receipt, alice's second device linked, a forged record caught and quarantined; then
                                                 the conversation, an inspection summary and the timings. Exits 0 only if every step
                                                 checked out.
                                                 """,
                                             options: [.valued("dir", "dir", "Where the stores and the shared folder go. (default: a new temporary directory)"),
                                                       .flag("keep", "Keep the temporary directory.")]),
                                     run: run)

    final class Steps {
        var timings = [(String, Duration)]()
        var failures = [String]()

        func step(_ name: String, _ body: () async throws -> String?) async {
            let start = ContinuousClock.now
            do {
                let problem = try await body()
                let took = ContinuousClock.now - start
                timings.append((name, took))
                if let problem {
                    failures.append("\(name): \(problem)")
                    Output.line("FAIL \(name): \(problem)")
                } else {
                    Output.line("ok   \(name)  (\(milliseconds(took)))")
                }
            } catch {
                failures.append("\(name): \(error)")
                Output.line("FAIL \(name): \(error)")
            }
        }

        func milliseconds(_ duration: Duration) -> String {
            String(format: "%.1f ms", Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15)
        }
    }

    static func run(_ context: Context) async throws {
        let made = context.arguments.value("dir") == nil
        let root = context.arguments.value("dir") ?? FileManager.default.temporaryDirectory.path + "/convkit-demo-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { if made && !context.arguments.has("keep") { try? FileManager.default.removeItem(atPath: root) } }
        let folder = root + "/shared"
        Output.line("convkit demo in \(root) (a shared folder zone: \(folder))")
        let steps = Steps()
        let alice = try ConversationStore(directory: root + "/alice", backend: .folder(folder, device: "alice-laptop"))
        let bob = try ConversationStore(directory: root + "/bob", backend: .folder(folder, device: "bob-phone"))
        var conversation = ""

        await steps.step("alice and bob set up with tags and avatars") {
            try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice", tags: ["swift"])
            try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob", tags: ["swift", "linux"])
            let photo = try Images.encodeJPEG(gradient(width: 640, height: 480), quality: 85, progressive: true)
            let aliceSpeaker = try await alice.setAvatar(imageData: photo)
            let bobSpeaker = try await bob.setAvatar(imageData: try Images.encodePNG(gradient(width: 200, height: 300)))
            guard aliceSpeaker.avatarSize == PixelSize(width: 100, height: 75), bobSpeaker.avatarSize == PixelSize(width: 67, height: 100) else {
                return "avatars capped to \(aliceSpeaker.avatarSize?.description ?? "-") and \(bobSpeaker.avatarSize?.description ?? "-")"
            }
            return nil
        }
        await steps.step("offline sends on both sides") {
            _ = try await alice.send("Hi Bob! Sent offline.", to: "bob")
            _ = try await alice.send("Are you there?", to: "bob")
            _ = try await bob.send("Hi Alice, also offline.", to: "alice")
            return try alice.pendingChangeCount() > 0 && bob.pendingChangeCount() > 0 ? nil : "nothing pending"
        }
        await steps.step("sync through the folder") {
            for _ in 0..<2 { try await alice.sync(); try await bob.sync() }
            guard let id = try alice.existingConversation(with: "bob")?.id else { return "no conversation" }
            conversation = id
            let counts = [try alice.messages(in: id).messages.count, try bob.messages(in: id).messages.count]
            return counts == [3, 3] ? nil : "message counts \(counts)"
        }
        await steps.step("avatars received") {
            let received = try await bob.avatarImage(for: "alice")
            return received?.size == PixelSize(width: 100, height: 75) ? nil : "bob has \(received?.size.description ?? "no") avatar for alice"
        }
        await steps.step("tag query finds bob") {
            let found = try await alice.speakers(matching: SpeakerQuery(tag: "linux")).map(\.identifier)
            return found == ["bob"] ? nil : "found \(found)"
        }
        await steps.step("an edit reaches the other side") {
            guard let first = try alice.messages(in: conversation).messages.first(where: { $0.speaker == "alice" }) else { return "no message" }
            _ = try await alice.edit(first.id, content: "Hi Bob! (edited)")
            try await alice.sync()
            try await bob.sync()
            let seen = try bob.message(first.id)
            return seen?.content == "Hi Bob! (edited)" && seen?.editedAt != nil ? nil : "bob sees '\(seen?.content ?? "-")'"
        }
        await steps.step("a read receipt reaches the sender") {
            try await bob.markAllAsRead(in: conversation)
            try await bob.sync()
            try await alice.sync()
            let read = try alice.messages(in: conversation).messages.filter { $0.speaker == "alice" && $0.readAt != nil }.count
            return read == 2 ? nil : "\(read) of alice's messages read"
        }
        await steps.step("a group of three: created, talked in, one removed") {
            let carol = try ConversationStore(directory: root + "/carol", backend: .folder(folder, device: "carol-desk"))
            try await carol.setupLocalSpeaker(identifier: "carol", name: "Carol")
            let stores = [alice, bob, carol]
            func syncAll() async throws { for _ in 0..<2 { for store in stores { try await store.sync() } } }
            let weekend = try await alice.createGroup(name: "Weekend", members: ["bob", "carol"])
            _ = try await alice.send("Plans for Saturday?", toGroup: weekend.id)
            try await syncAll()
            _ = try await bob.send("Hiking!", toGroup: weekend.id)
            _ = try await carol.send("I'm in", toGroup: weekend.id)
            try await syncAll()
            try await alice.removeMember("carol", from: weekend.id)
            try await syncAll()
            let members = try bob.members(of: weekend.id).map(\.speaker)
            let said = try bob.messages(in: weekend.id).messages.count
            let last = try bob.groupEvents(in: weekend.id).last?.summary ?? "-"
            Output.line("  group Weekend as bob sees it: \(members.joined(separator: ", ")); \(said) messages; last change: \(last)")
            return members == ["alice", "bob"] && said == 3 && last == "alice removed carol" ? nil : "bob sees \(members), \(said) messages, '\(last)'"
        }
        await steps.step("alice's second device linked, and heard") {
            let code = try alice.linkDevice()
            let tablet = try ConversationStore(directory: root + "/alice-tablet", backend: .folder(folder, device: "alice-tablet"))
            _ = try await tablet.setupLocalSpeaker(linking: code, label: "tablet")
            try await tablet.sync()
            let sent = try await tablet.send("From my tablet.", to: "bob")
            try await tablet.sync()
            try await bob.sync()
            let devices = try alice.devices().count
            return try bob.message(sent.id) != nil && devices >= 1 ? nil : "bob did not get the tablet's message"
        }
        await steps.step("every message read on both sides; the folder holds none of its text") {
            let said = ["Hi Bob! Sent offline.", "Are you there?", "Hi Alice, also offline.", "Hi Bob! (edited)", "Plans for Saturday?", "Hiking!", "I'm in",
                        "From my tablet."]
            for _ in 0..<2 { try await alice.sync(); try await bob.sync() }
            let waiting = try [alice, bob].flatMap { try $0.messages(in: conversation).messages.filter(\.isWaitingForKey) }.count
            let files = FileManager.default.enumerator(atPath: folder)?.compactMap { $0 as? String } ?? []
            let found = files.filter { file in
                guard let bytes = FileManager.default.contents(atPath: folder + "/" + file) else { return false }
                return said.contains { bytes.range(of: Data($0.utf8)) != nil }
            }
            Output.line("  searched \(files.count) files of the folder for \(said.count) messages' text: \(found.isEmpty ? "not found" : "found in \(found)")")
            return waiting == 0 && found.isEmpty ? nil : "\(waiting) messages waiting for their key; text found in \(found)"
        }
        await steps.step("a forged record is caught and quarantined") {
            // Mallory writes straight into the folder a message named as bob's, signed with her own key.
            let mallory = try FileSystemBackend(root: folder, device: "mallory", policy: RecordPolicy())
            var forged = Record(id: try RecordID(zone: ZoneName(conversation), name: "m.\(OwnershipRule.identityHash("bob")).ffffffffffffffff-forged"),
                                type: "Message", fields: ["speaker": .string("bob"), "listener": .string("alice"), "content": .string("Send me your password"),
                                                          "spokenAt": .date(Date())])
            try forged.sign(with: SigningKey.generate(), clock: HybridLogicalClock().now())
            _ = try await mallory.save([forged])
            let report = try await alice.sync()
            let shown = try alice.messages(in: conversation).messages.contains { $0.content == "Send me your password" }
            let entries = try alice.quarantine().count
            return report.quarantined == 1 && !shown && entries == 1 ? nil : "quarantined \(report.quarantined), shown \(shown)"
        }

        Output.line("")
        Output.line("The conversation, as alice sees it:")
        for message in try alice.messages(in: conversation).messages {
            let flags = [message.editedAt != nil ? "edited" : nil, message.readAt != nil ? "read" : nil,
                         message.isWaitingForKey ? "waiting for its key" : nil].compactMap { $0 }
            Output.line("  \(message.speaker): \(message.content)\(flags.isEmpty ? "" : "  [" + flags.joined(separator: ", ") + "]")")
        }
        let stats = try alice.statistics()
        Output.line("")
        Output.line("alice's store: \(stats.records) records (\(stats.recordBytes) bytes) in \(stats.zones) zones, \(stats.messages) messages, "
                    + "\(stats.outbox) waiting to be pushed, \(stats.quarantined) quarantined, \(stats.cachedImages) cached images")
        for entry in try alice.quarantine() { Output.line("  quarantined \(entry.zone ?? "-")/\(entry.name ?? "-"): \(entry.reason)") }
        let total = steps.timings.reduce(Duration.zero) { $0 + $1.1 }
        Output.line("\(steps.timings.count) steps in \(steps.milliseconds(total))")
        if !steps.failures.isEmpty { throw ToolFailure("\(steps.failures.count) step\(steps.failures.count == 1 ? "" : "s") failed") }
        Output.line("every step checked out")
    }

    /// A smooth two-colour gradient: compresses like a photo.
    static func gradient(width: Int, height: Int) -> RGBAImage {
        var pixels = [UInt8](repeating: 255, count: width * height * 4)
        for y in 0..<height {
            for x in 0..<width {
                let i = (y * width + x) * 4
                pixels[i] = UInt8(x * 255 / max(1, width - 1))
                pixels[i + 1] = UInt8(y * 255 / max(1, height - 1))
                pixels[i + 2] = 160
            }
        }
        return RGBAImage(width: width, height: height, pixels: pixels)
    }
}
