import Foundation
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// The index's operation log, `index.log`: how a change reaches the disk
/// before its operation returns, in one `write(2)`.
///
/// A commit (`Replica.transaction`, `persist`, `committedView`) appends one
/// record holding the commit's `IndexOp`s; that is the moment the change is
/// committed. The record is in the kernel once `write` returns, so it
/// survives `kill -9` of the daemon, exactly as a SQLite WAL commit with
/// `synchronous=NORMAL` did (a power loss may lose what the kernel had not
/// written back, as before). `IndexApplier` then writes the records to
/// SQLite in the background, many per SQLite transaction, with the number
/// of the last one (`meta.log_applied`) in the same transaction.
///
/// **Keeping it small.** Once the log has grown past a few MiB it is
/// emptied (`truncate`) if SQLite holds all of it, and otherwise *rotated*:
/// renamed to `index.log.1` (the previous segment) while appends go on in a
/// new `index.log`; the previous segment is deleted as soon as SQLite holds
/// its last record. Under a sustained load the applier never catches up
/// with the very last record, so waiting for that would let the log grow
/// without bound; with rotation it stays within about two segments plus
/// what the applier is truly behind by.
///
/// Opening a replica replays the records SQLite lacks (`seq >
/// log_applied`), from both segments, before the namespace is loaded. A
/// record is used only whole: a length past the end of the file or a
/// checksum that does not match ends the segment there (a write cut short
/// by a full disk, or a power loss), and that tail is cut off.
///
/// Besides index operations a record may carry journaled content (the
/// bytes of a small `fsync`, `JournaledContent`), which SQLite never gets:
/// such a record leaves the log only once its cache file is synced.
///
/// Record: `u32 payload length, u32 CRC-32 of (seq ‖ payload), u64 seq`,
/// then the payload: `u32 op count` and the ops (`IndexOpCodec`), all
/// little-endian. Sequence numbers only grow (they continue from
/// `log_applied` when the log is empty), across segments too.
///
/// **Written ahead.** The current segment keeps zeros written past its last
/// record (`writtenAhead`), and records are written over them: syncing the
/// log is then a data flush, with no change of size or blocks for the
/// filesystem's journal to commit (`fdatasync` costs about half). A zero
/// header ends the records as a cut-off one does.
///
/// Appends, rotation and emptying happen under `Replica.writer`; `fd`,
/// `size`, `allocated`, `lastSeq` and `previousLastSeq` are guarded by it.
final class OperationLog: @unchecked Sendable {
    struct Record {
        var seq: UInt64
        var ops: [IndexOp]
    }

    /// A record as appended: its bytes, a fraction of the memory of its
    /// decoded operations while it waits for the applier.
    struct Encoded {
        var seq: UInt64
        var opCount: Int
        var bytes: [UInt8]

        func decoded() throws -> [IndexOp] {
            guard let record = OperationLog.parse(bytes).records.first, record.seq == seq else {
                throw UbiquityError(EIO, "operation log record \(seq) does not decode")
            }
            return record.ops
        }
    }

    static let headerSize = 16
    let path: String
    /// The previous segment: records appended before the last rotation.
    var previousPath: String { Self.previousPath(path) }
    static func previousPath(_ path: String) -> String { path + ".1" }
    private(set) var fd: Int32
    /// Bytes in the current segment (the end of its last whole record).
    private(set) var size: Int
    /// The current segment's length: its records, then zeros.
    private(set) var allocated = 0
    /// Zeros written ahead of the records at a time.
    static let writtenAhead = 1 << 20
    /// Number of the last record appended (or applied, when the log is empty).
    var lastSeq: UInt64 = 0
    /// Number of the last record of the previous segment; nil when there is none.
    private(set) var previousLastSeq: UInt64?

    /// Open (creating it if needed) the log at `path`; `readRecords` reads it.
    init(path: String) throws {
        self.path = path
        fd = try Self.openSegment(path)
        size = 0
    }

    deinit { close(fd) }

