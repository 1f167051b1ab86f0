import CPNG
import Foundation
import ImageKit
import Testing

/// Test images made with the real libraries: every PNG colour type and bit depth (through
/// libpng's full writing API, which the decoder under test does not use), JPEGs through
/// TurboJPEG, and EXIF orientation spliced in as cameras write it.
public enum ImageFixtures {
    public enum PNGKind: String, CaseIterable, Sendable {
        case gray8, grayAlpha8, rgb8, rgba8, palette8, gray16, rgb16, rgba16
        public var colorType: Int32 {
            switch self {
            case .gray8, .gray16: 0
            case .rgb8, .rgb16: 2
            case .palette8: 3
            case .grayAlpha8: 4
            case .rgba8, .rgba16: 6
            }
        }
        public var bitDepth: Int32 { [.gray16, .rgb16, .rgba16].contains(self) ? 16 : 8 }
        public var isGray: Bool { [.gray8, .grayAlpha8, .gray16].contains(self) }
        public var hasAlpha: Bool { [.grayAlpha8, .rgba8, .rgba16, .palette8].contains(self) }
    }

    /// An image whose left part (`split` of its width) is one colour and the rest another.
    public static func split(width: Int, height: Int, left: (UInt8, UInt8, UInt8, UInt8), right: (UInt8, UInt8, UInt8, UInt8), at split: Double = 0.5) -> RGBAImage {
        let edge = Int(Double(width) * split)
        var row = [UInt8](repeating: 0, count: width * 4)
        for x in 0..<width {
            let c = x < edge ? left : right
            row[x * 4] = c.0; row[x * 4 + 1] = c.1; row[x * 4 + 2] = c.2; row[x * 4 + 3] = c.3
        }
        return RGBAImage(width: width, height: height, pixels: Array([[UInt8]](repeating: row, count: height).joined()))
    }

    /// An image whose top half is one colour and bottom half another.
    public static func topBottom(width: Int, height: Int, top: (UInt8, UInt8, UInt8), bottom: (UInt8, UInt8, UInt8)) -> RGBAImage {
        var pixels = [UInt8]()
        for y in 0..<height {
            let c = y < height / 2 ? top : bottom
            for _ in 0..<width { pixels += [c.0, c.1, c.2, 255] }
        }
        return RGBAImage(width: width, height: height, pixels: pixels)
    }

