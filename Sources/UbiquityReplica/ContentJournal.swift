import Foundation
import UbiquityLocks
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// Journaled `fsync`: a small change to a file is made durable by writing
/// its bytes into the operation log, so that one flush (the log's) covers
/// the content, the size, the name and the folder's entries, as one
/// journal commit does on ext4 — instead of three (the cache file, its
/// folder, the log).
///
/// **What is tracked.** For each file whose cache file is known to be on
/// disk up to some point (`ContentTracker`: since it was created empty, or
/// since its last `fsync`), the ranges written since, and the smallest size
/// it had since, on the content generation and epoch they lead to. Every
/// change through a mount moves the tracker along (`trackContentChange`);
/// a change it did not see (a download installed, an eviction, a pull)
/// moves the node's generation or epoch without it, which makes the
/// tracker stale, and the next `fsync` syncs the cache file itself.
///
/// **The record.** `fsync` of a file with a current tracker and at most
/// `JournaledContent.largest` bytes written since appends those bytes
/// (`.journaledContent`: the ranges, the smallest size, the final size, the
/// node's store version) to the next commit, then syncs the log. An `fsync`
/// that syncs the cache file itself records `.contentOnDisk`, which ends
/// what the earlier records say of that file.
///
/// **After a crash of the machine** (`Replica.init`, when the lock file
/// names another boot) each file's records after its last `.contentOnDisk`
/// are played onto its cache file, in order: cut to the smallest size,
/// the ranges written, then cut or extended to the final size — if the
/// node still has local content of the same store version (otherwise a
/// push, a download or a pull came after, and the store holds what the
/// records held). After `kill -9` the kernel still holds every write, so
/// nothing is played back.
///
/// **Records leave the log only after their files are synced**
/// (`Replica.syncJournaledFiles`, before the log is emptied or its previous
/// segment deleted): each cache file named by a record, and its folder.
public struct JournaledContent: Sendable, Equatable {
    /// Past this many bytes written since the last sync, `fsync` syncs the cache file.
    public static let largest = 128 << 10
    /// Past this many separate ranges, likewise.
    public static let mostRanges = 64

    public struct Piece: Sendable, Equatable {
        public var offset: UInt64
        public var bytes: [UInt8]
        public init(offset: UInt64, bytes: [UInt8]) {
            self.offset = offset
            self.bytes = bytes
        }
    }

    public var ino: UInt64
    /// The node's store version when recorded: played back only onto the same.
    public var version: UInt64
    /// The smallest size the content had since the previous record (or sync).
    public var smallestSize: UInt64
    public var size: UInt64
    public var pieces: [Piece]

    public init(ino: UInt64, version: UInt64, smallestSize: UInt64, size: UInt64, pieces: [Piece]) {
        self.ino = ino
        self.version = version
        self.smallestSize = smallestSize
        self.size = size
        self.pieces = pieces
    }

    /// Play this record onto the cache file `fd`.
    func play(onto fd: Int32) throws {
        try syscallRetrying("cut a cache file to its journaled size") { ftruncate(fd, off_t(smallestSize)) }
        for piece in pieces {
            var done = 0
            while done < piece.bytes.count {
                let n = piece.bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress! + done, $0.count - done, off_t(piece.offset) + off_t(done)) }
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { throw UbiquityError.posix("write journaled content of inode \(ino)") }
                done += n
            }
        }
        try syscallRetrying("set a cache file to its journaled size") { ftruncate(fd, off_t(size)) }
    }
}

/// What is known of a file's cache file on disk (see `JournaledContent`).
struct ContentTracker: Sendable {
    /// The content generation and epoch the tracked changes lead to.
    var generation: UInt64
    var epoch: UInt32
    /// The smallest size since the cache file was last known on disk.
    var smallestSize: UInt64
    /// Ranges written since, sorted, disjoint and not touching.
    var ranges: [Range<UInt64>] = []

    var bytesWritten: UInt64 { ranges.reduce(0) { $0 + UInt64($1.count) } }

