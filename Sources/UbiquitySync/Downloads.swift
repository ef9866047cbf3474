import Foundation
import Synchronization
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// Downloads of placeholder content, streamed into the cache by a bounded
/// pool of workers, chunks in any order, the ones a reader waits for first.
///
/// A download writes `cache/…/INO.VERSION.part`, chunk by chunk, at each
/// chunk's own offset. A chunk counts as *verified* — and readers may read
/// its bytes — only once its blob was fetched, checked against its hash
/// (the store's `fetchBlob` verifies) and written. Readers of the
/// placeholder read that same file and wait only for the chunks their range
/// covers; a reader that waits for a chunk nobody fetches yet puts it at the
/// head of the queue (*urgent*), and the download's sequential read-ahead
/// then goes on from after that chunk (wrapping round to the chunks it
/// skipped). So `tail` of a 1 GiB placeholder waits for one chunk, not 256.
/// When every chunk is in, the file is renamed over the cache path (readers
/// keep their descriptor: same inode).
///
/// A stream (a placeholder open for reading, `beginStream`) on a store
/// that is cheap to fetch from again (`Store.cheapToFetchAgain`: a folder)
/// is served from memory instead: its chunks are fetched into buffers and
/// *held* there, verified, at most `heldPerDownload` ahead of the reader
/// (and `heldInAll` for every download); a chunk the readers were served
/// whole is let go (*passed*). Writing each chunk into the cache file while
/// the reader streams would cost a copy into as many new pages as the file
/// has bytes, on the CPUs the reader needs (DESIGN.md, "Chunked content
/// and streaming downloads", has the figures). Once the last stream closes, or it
/// stops reading for `idleStream` seconds, or someone waits for the whole
/// file (`waitUntilDownloaded`: a writer, `ubiquityfs download`), the held
/// chunks are written and the passed ones fetched again, in the background,
/// so the file still ends up downloaded, as an open promises. A file
/// evicted while a reader streams it is not: its download serves the
/// streams alone, is never installed, and stops when the last one closes.
///
/// Which chunks are verified is known only in memory. An interrupted
/// download resumes from the bytes in the partial file: every chunk the
/// file covers is read back and checked against its hash before it counts
/// (holes, `SEEK_DATA`, are fetched without reading), so a chunk cut short
/// by a crash, never written, or written only in part is fetched again —
/// never served.
///
/// Threads: one process-wide `DownloadPool` of at most `DownloadPool.limit`
/// workers serves every download of every container: a worker takes one
/// unit (a manifest, a chunk, the final install) at a time, in this order:
/// chunks readers wait for, then foreground downloads (opened by a reader,
/// `ubiquityfs download`) at most `Store.downloadConcurrency` chunks each,
/// then background ones (pins, refreshes), two downloads at a time. Pinning
/// a folder of 10,000 placeholders queues 10,000 jobs, not threads. The
/// pool's one mutex (`DownloadPool.monitor`) has two conditions: idle
/// workers wait on one and are woken one per unit of work there is for
/// them (a worker that finishes a unit takes the next itself), readers wait
/// on the other and are all woken by any progress. On a VM a wake-up costs
/// tens of µs of CPU, and a broadcast to every idle worker for each chunk
/// cost a placeholder stream 14–15 context switches per chunk (DESIGN.md,
/// "Chunked content and streaming downloads").
///
/// A reader gives up with `EIO` when the download fails (a missing or
/// damaged blob, an unreachable store: at once) or neither its download nor
/// the pool made progress for `stallTimeout` seconds; the error is kept for
/// `status`.
///
/// The files: `DownloadBoard.swift` (the jobs' state), `DownloadPool.swift`
/// (the workers and what they take next), and this one (the engine's part:
/// starting, streaming, waiting, fetching, installing).
extension SyncEngine {
    /// Seconds a reader waits for a download that makes no progress.
    public static let stallTimeout: Double = 30
    /// How long an install waits for units still writing its partial file
    /// (tests shorten it).
    static let installWaitMilliseconds = Atomic<Int>(60_000)
    /// Seconds a stream may go without reading before its download writes
    /// what it holds and goes on without it.
    static let idleStream: Double = 2

