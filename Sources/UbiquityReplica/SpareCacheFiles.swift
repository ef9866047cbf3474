import Foundation
import UbiquityLocks
#if canImport(Glibc)
import Glibc
#endif

/// Emptied cache files kept for new files to take, so a burst of creates
/// after a burst of deletes costs no inode allocation on the replica's disk.
///
/// The cache file of a node that is gone is emptied (`empty`) and moved
/// into `spare/` under a number of its own (`retire`), up to `limit`
/// files; past that it is unlinked. A new file's cache file is a spare
/// moved into place (`take`), or a new one when none is left.
///
/// Why: ext4 skips an inode freed in the last minute (five, while its inode
/// table block is dirty) when it allocates one, unless it has a journal — it
/// checks each free inode of the group in turn, from the group's first. Every
/// cache file lives in a few directories, so every create the mount answers
/// and every file it deletes share one block group, and after a few thousand
/// deletions each create walked all of them: `open(O_CREAT)` through the mount
/// took 230–400 µs against 100 through bindfs, and a `git clone` into the mount
/// right after an `rm -rf` took as long as through bindfs. A rename into place
/// allocates nothing.
///
/// Spares are also made ahead, in the background (`fillAhead`): up to
/// `ahead` of them while the replica is open (the daemon's replicas), so the first burst of creates
/// after a mount renames into place like every later one (before, it was
/// the one burst that allocated, at half the rate).
///
/// A spare is never in use: a node's cache file is retired only once the node
/// is dropped (no name, no open handle, no lookup), and the pusher, the only
/// other reader of a cache file, checks after reading that the node still
/// exists with the same content generation. Spares left by a crash are found
/// again at the next start (any name in `spare/`).
final class SpareCacheFiles: Sendable {
    let directoryPath: String
    let limit: Int
    private struct State {
        var names: [UInt64] = []
        var nextName: UInt64 = 0
        /// Names handed to `retire` calls still under way, counted against `limit`.
        var retiring = 0
    }
    private let state: Lock<State>

    init(directoryPath: String, limit: Int = 16_384, ahead: Int = 0) {
        self.directoryPath = directoryPath
        self.limit = limit
        self.ahead = min(ahead, limit)
        mkdir(directoryPath, 0o700)
        var found = State()
        if let names = try? FileManager.default.contentsOfDirectory(atPath: directoryPath) {
            for name in names {
                if let number = UInt64(name), found.names.count < limit {
                    found.names.append(number)
                    found.nextName = max(found.nextName, number + 1)
                } else {
                    unlink(directoryPath + "/" + name)
                }
            }
        }
        state = Lock(found)
    }

    var count: Int { state.withLock { $0.names.count } }

    /// How many spares `fillAhead` keeps ready (0: none made ahead), and
    /// the count below which a `take` starts it again.
    let ahead: Int
    var lowWater: Int { ahead / 4 }
    private let filling = Lock(false)

    /// Make spares on a thread of their own until there are `ahead` (one
    /// filler at a time); a failure (a full disk) stops it quietly: spares
    /// are an optimisation, and a create makes its own file.
    func fillAhead() {
        guard ahead > 0, filling.withLock({ f in defer { f = true }; return !f }) else { return }
        Thread.detachNewThread { [self] in
            defer { filling.withLock { $0 = false } }
            while true {
                let name: UInt64? = state.withLock { s in
                    guard s.names.count + s.retiring < ahead else { return nil }
                    s.retiring += 1
                    defer { s.nextName += 1 }
                    return s.nextName
                }
                guard let name else { return }
                let fd = open(path(name), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0o600)
                if fd >= 0 { close(fd) }
                state.withLock { s in
                    s.retiring -= 1
                    if fd >= 0 { s.names.append(name) }
                }
                if fd < 0 { return }
            }
        }
    }

    private func path(_ name: UInt64) -> String { directoryPath + "/" + String(name) }

    /// Empty the file at `path` and keep it as a spare, or unlink it when
    /// there are enough spares (or it cannot be kept). A missing file is no
    /// error: a directory, a symlink or a placeholder has none.
    func retire(_ path: String) {
        let name: UInt64? = state.withLock { s in
            guard s.names.count + s.retiring < limit else { return nil }
            s.retiring += 1
            defer { s.nextName += 1 }
            return s.nextName
        }
        guard let name else {
            unlink(path)
            return
        }
        // No file (a directory's or a symlink's node has none): nothing to unlink either.
        let opened = Self.empty(path)
        let kept = opened == 0 && rename(path, self.path(name)) == 0
        if !kept && opened != ENOENT { unlink(path) }
        state.withLock { s in
            s.retiring -= 1
            if kept { s.names.append(name) }
        }
    }

    /// Truncate the file at `path` through a descriptor, closed at once: a
    /// truncation to 0 marks an ext4 inode to have its new data written out
    /// at its next `close` (`auto_da_alloc`, for programs that rewrite a file
    /// without `fsync`), which this close clears. With `truncate(2)` the mark
    /// stayed, and every file made from a spare was flushed to the disk in
    /// the `release` of its first writer.
    /// 0, or the `open`'s errno.
    private static func empty(_ path: String) -> Int32 {
        let fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC)
        guard fd >= 0 else { return errno }
        close(fd)
        return 0
    }

    /// Move a spare to `path` (making its directory if needed); false when
    /// there is none or it could not be moved (the caller creates a file).
    func take(to path: String) -> Bool {
        guard let (name, left) = state.withLock({ s in s.names.popLast().map { ($0, s.names.count) } }) else {
            fillAhead()
            return false
        }
        if left < lowWater { fillAhead() }
        let spare = self.path(name)
        if rename(spare, path) == 0 { return true }
        if errno == ENOENT {
            mkdir((path as NSString).deletingLastPathComponent, 0o700)
            if rename(spare, path) == 0 { return true }
        }
        unlink(spare)
        return false
    }
}
