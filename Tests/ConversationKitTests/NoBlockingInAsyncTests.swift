import Foundation
import Testing

/// No async function in Sources/ reaches a call that blocks its thread on a dispatch queue
/// (`DispatchQueue.sync`, `DatabaseQueue.readNow`/`writeNow`): such a call holds one of the
/// cooperative pool's few threads (two on a two-core machine) for as long as a disk, a lock or
/// another process takes.
///
/// The compiler checks half of it: the store's synchronous `read` is `noasync`, and its async
/// overload is what an async function gets. This test reads the source for the rest: it finds
/// every synchronous function that blocks (directly, or by calling one that does, to any
/// depth), and fails for an async function or task body that calls one by name — unless an
/// async function of the same name exists, which the compiler picks in an async context.
@Suite struct NoBlockingInAsyncTests {
    /// A function: its type (the innermost type or extension declaring it; "" at file scope),
    /// name, whether it is async, and its body (comments and strings taken out).
    struct Function {
        let type: String, name: String, isStatic: Bool, isAsync: Bool, body: Substring, file: String, module: String
        var key: String { type + (isStatic ? "::" : ".") + name }
    }

    /// `DispatchQueue.sync` (with a trailing closure or `execute:`) and the database queue's
    /// synchronous doors.
    static let primitives = [#"\.sync\s*(\{|\(\s*execute)"#, #"\breadNow\s*[({]"#, #"\bwriteNow\s*[({]"#]
    /// The store's objects by the names its code gives them.
    static let receivers = ["store": "ConversationStore", "database": "StoreDatabase", "engine": "SyncEngine",
                            "applier": "RecordApplier", "queue": "DatabaseQueue"]

    @Test func noAsyncFunctionReachesABlockingCall() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let sources = root.appendingPathComponent("Sources")
        var functions = [Function]()
        let files = FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL }.filter { $0.pathExtension == "swift" } ?? []
        #expect(files.count > 50, "the sources were not found at \(sources.path)")
        for file in files {
            let text = Self.code(try String(contentsOf: file, encoding: .utf8))
            let module = file.pathComponents.dropFirst(sources.pathComponents.count).first ?? ""
            functions += Self.functions(in: text, file: file.lastPathComponent, module: module)
        }
        #expect(functions.count > 500)
        let declared = Set(functions.map(\.key))
        let asyncKeys = Set(functions.filter(\.isAsync).map(\.key))

