import Foundation
import RecordZone
import Synchronization

/// How the operator's console is reached (`convkitd serve --console`; docs/SERVER.md, "Console").
public struct ConsoleSettings: Sendable {
    /// What an operator types to sign in (`convkitd serve` prints it at start).
    public var token: String
    /// A session ends after this long without a request, and after ``lifetime`` in any case.
    public var idleLifetime: Duration = .seconds(30 * 60)
    public var lifetime: Duration = .seconds(12 * 3600)
    /// Whether the server speaks HTTPS: the session cookie is then `Secure`.
    public var secure = false

    public init(token: String) { self.token = token }

    /// A new random token: 32 bytes, hex.
    public static func randomToken() -> String { Sodium.randomBytes(32).hexString }
}

/// Recent saves the server refused, with why (in memory, the newest 200), for the console.
public final class RefusalLog: Sendable {
    public struct Refusal: Sendable {
        public let at: Date
        public let identity: String
        public let record: String
        public let type: String
        public let code: String
        public let message: String
    }

    private let entries = Mutex<[Refusal]>([])
    static let capacity = 200

    func note(identity: String, record: Record?, error: RecordZoneError) {
        let entry = Refusal(at: Date(), identity: identity, record: record.map { "\($0.id)" } ?? error.recordID.map { "\($0)" } ?? "-",
                            type: record?.recordType ?? "-", code: error.code.rawValue, message: error.message)
        entries.withLock { entries in
            entries.append(entry)
            if entries.count > Self.capacity { entries.removeFirst(entries.count - Self.capacity) }
        }
    }

    /// Newest first.
    public var recent: [Refusal] { entries.withLock { $0.reversed() } }
}

/// Zones' sizes for the console: counting a zone reads every row of it (a million rows take
/// a third of a second), so a count runs in the background, at most one per zone at a time and
/// again when the one held is a minute old; a page waits 50 ms for it, then says it is counting.
final class ZoneSizes: Sendable {
    struct Size: Sendable {
        let records: Int
        let bytes: Int
        let at: ContinuousClock.Instant
    }
    private let sizes = Mutex<[ZoneName: Size]>([:])
    private let counting = Mutex<[ZoneName: Task<Void, Never>]>([:])
    static let maximumAge: Duration = .seconds(60)

    /// The size last counted, however old (the zones list shows what is known, counting none).
    func counted(_ zone: ZoneName) -> Size? { sizes.withLock { $0[zone] } }

    func size(of zone: ZoneName, storage: any ZoneStorage) async -> Size? {
        let held = sizes.withLock { $0[zone] }
        if let held, ContinuousClock.now - held.at < Self.maximumAge { return held }
        let task = counting.withLock { counting -> Task<Void, Never> in
            if let running = counting[zone] { return running }
            let task = Task {
                if let (records, bytes) = try? await storage.zoneSize(zone) {
                    self.sizes.withLock { $0[zone] = Size(records: records, bytes: bytes, at: .now) }
                }
                _ = self.counting.withLock { $0.removeValue(forKey: zone) }
            }
            counting[zone] = task
            return task
        }
        let (done, signal) = AsyncStream.makeStream(of: Void.self)
        let waiter = Task { await task.value; signal.yield() }
        let timer = Task { try? await Task.sleep(for: .milliseconds(50)); signal.yield() }
        for await _ in done { break }
        waiter.cancel()
        timer.cancel()
        return sizes.withLock { $0[zone] } ?? held
    }
}

/// The operator's console at `/console/`, beside the API: pages rendered on the server from
/// what the storage holds, behind a sign-in. Every other path goes to the API.
///
/// Access: a token printed at start signs in (compared in constant time; ten failures a minute
/// per client address at most); a session is a random cookie (`HttpOnly`, `SameSite=Strict`, `Secure` over
/// HTTPS, path `/console`) that ends after ``ConsoleSettings/idleLifetime`` idle or
/// ``ConsoleSettings/lifetime``; every form that changes something carries the session's CSRF
/// token. Nothing but the sign-in page answers without a session (a page: a redirect to it;
/// the metrics' JSON: 401). Every answer forbids framing, sniffing, caching and any script,
/// style or image not from `/console/static/` (Content-Security-Policy).
struct ConsoleService: HTTPService {
    let api: ZoneAPI
    let settings: ConsoleSettings
    let sessions = Sessions()
    let sizes = ZoneSizes()
    static let prefix = "/console"

