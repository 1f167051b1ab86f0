import Foundation
import RecordZone
import SQLiteKit

/// One of the local speaker's devices, as ``ConversationStore/devices()`` lists them.
public struct Device: Sendable, Hashable, Identifiable {
    /// The key the device signs with (the identity key, on the first device).
    public let publicKey: Data
    /// The name it was linked with ("first device" for the one that holds the identity key).
    public let label: String
    /// Whether it holds the identity key (the first device: it links and revokes the others).
    public let holdsIdentityKey: Bool
    /// Whether it is the device this store runs on.
    public let isThisDevice: Bool
    /// Set once revoked: the last time at which what it signed is still valid.
    public let revokedAfter: Date?
    /// The device key's safety number, to compare with the device's own screen.
    public let fingerprint: String

    public var id: Data { publicKey }
}

extension ConversationStore {
    /// How long a link code stays valid by default: ten minutes.
    public static let defaultLinkCodeLifetime: TimeInterval = 600

    /// On the device that holds the identity key: a link code for one more device of the local
    /// speaker, valid for `lifetime` seconds. Hand it over privately (type it, scan it): whoever
    /// holds it before it expires can link one device, which then shows in ``devices()``.
    /// - Throws: ``ConversationError/Code/notIdentityDevice`` on a linked device.
    public func linkDevice(lifetime: TimeInterval = ConversationStore.defaultLinkCodeLifetime) throws(ConversationError) -> String {
        let local = try requireIdentity()
        guard let identityKey = local.identityKey else {
            throw ConversationError(.notIdentityDevice, "only the first device of '\(local.identifier)', which holds its identity key, can link devices")
        }
        let expires = RecordClock(milliseconds: UInt64(max(0, (configuration.now().timeIntervalSince1970 + lifetime) * 1000)), counter: UInt16.max)
        return LinkCode.issue(identity: local.identifier, identityKey: identityKey, expires: expires).text
    }

    /// Sets this store up as another device of the speaker whose first device made `code`
    /// (``linkDevice(lifetime:)``): creates this device's key, checks with the backend that the
    /// code's identity key is the speaker's, publishes the device's certificate, and syncs. From
    /// then on this store sends and sees the speaker's conversations as the speaker.
    /// - Throws: ``ConversationError/Code/invalidLinkCode`` (not a code, or altered),
    ///   ``ConversationError/Code/linkCodeExpired``, ``ConversationError/Code/keyConflict`` (the
    ///   code was signed by a key that is not the speaker's, as this store or the backend knows
    ///   it), ``ConversationError/Code/storeBelongsToAnotherSpeaker``,
    ///   ``ConversationError/Code/backend`` (the backend cannot be reached: nothing is set up).
    @discardableResult
    public func setupLocalSpeaker(linking code: String, label: String = ProcessInfo.processInfo.hostName) async throws(ConversationError) -> Speaker {
        let link: LinkCode
        do { link = try LinkCode(text: code) } catch {
            guard case .invalid(let why) = error else { throw ConversationError(.invalidLinkCode, "invalid link code") }
            throw ConversationError(.invalidLinkCode, why)
        }
        try ChatRecords.validate(identifier: link.identity)
        if let existing = localSpeakerIdentifier {
            throw ConversationError(.storeBelongsToAnotherSpeaker, "this store is set up already, as '\(existing)'")
        }
        // A code made on a machine whose clock is behind this one's is taken up to the skew
        // tolerance past its expiry; the certificate is then signed at the expiry (readers check
        // its clock against it).
        let now = min(clock.now(), link.expires)
        let late = configuration.now().timeIntervalSince1970 - Double(link.expires.milliseconds) / 1000
        guard late <= configuration.clockSkewTolerance else {
            throw ConversationError(.linkCodeExpired, "the link code expired \(Int(late / 60)) min ago by this machine's clock (at \(Date(timeIntervalSince1970: Double(link.expires.milliseconds) / 1000))); "
                                    + "make a new one — or, if the two machines' clocks differ by more than \(Int(configuration.clockSkewTolerance / 60)) min, set them right")
        }
        if let pinned = policy.pins.chain(for: link.identity), pinned.current != link.certifier {
            throw ConversationError(.keyConflict, "this store holds another key for '\(link.identity)' than the one that signed the link code")
        }
        let deviceKey: SigningKey
        do { deviceKey = try KeyFile.loadOrCreate(at: deviceKeyFile) } catch {
            throw ConversationError(.storeNotWritable, "cannot keep the device key: \(error.message)", backendError: error)
        }
        let zone = ChatRecords.speakerZone(link.identity)
        let certificate: Record, certificateBytes: Data
        do {
            certificate = try DeviceCertificate.record(code: link, device: deviceKey, label: label, zone: zone, clock: now)
            certificateBytes = try certificate.encoded()
        } catch {
            throw ConversationError(.invalidIdentifier, error.message)
        }
        let pulled = try await publish(certificate, bytes: certificateBytes, for: link, key: deviceKey)

        let local = LocalIdentity(identifier: link.identity, key: deviceKey, certificate: certificateBytes)
        guard policy.pins.pinVerified(link.certifier, for: link.identity) else {
            throw ConversationError(.keyConflict, "this store holds another key for '\(link.identity)'")
        }
        let policy = self.policy
        try await write { applier in
            try Self.setLocalSpeaker(link.identity, in: &applier)
            try applier.db.execute("INSERT INTO ck_meta (key, value) VALUES ('device_certificate', ?)", [certificateBytes])
            applier.device = local
            try applier.follow(link.identity)
            for record in [certificate] + pulled {
                if let reason = policy.check(record) {
                    try applier.quarantine(RejectedRecord(recordID: record.id, reason: reason, source: "link", data: try? record.encoded()))
                } else {
                    try applier.apply(record, origin: .remote)
                }
            }
            try applier.publishEncryptionKey()
        }
        database.identity.withLock { $0 = local }
        do { try await sync() } catch where error.backendError?.isTransient == true {
            // Linked; the conversations come with the next sync.
        }
        return try localSpeaker ?? Speaker(identifier: link.identity, name: link.identity, tags: [], isLocalSpeaker: true,
                                           publicKey: link.certifier, trust: .verified)
    }

