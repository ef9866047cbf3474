import Foundation
import Testing
import UbiquityFS
@testable import UbiquityReplica
import UbiquityModel
import UbiquityTesting
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// Background work gives way to the programs' requests (`ForegroundActivity`):
/// pushing a large file, and SQLite's copy of the operation log.
/// Only lower bounds on time are asserted: a sleep is never shorter than asked,
/// whereas a busy machine can make anything longer.
@Suite struct ForegroundTests {
    static func seconds(_ body: () throws -> Void) rethrows -> Double {
        let start = Date()
        try body()
        return Date().timeIntervalSince(start)
    }

    /// Call `note` (`noteChange` with `changes`) now and every 10 ms until
    /// the returned closure is called.
    static func keepBusy(_ activity: ForegroundActivity, changes: Bool = false) -> () -> Void {
        let note = changes ? activity.noteChange : activity.note
        note()
        let stop = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        Thread {
            while stop.wait(timeout: .now() + .milliseconds(10)) == .timedOut { note() }
            done.signal()
        }.start()
        return { stop.signal(); done.wait() }
    }

    @Test func waitsForTheQuietWindowAfterIOAndNoLongerThanItsBound() {
        let activity = ForegroundActivity()
        // No I/O yet: nothing to wait for (the bound is only there to fail, not to time).
        #expect(Self.seconds { activity.waitForQuiet() } < Double(ForegroundActivity.longestWait) / 1e9)

        activity.note()
        #expect(Self.seconds { activity.waitForQuiet() } >= 0.09)

        let stop = Self.keepBusy(activity)
        defer { stop() }
        let waited = Self.seconds { activity.waitForQuiet() }
        #expect(waited >= 0.49)   // busy all along: waits its whole bound...
        #expect(waited < 30)      // ...and then goes on
    }

    @Test func aLargeFileIsPushedBetweenTheProgramsReadsAndWrites() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        // Three chunks: the pusher waits before each one and before the flush.
        let bytes = [UInt8](repeating: 7, count: 2 * ContentLayout.chunkSize + 1)
        let (entry, opened) = try a.fs.create(parent: Namespace.rootIno, name: FileName("big.bin"), mode: 0o644, flags: O_WRONLY, caller: .root)
        _ = try bytes.withUnsafeBytes { try a.fs.write(handle: opened.handle, offset: 0, bytes: $0.baseAddress!, count: $0.count) }
        try a.fs.release(handle: opened.handle)

        let stop = Self.keepBusy(a.replica.foreground)
        let took = try Self.seconds { try a.engine.drain(progress: { _, _ in }) }
        stop()
        #expect(took >= 4 * 0.49)
        #expect(a.replica.read { $0.node(entry.ino)?.hasUnpushedContent } == false)

        let b = try TestDevice(store: store, name: "b")
        defer { b.cleanUp() }
        try b.engine.pull()
        #expect(try b.fs.getattr(ino: try b.resolve("big.bin")).size == UInt64(bytes.count))
    }

    /// SQLite's copy of a change waits for a pause in the namespace changes
    /// (the change itself is in the operation log at once), not for one in
    /// reads, a bounded time while changes go on, and not at all once
    /// `drain` asks for it.
    @Test func theIndexCatchesUpInAPauseOrAfterItsBound() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        try d.replica.applier.drain()

        // A change (which notes itself): SQLite gets it no sooner than the quiet window after it.
        let start = Date()
        _ = try d.write("a.txt", "a")
        let logged = d.replica.log.lastSeq
        while d.replica.applier.appliedUpTo < logged { Thread.sleep(forTimeInterval: 0.005) }
        #expect(Date().timeIntervalSince(start) >= Double(ForegroundActivity.quietWindow) / 1e9 - 0.01)

        // Reads all along do not hold it back...
        let reads = Self.keepBusy(d.replica.foreground)
        _ = try d.write("r.txt", "r")
        let readsStart = Date()
        let third = d.replica.log.lastSeq
        Thread.sleep(forTimeInterval: Double(ForegroundActivity.quietWindow) / 1e9)   // the write's own change
        while d.replica.applier.appliedUpTo < third { Thread.sleep(forTimeInterval: 0.005) }
        reads()
        #expect(Date().timeIntervalSince(readsStart) < 0.8 * Double(ForegroundActivity.longestDeferral) / 1e9)

        // ...changes all along do: SQLite gets the change after the bound, not never.
        let stop = Self.keepBusy(d.replica.foreground, changes: true)
        _ = try d.write("b.txt", "b")
        let busyStart = Date()
        let second = d.replica.log.lastSeq
        while d.replica.applier.appliedUpTo < second { Thread.sleep(forTimeInterval: 0.005) }
        let waited = Date().timeIntervalSince(busyStart)
        #expect(waited >= 0.5)
        #expect(waited < 30)

        // `drain` does not wait for the pause that never comes.
        _ = try d.write("c.txt", "c")
        let drained = try Self.seconds { try d.replica.applier.drain() }
        stop()
        #expect(drained < Double(ForegroundActivity.longestDeferral) / 1e9)
        #expect(d.replica.applier.appliedUpTo == d.replica.log.lastSeq)
    }
}