    /// Whether download `key` holds the chunks it fetches for its streaming
    /// readers instead of writing them: while a stream reads it, and — once
    /// the file was evicted — until the last stream closes, however long it
    /// pauses (the caller holds the pool's monitor).
    func holdsChunks(_ key: DownloadBoard.JobKey, _ job: DownloadBoard.Job, now: Date) -> Bool {
        store.cheapToFetchAgain && job.chunked && job.chunkSize <= UInt64(ChunkBuffer.size) && !job.keep
            && downloads.streams[key, default: 0] > 0 && (job.evicted || now.timeIntervalSince(job.lastServed) < Self.idleStream)
    }

    /// A reader opened placeholder `ino` (version `version`) to stream it.
    public func beginStream(ino: UInt64, version: String?) {
        let key = DownloadBoard.JobKey(ino: ino, hash: version)
        downloads.withJobs { jobs in
            downloads.streams[key, default: 0] += 1
            jobs[key]?.lastServed = downloadClock()
        }
    }

    /// A streaming reader closed. With none left, the download writes what
    /// it held and fetches again what it let go of, in the background; or
    /// stops, if the file was evicted meanwhile or this version is no longer
    /// the file's.
    public func endStream(ino: UInt64, version: String?) {
        let key = DownloadBoard.JobKey(ino: ino, hash: version)
        defer { DownloadPool.shared.changed() }
        let stopped = downloads.withJobs { jobs -> String? in
            let left = downloads.streams[key, default: 1] - 1
            downloads.streams[key] = left > 0 ? left : nil
            guard left <= 0, var job = jobs[key], !job.done, job.error == nil, !job.keep else { return nil }
            let current = replica.read { ns in ns.node(ino).map { $0.isPlaceholder && $0.hash == version } ?? false }
            if job.evicted || !current { return stop(key, in: &jobs) }
            job.background = true
            jobs[key] = job
            return nil
        }
        if let stopped { unlink(stopped) }
    }

    /// Stop the download of placeholder `ino` (an eviction: the device is
    /// not to keep it) unless someone waits for the whole file; while a
    /// reader streams it, once the last stream closes. Only a download that
    /// goes on in the background stops at once (one a reader has started is
    /// counted as its stream from the start). Its partial file goes.
    func stopDownloads(ino: UInt64) {
        defer { DownloadPool.shared.changed() }
        let partials = downloads.withJobs { jobs -> [String] in
            var partials: [String] = []
            for (key, job) in jobs where key.ino == ino && !job.done && job.error == nil && !job.keep {
                if downloads.streams[key] != nil {
                    jobs[key]?.evicted = true
                } else if job.background {
                    partials.append(stop(key, in: &jobs))
                }
            }
            return partials
        }
        for partial in partials { unlink(partial) }
    }

    /// Forget download `key`; the path of its partial file, to unlink (the
    /// caller holds the pool's monitor). A unit under way finds no job to
    /// report to, and writes into the unlinked file: units open it without
    /// `O_CREAT`.
    private func stop(_ key: DownloadBoard.JobKey, in jobs: inout [DownloadBoard.JobKey: DownloadBoard.Job]) -> String {
        DownloadPool.shared.change(&jobs[key]!) { $0.letGoOfEverything() }
        defer { jobs[key] = nil }
        return jobs[key]!.partial
    }

