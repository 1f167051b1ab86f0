// convkit-lock-holder: takes the write lock of SQLite databases (BEGIN IMMEDIATE) as another
// process would — a backup tool, a second program, a stuck writer — prints "locked", holds it
// for a while, then lets go. The tests run it to show that a store or server whose writes wait
// for the lock keeps serving reads and requests meanwhile.
import Foundation
import SQLiteKit
import ToolSupport

let usage = """
    OVERVIEW: Hold the write lock of SQLite databases for a while.

    USAGE: convkit-lock-holder --seconds <s> --database <path> [--second-database <path>]

    OPTIONS:
      --seconds <s>              How long to hold the locks.
      --database <path>          A SQLite database to lock.
      --second-database <path>   Another one, locked too.
      -h, --help         Show help information.

    """

let options = parseOrExit(Array(CommandLine.arguments.dropFirst()), valued: ["seconds", "database", "second-database"], help: usage, tool: "convkit-lock-holder").values
guard let seconds = options["seconds"].flatMap(Double.init), seconds >= 0, let first = options["database"] else {
    exitWithError("--seconds and --database are required", help: usage, tool: "convkit-lock-holder")
}
do {
    let databases = try ([first] + (options["second-database"].map { [$0] } ?? [])).map { path throws(SQLiteError) in try Database(path: path) }
    for database in databases { try database.execute("BEGIN IMMEDIATE") }
    FileHandle.standardOutput.write(Data("locked\n".utf8))
    Thread.sleep(forTimeInterval: seconds)
    for database in databases { try database.execute("ROLLBACK") }
    FileHandle.standardOutput.write(Data("released\n".utf8))
} catch {
    exitWithError("\(error)", help: nil, tool: "convkit-lock-holder")
}
