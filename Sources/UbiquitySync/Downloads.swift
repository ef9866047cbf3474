import Foundation
import UbiquityReplica
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Downloads of placeholder content, streamed into the cache.
///
/// A download writes `cache/…/INO.VERSION.part` in order, chunk by chunk, each chunk
/// verified against the manifest before its bytes count as *verified*. A
/// reader that opened the placeholder reads that same file and waits only
/// until the range it asked for is verified — the first 4 KiB of a large
/// file come back after its first chunk, long before the last. When every
/// chunk is in, the file is renamed over the cache path (readers keep their
/// descriptor: same inode). An interrupted download resumes: chunks already
/// in the partial file are re-verified instead of fetched again.
///
/// A reader gives up with `EIO` when the download fails (a missing or
/// damaged blob, an unreachable store: at once) or makes no progress for
/// `stallTimeout` seconds; the error is kept for `status`.
final class DownloadBoard: @unchecked Sendable {
    struct Job {
        var hash: String?
        var total: UInt64
        var verified: UInt64 = 0
        var done = false
        var error: UbiquityError?
        var lastProgress: Date = Date()
    }

    /// Guards `jobs`; readers wait on it for progress. (A condition, not a
    /// `Mutex`, because waiting is the point.)
    let condition = NSCondition()
    /// One job per version of a file: a reader waits for the version it opened.
    var jobs: [JobKey: Job] = [:]
    /// At most this many background refreshes at once (readers never wait for a slot).
    let backgroundSlots = DispatchSemaphore(value: 2)

    struct JobKey: Hashable {
        var ino: UInt64
        var hash: String?
    }

    func withJobs<T>(_ body: (inout [JobKey: Job]) -> T) -> T {
        condition.lock()
        defer { condition.unlock() }
        return body(&jobs)
    }
}

extension SyncEngine {
    /// Seconds a reader waits for a download that makes no progress.
    public static let stallTimeout: Double = 30

