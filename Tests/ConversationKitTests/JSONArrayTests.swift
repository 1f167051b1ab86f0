import Foundation
import SQLiteKit
import Testing
import TestSupport
@testable import ConversationKit

/// The JSON arrays the store hands SQLite's `json_each` (one statement for many values) read
/// back as the very values, whatever their characters.
@Suite struct JSONArrayTests {
    @Test func everyValueReadsBackAsItWas() throws {
        let dir = try TemporaryDirectory("convkit-json-array")
        let db = try Database(path: dir.path + "/t.sqlite")
        let values = ["c-0000000000000001-0000000000000002", "", "a \"quoted\" word", "back\\slash", "line\nbreak\ttab\u{1}", "ünïcödé 🦓", "\u{7F}"]
        let read = try db.rows("SELECT value FROM json_each(?)", [ConversationStore.jsonArray(values)]) { $0.text(0) }
        #expect(read == values)
        #expect(try db.rows("SELECT value FROM json_each(?)", [ConversationStore.jsonArray([])]) { $0.text(0) }.isEmpty)
    }
}
