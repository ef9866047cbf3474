import Foundation
import Testing
import UbiquityModel
import UbiquityStore
@testable import UbiquitySync

/// One download's state machine (`DownloadBoard.Job`), driven as a value
/// with a clock of the test's own: what workers are handed, in which order,
/// and what each outcome leaves. The pool and the engine only call these.
@Suite struct DownloadJobTests {
    typealias Job = DownloadBoard.Job
    static let start = Date(timeIntervalSinceReferenceDate: 1_000)
    static let chunk: UInt64 = 4 << 20

    /// A chunked job of `chunks` chunks whose manifest is not in yet.
    func job(chunks: Int) -> Job {
        var job = Job(hash: "manifest", total: UInt64(chunks) * Self.chunk, started: Self.start)
        job.chunked = true
        return job
    }

    func blobs(_ count: Int) -> [String] { (0..<count).map { "blob-\($0)" } }

    @Test func aReadersRangeWaitsForTheManifestThenGoesFirst() {
        var job = job(chunks: 8)
        var taken = job.takeManifest(onlyForReaders: true)
        #expect(!taken, "nobody waits for the manifest yet")
        job.readerWaits(from: 5 * Self.chunk + 10, upTo: 5 * Self.chunk + 4096)
        taken = job.takeManifest(onlyForReaders: true)
        #expect(taken)
        taken = job.takeManifest(onlyForReaders: false)
        #expect(!taken, "one fetch of the manifest at a time")
        var urgent = job.takeUrgent(), ahead = job.takeReadAhead(holding: false)
        #expect(urgent == nil && ahead == nil, "no chunk before the manifest")

        let arrived = Self.start.addingTimeInterval(3)
        job.learnChunks(blobs(8), chunkSize: Self.chunk, at: arrived)
        #expect(job.lastProgress == arrived)
        #expect(!job.manifestInFlight && job.remaining == 8)
        urgent = job.takeUrgent()
        #expect(urgent == 5, "the reader's chunk first")
        urgent = job.takeUrgent()
        #expect(urgent == nil)
        var order: [Int?] = []
        for _ in 0..<3 { order.append(job.takeReadAhead(holding: false)) }
        #expect(order == [6, 7, 0], "then the read-ahead after it, and round to the start")
        #expect(job.inFlight == 4)
        #expect(job.state[5] == .fetching)
    }

    @Test func aFailedFetchIsMissingAgainAndTakenAgain() {
        var job = job(chunks: 2)
        job.learnChunks(blobs(2), chunkSize: Self.chunk, at: Self.start)
        let first = job.takeReadAhead(holding: false)!
        let later = Self.start.addingTimeInterval(10)
        job.ended(first, count: Int(Self.chunk), .failed, at: later)
        #expect(job.state[first] == .missing && job.inFlight == 0)
        #expect(job.lastProgress == Self.start, "a failure is no progress")
        let installs = job.takeInstall()
        #expect(!installs)
        var order: [Int?] = []
        for _ in 0..<2 { order.append(job.takeReadAhead(holding: false)) }
        #expect(order == [1, 0], "the failed chunk comes round again")
    }

    @Test func theInstallWaitsForEveryChunkAndForNothingUnderWay() {
        var job = job(chunks: 2)
        job.learnChunks(blobs(2), chunkSize: Self.chunk, at: Self.start)
        let a = job.takeReadAhead(holding: false)!, b = job.takeReadAhead(holding: false)!
        job.ended(a, count: Int(Self.chunk), .written, at: Self.start.addingTimeInterval(1))
        var installs = job.takeInstall()
        #expect(!installs, "a chunk is still missing")
        job.ended(b, count: Int(Self.chunk) - 100, .written, at: Self.start.addingTimeInterval(2))
        #expect(job.verified == 2 * Self.chunk - 100)
        #expect(job.lastProgress == Self.start.addingTimeInterval(2))
        #expect(job.isReady(from: 0, upTo: 2 * Self.chunk - 100, inMemory: false))
        var evicted = job
        evicted.evicted = true
        installs = evicted.takeInstall()
        #expect(!installs, "an evicted file is not installed")
        installs = job.takeInstall()
        #expect(installs)
        installs = job.takeInstall()
        #expect(!installs, "installed once")
        job.finish(at: Self.start.addingTimeInterval(5))
        #expect(job.done && job.lastProgress == Self.start.addingTimeInterval(5))
    }

    @Test func heldChunksBeyondTheLimitLetGoOfTheFurthestAndGoToTheFileLater() throws {
        let count = DownloadPool.heldPerDownload + 2
        var job = job(chunks: count)
        job.learnChunks(blobs(count), chunkSize: Self.chunk, at: Self.start)
        var buffers: [DownloadBoard.HeldChunk] = []
        defer { for chunk in buffers where !chunk.letGo { chunk.release() } }
        for _ in 0..<DownloadPool.heldPerDownload {
            let index = job.takeReadAhead(holding: true)!
            let chunk = DownloadBoard.HeldChunk(buffer: try ChunkBuffer.take(), count: Int(Self.chunk))
            buffers.append(chunk)
            job.ended(index, count: Int(Self.chunk), .held(chunk), at: Self.start)
        }
        #expect(job.held.count == DownloadPool.heldPerDownload && job.passed == 0)
        // A reader jumps to the last chunk: one more held than allowed.
        job.readerWaits(from: UInt64(count - 1) * Self.chunk, upTo: UInt64(count - 1) * Self.chunk + 1)
        let urgent = job.takeUrgent()
        let jump = try #require(urgent)
        #expect(jump == count - 1)
        let extra = DownloadBoard.HeldChunk(buffer: try ChunkBuffer.take(), count: Int(Self.chunk))
        buffers.append(extra)
        job.ended(jump, count: Int(Self.chunk), .held(extra), at: Self.start)
        let furthestBefore = DownloadPool.heldPerDownload - 1
        #expect(job.held.count == DownloadPool.heldPerDownload)
        #expect(job.state[furthestBefore] == .passed && job.passed == 1, "the furthest one nobody reads is let go of")
        #expect(job.held[jump] != nil, "not the one just fetched")

        // No stream any more: what was let go of is fetched again, held chunks go to the file.
        let toStore = job.takeHeldToStore()
        let (index, chunk) = try #require(toStore)
        #expect(job.state[furthestBefore] == .missing && job.passed == 0)
        #expect(job.state[index] == .fetching && job.held[index] == nil)
        job.ended(index, count: chunk.count, .written, at: Self.start)
        #expect(job.state[index] == .verified)
        chunk.release()
    }

    @Test func aFailureLetsGoOfEveryHeldChunk() throws {
        var job = job(chunks: 2)
        job.learnChunks(blobs(2), chunkSize: Self.chunk, at: Self.start)
        let index = job.takeReadAhead(holding: true)!
        let chunk = DownloadBoard.HeldChunk(buffer: try ChunkBuffer.take(), count: 10)
        job.ended(index, count: 10, .held(chunk), at: Self.start)
        job.fail(UbiquityError(EIO, "gone"))
        #expect(job.held.isEmpty && chunk.letGo)
        #expect(job.error?.message == "gone")
    }
}
