import Foundation
import RecordZone

/// The API's routes: every method and path the server answers. The OpenAPI document in the
/// repository (`openapi.json`) lists exactly these; a test keeps the two equal.
enum Route: CaseIterable {
    case health, metrics
    case listZones, createZone, deleteZone
    case databaseChanges, zoneChanges, waitForChanges, stream
    case setTyping, typing
    case setPresence, presence
    case modify, fetch, query
    case putAsset, getAsset
    case publicRecord

    var method: String {
        switch self {
        case .health, .metrics, .listZones, .databaseChanges, .zoneChanges, .waitForChanges, .stream, .typing, .presence, .getAsset, .publicRecord: "GET"
        case .createZone, .putAsset, .setTyping, .setPresence: "PUT"
        case .deleteZone: "DELETE"
        case .modify, .fetch, .query: "POST"
        }
    }

    /// The path template, OpenAPI style.
    var template: String {
        switch self {
        case .health: "/healthz"
        case .metrics: "/metrics"
        case .listZones: "/v1/zones"
        case .createZone, .deleteZone: "/v1/zones/{zone}"
        case .databaseChanges: "/v1/changes"
        case .zoneChanges: "/v1/zones/{zone}/changes"
        case .waitForChanges: "/v1/zones/{zone}/wait"
        case .stream: "/v1/stream"
        case .setTyping, .typing: "/v1/zones/{zone}/typing"
        case .setPresence: "/v1/presence"
        case .presence: "/v1/zones/{zone}/presence"
        case .modify: "/v1/records/modify"
        case .fetch: "/v1/records/fetch"
        case .query: "/v1/zones/{zone}/query"
        case .putAsset, .getAsset: "/v1/assets/{sha256}"
        case .publicRecord: "/v1/public/{zone}/{name}"
        }
    }

    var isAuthenticated: Bool { self != .health && self != .metrics && self != .publicRecord }

    struct Matched {
        var route: Route
        var parameters: [String: String]
        var isAuthenticated: Bool { route.isAuthenticated }
    }

    /// Each route with its template's segments, split once.
    private static let templates = allCases.map { ($0, Array(segments(of: $0.template).dropFirst())) }

    /// A path's segments, split at every `/` byte. Not by Swift's characters: a `/` followed by
    /// a combining mark or an emoji modifier (`/v1/assets/🏻`) is one character, which would hide
    /// the separator and make a known path unknown (404 where 400 is due).
    static func segments(of path: String) -> [String] {
        path.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Finds the route for a request: 400 for a path holding a control character (a decoded
    /// `%00` included), 404 for an unknown path, 405 (with `Allow`) for a known path with another
    /// method.
    static func match(method: String, path: String) throws(APIError) -> Matched {
        guard !path.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw APIError(.invalidArguments, "the path holds a control character")
        }
        let parts = segments(of: path).dropFirst()
        var allowed = [String]()
        for (route, template) in templates {
            guard template.count == parts.count else { continue }
            var parameters = [String: String]()
            var matches = true
            for (expected, actual) in zip(template, parts) {
                if expected.hasPrefix("{") {
                    guard !actual.isEmpty else { matches = false; break }
                    parameters[String(expected.dropFirst().dropLast())] = String(actual)
                } else if expected != actual {
                    matches = false
                    break
                }
            }
            guard matches else { continue }
            allowed.append(route.method)
            if route.method == method { return Matched(route: route, parameters: parameters) }
        }
        if !allowed.isEmpty {
            throw APIError(.methodNotAllowed, "\(method) is not allowed on \(path)", headers: [("Allow", allowed.joined(separator: ", "))])
        }
        throw APIError(.routeNotFound, "no route \(method) \(path)")
    }
}
