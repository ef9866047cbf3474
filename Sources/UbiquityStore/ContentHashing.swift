import Crypto
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// SHA-256 names of content (lower-case hex).
public enum ContentCopy {
    public static func hash(of data: Data) -> String { hex(SHA256.hash(data: data)) }

    static func hex<D: Sequence>(_ digest: D) -> String where D.Element == UInt8 {
        let table: [UInt8] = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(64)
        for byte in digest {
            out.append(table[Int(byte >> 4)])
            out.append(table[Int(byte & 0xf)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// A blob name must be exactly 64 lower-case hex digits.
    public static func isValidHash(_ hash: String) -> Bool {
        hash.utf8.count == 64 && hash.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}
