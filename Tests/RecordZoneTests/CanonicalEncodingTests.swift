import Foundation
import Testing
import TestSupport
@testable import RecordZone

@Suite struct CanonicalEncodingTests {
    let notes: ZoneName
    init() throws { notes = try ZoneName("notes") }

    func sample() throws -> Record {
        var record = Record(id: try RecordID(zone: notes, name: "n1"), type: "Note")
        record["text"] = .string("héllo ✓")
        record["count"] = .int(-42)
        record["ratio"] = .double(0.1)
        record["flag"] = .bool(true)
        record["when"] = .date(milliseconds: 1_700_000_000_123)
        record["blob"] = .bytes(Data([0, 1, 2, 255]))
        record["link"] = .reference(try RecordID(zone: "other", name: "x"))
        record["avatar"] = .asset(AssetReference(for: Data("png".utf8)))
        record["tags"] = .list([.string("a"), .int(1), .date(milliseconds: 5)])
        try record.sign(with: Keys.alice, clock: RecordClock(milliseconds: 1_700_000_000_000, counter: 3))
        return record
    }

    @Test func roundTripKeepsEveryFieldAndTheSignature() throws {
        let record = try sample()
        let decoded = try Record(canonical: try record.encoded())
        #expect(decoded == record)
        #expect(decoded.hasValidSignature())
        #expect(try decoded.encoded() == record.encoded())
    }

    @Test func encodingIsTheSameWhateverOrderFieldsWereSetIn() throws {
        var a = Record(id: try RecordID(zone: notes, name: "n"), type: "T")
        var b = a
        let pairs: [(String, FieldValue)] = (0..<40).map { ("k\($0)", .int(Int64($0))) } + [("é", .bool(true)), ("Z", .string("z"))]
        for (key, value) in pairs { a[key] = value }
        for (key, value) in pairs.reversed() { b[key] = value }
        #expect(try a.canonicalBytes() == b.canonicalBytes())
        // Independent of dictionary layout: rebuild from a shuffled copy.
        var rng = SeededRandom(seed: 7)
        var c = Record(id: a.id, type: "T")
        for (key, value) in pairs.shuffled(using: &rng) { c[key] = value }
        #expect(try a.canonicalBytes() == c.canonicalBytes())
    }

    @Test func unknownValueTypesSurviveARoundTrip() throws {
        var record = try sample()
        record["future"] = .unknown(tag: 42, payload: Data([9, 9, 9]))
        record["futureList"] = .list([.unknown(tag: 200, payload: Data())])
        try record.sign(with: Keys.alice, clock: record.clock)
        let bytes = try record.encoded()
        let decoded = try Record(canonical: bytes)
        #expect(decoded["future"] == .unknown(tag: 42, payload: Data([9, 9, 9])))
        #expect(try decoded.encoded() == bytes)
        #expect(decoded.hasValidSignature())
        // And through JSON.
        let viaJSON = try Record(json: try decoded.json())
        #expect(try viaJSON.encoded() == bytes)
    }

    @Test func everyTruncationIsATypedError() throws {
        let bytes = try sample().encoded()
        for length in 0..<bytes.count {
            #expect(throws: RecordDecodingError.self) { try Record(canonical: bytes.prefix(length)) }
        }
    }

    @Test func everyFlippedByteIsRejectedOrFailsTheSignature() throws {
        let bytes = try sample().encoded()
        for index in 0..<bytes.count {
            var copy = bytes
            copy[index] ^= 0x01
            if let decoded = try? Record(canonical: copy) {
                #expect(!decoded.hasValidSignature(), "flip at \(index) still verifies")
            }
        }
    }

