import Foundation
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityStore
@testable import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// The download pool's bookkeeping: what starting many downloads costs.
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
        #expect(b.replica.withNamespace { ns in files.allSatisfy { ns.node($0)!.isPlaceholder } })
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
}