    /// Start downloading the content of placeholder `ino` (if not already
    /// under way) and return the path of the file that receives it, for
    /// readers to open. `background` downloads wait for a free slot.
    @discardableResult
    public func startDownload(ino: UInt64, background: Bool = false) -> String {
        guard let node = replica.withNamespace({ ns in ns.node(ino) }) else { return replica.cachePath(ino) }
        // One partial file per version: a download of an older version that is
        // still finishing never writes into (or removes) the newer one's.
        let partial = replica.cachePath(ino) + "." + String((node.hash ?? "empty").prefix(16)) + ".part"
        guard node.isPlaceholder else { return replica.cachePath(ino) }
        let key = DownloadBoard.JobKey(ino: ino, hash: node.hash)
        let started = downloads.withJobs { jobs -> Bool in
            let stale = Date().addingTimeInterval(-600)
            jobs = jobs.filter { !$0.value.done || $0.value.lastProgress > stale }
            if let job = jobs[key], job.error == nil, !job.done { return false }
            jobs[key] = DownloadBoard.Job(hash: node.hash, total: node.hashSize)
            return true
        }
        guard started else { return partial }
        // Readers open the partial file right away: make sure it exists.
        let fd = open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        if fd < 0 && errno == ENOENT {
            mkdir((partial as NSString).deletingLastPathComponent, 0o700)
            close(open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0o600))
        } else if fd >= 0 {
            close(fd)
        }
        let thread = Thread { [self] in
            if background { downloads.backgroundSlots.wait() }
            defer { if background { downloads.backgroundSlots.signal() } }
            runDownload(ino: ino, hash: node.hash, size: node.hashSize, chunked: node.chunked, partial: partial)
        }
        thread.name = "ubiquityfs-download"
        thread.start()
        return partial
    }

    /// Wait until bytes `0..<upTo` of version `version` of `ino` are verified
    /// (or that download finished).
    public func waitForContent(ino: UInt64, version: String?, upTo: UInt64) throws {
        let board = downloads
        board.condition.lock()
        defer { board.condition.unlock() }
        while true {
            guard let job = board.jobs[DownloadBoard.JobKey(ino: ino, hash: version)] else {
                // No download: either it finished (content local) or never started.
                let local = replica.withNamespace { ns in ns.node(ino).map { !$0.isPlaceholder } ?? false }
                if local { return }
                throw UbiquityError(EIO, "the content of inode \(ino) is not downloaded")
            }
            if let error = job.error { throw error }
            if job.done || job.verified >= upTo { return }
            if Date().timeIntervalSince(job.lastProgress) > Self.stallTimeout {
                throw UbiquityError(EIO, "download of inode \(ino) made no progress for \(Int(Self.stallTimeout)) s")
            }
            _ = board.condition.wait(until: Date().addingTimeInterval(1))
        }
    }

    /// Download all of `ino` and wait until the download is over (before
    /// writing to a placeholder). The content may be a placeholder again by
    /// then (a newer version arrived): the caller looks again.
    public func download(ino: UInt64) throws {
        guard let node = replica.withNamespace({ ns in ns.node(ino) }), node.isPlaceholder else { return }
        startDownload(ino: ino)
        try waitForContent(ino: ino, version: node.hash, upTo: node.hashSize)
        // Every byte is verified; the job is done once the file is installed (or dropped, for a newer version).
        let key = DownloadBoard.JobKey(ino: ino, hash: node.hash)
        for _ in 0..<1000 {
            if replica.withNamespace({ ns in ns.node(ino).map { !$0.isPlaceholder } ?? true }) { return }
            let job = downloads.withJobs { $0[key] }
            if let error = job?.error { throw error }
            if job?.done ?? true { return }
            Thread.sleep(forTimeInterval: 0.01)
        }
        throw UbiquityError(EIO, "the download of inode \(ino) does not finish")
    }

    /// Downloads under way: (items, bytes still to fetch).
    public func downloadSummary() -> (items: Int, bytes: UInt64) {
        downloads.withJobs { jobs in
            let active = jobs.values.filter { !$0.done && $0.error == nil }
            return (active.count, active.reduce(0) { $0 + ($1.total - min($1.total, $1.verified)) })
        }
    }

    func progress(_ ino: UInt64, hash: String?, verified: UInt64) {
        downloads.condition.lock()
        _ = jobsUpdate(ino, hash: hash) { $0.verified = verified; $0.lastProgress = Date() }
        downloads.condition.broadcast()
        downloads.condition.unlock()
    }

    /// Update the download of version `hash` of `ino`, if it is still recorded.
    private func jobsUpdate(_ ino: UInt64, hash: String?, _ body: (inout DownloadBoard.Job) -> Void) -> Bool {
        let key = DownloadBoard.JobKey(ino: ino, hash: hash)
        guard downloads.jobs[key] != nil else { return false }
        body(&downloads.jobs[key]!)
        return true
    }

    func finish(_ ino: UInt64, hash: String?, error: UbiquityError?, cause: (any Error)? = nil) {
        if let cause { record(error: cause) }   // before waking readers: status shows what they got
        downloads.condition.lock()
        if let error {
            _ = jobsUpdate(ino, hash: hash) { $0.error = error }
        } else {
            // Kept (done) for a while: a reader of this version may still be
            // waiting for it even if a newer version replaced it meanwhile.
            _ = jobsUpdate(ino, hash: hash) { $0.done = true; $0.lastProgress = Date() }
        }
        downloads.condition.broadcast()
        downloads.condition.unlock()
        if error == nil { enforceCacheLimit() }
    }

    func runDownload(ino: UInt64, hash: String?, size: UInt64, chunked: Bool, partial: String) {
        do {
            let fd = try syscallRetrying("open \(partial)") { open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
            defer { close(fd) }
            func write(_ data: Data, at offset: UInt64) throws {
                try data.withUnsafeBytes { raw in
                    var done = 0
                    while done < raw.count {
                        done += try syscallRetrying("write \(partial)") {
                            pwrite(fd, raw.baseAddress! + done, raw.count - done, off_t(offset) + off_t(done))
                        }
                    }
                }
            }
            if let hash {
                if chunked {
                    let manifest = try ChunkManifest.decode(try store.fetchBlob(hash))
                    guard manifest.size == size else { throw UbiquityError(EIO, "chunk manifest \(hash) has the wrong size") }
                    var st = stat()
                    fstat(fd, &st)
                    let present = UInt64(max(0, st.st_size))
                    // Chunks are fetched (and verified) up to `ChunkFetcher.depth` (the store's download concurrency) ahead on
                    // their own threads, and written here in order, so `verified` only grows.
                    let fetcher = ChunkFetcher(store: store, hashes: manifest.chunks)
                    defer { fetcher.cancel() }
                    for (index, chunkHash) in manifest.chunks.enumerated() {
                        let offset = UInt64(index) * manifest.chunkSize
                        let count = min(manifest.chunkSize, size - offset)
                        if present >= offset + count, let existing = Self.read(fd, offset: offset, count: Int(count)),
                           ContentCopy.hash(of: existing) == chunkHash {
                            fetcher.skip(index)
                            progress(ino, hash: hash, verified: offset + count)   // resumed: already here and intact
                            continue
                        }
                        let data = try fetcher.take(index)
                        guard UInt64(data.count) == count else { throw UbiquityError(EIO, "chunk \(chunkHash) has the wrong size") }
                        try write(data, at: offset)
                        progress(ino, hash: hash, verified: offset + count)
                    }
                } else {
                    let data = try fetchContent(hash, size: size)   // its pack, if it is packed (Packs.swift)
                    guard UInt64(data.count) == size else { throw UbiquityError(EIO, "blob \(hash) has the wrong size") }
                    try write(data, at: 0)
                }
            }
            try syscallRetrying("truncate \(partial)") { ftruncate(fd, off_t(size)) }
            let installed = try replica.withNamespace { ns -> Bool in
                // A newer version may have arrived meanwhile: then this content is not it.
                guard let n = ns.node(ino), n.hash == hash, !n.hasContent else { return false }
                // The rename happens under the lock (one metadata syscall), so an
                // eviction or another download never interleaves with it.
                try replica.installCacheFile(from: partial, ino)
                // Every blob was checked against its hash: the copy is verified.
                ns.update(ino, local: false) { $0.hasContent = true; $0.size = $0.hashSize; $0.verifiedHash = hash }
                // Just downloaded counts as just used: the cache limit evicts others first.
                ns.updateRuntime(ino) { $0.lastAccess = Self.monotonicNow(); $0.contentEpoch &+= 1 }
                return true
            }
            if !installed { unlink(partial) }
            // The content is in place either way; if the index has no room to
            // record it, that stays queued (a restart downloads it again).
            do { try replica.persist(.grows) } catch { record(error: error) }
            // Readers waiting for this content go first: the kernel may hold a
            // page lock for one of them, and the notification below can wait
            // on that lock.
            finish(ino, hash: hash, error: nil)
            if installed {
                // st_blocks changed: the kernel must not keep the placeholder's attributes.
                var changes = ReplicaChanges()
                changes.nodes[ino] = false
                changes.count = 1
                observer.withLock { $0 }?.replicaChanged(changes)
            }
        } catch {
            let failure = UbiquityError(EIO, "download of inode \(ino) failed: \(UbiquityError.wrap(error))")
            finish(ino, hash: hash, error: failure, cause: failure.withErrno(UbiquityError.wrap(error).errno))
        }
    }

    static func read(_ fd: Int32, offset: UInt64, count: Int) -> Data? {
        var data = Data(count: count)
        let n = data.withUnsafeMutableBytes { pread(fd, $0.baseAddress, count, off_t(offset)) }
        return n == count ? data : nil
    }
}

