import Foundation
import RecordZone

/// The console's pages, as HTML made on the server from the storage: every page a bounded
/// read (50 rows, found by key), every text through ``HTML/text(_:)``.
struct ConsolePages {
    let api: ZoneAPI
    let request: HTTPRequest
    let sizes: ZoneSizes
    static let pageSize = 50
    var prefix: String { ConsoleService.prefix }

    static func signIn(message: String?) -> String {
        """
        \(message.map { "<p class=\"error\" role=\"alert\">\(HTML.text($0))</p>" } ?? "")
        <form method="post" action="\(ConsoleService.prefix)/sign-in">
        <label for="token">Console token (printed by <code>convkitd serve --console</code> at start)</label>
        <input id="token" name="token" type="password" autocomplete="off" required autofocus>
        <button type="submit">Sign in</button></form>
        """
    }

    func overview() async throws -> String {
        let storage = api.storage
        let problem = await storage.healthProblem()
        let records = try await storage.recordCount()
        let kind = storage is SQLiteZoneStorage ? "SQLite (one server)" : "PostgreSQL (shared by every server on it)"
        var rows: [[String]] = [
            ["Storage", HTML.text(kind)],
            ["Health", problem.map { "<span class=\"bad\">\(HTML.text($0))</span>" } ?? "<span class=\"good\">answers</span>"],
            ["Records stored", "\(records)"],
            ["Long polls waiting", "\(storage.waitingCount)"],
            ["Requests in flight", "\(api.counters.inFlightCount)"],
            ["Open connections", "\(api.counters.openConnectionCount)"],
            ["Requests answered", "\(api.metrics.answered())"],
            ["Saves refused (recent)", HTML.link("\(prefix)/refused", "\(api.refusals.recent.count)")],
        ]
        for line in storage.metricsText().split(separator: "\n") where !line.hasPrefix("#") {
            let parts = line.split(separator: " ", maxSplits: 1)
            if parts.count == 2 { rows.append([HTML.text(parts[0]), HTML.text(parts[1])]) }
        }
        return HTML.table(["", ""], rows, caption: "This server")
    }

    func zones() async throws -> String {
        let after = request.queryValue("after")
        let limit = self.limit
        let zones = try await api.storage.zoneListing(after: after, limit: limit)
        let rows = zones.map { zone in
            // Sizes as last counted (opening a zone counts it): a list counts nothing.
            let size = (try? ZoneName(zone.name)).flatMap { sizes.counted($0) }
            return [HTML.link("\(prefix)/zones/\(HTML.component(zone.name))", zone.name), "\(zone.sequence)",
                    size.map { "\($0.records)" } ?? "–", size.map { "\($0.bytes)" } ?? "–",
                    HTML.link("\(prefix)/zones/\(HTML.component(zone.name))/changes", "changes")]
        }
        var html = "<p>Records and bytes as last counted (opening a zone counts it; – : not yet).</p>"
        html += HTML.table(["Zone", "Versions taken", "Records", "Bytes", ""], rows, caption: after.map { "Zones after \($0)" } ?? "Zones")
        if zones.count == limit, let last = zones.last {
            html += "<p>" + HTML.link("\(prefix)/zones?limit=\(limit)&amp;after=\(HTML.component(last.name))", "Next zones →") + "</p>"
        }
        return html
    }

    /// Rows a page shows: `?limit=` (10 to 500), else 50.
    var limit: Int { min(500, max(10, request.queryValue("limit").flatMap { Int($0) } ?? Self.pageSize)) }

