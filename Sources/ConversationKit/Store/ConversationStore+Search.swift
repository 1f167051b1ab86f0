import Foundation
import SQLiteKit

/// Full-text search over this store's messages as it shows them (opened, not deleted), through
/// SQLite's FTS5 (`unicode61` words, diacritics folded: "cafe" finds "café"; no word splitting
/// for scripts written without spaces). The index is fed in batches and a search matches the
/// messages not indexed yet on its own (``SearchIndex``, docs/STORE.md).
extension ConversationStore {
    /// The messages holding every word of `query`, best first (FTS5's bm25), each with a snippet
    /// around the words, marked `[…]`. The words are matched as words, never as FTS5 syntax.
    /// - Parameters:
    ///   - conversation: only this conversation's (a pair's or a group's id).
    ///   - speaker: only what this speaker said.
    /// - Throws: ``ConversationError/Code/emptyContent`` for a query without a word.
    public func search(_ query: String, in conversation: String? = nil, from speaker: String? = nil, limit: Int = 20) throws(ConversationError) -> [SearchHit] {
        let words = query.split(whereSeparator: { $0.isWhitespace }).map { "\"" + $0.replacingOccurrences(of: "\"", with: "\"\"") + "\"" }
        guard !words.isEmpty else { throw ConversationError(.emptyContent, "a search needs a word") }
        return try read { db in
            let hits = try SearchIndex.search(words.joined(separator: " "), zone: conversation, speaker: speaker, limit: limit, in: db)
            // The hits' rows in one statement, in the hits' order (a row is there: the search
            // and this read are one transaction).
            let rowids = "[" + hits.map { String($0.rowid) }.joined(separator: ",") + "]"
            let messages = try Self.messages(db, "JOIN json_each(?) hit ON messages.rowid = hit.value ORDER BY hit.key", [rowids], capacity: hits.count)
            return zip(messages, hits).map { SearchHit(message: $0, snippet: $1.snippet) }
        }
    }
}

/// A message found by ``ConversationStore/search(_:in:from:limit:)``.
public struct SearchHit: Sendable, Hashable {
    public let message: Message
    /// The words around the match, the matched words in `[…]`.
    public let snippet: String
}
