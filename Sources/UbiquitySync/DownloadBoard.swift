import Foundation
import Synchronization
import UbiquityReplica
import UbiquityModel
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// The state of every download of one container (`SyncEngine.downloads`):
/// each job's chunks (queued, fetching, held, verified), its readers and
/// streams, and the errors kept for `status`. The design of downloads is
/// described once, in Downloads.swift; this is its bookkeeping, changed
/// only under the pool's monitor (`DownloadPool`).
final class DownloadBoard: @unchecked Sendable {
    struct Job {
        var hash: String?
        var total: UInt64
        /// Bytes verified so far (not necessarily a prefix).
        var verified: UInt64 = 0
        var done = false
        var error: UbiquityError?
        var lastProgress: Date

        // Scheduling (guarded by the pool's monitor, like everything here).
        /// Distinguishes this job from an earlier, failed one of the same version.
        var id: UInt64 = 0
        var ino: UInt64 = 0
        var background = false
        var partial = ""
        /// Size of the partial file when the job started: chunks it covers are
        /// read back and checked before they are fetched.
        var present: UInt64 = 0
        var chunked = false
        var chunkSize: UInt64 = 1
        /// The blobs, one per chunk (nil until the manifest of chunked content is in).
        var chunks: [String]?
        var state: [ChunkState] = []
        var remaining = 0
        var inFlight = 0
        var manifestInFlight = false
        var installing = false
        /// Chunks readers wait for, oldest first.
        var urgent: [Int] = []
        /// A reader waits for the manifest (and then for these ranges).
        var readerWaiting = false
        var waitingRanges: [(from: UInt64, upTo: UInt64)] = []
        /// The sequential read-ahead goes on from here.
        var cursor = 0
        /// Chunks held in memory for streaming readers (state `.held`).
        var held: [Int: HeldChunk] = [:]
        /// Chunks let go of since the last time nothing was held for readers (state `.passed`).
        var passed = 0
        /// Someone waits for the whole file in the cache: nothing more is
        /// held, and an eviction while a stream read it no longer counts.
        var keep = false { didSet { if keep { evicted = false } } }
        /// Evicted while a reader streams it: stopped when the last stream closes.
        var evicted = false
        /// When a streaming reader was last served from memory.
        var lastServed: Date
        /// Among the downloads the pool looks at (`DownloadPool.active`), not
        /// only queued behind others (`DownloadPool.queued`).
        var scheduled = false

        /// A job for `total` bytes of version `hash`, begun at `started`
        /// (on the engine's `downloadClock`, as every time here).
        init(hash: String?, total: UInt64, started: Date) {
            self.hash = hash
            self.total = total
            lastProgress = started
            lastServed = started
        }

        // MARK: The job's state machine
        //
        // Every change of a job's state is one of these (the caller holds
        // the pool's monitor; `DownloadPool.change` keeps the pool's count
        // of held chunks right). Times come from the engine's
        // `downloadClock`: a test drives a job with its own.

        /// The chunks are known (the manifest arrived, or the content is a
        /// single blob): all missing; the ranges readers asked for while the
        /// manifest was on its way go first.
        mutating func learnChunks(_ blobs: [String], chunkSize: UInt64, at now: Date) {
            chunks = blobs
            self.chunkSize = max(1, chunkSize)
            state = Array(repeating: .missing, count: blobs.count)
            remaining = blobs.count
            manifestInFlight = false
            lastProgress = now
            for range in waitingRanges { ask(from: range.from, upTo: range.upTo) }
            waitingRanges = []
        }

        /// A reader waits for bytes `from..<upTo`: before the manifest is in,
        /// the range waits with it; after, its missing chunks go first.
        mutating func readerWaits(from: UInt64, upTo: UInt64) {
            if chunks != nil {
                ask(from: from, upTo: upTo)
            } else {
                readerWaiting = true
                waitingRanges.append((from, upTo))
            }
        }

