import Foundation

/// The formats images are taken in.
public enum ImageFormat: String, Sendable {
    case png, jpeg

    /// The format the magic bytes at the start say, or nil.
    public init?(magicOf data: Data) {
        if data.starts(with: PNGCodec.magic) {
            self = .png
        } else if data.starts(with: JPEGCodec.magic) {
            self = .jpeg
        } else {
            return nil
        }
    }
}

/// An image made small enough to show and share: PNG bytes holding only pixels.
public struct CappedImage: Sendable, Hashable {
    public let png: Data
    public let width: Int
    public let height: Int
}

/// Decoding, capping and encoding images through libpng and libjpeg-turbo.
public enum Images {
    /// Decodes a PNG or a JPEG (chosen by its magic bytes) to upright RGBA pixels: the EXIF
    /// orientation of a JPEG is applied.
    /// - Parameter fitting: the size the caller will scale the result down to fit; a JPEG is then
    ///   decoded straight at a smaller scale that still covers it.
    /// - Throws: ``ImageError`` — the byte limit before anything is read, the pixel limit from
    ///   the header before any pixel is decoded, then damage and truncation.
    public static func decode(_ data: Data, limits: ImageLimits = ImageLimits(), fitting: (width: Int, height: Int)? = nil) throws(ImageError) -> RGBAImage {
        try decodeSized(data, limits: limits, fitting: fitting).image
    }

    /// The decoded pixels (upright) and the image's full upright size (a JPEG decoded at a
    /// reduced scale has fewer pixels than its size).
    private static func decodeSized(_ data: Data, limits: ImageLimits, fitting: (width: Int, height: Int)?) throws(ImageError) -> (image: RGBAImage, width: Int, height: Int) {
        try limits.check(bytes: data.count)
        switch ImageFormat(magicOf: data) {
        case .png?:
            let image = try PNGCodec.decode(data, limits: limits)
            return (image, image.width, image.height)
        case .jpeg?:
            let orientation = ExifOrientation.read(from: data)
            // A quarter turn swaps the sides the stored pixels must cover.
            let stored = fitting.map { orientation >= 5 ? (width: $0.height, height: $0.width) : $0 }
            let (image, width, height) = try JPEGCodec.decode(data, limits: limits, fitting: stored)
            return (image.oriented(orientation), orientation >= 5 ? height : width, orientation >= 5 ? width : height)
        case nil:
            throw ImageError(.notAnImage, "neither a PNG nor a JPEG (the first bytes are \(data.prefix(8).map { String(format: "%02x", $0) }.joined()))")
        }
    }

    /// Decodes an image, scales it down to fit `maxWidth × maxHeight` (aspect kept — from the
    /// image's full size —, area averaging, never scaled up) and encodes it as a PNG without any
    /// metadata.
    public static func cap(_ data: Data, maxWidth: Int, maxHeight: Int, limits: ImageLimits = ImageLimits()) throws(ImageError) -> CappedImage {
        let decoded = try decodeSized(data, limits: limits, fitting: (maxWidth, maxHeight))
        let target = RGBAImage.fittingSize(width: decoded.width, height: decoded.height, maxWidth: maxWidth, maxHeight: maxHeight)
        let scaled = decoded.image.scaled(toWidth: target.width, height: target.height)
        return CappedImage(png: try PNGCodec.encode(scaled), width: scaled.width, height: scaled.height)
    }

    /// A small JPEG of an image to show before the image itself (a message's file): scaled down
    /// to fit `maxSide × maxSide` (never up), the quality lowered until it is at most `maxBytes`.
    /// - Returns: the JPEG and the image's full upright size.
    /// - Throws: ``ImageError`` as ``decode(_:limits:fitting:)``; ``ImageError/Code/encodingFailed``
    ///   when no quality fits.
    public static func thumbnail(_ data: Data, maxSide: Int, maxBytes: Int, limits: ImageLimits = ImageLimits()) throws(ImageError) -> (jpeg: Data, width: Int, height: Int) {
        let decoded = try decodeSized(data, limits: limits, fitting: (maxSide, maxSide))
        let target = RGBAImage.fittingSize(width: decoded.width, height: decoded.height, maxWidth: maxSide, maxHeight: maxSide)
        let scaled = decoded.image.scaled(toWidth: target.width, height: target.height)
        for quality in [75, 50, 30] {
            let jpeg = try encodeJPEG(scaled, quality: quality)
            if jpeg.count <= maxBytes { return (jpeg, decoded.width, decoded.height) }
        }
        throw ImageError(.encodingFailed, "no JPEG of \(scaled.width)×\(scaled.height) fits \(maxBytes) bytes")
    }

