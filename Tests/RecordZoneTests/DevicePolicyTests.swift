import Foundation
import Testing
import TestSupport
@testable import RecordZone

/// Device certificates and revocations as every reader decides them.
@Suite struct DevicePolicyTests {
    let zone: ZoneName
    init() throws { zone = try ZoneName("s-alice") }

    func code(by key: SigningKey = Keys.alice, expires: UInt64 = 100) -> LinkCode {
        LinkCode.issue(identity: "alice", identityKey: key, expires: RecordClock(rawValue: expires))
    }

    func note(_ name: String, key: SigningKey, clock: UInt64) throws -> Record {
        try signed(zone, noteName(name, owner: "alice"), type: "Note", fields: ["owner": .string("alice")], key: key, clock: RecordClock(rawValue: clock))
    }

    @Test func aCertifiedDeviceSignsForTheIdentityUntilItIsRevoked() throws {
        let policy = makePolicy(pinnedKeys: ["alice": KeyChain(current: Keys.alice.publicKey)])
        let laptop = Keys.key(21)
        #expect(policy.check(try note("before", key: laptop, clock: 5)) == .keyConflict(identity: "alice"))
        let certificate = try DeviceCertificate.record(code: code(), device: laptop, label: "laptop", zone: zone, clock: RecordClock(rawValue: 10))
        #expect(policy.check(certificate) == nil)
        #expect(policy.check(try note("hello", key: laptop, clock: 20)) == nil)
        #expect(policy.pins.bind(identity: "alice", key: laptop.publicKey))

        // A device signs the identity's records, never its keys: no rotation, device or revocation.
        let rotation = try KeyRotation.record(identity: "alice", zone: zone, from: laptop, to: Keys.key(22), clock: RecordClock(rawValue: 30))
        #expect(policy.check(rotation) == .keyConflict(identity: "alice"))
        let selfRevocation = try DeviceRevocation.record(identity: "alice", device: Keys.key(23).publicKey, revokedAfter: RecordClock(rawValue: 1), zone: zone,
                                                         identityKey: laptop, clock: RecordClock(rawValue: 31))
        #expect(policy.check(selfRevocation) == .deviceNotCertified("a device cannot revoke devices"))

        let revocation = try DeviceRevocation.record(identity: "alice", device: laptop.publicKey, revokedAfter: RecordClock(rawValue: 40), zone: zone,
                                                     identityKey: Keys.alice, clock: RecordClock(rawValue: 50))
        #expect(policy.check(revocation) == nil)
        #expect(policy.check(try note("earlier", key: laptop, clock: 40)) == nil, "signed before the revocation: still valid")
        #expect(policy.check(try note("later", key: laptop, clock: 41)) == .deviceRevoked(identity: "alice"))
        #expect(!policy.pins.bind(identity: "alice", key: laptop.publicKey))
        #expect(policy.pins.isRevokedDevice(laptop.publicKey, of: "alice"))
        // A later revocation cannot widen the window; the certificate read again does not undo it.
        let wider = try DeviceRevocation.record(identity: "alice", device: laptop.publicKey, revokedAfter: RecordClock(rawValue: 90), zone: zone,
                                                identityKey: Keys.alice, clock: RecordClock(rawValue: 91))
        #expect(policy.check(wider) == nil && policy.check(certificate) == nil)
        #expect(policy.pins.chain(for: "alice")?.device(laptop.publicKey)?.revokedAfter == RecordClock(rawValue: 40))
        // The chain survives a restart whole.
        let restored = makePolicy(pinnedKeys: try JSONDecoder().decode([String: KeyChain].self, from: JSONEncoder().encode(["alice": try #require(policy.pins.chain(for: "alice"))])))
        #expect(restored.check(try note("later", key: laptop, clock: 41)) == .deviceRevoked(identity: "alice"))
        #expect(restored.check(try note("earlier", key: laptop, clock: 40)) == nil)
    }

    @Test func aCertificateMustHoldByItself() throws {
        let laptop = Keys.key(21)
        let pinned = { makePolicy(pinnedKeys: ["alice": KeyChain(current: Keys.alice.publicKey)]) }
        // Signed by mallory's key: not alice's.
        #expect(pinned().check(try DeviceCertificate.record(code: code(by: Keys.mallory), device: laptop, label: "", zone: zone, clock: RecordClock(rawValue: 10)))
                == .keyConflict(identity: "alice"))
        // Signed after the code expired.
        #expect(pinned().check(try DeviceCertificate.record(code: code(expires: 9), device: laptop, label: "", zone: zone, clock: RecordClock(rawValue: 10)))
                == .deviceNotCertified("signed after its link code expired"))
        // Without the device's acceptance (someone else's key claimed as a device).
        let invitation = code()
        var unaccepted = try DeviceCertificate.record(code: invitation, device: laptop, label: "", zone: zone, clock: RecordClock(rawValue: 10))
        unaccepted[DeviceCertificate.acceptanceField] = .bytes(Data(repeating: 0, count: 64))
        try unaccepted.sign(with: invitation.enrollment, clock: RecordClock(rawValue: 10))
        #expect(pinned().check(unaccepted) == .deviceNotCertified("the device key did not accept the certificate"))
        // The expiry moved: the invitation no longer verifies.
        var extended = try DeviceCertificate.record(code: invitation, device: laptop, label: "", zone: zone, clock: RecordClock(rawValue: 10))
        extended[DeviceCertificate.expiresField] = .int(1 << 40)
        try extended.sign(with: invitation.enrollment, clock: RecordClock(rawValue: 10))
        #expect(pinned().check(extended) == .deviceNotCertified("the invitation is not signed by the certifier"))
        // A code certifies one device.
        let policy = pinned()
        #expect(policy.check(try DeviceCertificate.record(code: invitation, device: laptop, label: "", zone: zone, clock: RecordClock(rawValue: 10))) == nil)
        #expect(policy.check(try DeviceCertificate.record(code: invitation, device: Keys.key(24), label: "", zone: zone, clock: RecordClock(rawValue: 11)))
                == .deviceNotCertified("its link code certified another device already"))
        // Deleting a certificate is no way to revoke.
        let tombstone = try policy.tombstone(for: try DeviceCertificate.record(code: invitation, device: laptop, label: "", zone: zone, clock: RecordClock(rawValue: 10)),
                                             signedWith: Keys.alice, clock: RecordClock(rawValue: 12))
        #expect(policy.check(tombstone) == .malformed("a device certificate cannot be deleted (revoke the device)"))
    }

    /// A fresh reader sees alice's identity key and her laptop's key claim "alice": related by
    /// the certificate, they are one identity, whatever the order. Mallory certifying alice's
    /// laptop key as her own device fails without the laptop's acceptance: still a conflict.
    @Test func devicesAreNoConflictButForgedCertificatesAre() throws {
        let laptop = Keys.key(21)
        let profile = try signed(zone, "p.alice", type: "Profile", key: Keys.alice, clock: RecordClock(rawValue: 1))
        let certificate = try DeviceCertificate.record(code: code(), device: laptop, label: "laptop", zone: zone, clock: RecordClock(rawValue: 10))
        let fromLaptop = try note("hi", key: laptop, clock: 20)
        for order in [[profile, certificate, fromLaptop], [fromLaptop, certificate, profile]] {
            let fresh = makePolicy()
            #expect(fresh.check(order) == [nil, nil, nil])
            #expect(fresh.pins.conflictedIdentities.isEmpty && fresh.pins.chain(for: "alice")?.current == Keys.alice.publicKey)
        }
        let forgedInvitation = code(by: Keys.mallory)
        var stolen = try DeviceCertificate.record(code: forgedInvitation, device: Keys.mallory, label: "", zone: zone, clock: RecordClock(rawValue: 10))
        stolen[DeviceCertificate.keyField] = .bytes(laptop.publicKey)
        try stolen.sign(with: forgedInvitation.enrollment, clock: RecordClock(rawValue: 10))
        let forgedProfile = try signed(zone, "p.alice", type: "Profile", key: Keys.mallory, clock: RecordClock(rawValue: 2))
        let fresh = makePolicy()
        _ = fresh.check([profile, forgedProfile, stolen, fromLaptop])
        #expect(fresh.pins.conflictedIdentities == ["alice"])
    }

    @Test func linkCodesRoundTripAndRefuseAlteration() throws {
        let issued = code()
        let read = try LinkCode(text: issued.text)
        #expect(read == issued && read.identity == "alice" && read.certifier == Keys.alice.publicKey && read.expires == RecordClock(rawValue: 100))
        #expect(read.enrollment.publicKey == issued.enrollment.publicKey)
        for bad in ["", "hello", "convkit-link-1:", "convkit-link-1:AAAA", String(issued.text.dropLast(3)), issued.text + "AA"] {
            #expect(throws: LinkCode.Failure.self) { try LinkCode(text: bad) }
        }
        var bytes = Array(issued.text.utf8)
        for index in stride(from: LinkCode.prefix.utf8.count, to: bytes.count, by: 7) {
            let original = bytes[index]
            bytes[index] = original == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            #expect(throws: LinkCode.Failure.self) { try LinkCode(text: String(decoding: bytes, as: UTF8.self)) }
            bytes[index] = original
        }
    }
}
