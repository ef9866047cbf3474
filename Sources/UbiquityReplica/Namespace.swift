import Foundation
import UbiquityModel

/// A local change to an entry that is not pushed yet.
public struct PendingEntry: Sendable, Equatable {
    /// The change counter value of the entry's latest change.
    public var change: UInt64
    /// What the entry named before this device changed it (0: nothing): the
    /// store's value as this device last saw it, kept from the first change
    /// until the push. A remote change set that removes the same entry from
    /// the same node tells that both devices moved that node away from there
    /// (see `ChangeApplier`).
    public var base: UInt64
    /// The new node (not in the store yet) the entry named when this device
    /// last changed it; 0 when it named nothing or a stored node, or when
    /// that is not known (read back from the index). A hint that spares the
    /// sync engine a lookup per entry: a remote change can make it stale,
    /// and every use either checks it with a lookup or only holds the entry
    /// back while a backlog lasts (see `SyncEngine.buildBatch`).
    public var newChild: UInt64 = 0
}

/// The replica's in-memory tables: every node and entry, kept coherent with
/// the index. The hot FUSE paths (`lookup`, `getattr`, `readdir`) are served
/// from here without touching SQLite.
///
/// A `Namespace` is only ever accessed inside `Replica.read`, `record`,
/// `transaction` or `committedView` (under the replica's lock). Every mutation goes through the primitives below,
/// which record what the index must write (`dirtyRows`, `log`) and what the
/// sync engine must push (`change` counters, `pendingEntries`). Inside a
/// transaction (`Replica.transaction`) they also record what they replace
/// (`undo`), so a change the index could not record is taken back whole.
///
/// Nodes, entries and the ID map live in a `NodeStore` (a compact resident
/// form: about 170 bytes per item); `nodes`, `children` and `inoByID` are
/// read-only views of it, and the primitives below are the only writers.
public struct Namespace: Sendable {
    /// Nodes, entries and IDs (copied before a change while shared: see `storeForWriting`).
    var store = NodeStore()
    /// Every node by inode number.
    public var nodes: NodeTable { NodeTable(store: store) }
    /// Every directory's entries by the directory's inode number.
    public var children: DirectoryTable { DirectoryTable(store: store) }
    /// The inode number of each node ID.
    public var inoByID: IDTable { IDTable(store: store) }
    /// The one entry's parent of each linked directory (directories have no hard links).
    public internal(set) var directoryParent: [UInt64: UInt64] = [:]
    /// Entries changed locally and not yet pushed.
    public internal(set) var pendingEntries: [EntryKey: PendingEntry] = [:]
    /// Highest journal sequence number applied to this replica.
    public internal(set) var appliedSeq: UInt64 = 0
    /// Journal records skipped because they failed validation, oldest first.
    public internal(set) var quarantined: [QuarantinedRecord] = []

    var nextIno: UInt64 = 2
    var nextCookie: UInt64 = 3   // 0 = start, 1 = ".", 2 = ".."
    var changeCounter: UInt64 = 0
    var dirtyRows: Set<UInt64> = []
    /// Nodes with metadata or content not yet in the store (kept so the sync
    /// engine never scans the whole namespace).
    public internal(set) var unpushed: Set<UInt64> = []
    var log: [IndexOp] = []
    /// Bumped by every change worth pushing; the sync engine waits on it.
    public internal(set) var pushWork: UInt64 = 0

    /// Items changed (their node, an entry naming them, their writers), newest
    /// last, in a ring: what a metadata query's watch looks at again.
    /// `structureSeq` moves when a directory is linked, unlinked or pinned,
    /// which may change the path or pin of everything below it.
    public internal(set) var itemChangeSeq: UInt64 = 0
    public internal(set) var structureSeq: UInt64 = 0
    var itemChangeRing = [UInt64](repeating: 0, count: 16_384)
    /// When each folder's entries last changed, on a namespace-wide clock:
    /// a kernel that cached a listing tells by it whether the listing is still
    /// current (`KernelReferences`). Runtime only and never rolled back: a
    /// stamp moved by a change that was rolled back costs a kernel one
    /// listing read again, nothing more.
    var listingStamps: [UInt64: UInt64] = [:]
    var listingClock: UInt64 = 0
    /// Runtime: what is known of cache files on disk, for journaled `fsync`s (`ContentTracker`).
    var contentTrackers: [UInt64: ContentTracker] = [:]
    /// Runtime: writes between their check of `unacknowledgedWrites` and
    /// their update of the node (`beginWrite`…`endWrite`), by node; a
    /// `close` or `fsync` meanwhile does not acknowledge them.
    var writesInFlight: [UInt64: Int32] = [:]
    /// The values a running transaction replaced (nil: no transaction).
    var undo: Undo?
    /// Set while a pull applies another device's change set: what each entry
    /// named before the change set first changed it (see `EntryHistory`).
    public var entryHistory: EntryHistory?