    /// Start downloading the content of placeholder `ino` (if not already
    /// under way) and return the path of the file that receives it, for
    /// readers to open. `background` downloads (pins, refreshes) come after
    /// those a reader or a `download` waits for; a foreground start makes a
    /// queued background download foreground. `keep`: the caller will wait
    /// for the whole file (`waitUntilDownloaded`), which an eviction does not stop.
    @discardableResult
    public func startDownload(ino: UInt64, background: Bool = false, keep: Bool = false) -> String {
        guard let node = replica.read({ ns in ns.node(ino) }) else { return replica.cache.path(ino) }
        // One partial file per version: a download of an older version that is
        // still finishing never writes into (or removes) the newer one's.
        let partial = replica.cache.partialPath(ino, version: node.hash)
        guard node.isPlaceholder else { return replica.cache.path(ino) }
        let key = DownloadBoard.JobKey(ino: ino, hash: node.hash)
        let pool = DownloadPool.shared
        pool.monitor.lock()
        let stale = downloadClock().addingTimeInterval(-600)
        downloads.forgetFinished(before: stale)
        if var job = downloads.jobs[key], job.error == nil, !job.done {
            if (!background && job.background) || (keep && !job.keep) {
                job.background = job.background && background
                job.keep = job.keep || keep
                downloads.jobs[key] = job
                pool.schedule(DownloadPool.Entry(engine: self, key: key, id: job.id))
                pool.wake()
            }
            pool.monitor.unlock()
            return partial
        }
        pool.monitor.unlock()
        // Readers open the partial file right away: make sure it exists.
        var fd = open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        if fd < 0 && errno == ENOENT {
            mkdir((partial as NSString).deletingLastPathComponent, 0o700)
            fd = open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        }
        var st = stat()
        let present = fd >= 0 && fstat(fd, &st) == 0 ? UInt64(max(0, st.st_size)) : 0
        if fd >= 0 { close(fd) }
        var job = DownloadBoard.Job(hash: node.hash, total: node.hashSize, started: downloadClock())
        job.ino = ino
        job.background = background
        job.keep = keep
        job.partial = partial
        job.present = present
        job.chunked = node.chunked && node.hash != nil
        if !job.chunked {
            // One blob (or none: empty content), a single "chunk".
            job.learnChunks(node.hash.map { [$0] } ?? [], chunkSize: node.hashSize, at: job.lastProgress)
        }
        pool.monitor.lock()
        defer { pool.monitor.unlock() }
        if var other = downloads.jobs[key], other.error == nil, !other.done {
            // Started by another open meanwhile.
            if keep && !other.keep {
                other.keep = true
                downloads.jobs[key] = other
                pool.schedule(DownloadPool.Entry(engine: self, key: key, id: other.id))
                pool.wake()
            }
            return partial
        }
        job.id = pool.nextID
        pool.nextID += 1
        downloads.jobs[key] = job
        pool.enqueue(DownloadPool.Entry(engine: self, key: key, id: job.id), background: background && !keep)
        return partial
    }

    /// Wait until the download of version `version` of `ino` (`size`
    /// bytes) is over: installed in place of the placeholder, or dropped
    /// because a newer version arrived meanwhile (the caller looks again).
    public func waitUntilDownloaded(ino: UInt64, version: String?, size: UInt64, beforeWaiting: () -> Void = {}) throws {
        _ = try waitFor(ino: ino, version: version, from: 0, upTo: size, goal: .installed, beforeWaiting: beforeWaiting)
    }

    /// Wait until a streaming reader can read bytes `from..<upTo` of
    /// version `version` of `ino`: the parts held in memory are returned,
    /// pinned (in order; nothing returned means all in the cache file). The
    /// chunks of the range nobody fetches yet are put first in the queue.
    public func waitToRead(ino: UInt64, version: String?, from: UInt64, upTo: UInt64, beforeWaiting: () -> Void) throws -> [PinnedBytes] {
        try waitFor(ino: ino, version: version, from: from, upTo: upTo, goal: .readable, beforeWaiting: beforeWaiting)
    }

    /// What a waiter waits for: the range readable (from memory or the
    /// cache file), or the whole download over (installed or dropped).
    private enum WaitGoal { case readable, installed }

    private func waitFor(ino: UInt64, version: String?, from: UInt64, upTo: UInt64, goal: WaitGoal,
                         beforeWaiting: () -> Void) throws -> [PinnedBytes] {
        let toRead = goal == .readable
        let pool = DownloadPool.shared
        let key = DownloadBoard.JobKey(ino: ino, hash: version)
        pool.monitor.lock()
        defer { pool.monitor.unlock() }
        var asked = false
        var waited = false
        while true {
            guard var job = downloads.jobs[key] else {
                // No download: either it finished (content local) or never started.
                let local = replica.read { ns in ns.node(ino).map { !$0.isPlaceholder } ?? false }
                if local { return [] }
                throw UbiquityError(EIO, "the content of inode \(ino) is not downloaded")
            }
            if let error = job.error { throw error }
            if goal == .installed ? job.done : job.isReady(from: from, upTo: upTo, inMemory: toRead) {
                guard toRead else { return [] }
                downloads.jobs[key]?.lastServed = downloadClock()
                return pinHeld(key, job, from: from, upTo: upTo)
            }
            if !asked {
                asked = true
                if !toRead { job.keep = true }
                job.readerWaits(from: from, upTo: upTo)
                downloads.jobs[key] = job
                pool.schedule(DownloadPool.Entry(engine: self, key: key, id: job.id))
                pool.wake()
            }
            if !waited {
                waited = true
                beforeWaiting()   // a FUSE worker: the mount goes on answering meanwhile
            }
            let last = max(job.lastProgress, pool.lastProgress)
            if downloadClock().timeIntervalSince(last) > Self.stallTimeout {
                throw UbiquityError(EIO, "download of inode \(ino) made no progress for \(Int(Self.stallTimeout)) s")
            }
            pool.monitor.waitForProgress(seconds: 1)
        }
    }

