import Foundation
import Synchronization
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// The download workers shared by every download of the process.
final class DownloadPool: @unchecked Sendable {
    static let shared = DownloadPool()
    /// At most this many workers (enough for an S3 store's 8 requests in flight).
    static let limit = 8
    /// Background downloads worked on at once.
    static let backgroundAtOnce = 2
    /// Chunks one download holds for its streaming readers, and all of them
    /// together (4 MiB each): the read-ahead of a stream waits beyond these.
    static let heldPerDownload = 6
    static let heldInAll = 16

    enum Unit { case manifest, chunk(Int), store(Int, DownloadBoard.HeldChunk), install }

    struct Entry {
        let engine: SyncEngine
        let key: DownloadBoard.JobKey
        let id: UInt64
    }

    /// A unit taken (marked in its job) for a worker to perform.
    typealias Work = (entry: Entry, unit: Unit, job: DownloadBoard.Job)

    let monitor = Monitor()
    /// Guarded by `monitor`: the downloads `next` looks at, oldest first:
    /// foreground ones, background ones begun, and any a reader asked for.
    var active: [Entry] = []
    /// Background downloads not begun yet, oldest first (from `queuedHead`
    /// on): `next` moves them to `active` while fewer than
    /// `backgroundAtOnce` background ones are there. So starting (and
    /// scheduling) a download looks at the few being worked on, not at
    /// every one queued: pinning N placeholders is O(N), not O(N²).
    var queued: [Entry] = []
    var queuedHead = 0
    /// Units taken for idle workers that were woken for them; never more than `idle`.
    var handed: [Work] = []
    var threads = 0
    var idle = 0
    var nextID: UInt64 = 1
    /// When any worker last finished a unit (a job queued behind others is not stalled).
    var lastProgress = Date()
    /// Units writing to each partial file (an install waits for stragglers of a failed job).
    var writers: [String: Int] = [:]
    /// Chunks held by every download.
    var heldChunks = 0

    /// Add a download: a background one behind the others, any other
    /// among those `next` looks at (the caller holds `monitor`).
    func enqueue(_ entry: Entry, background: Bool) {
        if background {
            queued.append(entry)
        } else {
            schedule(entry)
        }
        wake()
    }

    /// Put download `entry` among those `next` looks at, if it is not
    /// there yet: a reader waits for it, or it became foreground (the
    /// caller holds `monitor`).
    func schedule(_ entry: Entry) {
        let board = entry.engine.downloads
        guard let job = board.jobs[entry.key], job.id == entry.id, !job.scheduled else { return }
        board.jobs[entry.key]?.scheduled = true
        active.append(entry)
    }

    /// Move queued background downloads to `active` while fewer than
    /// `backgroundAtOnce` are there (the caller holds `monitor`).
    private func beginQueued() {
        var background = 0
        for entry in active where entry.engine.downloads.jobs[entry.key]?.background == true { background += 1 }
        while background < Self.backgroundAtOnce && queuedHead < queued.count {
            let entry = queued[queuedHead]
            queuedHead += 1
            let board = entry.engine.downloads
            board.examined += 1
            guard let job = board.jobs[entry.key], job.id == entry.id, !job.scheduled, !job.done, job.error == nil else { continue }
            board.jobs[entry.key]?.scheduled = true
            active.append(entry)
            if job.background { background += 1 }
        }
        if queuedHead >= 64 && queuedHead * 2 >= queued.count {
            queued.removeFirst(queuedHead)
            queuedHead = 0
        }
    }

    /// There may be new work: hand each unit there is to an idle worker,
    /// waking that one alone, or to a new worker while there are fewer than
    /// `limit` (the caller holds `monitor`). Busy workers take more work
    /// themselves when they finish a unit.
    func wake() {
        while idle > handed.count || threads < Self.limit {
            guard let taken = next() else { return }
            if idle > handed.count {
                handed.append(taken)
                monitor.signalWorker()
            } else {
                threads += 1
                Thread.run(named: "ubq-download") { [self] in work(from: taken) }
            }
        }
    }

