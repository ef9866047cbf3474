import Foundation
import UbiquityModel

/// One node as this device knows it: the shared state (`NodeState`) plus
/// what only this replica tracks — the inode number, whether the content is
/// here, and what still has to be pushed.
///
/// Change tracking: `change` is the value of the replica's change counter
/// when the node was last modified locally, `pushed` the value that was last
/// committed to the store; the node has metadata to push while
/// `change > pushed`. Content is tracked the same way with
/// `contentGeneration` / `pushedGeneration`.
///
/// A `LocalNode` is the value the namespace hands out and takes back; it
/// does not live in memory like this (see `NodeStore` for the resident
/// form). The ID and the hashes are held packed (`StoredID`, `StoredHash`),
/// so reading a node makes no strings; `id`, `hash` and `verifiedHash`
/// make theirs when asked.
public struct LocalNode: Sendable {
    public var ino: UInt64
    var storedID: StoredID
    public var id: NodeID {
        get { storedID.string }
        set { storedID = StoredID(newValue) }
    }
    public var kind: NodeKind
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    /// Local size (of the cache file for files with local content).
    public var size: UInt64
    public var rdev: UInt64
    public var target: String?
    /// Hash and size of the content last pushed to or pulled from the store.
    var storedHash: StoredHash?
    public var hash: String? {
        get { storedHash?.string }
        set { storedHash = newValue.map(StoredHash.init) }
    }
    public var hashSize: UInt64
    /// `hash` names a chunk manifest (content larger than one chunk).
    public var chunked: Bool
    public var atime: Timespec
    public var mtime: Timespec
    public var ctime: Timespec
    public var btime: Timespec
    public var xattrs: [String: Data]
    /// The cache file holds this node's content (always true for new local files).
    public var hasContent: Bool
    public var contentGeneration: UInt64
    public var pushedGeneration: UInt64
    /// Journal sequence number of the state this node was last synced with.
    public var version: UInt64
    public var change: UInt64
    public var pushed: UInt64
    /// Number of entries naming this node (directories: 2 + subdirectories).
    public var nlink: UInt32
    /// No entry names this node any more; it lives on while open or known to the kernel.
    public var unlinked: Bool
    /// The entry that named this node last (kept after unlinking, so a
    /// deletion that loses to a remote edit can be undone).
    public var lastParent: UInt64 = 0
    public var lastName: FileName = FileName(bytes: [])
    /// Conflicted copies of this node not yet resolved.
    public var conflicts: [NodeID] = []
    /// Keep on this device (a pinned directory pins what arrives in it later).
    public var pinned = false
    /// The device that made the current content (for `versions`).
    public var author = ""
    /// The content hash this device has verified its local copy against:
    /// the push hashed exactly these bytes and found (or put) the blobs in
    /// the store with the right sizes, or a download checked every blob.
    /// Eviction trusts the local copy to be `hash` only when the two agree
    /// (see `SyncEngine.evict`).
    var storedVerifiedHash: StoredHash?
    public var verifiedHash: String? {
        get { storedVerifiedHash?.string }
        set { storedVerifiedHash = newValue.map(StoredHash.init) }
    }
    /// The cache file may hold writes no `close` or `fsync` acknowledged yet
    /// (persisted before the first of them reaches the file; cleared when
    /// they are acknowledged). Found set at startup, the daemon died in the
    /// middle of a rewrite: the content becomes a recovered copy instead of
    /// replacing the last good version (see `SyncEngine.recoverInterruptedWrites`).
    /// Only set on nodes the store has (`version > 0`): a new file has no
    /// good version to protect.
    public var unacknowledgedWrites = false

