import ConversationKit
import Foundation
import RecordZone
import ToolSupport

/// Inspection: on a store, a folder zone (`--zone-dir`) or a server (`--server`).
enum InspectCommands {
    static let zoneOption = Option.valued("zone", "zone", "The zone.")

    static let all: [ToolCommand] = [
        ToolCommand(Command("convkit zones", "List the zones (with record counts on a store).", options: Targets.inspectOptions), run: zones),
        ToolCommand(Command("convkit records list", "List a zone's records (the winning version of each).",
                            options: [zoneOption, .valued("type", "type", "Only records of this type.")] + Targets.inspectOptions), run: list),
        ToolCommand(Command("convkit records show", "Show one record: fields, system fields, owner, author key, clock, signature.",
                            discussion: "Sealed (encrypted) content is shown as it is stored, as bytes; --decrypt opens it with the keys the store holds.",
                            positionals: [Positional("record", "<zone>/<name>")],
                            options: [.flag("decrypt", "Open sealed content with the keys this store holds (a store only).")] + Targets.inspectOptions), run: show),
        ToolCommand(Command("convkit records verify", "Check every record (and, on a folder, every file); print each bad one with why.",
                            discussion: "Exits 1 when anything is bad.", options: [.valued("zone", "zone", "Only this zone.")] + Targets.inspectOptions), run: verify),
        ToolCommand(Command("convkit changes", "What a client would receive from a zone since a token.",
                            options: [zoneOption, .valued("since", "token", "The token to start from (base64). (default: the start)"),
                                      .valued("limit", "n", "Records per page. (default: 200)")] + Targets.inspectOptions.filter { $0.name != "store" } + [Targets.store]), run: changes),
        ToolCommand(Command("convkit token decode", "Show what a change token holds.", positionals: [Positional("token", "The token (base64).")], options: [Targets.json]),
                    run: decodeToken),
        ToolCommand(Command("convkit outbox", "List the local changes waiting to be pushed, with reasons and next attempt.", options: [Targets.store, Targets.json]),
                    run: outbox),
        ToolCommand(Command("convkit quarantine", "List, clear or retry the records the store refused.",
                            positionals: [Positional("action", "list (default), clear <n> or retry", optional: true), Positional("n", "The entry to clear.", optional: true)],
                            options: [Targets.store, Targets.json]), run: quarantine),
        ToolCommand(Command("convkit refetch", "Pull one zone again from the start at the next sync.", positionals: [Positional("zone", "The zone.")], options: [Targets.store, Targets.json]),
                    run: refetch),
        ToolCommand(Command("convkit stats", "Counts, sizes, tokens, last sync and held-back speakers of a store.", options: [Targets.store, Targets.json]), run: stats),
    ]

    static func zoneName(_ text: String?) throws -> ZoneName {
        guard let text else { throw UsageError("--zone is required") }
        do { return try ZoneName(text) } catch { throw UsageError("'\(text)' is not a zone name") }
    }

    static func zones(_ context: Context) async throws {
        switch try context.inspectionSource() {
        case .store(let store):
            let zones = try store.heldZones()
            if context.json { return try Output.json(zones.map { ["zone": $0.zone, "records": $0.records, "token": $0.token?.base64EncodedString() ?? ""] as [String: Any] }) }
            for zone in zones { Output.line("\(zone.zone)  \(zone.records) records") }
        case .backend(let backend, _):
            let zones = try await backend.zones()
            if context.json { return try Output.json(zones.map(\.rawValue)) }
            for zone in zones { Output.line(zone.rawValue) }
        }
    }

    /// Every change of a zone from the start, with what was refused.
    static func readAll(_ backend: any RecordZoneBackend, _ zone: ZoneName, progress: Output.Progress? = nil) async throws -> (records: [Record], rejected: [RejectedRecord]) {
        var token: ChangeToken? = nil, winners = [RecordID: Record](), rejected = [RejectedRecord]()
        var read = 0
        repeat {
            let page = try await backend.fetchChanges(in: zone, since: token, limit: 400)
            for record in page.records { MergeRule.merge(record, into: &winners) }
            rejected += page.rejected
            read += page.records.count + page.rejected.count
            progress?.update(read)
            token = page.token
            if !page.moreComing { break }
        } while true
        return (winners.values.sorted { $0.id.name < $1.id.name }, rejected)
    }

