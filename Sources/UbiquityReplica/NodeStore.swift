import Foundation
import UbiquityModel

/// Where the namespace's nodes and entries live in memory: the resident
/// form behind `Namespace.nodes`, `Namespace.inoByID` and
/// `Namespace.children` (issue #11: 1,000,000 items in at most 200 MiB).
///
/// - **A node is a 104-byte record** (`NodeRecord`) in chunks of 4,096
///   records, found by its slot number. The content hash is kept in its
///   bytes (`StoredHash`); an ID made by `NodeID.next()` as the number of
///   its series (`idSeries`) and its count, in 8 bytes; times as nanoseconds,
///   counters in the widths they need in practice; kind, mode and owner
///   are interned together (`Profile`), and so is the author. Fields that
///   usually equal another one are a tag: `hashSize` and `pushed` /
///   `pushedGeneration` (equal to `size`, `change`, `contentGeneration` once
///   pushed), `ctime` (equal to `mtime`), `atime` (equal to `btime`,
///   `mtime` or `ctime`), `verifiedHash` (equal to `hash`).
/// - **Everything else is in a side table holding only the nodes that
///   need it**: `unsettled` (what a node with changes not yet pushed
///   needs: `pushed`, `pushedGeneration`, `hashSize`, `lastContentChange`),
///   `opens` (the open counts of a node open or being opened: every write
///   reads and writes its node, which must not cost a copy of its extras),
///   and `extras` (symlink targets, xattrs, conflicts, device numbers,
///   an ID or hash that is not in canonical form, and any
///   value past its field's width), and `wideIDs` (a UUID of another
///   kind, such as the random ones of earlier versions: 16 bytes).
///   `LocalNode` values are made from the record and its side entries when
///   read, and taken apart when written; a node reads back exactly as it
///   was written, whatever its values.
/// - **Inode numbers and IDs** are found through open-addressing tables of
///   4-byte slot numbers (linear probing, at most 4/5 full), whose keys are
///   the records' own `ino` and ID. `inoByID` is a map of its own: an ID
///   maps to the node that has it (the common case, kept in the table) or,
///   when it was set otherwise, through `idExceptions`.
/// - **Entries** live in one `Directory` per directory (16 bytes an entry,
///   names in a byte buffer per directory). A node's `lastName` is, while
///   its entry there exists, a reference to that entry's bytes instead of
///   a copy (tag `shared`); when the entry goes, the name moves to
///   `extras` (`detachName`).
///
/// `lastContentChange` is kept only while the node has content to push
/// (`hasUnpushedContent`), the only time it is read (the write-back
/// delay); otherwise it reads as 0, as after a restart.
///
/// The store is a class for one reason: `Namespace` hands out read-only
/// views (`NodeTable`, `IDTable`, `DirectoryTable`) that hold it. The
/// namespace copies it before changing it while a view or another copy of
/// the namespace holds it (copy on write); the chunks and tables inside
/// are themselves copy-on-write, so such a copy costs what it changes.
final class NodeStore: @unchecked Sendable {
    static let chunkShift = 12
    static let chunkMask = (1 << chunkShift) - 1

    var chunks: [[NodeRecord]] = []
    /// Slots handed out so far; freed ones are reused first.
    var slotEnd = 0
    var freeSlots: [UInt32] = []
    var count = 0
    var inoBuckets: [UInt32] = []
    var idBuckets: [UInt32] = []
    var idCount = 0
    var idExceptions: [StoredID: UInt64] = [:]
    var extras: [UInt32: NodeExtras] = [:]
    var opens: [UInt32: OpenCounts] = [:]
    var unsettled: [UInt32: Unsettled] = [:]
    var wideIDs: [UInt32: WideID] = [:]
    var idSeries = Interner<IDSeries>()
    var profiles = Interner<Profile>()
    var authors = Interner<String>()
    var dirs: [UInt64: Directory] = [:]

    init() {}

    func copy() -> NodeStore {
        let c = NodeStore()
        c.chunks = chunks; c.slotEnd = slotEnd; c.freeSlots = freeSlots; c.count = count
        c.inoBuckets = inoBuckets; c.idBuckets = idBuckets; c.idCount = idCount; c.idExceptions = idExceptions
        c.extras = extras; c.opens = opens; c.unsettled = unsettled; c.wideIDs = wideIDs; c.idSeries = idSeries
        c.profiles = profiles; c.authors = authors; c.dirs = dirs
        return c
    }

    // MARK: Records

    @inline(__always)
    func record(_ slot: Int) -> NodeRecord { chunks[slot >> Self.chunkShift][slot & Self.chunkMask] }

    @inline(__always)
    func setRecord(_ slot: Int, _ record: NodeRecord) { chunks[slot >> Self.chunkShift][slot & Self.chunkMask] = record }

    @inline(__always)
    func ino(atSlot slot: Int) -> UInt64 {
        chunks[slot >> Self.chunkShift].withUnsafeBufferPointer { buffer in
            NodeRecord.u48(UnsafeRawPointer(buffer.baseAddress! + (slot & Self.chunkMask)), NodeRecord.inoOffset)
        }
    }

    func allocateSlot() -> Int {
        if let slot = freeSlots.popLast() { return Int(slot) }
        let slot = slotEnd
        precondition(slot < Int(UInt32.max) - 1, "more nodes than slot numbers")
        slotEnd += 1
        if slot & Self.chunkMask == 0 {
            var chunk: [NodeRecord] = []
            chunk.reserveCapacity(1 << Self.chunkShift)
            chunks.append(chunk)
        }
        chunks[slot >> Self.chunkShift].append(NodeRecord())
        return slot
    }

