// convkit-zone-writer: writes signed records into a filesystem zone as one device and prints
// one "ack <record name>" line for each record once its batch is durable. The tests run it as
// a real process: two at once as two devices, a second one as the same device, and one killed
// with SIGKILL mid-write.
import Foundation
import ToolSupport
import RecordZone

let command = Command(
    "convkit-zone-writer", "Write signed test records into a filesystem zone as one device.",
    synopsis: "--root <dir> --device <label> --zone <zone> --count <n> [--state <dir>] [--batch <n>] [--prefix <p>]",
    options: [
        .valued("root", "dir", "The shared zone folder."),
        .valued("device", "label", "The device label to write under."),
        .valued("state", "dir", "The device's local state (its ID, lock and sequences); without it each run is a new device."),
        .valued("zone", "zone", "The zone to write into (created if missing)."),
        .valued("count", "n", "How many records to write."),
        .valued("batch", "n", "Records per segment. (default: 10)"),
        .valued("prefix", "p", "Record name prefix. (default: the device name)"),
    ])
let usage = command.help

func fail(_ message: String, code: Int32) -> Never {
    exitWithError(message, help: code == 64 ? usage : nil, tool: "convkit-zone-writer")
}

let options = parseOrExit(Array(CommandLine.arguments.dropFirst()), command, tool: "convkit-zone-writer")
guard let root = options.value("root"), let device = options.value("device"), let zoneText = options.value("zone"),
    let count = options.value("count").flatMap(Int.init), count >= 0
else { fail("--root, --device, --zone and --count are required", code: 64) }
let batchSize = options.value("batch").flatMap(Int.init) ?? 10
guard batchSize > 0, batchSize <= Record.maximumBatchSize else { fail("--batch must be 1…\(Record.maximumBatchSize)", code: 64) }
let prefix = options.value("prefix") ?? device

do {
    let zone = try ZoneName(zoneText)
    let backend = try FileSystemBackend(root: root, device: device, stateDirectory: options.value("state"))
    try await backend.createZone(zone)
    let key = SigningKey.generate()
    let clock = HybridLogicalClock()
    var written = 0
    while written < count {
        var batch = [Record]()
        for n in written..<min(count, written + batchSize) {
            var record = Record(id: try RecordID(zone: zone, name: "\(prefix)-\(n)"), type: "Item")
            record["n"] = .int(Int64(n))
            record["payload"] = .bytes(Data(repeating: UInt8(n % 256), count: 200))
            try record.sign(with: key, clock: clock.now())
            batch.append(record)
        }
        var acks = ""
        for result in try await backend.save(batch) {
            acks += "ack \(try result.get().id.name)\n"
        }
        FileHandle.standardOutput.write(Data(acks.utf8))
        written += batch.count
    }
} catch {
    fail("\(error)", code: 1)
}