    /// A worker's life: perform `first`, then whatever is handed to it or
    /// next in line, handing what more there is to others.
    private func work(from first: Work) {
        monitor.lock()
        var mine: Work? = first
        while true {
            if let (entry, unit, job) = mine {
                mine = nil
                wake()
                monitor.unlock()
                entry.engine.perform(unit, of: job, key: entry.key)
                monitor.lock()
                // Handed units have a woken worker on the way.
                mine = next() ?? (handed.isEmpty ? nil : handed.removeFirst())
                continue
            }
            idle += 1
            // The last worker to go idle with nothing queued lets go of the read buffers.
            if idle == threads && active.isEmpty && handed.isEmpty { ChunkBuffer.trim() }
            // A stream that stops reading lets its download go on (`idleStream`): look again.
            if active.contains(where: { !$0.engine.downloads.streams.isEmpty }) {
                monitor.waitForWork(seconds: 1)
            } else {
                monitor.waitForWork(seconds: nil)
            }
            idle -= 1
            mine = handed.isEmpty ? next() : handed.removeFirst()
        }
    }

    /// The next unit of work, marked taken (the caller holds `monitor`).
    func next() -> Work? {
        active.removeAll { entry in
            entry.engine.downloads.examined += 1
            guard let job = entry.engine.downloads.jobs[entry.key] else { return true }
            return job.id != entry.id || job.done || job.error != nil
        }
        beginQueued()
        // 1. What readers wait for; finished downloads to install; held
        // chunks no stream needs any more, to write.
        for entry in active {
            let board = entry.engine.downloads
            board.examined += 1
            guard var job = board.jobs[entry.key] else { continue }
            defer { board.jobs[entry.key] = job }
            if !job.held.isEmpty || job.passed > 0, !entry.engine.holdsChunks(entry.key, job, now: entry.engine.downloadClock()),
               let (index, chunk) = change(&job, { $0.takeHeldToStore() }) {
                return handOut(.store(index, chunk), of: job, entry)
            }
            if job.takeInstall() { return (entry, .install, job) }
            if job.takeManifest(onlyForReaders: true) { return (entry, .manifest, job) }
            if let index = job.takeUrgent() { return handOut(.chunk(index), of: job, entry) }
        }
        // 2. Read-ahead of foreground downloads (the one with the fewest
        // fetches under way first: several share the pool), then of the
        // first background ones.
        var backgroundSeen = 0
        for entry in active { entry.engine.downloads.examined += 1 }
        let foreground = active.filter { $0.engine.downloads.jobs[$0.key]?.background == false }
            .sorted { ($0.engine.downloads.jobs[$0.key]?.inFlight ?? 0) < ($1.engine.downloads.jobs[$1.key]?.inFlight ?? 0) }
        for background in [false, true] {
            for entry in background ? active : foreground {
                let board = entry.engine.downloads
                board.examined += 1
                guard var job = board.jobs[entry.key], job.background == background else { continue }
                defer { board.jobs[entry.key] = job }
                if background {
                    backgroundSeen += 1
                    if backgroundSeen > Self.backgroundAtOnce { break }
                }
                if job.takeManifest(onlyForReaders: false) { return (entry, .manifest, job) }
                guard job.chunks != nil, job.inFlight < max(1, entry.engine.store.downloadConcurrency) else { continue }
                // A stream's read-ahead: only after the reader, and only so far.
                let holding = entry.engine.holdsChunks(entry.key, job, now: entry.engine.downloadClock())
                if holding && (job.held.count + job.inFlight >= Self.heldPerDownload || heldChunks >= Self.heldInAll) { continue }
                if let index = job.takeReadAhead(holding: holding) { return handOut(.chunk(index), of: job, entry) }
            }
        }
        return nil
    }

    /// Change `job` (the caller holds `monitor`), keeping `heldChunks`,
    /// the chunks all downloads hold, right.
    func change<T>(_ job: inout DownloadBoard.Job, _ body: (inout DownloadBoard.Job) -> T) -> T {
        let before = job.held.count
        let result = body(&job)
        heldChunks += job.held.count - before
        return result
    }

