#if canImport(Glibc)
import Glibc
#endif
import CLinux
import Foundation
import UbiquityModel

// The Linux helpers: system calls Swift's Glibc module lacks (`CLinux`),
// retried and turned into `UbiquityError`s.

extension UbiquityError {
    /// The errno's symbolic name (`EAGAIN`), for messages that name it.
    public var errnoName: String {
        ubq_errno_name(errno).map { String(cString: $0) } ?? "errno \(errno)"
    }
}

/// Run a system call, retrying on `EINTR`, and throw `UbiquityError` on failure.
@discardableResult
public func syscallRetrying<T: BinaryInteger>(_ context: @autoclosure () -> String, _ body: () -> T) throws -> T {
    while true {
        let result = body()
        if result >= 0 { return result }
        let code = Glibc.errno
        if code == EINTR { continue }
        throw UbiquityError.posix(context(), errno: code)
    }
}

/// Linux calls Swift's Glibc module does not offer (see `CLinux`).
public enum LinuxCalls {
    public static func syncfs(_ fd: Int32) -> Int32 { ubq_syncfs(fd) }

    /// `fsync` the folder `path`: its entries (a file created, renamed or
    /// removed there) survive a power cut. `ENOENT` if it is gone.
    public static func syncDirectory(_ path: String) throws {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw UbiquityError.posix("open \(path)") }
        defer { close(fd) }
        try syscallRetrying("fsync \(path)") { fsync(fd) }
    }

    /// The type of the file system holding `path` (statfs(2)'s magic
    /// number), or -1 with `errno` set.
    public static func filesystemType(_ path: String) -> Int { ubq_filesystem_type(path) }

    /// Pages of the file `fd` in the page cache (cachestat(2)), or -1.
    public static func cachedPages(_ fd: Int32) -> Int { ubq_cached_pages(fd, 0, 0) }

    /// SIGTERM, SIGINT and SIGHUP arrive as one byte each on `fd`.
    public static func forwardShutdownSignals(to fd: Int32) -> Bool { ubq_forward_shutdown_signals(fd) == 0 }

    /// Set glibc's malloc up for a daemon that holds a large namespace for
    /// long (issue #11, 1,000,000 items in 200 MiB): one arena (threads
    /// otherwise each grow their own heap, and each heap keeps its own
    /// free holes), and a fixed mmap threshold of 128 KiB (by default it
    /// rises to the largest block freed so far, after which the namespace's
    /// large blocks land in the heap between short-lived ones and pin its
    /// pages). See DESIGN.md, "Memory at a million items".
    public static func tuneMallocForLongLivedData() { _ = ubq_tune_malloc(1, 128 << 10) }

    /// The whole content of `path`, read until end of file. For /proc files,
    /// whose size says 0 and which come a page per read: one read, or a
    /// read of the size `stat` reports, would stop at 4 KiB.
    public static func readWhole(_ path: String) throws -> Data {
        let fd = try syscallRetrying("open \(path)") { open(path, O_RDONLY | O_CLOEXEC) }
        defer { close(fd) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = try syscallRetrying("read \(path)") { read(fd, &buffer, buffer.count) }
            if n == 0 { return data }
            data.append(contentsOf: buffer[0..<n])
        }
    }

    /// The calling thread's ID (what the kernel tells a FUSE daemon as the requester's pid).
    public static var threadID: Int32 { ubq_gettid() }

    /// Give memory freed by a large operation back to the system.
    public static func releaseFreeMemory() { _ = ubq_malloc_trim() }

    /// The nice value of background work: the lowest, as file indexers run.
    static let backgroundNice: Int32 = 19

    /// Make the calling thread background work: nice 19 and the lowest
    /// best-effort I/O priority (DESIGN.md, "Priorities and lock order").
    public static func lowerThreadPriority() {
        let tid = ubq_gettid()
        setpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t(tid), backgroundNice)
        _ = ubq_ioprio_lowest(tid)
    }

    /// Whether the calling thread does background work (`lowerThreadPriority`).
    public static var threadIsLowered: Bool {
        errno = 0
        return getpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t(ubq_gettid())) >= backgroundNice
    }
}
