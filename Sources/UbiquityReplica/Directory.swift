import Foundation
import UbiquityModel

/// One directory's entries (name → inode number and cookie), as the
/// namespace keeps them: 16 bytes per entry, the names in one byte buffer
/// per directory (each after its length, a LEB128 varint), and above
/// `indexThreshold` entries an open-addressing index of positions, 2 bytes
/// each below 65,535 entries (linear probing, at most 4/5 full) keyed by a
/// seeded hash of the name.
/// A small directory is searched by comparing names.
///
/// A `Directory` is also the value `Namespace.children` and
/// `Namespace.entries(of:)` hand out: a copy-on-write snapshot, iterated as
/// `(key: FileName, value: DirEntry)` pairs in no particular order, like the
/// dictionary it replaces. Names are made (`FileName`) only when read.
///
/// Removing an entry leaves its name's bytes behind (`garbage`); once they
/// are more than half the buffer, `compactNames` rewrites it. A node whose
/// last name is its entry's name shares these bytes (`NodeStore`), so the
/// store moves that reference along.
public struct Directory: Sequence, Sendable {
    struct Entry: Sendable {
        var inoLow: UInt32
        var cookieLow: UInt32
        /// Offset of the name (its length, then its bytes) in `names`.
        var name: UInt32
        var inoHigh: UInt16
        var cookieHigh: UInt16

        init(ino: UInt64, cookie: UInt64, name: UInt32) {
            // Inode numbers and cookies are handed out one by one from 1 and 3:
            // 48 bits last longer than anything could use them up.
            precondition(ino >> 48 == 0 && cookie >> 48 == 0, "inode number or cookie past 48 bits")
            inoLow = UInt32(truncatingIfNeeded: ino)
            inoHigh = UInt16(truncatingIfNeeded: ino >> 32)
            cookieLow = UInt32(truncatingIfNeeded: cookie)
            cookieHigh = UInt16(truncatingIfNeeded: cookie >> 32)
            self.name = name
        }

        var ino: UInt64 { UInt64(inoHigh) << 32 | UInt64(inoLow) }
        var cookie: UInt64 { UInt64(cookieHigh) << 32 | UInt64(cookieLow) }
        var value: DirEntry { DirEntry(ino: ino, cookie: cookie) }
    }

    var entries: [Entry] = []
    var names: [UInt8] = []
    /// Positions in `entries` plus one (0: empty); empty up to `indexThreshold` entries.
    var buckets = NarrowBuckets()
    /// Bytes of `names` no entry uses any more.
    var garbage = 0

    static let indexThreshold = 8

    public init() {}

    public var count: Int { entries.count }
    public var isEmpty: Bool { entries.isEmpty }

    public subscript(name: FileName) -> DirEntry? {
        position(of: name.bytes).map { entries[$0].value }
    }

    public var keys: LazyMapSequence<Range<Int>, FileName> { entries.indices.lazy.map { self.name(at: self.entries[$0].name) } }
    public var values: LazyMapSequence<Range<Int>, DirEntry> { entries.indices.lazy.map { self.entries[$0].value } }

    public struct Iterator: IteratorProtocol {
        let directory: Directory
        var position = 0
        public mutating func next() -> (key: FileName, value: DirEntry)? {
            guard position < directory.entries.count else { return nil }
            defer { position += 1 }
            let entry = directory.entries[position]
            return (directory.name(at: entry.name), entry.value)
        }
    }

    public func makeIterator() -> Iterator { Iterator(directory: self) }

    /// The entry at `position` (positions are 0..<count, in no particular order).
    public func value(at position: Int) -> DirEntry { entries[position].value }

    public func cookie(at position: Int) -> UInt64 { entries[position].cookie }

    /// Reads names in place, without copying them out.
    public struct NameBytes {
        let directory: Directory
        let bytes: UnsafeRawBufferPointer

        /// The bytes of the name at `position`, valid while the reader is.
        public func name(at position: Int) -> UnsafeRawBufferPointer {
            UnsafeRawBufferPointer(rebasing: bytes[directory.nameRange(at: directory.entries[position].name)])
        }
    }

