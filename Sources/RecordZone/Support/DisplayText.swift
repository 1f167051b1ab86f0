/// Text from someone else made safe to show a person: every character that could change how a
/// terminal, a log viewer or a page shows the text around it is replaced by a visible
/// `<U+XXXX>`, and nothing else changes.
///
/// Records keep what was signed, byte for byte; this is for the moment a person reads it (the
/// tools use it for every line they print, and apps should for their UIs). Made visible:
/// - C0 and C1 controls and DEL (`ESC`, `CR`, `LF`, `BS`, …): cursor moves, line rewrites,
///   screen clears, colours, terminal queries;
/// - bidirectional formatting: the embeddings, overrides and isolates U+202A–U+202E,
///   U+2066–U+2069, the marks U+200E, U+200F, U+061C (the "Trojan Source" set);
/// - every other invisible format character (general category Cf: zero-width space, word
///   joiner, soft hyphen, byte-order mark, tag characters, …) and the line and paragraph
///   separators U+2028, U+2029.
///
/// Kept as they are: the zero-width non-joiner and joiner (U+200C, U+200D), which Persian,
/// Indic scripts and emoji sequences need, and every visible character.
///
/// ```swift
/// DisplayText.safe("hi\r\u{1B}[2KBob: …")  // "hi<U+000D><U+001B>[2KBob: …"
/// ```
public enum DisplayText {
    /// `text` with every unsafe character (``isUnsafe(_:)``) shown as `<U+XXXX>`; the same
    /// string when it holds none.
    public static func safe(_ text: some StringProtocol) -> String {
        guard text.unicodeScalars.contains(where: isUnsafe) else { return String(text) }
        var out = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            if isUnsafe(scalar) {
                out.append(contentsOf: visible(scalar).unicodeScalars)
            } else {
                out.append(scalar)
            }
        }
        return String(out)
    }

    /// Whether `scalar` is one ``safe(_:)`` makes visible.
    public static func isUnsafe(_ scalar: Unicode.Scalar) -> Bool {
        if scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) { return true }
        if scalar.value < 0xA0 { return false }
        switch scalar.properties.generalCategory {
        case .control, .lineSeparator, .paragraphSeparator: return true
        case .format: return scalar.value != 0x200C && scalar.value != 0x200D
        default: return false
        }
    }

    /// `<U+XXXX>`: at least four hex digits, upper case.
    static func visible(_ scalar: Unicode.Scalar) -> String {
        let hex = String(scalar.value, radix: 16, uppercase: true)
        return "<U+" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex + ">"
    }
}
