import Foundation
import Logging
import Synchronization
import UbiquityLocks
import UbiquityReplica
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// Makes one mount's kernel raise inotify and fanotify events for changes
/// pulled from other devices, by performing them through the mount.
///
/// FUSE's notifications (`notify_inval_entry`, `notify_delete`,
/// `notify_inval_inode`) drop the kernel's caches and raise no event: only
/// the VFS raises them, on the system calls it serves. So a thread of the
/// daemon (the *replay thread*) makes those calls on its own mountpoint —
/// `openat(O_CREAT|O_EXCL)`, `mkdirat`, `renameat`, `unlinkat`,
/// `ftruncate`, `utimensat` — following a `KernelEventScript`, and the FUSE
/// adapter hands every request that comes from that thread (the kernel names
/// the requesting thread) to `lookup`, `made`, `openReply` and `setattr`
/// here instead of the filesystem (removals and renames it answers itself). The
/// change is already in the replica: these answers change nothing, push
/// nothing and download nothing; a lookup is answered from the script's
/// virtual tree (what the kernel was shown so far), so the kernel sees the
/// name absent before a create and present before a remove or rename.
///
/// Safety: every call is made relative to a descriptor of the mount's root
/// that is checked to be this FUSE mount (its device number), and each
/// folder is opened one name at a time with `O_NOFOLLOW`, checked to be on
/// the same device: a symbolic link or another filesystem mounted inside
/// cannot lead the replay elsewhere. The root is opened per script and
/// closed after it (an open descriptor would make `umount` busy).
///
/// Keeping up: scripts queue here; while more than `maxQueuedSteps` steps
/// wait (50,000), the queue is replaced by one `attrib` per folder it touched (the
/// sign to look at the folder again, like inotify's `IN_Q_OVERFLOW`), and
/// the kernel's entries for everything dropped are invalidated. A step the
/// kernel refuses (a racing program cached the after state: `EEXIST`,
/// `ENOENT`) is retried once after dropping the kernel's entries, then
/// skipped; its entries are invalidated so the kernel asks again.
///
/// Lock order: `queue` and `state` are leaves, never held together, and
/// never held across a system call on the mount (the calls are answered by
/// FUSE workers that take `state`).
public final class KernelEventReplay: Sendable {
    /// Steps that may wait before the queue overflows (`UBIQUITYFS_EVENT_QUEUE_LIMIT` in the
    /// daemon's environment sets it, for tests).
    let maxQueuedSteps = ProcessInfo.processInfo.environment["UBIQUITYFS_EVENT_QUEUE_LIMIT"].flatMap { Int($0) } ?? 50_000
    /// Replay handles are told apart from the filesystem's by this bit (the
    /// drive keeps its container slots below it).
    public static let handleBit: UInt64 = 1 << 63
    /// `O_PATH` (glibc defines it only for _GNU_SOURCE).
    static let openPath: Int32 = 0o10000000
    /// `UTIME_NOW` (a macro Swift does not import).
    static let utimeNow = (1 << 30) - 1

    let mountpoint: String
    let fs: any MountedFileSystem
    /// Drop the kernel's entry `name` in folder `parent` (kernel numbers).
    let invalidate: @Sendable (UInt64, FileName) -> Void
    let logger: Logger

    struct Queue {
        var scripts: [KernelEventScript] = []
        var steps = 0
        var running = false
        var stopping = false
        /// The mount's device number, once started.
        var device: dev_t = 0
        init(running: Bool = false, device: dev_t = 0) {
            self.running = running
            self.device = device
        }
    }
    let queue = Lock(Queue())
    let wake = DispatchSemaphore(value: 0)
    let done = DispatchSemaphore(value: 0)

    /// What the replay thread's requests are answered from.
    /// The replay thread's ID (0: none), read by every FUSE request.
    let thread = Atomic<Int32>(0)

    struct State {
        /// The kernel's view during the current script: what each name it changes holds now.
        var holding: [KernelKey: Holding] = [:]
        /// The step under way: what its create answers.
        var creating: [KernelKey: Holding] = [:]
        var nextHandle: UInt64 = 1
    }
    let state = Lock(State())

    public init(mountpoint: String, fs: any MountedFileSystem, logger: Logger,
                invalidate: @escaping @Sendable (UInt64, FileName) -> Void) {
        self.mountpoint = mountpoint
        self.fs = fs
        self.logger = logger
        self.invalidate = invalidate
    }

