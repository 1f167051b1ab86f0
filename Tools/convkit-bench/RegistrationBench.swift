import ConversationKit
import Foundation
import RecordZone
import ZoneServer

/// New speakers registering with a chat zone server that already holds `existing` identities:
/// each is a fresh key whose first request binds its identity and saves its signed profile.
/// The pins are written one identity at a time with the save, so the rate should not depend on
/// how many identities the server holds. Then a tag query with one match among them, answered
/// from the server's index of Speaker tags: its cost should not depend on the count either.
@MainActor func registrationBench(_ reporter: Reporter, seconds: Double, existing counts: [Int]) async throws {
    reporter.header("Registering new speakers on a chat zone server (pins written with each save)")
    var rawRoundTrip = 0.0
    for existing in counts {
        let root = FileManager.default.temporaryDirectory.path + "/convkit-registration-bench-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let storage = try SQLiteZoneStorage(directory: root, policy: ConversationStore.recordPolicy(), indexedFields: ConversationStore.queryIndexes)
        let speakers = try ZoneName("speakers")
        try await storage.createZone(speakers)
        let clock = HybridLogicalClock()
        // Fill in-process, 400 profiles per transaction, each signed by its own key.
        var filled = 0
        while filled < existing {
            let batch = try (filled..<min(existing, filled + Record.maximumBatchSize)).map { try profile("existing-\($0)", tag: "t-\($0)", clock: clock, zone: speakers).record }
            for result in try await storage.save(batch) { _ = try result.get() }
            filled += batch.count
        }
        let (server, url, _) = try startBenchServer(storage, access: ChatZoneAccess())
        if rawRoundTrip == 0 { rawRoundTrip = try rawLibmicrohttpdRoundTrips(seconds: seconds) }
        var next = 0
        let registered = try await rateAsync(seconds: seconds, batch: 1) {
            defer { next += 1 }
            let (record, key) = try profile("new-\(next)", tag: "bench", clock: clock, zone: speakers)
            let client = HTTPBackend(url: url, identity: "new-\(next)", key: key, policy: ConversationStore.recordPolicy())
            _ = try await client.save([record])[0].get()
            return true
        }
        reporter.report(Row(name: "new speaker registered, \(existing) held", perSecond: registered, rawName: "raw libmicrohttpd round trip", rawPerSecond: rawRoundTrip))
        let (_, asker) = try profile("asker", tag: "bench", clock: clock, zone: speakers)
        let client = HTTPBackend(url: url, identity: "asker", key: asker, policy: ConversationStore.recordPolicy())
        let wanted = RecordQuery(zone: speakers, recordType: "Speaker", predicates: [.contains("tags", .string("t-\(existing / 2)"))])
        let queried = try await rateAsync(seconds: seconds, batch: 1) {
            let found = try await client.query(wanted, cursor: nil, limit: 10).records
            guard found.count == 1 else { throw RawError("the tag query found \(found.count) speakers, not 1") }
            return true
        }
        reporter.report(Row(name: "tag query, 1 match among \(existing)", perSecond: queried, rawName: "raw libmicrohttpd round trip", rawPerSecond: rawRoundTrip))
        await server.stop()
    }
}

private func profile(_ identity: String, tag: String, clock: HybridLogicalClock, zone: ZoneName) throws -> (record: Record, key: SigningKey) {
    let key = SigningKey.generate()
    var record = Record(id: try RecordID(zone: zone, name: identity), type: "Speaker", fields: ["name": .string(identity), "tags": .list([.string(tag)])])
    try record.sign(with: key, clock: clock.now())
    return (record, key)
}