    func zone(_ zone: ZoneName) async throws -> String {
        let after = request.queryValue("after")
        let limit = self.limit
        let page = try await api.storage.recordPage(in: zone, after: after, limit: limit)
        let size = await sizes.size(of: zone, storage: api.storage)
        let policy = api.storage.policy
        let rows = page.map { signed -> [String] in
            let shown = Self.inspect(signed, policy: policy)
            let name = shown.record?.id.name ?? "?"
            return [HTML.link("\(prefix)/zones/\(HTML.component(zone.rawValue))/records/\(HTML.component(name))", name),
                    HTML.text(shown.record.map { $0.recordType + ($0.isDeleted ? " (deleted)" : "") } ?? "-"),
                    HTML.text(shown.owner), Self.verdict(shown), HTML.text(shown.record.map { Self.clock($0.clock) } ?? "-")]
        }
        let counted = size.map { size in
            let age = Int((ContinuousClock.now - size.at).components.seconds)
            return "\(size.records) records, \(size.bytes) bytes\(age >= 1 ? " (counted \(age) s ago)" : "")."
        } ?? "Counting its records (a large zone takes a moment: reload)."
        var html = ""
        // What the zone's governing records decide, as this server applies it (a group's members).
        if let governance = api.access.governance, governance.governingType(of: zone) != nil,
           let governed = try await api.storage.governed([zone], by: governance)[zone], !governed.summary.isEmpty {
            html += HTML.table(["", ""], governed.summary.map { [HTML.text($0.label), HTML.text($0.value)] }, caption: "As this server decides it")
        }
        html += "<p>\(counted) " + HTML.link("\(prefix)/zones/\(HTML.component(zone.rawValue))/changes", "Its changes") + "</p>"
        html += HTML.table(["Record", "Type", "Owner", "Check", "Clock"], rows, caption: after.map { "Records after \($0)" } ?? "Records")
        if page.count == limit, let last = page.last.flatMap({ Self.inspect($0, policy: policy).record }) {
            html += "<p>" + HTML.link("\(prefix)/zones/\(HTML.component(zone.rawValue))?limit=\(limit)&amp;after=\(HTML.component(last.id.name))", "Next records →") + "</p>"
        }
        return html
    }

    func changes(_ zone: ZoneName) async throws -> String {
        let since = try request.queryValue("since").map { text throws(RecordZoneError) -> ChangeToken in
            guard let token = ChangeToken(base64: text) else { throw RecordZoneError(.invalidArguments, "not a change token: \(text)") }
            return token
        }
        let changes = try await api.storage.changes(in: zone, since: since, limit: Self.pageSize, readable: nil)
        let policy = api.storage.policy
        let rows = changes.records.map { signed -> [String] in
            let shown = Self.inspect(signed, policy: policy)
            let name = shown.record?.id.name ?? "?"
            return [HTML.text(signed.changeTag ?? "-"),
                    HTML.link("\(prefix)/zones/\(HTML.component(zone.rawValue))/records/\(HTML.component(name))", name),
                    HTML.text(shown.record?.recordType ?? "-"), Self.verdict(shown)]
        }
        var html = "<p>From \(since.map { "token <code>\(HTML.text($0.base64))</code>" } ?? "the start"): \(changes.records.count) changes.</p>"
        html += HTML.table(["Sequence", "Record", "Type", "Check"], rows, caption: "Changes")
        html += "<p>Token after this page: <code>\(HTML.text(changes.token.base64))</code></p>"
        if changes.moreComing {
            html += "<p>" + HTML.link("\(prefix)/zones/\(HTML.component(zone.rawValue))/changes?since=\(HTML.component(changes.token.base64))", "Next changes →") + "</p>"
        }
        return html
    }