    public static let rootIno: UInt64 = 1

    public init() {}

    // MARK: Reading

    public func node(_ ino: UInt64) -> LocalNode? { store.node(ino) }

    public func lookup(_ parent: UInt64, _ name: FileName) -> UInt64? { store.entry(parent, name)?.ino }

    public func entries(of dir: UInt64) -> Directory { store.dirs[dir] ?? Directory() }

    // Single fields of a node, read without making the whole `LocalNode`
    // (for loops over many nodes under the lock).

    public func kind(of ino: UInt64) -> NodeKind? { store.kind(of: ino) }
    public func version(of ino: UInt64) -> UInt64? { store.slot(of: ino).map { store.version(slot: $0) } }
    public func id(of ino: UInt64) -> NodeID? { store.slot(of: ino).map { store.storedID(slot: $0).string } }
    public func isUnlinked(_ ino: UInt64) -> Bool? { store.slot(of: ino).map { store.isUnlinked(slot: $0) } }

    /// The store, this namespace's own: copied first if a view or another
    /// copy of the namespace holds it. (A caller that keeps the reference
    /// uses it for all its writes: asking again meanwhile would find it
    /// shared, with itself, and copy it.)
    mutating func storeForWriting() -> NodeStore {
        if !isKnownUniquelyReferenced(&store) { store = store.copy() }
        return store
    }

    /// Write a node as it is (no change counting, nothing logged).
    mutating func setNode(_ node: LocalNode) { storeForWriting().set(node) }

    /// Change a node in place (no change counting, nothing logged); false if there is none.
    @discardableResult
    mutating func modifyNode(_ ino: UInt64, _ body: (inout LocalNode) -> Void) -> Bool {
        guard var node = store.node(ino) else { return false }
        body(&node)
        storeForWriting().set(node)
        return true
    }

    /// Map `id` to `ino` (nil: to nothing).
    mutating func setIno(_ ino: UInt64?, forID id: NodeID) { storeForWriting().setIno(ino, forID: StoredID(id)) }

    func ino(forID id: NodeID) -> UInt64? { store.ino(forID: StoredID(id)) }

    // MARK: Primitives that record their effect

    /// A node row changed: write it with the next commit, and track whether it has something to push.
    mutating func touched(_ ino: UInt64) {
        itemChanged(ino)
        dirtyRows.insert(ino)
        if let slot = store.slot(of: ino), store.hasUnpushedWork(slot: slot) {
            unpushed.insert(ino)
        } else {
            unpushed.remove(ino)
        }
    }

    mutating func itemChanged(_ ino: UInt64) {
        itemChangeRing[Int(itemChangeSeq % UInt64(itemChangeRing.count))] = ino
        itemChangeSeq += 1
    }

    /// What changed below every path: a watch reads every item again.
    public mutating func structureChanged() { structureSeq += 1 }

    /// Folder `dir`'s entries changed (see `listingStamps`).
    mutating func listingChanged(_ dir: UInt64) {
        listingClock += 1
        listingStamps[dir] = listingClock
    }

    /// The stamp of folder `dir`'s current entries: equal stamps, same entries.
    public func listingStamp(of dir: UInt64) -> UInt64 { listingStamps[dir] ?? 0 }

    /// The items changed since `seq` (a value of `itemChangeSeq`), or nil if
    /// the ring no longer reaches back that far.
    public func itemsChanged(since seq: UInt64) -> Set<UInt64>? {
        guard seq <= itemChangeSeq, itemChangeSeq - seq <= UInt64(itemChangeRing.count) else { return nil }
        var out = Set<UInt64>()
        for s in seq..<itemChangeSeq { out.insert(itemChangeRing[Int(s % UInt64(itemChangeRing.count))]) }
        return out
    }

