import Foundation
import RecordZone

/// HTML the console writes: every piece of text from a record, a peer or a request passes
/// ``text(_:)``, the page's one escaping rule — the terminal's (``DisplayText/safe(_:)``: no
/// control, bidi or invisible format character survives) and then HTML's (`& < > " '`), so no
/// record content can open a tag, end an attribute or reorder what a page shows.
enum HTML {
    static func text(_ value: some StringProtocol) -> String {
        var out = ""
        for scalar in DisplayText.safe(value).unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// A path segment or query value: percent-encoded (every byte but letters, digits and
    /// `-._~`), then escaped for the attribute it goes into.
    static func component(_ value: some StringProtocol) -> String {
        let allowed = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")
        return text(String(value).addingPercentEncoding(withAllowedCharacters: allowed) ?? "")
    }

    /// A link: `href` built from already-encoded parts, `label` escaped.
    static func link(_ href: String, _ label: some StringProtocol) -> String { "<a href=\"\(href)\">\(text(label))</a>" }

    /// A table: a header row and rows of cells already made HTML.
    static func table(_ header: [String], _ rows: [[String]], caption: String? = nil) -> String {
        var out = "<table>" + (caption.map { "<caption>\(text($0))</caption>" } ?? "") + "<thead><tr>"
        for cell in header { out += "<th scope=\"col\">\(text(cell))</th>" }
        out += "</tr></thead><tbody>"
        for row in rows { out += "<tr>" + row.map { "<td>\($0)</td>" }.joined() + "</tr>" }
        return out + "</tbody></table>"
    }

    /// Bytes for a person: their size and first bytes in hex (what is sealed stays ciphertext).
    static func bytes(_ data: Data) -> String {
        let head = data.prefix(16).hexString
        return "\(data.count) bytes: \(head)\(data.count > 16 ? "…" : "")"
    }

    /// `application/x-www-form-urlencoded` into names and values.
    static func form(_ body: Data) -> [String: String] {
        var fields = [String: String]()
        for pair in String(decoding: body, as: UTF8.self).split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map { $0.replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? "" }
            if let name = parts.first { fields[name] = parts.count > 1 ? parts[1] : "" }
        }
        return fields
    }
}