    static func records(_ context: Context, zone: ZoneName, type: String?) async throws -> [Record] {
        switch try context.inspectionSource() {
        case .store(let store): return try store.records(in: zone.rawValue, type: type)
        case .backend(let backend, _):
            try await readSpeakers(backend, before: [zone])
            return try await readAll(backend, zone).records.filter { type == nil || $0.recordType == type }
        }
    }

    /// Reads the speakers' own zones first, as a store does, so who holds which key and device
    /// is known before a conversation is judged (a linked device's messages would otherwise pin
    /// its key as the speaker's). - Returns: the zones in the order to read them.
    @discardableResult
    static func readSpeakers(_ backend: any RecordZoneBackend, before zones: [ZoneName]) async throws -> [ZoneName] {
        if zones.contains(where: { !ConversationStore.isSpeakerZone($0) }) {
            for zone in try await backend.zones() where ConversationStore.isSpeakerZone(zone) && !zones.contains(zone) {
                _ = try await readAll(backend, zone)
            }
        }
        return ConversationStore.readingOrder(zones)
    }


    static func list(_ context: Context) async throws {
        let zone = try zoneName(context.arguments.value("zone"))
        let type = context.arguments.value("type")
        let records = try await records(context, zone: zone, type: type)
        let group = try await membership(context, zone: zone, records: type == nil || type == GroupChange.recordType ? records : nil)
        if context.json {
            return try Output.json(records.map { record in
                var entry: [String: Any] = ["name": record.id.name, "type": record.recordType, "clock": clock(record.clock), "deleted": record.isDeleted]
                if let decided = group?.decided[record.id.name] { entry["change"] = ["summary": decided.summary, "decision": decided.decision] }
                return entry
            })
        }
        for record in records {
            let change = group?.decided[record.id.name].map { "  \($0.summary) — \($0.decision)" } ?? ""
            Output.line("\(record.id.name)  \(record.recordType)\(record.isDeleted ? " (deleted)" : "")  \(clock(record.clock))\(change)")
        }
        if let group {
            Output.line("members: " + (group.membership.roles.sorted { ($0.value, $1.key) > ($1.value, $0.key) }.map { "\($0.key) (\($0.value.rawValue))" }.joined(separator: ", ")))
        }
    }

    /// A group zone's membership as the rule decides it from the changes held (`records`, or
    /// read when nil), with each change's summary and decision by record name; nil for a zone
    /// that is not a group's.
    static func membership(_ context: Context, zone: ZoneName, records: [Record]?) async throws
        -> (membership: GroupMembership, decided: [String: (summary: String, decision: String)])? {
        guard GroupMembership.creatorHash(of: zone) != nil else { return nil }
        var held = records ?? []
        if records == nil { held = try await self.records(context, zone: zone, type: GroupChange.recordType) }
        guard let group = GroupMembership(zone: zone, changes: held.compactMap { try? GroupChange(record: $0) }) else { return nil }
        var decided = [String: (summary: String, decision: String)]()
        for (change, decision) in group.decisions {
            let verdict = switch decision { case .accepted: "accepted"; case .refused(let why): "refused: \(why)" }
            decided[change.name] = (change.summary, verdict)
        }
        return (group, decided)
    }

    static func clock(_ clock: RecordClock) -> String {
        "\(Output.time(Date(timeIntervalSince1970: Double(clock.milliseconds) / 1000))) +\(clock.counter)"
    }