    // MARK: - Queue and thread

    /// Start replaying (the mount is up and answers), or again after `stop`.
    /// The mount's root is examined on the replay's own thread: over an
    /// automount trigger, a walk to the mountpoint waits until systemd has
    /// seen the mount finish, which waits for the daemon to say it is ready.
    public func start() {
        let starting = queue.withLock { q -> Bool in
            guard !q.running else { return false }
            q = Queue(running: true)
            return true
        }
        guard starting else { return }
        Thread.run(named: "ubq-events") { [self] in
            var st = stat()
            guard stat(mountpoint, &st) == 0, st.st_ino == 1 else {
                logger.warning("\(mountpoint): no events for remote changes (the mount's root cannot be examined)")
                queue.withLock { $0 = Queue() }
                done.signal()
                return
            }
            queue.withLock { $0.device = st.st_dev }
            run()
        }
    }

    /// Stop: what is queued is dropped, the script under way ends after its
    /// step. With `wait`, wait (at most 2 s) for the thread to let go of the
    /// mount (an unmount must not find it busy); a step's call waiting for a
    /// loop that has ended returns when the session is closed.
    public func stop(wait: Bool) {
        let running = queue.withLock { q -> Bool in
            q.stopping = true
            q.scripts = []
            q.steps = 0
            return q.running
        }
        guard running else { return }
        wake.signal()
        if wait { _ = done.wait(timeout: .now() + 2) }
    }

    public func enqueue(_ script: KernelEventScript) {
        guard !script.isEmpty else { return }
        let (accepted, dropped): (Bool, [KernelEventScript]) = queue.withLock { q in
            guard q.running, !q.stopping else { return (false, []) }
            q.scripts.append(script)
            q.steps += script.steps.count
            guard q.steps > maxQueuedSteps else { return (true, []) }
            // Overflow: one look-again per folder instead of every step.
            let all = q.scripts
            var folders: [[FileName]: Void] = [:]
            var order: [[FileName]] = []
            for step in all.lazy.flatMap(\.steps) where folders.updateValue((), forKey: step.folder) == nil { order.append(step.folder) }
            let rescans = order.map { folder in
                ReplayStep(action: .attrib(KernelPlace(folder: Array(folder.dropLast()), key: folder.last.map { KernelKey(parent: 0, name: $0) })),
                           updates: [])
            }
            q.scripts = [KernelEventScript(steps: rescans)]
            q.steps = rescans.count
            return (true, all)
        }
        if !dropped.isEmpty {
            logger.info("\(mountpoint): \(dropped.reduce(0) { $0 + $1.steps.count }) events for remote changes queued; folders are told to look again instead")
            for script in dropped { invalidateAll(script) }
        }
        if accepted { wake.signal() }
    }

    func run() {
        thread.store(LinuxCalls.threadID, ordering: .releasing)
        defer {
            thread.store(0, ordering: .releasing)
            state.withLock { $0 = State() }
            queue.withLock { $0.running = false }
            done.signal()
        }
        while true {
            wake.wait()
            while let script = queue.withLock({ q -> KernelEventScript? in
                guard !q.stopping, !q.scripts.isEmpty else { return nil }
                let script = q.scripts.removeFirst()
                q.steps -= script.steps.count
                return script
            }) {
                perform(script)
            }
            if queue.withLock({ $0.stopping }) { return }
        }
    }

    // MARK: - Performing a script

    func perform(_ script: KernelEventScript) {
        guard let root = openRoot() else {
            invalidateAll(script)
            return
        }
        defer { close(root) }
        state.withLock { s in s.holding = script.initial }
        var skipped = 0
        for step in script.steps {
            if queue.withLock({ $0.stopping }) { break }
            if !perform(step, root: root) { skipped += 1 }
            state.withLock { s in
                for (key, holding) in step.updates { s.holding[key] = holding }
                s.creating = [:]
            }
        }
        state.withLock { s in s.holding = [:] }
        if skipped > 0 {
            logger.info("\(mountpoint): \(skipped) of \(script.steps.count) events for remote changes not raised (a program looked first, or the call was refused)")
        }
    }