/// Fetches the chunks of one download a few ahead of the writer, on
/// `Store.downloadConcurrency` threads, as many chunks ahead (fetching a
/// chunk is a read or a request plus a SHA-256 check: work the writer does
/// not wait for). Chunks the writer found already downloaded are skipped.
final class ChunkFetcher: @unchecked Sendable {
    let depth: Int

    let store: any Store
    let hashes: [String]
    let condition = NSCondition()
    /// Guarded by `condition`.
    var results: [Int: Result<Data, any Error>] = [:]
    var skipped: Set<Int> = []
    var next = 0
    var taken = 0
    var cancelled = false

    init(store: any Store, hashes: [String]) {
        self.store = store
        self.hashes = hashes
        depth = max(1, store.downloadConcurrency)
        for _ in 0..<min(depth, hashes.count) {
            let thread = Thread { [self] in work() }
            thread.name = "ubiquityfs-fetch"
            thread.start()
        }
    }

    func work() {
        while true {
            condition.lock()
            while !cancelled && next < hashes.count && (next >= taken + depth || skipped.contains(next)) {
                if skipped.contains(next) { next += 1; continue }
                condition.wait()
            }
            guard !cancelled, next < hashes.count else { condition.unlock(); return }
            let index = next
            next += 1
            condition.unlock()
            let result = Result { try store.fetchBlob(hashes[index]) }
            condition.lock()
            results[index] = result
            condition.broadcast()
            condition.unlock()
        }
    }

    /// Chunk `index`, fetched and verified (waits for it).
    func take(_ index: Int) throws -> Data {
        condition.lock()
        defer { condition.unlock() }
        while results[index] == nil { condition.wait() }
        let result = results.removeValue(forKey: index)!
        taken = index + 1
        condition.broadcast()
        return try result.get()
    }

    /// The writer has chunk `index` already: do not fetch it.
    func skip(_ index: Int) {
        condition.lock()
        skipped.insert(index)
        results[index] = nil
        taken = index + 1
        condition.broadcast()
        condition.unlock()
    }

    func cancel() {
        condition.lock()
        cancelled = true
        results = [:]
        condition.broadcast()
        condition.unlock()
    }
}
