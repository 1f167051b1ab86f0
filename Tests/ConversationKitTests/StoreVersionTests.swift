import ConversationKit
import Foundation
import SQLiteKit
import Testing
import TestSupport

/// A store whose schema is not this version's is refused with its own code, never mistaken for
/// a store that cannot be written.
@Suite struct StoreVersionTests {
    @Test func aStoreOfAnotherSchemaVersionIsRefusedWithItsOwnCode() async throws {
        let fixture = try await ChatFixture(.memory)
        let path = fixture.storePath("alice")
        var store: ConversationStore? = try await fixture.store("alice")
        _ = try await store?.send("kept", to: "bob")
        store?.close()
        store = nil
        let file = path + "/store.sqlite"
        let current = try Database(path: file, readOnly: true).userVersion

        // An older schema, opened only to look at: nothing may migrate it.
        try Database(path: file).execute("PRAGMA user_version = \(current - 1)")
        let older = Self.error { _ = try ConversationStore.inspecting(directory: path) }
        #expect(older?.code == .storeVersionMismatch)
        #expect(older?.sqliteError?.schema?.found == current - 1 && older?.sqliteError?.schema?.known == current && older?.sqliteError?.schema?.isNewer == false)

        // A newer schema (a later version wrote it): refused for writing and for looking.
        try Database(path: file).execute("PRAGMA user_version = \(current + 1)")
        let newer = Self.error { _ = try ConversationStore(directory: path, backend: fixture.factory(device: "alice")) }
        #expect(newer?.code == .storeVersionMismatch && newer?.sqliteError?.schema?.isNewer == true)
        #expect(Self.error { _ = try ConversationStore.inspecting(directory: path) }?.code == .storeVersionMismatch)

        // Put back, it opens with what it held.
        try Database(path: file).execute("PRAGMA user_version = \(current)")
        let reopened = try ConversationStore.inspecting(directory: path)
        #expect(try reopened.conversations().count == 1)
    }

    static func error(_ body: () throws -> Void) -> ConversationError? {
        do { try body() } catch let error as ConversationError { return error } catch { return nil }
        return nil
    }
}
