import Foundation

/// Unicode Normalization Form C, for the texts records are keyed by (record names, types, field
/// keys): Swift compares and hashes strings by canonical equivalence, so `é` (U+00E9) and `e`
/// + U+0301 are one dictionary key, while a server compares bytes. Allowing only NFC makes the
/// two agree: two NFC strings are canonically equivalent exactly when their bytes are equal.
enum NormalForm {
    /// Whether `text` is in NFC (ASCII always is: checked without normalizing).
    static func isNFC(_ text: some StringProtocol) -> Bool {
        if text.utf8.allSatisfy({ $0 < 0x80 }) { return true }
        return String(text).precomposedStringWithCanonicalMapping.utf8.elementsEqual(text.utf8)
    }
}