    /// Occupied slots, in order.
    func forEachSlot(_ body: (Int) -> Void) {
        for slot in 0..<slotEnd where ino(atSlot: slot) != 0 { body(slot) }
    }

    // MARK: Inode numbers

    func slot(of ino: UInt64) -> Int? {
        guard !inoBuckets.isEmpty, ino != 0 else { return nil }
        let capacity = inoBuckets.count
        var b = Self.home(ofIno: ino, capacity)
        while true {
            let value = inoBuckets[b]
            if value == 0 { return nil }
            if self.ino(atSlot: Int(value - 1)) == ino { return Int(value - 1) }
            b += 1
            if b == capacity { b = 0 }
        }
    }

    /// The bucket where the search for `ino` starts. Inode numbers are given
    /// out in order, so they are mixed first (Fibonacci hashing): with the
    /// number itself modulo the capacity, consecutive live numbers filled
    /// runs of consecutive buckets, and a removal (which moves the rest of
    /// its cluster back) or a new number whose home fell inside a run walked
    /// thousands of buckets (see DESIGN.md, "Memory at a million items").
    @inline(__always)
    static func home(ofIno ino: UInt64, _ capacity: Int) -> Int {
        Int((ino &* 0x9E37_79B9_7F4A_7C15).multipliedFullWidth(by: UInt64(capacity)).high)
    }

    private func inoHome(_ value: UInt32, _ capacity: Int) -> Int { Self.home(ofIno: ino(atSlot: Int(value - 1)), capacity) }

    private func insertIno(slot: Int) {
        if (count + 1) * 5 > inoBuckets.count * 4 {
            let old = inoBuckets
            inoBuckets = [UInt32](repeating: 0, count: max(64, (count + 1) * 8 / 5))
            for value in old where value != 0 { Probe.insert(&inoBuckets, value, home: inoHome(value, inoBuckets.count)) }
        }
        Probe.insert(&inoBuckets, UInt32(slot + 1), home: Self.home(ofIno: ino(atSlot: slot), inoBuckets.count))
    }

    private func removeIno(slot: Int) {
        let capacity = inoBuckets.count
        var b = Self.home(ofIno: ino(atSlot: slot), capacity)
        while inoBuckets[b] != UInt32(slot + 1) {
            b += 1
            if b == capacity { b = 0 }
        }
        Probe.remove(&inoBuckets, at: b) { inoHome($0, capacity) }
    }

    // MARK: IDs

    func storedID(slot: Int) -> StoredID { storedID(record(slot), slot: slot) }

    private func storedID(_ r: NodeRecord, slot: Int) -> StoredID {
        if r.flags & NodeRecord.idElsewhere != 0 {
            if let wide = wideIDs[UInt32(slot)] { return .uuid(wide.high, wide.low) }
            return .text(extras[UInt32(slot)]!.id!)
        }
        let packed = r.u64(NodeRecord.idOffset)
        let series = idSeries.values[Int(packed >> 48)]
        return .uuid(series.high, UInt64(series.lowTop) << 48 | packed & NodeID.seriesCountMask)
    }

    private func idHome(_ id: StoredID, _ capacity: Int) -> Int {
        Int(UInt64(bitPattern: Int64(id.hashValue)).multipliedFullWidth(by: UInt64(capacity)).high)
    }

    /// The bucket of `idBuckets` that maps `id`.
    private func idBucket(_ id: StoredID) -> Int? {
        guard !idBuckets.isEmpty else { return nil }
        let capacity = idBuckets.count
        var b = idHome(id, capacity)
        while true {
            let value = idBuckets[b]
            if value == 0 { return nil }
            if storedID(slot: Int(value - 1)) == id { return b }
            b += 1
            if b == capacity { b = 0 }
        }
    }

    private func insertID(slot: Int, _ id: StoredID) {
        if (idCount + 1) * 5 > idBuckets.count * 4 {
            let old = idBuckets
            idBuckets = [UInt32](repeating: 0, count: max(64, (idCount + 1) * 8 / 5))
            for value in old where value != 0 {
                Probe.insert(&idBuckets, value, home: idHome(storedID(slot: Int(value - 1)), idBuckets.count))
            }
        }
        Probe.insert(&idBuckets, UInt32(slot + 1), home: idHome(id, idBuckets.count))
        idCount += 1
    }

    private func removeID(bucket: Int) {
        let capacity = idBuckets.count
        Probe.remove(&idBuckets, at: bucket) { idHome(storedID(slot: Int($0 - 1)), capacity) }
        idCount -= 1
    }

    func ino(forID id: StoredID) -> UInt64? {
        if let b = idBucket(id) { return ino(atSlot: Int(idBuckets[b] - 1)) }
        return idExceptions.isEmpty ? nil : idExceptions[id]
    }

    func setIno(_ ino: UInt64?, forID id: StoredID) {
        if let b = idBucket(id) { removeID(bucket: b) } else if !idExceptions.isEmpty { idExceptions[id] = nil }
        guard let ino else { return }
        if let slot = slot(of: ino), storedID(slot: slot) == id {
            insertID(slot: slot, id)
        } else {
            idExceptions[id] = ino
        }
    }

    /// Every ID mapping, as `inoByID` lists them.
    func idMappings() -> [(key: NodeID, value: UInt64)] {
        var out: [(key: NodeID, value: UInt64)] = []
        for value in idBuckets where value != 0 {
            let slot = Int(value - 1)
            out.append((storedID(slot: slot).string, ino(atSlot: slot)))
        }
        for (id, ino) in idExceptions { out.append((id.string, ino)) }
        return out
    }