    mutating func add(_ range: Range<UInt64>) {
        guard !range.isEmpty else { return }
        // An append or a sequential write: the last range grows, or one follows it.
        if let last = ranges.last, range.lowerBound >= last.lowerBound {
            if range.lowerBound <= last.upperBound {
                ranges[ranges.count - 1] = last.lowerBound..<max(last.upperBound, range.upperBound)
                return
            }
            ranges.append(range)
            return
        }
        if ranges.isEmpty {
            ranges = [range]
            return
        }
        var merged = range
        var kept: [Range<UInt64>] = []
        kept.reserveCapacity(ranges.count + 1)
        for r in ranges {
            if r.upperBound < merged.lowerBound || r.lowerBound > merged.upperBound {
                kept.append(r)
            } else {
                merged = min(r.lowerBound, merged.lowerBound)..<max(r.upperBound, merged.upperBound)
            }
        }
        kept.append(merged)
        ranges = kept.sorted { $0.lowerBound < $1.lowerBound }
    }

    mutating func cut(to size: UInt64) {
        smallestSize = min(smallestSize, size)
        ranges = ranges.compactMap { r in
            r.lowerBound >= size ? nil : r.lowerBound..<min(r.upperBound, size)
        }
    }
}

extension Namespace {
    static let mostContentTrackers = 16_384

    /// The cache file of `ino` is on disk as the node says (just created
    /// empty and named in a folder the next commit names, or synced): track
    /// what changes it from here.
    public mutating func contentOnDisk(_ ino: UInt64) {
        guard let node = store.node(ino), node.kind == .file, node.hasContent else { return }
        // Bounded: forgetting a tracker only makes that file's next fsync sync its cache file.
        if contentTrackers.count >= Self.mostContentTrackers { contentTrackers.removeAll(keepingCapacity: true) }
        contentTrackers[ino] = ContentTracker(generation: node.contentGeneration, epoch: node.contentEpoch, smallestSize: node.size)
    }

    /// A change of `ino`'s content through a mount, from `before` (the node
    /// just before it) to what the node is now; `written`: the bytes a write put.
    public mutating func trackContentChange(_ ino: UInt64, from before: LocalNode, written: Range<UInt64>? = nil) {
        guard var tracker = contentTrackers[ino] else { return }
        guard let after = store.node(ino), tracker.generation == before.contentGeneration,
              tracker.epoch == before.contentEpoch, after.contentEpoch == before.contentEpoch else {
            contentTrackers[ino] = nil
            return
        }
        if after.size < before.size { tracker.cut(to: after.size) }
        if let written { tracker.add(written) }
        tracker.generation = after.contentGeneration
        if tracker.ranges.count > JournaledContent.mostRanges || tracker.bytesWritten > UInt64(JournaledContent.largest) {
            contentTrackers[ino] = nil   // the next fsync syncs the file
        } else {
            contentTrackers[ino] = tracker
        }
    }

    /// `ino`'s cache file changed in a way the daemon did not see (writes by
    /// passthrough): the next `fsync` syncs it.
    public mutating func contentChangedUnseen(_ ino: UInt64) {
        contentTrackers[ino] = nil
    }

    /// What an `fsync` of `ino` may journal instead of syncing the cache
    /// file: nil when the tracker is stale or missing.
    public func journalableChange(_ ino: UInt64) -> (generation: UInt64, version: UInt64, smallestSize: UInt64,
                                                     size: UInt64, ranges: [Range<UInt64>])? {
        guard let tracker = contentTrackers[ino], let node = store.node(ino), node.hasContent,
              tracker.generation == node.contentGeneration, tracker.epoch == node.contentEpoch else { return nil }
        return (node.contentGeneration, node.version, tracker.smallestSize, node.size,
                tracker.ranges.map { $0.lowerBound..<min($0.upperBound, node.size) }.filter { !$0.isEmpty })
    }

    /// Add `record` to the next commit; once it is durable, call `journaled`.
    public mutating func journal(_ record: JournaledContent) {
        log.append(.journaledContent(record))
    }

    /// `record` (taken at `generation`) is durable: what it covered is on
    /// disk as far as a later record is concerned — unless the content
    /// changed meanwhile, when the tracker keeps everything (played again).
    public mutating func journaled(_ ino: UInt64, generation: UInt64) {
        guard var tracker = contentTrackers[ino], tracker.generation == generation,
              let node = store.node(ino) else { return }
        tracker.ranges = []
        tracker.smallestSize = node.size
        contentTrackers[ino] = tracker
    }