    func isConsole(_ path: String) -> Bool { path == Self.prefix || path.hasPrefix(Self.prefix + "/") }

    func preflight(method: String, path: String, headers: [String: String]) -> HTTPResponse? {
        isConsole(path) ? nil : api.preflight(method: method, path: path, headers: headers)
    }

    func checkBody(method: String, path: String, prefix: Data) -> HTTPResponse? {
        isConsole(path) ? nil : api.checkBody(method: method, path: path, prefix: prefix)
    }

    func mayWait(method: String, path: String) -> Bool { isConsole(path) ? false : api.mayWait(method: method, path: path) }

    /// The sign-in's failures are counted per client address.
    func needsClient(path: String) -> Bool { path == Self.prefix + "/sign-in" }

    func respond(to request: HTTPRequest) async -> HTTPResponse {
        guard isConsole(request.path) else { return await api.respond(to: request) }
        var response = await console(request)
        response.headers += Self.securityHeaders
        return response
    }

    static let securityHeaders: [(String, String)] = [
        ("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
        ("X-Content-Type-Options", "nosniff"), ("X-Frame-Options", "DENY"), ("Referrer-Policy", "no-referrer"), ("Cache-Control", "no-store"),
    ]

    // MARK: Sessions

    final class Sessions: Sendable {
        struct Session {
            let csrf: String
            let started: Date
            var seen: Date
        }
        let sessions = Mutex<[String: Session]>([:])
        /// Failed sign-ins in the current minute, by client address.
        let failures = Mutex<(minute: Int64, counts: [String: Int])>((0, [:]))
        static let maximumSessions = 64
        static let failuresPerMinute = 10

        /// A new session's cookie value and CSRF token.
        func open(now: Date) -> (id: String, csrf: String) {
            let id = ConsoleSettings.randomToken(), csrf = ConsoleSettings.randomToken()
            sessions.withLock { sessions in
                if sessions.count >= Self.maximumSessions, let oldest = sessions.min(by: { $0.value.seen < $1.value.seen })?.key {
                    sessions[oldest] = nil
                }
                sessions[id] = Session(csrf: csrf, started: now, seen: now)
            }
            return (id, csrf)
        }

        /// The session `id` names, while it lasts (seen now); nil for an unknown or ended one.
        func find(_ id: String, settings: ConsoleSettings, now: Date) -> Session? {
            sessions.withLock { sessions in
                guard var session = sessions[id] else { return nil }
                guard now.timeIntervalSince(session.seen) < Self.seconds(settings.idleLifetime),
                      now.timeIntervalSince(session.started) < Self.seconds(settings.lifetime) else {
                    sessions[id] = nil
                    return nil
                }
                session.seen = now
                sessions[id] = session
                return session
            }
        }

        func close(_ id: String) { sessions.withLock { $0[id] = nil } }

        /// Ends every session. - Returns: how many there were.
        func closeAll() -> Int {
            sessions.withLock { sessions in
                defer { sessions.removeAll() }
                return sessions.count
            }
        }

        var count: Int { sessions.withLock { $0.count } }

        static func seconds(_ duration: Duration) -> TimeInterval {
            duration.inSeconds
        }

        /// Whether `client` may try one more sign-in this minute.
        func mayTry(_ client: String, now: Date) -> Bool {
            let minute = Int64(now.timeIntervalSince1970 / 60)
            return failures.withLock { state in
                if state.minute != minute { state = (minute, [:]) }
                return state.counts[client, default: 0] < Self.failuresPerMinute
            }
        }

        func failed(_ client: String, now: Date) {
            let minute = Int64(now.timeIntervalSince1970 / 60)
            failures.withLock { state in
                if state.minute != minute { state = (minute, [:]) }
                // A flood from many addresses forgets the oldest minute's counts, never grows past this.
                if state.counts.count >= 10_000 { state.counts.removeAll() }
                state.counts[client, default: 0] += 1
            }
        }
    }

    static let cookieName = "convkit_console"

    func cookie(_ request: HTTPRequest) -> String? {
        guard let header = request.headers["cookie"] else { return nil }
        for part in header.split(separator: ";") {
            let pair = part.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1).map(String.init)
            if pair.count == 2, pair[0] == Self.cookieName { return pair[1] }
        }
        return nil
    }

