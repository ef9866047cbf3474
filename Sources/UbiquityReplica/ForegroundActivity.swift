import Foundation
import Synchronization
import UbiquityLocks
import UbiquityModel
import UbiquityLinux

/// When programs last used the mount, so that background work gives way to them.
///
/// Noted on every content read and write and every lookup (`note`: one
/// atomic store), and on every change to the namespace (`noteChange`: two).
/// Three kinds of background work wait for a pause, each for a bounded time:
///
/// - **Pushing a large file**, between chunks, at most `longestWait` per
///   chunk. A file closed after writing is pushed a moment later; a program
///   that reads it back at once would otherwise share the disk and a CPU
///   with the push, which reads the whole file again, hashes it and writes
///   it to the store. Measured on a 512 MiB file: a cold read right after
///   the close ran at 250–390 MiB/s with the push going on, 580–980 MiB/s
///   without.
/// - **A push round** (`SyncEngine.pushLoop`), at most `longestDeferral`
///   before each.
/// - **SQLite's copy of the operation log** (`IndexApplier`), at most
///   `longestDeferral` per batch, for a pause in the namespace changes only
///   (they are what gives it work; a program reading all along does not
///   hold it back). The log holds every change meanwhile, so nothing
///   acknowledged waits on it.
///
/// The bounds keep a program that uses the mount all day long from
/// stopping the work: it is slowed down, batched, never held.
///
/// Reads the kernel serves itself (FUSE passthrough) never reach the
/// daemon. For those the cache file is watched instead (`watchUnseenReads`):
/// while its page cache grows or shrinks between two looks, a program is
/// reading it and the mount is not quiet.
public final class ForegroundActivity: Sendable {
    /// Monotonic nanoseconds of the last request noted (0: none yet).
    private let lastRequest = Atomic<UInt64>(0)
    /// Monotonic nanoseconds of the last namespace change noted (0: none yet).
    private let lastChange = Atomic<UInt64>(0)
    /// Descriptors of files read by passthrough, with their cached pages at the last look.
    private let unseenReads = Lock<[Int32: Int]>([:])

    /// Quiet time that counts as the programs having paused.
    public static let quietWindow: UInt64 = 100_000_000
    /// Longest a large file's push waits for quiet per chunk.
    public static let longestWait: UInt64 = 500_000_000
    /// Longest a push round or a batch of SQLite writes waits for quiet.
    public static let longestDeferral: UInt64 = 1_000_000_000

    public init() {}

    /// A program's request reached the mount (one atomic store: called on
    /// every read, write and lookup).
    public func note() {
        lastRequest.store(MonotonicClock.now(), ordering: .relaxed)
    }

    /// A program's request changes the namespace (a create, a rename…).
    public func noteChange() {
        let now = MonotonicClock.now()
        lastRequest.store(now, ordering: .relaxed)
        lastChange.store(now, ordering: .relaxed)
    }

    /// Nanoseconds until the mount has been quiet for `quietWindow` if no
    /// other request (with `changesOnly`, no other namespace change) comes
    /// (0: quiet now).
    public func untilQuiet(changesOnly: Bool = false) -> UInt64 {
        let last = changesOnly ? lastChange.load(ordering: .relaxed) : lastRequest.load(ordering: .relaxed)
        let quietAt = last &+ Self.quietWindow
        let now = MonotonicClock.now()
        if quietAt > now { return quietAt - now }
        if !changesOnly && unseenReadsMoved() {
            note()
            return Self.quietWindow
        }
        return 0
    }

    /// Watch `fd` (a cache file the kernel reads by passthrough) until `unwatchUnseenReads`.
    public func watchUnseenReads(fd: Int32) {
        note()
        unseenReads.withLock { $0[fd] = LinuxCalls.cachedPages(fd) }
    }

    public func unwatchUnseenReads(fd: Int32) {
        _ = unseenReads.withLock { $0.removeValue(forKey: fd) }
    }

    /// Whether a watched file's page cache changed since the last look (one
    /// cachestat each).
    private func unseenReadsMoved() -> Bool {
        unseenReads.withLock { watched in
            var moved = false
            for (fd, pages) in watched {
                let now = LinuxCalls.cachedPages(fd)
                if now != pages {
                    watched[fd] = now
                    moved = true
                }
            }
            return moved
        }
    }

    /// Wait until the mount has been quiet for `quietWindow`, at most
    /// `longest` nanoseconds. Returns at once when it is quiet.
    public func waitForQuiet(longest: UInt64 = ForegroundActivity.longestWait) {
        let deadline = MonotonicClock.now() + longest
        while true {
            let wait = untilQuiet()
            let now = MonotonicClock.now()
            guard wait > 0, now < deadline else { return }
            Thread.sleep(forTimeInterval: Double(min(wait, deadline - now)) / 1e9)
        }
    }
}
