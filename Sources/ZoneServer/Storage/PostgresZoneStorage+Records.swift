import Foundation
import PostgresKit
import RecordZone
import Synchronization

/// Saves (one transaction per batch, under the zones' row locks), fetches and queries.
extension PostgresZoneStorage {
    // MARK: Records

    public func save(_ records: [Record], policy savePolicy: SavePolicy, feedSince token: ChangeToken?,
                     visibleTo isVisible: @escaping @Sendable (ZoneName) -> Bool, gate: SaveGate?) async throws(RecordZoneError) -> SaveAnswer {
        try BackendLimits.checkBatch(records.count)
        let feedPosition = token.flatMap { try? TokenContents.databasePosition($0, backend: Self.kind, instance: instance) }
        for _ in 0..<4 {
            let owners = Set(records.compactMap { try? policy.rules.owner(of: $0)?.get() })
            let knownOwners = knownVersions(owners)
            // Decided into a value: nothing shared changes until the batch commits.
            let (admitted, admission) = SaveChecks.admit(records, policy: policy)
            let changed = Set(admission.chains.keys)
            // The owners' versions as they were before admission (a chain installed during it
            // sends the save round again); the others' as they are.
            let known = knownVersions(changed.subtracting(owners)).merging(knownOwners) { $1 }
            do {
                let (answer, written, stored) = try await pool.withConnection { db in
                    try self.store(records, (admitted, admission), savePolicy, pins: owners.union(changed), known: known, feedSince: feedPosition, gate: gate, in: db)
                }
                recordWritten(written)
                policy.pins.publish(stored)
                // This server's polls at once; the other servers' through the notification.
                for advance in answer.catchUp.zones { waiters.wake(advance.zone) }
                return SaveAnswer(results: answer.results, catchUp: answer.catchUp.filteringFeed(isVisible))
            } catch let moved as PinsChanged {
                // Another server moved a chain this batch relied on: read it, decide again.
                install(moved.rows)
            } catch let error as PostgresError where [.deadlockDetected, .serializationFailure].contains(error.code) {
                // A deadlock or serialization failure between servers: go round again.
            } catch {
                throw Self.storageError(error)
            }
        }
        throw Self.busy("the batch kept meeting concurrent changes to its keys")
    }