    func setCookie(_ value: String, maxAge: Int) -> (String, String) {
        ("Set-Cookie", "\(Self.cookieName)=\(value); Path=\(Self.prefix); HttpOnly; SameSite=Strict; Max-Age=\(maxAge)\(settings.secure ? "; Secure" : "")")
    }

    // MARK: Routing

    func console(_ request: HTTPRequest) async -> HTTPResponse {
        // The path arrives percent-decoded (libmicrohttpd): segments are split at its `/` bytes.
        let parts = Route.segments(of: request.path).dropFirst(2)
        let path = parts.first == "" ? [] : Array(parts)
        if path == ["static", "console.css"] { return Self.asset(ConsoleAssets.css, "text/css; charset=utf-8") }
        if path == ["static", "console.js"] { return Self.asset(ConsoleAssets.script, "text/javascript; charset=utf-8") }
        if path == ["sign-in"] {
            if request.method == "POST" { return signIn(request) }
            return Self.page(status: 200, "Sign in", ConsolePages.signIn(message: nil), csrf: nil)
        }
        guard let id = cookie(request), let session = sessions.find(id, settings: settings, now: api.configuration.now()) else {
            // Nothing answers without a session: pages go to the sign-in, data is refused.
            if path.last?.hasSuffix(".json") == true || request.method != "GET" {
                return HTTPResponse(status: 401, headers: [("Content-Type", "text/plain; charset=utf-8")], body: Data("sign in first\n".utf8))
            }
            return HTTPResponse(status: 303, headers: [("Location", Self.prefix + "/sign-in")])
        }
        if request.method == "POST" {
            // Every change is a form carrying the session's CSRF token.
            let form = HTML.form(request.body)
            guard let csrf = form["csrf"], Sodium.constantTimeEqual(Data(csrf.utf8), Data(session.csrf.utf8)) else {
                api.configuration.logger.notice("console: a POST to \(request.path) without the session's CSRF token refused")
                return Self.page(status: 403, "Refused", "<p>This form is not from this session (CSRF check failed).</p>", csrf: session.csrf)
            }
            if path == ["sign-out"] {
                sessions.close(id)
                api.configuration.logger.notice("console: an operator signed out")
                return HTTPResponse(status: 303, headers: [("Location", Self.prefix + "/sign-in"), setCookie("", maxAge: 0)])
            }
            if path == ["sessions", "end-all"] {
                // The operator action: every session ends (a token seen over a shoulder, a lost laptop).
                let ended = sessions.closeAll()
                api.configuration.logger.notice("console: an operator ended every session (\(ended))")
                return HTTPResponse(status: 303, headers: [("Location", Self.prefix + "/sign-in"), setCookie("", maxAge: 0)])
            }
            return Self.page(status: 404, "Not found", "<p>No such action.</p>", csrf: session.csrf)
        }
        guard request.method == "GET" else { return HTTPResponse(status: 405, headers: [("Allow", "GET, POST")]) }
        let pages = ConsolePages(api: api, request: request, sizes: sizes)
        do {
            switch path {
            case []: return Self.page(status: 200, "Overview", try await pages.overview(), csrf: session.csrf)
            case ["zones"]: return Self.page(status: 200, "Zones", try await pages.zones(), csrf: session.csrf)
            case ["refused"]: return Self.page(status: 200, "Refused saves", pages.refused(), csrf: session.csrf)
            case ["identities"]: return Self.page(status: 200, "Identities", pages.identities(), csrf: session.csrf)
            case ["sessions"]: return Self.page(status: 200, "Sessions", ConsolePages.sessions(count: sessions.count, csrf: session.csrf, settings: settings), csrf: session.csrf)
            case ["metrics"]: return Self.page(status: 200, "Metrics", pages.metrics(), csrf: session.csrf)
            case ["metrics.json"]: return HTTPResponse(status: 200, headers: [("Content-Type", "application/json")], body: try await pages.metricsJSON())
            case let path where path.count == 2 && path[0] == "zones":
                return Self.page(status: 200, "Zone \(path[1])", try await pages.zone(try ZoneName(path[1])), csrf: session.csrf)
            case let path where path.count == 3 && path[0] == "zones" && path[2] == "changes":
                return Self.page(status: 200, "Changes of \(path[1])", try await pages.changes(try ZoneName(path[1])), csrf: session.csrf)
            case let path where path.count == 4 && path[0] == "zones" && path[2] == "records":
                return Self.page(status: 200, "Record \(path[3])", try await pages.record(RecordID(zone: try ZoneName(path[1]), name: path[3])), csrf: session.csrf)
            case let path where path.count == 2 && path[0] == "identities":
                return Self.page(status: 200, "Identity \(path[1])", pages.identity(path[1]), csrf: session.csrf)
            default:
                return Self.page(status: 404, "Not found", "<p>No such page.</p>", csrf: session.csrf)
            }
        } catch let error as RecordZoneError {
            let status = error.code == .zoneNotFound || error.code == .unknownItem ? 404 : error.code == .invalidArguments || error.code == .malformed ? 400 : 500
            return Self.page(status: status, "Error", "<p class=\"error\">\(HTML.text(error.message))</p>", csrf: session.csrf)
        } catch {
            return Self.page(status: 500, "Error", "<p class=\"error\">\(HTML.text("\(error)"))</p>", csrf: session.csrf)
        }
    }