    func record(_ id: RecordID) async throws -> String {
        guard let result = try await api.storage.stored([id]).first else { throw RecordZoneError(.unknownItem, "no record \(id)") }
        let signed = try result.get()
        let shown = Self.inspect(signed, policy: api.storage.policy)
        guard let record = shown.record else { return "<p class=\"bad\">The stored bytes are not a canonical record: \(HTML.text(shown.signature))</p>" }
        var rows: [[String]] = [
            ["Zone", HTML.link("\(prefix)/zones/\(HTML.component(id.zone.rawValue))", id.zone.rawValue)],
            ["Name", HTML.text(id.name)], ["Type", HTML.text(record.recordType + (record.isDeleted ? " (deleted: a tombstone)" : ""))],
            ["Check", Self.verdict(shown)],
            ["Signature", HTML.text(shown.signature)],
            ["Owner", shown.ownerIdentity.map { HTML.link("\(prefix)/identities/\(HTML.component($0))", $0) } ?? HTML.text(shown.owner)],
            ["Author key", "<code>\(record.authorKey.hexString)</code>"],
            ["Fingerprint", "<code>\(HTML.text(shown.fingerprint))</code>"],
            ["Clock", HTML.text(Self.clock(record.clock))],
            ["Version held", HTML.text("sequence \(signed.changeTag ?? "-")" + (signed.receivedAt.map { ", received \(Date(timeIntervalSince1970: Double($0) / 1000).formatted(.iso8601))" } ?? ""))],
            ["Why this version", "The server keeps one version per record: the one with the latest clock (a hybrid logical clock, then the author key's bytes on a tie) among those its rules accepted. Older versions are not kept."],
        ]
        for (name, value) in record.fields.sorted(by: { $0.key < $1.key }) { rows.append(["<code>\(HTML.text(name))</code>", Self.field(value)]) }
        return HTML.table(["", ""], rows, caption: "\(id)")
    }

    func identities() -> String {
        let after = request.queryValue("after")
        let names = api.storage.policy.pins.identities(after: after, limit: limit)
        let rows = names.map { name -> [String] in
            let chain = api.storage.policy.pins.chain(for: name)
            let revoked = chain?.devices.filter { $0.revokedAfter != nil }.count ?? 0
            return [HTML.link("\(prefix)/identities/\(HTML.component(name))", name), "\(chain?.retired.count ?? 0)", "\(chain?.devices.count ?? 0)", "\(revoked)"]
        }
        var html = HTML.table(["Identity", "Rotations", "Devices", "Revoked"], rows, caption: after.map { "Identities after \($0)" } ?? "Identities with keys bound here")
        if names.count == limit, let last = names.last {
            html += "<p>" + HTML.link("\(prefix)/identities?limit=\(limit)&amp;after=\(HTML.component(last))", "Next identities →") + "</p>"
        }
        return html
    }

    func identity(_ identity: String) -> String {
        guard let chain = api.storage.policy.pins.chain(for: identity) else { return "<p>No key is bound to <code>\(HTML.text(identity))</code> here.</p>" }
        func key(_ data: Data) -> String { "<code>\(HTML.text(KeyChain.fingerprint(identity: identity, key: data)))</code>" }
        var rows: [[String]] = [["identity key (current)", key(chain.current), chain.isVerified ? "verified (rotated or certified)" : "first use"]]
        for retired in chain.retired { rows.append(["identity key (retired)", key(retired.key), HTML.text("signs up to \(Self.clock(retired.until))")]) }
        for device in chain.devices {
            rows.append(["device", key(device.key), HTML.text(device.revokedAfter.map { "revoked after \(Self.clock($0))" } ?? "active")])
        }
        return HTML.table(["Key", "Fingerprint", "State"], rows, caption: "Keys of \(identity)")
    }

    static func sessions(count: Int, csrf: String, settings: ConsoleSettings) -> String {
        """
        <p>\(count) console session\(count == 1 ? "" : "s") open (this one included). A session ends after \(settings.idleLifetime.components.seconds) s without a request, and after \(settings.lifetime.components.seconds) s in any case.</p>
        <form method="post" action="\(ConsoleService.prefix)/sessions/end-all"><input type="hidden" name="csrf" value="\(HTML.text(csrf))">
        <button type="submit">End every session (this one too)</button></form>
        """
    }

    func refused() -> String {
        let rows = api.refusals.recent.map { entry in
            [HTML.text(entry.at.formatted(.iso8601)), HTML.text(entry.identity), HTML.text(entry.record), HTML.text(entry.type), HTML.text(entry.code), HTML.text(entry.message)]
        }
        return "<p>The saves this server refused since it started (the newest \(RefusalLog.capacity), newest first); nothing of them was stored.</p>"
            + HTML.table(["When", "Sent by", "Record", "Type", "Code", "Why"], rows, caption: "Refused saves")
    }

