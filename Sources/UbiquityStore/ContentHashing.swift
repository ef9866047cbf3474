import Crypto
import Foundation
#if canImport(Glibc)
import Glibc
import UbiquityModel
import UbiquityLinux
#endif

/// SHA-256 names of content (lower-case hex).
public enum ContentCopy {
    public static func hash(of data: Data) -> String { hex(SHA256.hash(data: data)) }

    /// The most one `pwrite` puts into the page cache. A larger write into
    /// ext4 (kernel 6.18) ran at either full speed or a quarter of it, from
    /// one run to the next: 1 MiB pieces 0.8–5.1 GiB/s, 256 KiB 2.3–4.7,
    /// 128 KiB a steady 3.8–4.4 (512 MiB into a new file after
    /// `drop_caches`, eight runs each). Every write of file content into the
    /// cache or a store goes in pieces of this size.
    public static let writePiece = 128 << 10

    /// Write all of `data` into `fd` at `offset`.
    public static func write(_ data: Data, to fd: Int32, at offset: UInt64) throws {
        try data.withUnsafeBytes { try write($0, to: fd, at: offset) }
    }

    public static func write(_ bytes: UnsafeRawBufferPointer, to fd: Int32, at offset: UInt64) throws {
        var done = 0
        while done < bytes.count {
            done += try syscallRetrying("write \(bytes.count) bytes at \(offset)") {
                pwrite(fd, bytes.baseAddress! + done, min(bytes.count - done, writePiece), off_t(offset) + off_t(done))
            }
        }
    }

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
}

/// The name of content that arrives in pieces (a blob read through a
/// buffer, a download as it is received).
public struct ContentHasher {
    var sha = SHA256()
    public init() {}
    public mutating func update(_ bytes: UnsafeRawBufferPointer) { sha.update(bufferPointer: bytes) }
    public func finish() -> String { ContentCopy.hex(sha.finalize()) }
}
