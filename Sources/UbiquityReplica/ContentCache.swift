import Foundation
import UbiquityLocks
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// The replica's content cache: the files that hold content on this device.
///
/// - `cache/BUCKET/INO`: the content of node `INO` (local, or downloaded
///   and verified), a bucket per 4,096 consecutive inode numbers: files
///   created together share a folder (ext4 allocates their inodes close
///   together, which matters when making thousands of small files), and no
///   folder grows past 4,096 entries.
/// - `cache/BUCKET/INO.VERSION.part`: a download in progress (`partialPath`),
///   renamed over `INO` when complete and verified (`install`).
/// - `spare/N`: emptied cache files that new files take (`SpareCacheFiles`).
///
/// It owns the paths, creating, installing and retiring files, the buckets
/// that gained files since the last `Replica.makeDurable` (which syncs
/// them), and the sweep of files no node owns after a crash. What a file
/// holds, and who may open it, is the namespace's business.
///
/// Lock order: `createdInBuckets` is a leaf.
public final class ContentCache: Sendable {
    public let directory: URL
    /// `directory.path`, computed once (every open builds a cache path).
    let directoryPath: String
    let spares: SpareCacheFiles
    /// Buckets in which a cache file was created or installed since the last `takeCreatedBuckets`.
    let createdInBuckets = Lock<Set<UInt64>>([])

    init(replicaDirectory: URL, sparesAhead: Int) {
        directory = replicaDirectory.appendingPathComponent("cache")
        directoryPath = directory.path
        try? FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        Replica.makePrivate(directoryPath, mode: 0o700)
        spares = SpareCacheFiles(directoryPath: replicaDirectory.appendingPathComponent("spare").path, ahead: sparesAhead)
        spares.fillAhead()
    }

    static func bucket(_ ino: UInt64) -> UInt64 { ino >> 12 }

    func bucketPath(_ bucket: UInt64) -> String {
        directoryPath + "/" + String(bucket, radix: 16)
    }

    /// The cache file holding the content of `ino`.
    public func path(_ ino: UInt64) -> String {
        bucketPath(Self.bucket(ino)) + "/" + String(ino)
    }

    /// Where a download of version `version` (a content hash) of `ino` is written.
    public func partialPath(_ ino: UInt64, version: String?) -> String {
        path(ino) + "." + String((version ?? "empty").prefix(16)) + ".part"
    }

    /// Create (or truncate) the cache file of `ino`, open for reading and
    /// writing: a spare moved into place when there is one.
    public func create(_ ino: UInt64) throws -> Int32 {
        let path = path(ino)
        createdInBuckets.withLock { _ = $0.insert(Self.bucket(ino)) }
        if spares.take(to: path) {
            // Empty already: no O_TRUNC, which would mark it to be flushed at close (see `SpareCacheFiles`).
            let fd = open(path, O_RDWR | O_CLOEXEC)
            if fd >= 0 { return fd }
        }
        var fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        if fd < 0 && errno == ENOENT {
            makeBucket(of: path)
            fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        }
        guard fd >= 0 else {
            let code = errno
            throw UbiquityError(code == ENOSPC || code == EDQUOT ? code : EIO,
                                "create cache file \(path): \(String(cString: strerror(code)))")
        }
        return fd
    }

    /// Make the bucket `path` goes in, and sync the bucket's name (what is
    /// put in it is synced by `makeDurable`; a new bucket is rare: one per
    /// 4,096 inode numbers).
    func makeBucket(of path: String) {
        let bucket = (path as NSString).deletingLastPathComponent
        if mkdir(bucket, 0o700) == 0 { try? LinuxCalls.syncDirectory((bucket as NSString).deletingLastPathComponent) }
    }

    /// Retire the cache file of `ino`, a node just dropped (nothing uses it):
    /// it is kept, empty, as a spare for a new file.
    public func retire(_ ino: UInt64) {
        spares.retire(path(ino))
    }

    /// Move a fully downloaded, verified file into place as the content of `ino`.
    public func install(from staged: String, _ ino: UInt64) throws {
        let path = path(ino)
        createdInBuckets.withLock { _ = $0.insert(Self.bucket(ino)) }
        if rename(staged, path) == 0 { return }
        if errno == ENOENT {
            makeBucket(of: path)
            if rename(staged, path) == 0 { return }
        }
        throw UbiquityError.posix("install downloaded content for inode \(ino)")
    }

    /// Whether a bucket gained a file since the last `takeCreatedBuckets`.
    var hasCreatedBuckets: Bool { !createdInBuckets.withLock { $0.isEmpty } }

    /// The folders that gained files since the last call (for `makeDurable` to sync).
    func takeCreatedBuckets() -> [String] {
        createdInBuckets.withLock { buckets in
            defer { buckets.removeAll() }
            return buckets.map(bucketPath)
        }
    }

    /// Delete cache files no node owns (a file created but never closed
    /// before a crash; content of nodes deleted meanwhile). Partial downloads
    /// of placeholders stay: they resume.
    func removeOrphans(_ ns: Namespace) {
        let fm = FileManager.default
        guard let buckets = try? fm.contentsOfDirectory(atPath: directoryPath) else { return }
        for bucket in buckets {
            let dir = directoryPath + "/" + bucket
            guard let names = try? fm.contentsOfDirectory(atPath: dir) else { continue }
            for name in names {
                let isPartial = name.hasSuffix(".part")
                guard let ino = UInt64(isPartial ? String(name.prefix { $0 != "." }) : name) else { continue }
                let node = ns.node(ino)
                let owned = isPartial ? node?.isPlaceholder == true : (node?.kind == .file && node?.hasContent == true)
                if !owned { unlink(dir + "/" + name) }
            }
        }
    }
}