    /// Downloads or streams changed in a way that may make work for
    /// workers and news for readers (the caller does not hold `monitor`).
    func changed() {
        monitor.lock()
        wake()
        monitor.broadcastProgress()
        monitor.unlock()
    }

    /// The pool's mutex, with a condition for idle workers (signalled, one
    /// per unit handed out), one for waiting readers (broadcast), and one
    /// for installs waiting until no unit writes their partial file (broadcast).
    final class Monitor: @unchecked Sendable {
        private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        private let work = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
        private let progress = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
        private let quiet = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

        init() {
            pthread_mutex_init(mutex, nil)
            var attributes = pthread_condattr_t()
            pthread_condattr_init(&attributes)
            pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
            pthread_cond_init(work, &attributes)
            pthread_cond_init(progress, &attributes)
            pthread_cond_init(quiet, &attributes)
            pthread_condattr_destroy(&attributes)
        }

        deinit {
            pthread_cond_destroy(quiet)
            quiet.deallocate()
            pthread_cond_destroy(progress)
            pthread_cond_destroy(work)
            pthread_mutex_destroy(mutex)
            progress.deallocate()
            work.deallocate()
            mutex.deallocate()
        }

        func lock() { pthread_mutex_lock(mutex) }
        func unlock() { pthread_mutex_unlock(mutex) }
        func signalWorker() { pthread_cond_signal(work) }
        func broadcastProgress() { pthread_cond_broadcast(progress) }
        func broadcastQuiet() { pthread_cond_broadcast(quiet) }

        /// An install waits (holding the mutex) for a partial file's writers to finish, for at most `seconds`.
        func waitForQuiet(seconds: Double) {
            wait(on: quiet, seconds: seconds)
        }

        /// An idle worker waits (holding the mutex) until signalled, or for at most `seconds`.
        func waitForWork(seconds: Double?) {
            guard let seconds else {
                pthread_cond_wait(work, mutex)
                return
            }
            wait(on: work, seconds: seconds)
        }

        /// A reader waits (holding the mutex) for progress, for at most `seconds`.
        func waitForProgress(seconds: Double) {
            wait(on: progress, seconds: seconds)
        }

        private func wait(on condition: UnsafeMutablePointer<pthread_cond_t>, seconds: Double) {
            var deadline = timespec()
            clock_gettime(CLOCK_MONOTONIC, &deadline)
            let nanoseconds = Int(deadline.tv_nsec) + Int(seconds * 1e9)
            deadline.tv_sec += nanoseconds / 1_000_000_000
            deadline.tv_nsec = nanoseconds % 1_000_000_000
            _ = pthread_cond_timedwait(condition, mutex, &deadline)
        }
    }

    /// A unit is done with `partial` (the caller holds `monitor`). The
    /// last one wakes an install waiting for it (`waitUntilNobodyWrites`).
    func doneWriting(_ partial: String) {
        writers[partial, default: 1] -= 1
        if writers[partial] == 0 {
            writers[partial] = nil
            monitor.broadcastQuiet()
        }
    }

    /// Wait until no unit writes `partial` (units of an earlier, failed
    /// download of the same version may still be writing it), woken when
    /// the last one finishes; an error if some still do after `seconds`:
    /// the file is not installed under them (the caller does not hold `monitor`).
    func waitUntilNobodyWrites(_ partial: String, seconds: Double) throws {
        monitor.lock()
        defer { monitor.unlock() }
        let deadline = MonotonicClock.now() + UInt64(seconds * 1e9)
        while let count = writers[partial] {
            let now = MonotonicClock.now()
            guard now < deadline else {
                throw UbiquityError(EBUSY, "\(count) unit(s) of an earlier download still write \((partial as NSString).lastPathComponent) after \(Int(seconds)) s: not installed (tried again at the next start)")
            }
            monitor.waitForQuiet(seconds: Double(deadline - now) / 1e9)
        }
    }

    /// A unit that writes into `job`'s partial file, handed out (counted
    /// in `writers` until `doneWriting`).
    private func handOut(_ unit: Unit, of job: DownloadBoard.Job, _ entry: Entry) -> Work {
        writers[job.partial, default: 0] += 1
        return (entry, unit, job)
    }
}