    /// Pin the held chunks of bytes `from..<upTo`, which are ready (the
    /// caller holds the pool's monitor).
    private func pinHeld(_ key: DownloadBoard.JobKey, _ job: DownloadBoard.Job, from: UInt64, upTo: UInt64) -> [PinnedBytes] {
        guard !job.done, !job.held.isEmpty, upTo > from else { return [] }
        var pinned: [PinnedBytes] = []
        let size = job.chunkSize
        for index in Int(from / size)...Int((upTo - 1) / size) {
            guard let chunk = job.held[index] else { continue }
            let start = UInt64(index) * size
            let lower = max(from, start), upper = min(upTo, start + UInt64(chunk.count))
            guard upper > lower else { continue }
            chunk.pins += 1
            let count = Int(upper - lower), id = job.id
            pinned.append(PinnedBytes(offset: lower, base: UnsafeRawPointer(chunk.buffer + Int(lower - start)), count: count) { [self] in
                servedFromMemory(key, id: id, index: index, chunk, count: count)
            })
        }
        return pinned
    }

    /// A reader was served `count` bytes of held chunk `index`. Once every
    /// byte of it was served, the chunk is let go of (`passed`).
    private func servedFromMemory(_ key: DownloadBoard.JobKey, id: UInt64, index: Int, _ chunk: DownloadBoard.HeldChunk, count: Int) {
        let pool = DownloadPool.shared
        pool.monitor.lock()
        defer { pool.monitor.unlock() }
        chunk.pins -= 1
        chunk.served += count
        if chunk.letGo {
            if chunk.pins == 0 { ChunkBuffer.give(chunk.buffer) }
            return
        }
        guard chunk.pins == 0, chunk.served >= chunk.count, var job = downloads.jobs[key], job.id == id,
              job.held[index] === chunk, holdsChunks(key, job, now: downloadClock()) else { return }
        pool.change(&job) { $0.letGo(index) }
        downloads.jobs[key] = job
        pool.wake()   // the read-ahead may go on
    }

    /// Download all of `ino` and wait until the download is over (before
    /// writing to a placeholder). The content may be a placeholder again by
    /// then (a newer version arrived): the caller looks again.
    public func download(ino: UInt64, beforeWaiting: () -> Void = {}) throws {
        guard let node = replica.read({ ns in ns.node(ino) }), node.isPlaceholder else { return }
        startDownload(ino: ino, keep: true)
        try waitUntilDownloaded(ino: ino, version: node.hash, size: node.hashSize, beforeWaiting: beforeWaiting)
    }

    /// Downloads under way: (items, bytes still to fetch).
    public func downloadSummary() -> (items: Int, bytes: UInt64) {
        downloads.withJobs { jobs in
            let active = jobs.values.filter { !$0.done && $0.error == nil }
            return (active.count, active.reduce(0) { $0 + ($1.total - min($1.total, $1.verified)) })
        }
    }

    /// Update job `id` of `key`, if it is still the one recorded (the caller holds the monitor).
    private func jobsUpdate(_ key: DownloadBoard.JobKey, id: UInt64, _ body: (inout DownloadBoard.Job) -> Void) -> Bool {
        guard let job = downloads.jobs[key], job.id == id else { return false }
        body(&downloads.jobs[key]!)
        return true
    }

