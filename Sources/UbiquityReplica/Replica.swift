import Foundation
import Synchronization
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// This device's replica of one container: the index, the in-memory
/// namespace, and the content cache.
///
/// Layout under `$XDG_DATA_HOME/ubiquityfs/replicas/STORE-ID/CONTAINER/`:
/// `index.sqlite` (+ WAL), `cache/XX/INO` (content by inode number),
/// `cache/BUCKET/INO.VERSION.part` (downloads in progress), `daemon.log`, `lock`.
///
/// Lock order (outermost first): `Replica.writer` → `Replica.namespace`.
/// `namespace` is held only for in-memory work — never across I/O, a store
/// call or a FUSE reply. `writer` serializes index transactions; it may take
/// `namespace` briefly to collect the log.
public final class Replica: Sendable {
    public let directory: URL
    public let cacheDirectory: URL
    let index: Index
    let namespace: Mutex<Namespace>
    let writer = Mutex<Int>(0)
    let lockFD: Int32
    let lockReleased = Mutex(false)

    /// Open (creating if needed) the replica in `directory` and take its
    /// lock: a second daemon on the same replica is refused with `EBUSY`.
    /// The replica is its owner's only (folders 0700, index 0600) whatever
    /// the umask: it holds every name and the downloaded content.
    public init(directory: URL, rootOwner: (uid: UInt32, gid: UInt32)) throws {
        self.directory = directory
        cacheDirectory = directory.appendingPathComponent("cache")
        let fm = FileManager.default
        do {
            try fm.createDirectory(at: directory, withIntermediateDirectories: true)
        } catch {
            throw UbiquityError(EACCES, "cannot create replica \(directory.path): \(error.localizedDescription)")
        }
        Self.makePrivate(directory.path, mode: 0o700)
        let lockPath = directory.appendingPathComponent("lock").path
        let lockFD = try syscallRetrying("open \(lockPath)") { open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
        self.lockFD = lockFD
        if flock(lockFD, LOCK_EX | LOCK_NB) != 0 {
            var buffer = [UInt8](repeating: 0, count: 32)
            let n = pread(lockFD, &buffer, 31, 0)
            let holder = n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) : "?"
            close(lockFD)
            throw UbiquityError(EBUSY, "replica \(directory.path) is in use by another ubiquityfs daemon (pid \(holder))")
        }
        let pid = "\(getpid())\n"
        ftruncate(lockFD, 0)
        _ = pid.withCString { pwrite(lockFD, $0, strlen($0), 0) }

        try? fm.createDirectory(at: cacheDirectory, withIntermediateDirectories: true)
        Self.makePrivate(cacheDirectory.path, mode: 0o700)

        do {
            let indexPath = directory.appendingPathComponent("index.sqlite").path
            index = try Index(path: indexPath)
            for suffix in ["", "-wal", "-shm"] { Self.makePrivate(indexPath + suffix, mode: 0o600) }
            var ns = try index.load()
            Self.recover(&ns, cacheDirectory: cacheDirectory, rootOwner: rootOwner)
            Self.removeOrphanedCacheFiles(ns, cacheDirectory: cacheDirectory)
            namespace = Mutex(ns)
        } catch {
            close(lockFD)
            throw error
        }
        try persist()
    }

    deinit {
        releaseLock()
    }

    /// Take group and other permissions away from `path` (if it is ours).
    static func makePrivate(_ path: String, mode: mode_t) {
        var st = stat()
        if stat(path, &st) == 0, st.st_uid == geteuid(), st.st_mode & 0o077 != 0 { chmod(path, mode) }
    }

    /// Let another daemon open this replica (the daemon is done with it).
    public func releaseLock() {
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
        return try Index(path: path, readOnly: true).load()
    }