        /// Put the missing chunks of a short range (a `read`) first in the
        /// queue, and the read-ahead after them.
        mutating func ask(from: UInt64, upTo: UInt64) {
            guard let chunks, !chunks.isEmpty, upTo > from else { return }
            let first = Int(from / chunkSize), last = min(chunks.count - 1, Int((upTo - 1) / chunkSize))
            guard first <= last, last - first < 2 else { return }
            let wanted = (first...last).filter { (state[$0] == .missing || state[$0] == .passed) && !urgent.contains($0) }
            guard !wanted.isEmpty else { return }
            urgent += wanted
            cursor = last + 1
        }

        /// The manifest's fetch, if it is wanted and nobody fetches it
        /// (`onlyForReaders`: only if a reader waits for it).
        mutating func takeManifest(onlyForReaders: Bool) -> Bool {
            guard chunks == nil, !manifestInFlight, readerWaiting || !onlyForReaders else { return false }
            manifestInFlight = true
            return true
        }

        /// The manifest could not be fetched: the next look tries again.
        mutating func manifestFailed() { manifestInFlight = false }

        /// Chunk `index` is handed to a worker to fetch (or to write).
        mutating func take(_ index: Int) {
            state[index] = .fetching
            inFlight += 1
        }

        /// The next chunk a reader waits for, taken; nil if none.
        mutating func takeUrgent() -> Int? {
            while let index = urgent.first {
                urgent.removeFirst()
                guard state[index] == .missing || state[index] == .passed else { continue }
                if state[index] == .passed { passed -= 1 }
                take(index)
                return index
            }
            return nil
        }

        /// The next chunk of the read-ahead, taken: from the cursor on, and
        /// for a stream (`holding`) never behind it; nil if none.
        mutating func takeReadAhead(holding: Bool) -> Int? {
            guard let chunks else { return nil }
            for step in 0..<chunks.count {
                let index = (cursor + step) % chunks.count
                if holding && index < cursor { break }
                if state[index] == .missing {
                    cursor = index + 1
                    take(index)
                    return index
                }
            }
            return nil
        }

        /// No stream needs the held chunks any more: chunks let go of are
        /// missing again (fetched once more, into the file), and a held chunk
        /// nobody reads is taken to be written to the partial file.
        mutating func takeHeldToStore() -> (index: Int, chunk: HeldChunk)? {
            for index in 0..<state.count where state[index] == .passed { state[index] = .missing }
            passed = 0
            guard let (index, chunk) = held.first(where: { $0.value.pins == 0 }) else { return nil }
            held[index] = nil
            take(index)
            return (index, chunk)
        }

        /// Every chunk is verified and nothing is under way: the install,
        /// taken (an evicted file is not installed; its download stops when
        /// its last stream closes).
        mutating func takeInstall() -> Bool {
            guard chunks != nil, remaining == 0, !installing, inFlight == 0, !evicted else { return false }
            installing = true
            return true
        }

        /// What a worker's fetch (or write) of chunk `index`, `count` bytes, came to.
        enum Outcome {
            /// Verified in the partial file.
            case written
            /// Verified and held in memory for streaming readers.
            case held(HeldChunk)
            /// Failed: the chunk is missing again.
            case failed
        }

        /// A worker's unit on chunk `index` ended. A chunk held past
        /// `DownloadPool.heldPerDownload` (a reader jumped: urgent chunks
        /// came on top of the read-ahead) makes the job let go of the
        /// furthest one no reader is being served from.
        mutating func ended(_ index: Int, count: Int, _ outcome: Outcome, at now: Date) {
            inFlight -= 1
            switch outcome {
            case .written:
                state[index] = .verified
                verified += UInt64(count)
                remaining -= 1
                lastProgress = now
            case .held(let chunk):
                state[index] = .held
                held[index] = chunk
                lastProgress = now
                if held.count > DownloadPool.heldPerDownload,
                   let last = held.filter({ $0.key != index && $0.value.pins == 0 }).keys.max() {
                    letGo(last)
                }
            case .failed:
                state[index] = .missing
            }
        }