    /// A directory's path from the root ("" for the root itself), or nil if
    /// it is not linked.
    public func directoryPath(_ dir: UInt64) -> String? {
        var names: [String] = []
        var current = dir
        while current != Self.rootIno {
            guard let node = store.node(current), let parent = directoryParent[current], names.count < 100_000 else { return nil }
            names.append(node.lastName.description)
            current = parent
        }
        return names.reversed().map { "/" + $0 }.joined()
    }

    mutating func nextChange() -> UInt64 {
        changeCounter += 1
        pushWork &+= 1
        return changeCounter
    }

    /// Take the next inode number (never reused) for a node about to be created.
    public mutating func reserveIno() -> UInt64 {
        let ino = nextIno
        nextIno += 1
        log.append(.meta(key: "next_ino", value: String(nextIno)))
        return ino
    }

    /// Create a node (not yet linked anywhere) and return its inode number.
    public mutating func createNode(ino reserved: UInt64? = nil, id: NodeID = .next(), kind: NodeKind,
                                    mode: UInt32, uid: UInt32, gid: UInt32, rdev: UInt64 = 0, target: String? = nil,
                                    time: Timespec = .now(), local: Bool = true) -> UInt64 {
        let ino = reserved ?? reserveIno()
        saveNode(ino)
        saveID(id)
        if kind == .directory { saveDirectory(ino) }
        var node = LocalNode(ino: ino, id: id, kind: kind, mode: mode, uid: uid, gid: gid,
                             size: kind == .symlink ? UInt64(target?.utf8.count ?? 0) : 0,
                             rdev: rdev, target: target, time: time)
        if local { node.change = nextChange() }
        let store = storeForWriting()
        store.set(node)
        store.setIno(ino, forID: node.storedID)
        if kind == .directory { store.setDirectory(ino, Directory()) }
        touched(ino)
        return ino
    }

    /// Change a node. `local` changes are pushed; remote ones are not.
    public mutating func update(_ ino: UInt64, local: Bool = true, _ body: (inout LocalNode) -> Void) {
        guard var node = store.node(ino) else { return }
        saveNode(ino)
        body(&node)
        if local { node.change = nextChange() }
        storeForWriting().set(node)
        touched(ino)
    }

    /// Record a content change (write, truncate) without persisting it yet;
    /// `time` (if given) becomes the mtime and ctime.
    public mutating func contentChanged(_ ino: UInt64, size: UInt64, time: Timespec?, monotonic: UInt64) {
        guard var node = store.node(ino) else { return }
        saveNode(ino)
        node.size = size
        if let time {
            node.mtime = time
            node.ctime = time
        }
        node.lastContentChange = monotonic
        // Every change moves the generation: a snapshot taken across it is torn.
        if node.contentGeneration <= node.pushedGeneration {
            node.change = nextChange()
        }
        node.contentGeneration += 1
        storeForWriting().set(node)
        pushWork &+= 1
        touched(ino)
    }

    /// Mark the content as changing (an open for writing, a truncation):
    /// persisted before the content file is touched, so a crash never leaves
    /// modified content that the index believes clean. A node the store has
    /// is also marked as holding unacknowledged writes (see `beginWrite`).
    public mutating func beginContentChange(_ ino: UInt64, monotonic: UInt64) {
        guard var node = store.node(ino) else { return }
        saveNode(ino)
        node.contentGeneration += 1
        node.lastContentChange = monotonic
        node.change = nextChange()
        if node.version > 0 { node.unacknowledgedWrites = true }
        storeForWriting().set(node)
        touched(ino)
    }

    /// A write to `ino` is about to reach its cache file. Returns true when
    /// this write is the first since the writes were acknowledged (a
    /// `close`, an `fsync`): the caller must commit the mark before writing,
    /// so that a crash never passes unacknowledged content off as
    /// acknowledged. Once per open-for-write session in the usual case (the
    /// open sets the mark already), not once per write. Pair with `endWrite`.
    public mutating func beginWrite(_ ino: UInt64) -> Bool {
        guard let slot = store.slot(of: ino) else { return false }
        writesInFlight[ino, default: 0] += 1
        guard store.version(slot: slot) > 0, !store.hasUnacknowledgedWrites(slot: slot) else { return false }
        modifyNode(ino) { $0.unacknowledgedWrites = true }
        touched(ino)
        return true
    }

    /// The write begun with `beginWrite` is done (or failed).
    public mutating func endWrite(_ ino: UInt64) {
        guard let count = writesInFlight[ino] else { return }
        writesInFlight[ino] = count > 1 ? count - 1 : nil
    }