    private static func openSegment(_ path: String) throws -> Int32 {
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            if errno == ENOSPC || errno == EDQUOT {
                throw UbiquityError(ENOSPC, "the replica's disk is full: cannot open its operation log \(path)")
            }
            throw UbiquityError.posix("open the replica's operation log \(path)")
        }
        return fd
    }

    /// The whole records of both segments, in order; cuts off anything
    /// after the whole records of the current one.
    func readRecords() throws -> [Record] {
        var previous: [Record] = []
        if let bytes = try Self.contents(previousPath) {
            previous = Self.parse(bytes).records
            if let last = previous.last { previousLastSeq = last.seq } else { unlink(previousPath) }
        }
        guard let bytes = try Self.contents(fd: fd, path: path) else {
            writeAhead(0)
            return previous
        }
        let (records, offset) = Self.parse(bytes)
        if offset < bytes.count {
            guard ftruncate(fd, off_t(offset)) == 0 else { throw UbiquityError.posix("cut the tail of \(path)") }
        }
        size = offset
        allocated = offset
        writeAhead(0)
        return previous + records
    }

    /// Make sure zeros follow the records for at least `needed` more bytes
    /// (`writtenAhead` at a time). If the disk has no room for them, records
    /// are appended past the end as before.
    private func writeAhead(_ needed: Int) {
        guard size + needed > allocated || allocated == size else { return }
        let target = size + needed + Self.writtenAhead
        let zeros = [UInt8](repeating: 0, count: 64 << 10)
        var at = allocated
        while at < target {
            let n = zeros.withUnsafeBytes { pwrite(fd, $0.baseAddress!, min($0.count, target - at), off_t(at)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            at += n
        }
        allocated = at
    }

    /// The bytes of the segment at `path`; nil if there is none.
    static func contents(_ path: String) throws -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw UbiquityError.posix("open \(path)")
        }
        defer { close(fd) }
        return try contents(fd: fd, path: path)
    }

    private static func contents(fd: Int32, path: String) throws -> [UInt8]? {
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw UbiquityError.posix("stat \(path)") }
        var bytes = [UInt8](repeating: 0, count: Int(st.st_size))
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, $0.count - done, off_t(done)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw UbiquityError.posix("read \(path)") }
            done += n
        }
        return bytes.isEmpty ? nil : bytes
    }

    /// Every whole record of the log at `path`, both segments, read
    /// without changing anything (for a reader without the replica's lock).
    static func records(atPath path: String) throws -> [Record] {
        let previous = try contents(previousPath(path)).map { parse($0).records } ?? []
        let current = try contents(path).map { parse($0).records } ?? []
        return previous + current
    }

    /// The whole records at the start of `bytes`, and where they end.
    static func parse(_ bytes: [UInt8]) -> (records: [Record], end: Int) {
        var records: [Record] = []
        var offset = 0
        while offset + Self.headerSize <= bytes.count {
            var reader = ByteReader(bytes: bytes, offset: offset)
            guard let length = try? reader.u32(), let checksum = try? reader.u32(), let seq = try? reader.u64() else { break }
            let end = offset + Self.headerSize + Int(length)
            guard end <= bytes.count,
                  CRC32.checksum(bytes[(offset + 8)..<end]) == checksum,
                  let ops = try? IndexOpCodec.decode(&reader, end: end) else { break }
            records.append(Record(seq: seq, ops: ops))
            offset = end
        }
        return (records, offset)
    }

    /// Append one record of `ops` (the caller holds `Replica.writer`) and
    /// return its number. A failed write leaves the log as it was: `ENOSPC`
    /// when the disk has no room, `EIO` otherwise.
    func append(_ ops: [IndexOp]) throws -> Encoded {
        let seq = lastSeq + 1
        let bytes = Self.encode(seq: seq, ops)
        writeAhead(bytes.count)
        var written = 0
        while written < bytes.count {
            let n = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress! + written, $0.count - written, off_t(size + written)) }
            if n < 0 {
                if errno == EINTR { continue }
                let code = errno
                // A record cut short must not stay: the next one would follow garbage.
                _ = ftruncate(fd, off_t(size))
                allocated = size
                if code == ENOSPC || code == EDQUOT {
                    throw UbiquityError(ENOSPC, "the replica's disk is full: the index cannot record the change")
                }
                throw UbiquityError(EIO, "write the replica's operation log \(path): \(String(cString: strerror(code)))")
            }
            written += n
        }
        size += bytes.count
        allocated = max(allocated, size)
        lastSeq = seq
        return Encoded(seq: seq, opCount: ops.count, bytes: bytes)
    }

    /// Empty the log, both segments (every record is in SQLite; the caller
    /// holds `Replica.writer`).
    func truncate() {
        removePrevious()
        if ftruncate(fd, 0) == 0 {
            size = 0
            allocated = 0
            writeAhead(0)
        }
    }

    /// Delete the previous segment (SQLite holds all of it).
    func removePrevious() {
        guard previousLastSeq != nil else { return }
        if unlink(previousPath) == 0 || errno == ENOENT { previousLastSeq = nil }
    }

    /// Make the current segment the previous one and go on in a new, empty
    /// one. Only while there is no previous segment; on any failure the log
    /// stays as it was (appends go on in the current segment).
    ///
    /// The segment set aside is synced, and so are the two names, before
    /// appends go on: `Replica.makeDurable` then only has the current
    /// segment to sync. (Rotations come once per few MiB of log.)
    func rotate() {
        guard previousLastSeq == nil, size > 0 else { return }
        guard fdatasync(fd) == 0 else { return }
        guard rename(path, previousPath) == 0 else { return }
        guard let newFD = try? Self.openSegment(path) else {
            // No room for a new file: keep the one we have.
            _ = rename(previousPath, path)
            return
        }
        try? LinuxCalls.syncDirectory((path as NSString).deletingLastPathComponent)
        close(fd)
        fd = newFD
        previousLastSeq = lastSeq
        size = 0
        allocated = 0
        writeAhead(0)
    }

    static func encode(seq: UInt64, _ ops: [IndexOp]) -> [UInt8] {
        var w = ByteWriter()
        w.bytes.reserveCapacity(64 + ops.count * 160)
        w.u32(0)   // length, filled in below
        w.u32(0)   // checksum, filled in below
        w.u64(seq)
        IndexOpCodec.encode(ops, into: &w)
        let length = UInt32(w.bytes.count - headerSize)
        let checksum = CRC32.checksum(w.bytes[8...])
        w.set(u32: length, at: 0)
        w.set(u32: checksum, at: 4)
        return w.bytes
    }
}