    /// Checks the code's identity key against what the backend holds for the speaker, then saves
    /// the certificate. - Returns: the records of the speaker's zone, read with the code's key pinned.
    private func publish(_ certificate: Record, bytes: Data, for link: LinkCode, key: SigningKey) async throws(ConversationError) -> [Record] {
        let probe = ChatRecords.policy(pinnedKeys: [link.identity: KeyChain(current: link.certifier, isVerified: true)])
        let zone = certificate.id.zone
        do {
            let backend = try backendFactory.make(BackendContext(policy: probe, identity: link.identity, key: key, deviceCertificate: bytes, stateDirectory: backendStateDirectory))
            try await backend.createZone(zone)
            var records = [Record](), token: ChangeToken? = nil
            while true {
                let page = try await backend.fetchChanges(in: zone, since: token, limit: 500)
                if let conflict = page.rejected.first(where: { $0.reason.code == .keyConflict }) {
                    throw ConversationError(.keyConflict, "the link code is not signed by the key '\(link.identity)' holds on the backend (\(conflict.reason))")
                }
                records += page.records
                token = page.token
                if !page.moreComing { break }
            }
            if case .failure(let error) = try await backend.save([certificate])[0] {
                throw ConversationError(error.code == .notAuthorized ? .keyConflict : .backend, "the backend refused the device certificate: \(error.message)", backendError: error)
            }
            return records
        } catch let error as ConversationError {
            throw error
        } catch let error as RecordZoneError {
            if error.code == .notAuthorized || error.code == .notAuthenticated {
                throw ConversationError(.keyConflict, "the backend refused this device for '\(link.identity)': \(error.message)", backendError: error)
            }
            throw ConversationError(.backend, "cannot publish the device certificate: \(error)", backendError: error)
        } catch {
            throw ConversationError(.backend, "cannot publish the device certificate: \(error)")
        }
    }

    /// The local speaker's devices: the first one (identity key) and every device it linked,
    /// with revocations.
    public func devices() throws(ConversationError) -> [Device] {
        let local = try requireIdentity()
        let chain = policy.pins.chain(for: local.identifier)
        let labels = try read { db in
            try db.rows("SELECT record FROM ck_records WHERE zone = ? AND type = ?", [ChatRecords.speakerZone(local.identifier).rawValue, DeviceCertificate.recordType]) {
                $0.blob(0)
            }
        }.compactMap { try? Record(canonical: $0) }.reduce(into: [Data: String]()) { labels, record in
            if let key = record[DeviceCertificate.keyField]?.bytesValue { labels[key] = record[DeviceCertificate.labelField]?.stringValue ?? "" }
        }
        func device(_ key: Data, label: String, holdsIdentityKey: Bool, revokedAfter: RecordClock?) -> Device {
            Device(publicKey: key, label: label, holdsIdentityKey: holdsIdentityKey, isThisDevice: key == local.key.publicKey,
                   revokedAfter: revokedAfter.map { Date(timeIntervalSince1970: Double($0.milliseconds) / 1000) },
                   fingerprint: KeyChain.fingerprint(identity: local.identifier, key: key))
        }
        guard let chain else { return [] }
        return [device(chain.current, label: "first device", holdsIdentityKey: true, revokedAfter: nil)]
            + chain.devices.filter { $0.enrollment != nil }.map { device($0.key, label: labels[$0.key] ?? "", holdsIdentityKey: false, revokedAfter: $0.revokedAfter) }
    }

    /// Revokes one of the local speaker's linked devices (lost, stolen, sold): what it signed up
    /// to `after` (default: now) stays valid, anything later is refused by every reader, and a
    /// server refuses whatever it saves from now on, whatever clock it claims. Set `after` to when
    /// the device was lost, so that what a thief backdates is refused too.
    /// - Throws: ``ConversationError/Code/notIdentityDevice`` on a linked device,
    ///   ``ConversationError/Code/unknownDevice``.
    public func revokeDevice(_ device: Device, after: Date? = nil) async throws(ConversationError) {
        let local = try requireIdentity()
        guard let identityKey = local.identityKey else {
            throw ConversationError(.notIdentityDevice, "only the first device of '\(local.identifier)', which holds its identity key, can revoke devices")
        }
        guard policy.pins.chain(for: local.identifier)?.device(device.publicKey) != nil else {
            throw ConversationError(.unknownDevice, "'\(local.identifier)' has no device with this key")
        }
        let now = clock.now()
        let revokedAfter = after.map { RecordClock(milliseconds: UInt64(max(0, $0.timeIntervalSince1970 * 1000)), counter: UInt16.max) } ?? now
        let policy = self.policy
        try await write { applier in
            let record = try DeviceRevocation.record(identity: local.identifier, device: device.publicKey, revokedAfter: min(revokedAfter, now),
                                                     zone: ChatRecords.speakerZone(local.identifier), identityKey: identityKey, clock: now)
            if let reason = policy.check(record) { throw ConversationError(.database, "the revocation was refused: \(reason)") }
            try self.applyLocal(record, in: &applier)
        }
    }
}