    /// The mount's root, if it is still this FUSE mount.
    func openRoot() -> Int32? {
        let device = queue.withLock { $0.device }
        let fd = Glibc.open(mountpoint, Self.openPath | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_dev == device, st.st_ino == 1 else {
            close(fd)
            return nil
        }
        return fd
    }

    /// Open `folder` below `root` one name at a time, never following a link
    /// or leaving the mount. The caller closes it.
    func openFolder(_ folder: [FileName], root: Int32) -> Int32? {
        let device = queue.withLock { $0.device }
        var fd = dup(root)
        guard fd >= 0 else { return nil }
        for name in folder {
            // O_PATH: opening the folders raises no event of its own.
            let next = name.withCString { openat(fd, $0, Self.openPath | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }
            close(fd)
            guard next >= 0 else { return nil }
            var st = stat()
            guard fstat(next, &st) == 0, st.st_dev == device else {
                close(next)
                return nil
            }
            fd = next
        }
        return fd
    }

    /// Make one step's system call, the kernel's entries for its names
    /// dropped first (a racing lookup may have cached the after state), and
    /// once more if the kernel refused it so. True if it was made.
    func perform(_ step: ReplayStep, root: Int32) -> Bool {
        for _ in 0..<2 {
            for key in keys(of: step) where key.parent != 0 { invalidate(key.parent, key.name) }
            let result = call(step, root: root)
            if result == 0 { return true }
            if result != EEXIST && result != ENOENT && result != ENOTEMPTY && result != EISDIR && result != ENOTDIR { break }
        }
        for key in keys(of: step) where key.parent != 0 { invalidate(key.parent, key.name) }
        return false
    }

    func keys(of step: ReplayStep) -> [KernelKey] {
        switch step.action {
        case .create(let p, _, _, _, _, _), .remove(let p, _): return p.key.map { [$0] } ?? []
        case .rename(let from, let to): return [from.key, to.key].compactMap { $0 }
        case .modify, .attrib: return []
        }
    }

    /// The system call of `step`: 0, or the errno it failed with.
    func call(_ step: ReplayStep, root: Int32) -> Int32 {
        func inFolder(_ place: KernelPlace, _ body: (Int32, FileName?) -> Int32) -> Int32 {
            guard let dir = openFolder(place.folder, root: root) else { return ENOENT }
            defer { close(dir) }
            return body(dir, place.key?.name)
        }
        func check(_ result: Int32) -> Int32 { result < 0 ? errno : 0 }
        switch step.action {
        case .create(let place, let mode, let rdev, let target, let size, let fresh):
            guard let key = place.key else { return EINVAL }
            state.withLock { s in s.creating = [key: step.updates.first { $0.0 == key }?.1 ?? .absent] }
            return inFolder(place) { dir, name in
                name!.withCString { cname in
                    switch mode & UInt32(S_IFMT) {
                    case UInt32(S_IFDIR):
                        return check(mkdirat(dir, cname, mode_t(mode & 0o7777)))
                    case UInt32(S_IFLNK):
                        return check(symlinkat(target.isEmpty ? "." : target, dir, cname))
                    case UInt32(S_IFREG) where fresh:
                        // As a copy makes it: created, written (its size set), closed.
                        let fd = openat(dir, cname, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, mode_t(mode & 0o7777))
                        guard fd >= 0 else { return errno }
                        _ = ftruncate(fd, off_t(size))
                        close(fd)
                        return 0
                    default:
                        return check(mknodat(dir, cname, mode_t(mode), dev_t(rdev)))
                    }
                }
            }
        case .remove(let place, let directory):
            return inFolder(place) { dir, name in
                name!.withCString { check(unlinkat(dir, $0, directory ? AT_REMOVEDIR : 0)) }
            }
        case .rename(let from, let to):
            guard let fromDir = openFolder(from.folder, root: root) else { return ENOENT }
            defer { close(fromDir) }
            guard let toDir = openFolder(to.folder, root: root) else { return ENOENT }
            defer { close(toDir) }
            return from.key!.name.withCString { old in
                to.key!.name.withCString { new in check(renameat(fromDir, old, toDir, new)) }
            }
        case .modify(let place, let size):
            return inFolder(place) { dir, name in
                name!.withCString { cname in
                    let fd = openat(dir, cname, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
                    guard fd >= 0 else {
                        // Not writable here, or held in passthrough by a reader: its times are touched instead.
                        guard errno == EACCES || errno == EPERM || errno == EINVAL else { return errno }
                        var now = [timespec(tv_sec: 0, tv_nsec: Self.utimeNow), timespec(tv_sec: 0, tv_nsec: Self.utimeNow)]
                        return check(utimensat(dir, cname, &now, AT_SYMLINK_NOFOLLOW))
                    }
                    _ = ftruncate(fd, off_t(size))
                    close(fd)
                    return 0
                }
            }
        case .attrib(let place):
            var now = [timespec(tv_sec: 0, tv_nsec: Self.utimeNow), timespec(tv_sec: 0, tv_nsec: Self.utimeNow)]
            return inFolder(place) { dir, name in
                guard let name else {
                    // The folder itself (the mount's root): touched through a descriptor that can.
                    let fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                    guard fd >= 0 else { return errno }
                    defer { close(fd) }
                    return check(futimens(fd, &now))
                }
                return name.withCString { check(utimensat(dir, $0, &now, AT_SYMLINK_NOFOLLOW)) }
            }
        }
    }

    func invalidateAll(_ script: KernelEventScript) {
        var seen = Set<KernelKey>()
        for step in script.steps {
            for key in keys(of: step) where key.parent != 0 && seen.insert(key).inserted { invalidate(key.parent, key.name) }
        }
    }

    // MARK: - Answering the replay thread's requests

    /// Whether a request comes from the replay thread (`pid` as the kernel names the requester).
    public func isReplaying(_ pid: Int32) -> Bool {
        pid != 0 && thread.load(ordering: .acquiring) == pid
    }

    public static func isReplayHandle(_ handle: UInt64) -> Bool { handle & handleBit != 0 }

    /// The entry to answer for `node`: the filesystem's (counted as a lookup),
    /// or, for a node the replica no longer has, one that lives for no time.
    func entry(_ holding: Holding) throws -> EntryReply {
        guard case .node(let ino, let mode) = holding else { throw UbiquityError(ENOENT) }
        if var entry = try? fs.entry(ino: ino) {
            // A deleted node the kernel still holds: it has a name until the step removes it.
            if entry.attributes.nlink == 0 { entry.attributes.nlink = mode & UInt32(S_IFMT) == UInt32(S_IFDIR) ? 2 : 1 }
            return entry
        }
        var attributes = Attributes(ino: ino, mode: mode, nlink: 1, uid: getuid(), gid: getgid(), rdev: 0, size: 0, blocks: 0,
                                    atime: Timespec(sec: 0, nsec: 0), mtime: Timespec(sec: 0, nsec: 0), ctime: Timespec(sec: 0, nsec: 0))
        if mode & UInt32(S_IFMT) == UInt32(S_IFDIR) { attributes.nlink = 2 }
        return EntryReply(ino: ino, attributes: attributes, entryTimeout: 0, attributeTimeout: 0)
    }

    /// LOOKUP: from the virtual tree for the names the script changes, else the filesystem.
    public func lookup(parent: UInt64, name: FileName) throws -> EntryReply {
        let holding = state.withLock { $0.holding[KernelKey(parent: parent, name: name)] }
        guard let holding else { return try fs.lookup(parent: parent, name: name) }
        return try entry(holding)
    }

    /// MKNOD, MKDIR, SYMLINK, CREATE: the node the step puts there.
    public func made(parent: UInt64, name: FileName) throws -> EntryReply {
        let key = KernelKey(parent: parent, name: name)
        let holding = state.withLock { $0.creating[key] ?? $0.holding[key] }
        guard let holding else { throw UbiquityError(EIO, "an event replay made an entry it did not plan") }
        return try entry(holding)
    }

    /// OPEN and the open of CREATE: a handle that reads and writes nothing.
    public func openReply() -> OpenReply {
        let handle = state.withLock { s in
            defer { s.nextHandle += 1 }
            return Self.handleBit | s.nextHandle
        }
        var reply = OpenReply(handle: handle, keepCache: true, acknowledgedWithoutFlush: true)
        reply.kernelIO = .cached
        return reply
    }

    /// SETATTR (the size or times a step sets): the node's attributes as they are.
    public func setattr(ino: UInt64) throws -> Attributes { try fs.getattr(ino: ino) }
}