    /// Run `body` with a reader of the names in place (a listing: no name copied out).
    public func withNames<R>(_ body: (NameBytes) throws -> R) rethrows -> R {
        try names.withUnsafeBytes { try body(NameBytes(directory: self, bytes: $0)) }
    }

    /// Every position, in cookie order (creation order: what a listing shows).
    public func positionsByCookie() -> [Int] {
        var positions = Array(entries.indices)
        var sorted = true
        for i in entries.indices.dropFirst() where entries[i - 1].cookie > entries[i].cookie {
            sorted = false
            break
        }
        if !sorted { positions.sort { entries[$0].cookie < entries[$1].cookie } }
        return positions
    }

    // MARK: Names

    /// Where the bytes of the name at `offset` are.
    @inline(__always)
    func nameRange(at offset: UInt32) -> Range<Int> {
        var i = Int(offset)
        var length = 0
        var shift = 0
        while true {
            let byte = names[i]
            i += 1
            length |= Int(byte & 0x7f) << shift
            if byte < 0x80 { break }
            shift += 7
        }
        return i..<(i + length)
    }

    func name(at offset: UInt32) -> FileName {
        FileName(bytes: Array(names[nameRange(at: offset)]))
    }

    @inline(__always)
    func nameEquals(at offset: UInt32, _ bytes: [UInt8]) -> Bool {
        let range = nameRange(at: offset)
        guard range.count == bytes.count else { return false }
        return names.withUnsafeBufferPointer { stored in
            bytes.withUnsafeBufferPointer { wanted in
                range.isEmpty || memcmp(stored.baseAddress! + range.lowerBound, wanted.baseAddress!, range.count) == 0
            }
        }
    }

    static func hash(_ bytes: UnsafeBufferPointer<UInt8>) -> UInt64 {
        var hasher = Hasher()
        hasher.combine(bytes: UnsafeRawBufferPointer(bytes))
        return UInt64(bitPattern: Int64(hasher.finalize()))
    }

    static func hash(_ bytes: [UInt8]) -> UInt64 { bytes.withUnsafeBufferPointer { hash($0) } }

    func hash(at offset: UInt32) -> UInt64 {
        let range = nameRange(at: offset)
        return names.withUnsafeBufferPointer { Self.hash(UnsafeBufferPointer(rebasing: $0[range])) }
    }

    @inline(__always)
    func home(_ hash: UInt64) -> Int { Int(hash.multipliedFullWidth(by: UInt64(buckets.count)).high) }

    // MARK: Finding

    /// The position of the entry named `name` among the directory's entries:
    /// the order they were added in, until one is removed (the last entry
    /// then takes its place).
    public func position(of name: FileName) -> Int? { position(of: name.bytes) }

    /// The inode number of the entry at `position` (`position(of:)`).
    public func ino(at position: Int) -> UInt64 { entries[position].ino }

    /// The position in `entries` of the entry named `bytes`.
    func position(of bytes: [UInt8]) -> Int? {
        if buckets.isEmpty {
            for (i, entry) in entries.enumerated() where nameEquals(at: entry.name, bytes) { return i }
            return nil
        }
        var b = home(Self.hash(bytes))
        while true {
            let value = buckets[b]
            if value == 0 { return nil }
            let p = Int(value - 1)
            if nameEquals(at: entries[p].name, bytes) { return p }
            b += 1
            if b == buckets.count { b = 0 }
        }
    }

    /// The bucket holding position `p`.
    func bucket(of p: Int) -> Int {
        var b = home(hash(at: entries[p].name))
        while buckets[b] != UInt32(p + 1) {
            b += 1
            if b == buckets.count { b = 0 }
        }
        return b
    }

    // MARK: Changing

