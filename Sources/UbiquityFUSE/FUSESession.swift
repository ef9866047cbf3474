import CFuse3
import Foundation
import Logging
import Synchronization
import UbiquityFS
import UbiquityStore
import UbiquitySync

/// A libfuse low-level session serving one `MountedFileSystem` at a mountpoint.
///
/// `mount` creates the session and mounts; `run` serves requests on the
/// multi-threaded loop (on the calling thread) until the filesystem is
/// unmounted (`fusermount3 -u`, `umount`) or `stop` is called; then the
/// caller calls `close`. One process may run several sessions, each on its
/// own thread; signals are the caller's business (`stop` each session).
public final class FUSESession: @unchecked Sendable {
    let context: FUSEContext
    public let mountpoint: String
    /// The libfuse session (nil before `mount` and after `close`). Guarded:
    /// threads other than the loop's (pull, downloads, the drive's refresh)
    /// notify the kernel through it, and `close` must not destroy it under
    /// them. Lock order: `state` is a leaf (nothing else is taken under it).
    struct State: @unchecked Sendable {   // the pointer is only used under the lock
        var session: OpaquePointer?
        var mounted = false
    }
    let state = Mutex(State())

    /// Run `body` with the live session, under the lock; nothing if there is none.
    func withSession(_ body: (OpaquePointer) -> Void) {
        state.withLock { s in
            if let se = s.session { body(se) }
        }
    }
    /// The thread running `run`, and whether the loop has returned.
    let loop = Mutex<(thread: pthread_t?, ended: Bool)>((nil, false))

    static let wakeSignal = SIGUSR2

    public init(fileSystem: any MountedFileSystem, mountpoint: String, logger: Logger) {
        context = FUSEContext(fs: fileSystem, logger: logger)
        self.mountpoint = mountpoint
    }

    /// Create the session and mount it. `options` are `-o` mount options.
    public func mount(options: [String]) throws {
        var ops = makeOperations()
        var arguments = ["ubiquityfs"]
        for option in options where !option.isEmpty { arguments += ["-o", option] }
        var cStrings = arguments.map { strdup($0) }
        defer { cStrings.forEach { free($0) } }
        var args = ubq_args_init(Int32(cStrings.count), &cStrings)
        defer { fuse_opt_free_args(&args) }
        let userdata = Unmanaged.passUnretained(context).toOpaque()
        guard let se = fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata) else {
            throw UbiquityError(EINVAL, "invalid FUSE options: \(options.joined(separator: ","))")
        }
        guard fuse_session_mount(se, mountpoint) == 0 else {
            fuse_session_destroy(se)
            throw UbiquityError(EIO, "could not mount FUSE at \(mountpoint) (is /dev/fuse available and fusermount3 installed?)")
        }
        state.withLock { $0 = State(session: se, mounted: true) }
    }

    /// Serve requests until unmounted or stopped. Returns libfuse's status.
    public func run(threads: Int = 16, idleThreads: Int = Int(ProcessInfo.processInfo.environment["UBQ_IDLE_THREADS"] ?? "") ?? 2) -> Int32 {
        // The loop runs outside the lock; `close` (which destroys the session)
        // is only called after `run` returned.
        guard let se = state.withLock({ $0.session }) else { return -1 }
        _ = ubq_install_wake_signal(Self.wakeSignal)
        loop.withLock { $0.thread = pthread_self() }
        let status = ubq_session_loop_mt(se, UInt32(threads), UInt32(idleThreads))
        loop.withLock { $0.ended = true }
        return status
    }

    /// End `run` from another thread: the loop stops taking requests and
    /// returns (then `close` unmounts). The wake-up signal is repeated until
    /// the loop has noticed, since it may arrive just before the loop waits.
    public func stop() {
        var live = false
        withSession { se in
            fuse_session_exit(se)
            live = true
        }
        guard live else { return }
        for _ in 0..<100 {
            let (thread, ended) = loop.withLock { ($0.thread, $0.ended) }
            if ended { return }
            if let thread { pthread_kill(thread, Self.wakeSignal) }
            usleep(50_000)
        }
    }

    /// Drop what the kernel cached about items a pull changed: entries
    /// (names added, removed, replaced) and inodes (attributes, and pages
    /// when the content changed). `kernelIno` maps a replica inode to the
    /// kernel's number (nil: not shown here). Called from the pull thread,
    /// never while a lock of the core is held; errors (the kernel no longer
    /// knows the item) are expected and ignored.
    public func invalidate(_ changes: ReplicaChanges, kernelIno: (UInt64) -> UInt64?) {
        withSession { se in
            for (parent, name) in changes.entries {
                guard let parent = kernelIno(parent) else { continue }
                _ = name.withCString { fuse_lowlevel_notify_inval_entry(se, fuse_ino_t(parent), $0, name.count) }
            }
            for (ino, contentChanged) in changes.nodes {
                guard let ino = kernelIno(ino) else { continue }
                _ = fuse_lowlevel_notify_inval_inode(se, fuse_ino_t(ino), contentChanged ? 0 : -1, 0)
            }
        }
    }

    /// Drop the kernel's entry for `name` in directory `parent` (kernel numbers).
    public func invalidateEntry(parent: UInt64, name: FileName) {
        withSession { se in
            _ = name.withCString { fuse_lowlevel_notify_inval_entry(se, fuse_ino_t(parent), $0, name.count) }
            _ = fuse_lowlevel_notify_inval_inode(se, fuse_ino_t(parent), -1, 0)
        }
    }

    /// Unmount (if still mounted) and free the session (waits for
    /// notifications under way).
    public func close() {
        state.withLock { s in
            guard let se = s.session else { return }
            if s.mounted { fuse_session_unmount(se) }
            fuse_session_destroy(se)
            s = State()
        }
    }
}