    /// Everything written to `ino` so far is acknowledged (a `close` or an
    /// `fsync` is about to commit it; the last writer went away): clear the
    /// mark — unless a write is still on its way, which nothing acknowledged.
    public mutating func acknowledgeWrites(_ ino: UInt64) {
        guard writesInFlight[ino] == nil, var node = store.node(ino), node.unacknowledgedWrites else { return }
        node.unacknowledgedWrites = false
        storeForWriting().set(node)
        touched(ino)
    }

    /// Add `delta` to the kernels' lookup count of `ino` (runtime only): the
    /// count is changed in place, the node is not made whole (a listing of
    /// thousands of entries takes a reference to each, and gives them back).
    public mutating func addLookups(_ ino: UInt64, _ delta: Int) {
        if undo == nil, storeForWriting().addLookups(ino, delta) { return }
        updateRuntime(ino) { n in n.lookups = delta >= 0 ? n.lookups + UInt64(delta) : n.lookups - min(n.lookups, UInt64(-delta)) }
    }

    /// Runtime-only bookkeeping (lookup and open counts): not persisted.
    public mutating func updateRuntime(_ ino: UInt64, _ body: (inout LocalNode) -> Void) {
        guard var node = store.node(ino) else { return }
        let writers = node.openWriters
        saveNode(ino)
        body(&node)
        storeForWriting().set(node)
        if node.openWriters != writers { itemChanged(ino) }   // isUploading follows it
    }

    /// Link `ino` as `name` in `parent`, replacing whatever was there (the
    /// caller has dealt with the replaced node via `unlinkEntry` first).
    public mutating func linkEntry(_ parent: UInt64, _ name: FileName, _ ino: UInt64, local: Bool = true) {
        let previous = lookup(parent, name) ?? 0
        noteEntryHistory(parent, name, previous)
        saveEntry(parent, name)
        saveNode(ino)
        saveNode(parent)
        saveDirectoryParent(ino)
        let cookie = nextCookie
        nextCookie += 1
        listingChanged(parent)
        let store = storeForWriting()
        store.setEntry(parent, name, DirEntry(ino: ino, cookie: cookie))
        if var node = store.node(ino) {
            if node.kind == .directory {
                node.nlink = 2 + subdirectoryCount(ino)
                if var up = store.node(parent) {
                    up.nlink += 1
                    store.set(up)
                }
                directoryParent[ino] = parent
                structureChanged()
                touched(parent)
            } else {
                node.nlink += 1
            }
            node.unlinked = false
            node.lastParent = parent
            node.lastName = name
            store.set(node)
        }
        touched(ino)
        log.append(.entry(parent: parent, name: name, child: ino))
        if local { markEntryPending(parent, name, base: previous, newChild: version(of: ino) == 0 ? ino : 0) }
    }

    /// Remove the entry `name` from `parent`; returns the node it named.
    @discardableResult
    public mutating func unlinkEntry(_ parent: UInt64, _ name: FileName, local: Bool = true) -> UInt64? {
        guard let ino = lookup(parent, name) else { return nil }
        noteEntryHistory(parent, name, ino)
        saveEntry(parent, name)
        saveNode(ino)
        saveNode(parent)
        saveDirectoryParent(ino)
        listingChanged(parent)
        let store = storeForWriting()
        store.removeEntry(parent, name)
        if var node = store.node(ino) {
            if node.kind == .directory {
                if var up = store.node(parent), up.nlink > 0 {
                    up.nlink -= 1
                    store.set(up)
                }
                touched(parent)
                node.nlink = 0
                directoryParent[ino] = nil
                structureChanged()
            } else if node.nlink > 0 {
                node.nlink -= 1
            }
            if node.nlink == 0 {
                node.unlinked = true
                // A removed node is pushed as a deletion.
                if local { node.change = nextChange() }
            }
            store.set(node)
            touched(ino)
        }
        log.append(.removeEntry(parent: parent, name: name))
        if local { markEntryPending(parent, name, base: ino) }
        return ino
    }

    mutating func noteEntryHistory(_ parent: UInt64, _ name: FileName, _ previous: UInt64) {
        guard entryHistory != nil else { return }
        let earlier = previous == 0 ? nil : store.node(previous).map { EntryHistory.Earlier(ino: previous, kind: $0.kind, mode: $0.mode) }
        entryHistory!.note(EntryKey(parent: parent, name: name), earlier)
    }

