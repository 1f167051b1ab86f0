import Foundation
import ImageKit
import Testing
import TestSupport

@Suite struct ImageKitTests {
    static let red: (UInt8, UInt8, UInt8, UInt8) = (220, 30, 40, 255)
    static let blue: (UInt8, UInt8, UInt8, UInt8) = (20, 60, 200, 255)
    static let lightGray: (UInt8, UInt8, UInt8, UInt8) = (200, 200, 200, 255)
    static let darkGray: (UInt8, UInt8, UInt8, UInt8) = (40, 40, 40, 255)

    /// Every PNG colour type and bit depth (16-bit with and without a gamma chunk), interlaced
    /// or not, at several sizes and aspect ratios: capped to fit 100×100 with the aspect kept, a two-colour split keeps its split
    /// and each side its colour.
    @Test(arguments: ImageFixtures.PNGKind.allCases)
    func pngOfEveryKindIsCappedKeepingAspectAndColours(_ kind: ImageFixtures.PNGKind) throws {
        for (width, height, interlaced) in [(320, 240, false), (150, 450, true), (64, 40, false), (500, 50, true)] {
            var left = kind.isGray ? Self.lightGray : Self.red
            var right = kind.isGray ? Self.darkGray : Self.blue
            if kind.hasAlpha { left.3 = 160 }
            if kind == .palette8 { right.3 = 255 }
            let source = ImageFixtures.split(width: width, height: height, left: left, right: right)
            // 16-bit files with and without an sRGB chunk (libpng alone would take the latter for linear light).
            let file = try ImageFixtures.png(source, kind, interlaced: interlaced, tagged: interlaced)
            let capped = try Images.cap(file, maxWidth: 100, maxHeight: 100)
            let expected = RGBAImage.fittingSize(width: width, height: height, maxWidth: 100, maxHeight: 100)
            #expect(capped.width == expected.width && capped.height == expected.height, "\(kind) \(width)×\(height)")
            #expect(max(capped.width, capped.height) == min(100, max(width, height)), "fits, never scaled up")
            let decoded = try Images.decode(capped.png)
            #expect(decoded.width == capped.width && decoded.height == capped.height)
            let y = decoded.height / 2
            #expect(near(decoded.pixel(decoded.width / 8, y), left), "\(kind) \(width)×\(height) left: \(decoded.pixel(decoded.width / 8, y))")
            #expect(near(decoded.pixel(decoded.width - 1 - decoded.width / 8, y), right), "\(kind) \(width)×\(height) right")
        }
    }

    /// JPEGs — baseline, progressive, grayscale, CMYK — capped with their colours and split.
    @Test(arguments: [("baseline", false, Images.JPEGColorSpace.color), ("progressive", true, .color),
                      ("grayscale", false, .grayscale), ("cmyk", false, .cmyk), ("cmyk progressive", true, .cmyk)])
    func jpegsAreCappedKeepingAspectAndColours(_ name: String, _ progressive: Bool, _ space: Images.JPEGColorSpace) throws {
        for (width, height) in [(512, 384), (240, 600), (90, 60)] {
            let gray = space == .grayscale
            let left = gray ? Self.lightGray : Self.red, right = gray ? Self.darkGray : Self.blue
            let source = ImageFixtures.split(width: width, height: height, left: left, right: right)
            let file = try Images.encodeJPEG(source, quality: 92, progressive: progressive, colorSpace: space)
            let capped = try Images.cap(file, maxWidth: 100, maxHeight: 100)
            let expected = RGBAImage.fittingSize(width: width, height: height, maxWidth: 100, maxHeight: 100)
            #expect(capped.width == expected.width && capped.height == expected.height, "\(name) \(width)×\(height)")
            let decoded = try Images.decode(capped.png)
            let y = decoded.height / 2
            #expect(near(decoded.pixel(decoded.width / 8, y), left, 10), "\(name) \(width)×\(height) left \(decoded.pixel(decoded.width / 8, y))")
            #expect(near(decoded.pixel(decoded.width - 1 - decoded.width / 8, y), right, 10), "\(name) \(width)×\(height) right \(decoded.pixel(decoded.width - 1 - decoded.width / 8, y))")
        }
    }

    /// The EXIF orientation is applied: a landscape photo stored red over blue and tagged
    /// "turn 90° clockwise" (6) becomes portrait with red on the right; tagged 3 (180°), blue
    /// on top; tagged 8, red on the left.
    @Test func exifOrientationIsApplied() throws {
        let stored = ImageFixtures.topBottom(width: 400, height: 200, top: (220, 30, 40), bottom: (20, 60, 200))
        let jpeg = try Images.encodeJPEG(stored, quality: 92, progressive: true)
        let red = Self.red, blue = Self.blue

        let turned = try Images.decode(try Images.cap(ImageFixtures.withOrientation(jpeg, 6), maxWidth: 100, maxHeight: 100).png)
        #expect(turned.width == 50 && turned.height == 100)
        #expect(near(turned.pixel(turned.width - 5, 50), red, 10) && near(turned.pixel(4, 50), blue, 10))

        let upsideDown = try Images.decode(try Images.cap(ImageFixtures.withOrientation(jpeg, 3), maxWidth: 100, maxHeight: 100).png)
        #expect(upsideDown.width == 100 && upsideDown.height == 50)
        #expect(near(upsideDown.pixel(50, 4), blue, 10) && near(upsideDown.pixel(50, 45), red, 10))

        let left = try Images.decode(try Images.cap(ImageFixtures.withOrientation(jpeg, 8), maxWidth: 100, maxHeight: 100).png)
        #expect(left.width == 50 && left.height == 100)
        #expect(near(left.pixel(4, 50), red, 10) && near(left.pixel(45, 50), blue, 10))
    }

