import Foundation
import Testing
import TestSupport
@testable import RecordZone

@Suite struct RecordPolicyTests {
    let profiles: ZoneName
    init() throws { profiles = try ZoneName("profiles") }

    @Test func firstKeySeenIsPinnedAndAnotherKeyIsRefused() throws {
        let policy = makePolicy()
        let bobProfile = try signed(profiles, "p.bob", type: "Profile", key: Keys.bob, clock: RecordClock(rawValue: 1))
        #expect(policy.check(bobProfile) == nil)
        let forged = try signed(profiles, "p.bob", type: "Profile", key: Keys.mallory, clock: RecordClock(rawValue: 2))
        #expect(policy.check(forged) == .keyConflict(identity: "bob"))
        // A note claiming bob as owner but signed by mallory is refused too: same identity.
        let note = try note(profiles, "n", owner: "bob", key: Keys.mallory, clock: RecordClock(rawValue: 3))
        #expect(policy.check(note) == .keyConflict(identity: "bob"))
        #expect(policy.pins.chain(for: "bob")?.current == Keys.bob.publicKey)
    }

    @Test func unsignedAlteredAndWrongKeyRecordsAreRefused() throws {
        let policy = makePolicy()
        var record = try signed(profiles, "x", clock: RecordClock(rawValue: 1))
        var unsigned = record
        unsigned.signature = Data()
        #expect(policy.check(unsigned) == .unsigned)
        record["extra"] = .int(1)  // altered after signing
        #expect(policy.check(record) == .invalidSignature)
        var wrongKey = try signed(profiles, "y", clock: RecordClock(rawValue: 1))
        wrongKey.authorKey = Keys.bob.publicKey  // claims bob, signed by alice
        #expect(policy.check(wrongKey) == .invalidSignature)
    }

    @Test func theRecordIDNamesTheOwnerWhateverAVersionSays() throws {
        let policy = makePolicy()
        #expect(policy.check(try note(profiles, "n", owner: "alice", clock: RecordClock(rawValue: 1))) == nil)
        #expect(policy.check(try signed(profiles, "p.bob", type: "Profile", key: Keys.bob, clock: RecordClock(rawValue: 1))) == nil)
        // Bob's version of alice's note names himself as owner: the ID still says alice.
        let rewritten = try signed(profiles, noteName("n", owner: "alice"), type: "Note", fields: ["owner": .string("bob"), "text": .string("mine")],
                                   key: Keys.bob, clock: RecordClock(rawValue: 2))
        #expect(policy.check(rewritten) == .ownerFieldMismatch(field: "owner"))
        // Signed by bob with alice named: bob's key does not speak for alice.
        let impostor = try note(profiles, "n", owner: "alice", key: Keys.bob, clock: RecordClock(rawValue: 3))
        #expect(policy.check(impostor) == .keyConflict(identity: "alice"))
        // Under another type, an owned ID is still owned: no rule-free back door.
        let retyped = try signed(profiles, noteName("n", owner: "alice"), type: "Shared", key: Keys.bob, clock: RecordClock(rawValue: 4))
        #expect(policy.check(retyped) == .notOwnedByID(recordType: "Shared"))
        // An owned type under a free name has no owner.
        let loose = try signed(profiles, "free", type: "Note", fields: ["owner": .string("bob")], key: Keys.bob, clock: RecordClock(rawValue: 5))
        #expect(policy.check(loose) == .notOwnedByID(recordType: "Note"))
        // A field that must repeat the owner from the name.
        #expect(policy.check(try signed(profiles, "t.alice", type: "Thread", fields: ["author": .string("alice")], clock: RecordClock(rawValue: 6))) == nil)
        let thread = try signed(profiles, "t.carol", type: "Thread", fields: ["author": .string("alice")], clock: RecordClock(rawValue: 7))
        #expect(policy.check(thread) == .ownerFieldMismatch(field: "author"))
        // A closed policy refuses records no rule covers.
        let closed = RecordPolicy(rules: OwnershipRules(Array(policy.rules.all.dropFirst(OwnershipRules.keyRules.count)), requiresOwner: true))
        #expect(closed.check(try signed(profiles, "free", clock: RecordClock(rawValue: 8))) == .notOwnedByID(recordType: "Shared"))
    }

    @Test func chainsChangedByAdmissionAreHandedOutOnce() throws {
        let policy = makePolicy(pinnedKeys: ["carol": KeyChain(current: Keys.carol.publicKey)])
        #expect(policy.pins.takeChangedChains().isEmpty)
        #expect(policy.check(try note(profiles, "a", owner: "alice", clock: RecordClock(rawValue: 1))) == nil)
        #expect(policy.check(try note(profiles, "b", owner: "bob", key: Keys.bob, clock: RecordClock(rawValue: 1))) == nil)
        let changed = policy.pins.takeChangedChains()
        #expect(Set(changed.keys) == ["alice", "bob"])
        #expect(policy.pins.takeChangedChains().isEmpty)
        policy.pins.restoreChangedChains(changed)
        #expect(Set(policy.pins.takeChangedChains().keys) == ["alice", "bob"])
    }

