import Foundation
import Synchronization

/// When programs last read or wrote file content through the mount, so that
/// background work (pushing large files) can give way to them.
///
/// A file closed after writing is pushed a moment later; a program that reads
/// it back at once (or reads anything else) would otherwise share the disk and
/// a CPU with the push, which reads the whole file again, hashes it and writes
/// it to the store. Measured on a 512 MiB file: a cold read right after the
/// close ran at 250–390 MiB/s with the push going on, 580–980 MiB/s without.
///
/// The push therefore waits, between chunks, until the mount has seen no
/// content I/O for `quietWindow` — but never longer than `longestWait` per
/// chunk, so a program that reads all day long slows the push down but does
/// not stop it.
public final class ForegroundActivity: Sendable {
    /// Monotonic nanoseconds of the last content read or write (0: none yet).
    private let lastIO = Atomic<UInt64>(0)

    /// Quiet time that counts as the foreground having stopped.
    public static let quietWindow: UInt64 = 100_000_000
    /// Longest a background step waits for quiet.
    public static let longestWait: UInt64 = 500_000_000

    public init() {}

    /// A program read or wrote content (one atomic store: called on every read and write).
    public func noteIO() {
        lastIO.store(Self.now(), ordering: .relaxed)
    }

    /// Wait until the mount has been quiet for `quietWindow`, at most
    /// `longestWait`. Returns at once when there was no recent content I/O.
    public func waitForQuiet() {
        let deadline = Self.now() + Self.longestWait
        while true {
            let now = Self.now()
            let last = lastIO.load(ordering: .relaxed)
            guard now < deadline, last &+ Self.quietWindow > now else { return }
            let quietAt = min(last + Self.quietWindow, deadline)
            Thread.sleep(forTimeInterval: Double(quietAt - now) / 1e9)
        }
    }

    static func now() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }
}
