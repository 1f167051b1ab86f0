import Foundation
import RecordZone
import Testing
import TestSupport
@testable import ConversationKit

/// Alice's tablet runs 3 h fast. Its profile does not win for hours (a rename on the laptop
/// after it wins), an answer never shows above its question on any device, and the others'
/// clocks are not dragged hours ahead (they follow it only up to the 5-minute tolerance, and
/// flag it).
@Suite struct ClockSkewTests {
    @Test(arguments: [ChatBackend.memory, .filesystem])
    func aTabletThreeHoursFastNeitherWinsForHoursNorBreaksTheOrder(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let laptop = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        try await syncAll([laptop, bob])
        var fast = StoreConfiguration()
        fast.now = { Date().addingTimeInterval(3 * 3600) }
        let tablet = try ConversationStore(directory: fixture.storePath("alice-tablet"), backend: fixture.factory(device: "alice-tablet"), configuration: fast)
        try await tablet.setupLocalSpeaker(linking: try laptop.linkDevice(lifetime: 4 * 3600), label: "tablet")
        try await syncAll([laptop, tablet, bob])

        // The question from the fast tablet, the answer from bob (on time).
        let question = try await tablet.send("are you coming?", to: "bob")
        try await tablet.sync()
        let report = try await bob.sync()
        #expect(report.clocksAhead > 0, "the fast clock is flagged")
        let answer = try await bob.send("yes!", to: "alice")
        try await syncAll([bob, laptop, tablet])
        for (name, store) in [("laptop", laptop), ("tablet", tablet), ("bob", bob)] {
            #expect(try history(store, question.id.conversation).map(\.content) == ["are you coming?", "yes!"], "\(name)")
        }
        // Bob's clock followed the tablet's only up to the tolerance.
        let answerRecord = try #require(try bob.records(in: answer.id.conversation).first { $0.id.name == answer.id.name })
        #expect(Double(answerRecord.clock.milliseconds) / 1000 < Date().timeIntervalSince1970 + 6 * 60)

        // The tablet renames alice (3 h ahead); the laptop renames her after: the laptop's wins.
        _ = try await tablet.updateLocalSpeaker(name: "Alice (tablet)", tags: [])
        try await syncAll([tablet, laptop])
        _ = try await laptop.updateLocalSpeaker(name: "Alice", tags: [])
        try await syncAll([laptop, tablet, bob])
        for (name, store) in [("laptop", laptop), ("tablet", tablet), ("bob", bob)] {
            let shown = try store.speaker(fromRef: SpeakerRef(identifier: "alice"))?.name
            #expect(shown == "Alice", "\(name): \(String(describing: shown))")
        }
    }
}
