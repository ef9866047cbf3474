import CFuse3
import CFuseWire
import Foundation
import Logging
import UbiquityLocks
import UbiquityFS
import UbiquityLocator
import UbiquityModel
import UbiquityLinux
import UbiquityReplica

/// A libfuse low-level session serving one `MountedFileSystem` at a mountpoint.
///
/// `mount` creates the session and mounts; `run` serves requests on
/// CFuseWire's loop (`fuseloop.h`, from the calling thread) until the filesystem is
/// unmounted (`fusermount3 -u`, `umount`) or `stop` is called; then the
/// caller calls `close`. One process may run several sessions, each on its
/// own thread; signals are the caller's business (`stop` each session).
public final class FUSESession: @unchecked Sendable {
    let context: FUSEContext
    public let mountpoint: String
    /// The libfuse session (nil before `mount` and after `close`). Guarded:
    /// threads other than the loop's (pull, downloads, the drive's refresh)
    /// notify the kernel through it, and `close` must not destroy it under
    /// them. The guard is a reader-writer lock, not a mutex: notifiers hold
    /// it *shared*. A notification can block in the kernel on a page lock held
    /// by a READ that waits for a download, and that download's own
    /// notification must still get through, or the three wait for each other
    /// for good. `mount` and `close` hold it exclusively (glibc's default
    /// rwlock prefers readers, so a waiting `close` never stalls notifiers).
    /// Lock order: it is a leaf (nothing else is taken under it).
    struct State: @unchecked Sendable {   // the pointer is only used under the lock
        var session: OpaquePointer?
        var mounted = false
    }
    private var stateValue = State()
    private let stateLock: UnsafeMutablePointer<pthread_rwlock_t> = {
        let lock = UnsafeMutablePointer<pthread_rwlock_t>.allocate(capacity: 1)
        pthread_rwlock_init(lock, nil)
        return lock
    }()

    func readState<R>(_ body: (State) -> R) -> R {
        pthread_rwlock_rdlock(stateLock)
        defer { pthread_rwlock_unlock(stateLock) }
        return body(stateValue)
    }

    func writeState<R>(_ body: (inout State) -> R) -> R {
        pthread_rwlock_wrlock(stateLock)
        defer { pthread_rwlock_unlock(stateLock) }
        return body(&stateValue)
    }

    /// Run `body` with the live session, the lock held shared; nothing if there is none.
    func withSession(_ body: (OpaquePointer) -> Void) {
        readState { s in
            if let se = s.session { body(se) }
        }
    }

    deinit {
        pthread_rwlock_destroy(stateLock)
        stateLock.deallocate()
    }

    /// The thread running `run`, and whether the loop has returned.
    let loop = Lock<(thread: pthread_t?, ended: Bool)>((nil, false))

    static let wakeSignal = SIGUSR2

    public init(fileSystem: any MountedFileSystem, mountpoint: String, logger: Logger) {
        context = FUSEContext(fs: fileSystem, logger: logger)
        self.mountpoint = mountpoint
        context.session = self
    }