        /// Held chunk `index` is let go of, to be fetched again later.
        mutating func letGo(_ index: Int) {
            held.removeValue(forKey: index)?.release()
            state[index] = .passed
            passed += 1
        }

        /// Installed: kept a while for readers of this version.
        mutating func finish(at now: Date) {
            done = true
            lastProgress = now
        }

        /// Failed for good: readers get `error`; held chunks go.
        mutating func fail(_ error: UbiquityError) {
            self.error = error
            letGoOfEverything()
        }

        /// Let go of every held chunk (a failure, a stop).
        mutating func letGoOfEverything() {
            for chunk in held.values { chunk.release() }
            held = [:]
        }

        /// Whether bytes `from..<upTo` are verified in the cache file (or,
        /// `inMemory`, held).
        func isReady(from: UInt64, upTo: UInt64, inMemory: Bool) -> Bool {
            if done { return true }
            guard chunks != nil, upTo > from else { return upTo <= from }
            let first = Int(from / chunkSize), last = Int((upTo - 1) / chunkSize)
            guard last < state.count else { return false }
            return (first...last).allSatisfy { state[$0] == .verified || (inMemory && state[$0] == .held) }
        }
    }

    /// `held`: verified, in memory only; `passed`: was held and let go of,
    /// fetched again once no stream holds chunks.
    enum ChunkState: UInt8 { case missing, fetching, held, passed, verified }

    /// A chunk held in memory (guarded by the pool's monitor). Its buffer
    /// goes back once the download let go of it and no reader is served
    /// from it.
    final class HeldChunk: @unchecked Sendable {
        let buffer: UnsafeMutableRawPointer
        let count: Int
        /// Readers being served from it now.
        var pins = 0
        /// Bytes served to readers so far.
        var served = 0
        var letGo = false

        init(buffer: UnsafeMutableRawPointer, count: Int) {
            self.buffer = buffer
            self.count = count
        }

        /// The download is done with it (the caller holds the monitor).
        func release() {
            letGo = true
            if pins == 0 { ChunkBuffer.give(buffer) }
        }
    }

    /// Guards `jobs`; readers wait on it for progress (the pool's one mutex).
    var monitor: DownloadPool.Monitor { DownloadPool.shared.monitor }
    /// One job per version of a file: a reader waits for the version it opened.
    var jobs: [JobKey: Job] = [:]
    /// Streaming readers open, per version (`beginStream`).
    var streams: [JobKey: Int] = [:]
    /// Jobs looked at to start and schedule downloads (guarded by the
    /// monitor): tests count the work that starting N downloads costs.
    var examined = 0
    /// Downloads that finished, in the order they did, from `finishedHead`
    /// on: a start forgets the ones done for ten minutes from the front,
    /// without walking every job (that cost N²/2 for N starts).
    var finished: [(key: JobKey, id: UInt64)] = []
    var finishedHead = 0

    /// Forget downloads that finished before `stale` (the caller holds the monitor).
    func forgetFinished(before stale: Date) {
        while finishedHead < finished.count {
            let (key, id) = finished[finishedHead]
            examined += 1
            if let job = jobs[key], job.id == id, job.done {
                guard job.lastProgress <= stale else { break }
                jobs[key] = nil
            }
            finishedHead += 1
        }
        if finishedHead >= 64 && finishedHead * 2 >= finished.count {
            finished.removeFirst(finishedHead)
            finishedHead = 0
        }
    }

    struct JobKey: Hashable {
        var ino: UInt64
        var hash: String?
    }

    func withJobs<T>(_ body: (inout [JobKey: Job]) -> T) -> T {
        monitor.lock()
        defer { monitor.unlock() }
        return body(&jobs)
    }
}
