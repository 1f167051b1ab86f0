import ConversationKit
import Crowd
import Foundation
import RecordZone
import Synchronization

/// What the capacity section runs: how many clients online, how fast the senders send, what
/// share of the clients reconnect every 2–4 s, for how long.
struct CapacityOptions {
    var clients = 10_000
    var rate = 1_000
    var senders = 10
    var churn = 0.0
    var window = 30.0
    /// Each client holds a stream (what a store of this version does), not long polls.
    var streams = true
}

/// `convkitd serve` as a process with a crowd of online clients, each holding a stream that
/// follows its own conversation (with one of the senders; `--long-polls`: a long poll on it, and
/// a fetch of what arrives): the senders send at a
/// fixed total rate, one message at a time each; delivery is timed from each message's
/// scheduled send time to the push (fetch) that brings it to its client, so a sender that falls behind
/// shows in the figures. Reports the rate kept, delivery median / p99, errors an honest client
/// saw, the server's CPU and its memory per idle client.
@MainActor func capacityBench(_ reporter: Reporter, _ options: CapacityOptions) async throws {
    raiseDescriptorLimit()
    let root = FileManager.default.temporaryDirectory.path + "/convkit-capacity-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    guard let started = try startConvkitd(data: root, reporter: reporter, purpose: "capacity", extra: ["--max-wait", "60", "--max-connections", "\(max(16_384, options.clients + 1_024))"]) else { return }
    let (process, url) = started
    defer { process.terminate() }
    guard let port = url.port else { throw RawError("no port in \(url)") }
    let pid = process.processIdentifier

    // Setup (not timed): the senders, a zone per client, the clients' keys.
    let senders = (0..<min(options.senders, options.clients)).map { index in
        (identity: "s\(index)", key: SigningKey.generate())
    }
    let backends = senders.map { HTTPBackend(url: url, identity: $0.identity, key: $0.key, policy: ConversationStore.recordPolicy()) }
    let members = try (0..<options.clients).map { client in
        let sender = senders[client % senders.count]
        // One address per client, as ten thousand people would come from.
        let source = "127.\(1 + client % 50).\(client / 50 % 250).\(2 + client / 12_500)"
        return Crowd.Member(identity: "c\(client)", key: SigningKey.generate(), zone: try chatZone(sender.identity, "c\(client)"), source: source)
    }
    let setupStart = ContinuousClock.now
    try await withThrowingTaskGroup(of: Void.self) { group in
        for (index, backend) in backends.enumerated() {
            let zones = stride(from: index, to: members.count, by: backends.count).map { members[$0].zone }
            group.addTask { for zone in zones { try await backend.createZone(zone) } }
        }
        try await group.waitForAll()
    }
    reporter.note(String(format: "capacity: %d zones created in %.1f s", members.count, secondsIn(ContinuousClock.now - setupStart)))

    let idleRSS = try residentKilobytes(of: pid)
    let tally = CapacityTally(clients: members.count)
    let crowd = try Crowd(port: port, members: members, streams: options.streams, waitSeconds: 60, churn: options.churn > 0 ? Crowd.Churn(share: options.churn) : nil) { client, count in
        let now = ContinuousClock.now
        let times = tally.scheduled.withLock { lists in
            let taken = Array(lists[client].prefix(count))
            lists[client].removeFirst(taken.count)
            return taken
        }
        tally.latencies.withLock { $0.append(contentsOf: times.map { secondsIn(now - $0) }) }
    }
    crowd.start()
    defer { Task { await crowd.stop() } }
    let onlineStart = ContinuousClock.now
    // Online: every client connected and waiting (with churn, those reconnecting at that moment
    // aside: 95 % of them).
    while crowd.snapshot.connections < members.count || crowd.snapshot.waiting < members.count * (options.churn > 0 ? 95 : 100) / 100 {
        try await Task.sleep(for: .milliseconds(50))
        if ContinuousClock.now - onlineStart > .seconds(300) { throw RawError("only \(crowd.snapshot.waiting) of \(members.count) clients got online: \(crowd.snapshot.firstErrors)") }
    }
    try await Task.sleep(for: .seconds(1))
    let onlineRSS = try residentKilobytes(of: pid)
    reporter.note(String(format: "capacity: %d clients online (each %@) in %.1f s; convkitd resident memory %d MB idle, %d MB with them: %.1f kB per online client",
                         members.count, options.streams ? "a stream" : "a long poll", secondsIn(ContinuousClock.now - onlineStart), idleRSS / 1024, onlineRSS / 1024,
                         Double(onlineRSS - idleRSS) / Double(members.count)))

    // A save's round trip with the crowd online and nobody else writing (one sender, 200 saves,
    // each to the next client in turn).
    let clock = HybridLogicalClock()
    @Sendable func message(_ k: Int, from sender: Int, to client: Int) throws -> Record {
        var message = Record(id: try RecordID(zone: members[client].zone, name: "m.\(OwnershipRule.identityHash(senders[sender].identity)).\(k)"), type: "Message", fields: [
            "speaker": .string(senders[sender].identity), "listener": .string(members[client].identity),
            "content": .string("message \(k), about as long as a chat line, sent by the capacity bench"),
            "spokenAt": .date(milliseconds: Int64(Date().timeIntervalSince1970 * 1000)),
        ])
        try message.sign(with: senders[sender].key, clock: clock.now())
        return message
    }
    var alone = [Double]()
    for k in 0..<200 {
        let client = k * senders.count % members.count
        let record = try message(-1 - k, from: 0, to: client)
        tally.scheduled.withLock { $0[client].append(ContinuousClock.now) }
        let sent = ContinuousClock.now
        _ = try await backends[0].save([record])[0].get()
        alone.append(secondsIn(ContinuousClock.now - sent))
    }
    alone.sort()
    reporter.note(String(format: "capacity: a save's round trip with %d clients online and one sender: median %.2f ms, p90 %.2f ms (200 saves)",
                         members.count, alone[100] * 1000, alone[180] * 1000))
    // Those 200 arrive before the window starts.
    let aloneSent = ContinuousClock.now
    while tally.latencies.withLock({ $0.count }) < alone.count, ContinuousClock.now - aloneSent < .seconds(30) {
        try await Task.sleep(for: .milliseconds(20))
    }
    tally.latencies.withLock { $0.removeAll() }

    // The window: messages at `rate` a second, message k due at start + k / rate.
    let errorsBefore = crowd.snapshot.errors
    let cpuBefore = try cpuSeconds(of: pid)
    let ownBefore = try cpuSeconds(of: getpid())
    let start = ContinuousClock.now
    let total = Int(Double(options.rate) * options.window)
    try await withThrowingTaskGroup(of: Void.self) { group in
        for (index, backend) in backends.enumerated() {
            let mine = members.indices.filter { $0 % senders.count == index }
            let rate = Double(options.rate)
            guard !mine.isEmpty else { continue }
            group.addTask {
                var turn = 0
                for k in stride(from: index, to: total, by: senders.count) {
                    let due = start + .seconds(Double(k) / rate)
                    if ContinuousClock.now < due { try await Task.sleep(until: due, clock: .continuous) }
                    let late = secondsIn(ContinuousClock.now - due)
                    tally.lateness.withLock { $0 = max($0, late) }
                    let client = mine[turn % mine.count]
                    turn += 1
                    let record = try message(k, from: index, to: client)
                    tally.scheduled.withLock { $0[client].append(due) }
                    do {
                        let sent = ContinuousClock.now
                        _ = try await backend.save([record])[0].get()
                        let took = secondsIn(ContinuousClock.now - sent)
                        tally.saves.withLock { $0.append(took) }
                    } catch {
                        tally.sendErrors.withLock { if $0.count < 10 { $0.append("\(error)") } }
                    }
                }
            }
        }
        try await group.waitForAll()
    }
    let sending = secondsIn(ContinuousClock.now - start)
    // What is still on its way arrives within a few seconds, or counts as lost.
    let drainStart = ContinuousClock.now
    while tally.latencies.withLock({ $0.count }) < total, ContinuousClock.now - drainStart < .seconds(10) {
        try await Task.sleep(for: .milliseconds(50))
    }
    let cpu = try cpuSeconds(of: pid) - cpuBefore
    let own = try cpuSeconds(of: getpid()) - ownBefore
    let elapsed = secondsIn(ContinuousClock.now - start)
    let stats = crowd.snapshot
    let busyRSS = try residentKilobytes(of: pid)
    await crowd.stop()
    // Gone clients are gone: their polls end at once, and what they held is given back.
    try await Task.sleep(for: .seconds(6))
    let afterRSS = try residentKilobytes(of: pid)
    let times = tally.latencies.withLock { $0 }.sorted()
    let percentile = { (p: Double) in times.isEmpty ? .nan : times[min(times.count - 1, Int(Double(times.count) * p))] * 1000 }
    let failures = tally.sendErrors.withLock { $0 }
    reporter.note(String(format: "capacity: %d clients online%@, %d messages scheduled at %d/s over %.0f s: sent at %.0f/s (the latest send %.2f s behind its time); delivered %d, from the scheduled time median %.1f ms, p99 %.1f ms, slowest %.1f ms",
                         members.count, options.churn > 0 ? String(format: " (%.0f %% reconnecting every 2-4 s)", options.churn * 100) : "",
                         total, options.rate, options.window, Double(total) / sending, tally.lateness.withLock { $0 }, times.count,
                         percentile(0.5), percentile(0.99), (times.last ?? .nan) * 1000))
    let saves = tally.saves.withLock { $0 }.sorted()
    reporter.note(String(format: "capacity: convkitd resident memory %d MB at the end of the window, %d MB six seconds after every client left (%d MB idle before they came)",
                         busyRSS / 1024, afterRSS / 1024, idleRSS / 1024))
    reporter.note(String(format: "capacity: a save's round trip in the window: median %.2f ms, p99 %.2f ms; CPU over the window: convkitd %.0f %% of one core, the bench's clients %.0f %% (%d cores); client errors %d during the window (%d reconnections in all), send errors %d%@",
                         saves.isEmpty ? .nan : saves[saves.count / 2] * 1000, saves.isEmpty ? .nan : saves[saves.count * 99 / 100] * 1000,
                         cpu / elapsed * 100, own / elapsed * 100, ProcessInfo.processInfo.activeProcessorCount, stats.errors - errorsBefore, stats.connections - members.count, failures.count,
                         (stats.firstErrors + failures).isEmpty ? "" : ": " + (stats.firstErrors + failures).prefix(3).joined(separator: "; ")))
    // A capacity that loses messages or fails clients is no capacity: the run fails.
    guard stats.errors == 0, failures.isEmpty, times.count == total else {
        throw RawError("capacity: \(stats.errors) client errors, \(failures.count) send errors, \(total - times.count) of \(total) messages not delivered")
    }
}

/// What the senders and the crowd's thread note down.
final class CapacityTally: Sendable {
    /// Per client, the scheduled times of the messages sent to it and not yet fetched.
    let scheduled: Mutex<[[ContinuousClock.Instant]]>
    /// Seconds from each message's scheduled time to its fetch.
    let latencies = Mutex([Double]())
    let sendErrors = Mutex([String]())
    /// Each save's round trip in the window.
    let saves = Mutex([Double]())
    /// How far behind its time the latest send went.
    let lateness = Mutex(0.0)

    init(clients: Int) { scheduled = Mutex(Array(repeating: [], count: clients)) }
}

/// Raises this process's descriptor limit to its hard limit (ten thousand clients need as many).
func raiseDescriptorLimit() {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
    limit.rlim_cur = limit.rlim_max
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
}

/// User and system CPU seconds of a process so far (`/proc/<pid>/stat`).
func cpuSeconds(of pid: Int32) throws -> Double {
    let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    guard let close = stat.lastIndex(of: ")") else { throw RawError("unreadable /proc/\(pid)/stat") }
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { throw RawError("unreadable /proc/\(pid)/stat") }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}
