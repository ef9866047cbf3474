import Foundation
import UbiquityLocks
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// This device's replica of one container: the index, the in-memory
/// namespace, and the content cache.
///
/// Layout under `$XDG_DATA_HOME/ubiquityfs/replicas/STORE-ID/CONTAINER/`:
/// `index.log` (the operation log, see `OperationLog`), `index.sqlite` (+ WAL),
/// `cache/XX/INO` (content by inode number),
/// `cache/BUCKET/INO.VERSION.part` (downloads in progress), `spare/N` (emptied
/// cache files for new files to take, see `SpareCacheFiles`), `reserve` (space
/// set aside, see `SpaceReserve`), `daemon.log`, `lock` (`PID BOOT` while a daemon has it
/// open, see `openedAfterSystemCrash`).
///
/// **Changes and the index.** A change the user makes (a new item, a move,
/// a removal, new metadata) runs as a `transaction`: it is applied to the
/// namespace and written to the index (appended to its operation log: one
/// `write(2)`, copied into SQLite in the background by `IndexApplier`) under
/// the namespace lock, and taken back whole if the log does not take it — so nobody ever sees a change
/// the index lacks, and a failed operation has no effect.
/// What only records a fact (a pull applied, a push done, a download
/// installed, the size of content already written) goes through `persist`:
/// if the index does not take it, it stays queued in memory and is written
/// with the next commit (after a crash it is learned again: pulled, pushed,
/// downloaded, or read from the cache file). The sync engine pushes only
/// what the index holds (`committedView`).
///
/// Lock order (outermost first): `Replica.synced` → `Replica.writer` →
/// `Replica.namespace` → `SpaceReserve.state` → `IndexApplier.condition`;
/// `ContentCache.createdInBuckets` and `journaledRecords` are leaves. `writer` serializes
/// appends to the operation log. `namespace` is
/// held for in-memory work and, in a transaction, for its one index write
/// (and, on a full disk, the reserve's one system call) — never across
/// content I/O, a store call or a FUSE reply.
public final class Replica: Sendable {
    public let directory: URL
    /// The files holding content (`ContentCache`).
    public let cache: ContentCache
    let index: Index
    let log: OperationLog
    let applier: IndexApplier
    let namespace: Lock<Namespace>
    /// Operation log records SQLite lacked when the replica was opened (the
    /// daemon had stopped without waiting for `IndexApplier`).
    public let replayedRecords: Int
    /// Files whose journaled content was played back after a crash of the machine.
    public let playedJournaledFiles: Int
    let writer = Lock<Int>(0)
    /// The last operation log record `makeDurable` synced; held across the
    /// flush (see there).
    let synced = Lock<UInt64>(0)
    /// Records holding journaled content (`JournaledContent`) whose cache
    /// files were not synced since: what `syncJournaledFiles` syncs before
    /// records leave the log. Taken inside `writer`, or alone.
    let journaledRecords = Lock<[(seq: UInt64, ino: UInt64)]>([])
    let lockFD: Int32
    let lockReleased = Lock(false)
    /// The machine went down (a power cut, a kernel crash) while this
    /// replica was open the last time: its lock file still names another
    /// boot. Writes to cache files that were never synced may then have
    /// reached the disk while the operation log records describing them did
    /// not, so a local copy the index calls the store's version may differ
    /// from it: `SyncEngine.recoverInterruptedWrites` checks them all.
    public let openedAfterSystemCrash: Bool
    /// This boot's identity, written into the lock file while the replica is open.
    let boot: String
    /// Where `boot` comes from unless the opener names it:
    /// `/proc/sys/kernel/random/boot_id`. The testing command replaces it, so
    /// that a simulated power cut is a new boot.
    public static let bootIdentity = Lock<@Sendable () -> String>({
        ((try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)) ?? "")
            .trimmingCharacters(in: .whitespacesAndNewlines)
    })
    let reserve: SpaceReserve
    /// Past this size the operation log's current segment is emptied or rotated.
    let logSegmentSize: Int
    /// Content I/O of the programs using the mount, which pushing gives way to.
    public let foreground = ForegroundActivity()

    /// Open (creating if needed) the replica in `directory` and take its
    /// lock: a second daemon on the same replica is refused with `EBUSY`.
    /// The replica is its owner's only (folders 0700, index 0600) whatever
    /// the umask: it holds every name and the downloaded content.
    /// `sparesAhead`: empty cache files to make in the background for the
    /// first creates (`SpareCacheFiles.fillAhead`; the daemon asks for
    /// `defaultSparesAhead`).
    public static let defaultSparesAhead = 1024

    public init(directory: URL, rootOwner: (uid: UInt32, gid: UInt32), logSegmentSize: Int = 4 << 20,
                sparesAhead: Int = 0, boot: String? = nil) throws {
        self.directory = directory
        self.logSegmentSize = logSegmentSize
        let fm = FileManager.default
        do {
            try fm.createDirectory(at: directory, withIntermediateDirectories: true)
        } catch {
            throw UbiquityError(EACCES, "cannot create replica \(directory.path): \(error.localizedDescription)")
        }
        Self.makePrivate(directory.path, mode: 0o700)
        // The lock file holds "PID BOOT" while a daemon has the replica open,
        // and nothing once it closed it cleanly (`closedCleanly`).
        let lockPath = directory.appendingPathComponent("lock").path
        let lockExisted = fm.fileExists(atPath: lockPath)
        let lockFD = try syscallRetrying("open \(lockPath)") { open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
        self.lockFD = lockFD
        var buffer = [UInt8](repeating: 0, count: 128)
        let n = pread(lockFD, &buffer, 127, 0)
        let holder = (n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self) : "").split(separator: " ").map {
            $0.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        if flock(lockFD, LOCK_EX | LOCK_NB) != 0 {
            close(lockFD)
            throw UbiquityError(EBUSY, "replica \(directory.path) is in use by another ubiquityfs daemon (pid \(holder.first ?? "?"))")
        }
        let boot = boot ?? Self.bootIdentity.withLock { $0 }()
        self.boot = boot
        openedAfterSystemCrash = holder.count > 1 && holder[1] != boot
        do {
            // After a crash the old boot stays until the local copies are
            // checked (`checkedAfterSystemCrash`): a daemon that dies while
            // checking leaves it for the next one.
            try Self.writeLock(lockFD, boot: openedAfterSystemCrash ? holder[1] : boot)
            if !lockExisted { try LinuxCalls.syncDirectory(directory.path) }
        } catch {
            close(lockFD)
            throw error
        }

        cache = ContentCache(replicaDirectory: directory, sparesAhead: sparesAhead)

        do {
            reserve = try SpaceReserve(path: directory.appendingPathComponent("reserve").path)
            let indexPath = directory.appendingPathComponent("index.sqlite").path
            index = try Index(path: indexPath)
            log = try OperationLog(path: directory.appendingPathComponent("index.log").path)
            for suffix in ["", "-wal", "-shm"] { Self.makePrivate(indexPath + suffix, mode: 0o600) }
            Self.makePrivate(log.path, mode: 0o600)
            let records = try log.readRecords()
            replayedRecords = try Self.replay(records, of: log, into: index, reserve: reserve)
            var ns = try index.load()
            // Journaled content first: the recovery below reads cache files' sizes.
            let journal = Self.journaledContent(in: records)
            playedJournaledFiles = openedAfterSystemCrash ? try Self.playJournaledContent(journal, into: &ns, cache: cache) : 0
            try Self.syncCacheFiles(Set(journal.keys), cache: cache)
            if log.size > 0 || log.previousLastSeq != nil {
                index.checkpointAll()
                log.truncate()
            }
            Self.recover(&ns, cache: cache, rootOwner: rootOwner)
            cache.removeOrphans(ns)
            namespace = Lock(ns)
        } catch {
            close(lockFD)
            throw error
        }
        let owner = WeakReplica()
        applier = IndexApplier(index: index, appliedSeq: log.lastSeq, foreground: foreground) { owner.replica?.trimLog(applied: $0) }
        owner.replica = self
        try persist()
    }

    deinit {
        releaseLock()
    }

    final class WeakReplica: @unchecked Sendable {
        weak var replica: Replica?
    }

    /// Apply the `records` of `log` that `index` lacks (the daemon stopped
    /// before `IndexApplier` copied them). On a full disk the space reserve
    /// gives its room, a step at a time.
    static func replay(_ records: [OperationLog.Record], of log: OperationLog, into index: Index,
                       reserve: SpaceReserve) throws -> Int {
        let applied = try index.logApplied()
        let missing = records.filter { $0.seq > applied }
        if let last = missing.last {
            var ops = missing.flatMap(\.ops)
            ops.append(.meta(key: "log_applied", value: String(last.seq)))
            while true {
                do {
                    try index.write(ops)
                    break
                } catch let error as UbiquityError where error.errno == ENOSPC {
                    guard reserve.release() else { throw error }
                }
            }
        }
        log.lastSeq = max(applied, records.last?.seq ?? 0)
        return missing.count
    }

    /// Keep the operation log small (called by `IndexApplier` after each
    /// batch it wrote): delete the previous segment once SQLite holds it;
    /// past `logSegmentSize`, empty the log if SQLite holds all of it, or
    /// else rotate it.
    ///
    /// SQLite commits with `synchronous=NORMAL` are not synced, while a
    /// record `makeDurable` synced must survive a power loss: before
    /// records leave the log, a checkpoint puts what SQLite holds on disk
    /// (outside `writer`; once per few MiB of log). If it cannot, the
    /// records stay and the next batch tries again.
    func trimLog(applied: UInt64) {
        let dropsRecords = writer.withLock { _ -> Bool in
            if let previous = log.previousLastSeq, applied >= previous { return true }
            return log.size >= logSegmentSize && applied == log.lastSeq
        }
        let indexDurable = dropsRecords && index.checkpointDurably()
        if dropsRecords {
            do {
                try syncJournaledFiles()
            } catch {
                // The records stay in the log (it rotates instead), and the next batch tries again.
                FileHandle.standardError.write(Data("ubiquityfs: journaled content cannot leave the operation log yet: \(error)\n".utf8))
            }
        }
        writer.withLock { _ in
            if let previous = log.previousLastSeq, applied >= previous, indexDurable,
               !holdsJournaledContent(upTo: previous) { log.removePrevious() }
            guard log.size >= logSegmentSize else { return }
            if applied == log.lastSeq && indexDurable && !holdsJournaledContent(upTo: log.lastSeq) {
                log.truncate()
            } else {
                log.rotate()
            }
        }
    }

    /// Whether records up to `seq` hold journaled content whose cache files
    /// were not synced since (they must stay in the log).
    func holdsJournaledContent(upTo seq: UInt64) -> Bool {
        journaledRecords.withLock { $0.contains { $0.seq <= seq } }
    }

    /// Sync the cache files named by journaled content in the log (see
    /// `JournaledContent`), so that their records may leave it. Not under `writer`.
    func syncJournaledFiles() throws {
        let pending = journaledRecords.withLock { $0 }
        guard let upTo = pending.last?.seq else { return }
        try Self.syncCacheFiles(Set(pending.map(\.ino)), cache: cache)
        journaledRecords.withLock { $0.removeAll { $0.seq <= upTo } }
    }

    /// Make every change committed so far survive a power loss (`fsync`,
    /// `fdatasync`, `fsyncdir` through the mount): the operation log is
    /// synced, and with `cacheFolders` (an `fsync` that synced a cache file)
    /// so are the cache folders in which cache files were created or
    /// installed since the last time (their names).
    ///
    /// Group commit: callers that arrive while a sync is under way wait
    /// for it, and the next sync covers all of them, so a burst of fsyncs
    /// from many threads costs a few disk flushes, not one each. Lock
    /// order: `synced` → `writer`; `writer` is held only to take the log's
    /// descriptor, never across the flush.
    public func makeDurable(cacheFolders: Bool = false) throws {
        let target = writer.withLock { _ in log.lastSeq }
        try synced.withLock { syncedSeq in
            guard syncedSeq < target || (cacheFolders && cache.hasCreatedBuckets) else { return }
            let (upTo, fd) = writer.withLock { _ in (log.lastSeq, dup(log.fd)) }
            guard fd >= 0 else { throw UbiquityError.posix("duplicate the operation log's descriptor") }
            defer { close(fd) }
            for path in cacheFolders ? cache.takeCreatedBuckets() : [] {
                do {
                    try LinuxCalls.syncDirectory(path)
                } catch let error as UbiquityError where error.errno == ENOENT {
                    continue   // removed meanwhile: nothing in it to keep
                }
            }
            try syscallRetrying("fdatasync \(log.path)") { fdatasync(fd) }
            syncedSeq = upTo
        }
    }

    /// Commit what is queued, wait for SQLite to hold all of it and
    /// checkpoint it completely: for a replica being closed (its log and WAL
    /// are emptied into the database file).
    public func commitAndCheckpoint() throws {
        try persist()
        try applier.drain()
        try syncJournaledFiles()
        writer.withLock { _ in
            index.checkpointAll()
            if applier.appliedUpTo == log.lastSeq && !holdsJournaledContent(upTo: log.lastSeq) { log.truncate() }
        }
    }

    /// Take group and other permissions away from `path` (if it is ours).
    static func makePrivate(_ path: String, mode: mode_t) {
        var st = stat()
        if stat(path, &st) == 0, st.st_uid == geteuid(), st.st_mode & 0o077 != 0 { chmod(path, mode) }
    }

    /// The replica is closed cleanly (after `commitAndCheckpoint`): every
    /// cache file is synced (`syncfs` of the replica's filesystem) and the
    /// lock file no longer names a boot, so the next open after a restart of
    /// the machine trusts the local copies. If the sync fails the boot stays,
    /// and they are checked.
    public func closedCleanly() throws {
        try syscallRetrying("syncfs \(directory.path)") { LinuxCalls.syncfs(lockFD) }
        try Self.writeLock(lockFD, boot: nil)
    }

    /// The local copies were checked after a crash of the machine (and what
    /// the check marked is durable): the lock file names this boot now.
    public func checkedAfterSystemCrash() throws {
        try Self.writeLock(lockFD, boot: boot)
    }

    /// The lock file says "PID BOOT" (or nothing: closed cleanly), synced, so
    /// that a power cut from now on finds it.
    /// Written over the old text, then cut to length: a power cut between
    /// leaves the old boot or a mix, never an empty file that would pass
    /// for a clean close.
    static func writeLock(_ fd: Int32, boot: String?) throws {
        let text = boot.map { "\(getpid()) \($0)\n" } ?? ""
        let written = text.withCString { pwrite(fd, $0, strlen($0), 0) }
        guard written == text.utf8.count else { throw UbiquityError.posix("write the replica's lock file") }
        try syscallRetrying("truncate the replica's lock file") { ftruncate(fd, off_t(text.utf8.count)) }
        try syscallRetrying("fsync the replica's lock file") { fsync(fd) }
    }

    /// Let another daemon open this replica (the daemon is done with it).
    public func releaseLock() {
        applier.stop()
        lockReleased.withLock { released in
            if !released { close(lockFD) }
            released = true
        }
    }

    /// The namespace of the replica in `directory`, read without taking its
    /// lock and without writing anything (for queries while no daemon runs).
    public static func readNamespace(directory: URL) throws -> Namespace {
        let path = directory.appendingPathComponent("index.sqlite").path
        guard FileManager.default.fileExists(atPath: path) else {
            throw UbiquityError(ENOENT, "this device has no replica at \(directory.path)")
        }
        let index = try Index(path: path, readOnly: true)
        // Changes the daemon logged but had not copied into SQLite yet.
        let logPath = directory.appendingPathComponent("index.log").path
        let applied = try index.logApplied()
        let missing = try OperationLog.records(atPath: logPath).filter { $0.seq > applied }
        guard !missing.isEmpty else { return try index.load() }
        let copy = try Index(copyOf: index)
        try copy.write(missing.flatMap(\.ops))
        return try copy.load()
    }

    /// Bring a freshly loaded namespace to a consistent state after a crash.
    static func recover(_ ns: inout Namespace, cache: ContentCache, rootOwner: (uid: UInt32, gid: UInt32)) {
        if ns.node(Namespace.rootIno) == nil {
            var root = LocalNode(ino: Namespace.rootIno, id: .root, kind: .directory, mode: 0o755,
                                 uid: rootOwner.uid, gid: rootOwner.gid, time: .now())
            root.nlink = 2
            ns.setNode(root)
            ns.setIno(Namespace.rootIno, forID: .root)
            if ns.children[Namespace.rootIno] == nil { ns.storeForWriting().setDirectory(Namespace.rootIno, Directory()) }
            ns.dirtyRows.insert(Namespace.rootIno)
        }
        // What needs changing is found first, then changed: a change while
        // the namespace is being read would copy it.
        var written: [(ino: UInt64, size: UInt64, time: Timespec)] = []
        var unlinked: [UInt64] = []
        for (ino, node) in ns.nodes {
            // Content written after the last index commit (a new file's
            // writes are acknowledged without one) is in the cache file:
            // trust its size, and its time when newer than the last change
            // the index holds.
            if node.kind == .file, node.hasContent, node.hasUnpushedContent {
                var st = stat()
                if stat(cache.path(ino), &st) == 0 {
                    let modified = Timespec(sec: Int64(st.st_mtim.tv_sec), nsec: Int64(st.st_mtim.tv_nsec))
                    if UInt64(st.st_size) != node.size || modified > node.ctime {
                        written.append((ino, UInt64(st.st_size), max(modified, node.mtime)))
                    }
                }
            }
            // Nothing references an unlinked node after a restart.
            if node.unlinked || (node.nlink == 0 && ino != Namespace.rootIno) { unlinked.append(ino) }
        }
        for change in written {
            ns.modifyNode(change.ino) {
                $0.size = change.size
                $0.mtime = change.time
                $0.ctime = max($0.ctime, change.time)
            }
            ns.dirtyRows.insert(change.ino)
        }
        for ino in unlinked {
            ns.modifyNode(ino) { $0.unlinked = true }
            if ns.dropIfUnreferenced(ino) { cache.retire(ino) }
        }
    }

    // MARK: Access

    /// Read the namespace under the replica's lock. Keep it short: no I/O,
    /// no store calls, no FUSE replies inside.
    public func read<T: Sendable>(_ body: (Namespace) throws -> T) rethrows -> T {
        try namespace.withLock { ns in try body(ns) }
    }

    /// Record a fact in the namespace under the replica's lock: something
    /// that happened and cannot be refused (a write reached a cache file, a
    /// push or a download ended, a kernel's count moved). The index learns
    /// it with the next commit (`persist`, `transaction`, `committedView`);
    /// a change a program asks for, which may be refused or fail to be
    /// recorded, is a `transaction`. Same rules as `read`.
    public func record<T: Sendable>(_ body: (inout Namespace) throws -> T) rethrows -> T {
        try namespace.withLock { ns in try body(&ns) }
    }

    /// Make a change that takes effect only if the index records it.
    ///
    /// `body` changes the namespace (and may throw to refuse); everything
    /// logged so far is then written to the index in one SQLite
    /// transaction, still under the namespace lock. If `body` throws or the
    /// write fails, the namespace is put back exactly as it was and the
    /// error is thrown: `ENOSPC` when the disk has no room, `EIO` otherwise.
    /// `committed` runs after a successful write, still under the lock (for
    /// a file operation that must follow the commit and not interleave with
    /// others, such as removing an evicted file's content).
    ///
    /// A change that `.grows` the replica is refused with `ENOSPC` unless the
    /// space reserve is whole; one that `.mayUseReserve` gets the reserve's
    /// space, a step at a time, when the disk is full.
    public func transaction<T: Sendable>(_ use: DiskUse, _ body: (inout Namespace) throws -> T,
                                         committed: (inout Namespace, T) -> Void = { _, _ in }) throws -> T {
        try writer.withLock { _ in
            let result = try namespace.withLock { ns -> T in
                ns.beginTransaction()
                do {
                    let value = try body(&ns)
                    // After `body`: its own refusals (EEXIST…) come first, as on any filesystem.
                    if use == .grows { try reserve.requireWhole() }
                    try write(ns.takeLog(), use)
                    ns.endTransaction()
                    committed(&ns, value)
                    return value
                } catch {
                    ns.rollBackTransaction()
                    throw error
                }
            }
            return result
        }
    }

    /// Write what the namespace recorded since the last commit (the facts
    /// `persist` is for, and content sizes from writes) in one transaction.
    /// If the index does not take it, it stays queued for the next commit
    /// and the error is thrown (`ENOSPC` when the disk has no room; for
    /// `.grows`, also while the space reserve is not whole).
    public func persist(_ use: DiskUse = .mayUseReserve) throws {
        try writer.withLock { _ in
            let ops = namespace.withLock { ns in ns.takeLog() }
            do {
                if use == .grows && !ops.isEmpty { try reserve.requireWhole() }
                try write(ops, use)
            } catch {
                namespace.withLock { ns in ns.requeue(ops) }
                throw error
            }
        }
    }

    /// `body`'s view of the namespace at a moment when the index holds all
    /// of it: what the namespace recorded so far is written first (as by
    /// `persist`), and `body` sees exactly that. The sync engine builds its
    /// change sets here, so it never pushes what this device could lose.
    public func committedView<T: Sendable>(_ body: (Namespace) -> T) throws -> T {
        try writer.withLock { _ in
            let (ops, value) = namespace.withLock { ns in (ns.takeLog(), body(ns)) }
            do {
                try write(ops, .mayUseReserve)
            } catch {
                namespace.withLock { ns in ns.requeue(ops) }
                throw error
            }
            return value
        }
    }

    /// `ENOSPC` if the disk is full, as far as content is concerned: new
    /// content (a write, an allocation) needs the space reserve to be whole.
    public func requireRoomForContent() throws {
        try reserve.requireWhole()
    }

    /// Commit `ops`: append them to the operation log as one record and hand
    /// them to the applier (the caller holds `writer`). When the disk is full
    /// and `use` allows it, give back the reserve a step at a time and try again.
    func write(_ ops: [IndexOp], _ use: DiskUse) throws {
        guard !ops.isEmpty else { return }
        while true {
            do {
                let record = try log.append(ops)
                for case .journaledContent(let content) in ops {
                    journaledRecords.withLock { $0.append((record.seq, content.ino)) }
                }
                applier.enqueue(record)
                return
            } catch let error as UbiquityError where error.errno == ENOSPC && use == .mayUseReserve {
                guard reserve.release() else { throw error }
            }
        }
    }
}
