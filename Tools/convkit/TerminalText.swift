import CTerminal
import RecordZone

/// Text laid out by terminal columns: what the chat view draws, one styled character a cell.
struct Cell: Equatable {
    let character: Character
    /// The columns it takes: 0 (a combining mark on its own), 1, or 2 (CJK, most emoji).
    let width: Int
    let style: Int32
}

enum TerminalText {
    /// `text` made safe (``DisplayText/safe(_:)``: no control, escape or bidi character
    /// survives) as cells in `style`; a character the terminal could not print (an unassigned
    /// code point) shows as U+FFFD.
    static func cells(_ text: some StringProtocol, _ style: Int32 = 0) -> [Cell] {
        DisplayText.safe(text).map { character in
            var width = 0
            for scalar in character.unicodeScalars {
                let columns = Int(ck_terminal_scalar_width(scalar.value))
                guard columns >= 0 else { return Cell(character: "\u{FFFD}", width: 1, style: style) }
                width += columns
            }
            return Cell(character: character, width: width, style: style)
        }
    }

    static func width(_ cells: [Cell]) -> Int { cells.reduce(0) { $0 + $1.width } }

    /// `cells` cut into rows of at most `width` columns, at the last space that fits where
    /// there is one; every row after the first starts with `indent` spaces.
    static func wrap(_ cells: [Cell], width: Int, indent: Int = 0) -> [[Cell]] {
        let indent = min(indent, max(0, width / 2))
        let margin = Array(repeating: Cell(character: " ", width: 1, style: 0), count: indent)
        var rows: [[Cell]] = [], row: [Cell] = [], used = 0, start = 0
        for cell in cells {
            if used + cell.width > width, row.count > start {
                // Back to the last space after the row's start, when there is one.
                let space = row[start...].lastIndex { $0.character == " " }
                var carried: [Cell] = []
                if let space, space > start {
                    carried = Array(row[(space + 1)...])
                    row.removeSubrange(space...)
                }
                rows.append(row)
                row = margin + carried
                start = indent
                used = Self.width(row)
            }
            row.append(cell)
            used += cell.width
        }
        rows.append(row)
        return rows
    }

    /// The cells of `row` that fit in `width` columns.
    static func clip(_ row: [Cell], to width: Int) -> [Cell] {
        var used = 0, count = 0
        for cell in row {
            guard used + cell.width <= width else { break }
            used += cell.width
            count += 1
        }
        return Array(row.prefix(count))
    }

    /// Draws `row` at a row and column: one call per run of one style.
    static func draw(_ row: [Cell], at line: Int, column: Int) {
        var x = column, index = row.startIndex
        while index < row.endIndex {
            let style = row[index].style
            var run = "", width = 0
            while index < row.endIndex, row[index].style == style {
                run.append(row[index].character)
                width += row[index].width
                index += 1
            }
            ck_terminal_put(Int32(line), Int32(x), run, Output.colors.load(ordering: .relaxed) ? style : 0)
            x += width
        }
    }
}

/// The line being typed: a cursor, editing keys as a shell's (readline's) and a history.
struct LineEditor {
    private(set) var characters: [Character] = []
    /// Where the cursor is, in characters.
    private(set) var cursor = 0
    private var history: [String] = []
    /// While going through the history: which entry shows, and what was typed before.
    private var recalled: Int?
    private var typed: [Character] = []

    var text: String { String(characters) }
    var isEmpty: Bool { characters.isEmpty }

    mutating func insert(_ text: String) {
        let before = String(characters[..<cursor]) + text
        // Joined again as one string: a combining mark typed after its base becomes one character.
        characters = Array(before + String(characters[cursor...]))
        cursor = min(before.count, characters.count)
    }

    mutating func backspace() {
        guard cursor > 0 else { return }
        characters.remove(at: cursor - 1)
        cursor -= 1
    }

    mutating func deleteForward() {
        guard cursor < characters.count else { return }
        characters.remove(at: cursor)
    }

    mutating func left() { cursor = max(0, cursor - 1) }
    mutating func right() { cursor = min(characters.count, cursor + 1) }
    mutating func home() { cursor = 0 }
    mutating func end() { cursor = characters.count }

    /// To the start of this word (or the one before).
    mutating func wordLeft() {
        while cursor > 0, characters[cursor - 1].isWhitespace { cursor -= 1 }
        while cursor > 0, !characters[cursor - 1].isWhitespace { cursor -= 1 }
    }

    mutating func wordRight() {
        while cursor < characters.count, characters[cursor].isWhitespace { cursor += 1 }
        while cursor < characters.count, !characters[cursor].isWhitespace { cursor += 1 }
    }

    /// Ctrl-W: the word before the cursor.
    mutating func deleteWordBack() {
        let end = cursor
        wordLeft()
        characters.removeSubrange(cursor..<end)
    }

    /// Ctrl-K and Ctrl-U.
    mutating func deleteToEnd() { characters.removeSubrange(cursor...) }
    mutating func deleteToStart() {
        characters.removeSubrange(..<cursor)
        cursor = 0
    }

    /// Up: the entry before in the history (the first time, the newest).
    mutating func previous() {
        guard !history.isEmpty else { return }
        if recalled == nil { typed = characters }
        let index = max(0, (recalled ?? history.count) - 1)
        recalled = index
        show(Array(history[index]))
    }

    /// Down: the entry after, and past the newest what was being typed.
    mutating func next() {
        guard let index = recalled else { return }
        if index + 1 < history.count {
            recalled = index + 1
            show(Array(history[index + 1]))
        } else {
            recalled = nil
            show(typed)
        }
    }

    /// The line, kept in the history (not twice in a row), and a new empty one.
    mutating func take() -> String {
        let line = text
        if !line.isEmpty, history.last != line { history.append(line) }
        if history.count > 500 { history.removeFirst() }
        recalled = nil
        show([])
        return line
    }

    private mutating func show(_ line: [Character]) {
        characters = line
        cursor = line.count
    }

    /// `text` as the line, the cursor at its end (the history stays).
    mutating func show(_ text: String) {
        recalled = nil
        show(Array(text))
    }
}