    /// Create the session and mount it. `options` are `-o` mount options.
    /// A refusal says why: what libfuse and fusermount3 wrote about it (they
    /// write to stderr, which in the daemon is its log) becomes the message.
    public func mount(options: [String]) throws {
        var ops = makeOperations()
        var arguments = ["ubiquityfs"]
        for option in options where !option.isEmpty { arguments += ["-o", option] }
        context.maxRead = Self.maxRead(in: options)
        var cStrings = arguments.map { strdup($0) }
        defer { cStrings.forEach { free($0) } }
        var args = ubq_args_init(Int32(cStrings.count), &cStrings)
        defer { fuse_opt_free_args(&args) }
        let userdata = Unmanaged.passUnretained(context).toOpaque()
        var se: OpaquePointer?
        var mounted = false
        let said = Self.capturingStderr {
            se = fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata)
            if let se { mounted = fuse_session_mount(se, mountpoint) == 0 }
        }
        let reason = said.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            .joined(separator: "; ")
        guard let se else {
            throw UbiquityError(EINVAL, "invalid FUSE options \(options.joined(separator: ","))\(reason.isEmpty ? "" : ": \(reason)")")
        }
        guard mounted else {
            fuse_session_destroy(se)
            throw Self.mountError(mountpoint, reason: reason)
        }
        // The session's device I/O goes through CFuseWire, which adds
        // passthrough to INIT and OPEN replies (libfuse 3.14 cannot).
        var io = fuse_custom_io(writev: ubq_io_writev, read: ubq_io_read, splice_receive: nil,
                                splice_send: ubq_io_splice_send)
        context.deviceFD = fuse_session_fd(se)
        if fuse_session_custom_io(se, &io, context.deviceFD) != 0 {
            context.deviceFD = -1   // plain libfuse I/O, no passthrough
        }
        writeState { $0 = State(session: se, mounted: true) }
        raiseReadAhead()
    }

    /// The kernel reads ahead in a FUSE mount 128 KiB at a time (the default
    /// of its `bdi`; `max_readahead` can only lower it), so a sequential
    /// read is a FUSE request, a thread wake-up and a splice per 128 KiB.
    /// At 512 KiB a cold 1 GiB read measured 910–1,070 MiB/s against
    /// 600–900 (backing store in RAM, alternating runs); at 1 MiB libfuse
    /// no longer splices (its pipe is too small) and it measured 540–600.
    /// Only root may change it (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`):
    /// for other users the default stays. A larger value set by hand is kept.
    static let readAheadKiB = 512

    func raiseReadAhead() {
        guard let device = Self.mountDevice(of: mountpoint) else { return }
        let path = "/sys/class/bdi/\(device)/read_ahead_kb"
        guard let current = (try? LinuxCalls.readWhole(path)).flatMap({ Int(String(decoding: $0, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) }),
              current < Self.readAheadKiB else { return }
        let fd = open(path, O_WRONLY | O_CLOEXEC)
        let written = fd >= 0 && "\(Self.readAheadKiB)\n".withCString { write(fd, $0, strlen($0)) } > 0
        let code = errno
        if fd >= 0 { Glibc.close(fd) }
        if !written {
            context.logger.debug("read-ahead of \(mountpoint) stays \(current) KiB: \(String(cString: strerror(code)))")
        }
    }

    /// The device number ("MAJOR:MINOR") of the mount at `mountpoint`, from
    /// /proc/self/mountinfo (the last mount there is on top). Not `stat`:
    /// that would ask this very session, whose loop is not running yet.
    static func mountDevice(of mountpoint: String) -> String? {
        guard let data = try? LinuxCalls.readWhole("/proc/self/mountinfo") else { return nil }
        // mountinfo writes space, tab, newline and backslash as octal escapes.
        var escaped = ""
        for c in mountpoint.unicodeScalars {
            switch c {
            case " ": escaped += "\\040"
            case "\t": escaped += "\\011"
            case "\n": escaped += "\\012"
            case "\\": escaped += "\\134"
            default: escaped.unicodeScalars.append(c)
            }
        }
        var device: String?
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            if fields.count > 4, fields[4] == escaped { device = String(fields[2]) }
        }
        return device
    }

    /// Why a mount failed, from what libfuse or fusermount3 said, with what
    /// to do about the usual causes of an ordinary user's failure.
    static func mountError(_ mountpoint: String, reason: String) -> UbiquityError {
        var hint = ""
        if reason.contains("/dev/fuse") && (reason.contains("ermission denied") || reason.contains("not permitted")) {
            hint = " (an ordinary user needs read and write access to /dev/fuse, normally mode 0666)"
        } else if reason.contains("device not found") {
            hint = " (the kernel has no FUSE: modprobe fuse)"
        } else if reason.contains("fusermount3") && reason.contains("No such file") {
            hint = " (ordinary users mount through fusermount3: install fuse3)"
        }
        if reason.isEmpty {
            return UbiquityError(EIO, "could not mount FUSE at \(mountpoint) (libfuse gave no reason)")
        }
        return UbiquityError(EIO, "could not mount FUSE at \(mountpoint): \(reason)\(hint)")
    }

    /// Run `body` with stderr (fd 2) sent to a pipe; returns what was written
    /// there meanwhile (up to the pipe's 64 KiB), and puts stderr back.
    /// Mounting is rare and short, so other threads' stderr lines in that
    /// window (the log goes to its own descriptor) are an acceptable loss.
    static func capturingStderr(_ body: () -> Void) -> String {
        var fds: [Int32] = [0, 0]
        let saved = dup(STDERR_FILENO)
        guard saved >= 0, pipe(&fds) == 0 else {
            if saved >= 0 { Glibc.close(saved) }
            body()
            return ""
        }
        for fd in fds {
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd, F_SETFL, O_NONBLOCK)   // never wait for a child that keeps it open
        }
        fflush(nil)
        dup2(fds[1], STDERR_FILENO)
        Glibc.close(fds[1])
        body()
        fflush(nil)
        dup2(saved, STDERR_FILENO)
        Glibc.close(saved)
        var output = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(fds[0], &buffer, buffer.count)
            if n <= 0 { break }
            output.append(contentsOf: buffer[0..<n])
        }
        Glibc.close(fds[0])
        if !output.isEmpty { FileHandle.standardError.write(output) }   // the log keeps it too
        return String(decoding: output, as: UTF8.self)
    }

    /// The last `max_read=N` among comma-separated mount options (0: none,
    /// or not a number libfuse would take either).
    static func maxRead(in options: [String]) -> UInt32 {
        var value: UInt32 = 0
        for option in options.flatMap({ $0.split(separator: ",") }) where option.hasPrefix("max_read=") {
            value = UInt32(option.dropFirst("max_read=".count)) ?? 0
        }
        return value
    }

    /// For `FileSystemOptions.beforeLongWait`: if the calling thread is the
    /// loop's reader, another worker takes over reading the requests
    /// before it waits (`CFuseWire/fuseloop.h`); on any other thread, nothing.
    public static let beforeLongWait: @Sendable () -> Void = { ubq_loop_may_block() }

    /// Serve requests until unmounted or stopped. Returns 0 or the -errno
    /// that ended the session.
    ///
    /// The loop is CFuseWire's (`fuseloop.h`): the worker that answered a
    /// request reads the next one, and hands the reading over before it
    /// waits (`beforeLongWait`); at most `threads` workers. libfuse's own loop
    /// woke a different worker for every request.
    public func run(threads: Int = 16) -> Int32 {
        // The loop runs outside the lock; `close` (which destroys the session)
        // is only called after `run` returned.
        guard let se = readState({ $0.session }) else { return -1 }
        _ = ubq_install_wake_signal(Self.wakeSignal)
        loop.withLock { $0.thread = pthread_self() }
        let status = ubq_session_loop(se, UInt32(threads), Self.wakeSignal)
        loop.withLock { $0.ended = true }
        return status
    }

    /// Whether the kernel and the loop serve this mount: one `statfs` of the
    /// mountpoint, which waits for the kernel's INIT to be answered. Nil when
    /// it is answered by this file system; otherwise what went wrong (the
    /// loop ended, the kernel refused the INIT reply). Call with `run`
    /// going on another thread.
    public func firstRoundTrip() -> String? {
        // Mounted over an automount trigger (fstab's x-systemd.automount): the
        // path is not walked — the walk would wait for systemd, which waits for
        // this mount — so the round trip is the kernel's INIT, answered.
        let stacked = MountTable.entries().filter { $0.mountpoint == mountpoint }
        if stacked.dropLast().contains(where: { $0.type == "autofs" }) {
            guard context.initialized.wait(timeout: .now() + 10) == .success else { return "the kernel's INIT did not come" }
            return stacked.last?.type.hasPrefix("fuse") == true ? nil : "the mountpoint is not a FUSE mount"
        }
        let type = LinuxCalls.filesystemType(mountpoint)
        if type == -1 { return String(cString: strerror(errno)) }
        let fuseMagic = 0x6573_5546
        return type == fuseMagic ? nil : "the mountpoint is not a FUSE mount"
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
            var folders = Set<UInt64>()
            for (parent, name) in changes.entries {
                guard let parent = kernelIno(parent) else { continue }
                _ = name.withCString { fuse_lowlevel_notify_inval_entry(se, fuse_ino_t(parent), $0, name.count) }
                folders.insert(parent)
            }
            // A folder's listing the kernel keeps (`cache_readdir`) is in its pages.
            for folder in folders { _ = fuse_lowlevel_notify_inval_inode(se, fuse_ino_t(folder), 0, 0) }
            for (ino, contentChanged) in changes.nodes {
                guard let ino = kernelIno(ino) else { continue }
                _ = fuse_lowlevel_notify_inval_inode(se, fuse_ino_t(ino), contentChanged ? 0 : -1, 0)
            }
        }
    }

    /// Let the kernel free its cached pages of `range` of inode `ino` (the
    /// kernel's number): a reader streamed past them (`ReadReply`). Called
    /// by the READ that passed them, after its reply: a page under a read
    /// still waiting is locked, and this waits for such pages. The reading
    /// is handed over first: another program's READ of one of them may be
    /// waiting to be read from the device.
    func dropCachedPages(ino: fuse_ino_t, _ range: Range<Int64>) {
        ubq_loop_may_block()
        withSession { se in _ = fuse_lowlevel_notify_inval_inode(se, ino, off_t(range.lowerBound), off_t(range.count)) }
    }

    /// The mount's event replay: set before `mount`, it answers the requests
    /// of its own thread (`KernelEventReplay`).
    public var events: KernelEventReplay? {
        get { context.replay }
        set { context.replay = newValue }
    }

    /// Drop the kernel's entry for `name` in directory `parent` (kernel
    /// numbers), and nothing else.
    public func dropEntry(parent: UInt64, name: FileName) {
        withSession { se in
            _ = name.withCString { fuse_lowlevel_notify_inval_entry(se, fuse_ino_t(parent), $0, name.count) }
        }
    }

    /// The filesystem this session serves.
    public var fileSystem: any MountedFileSystem { context.fs }

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
        writeState { s in
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

