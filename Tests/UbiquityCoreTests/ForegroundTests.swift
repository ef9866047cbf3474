import Foundation
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityStore
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// Pushing a large file gives way to content I/O on the mount (`ForegroundActivity`).
/// Only lower bounds on time are asserted: a sleep is never shorter than asked,
/// whereas a busy machine can make anything longer.
@Suite struct ForegroundTests {
    static func seconds(_ body: () throws -> Void) rethrows -> Double {
        let start = Date()
        try body()
        return Date().timeIntervalSince(start)
    }

    /// Call `noteIO` now and every 10 ms until the returned closure is called.
    static func keepBusy(_ activity: ForegroundActivity) -> () -> Void {
        activity.noteIO()
        let stop = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        Thread {
            while stop.wait(timeout: .now() + .milliseconds(10)) == .timedOut { activity.noteIO() }
            done.signal()
        }.start()
        return { stop.signal(); done.wait() }
    }

    @Test func waitsForTheQuietWindowAfterIOAndNoLongerThanItsBound() {
        let activity = ForegroundActivity()
        // No I/O yet: nothing to wait for (the bound is only there to fail, not to time).
        #expect(Self.seconds { activity.waitForQuiet() } < Double(ForegroundActivity.longestWait) / 1e9)

        activity.noteIO()
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
        #expect(a.replica.withNamespace { $0.node(entry.ino)?.hasUnpushedContent } == false)

        let b = try TestDevice(store: store, name: "b")
        defer { b.cleanUp() }
        try b.engine.pull()
        #expect(try b.fs.getattr(ino: try b.resolve("big.bin")).size == UInt64(bytes.count))
    }
}