    /// Before the node in `slot` loses its ID (changed or removed): a
    /// mapping of the ID to it stays, as an exception.
    private func keepIDMapping(slot: Int, ino: UInt64) {
        let id = storedID(slot: slot)
        if let b = idBucket(id), idBuckets[b] == UInt32(slot + 1) {
            removeID(bucket: b)
            idExceptions[id] = ino
        }
    }

    /// After the node in `slot` got `id`: a mapping set to it before moves into the table.
    private func adoptIDMapping(slot: Int, ino: UInt64, _ id: StoredID) {
        guard !idExceptions.isEmpty, idExceptions[id] == ino else { return }
        idExceptions[id] = nil
        insertID(slot: slot, id)
    }

    // MARK: Nodes

    func node(_ ino: UInt64) -> LocalNode? {
        slot(of: ino).map { node(slot: $0) }
    }

    func contains(_ ino: UInt64) -> Bool { slot(of: ino) != nil }

    func kind(slot: Int) -> NodeKind {
        let r = record(slot)
        if r.flags & NodeRecord.hasExtras != 0, let profile = extras[UInt32(slot)]?.profile { return profile.kind }
        return profiles.values[Int(r.u16(NodeRecord.profileOffset))].kind
    }

    func kind(of ino: UInt64) -> NodeKind? { slot(of: ino).map { kind(slot: $0) } }

    /// Add `delta` to the lookup count of `ino` in its record, without
    /// making the whole node: false (nothing changed) when the count lives
    /// in the node's extras or would leave 16 bits.
    func addLookups(_ ino: UInt64, _ delta: Int) -> Bool {
        guard let slot = slot(of: ino) else { return false }
        var r = record(slot)
        if r.flags & NodeRecord.hasExtras != 0, extras[UInt32(slot)]?.lookups != nil { return false }
        let count = Int(r.u16(NodeRecord.lookupsOffset)) + delta
        guard count >= 0, count <= 0xFFFF else { return false }
        r.set(u16: UInt16(count), NodeRecord.lookupsOffset)
        setRecord(slot, r)
        return true
    }

    func isPinned(_ ino: UInt64) -> Bool { slot(of: ino).map { record($0).flags & NodeRecord.pinned != 0 } ?? false }

    // Single fields, read without making the whole node (for loops over many nodes).

    func hasUnacknowledgedWrites(slot: Int) -> Bool { record(slot).flags & NodeRecord.unacknowledged != 0 }

    func version(slot: Int) -> UInt64 {
        let r = record(slot)
        if r.flags & NodeRecord.hasExtras != 0, let version = extras[UInt32(slot)]?.version { return version }
        return UInt64(r.u32(NodeRecord.versionOffset))
    }

    func isUnlinked(slot: Int) -> Bool { record(slot).flags & NodeRecord.unlinked != 0 }

    /// `hasUnpushedMetadata || hasUnpushedContent` of the node in `slot`.
    func hasUnpushedWork(slot: Int) -> Bool {
        let r = record(slot)
        guard r.flags & NodeRecord.hasUnsettled != 0, let u = unsettled[UInt32(slot)] else { return false }
        let x = r.flags & NodeRecord.hasExtras != 0 ? extras[UInt32(slot)] : nil
        let change = x?.change ?? r.u48(NodeRecord.changeOffset)
        if change > u.pushed { return true }
        let generation = x?.contentGeneration ?? UInt64(r.u16(NodeRecord.contentGenerationOffset))
        return generation > u.pushedGeneration && kind(slot: slot) == .file
    }

    /// The size of the node in `slot` if it has content not pushed yet
    /// (`LocalNode.hasUnpushedContent`), else 0.
    func unpushedContentBytes(slot: Int) -> UInt64 {
        let r = record(slot)
        guard r.flags & NodeRecord.hasUnsettled != 0, let u = unsettled[UInt32(slot)] else { return 0 }
        let x = r.flags & NodeRecord.hasExtras != 0 ? extras[UInt32(slot)] : nil
        let generation = x?.contentGeneration ?? UInt64(r.u16(NodeRecord.contentGenerationOffset))
        guard generation > u.pushedGeneration, kind(slot: slot) == .file else { return 0 }
        return x?.size ?? UInt64(r.u32(NodeRecord.sizeOffset))
    }

    /// The sizes of the files whose content is here, added up (what `status`
    /// shows as cached), read from the records in slot order.
    func localContentBytes() -> UInt64 {
        var total: UInt64 = 0
        forEachSlot { slot in
            guard record(slot).flags & NodeRecord.hasContent != 0 else { return }
            let summary = summary(slot: slot)
            if summary.kind == .file { total += summary.size }
        }
        return total
    }

    /// Write `node` (a new node or a new value of an existing one).
    func set(_ node: LocalNode) {
        let ino = node.ino
        if let slot = slot(of: ino) {
            let previous = record(slot)
            let oldID = storedID(slot: slot)
            let idChanged = oldID != node.storedID
            if idChanged { keepIDMapping(slot: slot, ino: ino) }
            write(node, slot: slot, previous: previous)
            if idChanged { adoptIDMapping(slot: slot, ino: ino, node.storedID) }
        } else {
            precondition(ino != 0 && ino >> 48 == 0, "inode number \(ino) out of range")
            let slot = allocateSlot()
            write(node, slot: slot, previous: nil)
            count += 1
            insertIno(slot: slot)
            adoptIDMapping(slot: slot, ino: ino, node.storedID)
        }
    }

