import Foundation

/// A directory entry name: the exact bytes the kernel gave us.
///
/// Swift's `String` compares canonically equivalent Unicode as equal (an NFC
/// and an NFD "é" would collide) and cannot hold bytes that are not UTF-8;
/// a POSIX filesystem must do neither. So names are bytes, compared byte by
/// byte. In the journal a name is a JSON string when it is valid UTF-8, and
/// `{"base64": "…"}` otherwise.
public struct FileName: Hashable, Sendable, Comparable, CustomStringConvertible, ExpressibleByStringLiteral, Codable {
    public var bytes: [UInt8]

    public init(bytes: [UInt8]) { self.bytes = bytes }
    public init(_ string: String) { bytes = Array(string.utf8) }
    public init(stringLiteral value: String) { self.init(value) }

    /// From a NUL-terminated C string.
    public init(cString: UnsafePointer<CChar>) {
        let length = strlen(cString)
        bytes = cString.withMemoryRebound(to: UInt8.self, capacity: length) { Array(UnsafeBufferPointer(start: $0, count: length)) }
    }

    public var count: Int { bytes.count }
    public var isEmpty: Bool { bytes.isEmpty }
    /// The name for people (invalid UTF-8 shown as U+FFFD).
    public var description: String { String(decoding: bytes, as: UTF8.self) }
    var validUTF8: String? { String(validating: bytes, as: UTF8.self) }

    public static func < (a: FileName, b: FileName) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }

    /// The name NUL-terminated, in a temporary buffer (on the stack for a
    /// name of the usual size: a listing makes one per entry).
    public func withCString<R>(_ body: (UnsafePointer<CChar>) throws -> R) rethrows -> R {
        try withUnsafeTemporaryAllocation(of: CChar.self, capacity: bytes.count + 1) { buffer in
            bytes.withUnsafeBytes { raw in
                if raw.count > 0 { UnsafeMutableRawPointer(buffer.baseAddress!).copyMemory(from: raw.baseAddress!, byteCount: raw.count) }
            }
            buffer[bytes.count] = 0
            return try body(buffer.baseAddress!)
        }
    }

    private enum Keys: String, CodingKey { case base64 }

    public init(from decoder: any Decoder) throws {
        if let string = try? decoder.singleValueContainer().decode(String.self) {
            bytes = Array(string.utf8)
        } else if let c = try? decoder.container(keyedBy: Keys.self), let base64 = try? c.decode(String.self, forKey: .base64) {
            guard let data = Data(base64Encoded: base64) else {
                throw DecodingError.dataCorruptedError(forKey: .base64, in: c, debugDescription: "name is not valid base64")
            }
            bytes = Array(data)
        } else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath,
                                                    debugDescription: "name is neither a string nor {\"base64\": …}"))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        if let string = validUTF8 {
            var c = encoder.singleValueContainer()
            try c.encode(string)
        } else {
            var c = encoder.container(keyedBy: Keys.self)
            try c.encode(Data(bytes).base64EncodedString(), forKey: .base64)
        }
    }
}
