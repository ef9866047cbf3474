import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Coordinated access for this device (`NSFileCoordinator` in UbiquityKit,
/// the `coordinate` command): readers of an item share it, a writer has it
/// alone, and requests are served first come, first served — a request
/// waits while an earlier waiting one conflicts with it, so a writer is never
/// starved by a stream of readers. Items are paths on this device (the
/// mountpoint's path and the names below it); an access to a folder
/// conflicts with accesses to what is inside it.
///
/// A request holds its items for as long as its client keeps the connection
/// open: a client that dies lets go at once.
///
/// Lock order: `state` is a leaf; waiting is on its condition.
final class Coordinator: Sendable {
    struct Request {
        var id: UInt64
        var reads: [String]
        var writes: [String]
    }
    struct State {
        var granted: [UInt64: Request] = [:]
        var waiting: [Request] = []
        var next: UInt64 = 1
    }
    let state = Mutex(State())
    let changed = Condition()

    static func conflicts(_ a: String, _ b: String) -> Bool {
        a == b || a.hasPrefix(b + "/") || b.hasPrefix(a + "/")
    }

    static func conflicts(_ a: Request, _ b: Request) -> Bool {
        for w in a.writes {
            if b.writes.contains(where: { conflicts(w, $0) }) || b.reads.contains(where: { conflicts(w, $0) }) { return true }
        }
        for w in b.writes where a.reads.contains(where: { conflicts(w, $0) }) { return true }
        return false
    }

    /// Wait until `reads` and `writes` are granted (nil if `abandoned` says
    /// the client left meanwhile); `release` the token when done.
    func acquire(reads: [String], writes: [String], abandoned: () -> Bool) -> UInt64? {
        let id = state.withLock { s -> UInt64 in
            defer { s.next += 1 }
            s.waiting.append(Request(id: s.next, reads: reads, writes: writes))
            return s.next
        }
        while true {
            let seen = changed.current
            let granted = state.withLock { s -> Bool in
                guard let index = s.waiting.firstIndex(where: { $0.id == id }) else { return false }
                let request = s.waiting[index]
                let blocked = s.granted.values.contains { Self.conflicts($0, request) }
                    || s.waiting[..<index].contains { Self.conflicts($0, request) }
                guard !blocked else { return false }
                s.waiting.remove(at: index)
                s.granted[id] = request
                return true
            }
            if granted { return id }
            if abandoned() {
                state.withLock { s in s.waiting.removeAll { $0.id == id } }
                changed.broadcast()
                return nil
            }
            changed.wait(after: seen, seconds: 0.2)
        }
    }

    func release(_ id: UInt64) {
        state.withLock { s in _ = s.granted.removeValue(forKey: id) }
        changed.broadcast()
    }
}

/// A condition to wait on (with a timeout) until another thread signals.
final class Condition: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let cond = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var generation: UInt64 = 0

    init() {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(cond, nil)
    }

    deinit {
        pthread_cond_destroy(cond)
        pthread_mutex_destroy(mutex)
        cond.deallocate()
        mutex.deallocate()
    }

    func broadcast() {
        pthread_mutex_lock(mutex)
        generation &+= 1
        pthread_cond_broadcast(cond)
        pthread_mutex_unlock(mutex)
    }

    /// How many broadcasts so far (read before looking at what they announce).
    var current: UInt64 {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return generation
    }

    /// Wait for a broadcast after the `seen`-th, at most `seconds`.
    func wait(after seen: UInt64, seconds: Double) {
        pthread_mutex_lock(mutex)
        var deadline = timespec()
        clock_gettime(CLOCK_REALTIME, &deadline)
        let nanos = Int(deadline.tv_nsec) + Int(seconds * 1e9)
        deadline.tv_sec += nanos / 1_000_000_000
        deadline.tv_nsec = nanos % 1_000_000_000
        while generation == seen {
            if pthread_cond_timedwait(cond, mutex, &deadline) != 0 { break }
        }
        pthread_mutex_unlock(mutex)
    }
}