    func remove(_ ino: UInt64) {
        guard let slot = slot(of: ino) else { return }
        keepIDMapping(slot: slot, ino: ino)
        removeIno(slot: slot)
        let flags = record(slot).flags
        if flags & NodeRecord.hasExtras != 0 { extras[UInt32(slot)] = nil }
        if flags & NodeRecord.isOpen != 0 { opens[UInt32(slot)] = nil }
        if flags & NodeRecord.hasUnsettled != 0 { unsettled[UInt32(slot)] = nil }
        if flags & NodeRecord.idElsewhere != 0 { wideIDs[UInt32(slot)] = nil }
        setRecord(slot, NodeRecord())
        freeSlots.append(UInt32(slot))
        count -= 1
    }

    /// What a scan over many items reads of a node, straight from its
    /// record and without making a `LocalNode` (a query reads 100,000).
    func summary(slot: Int) -> NodeSummary {
        let r = record(slot)
        let x: NodeExtras? = r.flags & NodeRecord.hasExtras != 0 ? extras[UInt32(slot)] : nil
        return NodeSummary(kind: (x?.profile ?? profiles.values[Int(r.u16(NodeRecord.profileOffset))]).kind,
                           size: x?.size ?? UInt64(r.u32(NodeRecord.sizeOffset)),
                           btime: x?.btime ?? Timespec(nanoseconds: r.i64(NodeRecord.btimeOffset)),
                           mtime: x?.mtime ?? Timespec(nanoseconds: r.i64(NodeRecord.mtimeOffset)),
                           pinned: r.flags & NodeRecord.pinned != 0)
    }

    func node(slot: Int) -> LocalNode {
        let r = record(slot)
        let f = r.flags
        let x: NodeExtras? = f & NodeRecord.hasExtras != 0 ? extras[UInt32(slot)] : nil
        let u: Unsettled? = f & NodeRecord.hasUnsettled != 0 ? unsettled[UInt32(slot)] : nil
        let profile = x?.profile ?? profiles.values[Int(r.u16(NodeRecord.profileOffset))]
        let id = storedID(r, slot: slot)
        let mtime = x?.mtime ?? Timespec(nanoseconds: r.i64(NodeRecord.mtimeOffset))
        var n = LocalNode(ino: r.u48(NodeRecord.inoOffset), storedID: id, kind: profile.kind, mode: profile.mode,
                          uid: profile.uid, gid: profile.gid, time: mtime)
        n.size = x?.size ?? UInt64(r.u32(NodeRecord.sizeOffset))
        if let x {
            n.rdev = x.rdev
            n.target = x.target
            n.xattrs = x.xattrs
            n.conflicts = x.conflicts
        }
        if f & NodeRecord.isOpen != 0, let o = opens[UInt32(slot)] {
            n.openCount = o.openCount
            n.openWriters = o.openWriters
            n.opening = o.opening
        }
        if f & NodeRecord.hasHash != 0 {
            n.storedHash = x?.hash.map(StoredHash.text)
                ?? .sha256(r.u64(NodeRecord.hashOffset), r.u64(NodeRecord.hashOffset + 8),
                           r.u64(NodeRecord.hashOffset + 16), r.u64(NodeRecord.hashOffset + 24))
        }
        n.hashSize = u?.hashSize ?? n.size
        n.chunked = f & NodeRecord.chunked != 0
        n.btime = x?.btime ?? Timespec(nanoseconds: r.i64(NodeRecord.btimeOffset))
        n.ctime = f & NodeRecord.ctimeElsewhere != 0 ? x!.ctime! : mtime
        switch (f >> NodeRecord.atimeShift) & 3 {
        case 0: n.atime = n.btime
        case 1: n.atime = mtime
        case 2: n.atime = n.ctime
        default: n.atime = x!.atime!
        }
        n.hasContent = f & NodeRecord.hasContent != 0
        n.contentGeneration = x?.contentGeneration ?? UInt64(r.u16(NodeRecord.contentGenerationOffset))
        n.pushedGeneration = u?.pushedGeneration ?? n.contentGeneration
        n.version = x?.version ?? UInt64(r.u32(NodeRecord.versionOffset))
        n.change = x?.change ?? r.u48(NodeRecord.changeOffset)
        n.pushed = u?.pushed ?? n.change
        n.nlink = x?.nlink ?? UInt32(r.u16(NodeRecord.nlinkOffset))
        n.unlinked = f & NodeRecord.unlinked != 0
        n.lastParent = x?.lastParent ?? r.u48(NodeRecord.lastParentOffset)
        switch (f >> NodeRecord.nameShift) & 3 {
        case 0: break
        case 1: n.lastName = dirs[n.lastParent]!.name(at: r.u32(NodeRecord.nameOffset))
        default: n.lastName = x!.lastName!
        }
        n.pinned = f & NodeRecord.pinned != 0
        n.author = x?.author ?? authors.values[Int(r.u16(NodeRecord.authorOffset))]
        switch (f >> NodeRecord.verifiedShift) & 3 {
        case 0: break
        case 1: n.storedVerifiedHash = n.storedHash
        default: n.storedVerifiedHash = x!.verifiedHash
        }
        n.unacknowledgedWrites = f & NodeRecord.unacknowledged != 0
        n.lookups = x?.lookups ?? UInt64(r.u16(NodeRecord.lookupsOffset))
        n.lastContentChange = u?.lastContentChange ?? 0
        n.lastAccess = r.u32(NodeRecord.lastAccessOffset)
        n.contentEpoch = x?.contentEpoch ?? (f >> 24)
        return n
    }