    /// Stores a batch in one transaction of two round trips. The first begins, locks the pin
    /// rows of `pins`, locks the batch's zones (in name order) and reads the versions held —
    /// each statement after the lock before it, so it sees what the last holder committed. Each
    /// version is then decided against the one held and given its zone's next sequence; the
    /// chains of exactly the versions stored (``SaveChecks/settle(_:storing:admission:policy:)``) are
    /// checked against `known` and written (``agreePins``); the second round trip writes
    /// records, index rows and the zones' positions, notifies the other servers, reads the
    /// database feed since `feedSince` (the catch-up), and commits. With a `gate`, the first
    /// round trip also reads where each governed zone's governing records stand (under the
    /// zone's lock, so a removal and the removed member's message are decided in one order on
    /// every server), and versions the gate refuses are refused before they are decided.
    /// - Returns: per record the outcome with the catch-up, the pin versions written, and the
    ///   chains to publish.
    func store(_ records: [Record], _ admission: (outcomes: [Result<Data, RecordZoneError>], pins: PinChanges), _ savePolicy: SavePolicy,
               pins: Set<String>, known: [String: Int64], feedSince: Int64?, gate: SaveGate?, in db: PostgresConnection) throws -> (SaveAnswer, [String: Int64], PinChanges) {
        var reads: [(sql: String, parameters: [PostgresValue])] = [("BEGIN", [])]
        if !pins.isEmpty { reads.append((Self.lockPins, [.textArray(pins.sorted())])) }
        reads.append(("SELECT name, sequence, incarnation FROM ck_zones WHERE name = ANY($1) ORDER BY name FOR UPDATE", [.textArray(Set(records.map(\.id.zone.rawValue)).sorted())]))
        reads.append(("""
            SELECT r.zone, r.name, r.record, r.sequence, r.received_at FROM ck_records r JOIN unnest($1::text[], $2::text[]) AS k(zone, name) ON r.zone = k.zone AND r.name = k.name
            """, [.textArray(records.map(\.id.zone.rawValue)), .textArray(records.map(\.id.name))]))
        let governedZones = (gate?.governedZones(of: records) ?? [:]).sorted { $0.key < $1.key }
        if !governedZones.isEmpty {
            reads.append(("""
                SELECT k.zone, (SELECT coalesce(max(sequence), 0) FROM ck_records r WHERE r.zone = k.zone AND r.type = k.type) FROM unnest($1::text[], $2::text[]) AS k(zone, type)
                """, [.textArray(governedZones.map(\.key.rawValue)), .textArray(governedZones.map(\.value))]))
        }
        do {
            let read = try db.pipeline(reads)
            let currentIndex = governedZones.isEmpty ? read.count - 1 : read.count - 2
            let zoneRows = read[currentIndex - 1]
            var outcomes = admission.outcomes
            var governedStates = [ZoneName: any GovernedZone](), marks = [ZoneName: GoverningMark](), takenIn = [Int]()
            if let gate, !governedZones.isEmpty {
                (governedStates, marks) = try states(of: Dictionary(uniqueKeysWithValues: governedZones), governance: gate.governance, zones: zoneRows,
                                                     marks: read[read.count - 1], taking: gate.zonesChangingGovernance(of: records), in: db)
                let gated = gate.apply(records, outcomes: outcomes, states: governedStates) { try? self.policy.rules.owner(of: $0)?.get() }
                (outcomes, governedStates, takenIn) = gated
            }
            var (results, writes, storing, after) = decide(records, outcomes, savePolicy, zones: zoneRows, current: read[currentIndex])
            let (refused, settled) = SaveChecks.settle(records, storing: storing, admission: admission, policy: policy)
            if !refused.isEmpty {
                for (index, error) in refused { outcomes[index] = .failure(error) }
                (results, writes, storing, after) = decide(records, outcomes, savePolicy, zones: zoneRows, current: read[currentIndex])
            }
            let written = pins.isEmpty ? [:] : try agreePins(pins, known: known, changed: settled.chains, locked: read[1], in: db)
            // The zones are locked until the commit: between each one's position before and
            // after lie exactly this batch's versions.
            var catchUp = SaveCatchUp()
            for row in 0..<zoneRows.count {
                guard let name = zoneRows.text(row, 0), let before = zoneRows.int(row, 1), let incarnation = zoneRows.text(row, 2),
                      let to = after[name], to != before, let zone = try? ZoneName(name) else { continue }
                func token(_ position: Int64) -> ChangeToken {
                    TokenContents(kind: .zone, backend: Self.kind, zone: name, incarnation: incarnation, position: SequencePosition.encode(UInt64(position))).token
                }
                catchUp.zones.append(ZoneAdvance(zone: zone, from: before == 0 ? nil : token(before), to: token(to)))
            }
            // Zones whose governing records moved: every server tells their readers (`+<zone>`).
            let governing = Set(gate?.zonesChangingGovernance(of: records) ?? []).intersection(catchUp.zones.map(\.zone)).map(\.rawValue).sorted()
            if !governing.isEmpty { writes.append(("SELECT pg_notify('ck_changes', '+' || z) FROM unnest($1::text[]) AS z", [.textArray(governing)])) }
            let feed = feedSince.map { (Self.feedStatement, [PostgresValue.int($0)]) }
            let wrote = try db.pipeline(writes + (feed.map { [$0] } ?? []) + [("COMMIT", [])])
            if let feedSince, wrote.count >= 2 { catchUp.database = try? self.feed(wrote[wrote.count - 2], since: feedSince, isInitial: false) }
            if let gate, !governedStates.isEmpty {
                var stored = [Int: Int64]()
                for index in storing { if case .success(let saved) = results[index], let tag = saved.serverMetadata?.changeTag, let sequence = Int64(tag) { stored[index] = sequence } }
                governed.settle(records, gate: gate, states: governedStates, marks: marks, takenIn: takenIn, stored: stored)
            }
            return (SaveAnswer(results: results, catchUp: catchUp), written, settled)
        } catch {
            _ = try? db.execute("ROLLBACK")
            throw error
        }
    }

