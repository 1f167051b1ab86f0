import Foundation
import Synchronization

/// Counters and a latency histogram, written in the Prometheus text format.
/// See <https://prometheus.io/docs/instrumenting/exposition_formats/>.
final class Metrics: Sendable {
    static let buckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

    private struct State {
        var requests: [String: Int] = [:]  // "method,route,status"
        var errors = 0
        var bucketCounts = [Int](repeating: 0, count: Metrics.buckets.count)
        var latencyCount = 0
        var latencySum = 0.0
    }
    private let state = Mutex(State())

    /// The methods counted by name; any other is counted as `other`, so a client cannot add
    /// series (or put a quote into a label) by inventing methods.
    static let knownMethods: Set<String> = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]

    /// Counts a request answered; `route` is nil for a path no route matches (`none`).
    func record(method rawMethod: String, route: Route?, status: Int, seconds: Double) {
        let method = Self.knownMethods.contains(rawMethod) ? rawMethod : "other"
        state.withLock { state in
            state.requests["\(method),\(route.map { "\($0)" } ?? "none"),\(status)", default: 0] += 1
            if status >= 400 { state.errors += 1 }
            for (index, bound) in Self.buckets.enumerated() where seconds <= bound { state.bucketCounts[index] += 1 }
            state.latencyCount += 1
            state.latencySum += seconds
        }
    }

    /// How many requests have been answered (of one route, or all).
    func answered(_ route: Route? = nil) -> Int {
        let name = route.map { "\($0)" }
        return state.withLock { state in state.requests.filter { name == nil || $0.key.split(separator: ",").dropFirst().first.map(String.init) == name }.values.reduce(0, +) }
    }

    /// Every request answered, those with an error, and the seconds they took in all.
    func totals() -> (requests: Int, errors: Int, latencySeconds: Double) {
        state.withLock { ($0.latencyCount, $0.errors, $0.latencySum) }
    }

    func render(recordsStored: Int, longPollsWaiting: Int, inFlight: Int, idleGivenWay: Int = 0, openConnections: Int = 0, abandoned: Int = 0, memoryReleases: Int = 0) -> String {
        let snapshot = state.withLock { $0 }
        var out = """
            # HELP convkitd_requests_total HTTP requests answered, by method, route (none: no route matched) and status.
            # TYPE convkitd_requests_total counter

            """
        for (key, count) in snapshot.requests.sorted(by: { $0.key < $1.key }) {
            let parts = key.split(separator: ",")
            out += "convkitd_requests_total{method=\"\(parts[0])\",route=\"\(parts[1])\",status=\"\(parts[2])\"} \(count)\n"
        }
        out += """
            # HELP convkitd_errors_total Requests answered with a 4xx or 5xx status.
            # TYPE convkitd_errors_total counter
            convkitd_errors_total \(snapshot.errors)
            # HELP convkitd_records_stored Records held by the server.
            # TYPE convkitd_records_stored gauge
            convkitd_records_stored \(recordsStored)
            # HELP convkitd_long_polls_waiting Long polls waiting for a change.
            # TYPE convkitd_long_polls_waiting gauge
            convkitd_long_polls_waiting \(longPollsWaiting)
            # HELP convkitd_requests_in_flight Requests being handled.
            # TYPE convkitd_requests_in_flight gauge
            convkitd_requests_in_flight \(inFlight)
            # HELP convkitd_idle_connections_given_way_total Idle connections closed so that new clients could get in.
            # TYPE convkitd_idle_connections_given_way_total counter
            convkitd_idle_connections_given_way_total \(idleGivenWay)
            # HELP convkitd_open_connections Client connections open now.
            # TYPE convkitd_open_connections gauge
            convkitd_open_connections \(openConnections)
            # HELP convkitd_requests_abandoned_total Requests (long polls) ended early because their client went away.
            # TYPE convkitd_requests_abandoned_total counter
            convkitd_requests_abandoned_total \(abandoned)
            # HELP convkitd_memory_releases_total Times free memory was given back to the system after many connections closed.
            # TYPE convkitd_memory_releases_total counter
            convkitd_memory_releases_total \(memoryReleases)
            # HELP convkitd_request_duration_seconds Time to answer a request.
            # TYPE convkitd_request_duration_seconds histogram

            """
        for (index, bound) in Self.buckets.enumerated() {
            out += "convkitd_request_duration_seconds_bucket{le=\"\(bound)\"} \(snapshot.bucketCounts[index])\n"
        }
        out += "convkitd_request_duration_seconds_bucket{le=\"+Inf\"} \(snapshot.latencyCount)\n"
        out += "convkitd_request_duration_seconds_sum \(snapshot.latencySum)\n"
        out += "convkitd_request_duration_seconds_count \(snapshot.latencyCount)\n"
        return out
    }
}
