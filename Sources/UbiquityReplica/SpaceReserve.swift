import Foundation
import Synchronization
import UbiquityLocks
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// How a change may use the replica's disk when it is full.
public enum DiskUse: Sendable {
    /// Adds to what the replica holds (a new item, an xattr, content about
    /// to be written): refused with `ENOSPC` unless the reserve is whole.
    case grows
    /// Removes, renames, changes metadata, or records what is already on
    /// disk (written content, a push, an eviction): may use the reserve.
    case mayUseReserve
}

/// Disk space set aside so the index can still commit when the replica's
/// disk is full: SQLite needs room to record a deletion too, and `rm` is
/// how a user gets out of a full disk.
///
/// The reserve is the file `reserve` in the replica's directory, allocated
/// with `posix_fallocate` (the blocks are taken, not just promised). When an
/// index write that may use the reserve fails for lack of space, the file
/// gives back one `step` and the write is tried again, until the reserve is
/// empty. Changes that grow the replica run only while the reserve is
/// whole: before one runs, a reserve that gave something back is refilled;
/// if the disk cannot give the space back, the change is refused with
/// `ENOSPC`. A refill is tried only when `fstatvfs` shows room for it, so on
/// a full disk the answer is immediate and costs one system call, and the
/// first change after space is freed finds it. So the last `size` bytes of a
/// full disk are only ever used to remove things or to record what is
/// already there.
///
/// Thread safety: every method may be called from any thread; `state` is a
/// leaf lock (held for one system call).
final class SpaceReserve: Sendable {
    /// Bytes set aside per replica.
    static let size: Int64 = 2 << 20
    /// Bytes given back at a time.
    static let step: Int64 = 512 << 10

    struct State {
        var fd: Int32
        /// Bytes the file holds now.
        var allocated: Int64
    }

    let path: String
    let state: Lock<State>
    /// The reserve holds `size` bytes (read without the lock on every write).
    let whole = Atomic<Bool>(false)

    /// Open (creating it if needed) the reserve at `path` and fill it if the
    /// disk has room; a disk that has none leaves it short (and the replica
    /// refuses to grow until it is whole).
    init(path: String) throws {
        self.path = path
        let fd = try syscallRetrying("open \(path)") { open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }
        var st = stat()
        fstat(fd, &st)
        state = Lock(State(fd: fd, allocated: Int64(st.st_size)))
        whole.store(Int64(st.st_size) >= Self.size, ordering: .relaxed)
        refill()
    }

    deinit {
        _ = state.withLock { close($0.fd) }
    }

    /// Make the reserve whole again if it gave something back. Returns
    /// whether it is whole.
    @discardableResult
    func refill() -> Bool {
        if whole.load(ordering: .relaxed) { return true }
        return state.withLock { s -> Bool in
            if s.allocated >= Self.size { return true }
            // Root may use the blocks ext4 keeps for it; others may not.
            var st = statvfs()
            if fstatvfs(s.fd, &st) == 0 {
                let free = Int64(geteuid() == 0 ? st.f_bfree : st.f_bavail) * Int64(st.f_frsize)
                if free < Self.size - s.allocated { return false }
            }
            guard posix_fallocate(s.fd, 0, off_t(Self.size)) == 0 else { return false }
            s.allocated = Self.size
            whole.store(true, ordering: .relaxed)
            return true
        }
    }

    /// Give back one step of the reserve. Returns false if it was empty.
    func release() -> Bool {
        state.withLock { s -> Bool in
            guard s.allocated > 0 else { return false }
            let remaining = max(0, s.allocated - Self.step)
            guard ftruncate(s.fd, off_t(remaining)) == 0 else { return false }
            s.allocated = remaining
            whole.store(false, ordering: .relaxed)
            return true
        }
    }

    /// `ENOSPC` unless the reserve is whole (or can be made whole now).
    func requireWhole() throws {
        guard refill() else {
            throw UbiquityError(ENOSPC, "the replica's disk is full (\(path) keeps the last \(Self.size >> 20) MiB for deletions)")
        }
    }
}