    @Test func tombstonesKeepTheirOwnerAndMustBeSignedByIt() throws {
        let policy = makePolicy()
        let original = try note(profiles, "n", owner: "alice", clock: RecordClock(rawValue: 1))
        #expect(policy.check(original) == nil)
        let stone = try policy.tombstone(for: original, signedWith: Keys.alice, clock: RecordClock(rawValue: 2))
        #expect(stone.isDeleted && stone["text"] == nil && stone["owner"] == .string("alice"))
        #expect(policy.check(stone) == nil)
        let forgedStone = try policy.tombstone(for: original, signedWith: Keys.mallory, clock: RecordClock(rawValue: 3))
        #expect(policy.check(forgedStone) == .keyConflict(identity: "alice"))
    }

    @Test func rotationSignedByThePinnedKeyMovesThePin() throws {
        let policy = makePolicy()
        let newKey = Keys.key(9)
        #expect(policy.check(try signed(profiles, "p.alice", type: "Profile", clock: RecordClock(rawValue: 10))) == nil)
        // Mallory cannot rotate alice's key.
        let hostile = try KeyRotation.record(identity: "alice", zone: profiles, from: Keys.mallory, to: Keys.mallory, clock: RecordClock(rawValue: 20))
        #expect(policy.check(hostile) == .keyConflict(identity: "alice"))
        let rotation = try KeyRotation.record(identity: "alice", zone: profiles, from: Keys.alice, to: newKey, clock: RecordClock(rawValue: 20))
        #expect(policy.check(rotation) == nil)
        #expect(policy.check(try signed(profiles, "p.alice", type: "Profile", key: newKey, clock: RecordClock(rawValue: 30))) == nil)
        // The old key stays valid for what it signed before the rotation, not after.
        #expect(policy.check(try note(profiles, "old", owner: "alice", key: Keys.alice, clock: RecordClock(rawValue: 15))) == nil)
        #expect(policy.check(try note(profiles, "late", owner: "alice", key: Keys.alice, clock: RecordClock(rawValue: 31))) == .keyConflict(identity: "alice"))
    }

    /// Mallory cannot claim to be alice's earlier key by "rotating" from his key to hers: the new
    /// key must accept a rotation. A fresh reader sees a conflict; a real rotation is no conflict.
    @Test func aRotationNeedsTheNewKeysAcceptance() throws {
        let realProfile = try signed(profiles, "p.alice", type: "Profile", clock: RecordClock(rawValue: 10))
        var prepended = try KeyRotation.record(identity: "alice", zone: profiles, from: Keys.mallory, to: Keys.mallory, clock: RecordClock(rawValue: 50))
        prepended[KeyRotation.newKeyField] = .bytes(Keys.alice.publicKey)  // mallory → alice, without alice's acceptance
        try prepended.sign(with: Keys.mallory, clock: RecordClock(rawValue: 50))
        let forgedProfile = try signed(profiles, "p.alice", type: "Profile", key: Keys.mallory, clock: RecordClock(rawValue: 40))
        for order in [[prepended, forgedProfile, realProfile], [realProfile, forgedProfile, prepended]] {
            #expect(makePolicy().check(order) == [.identityConflict(identity: "alice"), .identityConflict(identity: "alice"), .identityConflict(identity: "alice")])
        }
        // Even the pinned key cannot move the pin to a key that did not accept it.
        var unaccepted = try KeyRotation.record(identity: "alice", zone: profiles, from: Keys.alice, to: Keys.key(9), clock: RecordClock(rawValue: 60))
        unaccepted[KeyRotation.acceptanceField] = nil
        try unaccepted.sign(with: Keys.alice, clock: RecordClock(rawValue: 60))
        #expect(makePolicy(pinnedKeys: ["alice": KeyChain(current: Keys.alice.publicKey)]).check(unaccepted) == .invalidSignature)

        let newKey = Keys.key(9)
        let rotation = try KeyRotation.record(identity: "alice", zone: profiles, from: Keys.alice, to: newKey, clock: RecordClock(rawValue: 20))
        let afterRotation = try signed(profiles, "p.alice", type: "Profile", key: newKey, clock: RecordClock(rawValue: 30))
        let fresh = makePolicy()
        #expect(fresh.check([realProfile, rotation, afterRotation]) == [nil, nil, nil])
        #expect(fresh.pins.chain(for: "alice")?.current == newKey.publicKey)
    }

    @Test func mergeRuleIsDeterministic() throws {
        let low = try signed(profiles, "r", key: Keys.bob, clock: RecordClock(rawValue: 5))
        let high = try signed(profiles, "r", key: Keys.alice, clock: RecordClock(rawValue: 6))
        #expect(MergeRule.winner(low, high) == high && MergeRule.winner(high, low) == high)
        // Same clock: the higher author key wins, whichever is seen first.
        let a = try signed(profiles, "r", key: Keys.alice, clock: RecordClock(rawValue: 7))
        let b = try signed(profiles, "r", key: Keys.bob, clock: RecordClock(rawValue: 7))
        let expected = Keys.alice.publicKey.lexicographicallyPrecedes(Keys.bob.publicKey) ? b : a
        #expect(MergeRule.winner(a, b) == expected && MergeRule.winner(b, a) == expected)
        // A tombstone is a version like any other.
        let stone = try a.tombstone(signedWith: Keys.alice, clock: RecordClock(rawValue: 8))
        #expect(MergeRule.winner(stone, b).isDeleted)
    }
}
