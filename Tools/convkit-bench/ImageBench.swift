import CPNG
import CTurboJPEG
import Foundation
import ImageKit

/// Avatars capped per second (decode, orient, scale to fit 100×100 by area averaging, encode a
/// PNG) for a 1024×768 photo-like JPEG and PNG, beside the libraries' own full decode of the
/// same file in the same run.
@MainActor func imageBench(_ reporter: Reporter, seconds: Double) throws {
    reporter.header("Avatars (1024×768 photo-like image, capped to fit 100×100)")
    let photo = photoLike(width: 1024, height: 768)
    let jpeg = try Images.encodeJPEG(photo, quality: 90)
    let png = try Images.encodePNG(photo)
    reporter.note("JPEG \(jpeg.count) bytes (quality 90, 4:2:0), PNG \(png.count) bytes (RGB)")
    for (name, file, rawName, raw) in [("JPEG", jpeg, "tjDecompress2, full size", rawJPEGDecode), ("PNG", png, "png_image_finish_read, RGBA", rawPNGDecode)] {
        let capped = try rate(seconds: seconds) { _ = try Images.cap(file, maxWidth: 100, maxHeight: 100) }
        let library = try rate(seconds: seconds) { try raw(file) }
        reporter.report(Row(name: "avatar capped from \(name)", perSecond: capped, rawName: rawName, rawPerSecond: library))
    }
}

/// Smooth gradients with a little deterministic noise: compresses like a photo, not like a flat colour.
private func photoLike(width: Int, height: Int) -> RGBAImage {
    var pixels = [UInt8](repeating: 255, count: width * height * 4)
    var state: UInt32 = 2026
    for y in 0..<height {
        for x in 0..<width {
            state = state &* 1_664_525 &+ 1_013_904_223
            let noise = Int(state >> 28) - 8
            let i = (y * width + x) * 4
            pixels[i] = UInt8(clamping: x * 255 / width + noise)
            pixels[i + 1] = UInt8(clamping: y * 255 / height + noise)
            pixels[i + 2] = UInt8(clamping: (x + y) * 128 / (width + height) + 64 + noise)
        }
    }
    return RGBAImage(width: width, height: height, pixels: pixels)
}

private func rawJPEGDecode(_ data: Data) throws {
    guard let handle = tjInitDecompress() else { throw RawError("tjInitDecompress") }
    defer { tjDestroy(handle) }
    var width: Int32 = 0, height: Int32 = 0, subsampling: Int32 = 0, colorspace: Int32 = 0
    let status = data.withUnsafeBytes { raw -> Int32 in
        let base = raw.bindMemory(to: UInt8.self).baseAddress
        guard tjDecompressHeader3(handle, base, UInt(raw.count), &width, &height, &subsampling, &colorspace) == 0 else { return -1 }
        var pixels = [UInt8](repeating: 0, count: Int(width * height * 4))
        return pixels.withUnsafeMutableBufferPointer {
            tjDecompress2(handle, base, UInt(raw.count), $0.baseAddress, width, 0, height, Int32(TJPF_RGBA.rawValue), Int32(TJFLAG_ACCURATEDCT))
        }
    }
    guard status == 0 else { throw RawError("tjDecompress2 failed") }
}

private func rawPNGDecode(_ data: Data) throws {
    let ok = data.withUnsafeBytes { raw -> Bool in
        var image = png_image()
        image.version = ck_png_image_version
        guard png_image_begin_read_from_memory(&image, raw.baseAddress, raw.count) != 0 else { return false }
        image.format = ck_png_format_rgba
        var pixels = [UInt8](repeating: 0, count: Int(image.width * image.height * 4))
        return pixels.withUnsafeMutableBytes { png_image_finish_read(&image, nil, $0.baseAddress, 0, nil) } != 0
    }
    guard ok else { throw RawError("png_image_finish_read failed") }
}