/// Unmounting from outside the FUSE loop (the CLI, or the daemon itself
/// after draining): `umount2` as root, `fusermount3 -u` otherwise.
public enum Unmounter {
    public static func unmount(_ mountpoint: String, lazy: Bool) throws {
        if geteuid() == 0 {
            if umount2(mountpoint, lazy ? Int32(MNT_DETACH) : 0) == 0 { return }
            let code = errno
            if code == EBUSY { throw UbiquityError(EBUSY, "\(mountpoint) is busy (a process is using it); close it or use --force") }
            if code != EPERM { throw UbiquityError(code, "unmount \(mountpoint): \(String(cString: strerror(code)))") }
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/fusermount3")
        process.arguments = lazy ? ["-u", "-z", mountpoint] : ["-u", mountpoint]
        let errPipe = Pipe()
        process.standardError = errPipe
        do {
            try process.run()
        } catch {
            throw UbiquityError(ENOENT, "cannot run fusermount3: \(error)")
        }
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            let text = String(decoding: errPipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            throw UbiquityError(EBUSY, "fusermount3: \(text.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
    }

    /// Whether `path` is currently a mountpoint.
    public static func isMountpoint(_ path: String) -> Bool {
        MountTable.entries().contains { $0.mountpoint == path }
    }
}

/// The mounts of this process's namespace, from /proc/self/mountinfo.
public enum MountTable {
    public static func entries() -> [(mountpoint: String, type: String)] {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line in
            // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS…] - TYPE SOURCE SUPEROPTS"
            let halves = line.components(separatedBy: " - ")
            let fields = halves[0].split(separator: " ")
            guard halves.count == 2, fields.count > 4, let type = halves[1].split(separator: " ").first else { return nil }
            return (unescape(String(fields[4])), String(type))
        }
    }

    /// Mountpoints of ubiquityfs mounts.
    public static func ubiquityMounts() -> [String] {
        entries().filter { $0.type == "fuse.ubiquityfs" }.map(\.mountpoint)
    }

    static func unescape(_ s: String) -> String {
        s.replacingOccurrences(of: "\\040", with: " ").replacingOccurrences(of: "\\011", with: "\t")
            .replacingOccurrences(of: "\\012", with: "\n").replacingOccurrences(of: "\\134", with: "\\")
    }
}


