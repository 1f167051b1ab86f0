import Foundation

/// Why image bytes could not be turned into an avatar: every hostile or broken input maps to
/// one of these codes, and nothing is kept of it.
public struct ImageError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Code: String, Sendable, Hashable {
        /// More bytes than ``ImageLimits/maximumBytes``: refused before anything is read.
        case inputTooLarge
        /// The header claims more pixels than ``ImageLimits/maximumPixels`` (a decompression
        /// bomb): refused before any pixel is decoded.
        case tooManyPixels
        /// Neither a PNG nor a JPEG (by the magic bytes at its start).
        case notAnImage
        /// A PNG or JPEG that is truncated, damaged, or whose content contradicts its header.
        case corrupt
        /// A valid file of a kind this decoder does not take (say, a JPEG colour space the
        /// library cannot convert).
        case unsupported
        /// The library could not encode the result (out of memory).
        case encodingFailed
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code.rawValue): \(message)" }
}

/// Limits on images taken in, checked before any pixel is decoded.
public struct ImageLimits: Sendable, Hashable {
    /// The most bytes an input may have (default 20 MiB).
    public var maximumBytes: Int
    /// The most pixels (width × height) an input's header may claim (default 25 million): what
    /// decoding may cost in memory is proportional to it (4 bytes a pixel for a PNG).
    public var maximumPixels: Int

    public init(maximumBytes: Int = 20 << 20, maximumPixels: Int = 25_000_000) {
        self.maximumBytes = maximumBytes
        self.maximumPixels = maximumPixels
    }

    func check(bytes: Int) throws(ImageError) {
        guard bytes <= maximumBytes else {
            throw ImageError(.inputTooLarge, "the image is \(bytes) bytes; the limit is \(maximumBytes)")
        }
    }

    func check(width: Int, height: Int) throws(ImageError) {
        guard width > 0, height > 0 else { throw ImageError(.corrupt, "the header says \(width)×\(height) pixels") }
        guard width.multipliedReportingOverflow(by: height).partialValue <= maximumPixels, width <= maximumPixels, height <= maximumPixels else {
            throw ImageError(.tooManyPixels, "the header claims \(width)×\(height) pixels; the limit is \(maximumPixels) pixels")
        }
    }
}