    /// Take `n` apart into the record in `slot` and its side entries.
    /// `previous` is the record there before (nil: a new node).
    private func write(_ n: LocalNode, slot: Int, previous: NodeRecord?) {
        var r = NodeRecord()
        var x = NodeExtras()
        var needsExtras = false
        var f: UInt32 = 0
        let key = UInt32(slot)
        let previousFlags = previous?.flags ?? 0

        var wideID: WideID?
        switch n.storedID {
        case .uuid(let high, let low):
            if let number = seriesNumber(high, low, previous: previous) {
                r.set(u64: UInt64(number) << 48 | low & NodeID.seriesCountMask, NodeRecord.idOffset)
            } else {
                f |= NodeRecord.idElsewhere
                wideID = WideID(high: high, low: low)
            }
        case .text(let text):
            f |= NodeRecord.idElsewhere
            x.id = text
            needsExtras = true
        }
        if let wideID {
            wideIDs[key] = wideID
        } else if previousFlags & NodeRecord.idElsewhere != 0 {
            wideIDs[key] = nil
        }
        if let hash = n.storedHash {
            f |= NodeRecord.hasHash
            switch hash {
            case .sha256(let a, let b, let c, let d):
                r.set(u64: a, NodeRecord.hashOffset); r.set(u64: b, NodeRecord.hashOffset + 8)
                r.set(u64: c, NodeRecord.hashOffset + 16); r.set(u64: d, NodeRecord.hashOffset + 24)
            case .text(let text):
                x.hash = text
                needsExtras = true
            }
        }
        if let verified = n.storedVerifiedHash {
            if verified == n.storedHash {
                f |= 1 << NodeRecord.verifiedShift
            } else {
                f |= 2 << NodeRecord.verifiedShift
                x.verifiedHash = verified
                needsExtras = true
            }
        }

        if let ns = Self.nanoseconds(n.mtime) { r.set(i64: ns, NodeRecord.mtimeOffset) } else { x.mtime = n.mtime; needsExtras = true }
        if let ns = Self.nanoseconds(n.btime) { r.set(i64: ns, NodeRecord.btimeOffset) } else { x.btime = n.btime; needsExtras = true }
        if n.ctime != n.mtime {
            f |= NodeRecord.ctimeElsewhere
            x.ctime = n.ctime
            needsExtras = true
        }
        if n.atime == n.btime {
        } else if n.atime == n.mtime {
            f |= 1 << NodeRecord.atimeShift
        } else if n.atime == n.ctime {
            f |= 2 << NodeRecord.atimeShift
        } else {
            f |= 3 << NodeRecord.atimeShift
            x.atime = n.atime
            needsExtras = true
        }
        r.set(u32: n.lastAccess, NodeRecord.lastAccessOffset)

        r.set(u48: n.ino, NodeRecord.inoOffset)
        if n.lastParent >> 48 == 0 { r.set(u48: n.lastParent, NodeRecord.lastParentOffset) } else { x.lastParent = n.lastParent; needsExtras = true }
        if n.change >> 48 == 0 { r.set(u48: n.change, NodeRecord.changeOffset) } else { x.change = n.change; needsExtras = true }
        if n.nlink <= 0xFFFF { r.set(u16: UInt16(n.nlink), NodeRecord.nlinkOffset) } else { x.nlink = n.nlink; needsExtras = true }
        if n.size <= 0xFFFF_FFFF { r.set(u32: UInt32(n.size), NodeRecord.sizeOffset) } else { x.size = n.size; needsExtras = true }
        if n.version <= 0xFFFF_FFFF { r.set(u32: UInt32(n.version), NodeRecord.versionOffset) } else { x.version = n.version; needsExtras = true }
        if n.contentGeneration <= 0xFFFF {
            r.set(u16: UInt16(n.contentGeneration), NodeRecord.contentGenerationOffset)
        } else {
            x.contentGeneration = n.contentGeneration
            needsExtras = true
        }
        if n.lookups <= 0xFFFF { r.set(u16: UInt16(n.lookups), NodeRecord.lookupsOffset) } else { x.lookups = n.lookups; needsExtras = true }
        // Kind, mode, owner and author: usually what the node had (no hashing then).
        let profile = Profile(kind: n.kind, mode: n.mode, uid: n.uid, gid: n.gid)
        let previousExtras = (previous?.flags ?? 0) & NodeRecord.hasExtras != 0 ? extras[UInt32(slot)] : nil
        if let previous, previousExtras?.profile == nil,
           profiles.values[Int(previous.u16(NodeRecord.profileOffset))] == profile {
            r.set(u16: previous.u16(NodeRecord.profileOffset), NodeRecord.profileOffset)
        } else if let index = profiles.index(of: profile) {
            r.set(u16: index, NodeRecord.profileOffset)
        } else {
            x.profile = profile
            needsExtras = true
        }
        if let previous, previousExtras?.author == nil,
           authors.values[Int(previous.u16(NodeRecord.authorOffset))] == n.author {
            r.set(u16: previous.u16(NodeRecord.authorOffset), NodeRecord.authorOffset)
        } else if let index = authors.index(of: n.author) {
            r.set(u16: index, NodeRecord.authorOffset)
        } else {
            x.author = n.author
            needsExtras = true
        }

        if n.hasContent { f |= NodeRecord.hasContent }
        if n.unlinked { f |= NodeRecord.unlinked }
        if n.pinned { f |= NodeRecord.pinned }
        if n.unacknowledgedWrites { f |= NodeRecord.unacknowledged }
        if n.chunked { f |= NodeRecord.chunked }

        if n.contentEpoch <= 0xFF { f |= n.contentEpoch << 24 } else { x.contentEpoch = n.contentEpoch; needsExtras = true }

        // The last name: the bytes of the entry naming the node, when there is one.
        if !n.lastName.isEmpty {
            if let offset = sharedNameOffset(n, previous: previous) {
                f |= 1 << NodeRecord.nameShift
                r.set(u32: offset, NodeRecord.nameOffset)
            } else {
                f |= 2 << NodeRecord.nameShift
                x.lastName = n.lastName
                needsExtras = true
            }
        }

        if n.target != nil || !n.xattrs.isEmpty || !n.conflicts.isEmpty || n.rdev != 0 {
            x.target = n.target
            x.xattrs = n.xattrs
            x.conflicts = n.conflicts
            x.rdev = n.rdev
            needsExtras = true
        }
        if n.openCount != 0 || n.openWriters != 0 || n.opening != 0 {
            f |= NodeRecord.isOpen
            opens[key] = OpenCounts(openCount: n.openCount, openWriters: n.openWriters, opening: n.opening)
        } else if previousFlags & NodeRecord.isOpen != 0 {
            opens[key] = nil
        }

        if needsExtras {
            f |= NodeRecord.hasExtras
            extras[key] = x
        } else if previousFlags & NodeRecord.hasExtras != 0 {
            extras[key] = nil
        }
        if n.pushed != n.change || n.pushedGeneration != n.contentGeneration || n.hashSize != n.size {
            f |= NodeRecord.hasUnsettled
            unsettled[key] = Unsettled(pushed: n.pushed, pushedGeneration: n.pushedGeneration, hashSize: n.hashSize,
                                       lastContentChange: n.hasUnpushedContent ? n.lastContentChange : 0)
        } else if previousFlags & NodeRecord.hasUnsettled != 0 {
            unsettled[key] = nil
        }
        r.flags = f
        setRecord(slot, r)
    }

