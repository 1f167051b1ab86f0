// convkit-fuzz: libFuzzer targets for the decoders that read untrusted bytes. Built and run by
// `scripts/fuzz.sh` (with `-sanitize=fuzzer,address -D FUZZING`: the program hands its arguments
// to libFuzzer's driver); a plain build makes a program that says so. The target is chosen with
// CONVKIT_FUZZ_TARGET: record (the canonical decoder), token (change tokens), header (request
// Authorization headers), wire (JSON and binary bodies), link (link codes), image (avatar
// capping: PNG and JPEG through libpng and libjpeg-turbo, EXIF, scaling).
import Foundation
import ImageKit
import RecordZone

let fuzzTarget = ProcessInfo.processInfo.environment["CONVKIT_FUZZ_TARGET"] ?? "record"
let fuzzTargets: Set<String> = ["record", "token", "header", "wire", "link", "image"]
guard fuzzTargets.contains(fuzzTarget) else {
    FileHandle.standardError.write(Data("convkit-fuzz: unknown CONVKIT_FUZZ_TARGET '\(fuzzTarget)'; one of \(fuzzTargets.sorted())\n".utf8))
    exit(64)
}

func convkitFuzz(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Data(bytes: $0, count: size) } ?? Data()
    switch fuzzTarget {
    case "record":
        if let record = try? Record(canonical: bytes) {
            // Whatever decodes re-encodes to exactly the same bytes, and JSON round-trips. A
            // failure crashes on purpose: that is how libFuzzer reports (and saves) the input.
            guard (try? record.encoded()) == bytes else { fatalError("a decoded record re-encodes differently") }
            _ = record.hasValidSignature()
            if let json = try? record.json(), let again = try? Record(json: json) { guard again == record else { fatalError("JSON round trip changed a record") } }
        }
    case "token":
        _ = ChangeToken(base64: String(decoding: bytes, as: UTF8.self))
    case "header":
        if let credentials = RequestSignature.parse(String(decoding: bytes, as: UTF8.self)) {
            _ = RequestSignature.verify(credentials, method: "GET", path: "/", query: [], body: Data())
        }
    case "wire":
        _ = try? Wire.decode(Wire.Modify.self, from: bytes, binary: true)
        _ = try? Wire.decode(Wire.Modify.self, from: bytes, binary: false)
        _ = try? Wire.decodeCanonical(Wire.Fetch.self, from: bytes, binary: false)
        _ = Wire.jsonObjectCountExceeds(bytes, 401)
    case "link":
        _ = try? LinkCode(text: String(decoding: bytes, as: UTF8.self))
    case "image":
        // Whatever is capped fits the box and decodes again to its own size.
        if let capped = try? Images.cap(bytes, maxWidth: 100, maxHeight: 100, limits: ImageLimits(maximumBytes: 1 << 16, maximumPixels: 1 << 22)) {
            guard capped.width <= 100, capped.height <= 100, let again = try? Images.decode(capped.png),
                again.width == capped.width, again.height == capped.height
            else { fatalError("a capped image does not fit its box or does not decode") }
        }
    default:
        break  // checked before the driver starts
    }
    return 0
}

#if FUZZING
@_silgen_name("LLVMFuzzerRunDriver")
func runFuzzerDriver(_ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
                     _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> CInt

var argc = CommandLine.argc
var argv = Optional(CommandLine.unsafeArgv)
exit(runFuzzerDriver(&argc, &argv) { data, size in convkitFuzz(data, size) })
#else
FileHandle.standardError.write(Data("convkit-fuzz: build and run it with scripts/fuzz.sh (libFuzzer, AddressSanitizer)\n".utf8))
exit(64)
#endif