/// The binary form of `IndexOp`s in the operation log. A node carries
/// exactly the fields the index stores (`Index.writeTransaction`).
enum IndexOpCodec {
    static func encode(_ ops: [IndexOp], into w: inout ByteWriter) {
        w.u32(UInt32(ops.count))
        for op in ops {
            switch op {
            case .node(let n):
                w.u8(1)
                w.u64(n.ino); w.string(n.id); w.string(n.kind.rawValue)
                w.u32(n.mode); w.u32(n.uid); w.u32(n.gid)
                w.u64(n.size); w.u64(n.rdev); w.optionalString(n.target)
                w.optionalString(n.hash); w.u64(n.hashSize); w.bool(n.chunked)
                for t in [n.atime, n.mtime, n.ctime, n.btime] { w.u64(UInt64(bitPattern: t.sec)); w.u64(UInt64(bitPattern: t.nsec)) }
                w.u32(UInt32(n.xattrs.count))
                for (key, value) in n.xattrs { w.string(key); w.data(Array(value)) }
                w.bool(n.hasContent); w.u64(n.contentGeneration); w.u64(n.pushedGeneration)
                w.u64(n.version); w.u64(n.change); w.u64(n.pushed); w.bool(n.unlinked)
                w.u64(n.lastParent); w.data(n.lastName.bytes)
                w.u32(UInt32(n.conflicts.count))
                for c in n.conflicts { w.string(c) }
                w.bool(n.pinned); w.string(n.author); w.optionalString(n.verifiedHash); w.bool(n.unacknowledgedWrites)
            case .removeNode(let ino):
                w.u8(2); w.u64(ino)
            case .entry(let parent, let name, let child):
                w.u8(3); w.u64(parent); w.data(name.bytes); w.u64(child)
            case .removeEntry(let parent, let name):
                w.u8(4); w.u64(parent); w.data(name.bytes)
            case .pendingEntry(let parent, let name, let change, let base):
                w.u8(5); w.u64(parent); w.data(name.bytes); w.u64(change); w.u64(base)
            case .clearPendingEntry(let parent, let name):
                w.u8(6); w.u64(parent); w.data(name.bytes)
            case .meta(let key, let value):
                w.u8(7); w.string(key); w.string(value)
            case .quarantine(let record):
                w.u8(8); w.u64(record.seq); w.string(record.reason); w.u64(record.date.timeIntervalSince1970.bitPattern)
            case .journaledContent(let c):
                w.u8(9); w.u64(c.ino); w.u64(c.version); w.u64(c.smallestSize); w.u64(c.size)
                w.u32(UInt32(c.pieces.count))
                for piece in c.pieces { w.u64(piece.offset); w.data(piece.bytes) }
            case .contentOnDisk(let ino):
                w.u8(10); w.u64(ino)
            }
        }
    }

