import Foundation
import RecordZone
import Testing
@testable import ConversationKit

/// The zone-name checks every applied record makes, read byte by byte, agree with the names the
/// store makes and refuse everything else.
@Suite struct ZoneNameChecksTests {
    @Test func theChecksAgreeWithTheNamesMade() throws {
        let people = ["alice", "bob", "carol", "a.b-c_d", "z9"]
        for a in people {
            for b in people where a != b {
                let pair = ChatRecords.conversationZone(a, b)
                #expect(ChatRecords.isConversationZone(pair, of: a, b) && ChatRecords.isConversationZone(pair, of: b, a))
                #expect(ChatRecords.isParticipant(a, in: pair) && ChatRecords.isParticipant(b, in: pair))
                #expect(!ChatRecords.isGroupZone(pair))
                for c in people where c != a && c != b {
                    #expect(!ChatRecords.isConversationZone(pair, of: a, c))
                    #expect(!ChatRecords.isParticipant(c, in: pair))
                }
            }
        }
        let hashes = [ChatRecords.identityHash("alice"), ChatRecords.identityHash("bob")].sorted()
        // The two hashes the other way round, or in a group's or a speaker's zone, are not the pair.
        let swapped = try ZoneName("c-\(hashes[1])-\(hashes[0])")
        #expect(!ChatRecords.isConversationZone(swapped, of: "alice", "bob"))
        let group = try ZoneName("g-\(hashes[0])-\(hashes[1])")
        #expect(ChatRecords.isGroupZone(group) && GroupMembership.creatorHash(of: group) == hashes[0])
        #expect(!ChatRecords.isConversationZone(group, of: "alice", "bob") && !ChatRecords.isParticipant("alice", in: group))
        for bad in ["g-\(hashes[0])-\(hashes[1])0", "g-\(hashes[0].uppercased())-\(hashes[1])", "g_\(hashes[0])-\(hashes[1])", "c-\(hashes[0])", ChatRecords.speakerZone("alice").rawValue] {
            let zone = try ZoneName(bad)
            #expect(!ChatRecords.isGroupZone(zone) && GroupMembership.creatorHash(of: zone) == nil, "\(bad)")
            #expect(!ChatRecords.isConversationZone(zone, of: "alice", "bob"), "\(bad)")
        }
    }

    @Test func aMessageNamesItsSendersPrefix() {
        let name = ChatRecords.messageName(speaker: "alice", clock: RecordClock(milliseconds: 1_800_000_000_000, counter: 0))
        #expect(ChatRecords.senderPrefix(ofMessage: name).map(String.init) == ChatRecords.messagePrefix + ChatRecords.identityHash("alice") + ".")
        for bad in ["m.", "m.0123456789abcdef", "m.0123456789abcdefX", "x.0123456789abcdef.1", "m.0123456789abcdé.1"] {
            #expect(ChatRecords.senderPrefix(ofMessage: bad) == nil, "\(bad)")
        }
    }
}
