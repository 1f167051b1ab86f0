import ConversationKit
import Foundation
import ImageKit
@testable import RecordZone
import Testing
import TestSupport
@testable import ZoneServer

/// Groups in the store, over every backend (a shared in-memory one, a folder, a zone server on
/// SQLite, two zone servers on one PostgreSQL database): created, messages from
/// everyone, a member added (who sees what is said from then on), an admin promoted, a member
/// removed (whose later message nobody else shows — everyone holds it in the quarantine — and
/// their own store shows failed), a member
/// who leaves — and every store ending with the same members and the same messages.
@Suite struct GroupStoreTests {
    static let backends = ChatBackend.allCases

    static func view(_ store: ConversationStore, _ group: String) throws -> [String] {
        try history(store, group).map { "\($0.speaker): \($0.content)" }
    }

    @Test(arguments: backends)
    func aGroupOfFiveFromCreationToARemoval(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let names = ["carol", "alice", "bob", "dave", "erin"]
        var stores: [String: ConversationStore] = [:]
        // With PostgreSQL, half the stores go through a second server on the same database.
        for (index, name) in names.enumerated() { stores[name] = try await fixture.store(name, onSecondServer: index % 2 == 1) }
        let carol = try #require(stores["carol"]), alice = try #require(stores["alice"]), bob = try #require(stores["bob"])
        let dave = try #require(stores["dave"]), erin = try #require(stores["erin"])
        let all = names.compactMap { stores[$0] }

        let trip = try await carol.createGroup(name: "Trip", members: ["alice", "bob", "dave"])
        #expect(trip.isGroup && trip.groupName == "Trip" && trip.id.hasPrefix("g-"))
        try await carol.send("Who brings the tent?", toGroup: trip.id)
        try await syncAll(all)
        for store in [alice, bob, dave] {
            let group = try #require(try store.conversations().first { $0.id == trip.id })
            #expect(group.groupName == "Trip" && group.unreadCount == 1)
            #expect(try store.members(of: trip.id).map(\.speaker) == ["carol", "alice", "bob", "dave"])
        }
        #expect(try erin.conversations().isEmpty)
        try await alice.send("I do", toGroup: trip.id)
        try await bob.send("I bring food", toGroup: trip.id)
        try await dave.send("Count me in", toGroup: trip.id)
        try await syncAll(all)
        let four = ["carol: Who brings the tent?", "alice: I do", "bob: I bring food", "dave: Count me in"]
        for store in [carol, alice, bob, dave] { #expect(Set(try Self.view(store, trip.id)) == Set(four)) }
        // Read receipts per member: "read by 2 of 3".
        try await alice.markAllAsRead(in: trip.id)
        try await bob.markAllAsRead(in: trip.id)
        try await syncAll(all)
        let tent = try #require(try history(carol, trip.id).first { $0.content == "Who brings the tent?" })
        #expect(try carol.readers(of: tent.id).map(\.speaker).sorted() == ["alice", "bob"])

        // A plain member cannot add; once promoted, alice adds erin, who sees from then on.
        await #expect(throws: ConversationError.self) { try await alice.addMembers(["erin"], to: trip.id) }
        try await carol.setRole(.admin, of: "alice", in: trip.id)
        try await syncAll(all)
        try await alice.addMembers(["erin"], to: trip.id)
        try await syncAll(all)
        try await erin.send("Hello all", toGroup: trip.id)
        try await syncAll(all)
        #expect(try Self.view(erin, trip.id) == ["erin: Hello all"])
        #expect(try carol.members(of: trip.id).map(\.role) == [.creator, .admin, .member, .member, .member])

        // Carol removes dave; dave, not yet knowing, says something: nobody shows it.
        try await carol.removeMember("dave", from: trip.id)
        try await carol.sync()
        try await dave.send("Am I still here?", toGroup: trip.id)
        try await bob.leave(trip.id)
        try await syncAll(all)
        await #expect(throws: ConversationError.self) { try await bob.send("Back?", toGroup: trip.id) }
        let members = ["carol", "alice", "erin"]
        for store in all { #expect(Set(try store.members(of: trip.id).map(\.speaker)) == Set(members)) }
        let shown = four + ["erin: Hello all"]
        for store in [carol, alice] {
            #expect(Set(try Self.view(store, trip.id)) == Set(shown))
            // A folder or a shared backend carries it, and every reader holds it back; a zone
            // server refuses it (dave is not in the group when it arrives): nobody gets it.
            #expect(try store.quarantine().contains { $0.code == .notAMember && $0.zone == trip.id } == !kind.isServer)
        }
        #expect(!(try dave.conversations().isEmpty))
        // What dave may still read: what was said while he was in the group (his store keeps it).
        #expect(Set(try Self.view(dave, trip.id)) == Set(shown + ["dave: Am I still here?"]))
        // Dave's own sees it failed, and why: nobody else shows it.
        let late = try #require(try history(dave, trip.id).first { $0.content == "Am I still here?" })
        guard case .failed(let failure) = late.syncState else {
            Issue.record("dave's message after his removal is \(late.syncState)")
            return
        }
        #expect(failure.code == .notInGroup)
    }

    /// A group that keeps its history: bob, added later, reads what was said before (a zone
    /// server serves it to him); alice, removed, keeps what she read and reads nothing said
    /// after her removal.
    @Test(arguments: backends)
    func aGroupThatKeepsItsHistoryShowsItToThoseAddedLater(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let carol = try await fixture.store("carol"), alice = try await fixture.store("alice"), bob = try await fixture.store("bob", onSecondServer: true)
        let club = try await carol.createGroup(name: "Club", members: ["alice"], history: .all)
        try await carol.send("Before bob", toGroup: club.id)
        try await alice.sync()
        try await syncAll([carol, alice, bob])
        #expect(try bob.conversations().isEmpty)
        try await carol.addMembers(["bob"], to: club.id)
        try await syncAll([carol, alice, bob])
        #expect(try Self.view(bob, club.id) == ["carol: Before bob"])
        try await carol.removeMember("alice", from: club.id)
        try await carol.send("After alice", toGroup: club.id)
        try await syncAll([carol, alice, bob])
        #expect(try Self.view(bob, club.id) == ["carol: Before bob", "carol: After alice"])
        #expect(try Self.view(alice, club.id) == ["carol: Before bob"])
        #expect(try alice.members(of: club.id).map(\.speaker) == ["carol", "bob"])
    }

    /// Removed, then added again to a group that keeps its history: what was said while away
    /// is read too — over a server as well, whose pages left it out while the member was away
    /// (the store reads the zone again from the start when its membership grows). With pages of
    /// two records, that happens while the next page is already being fetched.
    @Test(arguments: backends, [2, 200])
    func aMemberAddedAgainReadsWhatWasSaidWhileAway(_ kind: ChatBackend, pageSize: Int) async throws {
        let fixture = try await ChatFixture(kind)
        var pages = StoreConfiguration()
        pages.pageSize = pageSize
        let carol = try await fixture.store("carol"), alice = try await fixture.store("alice", configuration: pages, onSecondServer: true)
        let club = try await carol.createGroup(name: "Club", members: ["alice"], history: .all)
        try await carol.send("one", toGroup: club.id)
        try await syncAll([carol, alice])
        try await carol.removeMember("alice", from: club.id)
        let away = ["while away", "still away", "away again"]
        for text in away { try await carol.send(text, toGroup: club.id) }
        try await syncAll([carol, alice])
        #expect(try Self.view(alice, club.id) == ["carol: one"])
        try await carol.addMembers(["alice"], to: club.id)
        try await carol.send("welcome back", toGroup: club.id)
        try await syncAll([carol, alice])
        #expect(try Self.view(alice, club.id) == ["carol: one"] + away.map { "carol: \($0)" } + ["carol: welcome back"])
    }

    /// A group's description and picture, set by an admin (the picture through the avatar
    /// pipeline: capped, a PNG asset uploaded before the change that names it), reach every
    /// member; a plain member cannot set them; changing one keeps the other.
    @Test(arguments: backends)
    func aGroupsDescriptionAndPictureReachEveryMember(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let carol = try await fixture.store("carol"), alice = try await fixture.store("alice", onSecondServer: true)
        let club = try await carol.createGroup(name: "Club", members: ["alice"])
        try await carol.setDescription("Saturday hikes", ofGroup: club.id)
        try await carol.setAvatar(imageData: try Images.encodePNG(RGBAImage(width: 400, height: 200, fill: (20, 60, 200, 255))), ofGroup: club.id)
        try await syncAll([carol, alice])
        let seen = try #require(try alice.conversations().first { $0.id == club.id })
        #expect(seen.groupDescription == "Saturday hikes" && seen.groupAvatarSize == PixelSize(width: 100, height: 50))
        let image = try #require(try await alice.avatarImage(ofGroup: club.id))
        let decoded = try Images.decode(image.png)
        #expect(image.size == PixelSize(width: 100, height: 50) && decoded.width == 100 && decoded.height == 50)
        await #expect(throws: ConversationError.self) { try await alice.setDescription("Mine now", ofGroup: club.id) }
        try await carol.setDescription(nil, ofGroup: club.id)
        try await syncAll([carol, alice])
        let after = try #require(try alice.conversations().first { $0.id == club.id })
        #expect(after.groupDescription == nil && after.groupAvatarSize == PixelSize(width: 100, height: 50))
        #expect(try alice.groupEvents(in: club.id).last?.summary == "carol changed the group's description and picture")
    }

    /// Someone added to a group who never set up has no zone on the server: a member's store
    /// looks for it once, then only when the database feed names it — not on every sync (a
    /// group of 10,000 invited people would otherwise cost 10,000 requests a sync). Once they
    /// set up, the next sync reads their profile.
    @Test func aMemberWhoNeverSetUpIsNotLookedForOnEverySync() async throws {
        let fixture = try await ChatFixture(.http)
        let carol = try await fixture.store("carol")
        _ = try await carol.createGroup(name: "Trip", members: ["ghost"])
        try await carol.sync()
        let metrics = try #require(fixture.zoneServer).api.metrics
        let before = metrics.answered(.zoneChanges)
        for _ in 0..<3 { try await carol.sync() }
        #expect(metrics.answered(.zoneChanges) == before)
        try await fixture.store("ghost").sync()
        try await carol.sync()
        #expect(try carol.speaker(fromRef: SpeakerRef(identifier: "ghost"))?.name == "Ghost")
    }

    /// A change in the creator's name signed by someone else's key (planted past every save
    /// check, as a hostile folder writer would): every store quarantines it and nobody's
    /// membership moves; the same change signed again with another clock than its name says is
    /// refused too.
    @Test(arguments: [ChatBackend.memory, .filesystem])
    func aForgedChangeInTheCreatorsNameMovesNobody(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let carol = try await fixture.store("carol"), alice = try await fixture.store("alice")
        let trip = try await carol.createGroup(name: "Trip", members: ["alice"])
        try await syncAll([carol, alice])
        let zone = try ZoneName(trip.id)
        let clock = RecordClock(milliseconds: UInt64(Date().timeIntervalSince1970 * 1000) + 1_000, counter: 0)
        let forged = GroupChange(name: GroupChange.recordName(actor: "carol", clock: clock, random: "00000000000000aa"), actor: "carol",
                                 clock: clock, action: .add, targets: ["mallory"])
        var record = Record(id: try RecordID(zone: zone, name: forged.name), type: GroupChange.recordType, fields: forged.fields)
        try record.sign(with: SigningKey.generate(), clock: clock)
        try await fixture.plant(try record.encoded(), in: zone)
        var rewritten = Record(id: try RecordID(zone: zone, name: GroupChange.recordName(actor: "carol", clock: clock, random: "00000000000000bb")),
                               type: GroupChange.recordType, fields: forged.fields)
        try rewritten.sign(with: try fixture.key(of: "carol"), clock: RecordClock(rawValue: clock.rawValue + 1))
        try await fixture.plant(try rewritten.encoded(), in: zone)
        try await syncAll([carol, alice])
        for store in [carol, alice] {
            #expect(try store.members(of: trip.id).map(\.speaker) == ["carol", "alice"])
            let held = Set(try store.quarantine().compactMap { $0.zone == trip.id ? $0.name : nil })
            #expect(held.isSuperset(of: [record.id.name, rewritten.id.name]), "\(held)")
        }
    }

    /// A zone server refuses each forgery a member or an outsider can send with its own key —
    /// a plain member adding someone, a removed member adding themself back, someone never in
    /// the group adding themself, a member promoting themself — and stores nothing of them;
    /// an old `add` sent again after a removal is the same change, and moves nobody.
    @Test(arguments: ChatBackend.allCases.filter(\.isServer))
    func aServerRefusesEveryForgedChange(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let carol = try await fixture.store("carol"), alice = try await fixture.store("alice"), dave = try await fixture.store("dave")
        let mallory = try await fixture.store("mallory")
        let trip = try await carol.createGroup(name: "Trip", members: ["alice", "dave"])
        try await syncAll([carol, alice, dave, mallory])
        let zone = try ZoneName(trip.id)
        let addDave = try #require(try await fixture.rawBackend("carol", key: try fixture.key(of: "carol")).fetchChanges(in: zone, since: nil, limit: 100)
            .records.first { (try? GroupChange(record: $0))?.action == .create })
        try await carol.removeMember("dave", from: trip.id)
        try await syncAll([carol, alice, dave, mallory])

        var random = 0
        func change(_ actor: String, _ action: GroupChange.Action, _ targets: [String]) throws -> Record {
            random += 1
            let clock = RecordClock(milliseconds: UInt64(Date().timeIntervalSince1970 * 1000), counter: UInt16(random))
            let change = GroupChange(name: GroupChange.recordName(actor: actor, clock: clock, random: String(format: "%016x", random)), actor: actor,
                                     clock: clock, action: action, targets: targets)
            var record = Record(id: try RecordID(zone: zone, name: change.name), type: GroupChange.recordType, fields: change.fields)
            try record.sign(with: try fixture.key(of: actor), clock: clock)
            return record
        }
        let forgeries = [("alice", try change("alice", .add, ["mallory"])), ("dave", try change("dave", .add, ["dave"])),
                         ("mallory", try change("mallory", .add, ["mallory"])), ("alice", try change("alice", .promote, ["alice"]))]
        for (sender, record) in forgeries {
            let results = try await fixture.rawBackend(sender, key: try fixture.key(of: sender)).save([record], policy: .merge)
            guard case .failure(let error) = try #require(results.first) else {
                Issue.record("the server stored \(sender)'s \(record.id.name)")
                continue
            }
            #expect(error.code == .notAuthorized, "\(sender): \(error)")
        }
        // Dave, removed, dates a message back to when he was in: refused all the same.
        let early = RecordClock(milliseconds: addDave.clock.milliseconds + 1, counter: 0)
        let name = "m." + OwnershipRule.identityHash("dave") + "." + String(format: "%016llx", early.rawValue) + "-00000000000000ff"
        var backdated = Record(id: try RecordID(zone: zone, name: name), type: "Message", fields: [
            "speaker": .string("dave"), "content": .string("from the past"), "spokenAt": .date(milliseconds: Int64(early.milliseconds)),
        ])
        try backdated.sign(with: try fixture.key(of: "dave"), clock: early)
        let past = try await fixture.rawBackend("dave", key: try fixture.key(of: "dave")).save([backdated], policy: .merge)
        guard case .failure(let refusal) = try #require(past.first) else {
            Issue.record("the server stored a removed member's backdated message")
            return
        }
        #expect(refusal.code == .notAuthorized, "\(refusal)")
        // The creation (which made dave a member) sent again by dave: held already, nothing new.
        let replayed = try await fixture.rawBackend("dave", key: try fixture.key(of: "dave")).save([addDave], policy: .merge)
        if case .failure(let error) = try #require(replayed.first) { Issue.record("the same change again was refused: \(error)") }
        try await syncAll([carol, alice, dave, mallory])
        for store in [carol, alice, dave] {
            #expect(try store.members(of: trip.id).map(\.speaker) == ["carol", "alice"])
            #expect(try store.members(of: trip.id).map(\.role) == [.creator, .member])
        }
        // Never in the group: mallory reads nothing of it, and is not told it exists.
        #expect(try mallory.conversations().isEmpty)
        await #expect(throws: RecordZoneError.self) {
            _ = try await fixture.rawBackend("mallory", key: try fixture.key(of: "mallory")).fetchChanges(in: zone, since: nil, limit: 100)
        }
    }
}