    /// The node at `path` (names from the root), if any.
    public func resolve(_ path: [FileName]) -> UInt64? {
        var ino = Self.rootIno
        for name in path {
            guard let next = lookup(ino, name) else { return nil }
            ino = next
        }
        return ino
    }

    /// Whether `ino` is pinned, itself or through a directory above it.
    public func isPinned(_ ino: UInt64) -> Bool {
        guard let node = store.node(ino) else { return false }
        if node.pinned { return true }
        var current: UInt64? = node.kind == .directory ? directoryParent[ino] : (node.unlinked ? nil : node.lastParent)
        var steps = 0
        while let c = current, steps < 100_000 {
            if store.isPinned(c) { return true }
            current = directoryParent[c]
            steps += 1
        }
        return false
    }

    /// Regular files at or below `ino`.
    public func files(under ino: UInt64) -> [UInt64] {
        guard let kind = store.kind(of: ino) else { return [] }
        if kind == .file { return [ino] }
        guard kind == .directory else { return [] }
        var out: [UInt64] = []
        var stack = [ino]
        while let dir = stack.popLast() {
            for entry in entries(of: dir).values {
                switch store.kind(of: entry.ino) {
                case .file?: out.append(entry.ino)
                case .directory?: stack.append(entry.ino)
                default: break
                }
            }
        }
        return out
    }

    /// Every entry naming `ino` (a scan only for hard-linked files).
    public func entriesNaming(_ ino: UInt64) -> [EntryKey] {
        guard let node = store.node(ino), !node.unlinked else { return [] }
        if node.kind == .directory || node.nlink <= 1, lookup(node.lastParent, node.lastName) == ino {
            return [EntryKey(parent: node.lastParent, name: node.lastName)]
        }
        if node.kind == .directory { return [] }
        var out: [EntryKey] = []
        for (parent, entries) in store.dirs {
            for entry in entries.entries where entry.ino == ino {
                out.append(EntryKey(parent: parent, name: entries.name(at: entry.name)))
            }
        }
        return out
    }

    /// Give node `ino` a new stable ID (it becomes a new node to the store).
    public mutating func rekey(_ ino: UInt64, to id: NodeID) {
        guard let old = store.node(ino)?.id else { return }
        saveID(old)
        saveID(id)
        defer {
            // After the node has its new ID, so that the map keeps it with the node.
            if self.ino(forID: old) == ino { setIno(nil, forID: old) }
            setIno(ino, forID: id)
        }
        update(ino) { n in
            n.id = id
            n.version = 0
            n.pushed = 0
            n.hash = nil
            n.hashSize = 0
            n.chunked = false
            n.pushedGeneration = 0
            n.verifiedHash = nil
            if n.contentGeneration == 0 { n.contentGeneration = 1 }
        }
    }

    func subdirectoryCount(_ dir: UInt64) -> UInt32 {
        UInt32(entries(of: dir).values.reduce(0) { $0 + (store.kind(of: $1.ino) == .directory ? 1 : 0) })
    }

    /// The entry changed here; `base` is what it named before (kept from the
    /// first change until the entry is pushed).
    mutating func markEntryPending(_ parent: UInt64, _ name: FileName, base: UInt64, newChild: UInt64 = 0) {
        let key = EntryKey(parent: parent, name: name)
        savePending(key)
        let change = nextChange()
        let base = pendingEntries[key]?.base ?? base
        pendingEntries[key] = PendingEntry(change: change, base: base, newChild: newChild)
        log.append(.pendingEntry(parent: parent, name: name, change: change, base: base))
    }

    /// The entry was pushed as of `change`; forget it unless it changed again since.
    public mutating func entryPushed(_ key: EntryKey, change: UInt64) {
        if let current = pendingEntries[key], current.change <= change {
            savePending(key)
            pendingEntries[key] = nil
            log.append(.clearPendingEntry(parent: key.parent, name: key.name))
        }
    }

    /// `ino` is in the store now: its entry (the last one it was linked as)
    /// no longer names a new node, whether or not that entry was pushed with it.
    public mutating func nodeStored(_ ino: UInt64) {
        guard let node = store.node(ino) else { return }
        let key = EntryKey(parent: node.lastParent, name: node.lastName)
        guard pendingEntries[key]?.newChild == ino else { return }
        savePending(key)
        pendingEntries[key]?.newChild = 0
    }

