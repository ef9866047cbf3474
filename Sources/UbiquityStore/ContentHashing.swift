import Crypto
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Copying file content while computing its SHA-256, the one way content
/// moves between the cache, the staging area and the store.
public enum ContentCopy {
    public static let bufferSize = 1 << 20

    /// Copy everything readable from `source` (from offset 0) into
    /// `destination` (from offset 0, truncated first) and return the SHA-256
    /// hex digest and the byte count. `destination` may be -1 to only hash.
    public static func copy(from source: Int32, to destination: Int32,
                            progress: (UInt64) -> Void = { _ in }) throws -> (hash: String, size: UInt64) {
        var hasher = SHA256()
        var offset: off_t = 0
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: bufferSize, alignment: 4096)
        defer { buffer.deallocate() }
        if destination >= 0 { try syscallRetrying("truncate copy destination") { ftruncate(destination, 0) } }
        while true {
            let n = try syscallRetrying("read content") { pread(source, buffer.baseAddress, bufferSize, offset) }
            if n == 0 { break }
            let chunk = UnsafeRawBufferPointer(rebasing: buffer[0..<n])
            hasher.update(bufferPointer: chunk)
            if destination >= 0 {
                var written = 0
                while written < n {
                    let w = try syscallRetrying("write content") {
                        pwrite(destination, chunk.baseAddress! + written, n - written, offset + off_t(written))
                    }
                    written += w
                }
            }
            offset += off_t(n)
            progress(UInt64(offset))
        }
        return (hex(hasher.finalize()), UInt64(offset))
    }

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