    /// The number of the series of an ID made by `NodeID.next()` (a UUID of
    /// version 8), usually the one the node had; nil for other IDs, and once
    /// 65,535 series are known.
    private func seriesNumber(_ high: UInt64, _ low: UInt64, previous: NodeRecord?) -> UInt16? {
        guard NodeID.mayBeOfASeries(high: high) else { return nil }
        let series = IDSeries(high: high, lowTop: UInt16(low >> 48))
        if let previous, previous.flags & NodeRecord.idElsewhere == 0 {
            let number = UInt16(previous.u64(NodeRecord.idOffset) >> 48)
            if idSeries.values[Int(number)] == series { return number }
        }
        return idSeries.index(of: series)
    }

    /// Nanoseconds since the epoch, if `t` is exactly that many.
    static func nanoseconds(_ t: Timespec) -> Int64? {
        guard (0..<1_000_000_000).contains(t.nsec) else { return nil }
        let (scaled, overflow) = t.sec.multipliedReportingOverflow(by: 1_000_000_000)
        guard !overflow else { return nil }
        let (sum, overflow2) = scaled.addingReportingOverflow(t.nsec)
        return overflow2 ? nil : sum
    }

    /// Where the entry that names `n` as `n.lastName` in `n.lastParent`
    /// keeps the name, if there is such an entry.
    private func sharedNameOffset(_ n: LocalNode, previous: NodeRecord?) -> UInt32? {
        guard let directory = dirs[n.lastParent] else { return nil }
        if let previous, (previous.flags >> NodeRecord.nameShift) & 3 == 1,
           previous.u48(NodeRecord.lastParentOffset) == n.lastParent {
            let offset = previous.u32(NodeRecord.nameOffset)
            if directory.nameEquals(at: offset, n.lastName.bytes) { return offset }
        }
        guard let p = directory.position(of: n.lastName.bytes), directory.entries[p].ino == n.ino else { return nil }
        return directory.entries[p].name
    }

    // MARK: Entries

    func entry(_ dir: UInt64, _ name: FileName) -> DirEntry? { dirs[dir]?[name] }

    /// Set entry `name` of `dir` (creating the directory's table if missing).
    func setEntry(_ dir: UInt64, _ name: FileName, _ value: DirEntry) {
        if dirs[dir] == nil { dirs[dir] = Directory() }
        if let p = dirs[dir]!.position(of: name.bytes) {
            let old = dirs[dir]!.entries[p]
            if old.ino != value.ino { detachName(ino: old.ino, dir: dir, offset: old.name) }
            dirs[dir]!.replace(at: p, value)
        } else {
            dirs[dir]!.append(name.bytes, value)
        }
    }

    @discardableResult
    func removeEntry(_ dir: UInt64, _ name: FileName) -> DirEntry? {
        guard let p = dirs[dir]?.position(of: name.bytes) else { return nil }
        let old = dirs[dir]!.entries[p]
        detachName(ino: old.ino, dir: dir, offset: old.name)
        dirs[dir]!.remove(at: p)
        if dirs[dir]!.needsCompaction { compactNames(dir) }
        return old.value
    }

    /// Replace the whole table of `dir` (nil: it has none).
    func setDirectory(_ dir: UInt64, _ table: Directory?) {
        if let current = dirs[dir] {
            for entry in current.entries { detachName(ino: entry.ino, dir: dir, offset: entry.name) }
        }
        dirs[dir] = table
    }

