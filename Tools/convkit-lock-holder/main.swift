// convkit-lock-holder: takes the write lock of SQLite databases (BEGIN IMMEDIATE) as another
// process would — a backup tool, a second program, a stuck writer — prints "locked", holds it
// for a while (or until a file appears), then lets go. The tests run it to show that a store or server whose writes wait
// for the lock keeps serving reads and requests meanwhile.
import Foundation
import SQLiteKit
import ToolSupport

let command = Command(
    "convkit-lock-holder", "Hold the write lock of SQLite databases for a while.",
    synopsis: "--seconds <s> --database <path> [--second-database <path>] [--until-file <path>]",
    options: [
        .valued("seconds", "s", "How long to hold the locks (at most, with --until-file)."),
        .valued("until-file", "path", "Let go as soon as this file exists."),
        .valued("database", "path", "A SQLite database to lock."),
        .valued("second-database", "path", "Another one, locked too."),
    ])
let usage = command.help

let options = parseOrExit(Array(CommandLine.arguments.dropFirst()), command, tool: "convkit-lock-holder")
guard let seconds = options.value("seconds").flatMap(Double.init), seconds >= 0, let first = options.value("database") else {
    exitWithError("--seconds and --database are required", help: usage, tool: "convkit-lock-holder")
}
do {
    let databases = try ([first] + (options.value("second-database").map { [$0] } ?? [])).map { path throws(SQLiteError) in try Database(path: path) }
    for database in databases { try database.execute("BEGIN IMMEDIATE") }
    FileHandle.standardOutput.write(Data("locked\n".utf8))
    let deadline = Date().addingTimeInterval(seconds)
    if let file = options.value("until-file") {
        while Date() < deadline, !FileManager.default.fileExists(atPath: file) { Thread.sleep(forTimeInterval: 0.01) }
    } else {
        Thread.sleep(forTimeInterval: seconds)
    }
    for database in databases { try database.execute("ROLLBACK") }
    FileHandle.standardOutput.write(Data("released\n".utf8))
} catch {
    exitWithError("\(error)", help: nil, tool: "convkit-lock-holder")
}
