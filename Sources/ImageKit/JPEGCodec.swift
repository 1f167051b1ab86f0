import CTurboJPEG
import Foundation

/// JPEG through libjpeg-turbo's TurboJPEG API: baseline, progressive, grayscale and CMYK/YCCK
/// files, decoded straight at a reduced size (DCT scaling: 1/2 … 1/8) when the result is to be
/// much smaller anyway. <https://libjpeg-turbo.org/Documentation/Documentation>
enum JPEGCodec {
    static let magic: [UInt8] = [0xFF, 0xD8, 0xFF]

    /// Decodes the pixels as stored (the EXIF orientation is applied by the caller).
    /// - Parameter fitting: the size the caller will scale the image down to fit (in stored
    ///   orientation); the library then decodes at the smallest DCT scale that still covers it.
    /// - Returns: the pixels, and the image's full size as stored.
    static func decode(_ data: Data, limits: ImageLimits, fitting: (width: Int, height: Int)? = nil) throws(ImageError) -> (image: RGBAImage, width: Int, height: Int) {
        guard let handle = tjInitDecompress() else { throw ImageError(.encodingFailed, "cannot start a TurboJPEG decompressor") }
        defer { tjDestroy(handle) }
        let outcome = data.withUnsafeBytes { raw -> Result<(image: RGBAImage, width: Int, height: Int), ImageError> in
            guard let base = raw.bindMemory(to: UInt8.self).baseAddress else { return .failure(ImageError(.corrupt, "an empty JPEG")) }
            let size = UInt(raw.count)
            var width: Int32 = 0, height: Int32 = 0, subsampling: Int32 = 0, colorspace: Int32 = 0
            guard tjDecompressHeader3(handle, base, size, &width, &height, &subsampling, &colorspace) == 0 else {
                return .failure(ImageError(.corrupt, "not a readable JPEG: \(errorText(handle))"))
            }
            do throws(ImageError) { try limits.check(width: Int(width), height: Int(height)) } catch { return .failure(error) }
            let factor = scale(width: Int(width), height: Int(height), fitting: fitting)
            let outWidth = scaled(Int(width), factor), outHeight = scaled(Int(height), factor)
            let cmyk = colorspace == Int32(TJCS_CMYK.rawValue) || colorspace == Int32(TJCS_YCCK.rawValue)
            var pixels = [UInt8](repeating: 0, count: outWidth * outHeight * 4)
            let format = cmyk ? TJPF_CMYK : TJPF_RGBA
            // A warning (a truncated file, say) stops the decoder: a half-grey image is no avatar.
            let flags = Int32(TJFLAG_STOPONWARNING | TJFLAG_ACCURATEDCT)
            let status = pixels.withUnsafeMutableBufferPointer { out in
                tjDecompress2(handle, base, size, out.baseAddress, Int32(outWidth), 0, Int32(outHeight), Int32(format.rawValue), flags)
            }
            guard status == 0 else { return .failure(ImageError(.corrupt, "a damaged or truncated JPEG: \(errorText(handle))")) }
            if cmyk { convertCMYK(&pixels) }
            return .success((RGBAImage(width: outWidth, height: outHeight, pixels: pixels), Int(width), Int(height)))
        }
        return try outcome.get()
    }

    /// The smallest of the library's scaling factors whose result still covers the size the
    /// image will have once fitted in `box` (so area averaging does the last step), or 1/1.
    private static func scale(width: Int, height: Int, fitting box: (width: Int, height: Int)?) -> tjscalingfactor {
        let one = tjscalingfactor(num: 1, denom: 1)
        guard let box else { return one }
        let fitting = RGBAImage.fittingSize(width: width, height: height, maxWidth: box.width, maxHeight: box.height)
        var count: Int32 = 0
        guard let factors = tjGetScalingFactors(&count) else { return one }
        var best = one
        for i in 0..<Int(count) {
            let factor = factors[i]
            guard factor.num <= factor.denom, factor.num > 0,
                scaled(width, factor) >= fitting.width, scaled(height, factor) >= fitting.height,
                Double(factor.num) / Double(factor.denom) < Double(best.num) / Double(best.denom)
            else { continue }
            best = factor
        }
        return best
    }

    /// `TJSCALED`: the integer ceiling of `dimension × factor`.
    private static func scaled(_ dimension: Int, _ factor: tjscalingfactor) -> Int {
        (dimension * Int(factor.num) + Int(factor.denom) - 1) / Int(factor.denom)
    }

    /// CMYK (as the library gives it: 0 is no ink) to RGB, in place, alpha opaque. Not colour
    /// managed: the naive formula.
    private static func convertCMYK(_ pixels: inout [UInt8]) {
        for i in stride(from: 0, to: pixels.count, by: 4) {
            let k = 255 - Int(pixels[i + 3])
            pixels[i] = UInt8((255 - Int(pixels[i])) * k / 255)
            pixels[i + 1] = UInt8((255 - Int(pixels[i + 1])) * k / 255)
            pixels[i + 2] = UInt8((255 - Int(pixels[i + 2])) * k / 255)
            pixels[i + 3] = 255
        }
    }

    private static func errorText(_ handle: tjhandle) -> String {
        tjGetErrorStr2(handle).map { String(cString: $0) } ?? "unknown error"
    }

    /// How a JPEG is written (for tests, fixtures and the bench).
    enum Encoding {
        case color, grayscale, cmyk
    }

    /// Encodes opaque pixels as a JPEG (alpha is dropped). CMYK takes the RGB pixels' naive
    /// CMYK equivalent.
    static func encode(_ image: RGBAImage, quality: Int, progressive: Bool, as encoding: Encoding) throws(ImageError) -> Data {
        guard let handle = tjInitCompress() else { throw ImageError(.encodingFailed, "cannot start a TurboJPEG compressor") }
        defer { tjDestroy(handle) }
        var source = image.pixels
        var format = TJPF_RGBA
        var subsampling = TJSAMP_420
        switch encoding {
        case .color: break
        case .grayscale: subsampling = TJSAMP_GRAY
        case .cmyk:
            format = TJPF_CMYK
            for i in stride(from: 0, to: source.count, by: 4) {
                let r = Int(source[i]), g = Int(source[i + 1]), b = Int(source[i + 2])
                let maximum = max(r, g, b)
                source[i + 3] = UInt8(255 - maximum)
                for c in 0..<3 { source[i + c] = maximum == 0 ? 0 : UInt8(255 - Int(source[i + c]) * 255 / maximum) }
            }
        }
        var output: UnsafeMutablePointer<UInt8>? = nil
        var size: UInt = 0
        let flags = Int32(progressive ? TJFLAG_PROGRESSIVE : 0) | Int32(TJFLAG_ACCURATEDCT)
        let status = source.withUnsafeBufferPointer { pixels in
            tjCompress2(handle, pixels.baseAddress, Int32(image.width), 0, Int32(image.height), Int32(format.rawValue), &output, &size,
                        Int32(subsampling.rawValue), Int32(quality), flags)
        }
        defer { tjFree(output) }
        guard status == 0, let output else { throw ImageError(.encodingFailed, "TurboJPEG: \(errorText(handle))") }
        return Data(bytes: output, count: Int(size))
    }
}