    struct Malformed: Error {}

    static func decode(_ r: inout ByteReader, end: Int) throws -> [IndexOp] {
        let count = Int(try r.u32())
        var ops: [IndexOp] = []
        ops.reserveCapacity(min(count, 4096))
        for _ in 0..<count {
            switch try r.u8() {
            case 1:
                let ino = try r.u64()
                let id = try r.string()
                guard let kind = NodeKind(rawValue: try r.string()) else { throw Malformed() }
                let mode = try r.u32(), uid = try r.u32(), gid = try r.u32()
                let size = try r.u64(), rdev = try r.u64()
                let target = try r.optionalString()
                var n = LocalNode(ino: ino, id: id, kind: kind, mode: mode, uid: uid, gid: gid,
                                  size: size, rdev: rdev, target: target, time: Timespec(sec: 0, nsec: 0))
                n.hash = try r.optionalString(); n.hashSize = try r.u64(); n.chunked = try r.bool()
                var times: [Timespec] = []
                for _ in 0..<4 { times.append(Timespec(sec: Int64(bitPattern: try r.u64()), nsec: Int64(bitPattern: try r.u64()))) }
                (n.atime, n.mtime, n.ctime, n.btime) = (times[0], times[1], times[2], times[3])
                let xattrCount = Int(try r.u32())
                for _ in 0..<xattrCount {
                    let key = try r.string()
                    n.xattrs[key] = Data(try r.data())
                }
                n.hasContent = try r.bool(); n.contentGeneration = try r.u64(); n.pushedGeneration = try r.u64()
                n.version = try r.u64(); n.change = try r.u64(); n.pushed = try r.u64(); n.unlinked = try r.bool()
                n.lastParent = try r.u64(); n.lastName = FileName(bytes: try r.data())
                let conflictCount = Int(try r.u32())
                for _ in 0..<conflictCount { n.conflicts.append(try r.string()) }
                n.pinned = try r.bool(); n.author = try r.string(); n.verifiedHash = try r.optionalString()
                n.unacknowledgedWrites = try r.bool()
                ops.append(.node(n))
            case 2: ops.append(.removeNode(try r.u64()))
            case 3: ops.append(.entry(parent: try r.u64(), name: FileName(bytes: try r.data()), child: try r.u64()))
            case 4: ops.append(.removeEntry(parent: try r.u64(), name: FileName(bytes: try r.data())))
            case 5: ops.append(.pendingEntry(parent: try r.u64(), name: FileName(bytes: try r.data()),
                                             change: try r.u64(), base: try r.u64()))
            case 6: ops.append(.clearPendingEntry(parent: try r.u64(), name: FileName(bytes: try r.data())))
            case 7: ops.append(.meta(key: try r.string(), value: try r.string()))
            case 8: ops.append(.quarantine(QuarantinedRecord(seq: try r.u64(), reason: try r.string(),
                                                             date: Date(timeIntervalSince1970: Double(bitPattern: try r.u64())))))
            case 9:
                let ino = try r.u64(), version = try r.u64(), smallest = try r.u64(), size = try r.u64()
                let count = Int(try r.u32())
                guard count <= JournaledContent.mostRanges else { throw Malformed() }
                var pieces: [JournaledContent.Piece] = []
                for _ in 0..<count { pieces.append(JournaledContent.Piece(offset: try r.u64(), bytes: try r.data())) }
                ops.append(.journaledContent(JournaledContent(ino: ino, version: version, smallestSize: smallest,
                                                              size: size, pieces: pieces)))
            case 10: ops.append(.contentOnDisk(try r.u64()))
            default: throw Malformed()
            }
            guard r.offset <= end else { throw Malformed() }
        }
        guard r.offset == end else { throw Malformed() }
        return ops
    }
}

struct ByteWriter {
    var bytes: [UInt8] = []