    /// The entry at `offset` of `dir` stops naming `ino`: if the node's last
    /// name is that entry's bytes, it gets a copy of its own.
    private func detachName(ino: UInt64, dir: UInt64, offset: UInt32) {
        guard let slot = slot(of: ino) else { return }
        var r = record(slot)
        guard (r.flags >> NodeRecord.nameShift) & 3 == 1, r.u32(NodeRecord.nameOffset) == offset,
              r.u48(NodeRecord.lastParentOffset) == dir else { return }
        extras[UInt32(slot), default: NodeExtras()].lastName = dirs[dir]!.name(at: offset)
        r.flags = (r.flags & ~(3 << NodeRecord.nameShift)) | (2 << NodeRecord.nameShift) | NodeRecord.hasExtras
        setRecord(slot, r)
    }

    private func compactNames(_ dir: UInt64) {
        for (ino, old, new) in dirs[dir]!.compactNames() where old != new {
            guard let slot = slot(of: ino) else { continue }
            var r = record(slot)
            guard (r.flags >> NodeRecord.nameShift) & 3 == 1, r.u32(NodeRecord.nameOffset) == old,
                  r.u48(NodeRecord.lastParentOffset) == dir else { continue }
            r.set(u32: new, NodeRecord.nameOffset)
            setRecord(slot, r)
        }
    }
}

/// One node's fixed part: 104 bytes, 4-byte aligned (see `NodeStore`).
///
///     0 id (series number 16 bits, count 48)   8 hash (32)
///     40 mtime   48 btime (8 each)   56 lastAccess (4)
///     60 ino   66 lastParent   72 change (48 bits each)   78 nlink (16)
///     80 size   84 version   88 name offset (32 each)
///     92 contentGeneration   94 lookups   96 profile   98 author (16 each)
///     100 flags (24 bits) and contentEpoch (8)
struct NodeRecord: Sendable {
    typealias Words = (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32,
                       UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32,
                       UInt32, UInt32, UInt32, UInt32, UInt32, UInt32)
    var words: Words = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    static let idOffset = 0, hashOffset = 8, mtimeOffset = 40, btimeOffset = 48, lastAccessOffset = 56
    static let inoOffset = 60, lastParentOffset = 66, changeOffset = 72, nlinkOffset = 78
    static let sizeOffset = 80, versionOffset = 84, nameOffset = 88
    static let contentGenerationOffset = 92, lookupsOffset = 94, profileOffset = 96, authorOffset = 98
    static let flagsOffset = 100

    // Flags (bits 0–23 of the word at 100; bits 24–31 are contentEpoch).
    static let hasContent: UInt32 = 1 << 0
    static let unlinked: UInt32 = 1 << 1
    static let pinned: UInt32 = 1 << 2
    static let unacknowledged: UInt32 = 1 << 3
    static let chunked: UInt32 = 1 << 4
    static let hasHash: UInt32 = 1 << 5
    static let hasExtras: UInt32 = 1 << 6
    static let hasUnsettled: UInt32 = 1 << 7
    /// ctime is not mtime (it is in `extras`).
    static let ctimeElsewhere: UInt32 = 1 << 8
    /// verifiedHash: 0 none, 1 the hash, 2 in `extras`.
    static let verifiedShift: UInt32 = 9
    /// atime: 0 btime, 1 mtime, 2 ctime, 3 in `extras`.
    static let atimeShift: UInt32 = 11
    /// The node is open or being opened: its counts are in `opens`.
    static let isOpen: UInt32 = 1 << 13
    // Bit 14 is free.
    /// lastName: 0 empty, 1 the entry's bytes (`nameOffset` in the directory `lastParent`), 2 in `extras`.
    static let nameShift: UInt32 = 15
    /// The ID is not a series number and count: it is in `wideIDs` or (text) in `extras`.
    static let idElsewhere: UInt32 = 1 << 17

    @inline(__always) func load<T>(_ offset: Int, as type: T.Type) -> T {
        withUnsafeBytes(of: words) { $0.loadUnaligned(fromByteOffset: offset, as: T.self) }
    }
    @inline(__always) mutating func store<T>(_ value: T, _ offset: Int) {
        withUnsafeMutableBytes(of: &words) { $0.storeBytes(of: value, toByteOffset: offset, as: T.self) }
    }

    @inline(__always) func u16(_ offset: Int) -> UInt16 { load(offset, as: UInt16.self) }
    @inline(__always) func u32(_ offset: Int) -> UInt32 { load(offset, as: UInt32.self) }
    @inline(__always) func u64(_ offset: Int) -> UInt64 { load(offset, as: UInt64.self) }
    @inline(__always) func i64(_ offset: Int) -> Int64 { load(offset, as: Int64.self) }
    @inline(__always) func u48(_ offset: Int) -> UInt64 { UInt64(u32(offset)) | UInt64(u16(offset + 4)) << 32 }