    /// The image as a PNG of `kind` (gray kinds take the red channel), through libpng's full
    /// writing API; a `tagged` 16-bit file carries an sRGB chunk (as image editors write them),
    /// an untagged one says nothing of its gamma (as many tools write them).
    public static func png(_ image: RGBAImage, _ kind: PNGKind, interlaced: Bool = false, tagged: Bool = true) throws -> Data {
        let path = FileManager.default.temporaryDirectory.path + "/fixture-\(UUID().uuidString).png"
        defer { try? FileManager.default.removeItem(atPath: path) }
        guard let file = fopen(path, "wb") else { throw FixtureError("cannot create \(path)") }
        var png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nil, nil, nil)
        var info = png_create_info_struct(png)
        png_init_io(png, file)
        png_set_IHDR(png, info, png_uint_32(image.width), png_uint_32(image.height), kind.bitDepth, kind.colorType,
                     interlaced ? 1 : 0, 0, 0)
        if kind.bitDepth == 16 && tagged { png_set_sRGB(png, info, 0) }
        var paletteIndex = [UInt32: UInt8]()
        if kind == .palette8 {
            var colors = [png_color](), alphas = [UInt8]()
            for i in stride(from: 0, to: image.pixels.count, by: 4) {
                let p = image.pixels
                let key = UInt32(p[i]) << 24 | UInt32(p[i + 1]) << 16 | UInt32(p[i + 2]) << 8 | UInt32(p[i + 3])
                guard paletteIndex[key] == nil else { continue }
                guard colors.count < 256 else { throw FixtureError("more than 256 colours for a palette") }
                paletteIndex[key] = UInt8(colors.count)
                colors.append(png_color(red: p[i], green: p[i + 1], blue: p[i + 2]))
                alphas.append(p[i + 3])
            }
            png_set_PLTE(png, info, colors, Int32(colors.count))
            if alphas.contains(where: { $0 < 255 }) { png_set_tRNS(png, info, alphas, Int32(alphas.count), nil) }
        }
        png_write_info(png, info)
        do {
            let channels: [Int] = switch kind {
            case .gray8, .gray16, .palette8: [0]
            case .grayAlpha8: [0, 3]
            case .rgb8, .rgb16: [0, 1, 2]
            case .rgba8, .rgba16: [0, 1, 2, 3]
            }
            let repeats = kind.bitDepth == 16 ? 2 : 1  // 16-bit samples: v × 257, big-endian
            let rowBytes = image.width * channels.count * repeats
            var buffer = [UInt8](repeating: 0, count: rowBytes * image.height)
            var o = 0
            for i in stride(from: 0, to: image.pixels.count, by: 4) {
                if kind == .palette8 {
                    let p = image.pixels
                    buffer[o] = paletteIndex[UInt32(p[i]) << 24 | UInt32(p[i + 1]) << 16 | UInt32(p[i + 2]) << 8 | UInt32(p[i + 3])] ?? 0
                    o += 1
                    continue
                }
                for c in channels {
                    for _ in 0..<repeats { buffer[o] = image.pixels[i + c]; o += 1 }
                }
            }
            buffer.withUnsafeMutableBufferPointer { base in
                guard let start = base.baseAddress else { return }
                var pointers: [UnsafeMutablePointer<UInt8>?] = (0..<image.height).map { start + $0 * rowBytes }
                pointers.withUnsafeMutableBufferPointer { png_write_image(png, $0.baseAddress) }
            }
            png_write_end(png, nil)
        }
        png_destroy_write_struct(&png, &info)
        fclose(file)
        return try Data(contentsOf: URL(fileURLWithPath: path))
    }

    /// A JPEG with an EXIF APP1 segment holding only the orientation tag (big-endian TIFF, as
    /// many cameras write it), right after the start-of-image marker.
    public static func withOrientation(_ jpeg: Data, _ orientation: UInt8) -> Data {
        let tiff: [UInt8] = [0x4D, 0x4D, 0x00, 0x2A, 0x00, 0x00, 0x00, 0x08,  // "MM", 42, IFD0 at 8
                             0x00, 0x01,  // one entry
                             0x01, 0x12, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0x00, orientation, 0x00, 0x00,
                             0x00, 0x00, 0x00, 0x00]  // no next IFD
        let payload = Array("Exif".utf8) + [0, 0] + tiff
        let length = payload.count + 2
        var out = Data(jpeg.prefix(2))
        out += [0xFF, 0xE1, UInt8(length >> 8), UInt8(length & 0xFF)] + payload
        out += jpeg.dropFirst(2)
        return out
    }

    /// A JPEG whose frame header (SOF) claims another size.
    public static func claiming(_ jpeg: Data, width: UInt16, height: UInt16) throws -> Data {
        var bytes = [UInt8](jpeg)
        guard let sof = bytes.indices.dropLast(9).first(where: { bytes[$0] == 0xFF && (bytes[$0 + 1] == 0xC0 || bytes[$0 + 1] == 0xC2) }) else {
            throw FixtureError("no frame header")
        }
        bytes[sof + 5] = UInt8(height >> 8); bytes[sof + 6] = UInt8(height & 0xFF)
        bytes[sof + 7] = UInt8(width >> 8); bytes[sof + 8] = UInt8(width & 0xFF)
        return Data(bytes)
    }
}

public struct FixtureError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Whether two colours are within `tolerance` on every channel.
public func near(_ a: (r: UInt8, g: UInt8, b: UInt8, a: UInt8), _ b: (UInt8, UInt8, UInt8, UInt8), _ tolerance: Int = 6) -> Bool {
    abs(Int(a.r) - Int(b.0)) <= tolerance && abs(Int(a.g) - Int(b.1)) <= tolerance
        && abs(Int(a.b) - Int(b.2)) <= tolerance && abs(Int(a.a) - Int(b.3)) <= tolerance
}