    /// The cache file of `ino` was synced at `generation` (a classic
    /// `fsync`): the next commit says so (`.contentOnDisk`), and tracking
    /// starts again from here.
    public mutating func cacheFileSynced(_ ino: UInt64, generation: UInt64, epoch: UInt32) {
        log.append(.contentOnDisk(ino))
        guard let node = store.node(ino), node.contentGeneration == generation, node.contentEpoch == epoch else {
            contentTrackers[ino] = nil
            return
        }
        contentOnDisk(ino)
    }
}

extension Replica {
    /// The records of `records` that say what a file's cache file holds:
    /// for each file, its journaled content after its last `.contentOnDisk`, in order.
    static func journaledContent(in records: [OperationLog.Record]) -> [UInt64: [JournaledContent]] {
        var byIno: [UInt64: [JournaledContent]] = [:]
        for record in records {
            for op in record.ops {
                switch op {
                case .journaledContent(let content): byIno[content.ino, default: []].append(content)
                case .contentOnDisk(let ino): byIno[ino] = nil
                default: break
                }
            }
        }
        return byIno
    }

    /// After a crash of the machine: play each file's journaled content onto
    /// its cache file where the node still has local content of the version
    /// recorded (see `JournaledContent`). Returns the files played; the
    /// caller syncs them (`syncCacheFiles`) with the other files the records
    /// name before the log is emptied. (A file
    /// whose node says writes began after its last `fsync` keeps that mark:
    /// the crash recovery makes it a recovered copy, as for any file.)
    static func playJournaledContent(_ journal: [UInt64: [JournaledContent]], into ns: inout Namespace,
                                     cache: ContentCache) throws -> Int {
        var played = 0
        for (ino, records) in journal.sorted(by: { $0.key < $1.key }) {
            guard let last = records.last, let node = ns.node(ino), node.kind == .file, node.hasContent,
                  node.version == last.version else { continue }
            let path = cache.path(ino)
            cache.makeBucket(of: path)
            let fd = try syscallRetrying("open \(path)") { open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
            defer { close(fd) }
            for record in records { try record.play(onto: fd) }
            played += 1
        }
        return played
    }

    /// From this many files on, `syncCacheFiles` syncs the filesystem.
    static let syncfsFrom = 4

    /// Whether `syncfs(2)` on a filesystem of this type (statfs's `f_type`)
    /// writes its dirty files and commits them to the disk: the local disk
    /// filesystems (ext2/3/4, XFS, Btrfs, F2FS). Not FUSE (the kernel sends
    /// `FUSE_SYNCFS` to virtiofs only), not network filesystems.
    static func syncfsReachesTheDisk(filesystemType: Int) -> Bool {
        [0xEF53, 0x5846_5342, 0x9123_683E, 0xF2F5_2010].contains(filesystemType)
    }

    /// Sync the cache files that journaled records name (and their
    /// folders), so that the records may leave the log. Files gone since
    /// (deleted) are skipped.
    ///
    /// Records name many files when programs fsync many small ones (an
    /// editor's saves, git's objects, mail): one `fsync` each would cost a
    /// journal commit and a flush each, in the background but on the disk
    /// the next program's `fsync` waits for. So where `syncfs(2)` reaches
    /// the disk (`syncfsReachesTheDisk`), and past a few files, one
    /// `syncfs` of the cache's filesystem syncs them all at once. Elsewhere
    /// — a FUSE filesystem, to which the kernel does not pass `syncfs` on;
    /// NFS — each file and folder is synced.
    static func syncCacheFiles(_ inos: Set<UInt64>, cache: ContentCache) throws {
        if inos.count >= syncfsFrom, syncfsReachesTheDisk(filesystemType: LinuxCalls.filesystemType(cache.directory.path)) {
            let fd = try syscallRetrying("open \(cache.directory.path)") {
                open(cache.directory.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            }
            defer { close(fd) }
            try syscallRetrying("syncfs \(cache.directory.path)") { LinuxCalls.syncfs(fd) }
            return
        }
        var folders = Set<String>()
        for ino in inos.sorted() {
            let path = cache.path(ino)
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                if errno == ENOENT { continue }
                throw UbiquityError.posix("open \(path) to sync it")
            }
            defer { close(fd) }
            try syscallRetrying("fsync \(path)") { fsync(fd) }
            folders.insert((path as NSString).deletingLastPathComponent)
        }
        for folder in folders.sorted() {
            do {
                try LinuxCalls.syncDirectory(folder)
            } catch let error as UbiquityError where error.errno == ENOENT {
                continue
            }
        }
    }
}