        // Synchronous functions that block, to a fixed point, with why.
        var because = [String: String]()
        var changed = true
        while changed {
            changed = false
            for function in functions where !function.isAsync && because[function.key] == nil {
                if Self.matches(Self.primitives, function.body) {
                    because[function.key] = "\(function.file): blocks on a queue"
                } else if let callee = Self.calls(in: function, declared: declared).first(where: { because[$0] != nil }) {
                    because[function.key] = "calls \(callee)"
                } else {
                    continue
                }
                changed = true
            }
        }
        // The test sees what it must: the primitives' homes block, and the store's synchronous API.
        #expect(["DatabaseQueue.readNow", "DatabaseQueue.writeNow", "StoreDatabase.read", "ConversationStore.messages", "ConversationStore.message",
                 "ConversationStore.conversations", "ConversationStore.search"].allSatisfy { because[$0] != nil })

        var found = [String]()
        for function in functions.filter(\.isAsync) + Self.taskBodies(functions) {
            if Self.matches(Self.primitives, function.body) { found.append("\(function.file) \(function.key): blocks on a queue") }
            // An async overload is what the compiler picks in an async context.
            for callee in Self.calls(in: function, declared: declared) where because[callee] != nil && !asyncKeys.contains(callee) {
                var chain = [callee], next = callee
                while let reason = because[next], chain.count < 12 {
                    chain.append(reason)
                    guard reason.hasPrefix("calls ") else { break }
                    next = String(reason.dropFirst(6))
                }
                found.append("\(function.file) \(function.key) calls " + chain.joined(separator: " → "))
            }
        }
        #expect(found.isEmpty, "\(found.joined(separator: "\n"))")
    }

    static let callPattern = try? NSRegularExpression(pattern: #"(?<![.\w])(?:(self|Self|store|database|engine|applier|queue)\s*\.\s*)?([A-Za-z_]\w*)\s*[({]"#)

    /// The declared functions `function` calls: unqualified or on `self` (its own type's, or
    /// one at file scope), or on one of the store's objects by name. A call on any other value
    /// (`db.first`, `continuation.finish`) is of a type this reading does not know.
    /// `Self.name(` is a static function; an unqualified call is one of either kind, told
    /// apart when both exist by whether it passes a connection (`db`): the static helpers take
    /// one, the instance API reads through the store's own.
    static func calls(in function: Function, declared: Set<String>) -> [String] {
        guard let pattern = callPattern else { return [] }
        let text = String(function.body)
        return pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)).compactMap { match -> String? in
            guard let nameRange = Range(match.range(at: 2), in: text), let whole = Range(match.range, in: text),
                  !text[..<nameRange.lowerBound].hasSuffix("func ") else { return nil }
            // `for x in name {`, `if name {`: a value before a block, not a trailing closure.
            if text[text.index(before: whole.upperBound)] == "{",
               text[..<whole.lowerBound].range(of: #"\b(in|if|while|where|switch|guard|return|else)\s+$"#, options: .regularExpression) != nil {
                return nil
            }
            let name = String(text[nameRange])
            let receiver = Range(match.range(at: 1), in: text).map { String(text[$0]) }
            let instance = (receiver.flatMap { receivers[$0] } ?? function.type) + "." + name
            let isStatic = (receiver.flatMap { receivers[$0] } ?? function.type) + "::" + name
            switch receiver {
            case "Self"?: return declared.contains(isStatic) ? isStatic : nil
            case nil:
                let arguments = text[text.index(before: whole.upperBound)...].prefix(120)
                let passesConnection = arguments.range(of: #"^\(([^()]*\bdb\b|[^()]*\.db\b)"#, options: .regularExpression) != nil
                if function.isStatic { return declared.contains(isStatic) ? isStatic : nil }
                switch (declared.contains(instance), declared.contains(isStatic)) {
                case (true, true): return passesConnection ? isStatic : instance
                case (true, false): return instance
                case (false, true): return isStatic
                case (false, false): return declared.contains("." + name) ? "." + name : nil
                }
            default: return declared.contains(instance) ? instance : nil
            }
        }
    }

    static func matches(_ patterns: [String], _ body: Substring) -> Bool {
        patterns.contains { body.range(of: $0, options: .regularExpression) != nil }
    }

    /// The bodies of `Task { }`, `Task.detached { }` and `addTask { }` closures: async, even
    /// inside a synchronous function.
    static func taskBodies(_ functions: [Function]) -> [Function] {
        functions.flatMap { function -> [Function] in
            let text = function.body
            var bodies = [Function]()
            var search = text.startIndex
            while let range = text.range(of: #"\b(Task(\.detached)?|addTask(UnlessCancelled)?)\s*(\([^)]*\))?\s*\{"#, options: .regularExpression, range: search..<text.endIndex) {
                let open = text.index(before: range.upperBound)
                guard let close = matchingBrace(text, from: open) else { break }
                bodies.append(Function(type: function.type, name: function.name + " (a task)", isStatic: function.isStatic, isAsync: true, body: text[open...close],
                                       file: function.file, module: function.module))
                search = range.upperBound
            }
            return bodies
        }
    }

    /// Every `func` with its type and body.
    static func functions(in text: String, file: String, module: String) -> [Function] {
        // The types and extensions with the span of their bodies: a function's is the innermost.
        var types = [(name: String, body: Range<String.Index>)]()
        var search = text.startIndex
        while let range = text.range(of: #"\b(extension|struct|class|actor|enum|protocol)\s+[A-Za-z_][A-Za-z0-9_.]*"#, options: .regularExpression, range: search..<text.endIndex) {
            search = range.upperBound
            guard let open = text[range.upperBound...].firstIndex(where: { $0 == "{" || $0 == "}" || $0 == "=" || $0 == "\n" && false }),
                  text[open] == "{", let close = matchingBrace(Substring(text), from: open) else { continue }
            let name = String(text[range].split(separator: " ").last?.split(separator: ".").last ?? "")
            types.append((name, open..<close))
        }
        var result = [Function]()
        search = text.startIndex
        while let range = text.range(of: #"\bfunc\s+[A-Za-z_][A-Za-z0-9_]*"#, options: .regularExpression, range: search..<text.endIndex) {
            let name = String(text[range].split(separator: " ").last ?? "")
            search = range.upperBound
            // The signature runs to the body's brace outside parentheses (a protocol's
            // requirement has none: the next declaration or the closing brace comes first).
            var depth = 0
            var index = range.upperBound
            var open: String.Index?
            while index < text.endIndex {
                let character = text[index]
                if character == "(" || character == "[" { depth += 1 }
                if character == ")" || character == "]" { depth -= 1 }
                if depth == 0, character == "{" { open = index; break }
                if depth == 0, character == "}" || text[index...].hasPrefix("func ") || text[index...].hasPrefix("var ") { break }
                index = text.index(after: index)
            }
            guard let open, let close = matchingBrace(Substring(text), from: open) else { continue }
            let signature = text[range.upperBound..<open]
            let isAsync = signature.range(of: #"\)\s*(async|reasync)\b"#, options: .regularExpression) != nil
            let type = types.filter { $0.body.contains(range.lowerBound) }.min { $0.body.count(in: text) < $1.body.count(in: text) }?.name ?? ""
            let line = text[..<range.lowerBound].split(separator: "\n", omittingEmptySubsequences: false).last ?? ""
            let isStatic = line.range(of: #"\b(static|class)\b"#, options: .regularExpression) != nil
            result.append(Function(type: type, name: name, isStatic: isStatic, isAsync: isAsync, body: text[open...close], file: file, module: module))
        }
        return result
    }

    static func matchingBrace(_ text: Substring, from open: String.Index) -> String.Index? {
        var depth = 0
        var index = open
        while index < text.endIndex {
            if text[index] == "{" { depth += 1 }
            if text[index] == "}" { depth -= 1; if depth == 0 { return index } }
            index = text.index(after: index)
        }
        return nil
    }

    /// The source without comments and without the contents of string literals (so a brace or
    /// a name in either counts for nothing); interpolations are kept out too.
    static func code(_ source: String) -> String {
        var out = String.UnicodeScalarView()
        let scalars = Array(source.unicodeScalars)
        var index = 0
        func at(_ offset: Int) -> Unicode.Scalar? { index + offset < scalars.count ? scalars[index + offset] : nil }
        while index < scalars.count {
            let scalar = scalars[index]
            if scalar == "/", at(1) == "/" {
                while index < scalars.count, scalars[index] != "\n" { index += 1 }
            } else if scalar == "/", at(1) == "*" {
                var depth = 0
                repeat {
                    if scalars[index] == "/", at(1) == "*" { depth += 1; index += 2; continue }
                    if scalars[index] == "*", at(1) == "/" { depth -= 1; index += 2; continue }
                    index += 1
                } while index < scalars.count && depth > 0
            } else if scalar == "\"" {
                let hashes = out.reversed().prefix { $0 == "#" }.count
                let triple = at(1) == "\"" && at(2) == "\""
                index += triple ? 3 : 1
                out.append("\"")
                let closing = String(repeating: "\"", count: triple ? 3 : 1) + String(repeating: "#", count: hashes)
                let closer = Array(closing.unicodeScalars)
                while index < scalars.count {
                    if scalars[index] == "\\", hashes == 0, at(1) == "(" {
                        // An interpolation: to its closing parenthesis, over any string in it.
                        var depth = 0
                        repeat {
                            if scalars[index] == "(" { depth += 1 }
                            if scalars[index] == ")" { depth -= 1 }
                            if scalars[index] == "\"", index > 0, scalars[index - 1] != "\\" {
                                index += 1
                                while index < scalars.count, scalars[index] != "\"" { index += scalars[index] == "\\" ? 2 : 1 }
                            }
                            index += 1
                        } while index < scalars.count && depth > 0
                        continue
                    }
                    if scalars[index] == "\\", hashes == 0 { index += 2; continue }
                    if Array(scalars[index..<min(scalars.count, index + closer.count)]) == closer { index += closer.count; break }
                    if scalars[index] == "\n" { out.append("\n") }
                    index += 1
                }
                out.append("\"")
            } else {
                out.append(scalar)
                index += 1
            }
        }
        return String(out)
    }
}

extension Range<String.Index> {
    func count(in text: String) -> Int { text.distance(from: lowerBound, to: upperBound) }
}