    /// Bring a freshly loaded namespace to a consistent state after a crash.
    static func recover(_ ns: inout Namespace, cacheDirectory: URL, rootOwner: (uid: UInt32, gid: UInt32)) {
        if ns.nodes[Namespace.rootIno] == nil {
            var root = LocalNode(ino: Namespace.rootIno, id: .root, kind: .directory, mode: 0o755,
                                 uid: rootOwner.uid, gid: rootOwner.gid, time: .now())
            root.nlink = 2
            ns.nodes[Namespace.rootIno] = root
            ns.inoByID[.root] = Namespace.rootIno
            ns.children[Namespace.rootIno] = ns.children[Namespace.rootIno] ?? [:]
            ns.dirtyRows.insert(Namespace.rootIno)
        }
        for (ino, node) in ns.nodes {
            // Content written after the last index commit is in the cache file: trust its size.
            if node.kind == .file, node.hasContent, node.hasUnpushedContent {
                var st = stat()
                if stat(cachePath(cacheDirectory, ino), &st) == 0, UInt64(st.st_size) != node.size {
                    ns.nodes[ino]!.size = UInt64(st.st_size)
                    ns.dirtyRows.insert(ino)
                }
            }
            // Nothing references an unlinked node after a restart.
            if ns.nodes[ino]!.unlinked || (ns.nodes[ino]!.nlink == 0 && ino != Namespace.rootIno) {
                ns.nodes[ino]!.unlinked = true
                if ns.dropIfUnreferenced(ino) { unlink(cachePath(cacheDirectory, ino)) }
            }
        }
    }

    /// Delete cache files no node owns (a file created but never closed
    /// before a crash; content of nodes deleted meanwhile). Partial downloads
    /// of placeholders stay: they resume.
    static func removeOrphanedCacheFiles(_ ns: Namespace, cacheDirectory: URL) {
        let fm = FileManager.default
        guard let buckets = try? fm.contentsOfDirectory(atPath: cacheDirectory.path) else { return }
        for bucket in buckets {
            let dir = cacheDirectory.path + "/" + bucket
            guard let names = try? fm.contentsOfDirectory(atPath: dir) else { continue }
            for name in names {
                let isPartial = name.hasSuffix(".part")
                guard let ino = UInt64(isPartial ? String(name.prefix { $0 != "." }) : name) else { continue }
                let node = ns.nodes[ino]
                let owned = isPartial ? node?.isPlaceholder == true : (node?.kind == .file && node?.hasContent == true)
                if !owned { unlink(dir + "/" + name) }
            }
        }
    }

    // MARK: Access

    /// Run `body` on the namespace under the replica's lock. Keep it short:
    /// no I/O, no store calls, no FUSE replies inside.
    public func withNamespace<T: Sendable>(_ body: (inout Namespace) throws -> T) rethrows -> T {
        try namespace.withLock { ns in try body(&ns) }
    }

    /// Write everything the namespace changed since the last call to the
    /// index in one transaction (group commit: a caller whose changes were
    /// written by a concurrent `persist` returns once that commit is done).
    public func persist() throws {
        try writer.withLock { _ in
            let ops = namespace.withLock { ns in ns.takeLog() }
            do {
                try index.write(ops)
            } catch {
                throw UbiquityError(EIO, "replica index write failed: \(error)")
            }
        }
    }


    // MARK: Content cache

    /// `cache/BUCKET/INO`, a bucket per 4096 consecutive inode numbers: files
    /// created together share a directory (ext4 allocates their inodes close
    /// together, which matters when creating thousands of small files), and no
    /// directory grows past 4096 entries.
    static func cachePath(_ cacheDirectory: URL, _ ino: UInt64) -> String {
        cacheDirectory.path + "/" + String(ino >> 12, radix: 16) + "/" + String(ino)
    }

    /// The cache file holding the content of `ino`.
    public func cachePath(_ ino: UInt64) -> String { Self.cachePath(cacheDirectory, ino) }

    /// Create (or truncate) the cache file of `ino`, open for reading and writing.
    public func createCacheFile(_ ino: UInt64) throws -> Int32 {
        let path = cachePath(ino)
        var fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        if fd < 0 && errno == ENOENT {
            mkdir((path as NSString).deletingLastPathComponent, 0o700)
            fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        }
        guard fd >= 0 else {
            let code = errno
            throw UbiquityError(code == ENOSPC || code == EDQUOT ? code : EIO,
                                "create cache file \(path): \(String(cString: strerror(code)))")
        }
        return fd
    }

    /// Move a fully downloaded, verified file into place as the content of `ino`.
    public func installCacheFile(from staged: String, _ ino: UInt64) throws {
        let path = cachePath(ino)
        if rename(staged, path) == 0 { return }
        if errno == ENOENT {
            mkdir((path as NSString).deletingLastPathComponent, 0o700)
            if rename(staged, path) == 0 { return }
        }
        throw UbiquityError.posix("install downloaded content for inode \(ino)")
    }


}
