import CLinux
import Foundation
import Synchronization
import UbiquityLocks
import UbiquityModel
import UbiquityLinux

/// Blocking work (network requests) spread over a few helper threads.
/// Not `DispatchQueue.concurrentPerform`: that runs about one iteration per
/// CPU at a time, and these wait on the network, not on a CPU.
///
/// Helpers come from a process-wide pool per priority (`HelperPool`):
/// a burst of calls (a pusher cycle every few milliseconds, a journal read
/// of many records) reuses the same threads instead of creating and ending
/// threads per call, and calls running at once share one bound. The
/// calling thread works on the items too, so a call makes progress even
/// when every helper is busy with another call's items.
public enum Parallel {
    /// `transform` of every element, at most `width` at a time, results in
    /// order. With `width` 1 (or one item) it runs on the calling thread.
    public static func map<T: Sendable, R: Sendable>(_ items: [T], width: Int, _ transform: @escaping @Sendable (T) -> R) -> [R] {
        guard width > 1, items.count > 1 else { return items.map(transform) }
        let batch = Batch(items: items, transform: transform)
        // Helpers of background work (the pusher's uploads) are background
        // work too: they must not compete with the programs using the mount.
        (LinuxCalls.threadIsLowered ? HelperPool.lowered : HelperPool.foreground).run({ batch.work() }, helpers: min(width, items.count) - 1)
        batch.work()
        return batch.results()
    }

    /// The items of one `map`, claimed one at a time by whichever thread
    /// (the caller or a helper) is free.
    private final class Batch<T: Sendable, R: Sendable>: Sendable {
        let items: [T]
        let transform: @Sendable (T) -> R
        let next = Atomic<Int>(0)
        let finished = Lock<(results: [R?], count: Int)>(([], 0))
        let allDone = DispatchSemaphore(value: 0)

        init(items: [T], transform: @escaping @Sendable (T) -> R) {
            self.items = items
            self.transform = transform
            finished.withLock { $0.results = Array(repeating: nil, count: items.count) }
        }

        /// Transform unclaimed items until none is left.
        func work() {
            while true {
                let index = next.add(1, ordering: .relaxed).oldValue
                guard index < items.count else { return }
                let result = transform(items[index])
                let last = finished.withLock { state -> Bool in
                    state.results[index] = result
                    state.count += 1
                    return state.count == items.count
                }
                if last { allDone.signal() }
            }
        }

        /// Every result, once the last item is done (helpers that start
        /// later find nothing left and go back to the pool).
        func results() -> [R] {
            allDone.wait()
            return finished.withLock { $0.results.map { $0! } }
        }
    }
}

/// Threads that run `Parallel.map` work at one priority: at most `limit`,
/// created when work waits and none is free, ended after `linger` seconds
/// without work.
public final class HelperPool: Sendable {
    static let limit = 16
    static let linger: TimeInterval = 60

    public static let foreground = HelperPool(lowered: false)
    static let lowered = HelperPool(lowered: true)

    private struct State {
        var queue: [@Sendable () -> Void] = []
        var threads = 0
        var waiting = 0
    }

    private let lowered: Bool
    private let condition = NSCondition()
    private nonisolated(unsafe) var state = State()   // guarded by `condition`

    private init(lowered: Bool) { self.lowered = lowered }

    /// Threads the pool has now (busy or waiting for work).
    var threadCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return state.threads
    }

    /// Queue `job` for `helpers` threads, starting threads up to the limit.
    public func run(_ job: @escaping @Sendable () -> Void, helpers: Int) {
        guard helpers > 0 else { return }
        condition.lock()
        defer { condition.unlock() }
        for _ in 0..<helpers { state.queue.append(job) }
        let wanted = min(Self.limit, state.threads + max(0, state.queue.count - state.waiting))
        while state.threads < wanted {
            state.threads += 1
            Thread.run(named: "ubq-io") { [self] in serve() }
        }
        condition.broadcast()
    }

    private func serve() {
        if lowered { LinuxCalls.lowerThreadPriority() }
        condition.lock()
        while true {
            if !state.queue.isEmpty {
                let job = state.queue.removeFirst()
                condition.unlock()
                job()
                condition.lock()
                continue
            }
            state.waiting += 1
            let woken = condition.wait(until: Date(timeIntervalSinceNow: Self.linger))
            state.waiting -= 1
            if !woken && state.queue.isEmpty {
                state.threads -= 1
                condition.unlock()
                return
            }
        }
    }
}

extension Thread {
    /// Start a thread running `body`, named `name` where Linux shows thread
    /// names (`top -H`, `ps -L`, /proc/PID/task/TID/comm), which takes at
    /// most 15 bytes. The thread names itself: Foundation's `Thread.name`
    /// names nothing when set before `start`, nor when the new thread sets
    /// it before `start` has recorded the thread's handle (a race CI lost:
    /// a FUSE loop and its workers ran unnamed).
    @discardableResult
    public static func run(named name: String, _ body: @escaping @Sendable () -> Void) -> Thread {
        precondition(name.utf8.count <= 15, "thread name \(name) is longer than Linux's 15 bytes")
        let thread = Thread {
            ubq_name_this_thread(name)
            body()
        }
        thread.start()
        return thread
    }
}