    // Runtime only (never persisted).
    public var lookups: UInt64 = 0
    /// Opens and writers of the content, and opens under way (from looking
    /// at the node until the open is counted, a placeholder's download
    /// included: eviction keeps off meanwhile). Changed only through
    /// `ContentOpens.swift`.
    public internal(set) var openCount: Int32 = 0
    public internal(set) var openWriters: Int32 = 0
    public internal(set) var opening: Int32 = 0
    /// Monotonic nanoseconds of the last local content change (write-back delay).
    public var lastContentChange: UInt64 = 0
    /// When the content was last opened or downloaded, in `AccessClock`
    /// ticks (least recently used eviction).
    public var lastAccess: UInt32 = 0
    /// Moves when the cache file is replaced by other content (a remote
    /// version, a download, an eviction): the kernel's pages of the file are
    /// then not to be trusted by the next open.
    public var contentEpoch: UInt32 = 0

    public init(ino: UInt64, id: NodeID, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32,
                size: UInt64 = 0, rdev: UInt64 = 0, target: String? = nil, time: Timespec) {
        self.init(ino: ino, storedID: StoredID(id), kind: kind, mode: mode, uid: uid, gid: gid,
                  size: size, rdev: rdev, target: target, time: time)
    }

    init(ino: UInt64, storedID: StoredID, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32,
         size: UInt64 = 0, rdev: UInt64 = 0, target: String? = nil, time: Timespec) {
        self.ino = ino; self.storedID = storedID; self.kind = kind; self.mode = mode; self.uid = uid; self.gid = gid
        self.size = size; self.rdev = rdev; self.target = target
        self.storedHash = nil; self.hashSize = 0; self.chunked = false
        self.atime = time; self.mtime = time; self.ctime = time; self.btime = time
        self.xattrs = [:]
        self.hasContent = true
        self.contentGeneration = 0; self.pushedGeneration = 0
        self.version = 0; self.change = 0; self.pushed = 0
        self.nlink = kind == .directory ? 2 : 0
        self.unlinked = false
    }

    public var isDirectory: Bool { kind == .directory }
    public var hasUnpushedMetadata: Bool { change > pushed }
    public var hasUnpushedContent: Bool { kind == .file && contentGeneration > pushedGeneration }
    public var isPlaceholder: Bool { kind == .file && !hasContent }

    /// The state to commit to the store for this node, with content `hash`/`size`.
    public func sharedState(hash: String?, size: UInt64, chunked: Bool) -> NodeState {
        NodeState(id: id, kind: kind, mode: mode, uid: uid, gid: gid,
                  size: kind == .file ? size : (kind == .symlink ? UInt64(target?.utf8.count ?? 0) : 0),
                  hash: kind == .file ? hash : nil, target: target, rdev: rdev,
                  mtime: mtime, ctime: ctime, btime: btime, xattrs: xattrs, base: version,
                  chunked: kind == .file && hash != nil && chunked, conflicts: conflicts)
    }
}

/// One directory entry in memory. `cookie` orders the entries of a
/// directory for `readdir` offsets: it only grows, so a listing resumed at
/// an offset never repeats or skips an entry that stayed put.
public struct DirEntry: Sendable {
    public var ino: UInt64
    public var cookie: UInt64
}

public struct EntryKey: Hashable, Sendable {
    public var parent: UInt64
    public var name: FileName
    public init(parent: UInt64, name: FileName) {
        self.parent = parent
        self.name = name
    }
}

/// The clock of `LocalNode.lastAccess`: hundredths of a second since the
/// process started, monotonic, in the 4 bytes a node record gives it. It
/// stops at its largest value after 497 days of running; accesses after
/// that count as equally recent (eviction then picks among them by size).
public enum AccessClock {
    static let start = monotonicNanoseconds()

    public static func now() -> UInt32 {
        // `start` is set on its first use: read it before the clock, or the
        // first call would see the clock before its own start.
        let origin = start
        let clock = monotonicNanoseconds()
        return UInt32(clamping: (clock > origin ? clock - origin : 0) / 10_000_000 + 1)
    }

    static func monotonicNanoseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }
}