    func signIn(_ request: HTTPRequest) -> HTTPResponse {
        let now = api.configuration.now()
        guard sessions.mayTry(request.client, now: now) else {
            return Self.page(status: 429, "Sign in", ConsolePages.signIn(message: "Too many failed sign-ins: wait a minute."), csrf: nil)
        }
        let token = HTML.form(request.body)["token"] ?? ""
        guard Sodium.constantTimeEqual(Data(token.utf8), Data(settings.token.utf8)) else {
            sessions.failed(request.client, now: now)
            api.configuration.logger.notice("console: a sign-in with a wrong token from \(request.client) refused")
            return Self.page(status: 401, "Sign in", ConsolePages.signIn(message: "That is not the console's token."), csrf: nil)
        }
        let (id, _) = sessions.open(now: now)
        api.configuration.logger.notice("console: an operator signed in")
        let seconds = Int(settings.lifetime.components.seconds)
        return HTTPResponse(status: 303, headers: [("Location", Self.prefix + "/"), setCookie(id, maxAge: seconds)])
    }

    static func asset(_ text: String, _ type: String) -> HTTPResponse {
        HTTPResponse(status: 200, headers: [("Content-Type", type)], body: Data(text.utf8))
    }

    /// A whole page: the navigation (with the sign-out form, when signed in) and `body`.
    static func page(status: Int, _ title: String, _ body: String, csrf: String?) -> HTTPResponse {
        var html = """
            <!doctype html>
            <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
            <title>\(HTML.text(title)) · convkitd console</title><link rel="stylesheet" href="\(prefix)/static/console.css"></head>
            <body><header><nav aria-label="Console">
            """
        if let csrf {
            html += """
                <a href="\(prefix)/">Overview</a> <a href="\(prefix)/zones">Zones</a> <a href="\(prefix)/identities">Identities</a> <a href="\(prefix)/refused">Refused saves</a> <a href="\(prefix)/metrics">Metrics</a> <a href="\(prefix)/sessions">Sessions</a>
                <form method="post" action="\(prefix)/sign-out" class="inline"><input type="hidden" name="csrf" value="\(HTML.text(csrf))"><button type="submit">Sign out</button></form>
                """
        }
        html += "</nav></header><main><h1>\(HTML.text(title))</h1>\(body)</main></body></html>\n"
        return HTTPResponse(status: status, headers: [("Content-Type", "text/html; charset=utf-8")], body: Data(html.utf8))
    }
}
