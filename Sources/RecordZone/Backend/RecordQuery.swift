import Foundation

/// A query over the live records of one type in one zone: predicates, a sort, and pages.
///
/// ```swift
/// let query = RecordQuery(zone: speakers, recordType: "Speaker",
///                         predicates: [.contains("tags", .string("swift"))],
///                         sort: [.init("name")])
/// let page = try await backend.query(query, cursor: nil, limit: 50)
/// ```
public struct RecordQuery: Sendable, Hashable {
    public enum Predicate: Sendable, Hashable {
        /// The field equals the value.
        case equals(String, FieldValue)
        /// The list field holds the value.
        case contains(String, FieldValue)
        /// The field (an int or a date) lies in lower...upper; either bound may be open.
        case range(String, lower: FieldValue?, upper: FieldValue?)

        func matches(_ record: Record) -> Bool {
            switch self {
            case .equals(let field, let value):
                return record[field].map { $0.isCanonicallyEqual(to: value) } ?? false
            case .contains(let field, let value):
                return record[field]?.listValue?.contains { $0.isCanonicallyEqual(to: value) } ?? false
            case .range(let field, let lower, let upper):
                guard let v = record[field] else { return false }
                switch v {
                case .int, .date, .double: break
                default: return false
                }
                if let lower, v < lower { return false }
                if let upper, upper < v { return false }
                return true
            }
        }
    }

    public struct Sort: Sendable, Hashable, Codable {
        public var field: String
        public var ascending: Bool
        public init(_ field: String, ascending: Bool = true) {
            self.field = field
            self.ascending = ascending
        }
    }

    public var zone: ZoneName
    public var recordType: String
    public var predicates: [Predicate]
    /// Sort keys in order; ties (and an empty sort) fall back to the record name.
    public var sort: [Sort]

    public init(zone: ZoneName, recordType: String, predicates: [Predicate] = [], sort: [Sort] = []) {
        self.zone = zone
        self.recordType = recordType
        self.predicates = predicates
        self.sort = sort
    }
}

/// An opaque position after the last record of a query page.
public struct QueryCursor: Hashable, Sendable, Codable {
    public let data: Data
    public init(data: Data) { self.data = data }
}

/// One page of query results.
public struct QueryResult: Sendable {
    public var records: [Record]
    /// Pass it back for the next page; nil when this was the last.
    public var cursor: QueryCursor?

    public init(records: [Record], cursor: QueryCursor?) {
        self.records = records
        self.cursor = cursor
    }
}

extension RecordQuery {
    /// Runs the query over a zone's winning versions. Shared by every backend that holds its
    /// records in memory, so all sort, filter and page the same way.
    package func run(over winners: some Sequence<Record>, cursor: QueryCursor?, limit: Int) throws(RecordZoneError) -> QueryResult {
        let limit = BackendLimits.clampPage(limit)
        var matches = winners.filter { r in
            !r.isDeleted && r.recordType == recordType && r.id.zone == zone && predicates.allSatisfy { $0.matches(r) }
        }
        matches.sort { precedes(key(of: $0), key(of: $1)) }
        var start = 0
        if let cursor {
            let after = try decode(cursor)
            start = matches.firstIndex { precedes(after, key(of: $0)) } ?? matches.count
        }
        let page = Array(matches[start..<min(matches.count, start + limit)])
        let hasMore = start + page.count < matches.count
        return QueryResult(records: page, cursor: hasMore ? page.last.map { encode(key(of: $0)) } : nil)
    }

    private typealias SortKey = (values: [FieldValue?], name: String)

    private func key(of record: Record) -> SortKey {
        (sort.map { record[$0.field] }, record.id.name)
    }

    private func precedes(_ a: SortKey, _ b: SortKey) -> Bool {
        for (index, descriptor) in sort.enumerated() {
            let x = a.values[index], y = b.values[index]
            if x == y || (x != nil && y != nil && x!.isCanonicallyEqual(to: y!)) { continue }
            let less: Bool
            switch (x, y) {
            case (nil, _): less = true
            case (_, nil): less = false
            case (let x?, let y?): less = x < y
            }
            return descriptor.ascending ? less : !less
        }
        return a.name.utf8.lexicographicallyPrecedes(b.name.utf8)
    }

    private func encode(_ key: SortKey) -> QueryCursor {
        var w = ByteWriter()
        w.u8(1)
        w.string16(key.name)
        w.u16(UInt16(key.values.count))
        for value in key.values {
            if let value, (try? w.value(value, allowList: true, field: "cursor", id: nil)) != nil {
                continue
            }
            w.u8(0)  // absent
        }
        return QueryCursor(data: Data(w.bytes))
    }

    private func decode(_ cursor: QueryCursor) throws(RecordZoneError) -> SortKey {
        let key: SortKey? = cursor.data.withUnsafeBytes { raw in
            var r = ByteReader(raw)
            guard (try? r.u8()) == 1, let name = try? r.string16(what: "cursor"), let count = try? r.u16(),
                Int(count) == sort.count
            else { return nil }
            var values = [FieldValue?]()
            for _ in 0..<count {
                guard r.remaining > 0 else { return nil }
                if r.bytes[r.offset] == 0 {
                    r.offset += 1
                    values.append(nil)
                } else {
                    guard let v = try? r.value(allowList: true, field: "cursor") else { return nil }
                    values.append(v)
                }
            }
            return r.remaining == 0 ? (values, name) : nil
        }
        guard let key else { throw RecordZoneError(.invalidArguments, "query cursor does not belong to this query") }
        return key
    }
}
