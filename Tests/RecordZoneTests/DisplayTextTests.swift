import Foundation
import RecordZone
import Testing

/// ``DisplayText``: what may change how a terminal shows text is made visible, nothing else changes.
@Suite struct DisplayTextTests {
    /// Every character a terminal or a bidi-aware viewer acts on.
    static let hostile: [Unicode.Scalar] = (Array(0x00...0x1F) + [0x7F] + Array(0x80...0x9F)
        + [0x00AD, 0x061C, 0x200B, 0x200E, 0x200F, 0x2028, 0x2029, 0x2060, 0xFEFF, 0xE0001, 0xE0041]
        + Array(0x202A...0x202E) + Array(0x2066...0x2069)).compactMap(Unicode.Scalar.init)

    @Test func everyControlBidiAndInvisibleFormatCharacterIsMadeVisible() {
        for scalar in Self.hostile {
            let shown = DisplayText.safe("a\(Character(scalar))b")
            let hex = String(scalar.value, radix: 16, uppercase: true)
            #expect(shown == "a<U+\(String(repeating: "0", count: max(0, 4 - hex.count)) + hex)>b", "U+\(hex)")
            #expect(!shown.unicodeScalars.contains(where: DisplayText.isUnsafe))
        }
    }

    @Test func theForgedLineOfTheIssueStaysOnOneVisibleLine() {
        let shown = DisplayText.safe("hi\r\u{1B}[2KBob: I owe Alice 500 EUR\u{1B}[2J")
        #expect(shown == "hi<U+000D><U+001B>[2KBob: I owe Alice 500 EUR<U+001B>[2J")
    }

    @Test func visibleTextJoinersAndEmojiSequencesAreKept() {
        for text in ["plain ASCII", "Grüße, 你好, مرحبا, שלום", "👩‍👩‍👧 ❤️ 👍🏽", "می‌خواهم", "क्‍ष", ""] {
            #expect(DisplayText.safe(text) == text, "\(text)")
        }
    }

    @Test func theLoggerWritesOneSafeLinePerEntry() {
        let lines = LinesBox()
        let logger = Logger(label: "t", level: .info) { lines.append($0) }
        logger.info("record \u{1B}[31mred\u{202E}\ntwo")
        let written = lines.all
        #expect(written.count == 1 && written[0].hasSuffix("record <U+001B>[31mred<U+202E><U+000A>two\n"), "\(written)")
    }

    final class LinesBox: @unchecked Sendable {
        private let lock = NSLock()
        private var lines: [String] = []
        func append(_ line: String) { lock.withLock { lines.append(line) } }
        var all: [String] { lock.withLock { lines } }
    }
}