    /// The states of governed zones (`zones`: each with its governing type), given the locked
    /// zone rows (name, sequence, incarnation) and the marks read with them (zone, highest
    /// governing sequence): from memory where the mark holds, otherwise decided from the records
    /// (read under the same locks).
    func states(of zones: [ZoneName: String], governance: any ZoneGovernance, zones zoneRows: PostgresRows, marks markRows: PostgresRows,
                taking: Set<ZoneName>, in db: PostgresConnection) throws -> (states: [ZoneName: any GovernedZone], marks: [ZoneName: GoverningMark]) {
        var incarnations = [String: String]()
        for row in 0..<zoneRows.count { if let name = zoneRows.text(row, 0), let incarnation = zoneRows.text(row, 2) { incarnations[name] = incarnation } }
        var states = [ZoneName: any GovernedZone](), marks = [ZoneName: GoverningMark]()
        for row in 0..<markRows.count {
            guard let name = markRows.text(row, 0), let sequence = markRows.int(row, 1), let incarnation = incarnations[name],
                  let zone = try? ZoneName(name), let type = zones[zone] else { continue }
            let mark = GoverningMark(incarnation: incarnation, sequence: sequence)
            marks[zone] = mark
            states[zone] = try governed.state(of: zone, at: mark, taking: taking.contains(zone))
                ?? governance.decide(zone, governing: Self.governingRecords(of: zone, type: type, in: db))
        }
        return (states, marks)
    }

    /// A zone's governing records, as stored.
    static func governingRecords(of zone: ZoneName, type: String, in db: PostgresConnection) throws -> [Record] {
        let rows = try db.execute("SELECT record FROM ck_records WHERE zone = $1 AND type = $2", [.text(zone.rawValue), .text(type)])
        return (0..<rows.count).compactMap { rows.bytes($0, 0).flatMap { try? Record(canonical: $0) } }
    }

    public func governed(_ zones: [ZoneName], by governance: any ZoneGovernance) async throws(RecordZoneError) -> [ZoneName: any GovernedZone] {
        let types = zones.reduce(into: [ZoneName: String]()) { types, zone in if let type = governance.governingType(of: zone) { types[zone] = type } }.sorted { $0.key < $1.key }
        guard !types.isEmpty else { return [:] }
        return try await run { db in
            // One statement for the marks (usually all that is read: the states are in memory);
            // where one moved, one statement reads the zone's governing records with the mark
            // they make, so a state is never kept under a mark other than its own.
            let rows = try db.execute("""
                SELECT z.name, z.incarnation, (SELECT coalesce(max(sequence), 0) FROM ck_records r WHERE r.zone = k.zone AND r.type = k.type)
                FROM unnest($1::text[], $2::text[]) AS k(zone, type) JOIN ck_zones z ON z.name = k.zone
                """, [.textArray(types.map(\.key.rawValue)), .textArray(types.map(\.value))])
            let typeOf = Dictionary(uniqueKeysWithValues: types)
            var states = [ZoneName: any GovernedZone]()
            for row in 0..<rows.count {
                guard let name = rows.text(row, 0), let incarnation = rows.text(row, 1), let sequence = rows.int(row, 2),
                      let zone = try? ZoneName(name), let type = typeOf[zone] else { continue }
                if let state = self.governed.state(of: zone, at: GoverningMark(incarnation: incarnation, sequence: sequence)) {
                    states[zone] = state
                    continue
                }
                let held = try db.execute("""
                    SELECT z.incarnation, r.record, r.sequence FROM ck_zones z LEFT JOIN ck_records r ON r.zone = z.name AND r.type = $2 WHERE z.name = $1
                    """, [.text(zone.rawValue), .text(type)])
                guard held.count > 0, let current = held.text(0, 0) else { continue }
                let records = (0..<held.count).compactMap { held.bytes($0, 1).flatMap { try? Record(canonical: $0) } }
                let mark = GoverningMark(incarnation: current, sequence: (0..<held.count).compactMap { held.int($0, 2) }.max() ?? 0)
                let state = governance.decide(zone, governing: records)
                self.governed.keep(state, of: zone, at: mark)
                states[zone] = state
            }
            return states
        }
    }

