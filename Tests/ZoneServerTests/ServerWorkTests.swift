import Foundation
import Synchronization
import Testing
import TestSupport
@testable import ZoneServer

/// The work a server waits for before it stops (``ServerWork``): its handlers, streams and
/// answers on their way out.
@Suite struct ServerWorkTests {
    final class Ended: Sendable {
        let count = Atomic(0)
    }

    /// Work started before the close is waited for (the waiter woken as the last ends), work
    /// after it is refused, a deadline lets the waiter go while work still runs, and cancelling
    /// reaches the tasks still running; an answer on its way out (no task) is waited for too.
    @Test func theStopWaitsForWhatRunsRefusesWhatComesAndCancelsAtItsDeadline() async throws {
        let work = ServerWork()
        let executor = HandlerExecutor(label: "convkit.test.work")
        let (release, releasing) = AsyncStream<Void>.makeStream()
        let ended = Ended()
        #expect(work.start(on: executor) { _ in
            for await _ in release {}
            ended.count.add(1, ordering: .relaxed)
        } != nil)
        #expect(work.start(on: executor) { _ in
            while !Task.isCancelled { try? await Task.sleep(for: .milliseconds(10)) }
            ended.count.add(1, ordering: .relaxed)
        } != nil)
        work.close()
        #expect(work.start(on: executor) { _ in ended.count.add(100, ordering: .relaxed) } == nil, "nothing starts once closed")
        #expect(await work.waitUntilEmpty(until: .now + .milliseconds(200)) == false, "the deadline lets the waiter go")
        #expect(work.count == 2)

        releasing.finish()
        #expect(await until { work.count == 1 }, "a task that ends leaves")
        #expect(work.cancelAll() == 1)
        #expect(await work.waitUntilEmpty(until: .now + .seconds(10)), "the cancelled task ended, and the waiter was woken")
        #expect(ended.count.load(ordering: .relaxed) == 2)

        let answer = work.begin()
        let waiting = Task { await work.waitUntilEmpty() }
        try await Task.sleep(for: .milliseconds(50))  // the waiter waits (nothing to wait on but time)
        work.end(answer)
        #expect(await waiting.value, "woken when the answer left")
    }
}
