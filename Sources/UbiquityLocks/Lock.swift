#if canImport(Glibc)
import Glibc
#endif

/// A value behind a lock: `Synchronization.Mutex`'s `withLock`, on a
/// `pthread_mutex_t`. Every lock of the project is one of these.
///
/// Why not `Mutex`: on Linux it waits on a futex that ThreadSanitizer does
/// not see, so TSan reports two `withLock` sections of one `Mutex` on two
/// threads as a race (bench/RESULTS.md, "Threads instead of Swift
/// concurrency"); it intercepts pthread mutexes, so with this type a TSan
/// run reports only real races. An uncontended lock and unlock cost about
/// the same as `Mutex`'s; the lock is a class (one allocation per lock, none
/// per use) because a `pthread_mutex_t` must not move.
public final class Lock<Value>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    // Only touched under `mutex`: the dynamic exclusivity check would add nothing.
    @exclusivity(unchecked) private var value: Value

    public init(_ value: sending Value) {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        self.value = value
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Run `body` with the value, holding the lock.
    @inline(__always)
    public func withLock<Result, E: Error>(_ body: (inout sending Value) throws(E) -> sending Result) throws(E) -> sending Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
