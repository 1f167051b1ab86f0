import ConversationKit
import Foundation
import RecordZone
import Testing
import TestSupport

/// A person's housekeeping of their conversations (archive, mute, pin, mark unread, drafts):
/// kept on the device, never on the backend.
@Suite struct HousekeepingTests {
    @Test func archivePinMuteUnreadAndDraftsStayOnTheDevice() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        _ = try await bob.send("from bob", to: "alice")
        try await bob.sync()
        _ = try await carol.send("from carol", to: "alice")
        try await carol.sync()
        try await alice.sync()
        func order() throws -> [String] { try alice.conversations().map(\.nonLocalSpeaker) }
        #expect(try order() == ["carol", "bob"])
        let withBob = try #require(try alice.existingConversation(with: "bob")).id
        let withCarol = try #require(try alice.existingConversation(with: "carol")).id

        // Pinned first, whatever is more recent; unpinned, back in its place.
        try await alice.pin(withBob)
        #expect(try order() == ["bob", "carol"])
        #expect(try alice.existingConversation(with: "bob")?.pinnedAt != nil)
        // Archived: out of the list (and stays out when a message comes), listed when asked.
        try await alice.archive(withCarol)
        #expect(try order() == ["bob"])
        _ = try await carol.send("still there?", to: "alice")
        try await carol.sync()
        try await alice.sync()
        #expect(try order() == ["bob"])
        #expect(try alice.conversations(includeArchived: true).map(\.nonLocalSpeaker) == ["bob", "carol"])
        #expect(try alice.conversations(includeArchived: true).last?.isArchived == true)
        try await alice.archive(withCarol, false)
        try await alice.pin(withBob, false)
        #expect(try order() == ["carol", "bob"])

        // Muted until a time; unmuted.
        let now = Date()
        try await alice.mute(withBob, until: now.addingTimeInterval(3600))
        #expect(try alice.existingConversation(with: "bob")?.isMuted(at: now) == true)
        #expect(try alice.existingConversation(with: "bob")?.isMuted(at: now.addingTimeInterval(7200)) == false)
        try await alice.mute(withBob, until: .distantFuture)
        #expect(try alice.existingConversation(with: "bob")?.isMuted(at: now.addingTimeInterval(1e9)) == true)
        try await alice.mute(withBob, until: nil)
        #expect(try alice.existingConversation(with: "bob")?.mutedUntil == nil)
        #expect(try alice.pendingChangeCount() == 0, "since the last sync: pins, archives and mutes only, none of them for the backend")

        // Marked unread until read; a draft until sent.
        try await alice.markAllAsRead(in: withBob)
        let pending = try alice.pendingChangeCount()
        try await alice.markUnread(withBob)
        #expect(try alice.existingConversation(with: "bob")?.isMarkedUnread == true)
        try await alice.markAllAsRead(in: withBob)
        #expect(try alice.existingConversation(with: "bob")?.isMarkedUnread == false)
        try await alice.setDraft("half a thought", in: withBob)
        #expect(try alice.existingConversation(with: "bob")?.draft == "half a thought")
        #expect(try alice.pendingChangeCount() == pending, "marking unread, reading again (nothing left unread) and a draft queue nothing")
        _ = try await alice.send("a whole thought", to: "bob")
        #expect(try alice.existingConversation(with: "bob")?.draft == nil)
        await #expect { try await alice.setDraft(String(repeating: "x", count: Message.maximumContentBytes + 1), in: withBob) } throws: {
            ($0 as? ConversationError)?.code == .contentTooLarge
        }
        await #expect { try await alice.pin("c-0000000000000000-0000000000000000") } throws: { ($0 as? ConversationError)?.code == .unknownConversation }

        // Bob's store knows nothing of it.
        try await syncAll([alice, bob])
        #expect(try bob.conversations().first?.isArchived == false && bob.conversations().first?.pinnedAt == nil)
    }

    @Test func theLiveListFollowsPinsAndArchives() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice"), bob = try await fixture.store("bob"), carol = try await fixture.store("carol")
        try await syncAll([alice, bob, carol])
        _ = try await alice.send("to bob", to: "bob")
        _ = try await alice.send("to carol", to: "carol")
        let live = try alice.liveConversations()
        let snapshots = LiveCollectionTests.Taken(live.snapshots)
        var snapshot = try await snapshots.next()
        #expect(snapshot.conversations.map(\.nonLocalSpeaker) == ["carol", "bob"])
        let withBob = try #require(try alice.existingConversation(with: "bob")).id
        try await alice.pin(withBob)
        snapshot = try await snapshots.next()
        #expect(snapshot.conversations.map(\.nonLocalSpeaker) == ["bob", "carol"] && snapshot.changes == CollectionChanges(updated: [withBob]))
        try await alice.archive(withBob)
        snapshot = try await snapshots.next()
        #expect(snapshot.conversations.map(\.nonLocalSpeaker) == ["carol"] && snapshot.changes == CollectionChanges(removed: [withBob]))
    }
}
