import CPNG
import Foundation

/// PNG through libpng's simplified API (`png_image`), which reads every PNG colour type and bit
/// depth (gray, palette, alpha, 16-bit, interlaced) into 8-bit RGBA and reports errors without
/// `setjmp`. <http://www.libpng.org/pub/png/libpng-manual.txt>, "Simplified API".
enum PNGCodec {
    static let magic: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]

    static func decode(_ data: Data, limits: ImageLimits) throws(ImageError) -> RGBAImage {
        let outcome = data.withUnsafeBytes { raw -> Result<RGBAImage, ImageError> in
            var image = png_image()
            image.version = ck_png_image_version
            // The header only: the size is checked before any pixel is decoded.
            guard png_image_begin_read_from_memory(&image, raw.baseAddress, raw.count) != 0 else {
                return .failure(ImageError(.corrupt, "not a readable PNG: \(message(image))"))
            }
            let width = Int(image.width), height = Int(image.height)
            do throws(ImageError) { try limits.check(width: width, height: height) } catch {
                png_image_free(&image)
                return .failure(error)
            }
            // libpng takes a 16-bit file that does not say its gamma for linear light; viewers
            // (and the files' makers) take it for sRGB, as 8-bit files. Such a file is read as
            // it is stored (linear in, linear out: no conversion) and reduced to 8 bits here.
            let untagged16 = Self.isUntagged16Bit(raw)
            image.format = untagged16 ? ck_png_format_linear_rgba : ck_png_format_rgba
            var pixels = [UInt8](repeating: 0, count: width * height * 4)
            var wide = [UInt16](repeating: 0, count: untagged16 ? width * height * 4 : 0)
            // Frees the image's resources whether it succeeds or not.
            let finished = untagged16
                ? wide.withUnsafeMutableBytes { png_image_finish_read(&image, nil, $0.baseAddress, 0, nil) }
                : pixels.withUnsafeMutableBytes { png_image_finish_read(&image, nil, $0.baseAddress, 0, nil) }
            guard finished != 0 else { return .failure(ImageError(.corrupt, "a damaged or truncated PNG: \(message(image))")) }
            if untagged16 { Self.narrow(wide, into: &pixels) }
            return .success(RGBAImage(width: width, height: height, pixels: pixels))
        }
        return try outcome.get()
    }

    /// Whether the file is 16-bit and says nothing of its gamma (no `gAMA`, `sRGB` or `iCCP`
    /// chunk before its pixels).
    private static func isUntagged16Bit(_ raw: UnsafeRawBufferPointer) -> Bool {
        let bytes = raw.bindMemory(to: UInt8.self)
        guard bytes.count > 33, bytes[24] == 16 else { return false }
        var at = 8
        while at + 8 <= bytes.count {
            let length = (0..<4).reduce(0) { $0 << 8 | Int(bytes[at + $1]) }
            let type = String(decoding: bytes[(at + 4)..<(at + 8)], as: UTF8.self)
            if type == "IDAT" { return true }
            if ["gAMA", "sRGB", "iCCP"].contains(type) { return false }
            guard length <= bytes.count else { return true }
            at += 12 + length
        }
        return true
    }

    /// Premultiplied 16-bit RGBA (libpng's linear format) to straight 8-bit RGBA.
    private static func narrow(_ wide: [UInt16], into pixels: inout [UInt8]) {
        for i in stride(from: 0, to: wide.count, by: 4) {
            let alpha = Int(wide[i + 3])
            for c in 0..<3 {
                let straight = alpha == 0 ? 0 : min(65535, (Int(wide[i + c]) * 65535 + alpha / 2) / alpha)
                pixels[i + c] = UInt8((straight + 128) / 257)
            }
            pixels[i + 3] = UInt8((alpha + 128) / 257)
        }
    }

    /// The image as a PNG holding nothing but its pixels (RGB when it is opaque, RGBA otherwise).
    static func encode(_ source: RGBAImage) throws(ImageError) -> Data {
        var image = png_image()
        image.version = ck_png_image_version
        image.width = UInt32(source.width)
        image.height = UInt32(source.height)
        var pixels = source.pixels
        let opaque = source.isOpaque
        if opaque {
            image.format = ck_png_format_rgb
            pixels = stride(from: 0, to: source.pixels.count, by: 4).flatMap { source.pixels[$0..<$0 + 3] }
        } else {
            image.format = ck_png_format_rgba
        }
        // Speed over the last few per cent of size (zlib's fast settings): an avatar is small,
        // and the default settings cost milliseconds on photo-like pixels.
        image.flags |= ck_png_image_flag_fast
        let channels = opaque ? 3 : 4
        // Room for the pixels stored uncompressed and every chunk: written in one pass.
        var size = (source.width * channels + 1) * source.height * 102 / 100 + 1024
        for _ in 0..<2 {
            var output = [UInt8](repeating: 0, count: size)
            let capacity = size
            let written = output.withUnsafeMutableBytes { out in
                pixels.withUnsafeBytes { png_image_write_to_memory(&image, out.baseAddress, &size, 0, $0.baseAddress, 0, nil) }
            }
            if written != 0 { return Data(output.prefix(size)) }
            // Too small a buffer: the size it needs is in `size`.
            guard size > capacity else { break }
        }
        throw ImageError(.encodingFailed, "libpng: \(message(image))")
    }

    private static func message(_ image: png_image) -> String {
        withUnsafeBytes(of: image.message) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
    }
}
