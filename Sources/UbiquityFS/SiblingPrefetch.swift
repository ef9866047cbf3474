import Foundation
import UbiquityLocks
import UbiquityReplica
import UbiquityModel
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Small files opened one after another in their directory's order (`cat
/// dir/*`, `grep -r`, `tar c`, an editor or build reading a tree): the
/// daemon asks the disk for the next ones' cache files before the reader
/// opens them.
///
/// With cold caches every small file costs a disk read of its own, which
/// the reader waits for (the kernel reads ahead within a file, never across
/// files). Once a reader has opened two files at consecutive positions of a
/// directory (`Directory.position(of:)`: the order the entries were added
/// in, as long as none was removed), the cache files of the next `ahead` entries that are
/// small local files are opened, given `POSIX_FADV_WILLNEED` and closed by a
/// helper thread, so their reads are in flight while the reader is still
/// on the first. A reader that jumps about never builds a run and nothing is
/// asked for; a prefetched file that changed meanwhile costs nothing but the
/// read. bench/RESULTS.md ("Cold small files read in directory order")
/// has the measurements.
final class SiblingPrefetch: Sendable {
    /// Entries asked for ahead of the reader, and at least this many at a time.
    static let ahead = 32
    static let step = 8
    /// Only files this small: a larger one's own read-ahead keeps the disk busy.
    static let largest: UInt64 = 256 << 10
    /// Directories followed at once (the most recently opened in).
    static let runsKept = 4

    struct Run {
        var parent: UInt64
        /// The position a reader going on in order opens next.
        var next: Int
        var length: Int
        /// Positions before this were asked for.
        var askedUpTo: Int
    }

    /// A leaf lock (taken inside the namespace lock, takes nothing itself).
    private let runs = Lock<[Run]>([])

    /// `node`, a small local file, was opened for reading: the positions of
    /// its siblings to ask for now, if any (the caller holds the namespace,
    /// `directory` is the node's parent's listing).
    func opened(_ node: LocalNode, in directory: Directory) -> Range<Int>? {
        guard let position = directory.position(of: node.lastName) else { return nil }
        let parent = node.lastParent
        return runs.withLock { runs -> Range<Int>? in
            var run = runs.firstIndex(where: { $0.parent == parent }).map { runs.remove(at: $0) }
                ?? Run(parent: parent, next: -1, length: 0, askedUpTo: 0)
            if position != run.next { run = Run(parent: parent, next: -1, length: 0, askedUpTo: 0) }
            run.length += 1
            run.next = position + 1
            run.askedUpTo = max(run.askedUpTo, position + 1)
            defer {
                runs.append(run)
                if runs.count > Self.runsKept { runs.removeFirst() }
            }
            let upTo = min(directory.count, position + 1 + Self.ahead)
            guard run.length >= 2, upTo > run.askedUpTo,
                  upTo - run.askedUpTo >= Self.step || upTo == directory.count else { return nil }
            defer { run.askedUpTo = upTo }
            return run.askedUpTo..<upTo
        }
    }

    /// Ask the disk for the cache files at `paths`, on a helper thread.
    static func prefetch(_ paths: [String]) {
        guard !paths.isEmpty else { return }
        HelperPool.foreground.run({
            for path in paths {
                let fd = open(path, O_RDONLY | O_CLOEXEC)
                guard fd >= 0 else { continue }   // gone meanwhile: nothing to ask for
                _ = posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED)
                close(fd)
            }
        }, helpers: 1)
    }
}
