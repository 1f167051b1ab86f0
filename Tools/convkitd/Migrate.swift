import ChatSchema
import Foundation
import RecordZone
import ToolSupport
import ZoneServer

/// Where `convkitd serve` keeps its data: a directory with a SQLite file (one server), or a
/// PostgreSQL database (any number of servers).
enum StorageChoice {
    case sqlite(directory: String)
    case postgres(conninfo: String, poolSize: Int)

    init(_ arguments: ParsedArguments) throws(UsageError) {
        switch (arguments.value("data"), arguments.value("storage")) {
        case (let directory?, nil): self = .sqlite(directory: directory)
        case (nil, let url?):
            self = .postgres(conninfo: try Self.postgresURL(url), poolSize: try arguments.int("pool-size", default: 8, range: 1...1000))
        case (nil, nil): throw UsageError("give --data <dir> or --storage <postgres-url>")
        default: throw UsageError("give one of --data and --storage")
        }
    }

    /// A `postgres://` or `postgresql://` URL, or libpq's `key=value` form.
    static func postgresURL(_ text: String) throws(UsageError) -> String {
        guard text.hasPrefix("postgres://") || text.hasPrefix("postgresql://") || text.contains("=") else {
            throw UsageError("--storage takes a PostgreSQL URL (postgres://user@host:5432/database) or libpq's key=value form")
        }
        return text
    }

    func open() async throws(RecordZoneError) -> any ZoneStorage {
        switch self {
        case .sqlite(let directory):
            try SQLiteZoneStorage(directory: directory, policy: ChatSchema.recordPolicy(), indexedFields: ChatSchema.queryIndexes)
        case .postgres(let conninfo, let poolSize):
            try await PostgresZoneStorage(conninfo: conninfo, poolSize: poolSize, policy: ChatSchema.recordPolicy(), indexedFields: ChatSchema.queryIndexes)
        }
    }
}

let migrateCommand = Command(
    "convkitd migrate", "Copy a SQLite server's data into a PostgreSQL database, verifying every record.",
    discussion: """
        Stop the server first. The PostgreSQL database must hold no zone yet (its schema is made
        here). Key chains, zones (with their incarnations and sequences), deleted zones, records
        (with their sequences) and assets are copied; every record is verified again and every
        asset checked against its hash, and what fails is listed and left behind (exit 1). If
        the copy stops midway, drop and recreate the database and run it again.

        Clients keep their zone tokens: they carry on where they were. Their database-feed tokens
        expire, cleanly: their next look at the feed starts over, once.
        """,
    synopsis: "--from <dir> --storage <postgres-url> [--json]",
    options: [
        .valued("from", "dir", "The SQLite server's data directory (convkitd serve --data) (required)."),
        .valued("storage", "url", "The PostgreSQL database to copy into (required)."),
        .flag("json", "Print the report as JSON."),
    ])
let migrateHelp = migrateCommand.help

func migrate(_ arguments: ParsedArguments) async {
    let directory: String, conninfo: String
    do throws(UsageError) {
        guard let from = arguments.value("from") else { throw UsageError("--from is required") }
        guard let url = arguments.value("storage") else { throw UsageError("--storage is required") }
        directory = from
        conninfo = try StorageChoice.postgresURL(url)
    } catch {
        fail(error.message, usage: migrateHelp)
    }
    let json = arguments.has("json")
    do {
        let storage = try await PostgresZoneStorage(conninfo: conninfo, poolSize: 2, policy: ChatSchema.recordPolicy(), indexedFields: ChatSchema.queryIndexes)
        let report = try await storage.importSQLite(from: directory) { line in
            if !json { FileHandle.standardError.write(Data("copied \(line)\n".utf8)) }
        }
        storage.close()
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
            print(String(decoding: try encoder.encode(report), as: UTF8.self))
        } else {
            print("\(report.zones) zones (\(report.deletedZones) deleted), \(report.records) records, \(report.pins) key chains, \(report.assets) assets copied")
            for line in report.refused { print("refused \(line)") }
            for name in report.corruptAssets { print("corrupt asset \(name)") }
        }
        exit(report.refused.isEmpty && report.corruptAssets.isEmpty ? 0 : 1)
    } catch {
        fail("\(error)", usage: nil)
    }
}
