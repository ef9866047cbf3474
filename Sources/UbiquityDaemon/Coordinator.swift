import Foundation
import UbiquityLocks
import UbiquityProtocol
#if canImport(Glibc)
import Glibc
#endif

/// Coordinated access for this device (`NSFileCoordinator` and
/// `NSFilePresenter` in UbiquityKit; the `coordinate` and `present`
/// commands; the sync's own writes of pulled versions).
///
/// Items are keyed by container and path in it (`ID/Documents/notes.txt`),
/// so two mounts of one container coordinate with each other. Readers of an
/// item share it, a writer has it alone, and requests are served first come,
/// first served — a request waits while an earlier waiting one conflicts
/// with it, so a writer is never starved by a stream of readers. An access
/// to a folder conflicts with accesses to what is inside it.
///
/// Presenters of an item are asked before another process's access to it
/// (and before the sync writes it): `relinquish` (reading, writing or
/// deleting), answered by the client; the access waits for every answer,
/// at most `presenterTimeout` (`UBIQUITYFS_PRESENTER_TIMEOUT`, seconds;
/// default 10), then proceeds; `reacquire` follows when it ends. A
/// process's own presenters are its own business (UbiquityKit asks them in
/// process), so the daemon skips presenters of the asking process.
///
/// A request or a presenter lasts as long as its client's connection: a
/// client that dies lets go at once.
///
/// Lock order: `state` is a leaf (nothing is sent while holding it); waiting
/// is on `changed`.
final class Coordinator: Sendable {
    struct Request {
        var id: UInt64
        var reads: [String]
        var writes: [String]
    }
    struct Presenter {
        var key: String
        var pid: Int32
        var connection: ControlConnection
    }
    /// An ask sent to a presenter: `reacquire` goes to the same connection.
    struct Ask {
        var id: UInt64
        var access: PresenterAsk.Access
        var connection: ControlConnection
    }
    struct State {
        var granted: [UInt64: Request] = [:]
        var waiting: [Request] = []
        var presenters: [UInt64: Presenter] = [:]
        var answered: Set<UInt64> = []
        var next: UInt64 = 1
    }
    let state = Lock(State())
    let changed = Condition()
    let presenterTimeout: Double = ProcessInfo.processInfo.environment["UBIQUITYFS_PRESENTER_TIMEOUT"]
        .flatMap(Double.init).map { max(0, $0) } ?? 10

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

    /// Whether nobody coordinates or presents anything in `container` (the
    /// sync then need not work out the paths it is about to change).
    func isIdle(container: String) -> Bool {
        let prefix = container + "/"
        func inside(_ key: String) -> Bool { key == container || key.hasPrefix(prefix) }
        return state.withLock { s in
            !s.granted.values.contains { ($0.reads + $0.writes).contains(where: inside) }
                && !s.waiting.contains { ($0.reads + $0.writes).contains(where: inside) }
                && !s.presenters.values.contains { inside($0.key) }
        }
    }

    /// Wait until `reads` and `writes` are granted (nil if `abandoned` says
    /// the client left meanwhile, or when `deadline` passes); `release` the
    /// token when done.
    func acquire(reads: [String], writes: [String], deadline: Date? = nil, abandoned: () -> Bool) -> UInt64? {
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
            if abandoned() || deadline.map({ Date() >= $0 }) == true {
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

    // MARK: Presenters

    func addPresenter(key: String, pid: Int32, connection: ControlConnection) -> UInt64 {
        state.withLock { s in
            defer { s.next += 1 }
            s.presenters[s.next] = Presenter(key: key, pid: pid, connection: connection)
            return s.next
        }
    }

    func removePresenter(_ id: UInt64) {
        state.withLock { s in _ = s.presenters.removeValue(forKey: id) }
        changed.broadcast()
    }

    /// A presenter's client says it let go.
    func answered(_ ask: UInt64) {
        state.withLock { s in _ = s.answered.insert(ask) }
        changed.broadcast()
    }

    /// Ask the presenters of the items (other than process `pid`'s) to let
    /// go, and wait for their answers (at most `presenterTimeout`). A
    /// presenter of a deleted item, or of something inside it, is asked to
    /// accommodate the deletion; of a written one, to relinquish to the
    /// writer; of a read one, to relinquish to the reader.
    func askPresenters(reads: [String], writes: [String], deletes: [String], except pid: Int32?) -> [Ask] {
        let asks = state.withLock { s -> [Ask] in
            var asks: [Ask] = []
            for (_, presenter) in s.presenters.sorted(by: { $0.key < $1.key }) where presenter.pid != pid {
                let key = presenter.key
                let access: PresenterAsk.Access
                if deletes.contains(where: { key == $0 || key.hasPrefix($0 + "/") }) { access = .deleting }
                else if writes.contains(where: { Self.conflicts(key, $0) }) { access = .writing }
                else if reads.contains(where: { Self.conflicts(key, $0) }) { access = .reading }
                else { continue }
                asks.append(Ask(id: s.next, access: access, connection: presenter.connection))
                s.next += 1
            }
            return asks
        }
        guard !asks.isEmpty else { return [] }
        var sent: [Ask] = []
        for ask in asks where ask.connection.send(.relinquish(PresenterAsk(id: ask.id, access: ask.access))) {
            sent.append(ask)
        }
        let deadline = Date().addingTimeInterval(presenterTimeout)
        while true {
            let seen = changed.current
            let open = state.withLock { s in
                sent.contains { ask in !s.answered.contains(ask.id) && s.presenters.values.contains { $0.connection === ask.connection } }
            }
            let left = deadline.timeIntervalSinceNow
            if !open || left <= 0 { break }
            changed.wait(after: seen, seconds: min(left, 0.5))
        }
        state.withLock { s in for ask in sent { s.answered.remove(ask.id) } }
        return sent.filter { $0.access != .deleting }
    }

    /// The access the asks announced has ended: the presenters may take their item back.
    func reacquire(_ asks: [Ask]) {
        for ask in asks { ask.connection.send(.reacquire(ask.id)) }
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