    func finish(_ key: DownloadBoard.JobKey, id: UInt64, error: UbiquityError?, cause: (any Error)? = nil) {
        if let cause { record(error: cause) }   // before waking readers: status shows what they got
        let pool = DownloadPool.shared
        pool.monitor.lock()
        if let error {
            _ = jobsUpdate(key, id: id) { job in pool.change(&job) { $0.fail(error) } }
        } else {
            // Kept (done) for a while: a reader of this version may still be
            // waiting for it even if a newer version replaced it meanwhile.
            if jobsUpdate(key, id: id, { $0.finish(at: downloadClock()) }) {
                downloads.finished.append((key, id))
            }
        }
        pool.monitor.broadcastProgress()
        pool.monitor.unlock()
        if error == nil { enforceCacheLimit() }
    }

    /// Run one unit of download `job` (on a pool worker).
    func perform(_ unit: DownloadPool.Unit, of job: DownloadBoard.Job, key: DownloadBoard.JobKey) {
        let pool = DownloadPool.shared
        do {
            switch unit {
            case .manifest:
                let manifest: ChunkManifest
                do {
                    manifest = try ChunkManifest.decode(try store.fetchBlob(job.hash ?? ""))
                    guard manifest.size == job.total else { throw UbiquityError(EIO, "chunk manifest \(job.hash ?? "") has the wrong size") }
                } catch {
                    pool.monitor.lock()
                    _ = jobsUpdate(key, id: job.id) { $0.manifestFailed() }
                    pool.monitor.unlock()
                    throw error
                }
                pool.monitor.lock()
                _ = jobsUpdate(key, id: job.id) { $0.learnChunks(manifest.chunks, chunkSize: manifest.chunkSize, at: downloadClock()) }
                pool.monitor.broadcastProgress()   // this worker takes the chunks next, and hands out the rest
                pool.monitor.unlock()
            case .chunk(let index):
                let offset = UInt64(index) * job.chunkSize
                let count = Int(min(job.chunkSize, job.total - offset))
                let result = Result { try fetchChunk(job, key: key, index: index, offset: offset, count: count) }
                pool.monitor.lock()
                pool.doneWriting(job.partial)
                let outcome: DownloadBoard.Job.Outcome = switch result {
                case .success(let held?): .held(held)
                case .success(nil): .written
                case .failure: .failed
                }
                let recorded = jobsUpdate(key, id: job.id) { j in
                    pool.change(&j) { $0.ended(index, count: count, outcome, at: downloadClock()) }
                }
                if !recorded, case .success(let held?) = result { held.release() }
                if case .success = result { pool.lastProgress = downloadClock() }
                pool.monitor.broadcastProgress()
                pool.monitor.unlock()
                _ = try result.get()
            case .store(let index, let chunk):
                // A held chunk no stream needs any more: into the cache file.
                let result = Result {
                    let fd = try syscallRetrying("open \(job.partial)") { open(job.partial, O_RDWR | O_CLOEXEC) }
                    defer { close(fd) }
                    try ContentCopy.write(UnsafeRawBufferPointer(start: chunk.buffer, count: chunk.count), to: fd,
                                          at: UInt64(index) * job.chunkSize)
                }
                pool.monitor.lock()
                pool.doneWriting(job.partial)
                _ = jobsUpdate(key, id: job.id) { j in
                    let outcome: DownloadBoard.Job.Outcome = if case .success = result { .written } else { .failed }
                    j.ended(index, count: chunk.count, outcome, at: downloadClock())
                }
                chunk.release()
                if case .success = result { pool.lastProgress = downloadClock() }
                pool.monitor.broadcastProgress()
                pool.monitor.unlock()
                try result.get()
            case .install:
                try install(job, key: key)
            }
        } catch {
            let failure = UbiquityError(EIO, "download of inode \(job.ino) failed: \(UbiquityError.wrap(error))")
            finish(key, id: job.id, error: failure, cause: failure.withErrno(UbiquityError.wrap(error).errno))
        }
    }

