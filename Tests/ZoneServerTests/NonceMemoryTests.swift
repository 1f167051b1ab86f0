import Foundation
import Testing
@testable import ZoneServer

/// A single server's replay protection: each nonce once, and no more kept than the horizon needs.
@Suite struct NonceMemoryTests {
    @Test func aNonceIsClaimedOnceAndForgottenAfterTheHorizon() {
        let memory = NonceMemory()
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        let nonce = Data(repeating: 7, count: 16)
        #expect(memory.claim(nonce, at: start, horizon: 300, now: start))
        #expect(!memory.claim(nonce, at: start, horizon: 300, now: start.addingTimeInterval(299)), "a replay within the horizon")
        // A steady stream for 20 minutes, 50 requests a second: what is kept stays within the
        // horizon (plus a minute or two), not the whole stream.
        var kept = 0
        for second in 0..<1200 {
            let now = start.addingTimeInterval(Double(second))
            for index in 0..<50 {
                #expect(memory.claim(Data("\(second)-\(index)".utf8), at: now, horizon: 300, now: now))
            }
            kept = max(kept, memory.count)
        }
        #expect(kept <= 50 * 60 * 8, "\(kept) nonces kept")
        #expect(kept >= 50 * 300, "\(kept) nonces kept: fewer than the horizon needs")
    }
}