    @Test func randomGarbageNeverCrashesTheDecoder() {
        var rng = SeededRandom(seed: 99)
        for length in 0..<2000 {
            var bytes = (0..<(length % 300)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            if length % 2 == 0, bytes.count > 4 { bytes[0...3] = [0x43, 0x4B, 0x52, 0x01] }
            _ = try? Record(canonical: Data(bytes))
        }
        #expect(throws: RecordDecodingError.badMagic) { try Record(canonical: Data("nope".utf8)) }
    }

    @Test func nonCanonicalInputIsRefused() throws {
        var record = Record(id: try RecordID(zone: notes, name: "n"), type: "T")
        record["a"] = .int(1)
        record["b"] = .int(2)
        var bytes = [UInt8](try record.encoded())
        // Swap the two field names: now out of order.
        let a = bytes.firstIndex(of: UInt8(ascii: "a"))!, b = bytes.lastIndex(of: UInt8(ascii: "b"))!
        bytes.swapAt(a, b)
        #expect(throws: RecordDecodingError.fieldsOutOfOrder(key: "a")) { try Record(canonical: Data(bytes)) }
        #expect(throws: RecordDecodingError.trailingBytes(count: 1)) { try Record(canonical: try record.encoded() + [0]) }
    }

    @Test func invalidValuesAreRefusedOnEncode() throws {
        var record = Record(id: try RecordID(zone: notes, name: "n"), type: "T")
        record["x"] = .double(.nan)
        #expect(throws: RecordZoneError.self) { try record.canonicalBytes() }
        record["x"] = .list([.list([])])
        #expect(throws: RecordZoneError.self) { try record.canonicalBytes() }
        record["x"] = nil
        record.recordType = ""
        #expect(throws: RecordZoneError.self) { try record.canonicalBytes() }
    }

    @Test func recordsOverOneMebibyteAreRefused() throws {
        var record = Record(id: try RecordID(zone: notes, name: "big"), type: "T")
        record["blob"] = .bytes(Data(count: Record.maximumEncodedSize))
        #expect { try record.sign(with: Keys.alice, clock: RecordClock(rawValue: 1)) } throws: { error in
            (error as? RecordZoneError)?.code == .limitExceeded
        }
        #expect(throws: RecordDecodingError.tooLarge(size: Record.maximumEncodedSize + 1)) {
            try Record(canonical: Data(count: Record.maximumEncodedSize + 1))
        }
    }

    @Test func namesAreValidated() {
        #expect(throws: RecordZoneError.self) { try RecordID(zone: "z", name: "") }
        #expect(throws: RecordZoneError.self) { try RecordID(zone: "z", name: "_system") }
        #expect(throws: RecordZoneError.self) { try RecordID(zone: "z", name: String(repeating: "x", count: 256)) }
        #expect(throws: RecordZoneError.self) { try RecordID(zone: "z", name: "a\nb") }
        #expect(throws: RecordZoneError.self) { try ZoneName("../etc") }
        #expect(throws: RecordZoneError.self) { try ZoneName("a/b") }
        #expect(throws: RecordZoneError.self) { try ZoneName(".hidden") }
        #expect((try? RecordID(zone: "conv-alice-bob", name: "msg 1 ✓")) != nil)
    }

    @Test func jsonFormRoundTripsAndRejectsBadInput() throws {
        let record = try sample()
        let json = try record.json()
        let decoded = try Record(json: json)
        #expect(decoded == record)
        #expect(decoded.hasValidSignature())
        let text = String(decoding: json, as: UTF8.self)
        #expect(text.contains("\"string\":\"héllo ✓\""))
        for bad in ["{}", "[]", "{\"zone\":\"z\",\"name\":\"_x\",\"type\":\"T\"}",
                    "{\"zone\":\"z\",\"name\":\"x\",\"type\":\"T\",\"fields\":{\"a\":{\"int\":1,\"string\":\"x\"}}}",
                    "{\"zone\":\"z\",\"name\":\"x\",\"type\":\"T\",\"fields\":{\"a\":{\"int\":1e400}}}",
                    "{\"zone\":\"z\",\"name\":\"x\",\"type\":\"T\",\"author\":\"not base64!\"}", "\u{FF}"] {
            #expect(throws: RecordZoneError.self) { try Record(json: Data(bad.utf8)) }
        }
    }

    @Test func hybridLogicalClockAlwaysIncreases() {
        let wall = WallClock(start: 1000)
        let clock = HybridLogicalClock(wallMilliseconds: { wall.now })
        let first = clock.now()
        wall.set(500)  // the wall clock steps back
        let second = clock.now()
        #expect(second > first)
        clock.observe(RecordClock(milliseconds: 5000, counter: 7))
        #expect(clock.now() > RecordClock(milliseconds: 5000, counter: 7))
        wall.set(9000)
        #expect(clock.now().milliseconds == 9000)
    }
}