    /// Decides each version of a batch against the zones' positions and the versions held
    /// (rows locked and read by ``store``). - Returns: per record the outcome, the
    /// statements that write what was decided, the indexes of the records stored, and each
    /// zone's position after them.
    func decide(_ records: [Record], _ admitted: [Result<Data, RecordZoneError>], _ savePolicy: SavePolicy, zones zoneRows: PostgresRows,
                        current currentRows: PostgresRows) -> ([Result<Record, RecordZoneError>], [(sql: String, parameters: [PostgresValue])], [Int], [String: Int64]) {
        var sequences = [String: Int64]()
        for row in 0..<zoneRows.count { if let name = zoneRows.text(row, 0), let sequence = zoneRows.int(row, 1) { sequences[name] = sequence } }
        var current = [RecordID: Record]()
        for row in 0..<currentRows.count {
            guard let bytes = currentRows.bytes(row, 2), var record = try? Record(canonical: bytes), let sequence = currentRows.int(row, 3) else { continue }
            record.serverMetadata = ServerMetadata(changeTag: String(sequence), receivedAt: currentRows.int(row, 4).map { Date(timeIntervalSince1970: Double($0) / 1000) })
            current[record.id] = record
        }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        var results = [Result<Record, RecordZoneError>]()
        // What to write, by record: a later version of one record in the batch replaces an earlier.
        var winners = [RecordID: (record: Record, bytes: Data, sequence: Int64)](), order = [RecordID]()
        var previouslyIndexed = Set<RecordID>(), storing = [Int]()
        for (index, (record, outcome)) in zip(records, admitted).enumerated() {
            let zone = record.id.zone.rawValue
            guard let sequence = sequences[zone] else {
                results.append(.failure(RecordZoneError(.zoneNotFound, "zone '\(zone)' does not exist", recordID: record.id)))
                continue
            }
            // PostgreSQL's text cannot hold NUL: such a type is refused alone, not the batch.
            let outcome = record.recordType.utf8.contains(0)
                ? .failure(RecordZoneError(.malformed, "the record type holds a NUL character", recordID: record.id)) : outcome
            switch SaveChecks.decide(record, admitted: outcome, current: current[record.id], policy: savePolicy, pins: policy) {
            case .refused(let error): results.append(.failure(error))
            case .superseded(let winner): results.append(.success(winner))
            case .store(let bytes):
                let next = sequence + 1
                sequences[zone] = next
                if let held = current[record.id], queryIndex.fields[held.recordType] != nil { previouslyIndexed.insert(record.id) }
                var saved = record
                saved.serverMetadata = ServerMetadata(changeTag: String(next), receivedAt: Date(timeIntervalSince1970: Double(now) / 1000))
                current[record.id] = saved
                if winners[record.id] == nil { order.append(record.id) }
                winners[record.id] = (record, bytes, next)
                storing.append(index)
                results.append(.success(saved))
            }
        }
        let rows = order.compactMap { winners[$0] }
        guard !rows.isEmpty else { return (results, [], storing, sequences) }
        var writes: [(sql: String, parameters: [PostgresValue])] = [("""
            INSERT INTO ck_records (zone, name, type, sequence, clock, author, signature, record, received_at)
            SELECT zone, name, type, sequence, clock, author, signature, record, $9
            FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bytea[], $7::bytea[], $8::bytea[])
                AS t(zone, name, type, sequence, clock, author, signature, record)
            ON CONFLICT (zone, name) DO UPDATE SET type = excluded.type, sequence = excluded.sequence, clock = excluded.clock,
                author = excluded.author, signature = excluded.signature, record = excluded.record, received_at = excluded.received_at
            """, [.textArray(rows.map(\.record.id.zone.rawValue)), .textArray(rows.map(\.record.id.name)), .textArray(rows.map(\.record.recordType)),
                  .intArray(rows.map(\.sequence)), .intArray(rows.map { Int64(bitPattern: $0.record.clock.rawValue) }), .bytesArray(rows.map(\.record.authorKey)),
                  .bytesArray(rows.map(\.record.signature)), .bytesArray(rows.map(\.bytes)), .int(now)])]
        writes += Self.indexStatements(queryIndex, of: rows.map(\.record), previouslyIndexed: previouslyIndexed)
        // The zones' new positions, and a notification to every server on commit.
        let touched = Set(rows.map(\.record.id.zone.rawValue)).sorted()
        writes.append(("""
            WITH moved AS (
                UPDATE ck_zones SET sequence = t.sequence, changed_xid = pg_current_xact_id()::text::bigint
                FROM unnest($1::text[], $2::bigint[]) AS t(name, sequence) WHERE ck_zones.name = t.name RETURNING ck_zones.name)
            SELECT pg_notify('ck_changes', name) FROM moved
            """, [.textArray(touched), .intArray(touched.map { sequences[$0] ?? 0 })]))
        return (results, writes, storing, sequences)
    }

    /// Replaces the index rows of these versions (none for a tombstone).
    static func writeIndex(_ index: QueryIndex, of versions: [Record], in db: PostgresConnection) throws {
        for statement in indexStatements(index, of: versions) { try db.execute(statement.sql, statement.parameters) }
    }

