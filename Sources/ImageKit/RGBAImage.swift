import Foundation

/// Decoded pixels: 8-bit RGBA, row by row, alpha not premultiplied.
public struct RGBAImage: Sendable, Hashable {
    public let width: Int
    public let height: Int
    /// `width × height × 4` bytes.
    public var pixels: [UInt8]

    public init(width: Int, height: Int, pixels: [UInt8]) {
        precondition(width > 0 && height > 0 && pixels.count == width * height * 4, "pixels must hold width × height × 4 bytes")
        self.width = width
        self.height = height
        self.pixels = pixels
    }

    /// An image of one colour.
    public init(width: Int, height: Int, fill: (UInt8, UInt8, UInt8, UInt8)) {
        self.init(width: width, height: height, pixels: (0..<width * height).flatMap { _ in [fill.0, fill.1, fill.2, fill.3] })
    }

    /// The pixel at (x, y) as (r, g, b, a).
    public func pixel(_ x: Int, _ y: Int) -> (r: UInt8, g: UInt8, b: UInt8, a: UInt8) {
        let i = (y * width + x) * 4
        return (pixels[i], pixels[i + 1], pixels[i + 2], pixels[i + 3])
    }

    /// Whether every pixel is fully opaque.
    public var isOpaque: Bool {
        stride(from: 3, to: pixels.count, by: 4).allSatisfy { pixels[$0] == 255 }
    }

    /// The size that fits in `maxWidth × maxHeight` keeping the aspect ratio, never larger than
    /// `width × height` (never scaled up), at least 1×1.
    public static func fittingSize(width: Int, height: Int, maxWidth: Int, maxHeight: Int) -> (width: Int, height: Int) {
        let scale = min(1, Double(maxWidth) / Double(width), Double(maxHeight) / Double(height))
        guard scale < 1 else { return (width, height) }
        return (max(1, min(maxWidth, Int((Double(width) * scale).rounded()))),
                max(1, min(maxHeight, Int((Double(height) * scale).rounded()))))
    }

    /// Scaled down to fit `maxWidth × maxHeight` keeping the aspect ratio, by area averaging:
    /// each output pixel is the mean of the source area it covers (fractional edges weighted),
    /// in premultiplied alpha so transparent pixels lend no colour. Never scaled up.
    public func scaled(toFitWidth maxWidth: Int, height maxHeight: Int) -> RGBAImage {
        let target = Self.fittingSize(width: width, height: height, maxWidth: maxWidth, maxHeight: maxHeight)
        return scaled(toWidth: target.width, height: target.height)
    }

    /// Scaled down to exactly `targetWidth × targetHeight` (each no larger than now) by area
    /// averaging, in premultiplied alpha.
    public func scaled(toWidth targetWidth: Int, height targetHeight: Int) -> RGBAImage {
        let target = (width: max(1, min(width, targetWidth)), height: max(1, min(height, targetHeight)))
        guard target != (width, height) else { return self }
        let columns = Self.coverage(source: width, target: target.width)
        let rows = Self.coverage(source: height, target: target.height)
        // Horizontal pass: every source row to `target.width` premultiplied columns.
        var across = [Float](repeating: 0, count: target.width * height * 4)
        pixels.withUnsafeBufferPointer { source in
            across.withUnsafeMutableBufferPointer { out in
                for y in 0..<height {
                    let row = y * width * 4
                    for (x, taps) in columns.enumerated() {
                        var r: Float = 0, g: Float = 0, b: Float = 0, a: Float = 0
                        for tap in taps {
                            let i = row + tap.index * 4
                            let alpha = Float(source[i + 3]) * tap.weight
                            r += Float(source[i]) * alpha
                            g += Float(source[i + 1]) * alpha
                            b += Float(source[i + 2]) * alpha
                            a += alpha
                        }
                        let o = (y * target.width + x) * 4
                        out[o] = r; out[o + 1] = g; out[o + 2] = b; out[o + 3] = a
                    }
                }
            }
        }
        // Vertical pass, then back to straight alpha.
        var result = [UInt8](repeating: 0, count: target.width * target.height * 4)
        across.withUnsafeBufferPointer { source in
            result.withUnsafeMutableBufferPointer { out in
                for (y, taps) in rows.enumerated() {
                    for x in 0..<target.width {
                        var r: Float = 0, g: Float = 0, b: Float = 0, a: Float = 0
                        for tap in taps {
                            let i = (tap.index * target.width + x) * 4
                            r += source[i] * tap.weight
                            g += source[i + 1] * tap.weight
                            b += source[i + 2] * tap.weight
                            a += source[i + 3] * tap.weight
                        }
                        let o = (y * target.width + x) * 4
                        if a > 0 {
                            out[o] = Self.byte(r / a)
                            out[o + 1] = Self.byte(g / a)
                            out[o + 2] = Self.byte(b / a)
                        }
                        out[o + 3] = Self.byte(a)
                    }
                }
            }
        }
        return RGBAImage(width: target.width, height: target.height, pixels: result)
    }

    private static func byte(_ value: Float) -> UInt8 { UInt8(max(0, min(255, value.rounded()))) }

    /// For each target index, the source indexes it covers and their weights (summing to 1).
    private static func coverage(source: Int, target: Int) -> [[(index: Int, weight: Float)]] {
        let step = Double(source) / Double(target)
        return (0..<target).map { t in
            let start = Double(t) * step, end = Double(t + 1) * step
            var taps = [(index: Int, weight: Float)]()
            var s = Int(start)
            while Double(s) < end && s < source {
                let overlap = min(end, Double(s + 1)) - max(start, Double(s))
                if overlap > 0 { taps.append((s, Float(overlap / step))) }
                s += 1
            }
            return taps
        }
    }

    /// Turned as an EXIF orientation (1–8) says the stored pixels must be turned to display
    /// upright; any other value leaves the image as it is.
    public func oriented(_ orientation: Int) -> RGBAImage {
        guard (2...8).contains(orientation) else { return self }
        let swaps = orientation >= 5
        let outWidth = swaps ? height : width, outHeight = swaps ? width : height
        var result = [UInt8](repeating: 0, count: pixels.count)
        let (w, h) = (width, height)
        pixels.withUnsafeBufferPointer { source in
            result.withUnsafeMutableBufferPointer { out in
                for oy in 0..<outHeight {
                    for ox in 0..<outWidth {
                        let (sx, sy): (Int, Int)
                        switch orientation {
                        case 2: (sx, sy) = (w - 1 - ox, oy)
                        case 3: (sx, sy) = (w - 1 - ox, h - 1 - oy)
                        case 4: (sx, sy) = (ox, h - 1 - oy)
                        case 5: (sx, sy) = (oy, ox)
                        case 6: (sx, sy) = (oy, h - 1 - ox)
                        case 7: (sx, sy) = (w - 1 - oy, h - 1 - ox)
                        default: (sx, sy) = (w - 1 - oy, ox)
                        }
                        let i = (sy * w + sx) * 4, o = (oy * outWidth + ox) * 4
                        out[o] = source[i]; out[o + 1] = source[i + 1]; out[o + 2] = source[i + 2]; out[o + 3] = source[i + 3]
                    }
                }
            }
        }
        return RGBAImage(width: outWidth, height: outHeight, pixels: result)
    }
}
