import Foundation
import Synchronization
import RecordZone
import Testing
import TestSupport
@testable import ConversationKit

/// A server that does not accept who signs a request says why, and the store tells its user:
/// never the silent "takes no writes" deferral that left messages pending forever.
@Suite struct AuthenticationFailureTests {
    /// A machine whose clock is 10 minutes fast: the sync fails with a typed error that names the
    /// skew; the message waits in the outbox with the reason (nothing is lost), and goes once the
    /// clock is right.
    @Test(arguments: ChatBackend.allCases.filter(\.isServer))
    func aClockTenMinutesAheadGivesATypedErrorNamingTheSkew(_ kind: ChatBackend) async throws {
        let fixture = try await ChatFixture(kind)
        let url = try #require(fixture.serverURL)
        let skew = Mutex(600.0)
        var configuration = StoreConfiguration()
        configuration.retryBaseDelay = 0
        let alice = try ConversationStore(directory: fixture.storePath("alice"), backend: .custom { context in
            HTTPBackend(url: url, identity: context.identity, key: context.key, policy: context.policy, deviceCertificate: context.deviceCertificate,
                        now: { Date().addingTimeInterval(skew.withLock { $0 }) })
        }, configuration: configuration)
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        let message = try await alice.send("on a fast clock", to: "bob")
        do {
            try await alice.sync()
            Issue.record("a sync with a clock 600 s ahead succeeded")
        } catch {
            #expect(error.code == .notAuthenticated, "\(error)")
            guard case .clockSkew(let seconds)? = error.backendError?.authentication else {
                Issue.record("no clock skew in \(error)")
                return
            }
            #expect(abs(seconds - 600) < 30, "\(seconds)")
            // The message names the skew: 600 s, less the request's transit (599 s on a loaded machine).
            let ahead = error.message.components(separatedBy: " s ahead of the server's").first?.split(separator: " ").last.flatMap { Int($0) }
            #expect(ahead.map { abs($0 - 600) <= 30 } == true, "\(error.message)")
        }
        #expect(try alice.message(message.id)?.syncState == .pending)
        #expect(try alice.outbox().contains { $0.lastError?.contains("ahead of the server's clock") == true && $0.lastErrorCode == .notAuthenticated })

        skew.withLock { $0 = 0 }
        try await alice.sync()
        #expect(try alice.message(message.id)?.syncState == .synced)
    }

    /// The continuous sync says the same: not "unreachable" but not accepted, with the reason.
    @Test func theContinuousSyncReportsAClockTooFarOffAsNotAccepted() async throws {
        let fixture = try await ChatFixture(.http)
        let url = try #require(fixture.serverURL)
        let alice = try ConversationStore(directory: fixture.storePath("alice"), backend: .custom { context in
            HTTPBackend(url: url, identity: context.identity, key: context.key, policy: context.policy, now: { Date().addingTimeInterval(-3600) })
        })
        try await alice.setupLocalSpeaker(identifier: "alice", name: "Alice")
        let events = alice.events()
        let running = Task { try await alice.run() }
        defer { running.cancel() }
        _ = try await alice.send("on a slow clock", to: "bob")
        // A bound on waiting, not on speed: with nothing else running the activity comes within a second.
        let activity = await firstElement(of: events, seconds: 60) { if case .syncActivity(.notAccepted) = $0 { true } else { false } }
        guard case .syncActivity(.notAccepted(let code, let reason))? = activity else {
            Issue.record("no notAccepted activity: \(String(describing: activity))")
            return
        }
        // 3600 s, and the request's own transit on a loaded machine (rounded: 3601 s happens).
        let behind = reason.components(separatedBy: " s behind").first?.split(separator: " ").last.flatMap { Int($0) }
        #expect(code == .notAuthenticated && behind.map { abs($0 - 3600) <= 30 } == true, "\(reason)")
    }

    /// The same skew seen from outside: the 401's body carries the reason and the skew.
    @Test func aSkewedRequestIsAnsweredWithTheReasonAndTheSkew() async throws {
        let fixture = try await ChatFixture(.http)
        let backend = HTTPBackend(url: try #require(fixture.serverURL), identity: "alice", key: SigningKey.generate(), policy: ConversationStore.recordPolicy(),
                                  now: { Date().addingTimeInterval(-900) })
        await #expect {
            try await backend.zones()
        } throws: { error in
            guard let error = error as? RecordZoneError, case .clockSkew(let seconds)? = error.authentication else { return false }
            return error.code == .notAuthenticated && abs(seconds + 900) < 30
        }
    }
}