    /// The statements that replace the index rows of these versions.
    /// - Parameter previouslyIndexed: records whose version held before was of an indexed type.
    static func indexStatements(_ index: QueryIndex, of versions: [Record], previouslyIndexed: Set<RecordID> = []) -> [(sql: String, parameters: [PostgresValue])] {
        // Only records of an indexed type, now or before, have rows to replace.
        let records = versions.filter { index.fields[$0.recordType] != nil || previouslyIndexed.contains($0.id) }
        guard !records.isEmpty else { return [] }
        var statements: [(sql: String, parameters: [PostgresValue])] = [(
            "DELETE FROM ck_record_index i USING unnest($1::text[], $2::text[]) AS k(zone, name) WHERE i.zone = k.zone AND i.name = k.name",
            [.textArray(records.map(\.id.zone.rawValue)), .textArray(records.map(\.id.name))])]
        var zone = [String](), type = [String](), field = [String](), value = [Data](), name = [String]()
        for record in records {
            for entry in index.entries(of: record) {
                zone.append(record.id.zone.rawValue)
                type.append(record.recordType)
                field.append(entry.field)
                value.append(entry.value)
                name.append(record.id.name)
            }
        }
        if !zone.isEmpty {
            statements.append(("""
                INSERT INTO ck_record_index (zone, type, field, value, name)
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[]) ON CONFLICT DO NOTHING
                """, [.textArray(zone), .textArray(type), .textArray(field), .bytesArray(value), .textArray(name)]))
        }
        return statements
    }

    public func stored(_ ids: [RecordID]) async throws(RecordZoneError) -> [Result<Wire.SignedRecord, RecordZoneError>] {
        try BackendLimits.checkBatch(ids.count)
        // One statement: each ID with its zone's existence and its record, if any.
        let rows = try await run { db in
            try db.execute("""
                SELECT k.zone, k.name, z.name IS NOT NULL, r.record, r.sequence, r.received_at
                FROM unnest($1::text[], $2::text[]) AS k(zone, name)
                LEFT JOIN ck_zones z ON z.name = k.zone LEFT JOIN ck_records r ON r.zone = k.zone AND r.name = k.name
                """, [.textArray(ids.map(\.zone.rawValue)), .textArray(ids.map(\.name))])
        }
        var existing = Set<String>(), found = [String: Wire.SignedRecord]()
        for row in 0..<rows.count {
            guard let zone = rows.text(row, 0), let name = rows.text(row, 1) else { continue }
            if rows.bool(row, 2) == true { existing.insert(zone) }
            guard let bytes = rows.bytes(row, 3), let sequence = rows.int(row, 4) else { continue }
            found[zone + "\u{0}" + name] = Wire.SignedRecord(bytes: bytes, changeTag: String(sequence), receivedAt: rows.int(row, 5))
        }
        return ids.map { id in
            guard existing.contains(id.zone.rawValue) else { return .failure(RecordZoneError(.zoneNotFound, "zone '\(id.zone)' does not exist", recordID: id)) }
            guard let signed = found[id.zone.rawValue + "\u{0}" + id.name] else { return .failure(RecordZoneError(.unknownItem, "no record \(id)", recordID: id)) }
            return .success(signed)
        }
    }

    public func query(_ query: RecordQuery, cursor: QueryCursor?, limit: Int) async throws(RecordZoneError) -> QueryResult {
        let lookup = queryIndex.lookup(for: query)
        let (exists, rows) = try await run { db in
            try db.transaction { () throws(PostgresError) in
                let exists = try db.execute("SELECT 1 FROM ck_zones WHERE name = $1", [.text(query.zone.rawValue)]).count == 1
                guard exists else { return (false, PostgresRows?.none) }
                if let lookup {
                    // The index narrows to candidates; the query's own predicates decide below.
                    return (true, try db.execute("""
                        SELECT r.record, r.sequence FROM ck_record_index i JOIN ck_records r ON r.zone = i.zone AND r.name = i.name
                        WHERE i.zone = $1 AND i.type = $2 AND i.field = $3 AND i.value = $4 AND r.type = $2
                        """, [.text(query.zone.rawValue), .text(query.recordType), .text(lookup.field), .bytes(lookup.value)]))
                }
                return (true, try db.execute("SELECT record, sequence FROM ck_records WHERE zone = $1 AND type = $2", [.text(query.zone.rawValue), .text(query.recordType)]))
            }
        }
        guard exists, let rows else { throw RecordZoneError(.zoneNotFound, "zone '\(query.zone)' does not exist") }
        let records = (0..<rows.count).compactMap { row -> Record? in
            guard let bytes = rows.bytes(row, 0), let sequence = rows.int(row, 1) else { return nil }
            return try? Wire.SignedRecord(bytes: bytes, changeTag: String(sequence)).decoded()
        }
        return try query.run(over: records, cursor: cursor, limit: limit)
    }
}