    @inline(__always) static func u48(_ base: UnsafeRawPointer, _ offset: Int) -> UInt64 {
        UInt64(base.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
            | UInt64(base.loadUnaligned(fromByteOffset: offset + 4, as: UInt16.self)) << 32
    }

    @inline(__always) mutating func set(u16 value: UInt16, _ offset: Int) { store(value, offset) }
    @inline(__always) mutating func set(u32 value: UInt32, _ offset: Int) { store(value, offset) }
    @inline(__always) mutating func set(u64 value: UInt64, _ offset: Int) { store(value, offset) }
    @inline(__always) mutating func set(i64 value: Int64, _ offset: Int) { store(value, offset) }
    @inline(__always) mutating func set(u48 value: UInt64, _ offset: Int) {
        store(UInt32(truncatingIfNeeded: value), offset)
        store(UInt16(truncatingIfNeeded: value >> 32), offset + 4)
    }

    var flags: UInt32 {
        get { u32(Self.flagsOffset) }
        set { store(newValue, Self.flagsOffset) }
    }
}

/// What a node has that its record does not hold (see `NodeStore`); a
/// field left nil reads from the record.
struct NodeExtras: Sendable {
    var id: String?
    var hash: String?
    var verifiedHash: StoredHash?
    var mtime: Timespec?
    var btime: Timespec?
    var ctime: Timespec?
    var atime: Timespec?
    var lastName: FileName?
    var lastParent: UInt64?
    var change: UInt64?
    var size: UInt64?
    var version: UInt64?
    var contentGeneration: UInt64?
    var lookups: UInt64?
    var nlink: UInt32?
    var contentEpoch: UInt32?
    var profile: Profile?
    var author: String?
    var target: String?
    var xattrs: [String: Data] = [:]
    var conflicts: [NodeID] = []
    var rdev: UInt64 = 0
}

/// The open counts of a node open or being opened (`LocalNode.openCount`…).
struct OpenCounts: Sendable {
    var openCount: Int32
    var openWriters: Int32
    var opening: Int32
}

/// What a node with changes not yet pushed has besides its record.
struct Unsettled: Sendable {
    var pushed: UInt64
    var pushedGeneration: UInt64
    var hashSize: UInt64
    var lastContentChange: UInt64
}

/// What an ID made by `NodeID.next()` shares with the others of its
/// series: all but its last 48 bits.
struct IDSeries: Hashable, Sendable {
    var high: UInt64
    var lowTop: UInt16
}

/// A UUID the record cannot hold as a series number and count.
struct WideID: Sendable {
    var high: UInt64
    var low: UInt64
}

/// Kind, mode and owner, which many nodes share.
struct Profile: Hashable, Sendable {
    var kind: NodeKind
    var mode: UInt32
    var uid: UInt32
    var gid: UInt32
}

/// Values numbered in the order they first appear (at most 65,535 of them).
struct Interner<Value: Hashable & Sendable>: Sendable {
    var values: [Value] = []
    var numbers: [Value: UInt16] = [:]

    mutating func index(of value: Value) -> UInt16? {
        if let n = numbers[value] { return n }
        guard values.count < Int(UInt16.max) else { return nil }
        let n = UInt16(values.count)
        values.append(value)
        numbers[value] = n
        return n
    }
}

/// Linear probing over buckets of values (0: empty) whose keys live
/// elsewhere; the caller finds the home bucket of a value.
enum Probe {
    @inline(__always)
    static func insert<B: ProbeBuckets>(_ buckets: inout B, _ value: UInt32, home: Int) {
        var b = home
        while buckets[b] != 0 {
            b += 1
            if b == buckets.count { b = 0 }
        }
        buckets[b] = value
    }

    /// Empty bucket `hole`, moving later members of its cluster back (no tombstones).
    static func remove<B: ProbeBuckets>(_ buckets: inout B, at hole: Int, home: (UInt32) -> Int) {
        var hole = hole
        buckets[hole] = 0
        var b = hole
        while true {
            b += 1
            if b == buckets.count { b = 0 }
            let value = buckets[b]
            if value == 0 { return }
            let h = home(value)
            let stays = hole <= b ? (hole < h && h <= b) : (hole < h || h <= b)
            if !stays {
                buckets[hole] = value
                buckets[b] = 0
                hole = b
            }
        }
    }
}

protocol ProbeBuckets {
    var count: Int { get }
    subscript(_ i: Int) -> UInt32 { get set }
}

extension Array: ProbeBuckets where Element == UInt32 {}

/// Buckets of 2 bytes while the values fit (a directory of fewer than
/// 65,535 entries), of 4 beyond.
struct NarrowBuckets: ProbeBuckets, Sendable {
    var narrow: [UInt16] = []
    var wide: [UInt32] = []

    init() {}

    init(count: Int, largestValue: Int) {
        if largestValue < Int(UInt16.max) {
            narrow = [UInt16](repeating: 0, count: count)
        } else {
            wide = [UInt32](repeating: 0, count: count)
        }
    }

    var count: Int { narrow.isEmpty ? wide.count : narrow.count }
    var isEmpty: Bool { narrow.isEmpty && wide.isEmpty }
    /// Whether `value` fits.
    func holds(_ value: Int) -> Bool { narrow.isEmpty || value < Int(UInt16.max) }

    subscript(_ i: Int) -> UInt32 {
        @inline(__always) get { narrow.isEmpty ? wide[i] : UInt32(narrow[i]) }
        @inline(__always) set {
            if narrow.isEmpty { wide[i] = newValue } else { narrow[i] = UInt16(newValue) }
        }
    }
}

extension Dictionary {
    /// Far more room than keys (a dictionary keeps its capacity when keys go:
    /// a backlog once 100,000 long would keep its table).
    var isSparse: Bool { capacity > 1024 && count * 8 < capacity }

    /// The same keys in a table of the size they need.
    mutating func shrink() {
        var fresh = Self(minimumCapacity: count)
        for (key, value) in self { fresh[key] = value }
        self = fresh
    }
}

extension Set {
    var isSparse: Bool { capacity > 1024 && count * 8 < capacity }

    mutating func shrink() {
        var fresh = Self(minimumCapacity: count)
        for member in self { fresh.insert(member) }
        self = fresh
    }
}
