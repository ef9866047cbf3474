import Foundation
import Synchronization
import UbiquityLocks
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityTesting
@testable import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// The download pool's bookkeeping: what starting many downloads costs, and
/// an install that must wait for units still writing its partial file.
@Suite struct DownloadSchedulingTests {
    /// A writes `count` small files (each different) in folder "many"; B
    /// (on `storeForB`) pulls them as placeholders. The folder's inode on B and the files'.
    func placeholders(_ count: Int, _ store: any Store, _ storeForB: any Store) throws -> (TestDevice, TestDevice, UInt64, [UInt64]) {
        let a = try TestDevice(store: store, name: "a")
        let folder = try a.fs.mkdir(parent: Namespace.rootIno, name: FileName("many"), mode: 0o755, caller: .root).ino
        for i in 0..<count {
            let handle = try a.fs.create(parent: folder, name: FileName("f\(i)"), mode: 0o644, flags: O_WRONLY, caller: .root).1.handle
            let bytes = Data("content of file \(i)\n".utf8)
            _ = try bytes.withUnsafeBytes { try a.fs.write(handle: handle, offset: 0, bytes: $0.baseAddress!, count: $0.count) }
            try a.fs.release(handle: handle)
        }
        try a.engine.drain(progress: { _, _ in })
        let b = try TestDevice(store: storeForB, name: "b")
        try b.engine.pull()
        let onB = try b.resolve("many")
        let files = try (0..<count).map { try b.resolve("many/f\($0)") }
        #expect(b.replica.read { ns in files.allSatisfy { ns.node($0)!.isPlaceholder } })
        return (a, b, onB, files)
    }

    func examined(_ device: TestDevice) -> Int {
        let pool = DownloadPool.shared
        pool.monitor.lock()
        defer { pool.monitor.unlock() }
        return device.engine.downloads.examined
    }

    /// Pinning a folder of N placeholders starts N background downloads:
    /// each start may look at a few jobs, not at every job started before
    /// it (that was N²/2 jobs copied for N starts, under the lock every
    /// streaming reader waits on).
    @Test func startingNDownloadsLooksAtEachJobAFewTimesNotNTimes() throws {
        let n = 1500
        let store = InMemoryStore()
        let slow = FaultyStore(store)
        let (a, b, folder, files) = try placeholders(n, store, slow)
        defer { a.cleanUp(); b.cleanUp() }
        // Nothing finishes while they are started: the count is the starts' alone.
        slow.slowFetches(by: 3)
        let before = examined(b)
        try b.engine.setPinned(ino: folder, true)
        let work = examined(b) - before
        #expect(b.engine.downloadSummary().items >= n - 4, "the downloads did not all start")
        // Each start looks at its own job and a few running ones.
        #expect(work <= 20 * n, "starting \(n) downloads looked at \(work) jobs (\(work / n) a start)")
        for ino in files { b.engine.stopDownloads(ino: ino) }
        slow.slowFetches(by: nil)
    }

    /// The download's clock is the engine's (`downloadClock`): a download
    /// whose store stops answering fails once that clock says `stallTimeout`
    /// passed with no progress — here at once, the clock being moved on.
    @Test func aDownloadThatMakesNoProgressFailsByTheEnginesClock() throws {
        let store = InMemoryStore()
        let slow = FaultyStore(store)
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        try a.write("f", String(repeating: "x", count: 3 << 20))   // chunked, fetched by the pool
        try a.engine.drain(progress: { _, _ in })
        let ahead = Lock(0.0)
        let b = try TestDevice(store: slow, name: "b", downloadClock: { Date().addingTimeInterval(ahead.withLock { $0 }) })
        defer { b.cleanUp() }
        try b.engine.pull()
        let ino = try b.resolve("f")
        slow.slowFetches(by: 5)
        defer { slow.slowFetches(by: nil) }
        let started = Date()
        let outcome = Lock<Result<Void, any Error>?>(nil)
        let engine = b.engine
        Thread.detachNewThread {
            let result = Result { try engine.download(ino: ino) }
            outcome.withLock { $0 = result }
        }
        Thread.sleep(forTimeInterval: 0.5)
        #expect(outcome.withLock { $0 } == nil, "the download ended before its clock moved")
        ahead.withLock { $0 = SyncEngine.stallTimeout + 1 }
        while outcome.withLock({ $0 }) == nil && Date().timeIntervalSince(started) < 10 { Thread.sleep(forTimeInterval: 0.05) }
        let message = outcome.withLock { result -> String? in
            guard case .failure(let error)? = result else { return nil }
            return "\(error)"
        }
        #expect(message?.contains("made no progress") == true, "\(String(describing: message))")
        #expect(Date().timeIntervalSince(started) < 10, "the stall was found by the wall clock, not the engine's")
    }

    /// An install waits for units of an earlier attempt still writing the
    /// partial file, woken when they finish; if they do not finish in time
    /// it fails (kept in status), never installs under them, and a later
    /// download installs once they are done.
    @Test func anInstallNeverHappensWhileAUnitStillWritesThePartialFile() throws {
        let store = InMemoryStore()
        let (a, b, _, files) = try placeholders(1, store, store)
        defer { a.cleanUp(); b.cleanUp() }
        let ino = files[0]
        let hash = b.replica.read { $0.node(ino)!.hash! }
        let partial = b.replica.cache.path(ino) + "." + String(hash.prefix(16)) + ".part"
        let pool = DownloadPool.shared
        // A straggler of an earlier attempt writes the partial file.
        pool.monitor.lock()
        pool.writers[partial, default: 0] += 1
        pool.monitor.unlock()
        let saved = SyncEngine.installWaitMilliseconds.load(ordering: .relaxed)
        SyncEngine.installWaitMilliseconds.store(1000, ordering: .relaxed)
        defer { SyncEngine.installWaitMilliseconds.store(saved, ordering: .relaxed) }

        let outcome = Lock<Result<Void, any Error>?>(nil)
        let engine = b.engine
        Thread.detachNewThread {
            let result = Result { try engine.download(ino: ino) }
            outcome.withLock { $0 = result }
        }
        // Longer than the install waits: the straggler still writes throughout.
        let deadline = Date().addingTimeInterval(4)
        var installedUnderAWriter = false
        while Date() < deadline {
            if b.replica.read({ !$0.node(ino)!.isPlaceholder }) { installedUnderAWriter = true; break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(!installedUnderAWriter, "installed while a unit still wrote the partial file")
        let failed = outcome.withLock { result -> Bool in
            if case .failure? = result { return true }
            return false
        }
        #expect(failed, "the download did not fail while a unit still wrote its partial file")
        #expect(b.engine.currentStatus.recentErrors.contains { $0.message.contains("still writ") },
                "status does not say why: \(b.engine.currentStatus.recentErrors)")

        // The straggler finishes: the next try installs.
        pool.monitor.lock()
        pool.doneWriting(partial)
        pool.monitor.unlock()
        try b.engine.download(ino: ino)
        #expect(b.replica.read { !$0.node(ino)!.isPlaceholder })
        #expect(try b.read("many/f0") == "content of file 0\n")
    }
}
