import Glibc
import UbiquityModel
import UbiquityLinux

/// Giving back the pages a large WRITE left in a worker's receive buffer.
///
/// libfuse gives each worker thread one receive buffer as large as the
/// largest request (`max_write` plus a header: about 1 MiB) and keeps it
/// for the thread's life. The kernel copies a WRITE's bytes into it, so a
/// worker that once served a 1 MiB write keeps 1 MiB of its heap resident
/// for good: after `bench/bench.py`'s sequential workload, 16 workers held
/// some 15 MiB that nothing would read again (`/proc/PID/smaps`: the
/// daemon's anonymous memory went from 6 to 19 MiB and stayed there).
///
/// A write of `large` bytes or more notes, per thread, the whole pages of
/// the buffer its bytes filled. The next small request that worker serves
/// (`getattr`, `lookup`, `open`, `read`, `flush`, `release`: requests that
/// fit in the buffer's first page, which the noted pages never include) at
/// least `idle` nanoseconds after that write gives them back with
/// `MADV_DONTNEED`. Only the worker itself may: between two of its requests
/// the kernel may be copying the next one into that buffer. Within a burst
/// of writes nothing is given back, so a sequential writer does not fault
/// the buffer in again for every request.
enum ReceiveBufferPages {
    /// A write at least this large notes its pages.
    static let large = 64 << 10
    /// How long after its last large write a worker gives its pages back.
    static let idle: UInt64 = 1_000_000_000

    /// What one worker holds: the first page and the length, and the time
    /// of its last large write.
    struct Held {
        var start: UInt = 0
        var length: Int = 0
        var since: UInt64 = 0
    }

    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key) { $0?.deallocate() }
        return key
    }()

    private static func held() -> UnsafeMutablePointer<Held> {
        if let existing = pthread_getspecific(key) { return existing.assumingMemoryBound(to: Held.self) }
        let created = UnsafeMutablePointer<Held>.allocate(capacity: 1)
        created.initialize(to: Held())
        pthread_setspecific(key, created)
        return created
    }

    private static let pageSize = UInt(sysconf(Int32(_SC_PAGESIZE)))

    /// A write's `count` bytes at `bytes` (in this worker's receive buffer) were served.
    static func written(_ bytes: UnsafeRawPointer, count: Int) {
        guard count >= large else { return }
        let first = (UInt(bitPattern: bytes) + pageSize - 1) & ~(pageSize - 1)
        let end = (UInt(bitPattern: bytes) + UInt(count)) & ~(pageSize - 1)
        guard end > first else { return }
        let h = held()
        // The union with what is noted already (writes start at the same place in the buffer).
        let (start, stop) = h.pointee.length == 0
            ? (first, end)
            : (min(first, h.pointee.start), max(end, h.pointee.start + UInt(h.pointee.length)))
        h.pointee.start = start
        h.pointee.length = Int(stop - start)
        h.pointee.since = MonotonicClock.now()
    }

    /// Called at the start of a small request: give the pages back if this
    /// worker's last large write is `idle` old.
    @inline(__always)
    static func smallRequest() {
        guard let existing = pthread_getspecific(key) else { return }
        let h = existing.assumingMemoryBound(to: Held.self)
        guard h.pointee.length > 0, MonotonicClock.now() &- h.pointee.since >= idle else { return }
        _ = madvise(UnsafeMutableRawPointer(bitPattern: h.pointee.start), h.pointee.length, MADV_DONTNEED)
        h.pointee.length = 0
    }
}
