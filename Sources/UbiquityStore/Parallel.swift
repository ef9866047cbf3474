import Foundation
import Synchronization

/// Blocking work (network requests) spread over a few threads of its own.
/// Not `DispatchQueue.concurrentPerform`: that runs about one iteration per
/// CPU at a time, and these wait on the network, not on a CPU.
public enum Parallel {
    /// `transform` of every element, at most `width` at a time, results in
    /// order. With `width` 1 (or one item) it runs on the calling thread.
    public static func map<T: Sendable, R: Sendable>(_ items: [T], width: Int, _ transform: @escaping @Sendable (T) -> R) -> [R] {
        guard width > 1, items.count > 1 else { return items.map(transform) }
        let results = Mutex<[Int: R]>([:])
        let next = Atomic<Int>(0)
        let workers = min(width, items.count)
        let done = DispatchSemaphore(value: 0)
        // Helpers of background work (the pusher's uploads) are background
        // work too: they must not compete with the programs using the mount.
        let lowered = LinuxCalls.threadIsLowered
        for _ in 0..<workers {
            let thread = Thread {
                if lowered { LinuxCalls.lowerThreadPriority() }
                while true {
                    let index = next.add(1, ordering: .relaxed).oldValue
                    guard index < items.count else { break }
                    let result = transform(items[index])
                    results.withLock { $0[index] = result }
                }
                done.signal()
            }
            thread.name = "ubiquityfs-io"
            thread.start()
        }
        for _ in 0..<workers { done.wait() }
        return results.withLock { all in (0..<items.count).map { all[$0]! } }
    }
}
