import ConversationKit
import Foundation
@testable import RecordZone
import Testing
import TestSupport

/// One speaker on several devices: linking with a code, sending from both, revoking one.
@Suite struct DeviceTests {
    /// Links a second store of alice's ("laptop") from her first store's code.
    func linkLaptop(_ fixture: ChatFixture, from alice: ConversationStore, configuration: StoreConfiguration = StoreConfiguration()) async throws -> ConversationStore {
        let laptop = try ConversationStore(directory: fixture.storePath("alice-laptop"), backend: fixture.factory(device: "alice-laptop"), configuration: configuration)
        try await laptop.setupLocalSpeaker(linking: try alice.linkDevice(), label: "laptop")
        return laptop
    }

    /// A reader that meets a person's linked device before the person's own zone — bob, who
    /// wrote to alice before he ever synced, reads the pair's folder files as he saves into them
    /// — ends trusting alice's identity key as if he had read her zone first: when both her
    /// keys wrote there (a conflict, until her zone's certificate relates them), and when only
    /// the laptop did (pinned on first use to the laptop's key, until the certificate puts
    /// her identity key at the root). Through a folder, where a save reads the zone.
    @Test(arguments: [true, false])
    func aLinkedDeviceMetBeforeItsPersonsZoneIsTrustedAsThatPersons(_ bothWrote: Bool) async throws {
        let fixture = try await ChatFixture(.filesystem)
        let alice = try await fixture.store("alice")
        let bob = try ConversationStore(directory: fixture.storePath("bob"), backend: fixture.factory(device: "bob"))
        try await bob.setupLocalSpeaker(identifier: "bob", name: "Bob")
        try await alice.sync()
        let laptop = try await linkLaptop(fixture, from: alice)
        var sent = [MessageID]()
        if bothWrote { sent.append(try await alice.send("from the phone", to: "bob").id) }
        sent.append(try await laptop.send("from the laptop", to: "bob").id)
        try await syncAll([alice, laptop])
        let reply = try await bob.send("hello alice", to: "alice")
        try await bob.sync()
        try await bob.sync()
        #expect(bob.trust(of: "alice") == .firstUse)
        #expect(try bob.speaker(fromRef: SpeakerRef(identifier: "alice"))?.publicKey == (try fixture.key(of: "alice")).publicKey)
        let held = try bob.quarantine().map(\.reason)
        #expect(held.isEmpty, "\(held)")
        // Once alice's devices have seen bob's key, he reads both (they waited for their keys).
        try await syncAll([alice, laptop, bob])
        for id in sent { #expect(try bob.message(id).map { $0.content.hasPrefix("from the") && !$0.isWaitingForKey } == true, "\(id)") }
        #expect(try alice.message(reply.id)?.content == "hello alice")
    }

    /// Alice links her laptop to her first device, sends from both: bob sees one alice, and
    /// alice's two stores show the same conversation, her messages as her own on both.
    @Test(arguments: ChatBackend.allCases)
    func aSpeakerOnTwoDevicesIsOneSpeaker(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        try await alice.send("from the phone", to: "bob")
        try await syncAll([alice, bob])

        let laptopKey = try await laptopSendsToo(fixture, alice: alice, bob: bob)

        // Reopened (the first instance is gone, as after a restart), the laptop is still alice's
        // laptop, and still sends as alice.
        let reopened = try ConversationStore(directory: fixture.storePath("alice-laptop"), backend: fixture.factory(device: "alice-laptop"))
        #expect(reopened.localSpeakerIdentifier == "alice" && reopened.localPublicKey == laptopKey)
        try await reopened.send("after a restart", to: "bob")
        try await syncAll([reopened, bob])
        let conversation = try #require(try bob.existingConversation(with: "alice"))
        #expect(try bob.messages(in: conversation.id).messages.map(\.content) == ["from the phone", "from the laptop", "after a restart"])
    }

    /// Links alice's laptop, sends from it, and checks that bob and alice's two stores agree.
    /// - Returns: the laptop's key.
    func laptopSendsToo(_ fixture: ChatFixture, alice: ConversationStore, bob: ConversationStore) async throws -> Data? {
        let laptop = try await linkLaptop(fixture, from: alice)
        #expect(laptop.localSpeakerIdentifier == "alice")
        #expect(laptop.localPublicKey != alice.localPublicKey)
        #expect(try laptop.localSpeaker?.name == "Alice")
        #expect(try laptop.localSpeaker?.publicKey == alice.localPublicKey, "the identity key, the same on both")
        // The laptop has the conversation already: linking synced it. What was said before it
        // existed waits for its key until a device that holds it has seen the laptop's key (each
        // sender shares its epochs with a new device of a member as it learns of it).
        let conversation = try #require(try laptop.existingConversation(with: "bob"))
        #expect(try laptop.messages(in: conversation.id).messages.map(\.isWaitingForKey) == [true])
        try await syncAll([alice, laptop])
        #expect(try laptop.messages(in: conversation.id).messages.map(\.content) == ["from the phone"])

        try await laptop.send("from the laptop", to: "bob")
        try await syncAll([laptop, alice, bob])

        #expect(try bob.allKnownSpeakers().map(\.identifier) == ["alice"])
        #expect(try bob.quarantine().isEmpty)
        let seenByBob = try bob.messages(in: conversation.id).messages
        #expect(seenByBob.map(\.content) == ["from the phone", "from the laptop"])
        #expect(seenByBob.allSatisfy { $0.speaker == "alice" })
        for store in [alice, laptop] {
            #expect(try store.conversations().map(\.id) == [conversation.id])
            let messages = try store.messages(in: conversation.id).messages
            #expect(messages.map(\.content) == ["from the phone", "from the laptop"])
            #expect(messages.allSatisfy { $0.speaker == "alice" && $0.syncState == .synced })
            #expect(try store.quarantine().isEmpty)
        }
        // Both list both devices; each knows which one it is.
        for (store, label) in [(alice, "first device"), (laptop, "laptop")] {
            let devices = try store.devices()
            #expect(Set(devices.map(\.label)) == ["first device", "laptop"])
            #expect(devices.filter(\.isThisDevice).map(\.label) == [label])
            #expect(devices.filter(\.holdsIdentityKey).map(\.label) == ["first device"])
        }
        // Only the first device links and revokes.
        #expect(throws: ConversationError.self) { try laptop.linkDevice() }
        await #expect(throws: ConversationError.self) { try await laptop.revokeDevice(try #require(try laptop.devices().first { $0.isThisDevice })) }
        return laptop.localPublicKey
    }

    /// Alice revokes her laptop: what it signed before stays; what it signs later is refused by
    /// the backend and by every store, and a server refuses it even when the laptop backdates it.
    @Test(arguments: ChatBackend.allCases)
    func aRevokedDevicesLaterRecordsAreRefusedEverywhere(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice")
        let bob = try await fixture.store("bob")
        let laptop = try await linkLaptop(fixture, from: alice)
        try await laptop.send("before", to: "bob")
        try await syncAll([laptop, alice, bob])

        let device = try #require(try alice.devices().first { $0.label == "laptop" })
        try await alice.revokeDevice(device)
        try await alice.sync()
        #expect(try alice.devices().first { $0.label == "laptop" }?.revokedAfter != nil)

        let late = try await laptop.send("after the revocation", to: "bob")
        if kind.isServer {
            // The server no longer takes the laptop's key at all, and says so: the laptop is
            // told it was revoked, not left waiting.
            await #expect { try await laptop.sync() } throws: { ($0 as? ConversationError)?.code == .deviceRevoked }
        } else {
            try await laptop.sync()
        }
        // On every backend the laptop's late message fails, as revoked, and leaves the outbox.
        guard case .failed(let failure)? = try laptop.message(late.id)?.syncState else {
            Issue.record("the revoked device's message is \(String(describing: try laptop.message(late.id)?.syncState))")
            return
        }
        #expect(failure.code == .deviceRevoked, "\(failure)")
        #expect(try laptop.pendingChangeCount() == 0)
        try await syncAll([alice, bob])
        let conversation = late.id.conversation
        #expect(try bob.messages(in: conversation).messages.map(\.content) == ["before"])
        #expect(try alice.messages(in: conversation).messages.map(\.content) == ["before"])
        #expect(try laptop.messages(in: conversation).messages.first { $0.id == late.id }?.syncState != .synced)
        if kind == .filesystem {
            // A folder takes whatever its writers write; every reader refuses it.
            #expect(try bob.quarantine().contains { $0.reason.contains("after it was revoked") })
            #expect(try alice.quarantine().contains { $0.reason.contains("after it was revoked") })
        }

        // The laptop's key, stolen, backdates a message to before the revocation.
        var backdated = Record(id: try RecordID(zone: try ZoneName(conversation), name: "m.\(OwnershipRule.identityHash("alice")).0001-backdated"), type: "Message", fields: [
            "speaker": .string("alice"), "listener": .string("bob"), "content": .string("backdated"), "spokenAt": .date(milliseconds: 1_800_000_000_000),
        ])
        try backdated.sign(with: try KeyFile.load(from: fixture.storePath("alice-laptop") + "/device.key"), clock: RecordClock(milliseconds: 1, counter: 0))
        if kind != .filesystem {
            let raw = try fixture.rawBackend("alice", key: try KeyFile.load(from: fixture.storePath("alice-laptop") + "/device.key"))
            if kind.isServer {
                await #expect { try await raw.save([backdated]) } throws: {
                    ($0 as? RecordZoneError)?.code == .notAuthenticated && ($0 as? RecordZoneError)?.authentication == .deviceRevoked
                }
            } else {
                guard case .failure(let error) = try await raw.save([backdated])[0] else { Issue.record("the backdated message was saved"); return }
                #expect(error.code == .notAuthorized)
            }
        }
    }