    /// The pixels as a PNG (RGB when opaque), with no metadata.
    public static func encodePNG(_ image: RGBAImage) throws(ImageError) -> Data {
        try PNGCodec.encode(image)
    }

    /// How ``encodeJPEG(_:quality:progressive:colorSpace:)`` writes.
    public enum JPEGColorSpace: Sendable {
        case color, grayscale, cmyk
    }

    /// The pixels as a JPEG (alpha dropped), for fixtures and measurements.
    public static func encodeJPEG(_ image: RGBAImage, quality: Int = 90, progressive: Bool = false, colorSpace: JPEGColorSpace = .color) throws(ImageError) -> Data {
        let encoding: JPEGCodec.Encoding = switch colorSpace {
        case .color: .color
        case .grayscale: .grayscale
        case .cmyk: .cmyk
        }
        return try JPEGCodec.encode(image, quality: quality, progressive: progressive, as: encoding)
    }
}

/// The orientation tag (0x0112) of a JPEG's EXIF data: which way the stored pixels must be
/// turned to display upright. libjpeg-turbo does not read EXIF, so this reads exactly that one
/// tag: the JPEG's marker segments up to the first scan, the APP1 `Exif` segment's TIFF header
/// and its first directory, every offset checked against the segment's bounds.
enum ExifOrientation {
    /// 1–8, or 1 when there is no readable tag.
    static func read(from data: Data) -> Int {
        let bytes = [UInt8](data.prefix(1 << 20))  // EXIF lives in the first 64 KiB segments
        var position = 2
        while position + 4 <= bytes.count, bytes[position] == 0xFF {
            let marker = bytes[position + 1]
            if marker == 0xFF { position += 1; continue }  // fill byte
            if marker == 0xD8 || (0xD0...0xD7).contains(marker) || marker == 0x01 { position += 2; continue }
            if marker == 0xDA || marker == 0xD9 { break }  // the scan starts: no EXIF after it
            let length = Int(bytes[position + 2]) << 8 | Int(bytes[position + 3])
            guard length >= 2, position + 2 + length <= bytes.count else { break }
            let segment = bytes[(position + 4)..<(position + 2 + length)]
            if marker == 0xE1, let orientation = orientation(inExif: Array(segment)) { return orientation }
            position += 2 + length
        }
        return 1
    }

    private static func orientation(inExif segment: [UInt8]) -> Int? {
        let header: [UInt8] = Array("Exif".utf8) + [0, 0]
        guard segment.count >= header.count + 8, Array(segment.prefix(6)) == header else { return nil }
        let tiff = Array(segment.dropFirst(6))
        let little: Bool
        switch (tiff[0], tiff[1]) {
        case (0x49, 0x49): little = true
        case (0x4D, 0x4D): little = false
        default: return nil
        }
        func u16(_ at: Int) -> Int? {
            guard at >= 0, at + 2 <= tiff.count else { return nil }
            return little ? Int(tiff[at]) | Int(tiff[at + 1]) << 8 : Int(tiff[at]) << 8 | Int(tiff[at + 1])
        }
        func u32(_ at: Int) -> Int? {
            guard let high = u16(little ? at + 2 : at), let low = u16(little ? at : at + 2) else { return nil }
            return high << 16 | low
        }
        guard u16(2) == 42, let directory = u32(4), let count = u16(directory) else { return nil }
        for entry in 0..<min(count, 512) {
            let at = directory + 2 + entry * 12
            guard let tag = u16(at), let type = u16(at + 2) else { return nil }
            // SHORT (3), one value, held in the entry itself.
            if tag == 0x0112, type == 3, let value = u16(at + 8), (1...8).contains(value) { return value }
        }
        return nil
    }
}