    /// The entry now holds what the store holds (a remote change set its
    /// value): nothing of it is left to push.
    public mutating func entryMatchesStore(_ key: EntryKey) {
        savePending(key)
        if pendingEntries.removeValue(forKey: key) != nil {
            log.append(.clearPendingEntry(parent: key.parent, name: key.name))
        }
    }

    /// A remote change set changed entry `key`, and the change made here stands
    /// over it: the store's value it was made from is now `base` (0: nothing).
    public mutating func rebaseEntry(_ key: EntryKey, on base: UInt64) {
        guard let pending = pendingEntries[key], pending.base != base else { return }
        savePending(key)
        pendingEntries[key]?.base = base
        log.append(.pendingEntry(parent: key.parent, name: key.name, change: pending.change, base: base))
    }

    /// Node `old` split in two and `new` is now the store's node: pending
    /// entries that named `old` before they changed named `new`.
    public mutating func rebasePendingEntries(from old: UInt64, to new: UInt64) {
        let moved = pendingEntries.compactMap { $0.value.base == old ? $0.key : nil }
        for key in moved {
            savePending(key)
            pendingEntries[key]?.base = new
            log.append(.pendingEntry(parent: key.parent, name: key.name, change: pendingEntries[key]?.change ?? 0, base: new))
        }
    }

    /// Drop a node that has no entries, no opens, no kernel references and
    /// nothing left to push. Returns true if it was dropped (its cache file
    /// can go).
    @discardableResult
    public mutating func dropIfUnreferenced(_ ino: UInt64) -> Bool {
        // (Linked nodes, almost all, are told apart without making the node.)
        guard let slot = store.slot(of: ino), store.isUnlinked(slot: slot) else { return false }
        guard let node = store.node(ino), node.unlinked, node.lookups == 0, node.openCount == 0,
              !node.hasUnpushedMetadata, ino != Self.rootIno else { return false }
        saveNode(ino)
        saveDirectory(ino)
        saveDirectoryParent(ino)
        saveID(node.id)
        let store = storeForWriting()
        if store.ino(forID: node.storedID) == ino { store.setIno(nil, forID: node.storedID) }
        store.remove(ino)
        store.setDirectory(ino, nil)
        directoryParent[ino] = nil
        listingStamps[ino] = nil
        contentTrackers[ino] = nil
        dirtyRows.remove(ino)
        unpushed.remove(ino)
        log.append(.removeNode(ino))
        return true
    }

    public mutating func setAppliedSeq(_ seq: UInt64) {
        appliedSeq = seq
        log.append(.meta(key: "applied_seq", value: String(seq)))
    }

    /// Skip journal record `record.seq` for good: it failed validation.
    /// Written with the new `appliedSeq` in one commit, so a restart neither
    /// tries it again nor forgets it. Only the puller calls this, never
    /// inside a transaction.
    public mutating func quarantine(_ record: QuarantinedRecord) {
        precondition(undo == nil, "a quarantine is recorded by the puller, not inside a transaction")
        quarantined.append(record)
        log.append(.quarantine(record))
        setAppliedSeq(record.seq)
    }

    /// Move dirty node rows into the write log (called under the lock, so the
    /// log keeps the order in which the namespace changed).
    ///
    /// The log starts again empty, not at the capacity it had: the ops go on
    /// to the index applier's queue, and each transaction copies the log
    /// (`Undo`), so a log that once held a burst must not carry its capacity
    /// into every later copy.
    mutating func takeLog() -> [IndexOp] {
        for ino in dirtyRows {
            if let node = store.node(ino) { log.append(.node(node)) }
        }
        dirtyRows.removeAll()
        let out = log
        log = []
        shrinkSparseTables()
        return out
    }

    /// Tables that only grow with a backlog (pending entries, nodes with
    /// something to push) keep the room of their largest backlog unless
    /// given back: once mostly empty, they are made again at their size.
    mutating func shrinkSparseTables() {
        if pendingEntries.isSparse { pendingEntries.shrink() }
        if unpushed.isSparse { unpushed.shrink() }
        if store.unsettled.isSparse || store.extras.isSparse || store.opens.isSparse || store.wideIDs.isSparse {
            let store = storeForWriting()
            if store.unsettled.isSparse { store.unsettled.shrink() }
            if store.extras.isSparse { store.extras.shrink() }
            if store.opens.isSparse { store.opens.shrink() }
            if store.wideIDs.isSparse { store.wideIDs.shrink() }
        }
    }