    static func show(_ context: Context) async throws {
        guard let text = context.arguments.positional(0), let slash = text.firstIndex(of: "/") else { throw UsageError("a record is <zone>/<name>") }
        let zone = try zoneName(String(text[..<slash]))
        let name = String(text[text.index(after: slash)...])
        guard let record = try await records(context, zone: zone, type: nil).first(where: { $0.id.name == name }) else {
            throw ToolFailure("no record \(text)")
        }
        let policy = ConversationStore.recordPolicy()
        let owner: String
        switch policy.rules.owner(of: record) {
        case .success(let identity)?: owner = identity
        case .failure(let reason)?: owner = "refused: \(reason)"
        case nil: owner = "none"
        }
        let signature = !record.isSigned ? "missing" : record.hasValidSignature() ? "valid" : "invalid (does not verify over the record's bytes)"
        let fingerprint = KeyChain.fingerprint(identity: owner, key: record.authorKey)
        let sealed = record[Sealing.sealedField]?.bytesValue
        var shown = record
        if context.arguments.has("decrypt") {
            guard case .store(let store) = try context.inspectionSource() else { throw UsageError("--decrypt needs a store (the keys are this device's), not --zone-dir or --server") }
            guard sealed != nil else { throw ToolFailure("\(text) holds nothing sealed") }
            shown = try store.decrypted(record)
        }
        let encryption = sealed.map { bytes in
            let epoch = (try? Sealing.epoch(of: bytes))?.hexString ?? "malformed"
            return shown[Sealing.sealedField] == nil ? "sealed (epoch \(epoch)), opened with this store's key" : "sealed (epoch \(epoch)): shown as stored; --decrypt opens it"
        }
        let fields = try JSONSerialization.jsonObject(with: try shown.json())
        if context.json {
            var value: [String: Any] = ["record": fields, "owner": owner, "authorFingerprint": fingerprint, "clock": clock(record.clock), "signature": signature]
            if let encryption { value["encryption"] = encryption }
            return try Output.json(value)
        }
        Output.line("\(record.id)  \(record.recordType)\(record.isDeleted ? " (deleted)" : "")")
        Output.line("owner      \(owner)")
        Output.line("author     \(Output.hex(record.authorKey))")
        Output.line("fingerprint \(fingerprint)")
        Output.line("clock      \(clock(record.clock))")
        Output.line("signature  \(signature)")
        if let encryption { Output.line("encryption \(encryption)") }
        if record.recordType == GroupChange.recordType {
            let decided = try await membership(context, zone: zone, records: nil)?.decided[record.id.name]
            Output.line("change     " + (decided.map { "\($0.summary) — \($0.decision)" } ?? "not a valid group change"))
        }
        if let changeTag = record.serverMetadata?.changeTag { Output.line("change tag \(changeTag)") }
        let pretty = try JSONSerialization.data(withJSONObject: fields, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])
        for line in String(decoding: pretty, as: UTF8.self).split(separator: "\n") { Output.line(String(line)) }
    }

    static func verify(_ context: Context) async throws {
        let only = try context.arguments.value("zone").map { try zoneName($0) }
        var bad = [(what: String, why: String)]()
        var conflicts = [String: [Record]]()  // records held back per identity claimed with unrelated keys
        var checked = 0
        let policy = ConversationStore.recordPolicy()
        func note(_ rejection: RejectedRecord) {
            if case .identityConflict(let identity) = rejection.reason, let data = rejection.data, let record = try? Record(canonical: data) {
                conflicts[identity, default: []].append(record)
            }
        }
        switch try context.inspectionSource() {
        case .store(let store):
            // Signatures and owners checked again as a new reader would: speakers' own zones first.
            let held = try store.heldZones().compactMap { try? ZoneName($0.zone) }.filter { only == nil || only == $0 }
            let zones = ConversationStore.readingOrder(held).map(\.rawValue)
            for zone in zones {
                let records = try store.records(in: zone)
                let bytes = try records.map { try $0.encoded() }
                for outcome in policy.admit(batch: bytes, source: { "\(zone)/\(records[$0].id.name)" }) {
                    checked += 1
                    if case .failure(let rejection) = outcome {
                        bad.append((rejection.source, "\(rejection.reason)"))
                        note(rejection)
                    }
                }
            }
        case .backend(let backend, _):
            // Two writers as one device on a folder: nothing is lost (every file is read), but it is said.
            let duplicates = try await (backend as? FileSystemBackend)?.duplicatedSequences() ?? []
            for duplicate in duplicates {
                bad.append((duplicate, "two writers wrote as one device (a copied store?); every file is read"))
            }
            var zones = try await backend.zones()
            if let only { zones = zones.filter { $0 == only } }
            zones = try await readSpeakers(backend, before: zones)
            let progress = Output.Progress("verifying", total: zones.count)
            for (index, zone) in zones.enumerated() {
                let (records, rejected) = try await readAll(backend, zone)
                checked += records.count + rejected.count
                for rejection in rejected {
                    bad.append((rejection.recordID.map { "\($0)" } ?? rejection.source, "\(rejection.reason)"))
                    note(rejection)
                }
                progress.update(index + 1)
            }
            progress.finish()
        }
        // Each bad record once (a folder holds a version in every copy that has it), in order.
        var counts = [String: Int](), unique = [(what: String, why: String)]()
        for item in bad {
            let key = item.what + "\n" + item.why
            if counts[key] == nil { unique.append(item) }
            counts[key, default: 0] += 1
        }
        let conflictLines = conflicts.keys.sorted().map { identity in
            (identity, policy.claimedIdentityKeys(of: identity, in: conflicts[identity] ?? []).map { KeyChain.fingerprint(identity: identity, key: $0) }.sorted())
        }
        if context.json {
            try Output.json(["checked": checked, "bad": unique.map { ["what": $0.what, "why": $0.why, "count": counts[$0.what + "\n" + $0.why] ?? 1] as [String: Any] },
                             "conflicts": conflictLines.map { ["identity": $0.0, "candidates": $0.1] as [String: Any] }])
        } else {
            for item in unique {
                let count = counts[item.what + "\n" + item.why] ?? 1
                Output.line("BAD \(item.what): \(item.why)\(count > 1 ? " (\(count) copies)" : "")")
            }
            for (identity, fingerprints) in conflictLines {
                Output.line("CONFLICT \(identity): claimed by \(fingerprints.count) unrelated keys: \(fingerprints.joined(separator: " | "))")
            }
            Output.line("\(checked) checked, \(unique.count) bad")
        }
        if !unique.isEmpty { throw ToolFailure("\(unique.count) bad record\(unique.count == 1 ? "" : "s") or file\(unique.count == 1 ? "" : "s")") }
    }

    static func changes(_ context: Context) async throws {
        let zone = try zoneName(context.arguments.value("zone"))
        let limit = try context.arguments.int("limit", default: 200, range: 1...1000)
        var since: ChangeToken? = nil
        if let text = context.arguments.value("since") {
            guard let token = ChangeToken(base64: text) else { throw UsageError("--since takes a token in base64") }
            since = token
        }
        guard case .backend(let backend, _) = try context.backendSource() else { throw ToolFailure("no backend") }
        let page = try await backend.fetchChanges(in: zone, since: since, limit: limit)
        if context.json {
            return try Output.json(["records": page.records.map { ["name": $0.id.name, "type": $0.recordType, "clock": clock($0.clock), "changeTag": $0.serverMetadata?.changeTag ?? ""] as [String: Any] },
                                    "rejected": page.rejected.map { ["source": $0.source, "reason": "\($0.reason)"] }, "token": page.token.base64, "moreComing": page.moreComing])
        }
        for record in page.records { Output.line("\(record.id.name)  \(record.recordType)  \(clock(record.clock))") }
        for rejection in page.rejected { Output.line("REFUSED \(rejection.source): \(rejection.reason)") }
        Output.line("token \(page.token.base64)\(page.moreComing ? "  (more coming)" : "")")
    }

    static func decodeToken(_ context: Context) async throws {
        guard let text = context.arguments.positional(0) else { throw UsageError("missing <token>") }
        guard let token = ChangeToken(base64: text), let description = token.describe() else { throw ToolFailure("not a change token") }
        if context.json { return try Output.json(["kind": description.kind, "backend": description.backend, "zone": description.zone,
                                                  "incarnation": description.incarnation, "position": description.position]) }
        Output.line("kind        \(description.kind)")
        Output.line("backend     \(description.backend)")
        if !description.zone.isEmpty { Output.line("zone        \(description.zone)") }
        if !description.incarnation.isEmpty { Output.line("incarnation \(description.incarnation)") }
        Output.line("position    \(description.position)")
    }

    static func outbox(_ context: Context) async throws {
        let entries = try context.store(readOnly: true).outbox()
        if context.json {
            return try Output.json(entries.map { ["zone": $0.zone, "name": $0.name, "type": $0.recordType, "attempts": $0.attempts,
                                                  "nextAttemptAt": Output.time($0.nextAttemptAt), "lastError": $0.lastError ?? "",
                                                  "lastErrorCode": $0.lastErrorCode?.rawValue ?? ""] as [String: Any] })
        }
        for entry in entries {
            Output.line("\(entry.zone)/\(entry.name)  \(entry.recordType)  attempts \(entry.attempts)\(entry.attempts > 0 ? ", next \(Output.time(entry.nextAttemptAt))" : "")\(entry.lastError.map { ": \($0)" } ?? "")")
        }
        if entries.isEmpty { Output.line("the outbox is empty") }
    }

    static func quarantine(_ context: Context) async throws {
        let action = context.arguments.positional(0) ?? "list"
        let store = try context.store(readOnly: action == "list")
        switch action {
        case "list":
            let entries = try store.quarantine()
            if context.json {
                return try Output.json(entries.map { ["id": $0.id, "zone": $0.zone ?? "", "name": $0.name ?? "", "code": $0.code?.rawValue ?? "", "reason": $0.reason, "source": $0.source,
                                                      "receivedAt": Output.time($0.receivedAt)] as [String: Any] })
            }
            for entry in entries { Output.line("\(entry.id)  \(entry.zone ?? "-")/\(entry.name ?? "-")  \(entry.reason)  (\(entry.source))") }
            if entries.isEmpty { Output.line("the quarantine is empty") }
        case "clear":
            guard let text = context.arguments.positional(1), let id = Int64(text) else { throw UsageError("quarantine clear takes an entry's number") }
            guard try await store.clearQuarantine(id: id) else { throw ToolFailure("no quarantine entry \(id)") }
            Output.line("entry \(id) cleared")
        case "retry":
            let zones = try await store.retryQuarantine()
            Output.line("\(zones.count) zone\(zones.count == 1 ? "" : "s") to pull again at the next sync\(zones.isEmpty ? "" : ": " + zones.joined(separator: ", "))")
        case let other:
            throw UsageError("unknown quarantine action '\(other)' (list, clear <n> or retry)")
        }
    }

    static func refetch(_ context: Context) async throws {
        guard let zone = context.arguments.positional(0) else { throw UsageError("missing <zone>") }
        try await context.store().refetch(zone: try zoneName(zone).rawValue)
        try Output.result(context, ["refetch": zone], "\(zone) will be pulled again from the start at the next sync")
    }

    static func stats(_ context: Context) async throws {
        let store = try context.store(readOnly: true)
        let stats = try store.statistics()
        if context.json {
            let data = try JSONEncoder().encode(stats)
            FileHandle.standardOutput.write(data + Data("\n".utf8))
            return
        }
        Output.line("records \(stats.records) (\(stats.recordBytes) bytes) in \(stats.zones) zones")
        Output.line("speakers \(stats.speakers), conversations \(stats.conversations), messages \(stats.messages) (\(stats.pendingMessages) pending, \(stats.failedMessages) failed)")
        Output.line("outbox \(stats.outbox), quarantine \(stats.quarantined), cached images \(stats.cachedImages) (\(stats.cachedImageBytes) bytes)")
        Output.line("last sync \(stats.lastSyncAt.map(Output.time) ?? "never")")
        if !stats.conflictedSpeakers.isEmpty { Output.line("held back (identity conflicts): \(stats.conflictedSpeakers.joined(separator: ", "))") }
    }
}

extension Context {
    /// The backend a client of this store reads: `--zone-dir` / `--server`, or the store's own.
    func backendSource() throws -> Source {
        if arguments.value("zone-dir") != nil || arguments.value("server") != nil { return try inspectionSource() }
        let settings = settings()
        var arguments = self.arguments
        if let folder = settings.zoneDir {
            arguments.values["zone-dir"] = [folder]
        } else if let server = settings.server {
            arguments.values["server"] = [server]
        } else {
            throw ToolFailure("no backend for \(storePath): give --server or --zone-dir")
        }
        return try Context(arguments: arguments).inspectionSource()
    }
}