    /// A link code past its expiry, altered, or signed by a key that is not the identity's is
    /// refused with a typed error, and leaves the new store without a speaker.
    @Test(arguments: ChatBackend.allCases)
    func badLinkCodesAreRefusedWithTypedErrors(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let alice = try await fixture.store("alice")
        try await alice.sync()
        func newStore(_ name: String, now: Date = Date()) throws -> ConversationStore {
            var configuration = StoreConfiguration()
            configuration.now = { now }
            return try ConversationStore(directory: fixture.storePath(name), backend: fixture.factory(device: name), configuration: configuration)
        }
        func refusal(_ code: String, on store: ConversationStore) async -> ConversationError.Code? {
            do {
                try await store.setupLocalSpeaker(linking: code)
                return nil
            } catch {
                return error.code
            }
        }

        // Past its expiry by more than the skew tolerance (5 min) of the joining machine's clock.
        let code = try alice.linkDevice(lifetime: 60)
        let late = try newStore("late", now: Date().addingTimeInterval(60 + StoreConfiguration().clockSkewTolerance + 60))
        #expect(await refusal(code, on: late) == .linkCodeExpired)
        #expect(late.localSpeakerIdentifier == nil)

        var altered = Array(code)
        let index = altered.count - 20
        altered[index] = altered[index] == "A" ? "B" : "A"
        let tampered = try newStore("tampered")
        #expect(await refusal(String(altered), on: tampered) == .invalidLinkCode)
        #expect(await refusal("convkit-link-1:nonsense", on: tampered) == .invalidLinkCode)
        #expect(await refusal("hello", on: tampered) == .invalidLinkCode)

        // Mallory signs a code for "alice" with her own key.
        let mallory = SigningKey.generate()
        let forged = LinkCode.issue(identity: "alice", identityKey: mallory, expires: RecordClock(milliseconds: UInt64(Date().timeIntervalSince1970 * 1000) + 60_000, counter: 0))
        let victim = try newStore("victim")
        #expect(await refusal(forged.text, on: victim) == .keyConflict)
        #expect(victim.localSpeakerIdentifier == nil)

        // A code links one device only.
        let first = try newStore("first")
        try await first.setupLocalSpeaker(linking: code)
        #expect(first.localSpeakerIdentifier == "alice")
        let second = try newStore("second")
        #expect(await refusal(code, on: second) != nil)
        #expect(second.localSpeakerIdentifier == nil)
        try await alice.sync()
        #expect(try alice.devices().count == 2)

        // A machine whose clock is 4 minutes ahead of the one that made a 1-minute code (3 min
        // past its expiry by its own clock): within the tolerance, it links, on every backend.
        let ahead = try newStore("ahead", now: Date().addingTimeInterval(240))
        try await ahead.setupLocalSpeaker(linking: try alice.linkDevice(lifetime: 60), label: "ahead")
        #expect(ahead.localSpeakerIdentifier == "alice")
        try await alice.sync()
        #expect(try alice.devices().contains { $0.label == "ahead" })
    }
}