    mutating func u8(_ v: UInt8) { bytes.append(v) }
    mutating func bool(_ v: Bool) { bytes.append(v ? 1 : 0) }
    mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { bytes.append(contentsOf: $0) } }
    mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.littleEndian) { bytes.append(contentsOf: $0) } }
    mutating func data(_ v: [UInt8]) { u32(UInt32(v.count)); bytes.append(contentsOf: v) }
    mutating func string(_ v: String) { data(Array(v.utf8)) }
    mutating func optionalString(_ v: String?) {
        bool(v != nil)
        if let v { string(v) }
    }
    mutating func set(u32 v: UInt32, at offset: Int) {
        withUnsafeBytes(of: v.littleEndian) { for (i, b) in $0.enumerated() { bytes[offset + i] = b } }
    }
}

struct ByteReader {
    let bytes: [UInt8]
    var offset: Int

    mutating func take(_ n: Int) throws -> ArraySlice<UInt8> {
        guard n >= 0, n <= bytes.count - offset else { throw IndexOpCodec.Malformed() }
        defer { offset += n }
        return bytes[offset..<(offset + n)]
    }
    mutating func u8() throws -> UInt8 { try take(1).first! }
    mutating func bool() throws -> Bool {
        switch try u8() {
        case 0: return false
        case 1: return true
        default: throw IndexOpCodec.Malformed()
        }
    }
    mutating func u32() throws -> UInt32 {
        try take(4).reversed().reduce(0) { $0 << 8 | UInt32($1) }
    }
    mutating func u64() throws -> UInt64 {
        try take(8).reversed().reduce(0) { $0 << 8 | UInt64($1) }
    }
    mutating func data() throws -> [UInt8] { Array(try take(Int(try u32()))) }
    mutating func string() throws -> String {
        let raw = try data()
        guard let s = String(validating: raw, as: UTF8.self) else { throw IndexOpCodec.Malformed() }
        return s
    }
    mutating func optionalString() throws -> String? { try bool() ? try string() : nil }
}

/// CRC-32 (IEEE 802.3), for telling a whole log record from a cut-off one.
///
/// Slicing-by-8 (eight bytes per step through eight tables): the same
/// checksum as the byte-at-a-time table, about five times as fast; it was
/// the daemon's largest user-space cost in a loop of small appends and
/// `fdatasync`s, where each record is checksummed once written and once
/// when `IndexApplier` decodes it.
enum CRC32 {
    /// `tables[k][b]`: the CRC of byte `b` followed by `k` zero bytes.
    static let tables: [UInt32] = {
        var t = [UInt32](repeating: 0, count: 8 * 256)
        for i in 0..<256 {
            var c = UInt32(i)
            for _ in 0..<8 { c = c & 1 != 0 ? 0xEDB8_8320 ^ (c >> 1) : c >> 1 }
            t[i] = c
        }
        for k in 1..<8 {
            for i in 0..<256 {
                let previous = t[(k - 1) * 256 + i]
                t[k * 256 + i] = t[Int(previous & 0xFF)] ^ (previous >> 8)
            }
        }
        return t
    }()

    static func checksum(_ bytes: ArraySlice<UInt8>) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        tables.withUnsafeBufferPointer { t in
            bytes.withUnsafeBufferPointer { b in
                var i = 0
                let n = b.count
                while i + 8 <= n {
                    let low = crc ^ (UInt32(b[i]) | UInt32(b[i + 1]) << 8 | UInt32(b[i + 2]) << 16 | UInt32(b[i + 3]) << 24)
                    crc = t[7 * 256 + Int(low & 0xFF)] ^ t[6 * 256 + Int((low >> 8) & 0xFF)]
                        ^ t[5 * 256 + Int((low >> 16) & 0xFF)] ^ t[4 * 256 + Int(low >> 24)]
                        ^ t[3 * 256 + Int(b[i + 4])] ^ t[2 * 256 + Int(b[i + 5])]
                        ^ t[256 + Int(b[i + 6])] ^ t[Int(b[i + 7])]
                    i += 8
                }
                while i < n {
                    crc = t[Int((crc ^ UInt32(b[i])) & 0xFF)] ^ (crc >> 8)
                    i += 1
                }
            }
        }
        return crc ^ 0xFFFF_FFFF
    }
}
