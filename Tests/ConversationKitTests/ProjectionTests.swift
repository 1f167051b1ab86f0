import Foundation
import RecordZone
import Testing
@testable import ConversationKit

/// One projection per record type, each the only writer of the tables it owns, read from the
/// sources in `Sources/ConversationKit/Projection/`.
@Suite struct ProjectionTests {
    static let folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Sources/ConversationKit/Projection")

    /// The tables a source file writes: every `INSERT [OR …] INTO t`, `UPDATE t`, `DELETE FROM t`.
    static func tablesWritten(in file: String) throws -> Set<String> {
        let text = try String(contentsOf: folder.appendingPathComponent(file), encoding: .utf8)
        let pattern = try Regex(#"(?:INSERT(?: OR [A-Z]+)? INTO|UPDATE|DELETE FROM|REPLACE INTO) ([a-z_]+)"#)
        return Set(text.matches(of: pattern).compactMap { $0.output[1].substring.map(String.init) })
    }

    @Test func eachProjectionWritesOnlyTheTablesItOwns() throws {
        var owners: [String: String] = [:]
        for projection in Projection.allCases {
            for table in projection.tables {
                #expect(owners.updateValue(projection.rawValue, forKey: table) == nil, "\(table) has two owners")
            }
            let written = try Self.tablesWritten(in: projection.file)
            #expect(!written.isEmpty, "\(projection.file) writes nothing")
            #expect(written.isSubset(of: projection.tables), "\(projection.file) writes \(written.subtracting(projection.tables).sorted()), owned elsewhere")
        }
        let applier = try Self.tablesWritten(in: "RecordApplier.swift")
        #expect(applier.isSubset(of: Projection.applierTables), "the applier writes \(applier.subtracting(Projection.applierTables).sorted())")
        // No other file in the folder: every one is a projection's or the applier's.
        let files = Set(try FileManager.default.contentsOfDirectory(atPath: Self.folder.path))
        #expect(files == Set(Projection.allCases.map(\.file) + ["RecordApplier.swift"]), "\(files.sorted())")

        // Every table a zone's rows live in has one home: a projection, the applier, or the
        // two the store keeps itself (the outbox, this device's settings).
        let homes = Set(owners.keys).union(Projection.applierTables).union(["ck_outbox", "conversation_settings"])
        let zoneTables = Set(ZoneTables.removed).union(ZoneTables.kept.keys)
        #expect(zoneTables.isSubset(of: homes), "no home: \(zoneTables.subtracting(homes).sorted())")
    }

    @Test func everyRecordTypeTheChatProjectsHasOneProjection() {
        let types = Projection.allCases.flatMap(\.recordTypes)
        #expect(types.count == Set(types).count && Projection.of.count == types.count)
        #expect(Set(types) == [ChatRecords.speakerType, ChatRecords.memberType, ChatRecords.messageType, ChatRecords.receiptType, ChatRecords.reactionType,
                               ChatRecords.deliveryType, ChatRecords.blockType, GroupChange.recordType, EncryptionKey.recordType, KeyShare.recordType,
                               HistoryShare.recordType])
    }
}