    func metrics() -> String {
        """
        <p>Live, every two seconds, from this server's counters (the same as <code>/metrics</code>).</p>
        <div id="charts" data-source="\(prefix)/metrics.json">
        <figure><figcaption>Requests per second</figcaption><svg id="chart-requests" viewBox="0 0 600 120" role="img" aria-label="Requests per second"></svg></figure>
        <figure><figcaption>Mean latency (ms)</figcaption><svg id="chart-latency" viewBox="0 0 600 120" role="img" aria-label="Mean latency"></svg></figure>
        <figure><figcaption>Saves per second</figcaption><svg id="chart-saves" viewBox="0 0 600 120" role="img" aria-label="Saves per second"></svg></figure>
        <figure><figcaption>Long polls waiting</figcaption><svg id="chart-polls" viewBox="0 0 600 120" role="img" aria-label="Long polls waiting"></svg></figure>
        </div>
        <noscript><p>The charts need JavaScript; <code>/metrics</code> has the same counters as text.</p></noscript>
        <script src="\(prefix)/static/console.js"></script>
        """
    }

    func metricsJSON() async throws -> Data {
        let totals = api.metrics.totals()
        let value: [String: Double] = [
            "time": Date().timeIntervalSince1970, "requests": Double(totals.requests), "errors": Double(totals.errors),
            "latencySeconds": totals.latencySeconds, "saves": Double(api.metrics.answered(.modify)),
            "longPolls": Double(api.storage.waitingCount), "inFlight": Double(api.counters.inFlightCount),
        ]
        return try JSONSerialization.data(withJSONObject: value, options: [.sortedKeys])
    }

    // MARK: Records as the console shows them

    struct Inspected {
        var record: Record?
        var signature: String
        var owner: String
        var ownerIdentity: String?
        var fingerprint: String
        /// Whether a reader would take it: signed, owned, by a key its owner's chain allows then.
        var isAccepted: Bool
    }

    /// Decodes and checks a stored record as a reader would: its signature, its owner by the
    /// policy's rules, and its key against the owner's chain at its clock.
    static func inspect(_ signed: Wire.SignedRecord, policy: RecordPolicy) -> Inspected {
        guard let record = try? signed.decoded() else {
            return Inspected(record: nil, signature: "the bytes are not a canonical record", owner: "-", fingerprint: "-", isAccepted: false)
        }
        let signature = !record.isSigned ? "missing" : record.hasValidSignature() ? "valid" : "invalid: it does not verify over the record's bytes"
        var owner = "none (no rule names one)", identity: String?
        switch policy.rules.owner(of: record) {
        case .success(let name)?:
            owner = name
            identity = name
        case .failure(let reason)?: owner = "refused: \(reason)"
        case nil: break
        }
        let keyAllowed = identity.map { policy.pins.chain(for: $0)?.allows(record.authorKey, at: record.clock) ?? false } ?? true
        let fingerprint = KeyChain.fingerprint(identity: identity ?? owner, key: record.authorKey)
        return Inspected(record: record, signature: signature + (keyAllowed ? "" : "; its key is not one its owner's chain allows at its clock"),
                         owner: owner, ownerIdentity: identity, fingerprint: fingerprint, isAccepted: signature == "valid" && keyAllowed && !owner.hasPrefix("refused"))
    }

    static func verdict(_ shown: Inspected) -> String {
        shown.isAccepted ? "<span class=\"good\">verified</span>" : "<span class=\"bad\">FORGED OR BROKEN: \(HTML.text(shown.signature))</span>"
    }

    static func clock(_ clock: RecordClock) -> String {
        "\(Date(timeIntervalSince1970: Double(clock.milliseconds) / 1000).formatted(.iso8601)) +\(clock.counter)"
    }

    /// A field's value; bytes (sealed content among them) as their size and first bytes.
    static func field(_ value: FieldValue) -> String {
        switch value {
        case .bytes(let data): "<span class=\"cipher\">\(HTML.text(HTML.bytes(data)))</span>"
        case .string(let text): HTML.text(text)
        default: HTML.text("\(value)")
        }
    }
}