final class WallClock: @unchecked Sendable {
    private let lock = NSLock()
    private var value: UInt64
    init(start: UInt64) { value = start }
    var now: UInt64 { lock.withLock { value } }
    func set(_ v: UInt64) { lock.withLock { value = v } }
}

/// Record names, types and field keys have one spelling (Unicode NFC): Swift compares text by
/// canonical equivalence and a server by bytes, so `é` (C3 A9) and `e`+U+0301 (65 CC 81) would
/// be one key to one reader and two to another. Refused with a reason that says so.
@Suite struct NormalFormTests {
    /// Canonical bytes written by hand: a record `z/n` of type `T`, unsigned, with these fields
    /// (key bytes, string value), in the order given.
    static func bytes(name: [UInt8] = Array("n".utf8), fields: [([UInt8], String)]) -> Data {
        var out: [UInt8] = Array("CKR".utf8) + [1]
        func u16(_ v: Int) { out += [UInt8(v >> 8), UInt8(v & 0xFF)] }
        func u32(_ v: Int) { out += [0, 0, UInt8(v >> 8), UInt8(v & 0xFF)] }
        u16(1); out += Array("z".utf8)
        u16(name.count); out += name
        u16(1); out += Array("T".utf8)
        out += [0] + Array(repeating: 0, count: 8) + [0]
        u32(fields.count)
        for (key, value) in fields {
            u16(key.count); out += key
            out += [1]; u32(value.utf8.count); out += Array(value.utf8)
        }
        out += [0]
        return Data(out)
    }

    static let composed: [UInt8] = [0xC3, 0xA9], decomposed: [UInt8] = [0x65, 0xCC, 0x81]

    @Test func aComposedKeyDecodesAndADecomposedOneIsRefusedAsNotNFC() throws {
        let record = try Record(canonical: Self.bytes(fields: [(Self.composed, "a")]))
        #expect(record["\u{E9}"] == .string("a"))
        #expect(throws: RecordDecodingError.notNormalized(what: "field name")) { try Record(canonical: Self.bytes(fields: [(Self.decomposed, "a")])) }
        // Both spellings, in byte order: refused for the spelling, not as a repeat.
        #expect(throws: RecordDecodingError.notNormalized(what: "field name")) {
            try Record(canonical: Self.bytes(fields: [(Self.decomposed, "a"), (Self.composed, "b")]))
        }
    }

    @Test func namesAndKeysNotInNFCAreRefusedWhereverRecordsAreMade() throws {
        #expect { try Record(canonical: Self.bytes(name: Array("caf".utf8) + Self.decomposed, fields: [])) } throws: { error in
            if case .invalidName(let why) = error as? RecordDecodingError { return why.contains("NFC") }
            return false
        }
        #expect { try RecordID(zone: "z", name: "cafe\u{301}") } throws: { ($0 as? RecordZoneError)?.code == .invalidArguments }
        #expect(try RecordID(zone: "z", name: "caf\u{E9}").name == "caf\u{E9}")
        let record = Record(id: try RecordID(zone: "z", name: "n"), type: "T", fields: ["e\u{301}": .string("a")])
        #expect { try record.encoded() } throws: { ($0 as? RecordZoneError)?.code == .invalidArguments }
    }
}