    /// Make chunk `index` of `job` verified: already in the partial file and
    /// intact (a resumed download), or fetched (and so verified by the
    /// store) and written there, or — while the download holds chunks for
    /// a stream — fetched into a buffer and returned, held.
    func fetchChunk(_ job: DownloadBoard.Job, key: DownloadBoard.JobKey, index: Int, offset: UInt64, count: Int) throws -> DownloadBoard.HeldChunk? {
        let hash = job.chunks![index]
        let partial = job.partial
        // Not created again if gone: an evicted download's (its readers are gone too).
        let fd = try syscallRetrying("open \(partial)") { open(partial, O_RDWR | O_CLOEXEC) }
        defer { close(fd) }
        if offset + UInt64(count) <= job.present, count > 0 {
            // Resumed: a hole (never written) is fetched without reading it.
            let data = lseek(fd, off_t(offset), 3)   // SEEK_DATA
            if data >= 0 && UInt64(data) < offset + UInt64(count),
               let existing = Self.read(fd, offset: offset, count: count), ContentCopy.hash(of: existing) == hash {
                return nil
            }
        }
        let pool = DownloadPool.shared
        func holding() -> Bool {
            pool.monitor.lock()
            defer { pool.monitor.unlock() }
            return downloads.jobs[key].map { holdsChunks(key, $0, now: downloadClock()) } ?? false
        }
        if job.chunked && holding() {
            let buffer = try ChunkBuffer.take()
            do {
                try store.readBlob(hash, size: count, into: buffer)
            } catch {
                ChunkBuffer.give(buffer)
                throw error
            }
            if holding() { return DownloadBoard.HeldChunk(buffer: buffer, count: count) }
            // The stream closed meanwhile.
            defer { ChunkBuffer.give(buffer) }
            try ContentCopy.write(UnsafeRawBufferPointer(start: buffer, count: count), to: fd, at: offset)
            return nil
        }
        if job.chunked {
            try store.copyBlob(hash, size: count, into: fd, at: offset)
            return nil
        }
        // Unchunked content may be packed with other small files (Packs.swift).
        let data = try fetchContent(hash, size: UInt64(count))
        guard data.count == count else { throw UbiquityError(EIO, "blob \(hash) has the wrong size") }
        try ContentCopy.write(data, to: fd, at: offset)
        return nil
    }

    /// Every chunk is verified: put the file in place of the placeholder.
    func install(_ job: DownloadBoard.Job, key: DownloadBoard.JobKey) throws {
        let ino = job.ino, hash = job.hash, partial = job.partial
        // Units of an earlier, failed download of this version may still be
        // writing (the same verified bytes): never into the installed file.
        // This job's own units are all done, and no new job of this version
        // starts while this one is under way: once they are gone, nobody writes it.
        try DownloadPool.shared.waitUntilNobodyWrites(partial, seconds: Double(Self.installWaitMilliseconds.load(ordering: .relaxed)) / 1000)
        let fd = try syscallRetrying("open \(partial)") { open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
        defer { close(fd) }
        try syscallRetrying("truncate \(partial)") { ftruncate(fd, off_t(job.total)) }
        // On disk before it takes the cache path: a power loss never leaves
        // the installed file without the bytes that were verified.
        try syscallRetrying("fdatasync \(partial)") { fdatasync(fd) }
        let installed = try replica.record { ns -> Bool in
            // A newer version may have arrived meanwhile: then this content is not it.
            guard let n = ns.node(ino), n.hash == hash, !n.hasContent else { return false }
            // The rename happens under the lock (one metadata syscall), so an
            // eviction or another download never interleaves with it.
            try replica.cache.install(from: partial, ino)
            // Every blob was checked against its hash: the copy is verified.
            ns.update(ino, local: false) { $0.hasContent = true; $0.size = $0.hashSize; $0.verifiedHash = hash }
            // Just downloaded counts as just used: the cache limit evicts others first.
            ns.updateRuntime(ino) { $0.lastAccess = AccessClock.now(); $0.contentEpoch &+= 1 }
            return true
        }
        if !installed { unlink(partial) }
        // The content is in place either way; if the index has no room to
        // record it, that stays queued (a restart downloads it again).
        do { try replica.persist(.grows) } catch { record(error: error) }
        // Readers waiting for this content go first: the kernel may hold a
        // page lock for one of them, and the notification below can wait
        // on that lock.
        finish(key, id: job.id, error: nil)
        if installed {
            // st_blocks changed: the kernel must not keep the placeholder's attributes.
            var changes = ReplicaChanges()
            changes.nodes[ino] = false
            changes.count = 1
            observer.withLock { $0 }?.replicaChanged(changes)
        }
    }

    static func read(_ fd: Int32, offset: UInt64, count: Int) -> Data? {
        var data = Data(count: count)
        let n = data.withUnsafeMutableBytes { pread(fd, $0.baseAddress, count, off_t(offset)) }
        return n == count ? data : nil
    }
}