    /// Add an entry under a name not in the directory; returns its name's offset.
    @discardableResult
    mutating func append(_ bytes: [UInt8], _ value: DirEntry) -> UInt32 {
        let offset = UInt32(names.count)
        precondition(names.count + bytes.count + 10 < Int(UInt32.max), "a directory's names past 4 GiB")
        Self.makeRoom(&names, for: names.count + bytes.count + 5)
        Self.makeRoom(&entries, for: entries.count + 1)
        var length = bytes.count
        repeat {
            names.append(UInt8(length & 0x7f) | (length >= 0x80 ? 0x80 : 0))
            length >>= 7
        } while length > 0
        names.append(contentsOf: bytes)
        entries.append(Entry(ino: value.ino, cookie: value.cookie, name: offset))
        if buckets.isEmpty {
            if entries.count > Self.indexThreshold { rebuildIndex() }
        } else if entries.count * 5 > buckets.count * 4 || !buckets.holds(entries.count) {
            rebuildIndex()
        } else {
            insertBucket(entries.count - 1, hash: Self.hash(bytes))
        }
        return offset
    }

    /// Grow `array` to hold `count` elements by an eighth more, not by
    /// doubling as `append` would: a directory's buffers are most of the
    /// namespace's memory after the node records, and all directories of
    /// a tree filled evenly grow in lockstep (with doubling, a million
    /// names in 1,000 directories kept 7 MiB of room nobody used).
    @inline(__always)
    static func makeRoom<T>(_ array: inout [T], for count: Int) {
        if count > array.capacity { array.reserveCapacity(count + count / 8 + 8) }
    }

    /// Set the value of the entry at `p` (its name stays).
    mutating func replace(at p: Int, _ value: DirEntry) {
        entries[p] = Entry(ino: value.ino, cookie: value.cookie, name: entries[p].name)
    }

    /// Remove the entry at `p` (the last entry takes its place).
    mutating func remove(at p: Int) {
        let range = nameRange(at: entries[p].name)
        garbage += range.upperBound - Int(entries[p].name)
        let last = entries.count - 1
        if !buckets.isEmpty {
            removeBucket(bucket(of: p))
            if p != last { buckets[bucket(of: last)] = UInt32(p + 1) }
        }
        entries[p] = entries[last]
        entries.removeLast()
        if entries.isEmpty {
            self = Directory()
        } else if !buckets.isEmpty && entries.count <= Self.indexThreshold / 2 {
            buckets = NarrowBuckets()
        } else if buckets.count > 64 && entries.count * 8 < buckets.count {
            rebuildIndex()
        }
    }

    /// Whether the buffer is mostly bytes of removed names.
    var needsCompaction: Bool { garbage > 256 && garbage * 2 > names.count }

    /// Rewrite `names` without the removed names (and `entries` at the size
    /// they need); returns each entry's inode number with its name's old and
    /// new offset.
    mutating func compactNames() -> [(ino: UInt64, old: UInt32, new: UInt32)] {
        var moved: [(ino: UInt64, old: UInt32, new: UInt32)] = []
        moved.reserveCapacity(entries.count)
        var fresh: [UInt8] = []
        fresh.reserveCapacity(names.count - garbage)
        var kept: [Entry] = []
        kept.reserveCapacity(entries.count)
        for var entry in entries {
            let range = nameRange(at: entry.name)
            let new = UInt32(fresh.count)
            fresh.append(contentsOf: names[Int(entry.name)..<range.upperBound])
            moved.append((entry.ino, entry.name, new))
            entry.name = new
            kept.append(entry)
        }
        names = fresh
        entries = kept
        garbage = 0
        return moved
    }

    mutating func rebuildIndex() {
        buckets = NarrowBuckets(count: Swift.max(16, entries.count * 8 / 5), largestValue: entries.count)
        for p in entries.indices { insertBucket(p, hash: hash(at: entries[p].name)) }
    }

    mutating func insertBucket(_ p: Int, hash: UInt64) {
        Probe.insert(&buckets, UInt32(p + 1), home: home(hash))
    }

    /// Empty bucket `hole` (linear probing without tombstones: see `Probe`).
    mutating func removeBucket(_ hole: Int) {
        // The names without the buckets, which change meanwhile.
        var names = Directory()
        names.entries = entries
        names.names = self.names
        let capacity = UInt64(buckets.count)
        Probe.remove(&buckets, at: hole) { value in
            Int(names.hash(at: names.entries[Int(value - 1)].name).multipliedFullWidth(by: capacity).high)
        }
    }
}
