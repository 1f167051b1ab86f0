import Foundation
import RecordZone
import Testing
import TestSupport
import ConversationKit

/// A store is its user's alone: created 0700, its database, WAL and key 0600.
@Suite struct StorePrivacyTests {
    static func mode(_ path: String) throws -> Int {
        try #require(try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int) & 0o777
    }

    @Test func aNewStoreIsReadableByItsUserOnly() async throws {
        let fixture = try await ChatFixture(.memory)
        let alice = try await fixture.store("alice")
        try await alice.send("private", to: "bob")
        let directory = fixture.storePath("alice")
        #expect(try Self.mode(directory) == 0o700)
        for file in ["store.sqlite", "store.sqlite-wal", "speaker.key"] {
            #expect(try Self.mode(directory + "/" + file) == 0o600, "\(file)")
        }
    }
}