    /// Put back writes the index did not take (they go first, before
    /// anything logged since): they are written with the next commit.
    mutating func requeue(_ ops: [IndexOp]) {
        log = ops + log
    }

    // MARK: Transactions

    /// What a transaction replaced: for every key it touched, the value
    /// before its first change (nil inside: there was none). Restoring them
    /// puts the namespace back exactly as it was, whatever order the
    /// changes came in.
    struct Undo {
        var nodes: [UInt64: (node: LocalNode?, unpushed: Bool)] = [:]
        var entries: [EntryKey: DirEntry?] = [:]
        /// Whole directory tables, saved when one is created or dropped.
        var directories: [UInt64: Directory?] = [:]
        var ids: [NodeID: UInt64?] = [:]
        var directoryParents: [UInt64: UInt64?] = [:]
        var pending: [EntryKey: PendingEntry?] = [:]
        var nextIno: UInt64
        var nextCookie: UInt64
        var changeCounter: UInt64
        var appliedSeq: UInt64
        var log: [IndexOp]
        var dirtyRows: Set<UInt64>
    }

    /// Start recording what changes replace (one transaction at a time).
    mutating func beginTransaction() {
        precondition(undo == nil, "transactions do not nest")
        undo = Undo(nextIno: nextIno, nextCookie: nextCookie, changeCounter: changeCounter,
                    appliedSeq: appliedSeq, log: log, dirtyRows: dirtyRows)
    }

    /// The index recorded the transaction: keep its changes.
    mutating func endTransaction() {
        undo = nil
    }

    /// Take back everything the transaction changed, including what it
    /// logged for the index. Counters that only announce changes
    /// (`pushWork`, `itemChangeSeq`, `structureSeq`) are left moved: their
    /// readers look again and find nothing new.
    mutating func rollBackTransaction() {
        guard let saved = undo else { return }
        undo = nil
        let store = storeForWriting()
        for (ino, value) in saved.nodes {
            if let node = value.node { store.set(node) } else { store.remove(ino) }
            if value.unpushed { unpushed.insert(ino) } else { unpushed.remove(ino) }
        }
        // Whole tables first: the entries saved below hold the values from
        // before the transaction, also for a table dropped after changing.
        for (dir, table) in saved.directories { store.setDirectory(dir, table) }
        for (key, entry) in saved.entries {
            if let entry {
                store.setEntry(key.parent, key.name, entry)
            } else {
                store.removeEntry(key.parent, key.name)
            }
        }
        for (id, ino) in saved.ids { store.setIno(ino, forID: StoredID(id)) }
        for (dir, parent) in saved.directoryParents { directoryParent[dir] = parent }
        for (key, value) in saved.pending { pendingEntries[key] = value }
        nextIno = saved.nextIno
        nextCookie = saved.nextCookie
        changeCounter = saved.changeCounter
        appliedSeq = saved.appliedSeq
        log = saved.log
        dirtyRows = saved.dirtyRows
    }

    mutating func saveNode(_ ino: UInt64) {
        guard undo != nil, undo!.nodes.index(forKey: ino) == nil else { return }
        undo!.nodes[ino] = (store.node(ino), unpushed.contains(ino))
    }

    mutating func saveEntry(_ parent: UInt64, _ name: FileName) {
        let key = EntryKey(parent: parent, name: name)
        guard undo != nil, undo!.entries.index(forKey: key) == nil else { return }
        undo!.entries[key] = .some(store.entry(parent, name))
    }

    mutating func saveDirectory(_ ino: UInt64) {
        guard undo != nil, undo!.directories.index(forKey: ino) == nil else { return }
        undo!.directories[ino] = .some(store.dirs[ino])
    }

    mutating func saveID(_ id: NodeID) {
        guard undo != nil, undo!.ids.index(forKey: id) == nil else { return }
        undo!.ids[id] = .some(ino(forID: id))
    }

    mutating func saveDirectoryParent(_ ino: UInt64) {
        guard undo != nil, undo!.directoryParents.index(forKey: ino) == nil else { return }
        undo!.directoryParents[ino] = .some(directoryParent[ino])
    }