    /// Area averaging, not nearest neighbour: one-pixel black and white stripes scaled down
    /// ten times become an even grey.
    @Test func scalingAveragesTheAreaItCovers() throws {
        var pixels = [UInt8]()
        for _ in 0..<200 { for x in 0..<500 { let v: UInt8 = x % 2 == 0 ? 0 : 255; pixels += [v, v, v, 255] } }
        let stripes = RGBAImage(width: 500, height: 200, pixels: pixels)
        let small = stripes.scaled(toFitWidth: 50, height: 50)
        #expect(small.width == 50 && small.height == 20)
        for x in [0, 17, 49] { #expect(near(small.pixel(x, 10), (128, 128, 128, 255), 2), "\(small.pixel(x, 10))") }
        // Transparent pixels lend no colour: red at full alpha beside clear black averages to red.
        let half = ImageFixtures.split(width: 20, height: 20, left: (255, 0, 0, 255), right: (0, 0, 0, 0))
        let one = half.scaled(toFitWidth: 1, height: 1)
        #expect(near(one.pixel(0, 0), (255, 0, 0, 128), 1), "\(one.pixel(0, 0))")
    }

    /// The capped PNG holds pixels only — no text, time, EXIF or other ancillary chunk — and the
    /// one byte that says they are sRGB.
    @Test func theCappedPNGHoldsNoMetadata() throws {
        let jpeg = ImageFixtures.withOrientation(try Images.encodeJPEG(ImageFixtures.split(width: 300, height: 200, left: Self.red, right: Self.blue)), 1)
        let png = try Images.cap(jpeg, maxWidth: 100, maxHeight: 100).png
        var chunks = [String]()
        var at = 8
        while at + 8 <= png.count {
            let length = png[at..<at + 4].reduce(0) { $0 << 8 | Int($1) }
            chunks.append(String(decoding: png[at + 4..<at + 8], as: UTF8.self))
            at += 12 + length
        }
        #expect(chunks == ["IHDR", "sRGB", "IDAT", "IEND"], "\(chunks)")
    }

    /// Hostile inputs: each its typed error, no crash.
    @Test func hostileImagesFailWithTypedErrors() throws {
        func code(_ data: Data, limits: ImageLimits = ImageLimits()) -> ImageError.Code? {
            do { _ = try Images.cap(data, maxWidth: 100, maxHeight: 100, limits: limits); return nil } catch { return error.code }
        }
        let picture = ImageFixtures.split(width: 300, height: 200, left: Self.red, right: Self.blue)
        let png = try ImageFixtures.png(picture, .rgba8)
        let jpeg = try Images.encodeJPEG(picture)
        // A PNG whose header claims 100,000 × 100,000 pixels (40 GB of RGBA; its checksum made
        // right), and a JPEG claiming 60,000².
        var claimed = [UInt8](png)
        claimed[16...23] = [0x00, 0x01, 0x86, 0xA0, 0x00, 0x01, 0x86, 0xA0]
        let crc = crc32(claimed[12..<29])
        claimed[29...32] = [UInt8(crc >> 24), UInt8((crc >> 16) & 0xFF), UInt8((crc >> 8) & 0xFF), UInt8(crc & 0xFF)]
        #expect(code(Data(claimed)) == .tooManyPixels)
        #expect(code(try ImageFixtures.claiming(jpeg, width: 60_000, height: 60_000)) == .tooManyPixels)
        #expect(code(png, limits: ImageLimits(maximumPixels: 300 * 200 - 1)) == .tooManyPixels)
        // Truncated.
        for cut in [png.count / 2, png.count - 13, 40] { #expect(code(png.prefix(cut)) == .corrupt, "PNG cut at \(cut)") }
        for cut in [jpeg.count / 2, jpeg.count - 2, 30] { #expect(code(jpeg.prefix(cut)) == .corrupt, "JPEG cut at \(cut)") }
        // A flipped byte in the middle of the PNG's compressed data (its CRC catches it).
        var flipped = png
        flipped[png.count / 2] ^= 0x55
        #expect(code(flipped) == .corrupt)
        // Wrong or lying magic.
        #expect(code(Data("GIF89a".utf8) + png.dropFirst(6)) == .notAnImage)
        #expect(code(Data(JPEGCodecMagic.jpeg) + png.dropFirst(3)) == .corrupt, "JPEG magic on a PNG body")
        #expect(code(Data(JPEGCodecMagic.png) + jpeg.dropFirst(8)) == .corrupt, "PNG magic on a JPEG body")
        #expect(code(Data()) == .notAnImage)
        // Random bytes, with and without a real magic in front.
        var random = SeededRandom(seed: 11)
        for n in 0..<20 {
            let noise = Data((0..<(n * 97 + 10)).map { _ in UInt8.random(in: 0...255, using: &random) })
            #expect([.notAnImage, .corrupt].contains(code(noise)))
            #expect(code(Data(JPEGCodecMagic.png) + noise) == .corrupt)
            #expect(code(Data(JPEGCodecMagic.jpeg) + noise) == .corrupt)
        }
        // 30 MiB: refused by size before anything is read.
        #expect(code(png + Data(count: 30 << 20)) == .inputTooLarge)
    }
}

enum JPEGCodecMagic {
    static let png: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]
    static let jpeg: [UInt8] = [0xFF, 0xD8, 0xFF]
}

/// CRC-32 as PNG chunks use it (ISO 3309).
func crc32(_ bytes: ArraySlice<UInt8>) -> UInt32 {
    var crc: UInt32 = 0xFFFF_FFFF
    for byte in bytes {
        crc ^= UInt32(byte)
        for _ in 0..<8 { crc = crc & 1 == 1 ? 0xEDB8_8320 ^ (crc >> 1) : crc >> 1 }
    }
    return ~crc
}