    mutating func savePending(_ key: EntryKey) {
        guard undo != nil, undo!.pending.index(forKey: key) == nil else { return }
        undo!.pending[key] = .some(pendingEntries[key])
    }

    // MARK: Queries for the sync engine and status

    /// Nodes with something to push.
    public func unpushedNodes() -> [LocalNode] {
        unpushed.compactMap { store.node($0) }
    }

    /// At most `limit` unpushed nodes, oldest (lowest inode number) first, so a
    /// directory goes before what was created in it.
    public func unpushedNodes(limit: Int) -> [LocalNode] {
        guard unpushed.count > limit else { return unpushedNodes().sorted { $0.ino < $1.ino } }
        return Self.smallest(limit, of: unpushed).compactMap { store.node($0) }
    }

    /// The `count` smallest of `values`, in order, without sorting them all
    /// (a backlog of a million new files is pushed 4,000 at a time, and each
    /// round picks its nodes under the namespace lock): the smallest seen so
    /// far are kept, at most twice `count` of them before they are cut back
    /// to `count`, and a value above the largest kept is passed over.
    static func smallest(_ count: Int, of values: Set<UInt64>) -> [UInt64] {
        guard count > 0 else { return [] }
        var kept: [UInt64] = []
        kept.reserveCapacity(2 * count)
        var bound = UInt64.max
        for value in values where value < bound {
            kept.append(value)
            if kept.count == 2 * count {
                kept.sort()
                kept.removeLast(count)
                bound = kept[count - 1]
            }
        }
        kept.sort()
        return Array(kept.prefix(count))
    }

    /// The sizes of the files whose content is here, added up.
    public func localContentBytes() -> UInt64 { store.localContentBytes() }

    /// Items and bytes still waiting to be pushed.
    public func pendingSummary() -> (items: Int, bytes: UInt64) {
        var items = 0
        var bytes: UInt64 = 0
        for ino in unpushed {
            guard let slot = store.slot(of: ino) else { continue }
            items += 1
            bytes += store.unpushedContentBytes(slot: slot)
        }
        // Entries count as items of their own unless their node is already
        // counted. By the `newChild` hint where there is one: with nothing
        // unpushed every entry counts either way, so zero is always exact.
        for (key, pending) in pendingEntries {
            let child: UInt64? = pending.newChild != 0 ? pending.newChild : lookup(key.parent, key.name)
            if child.map({ !unpushed.contains($0) }) ?? true { items += 1 }
        }
        return (items, bytes)
    }

    /// Walk up from `ino` to the root (first entry naming each node): each
    /// node's last place when it still names it, else a scan of every folder.
    public func path(of ino: UInt64) -> String? {
        if ino == Self.rootIno { return "/" }
        if let node = store.node(ino), !node.unlinked, lookup(node.lastParent, node.lastName) == ino,
           let up = path(of: node.lastParent) {
            return up == "/" ? "/\(node.lastName)" : "\(up)/\(node.lastName)"
        }
        for (parent, entries) in store.dirs {
            for entry in entries.entries where entry.ino == ino {
                guard let up = path(of: parent) else { return nil }
                let name = entries.name(at: entry.name)
                return up == "/" ? "/\(name)" : "\(up)/\(name)"
            }
        }
        return nil
    }
}

/// One write to the index, in namespace order.
enum IndexOp: Sendable {
    case node(LocalNode)
    case removeNode(UInt64)
    case entry(parent: UInt64, name: FileName, child: UInt64)
    case removeEntry(parent: UInt64, name: FileName)
    case pendingEntry(parent: UInt64, name: FileName, change: UInt64, base: UInt64)
    case clearPendingEntry(parent: UInt64, name: FileName)
    case meta(key: String, value: String)
    case quarantine(QuarantinedRecord)
    /// Content an `fsync` journaled (`ContentJournal.swift`); not in SQLite.
    case journaledContent(JournaledContent)
    /// The cache file was synced: earlier journaled content of it is on disk. Not in SQLite.
    case contentOnDisk(UInt64)
}

/// A journal record this replica skipped: its number, why, and when (see
/// `SyncEngine.pull`).
public struct QuarantinedRecord: Sendable, Equatable {
    public var seq: UInt64
    public var reason: String
    public var date: Date

    public init(seq: UInt64, reason: String, date: Date = Date()) {
        self.seq = seq
        self.reason = reason
        self.date = date
    }
}
