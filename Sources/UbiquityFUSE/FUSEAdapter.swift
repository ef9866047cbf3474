import CFuse3
import CFuseWire
import Foundation
import UbiquityLocks
import Logging
import UbiquityFS
import UbiquityModel

/// The only code that touches libfuse: it translates each low-level request
/// into a call on `FileSystem` and the result into a `fuse_reply_*`.
///
/// Callbacks are one function per operation (`FUSEOperations`), put in the
/// table by `@convention(c)` closures made in a nonisolated function (never
/// at the top level of `main.swift`, where they would be main-actor
/// isolated and trap on libfuse's worker threads). Each finds the
/// `FUSEContext` through `fuse_req_userdata`. Pointers libfuse passes
/// (`name`, `fi`) are copied before the callback returns. No lock of the
/// core is held while replying: the core returns values, then we reply.
final class FUSEContext: Sendable {
    let fs: any MountedFileSystem
    let logger: Logger

    /// What is set once while the session starts and read by every request
    /// after (on libfuse's threads): behind a lock, so that each read sees
    /// the write (a leaf, uncontended once serving).
    struct Wiring {
        weak var session: FUSESession?
        var maxRead: UInt32 = 0
        var deviceFD: Int32 = -1
        var backingFiles: KernelBackingFiles?
        var replay: KernelEventReplay?
    }
    let wiring = Lock(Wiring())
    /// Signalled once the kernel's INIT has been answered by `init`.
    let initialized = DispatchSemaphore(value: 0)

    /// The session serving `fs`, for notifications from a request (set before mounting).
    var session: FUSESession? {
        get { wiring.withLock { $0.session } }
        set { wiring.withLock { $0.session = newValue } }
    }
    /// The `max_read` mount option, if given (set before mounting): `init`
    /// must ask for the same, or libfuse refuses the kernel's INIT.
    var maxRead: UInt32 {
        get { wiring.withLock { $0.maxRead } }
        set { wiring.withLock { $0.maxRead = newValue } }
    }
    /// The session's /dev/fuse descriptor (set before mounting returns).
    var deviceFD: Int32 {
        get { wiring.withLock { $0.deviceFD } }
        set { wiring.withLock { $0.deviceFD = newValue } }
    }
    /// Set by `init` when the kernel agreed to passthrough (read by every `open` after it).
    var backingFiles: KernelBackingFiles? {
        get { wiring.withLock { $0.backingFiles } }
        set { wiring.withLock { $0.backingFiles = newValue } }
    }
    /// The mount's event replay (set before mounting): requests from its
    /// thread are answered by it (see `KernelEventReplay`).
    var replay: KernelEventReplay? {
        get { wiring.withLock { $0.replay } }
        set { wiring.withLock { $0.replay = newValue } }
    }

    init(fs: any MountedFileSystem, logger: Logger) {
        self.fs = fs
        self.logger = logger
    }

    static func from(_ req: fuse_req_t?) -> FUSEContext {
        Unmanaged<FUSEContext>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue()
    }

    /// Run `body`; a thrown error becomes `fuse_reply_err`.
    func serve(_ req: fuse_req_t?, _ operation: StaticString, _ body: () throws -> Void) {
        do {
            try body()
        } catch {
            let e = UbiquityError.wrap(error)
            let code = e.fileOperationErrno
            if code == EIO || !e.message.isEmpty && code != ENOENT && code != EEXIST && code != ENODATA {
                logger.warning("\(operation): \(e)")
            }
            fuse_reply_err(req, code)
        }
    }

    /// The event replay, if `req` comes from its thread.
    func replaying(_ req: fuse_req_t?) -> KernelEventReplay? {
        guard let replay, let c = fuse_req_ctx(req), replay.isReplaying(c.pointee.pid) else { return nil }
        return replay
    }

    static func caller(_ req: fuse_req_t?) -> Caller {
        guard let ctx = fuse_req_ctx(req) else { return .root }
        return Caller(uid: ctx.pointee.uid, gid: ctx.pointee.gid, pid: ctx.pointee.pid)
    }
}

enum Convert {
    static func stat(_ a: Attributes) -> stat {
        var st = Glibc.stat()
        st.st_ino = ino_t(a.ino)
        st.st_mode = mode_t(a.mode)
        st.st_nlink = nlink_t(a.nlink)
        st.st_uid = a.uid
        st.st_gid = a.gid
        st.st_rdev = dev_t(a.rdev)
        st.st_size = off_t(a.size)
        st.st_blksize = blksize_t(Attributes.blockSize)
        st.st_blocks = blkcnt_t(a.blocks)
        ubq_stat_set_times(&st, a.atime.sec, Int(a.atime.nsec), a.mtime.sec, Int(a.mtime.nsec), a.ctime.sec, Int(a.ctime.nsec))
        return st
    }

    static func entry(_ e: EntryReply) -> fuse_entry_param {
        var p = fuse_entry_param()
        p.ino = fuse_ino_t(e.ino)
        p.generation = 1
        p.attr = stat(e.attributes)
        p.attr_timeout = e.attributeTimeout
        p.entry_timeout = e.entryTimeout
        return p
    }

    static func string(_ p: UnsafePointer<CChar>?) -> String { p.map { String(cString: $0) } ?? "" }
    static func name(_ p: UnsafePointer<CChar>?) -> FileName { p.map { FileName(cString: $0) } ?? FileName(bytes: []) }

    static func timespec(_ t: Glibc.timespec) -> Timespec { Timespec(sec: Int64(t.tv_sec), nsec: Int64(t.tv_nsec)) }
}

/// Build the operation table. Every entry forwards to the core.
func makeOperations() -> fuse_lowlevel_ops {
    var ops = fuse_lowlevel_ops()
    ops.`init` = { FUSEOperations.initialize($0, $1) }
    ops.lookup = { FUSEOperations.lookup($0, $1, $2) }
    ops.forget = { FUSEOperations.forget($0, $1, $2) }
    ops.forget_multi = { FUSEOperations.forgetMulti($0, $1, $2) }
    ops.getattr = { FUSEOperations.getattr($0, $1, $2) }
    ops.setattr = { FUSEOperations.setattr($0, $1, $2, $3, $4) }
    ops.readlink = { FUSEOperations.readlink($0, $1) }
    ops.mknod = { FUSEOperations.mknod($0, $1, $2, $3, $4) }
    ops.mkdir = { FUSEOperations.mkdir($0, $1, $2, $3) }
    ops.unlink = { FUSEOperations.unlink($0, $1, $2) }
    ops.rmdir = { FUSEOperations.rmdir($0, $1, $2) }
    ops.symlink = { FUSEOperations.symlink($0, $1, $2, $3) }
    ops.rename = { FUSEOperations.rename($0, $1, $2, $3, $4, $5) }
    ops.link = { FUSEOperations.link($0, $1, $2, $3) }
    ops.open = { FUSEOperations.open($0, $1, $2) }
    ops.create = { FUSEOperations.create($0, $1, $2, $3, $4) }
    ops.read = { FUSEOperations.read($0, $1, $2, $3, $4) }
    ops.write = { FUSEOperations.write($0, $1, $2, $3, $4, $5) }
    ops.flush = { FUSEOperations.flush($0, $1, $2) }
    ops.release = { FUSEOperations.release($0, $1, $2) }
    ops.fsync = { FUSEOperations.fsync($0, $1, $2, $3) }
    ops.fallocate = { FUSEOperations.fallocate($0, $1, $2, $3, $4, $5) }
    ops.opendir = { FUSEOperations.opendir($0, $1, $2) }
    ops.readdir = { FUSEOperations.readdir($0, $1, $2, $3, $4) }
    ops.releasedir = { FUSEOperations.releasedir($0, $1, $2) }
    ops.fsyncdir = { FUSEOperations.fsyncdir($0, $1, $2, $3) }
    ops.statfs = { FUSEOperations.statfs($0, $1) }
    ops.setxattr = { FUSEOperations.setxattr($0, $1, $2, $3, $4, $5) }
    ops.getxattr = { FUSEOperations.getxattr($0, $1, $2, $3) }
    ops.listxattr = { FUSEOperations.listxattr($0, $1, $2) }
    ops.removexattr = { FUSEOperations.removexattr($0, $1, $2) }
    return ops
}

/// The low-level callbacks, one per FUSE operation (the names are libfuse's):
/// each copies what libfuse passes, calls the core, and replies.
enum FUSEOperations {
    static func initialize(_ userdata: UnsafeMutableRawPointer?, _ conn: UnsafeMutablePointer<fuse_conn_info>?) {
        guard let conn else { return }
        let wanted = UInt32(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_ATOMIC_O_TRUNC
                            | FUSE_CAP_PARALLEL_DIROPS
                            | FUSE_CAP_ASYNC_READ | FUSE_CAP_CACHE_SYMLINKS)
        conn.pointee.want |= wanted & conn.pointee.capable
        // Writes may be up to 1 MiB (libfuse's buffer); the kernel sends less if it must.
        conn.pointee.max_write = 1 << 20
        conn.pointee.max_readahead = 1 << 20
        // libfuse takes `max_read` from the mount option and from here, and
        // ends the session at INIT when the two differ.
        guard let userdata else { return }
        let ctx = Unmanaged<FUSEContext>.fromOpaque(userdata).takeUnretainedValue()
        conn.pointee.max_read = ctx.maxRead
        // Passthrough: registering a backing file takes CAP_SYS_ADMIN, so
        // only a daemon running as root asks for it.
        if ubq_init_offers_passthrough() != 0 && geteuid() == 0 && ctx.deviceFD >= 0 {
            ubq_init_accept_passthrough()
            ctx.backingFiles = KernelBackingFiles(deviceFD: ctx.deviceFD, logger: ctx.logger)
        }
        ctx.initialized.signal()
    }

    static func lookup(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        let ctx = FUSEContext.from(req)
        let name = Convert.name(name)
        ReceiveBufferPages.smallRequest()
        let replay = ctx.replaying(req)
        ctx.serve(req, "lookup") {
            do {
                let entry = try replay?.lookup(parent: UInt64(parent), name: name) ?? ctx.fs.lookup(parent: UInt64(parent), name: name)
                var e = Convert.entry(entry)
                fuse_reply_entry(req, &e)
            } catch let error as UbiquityError where error.errno == ENOENT {
                // A negative entry the kernel may cache (invalidated when a pull creates the name).
                var e = fuse_entry_param()
                e.entry_timeout = replay == nil ? ctx.fs.entryTimeout : 0
                fuse_reply_entry(req, &e)
            }
        }
    }

    static func forget(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ count: UInt64) {
        FUSEContext.from(req).fs.forget(ino: UInt64(ino), count: count)
        fuse_reply_none(req)
    }

    static func forgetMulti(_ req: fuse_req_t?, _ count: Int, _ forgets: UnsafeMutablePointer<fuse_forget_data>?) {
        let ctx = FUSEContext.from(req)
        if let forgets {
            for i in 0..<count { ctx.fs.forget(ino: UInt64(forgets[i].ino), count: forgets[i].nlookup) }
        }
        fuse_reply_none(req)
    }

    static func getattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ _: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        ReceiveBufferPages.smallRequest()
        ctx.serve(req, "getattr") {
            var st = Convert.stat(try ctx.fs.getattr(ino: UInt64(ino)))
            fuse_reply_attr(req, &st, ctx.fs.attributeTimeout)
        }
    }

    static func setattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ attr: UnsafeMutablePointer<stat>?, _ toSet: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        let handle = fi.map { UInt64($0.pointee.fh) }
        var changes = AttributeChanges()
        if let attr {
            let a = attr.pointee
            if toSet & FUSE_SET_ATTR_MODE != 0 { changes.mode = UInt32(a.st_mode) }
            if toSet & FUSE_SET_ATTR_UID != 0 { changes.uid = a.st_uid }
            if toSet & FUSE_SET_ATTR_GID != 0 { changes.gid = a.st_gid }
            if toSet & FUSE_SET_ATTR_SIZE != 0 { changes.size = UInt64(a.st_size) }
            if toSet & FUSE_SET_ATTR_ATIME_NOW != 0 { changes.atime = .now }
            else if toSet & FUSE_SET_ATTR_ATIME != 0 { changes.atime = .at(Convert.timespec(a.st_atim)) }
            if toSet & FUSE_SET_ATTR_MTIME_NOW != 0 { changes.mtime = .now }
            else if toSet & FUSE_SET_ATTR_MTIME != 0 { changes.mtime = .at(Convert.timespec(a.st_mtim)) }
            if toSet & FUSE_SET_ATTR_CTIME != 0 { changes.ctime = Convert.timespec(a.st_ctim) }
        }
        let replay = ctx.replaying(req)
        ctx.serve(req, "setattr") {
            let attributes = try replay?.setattr(ino: UInt64(ino)) ?? ctx.fs.setattr(ino: UInt64(ino), changes: changes, handle: handle)
            var st = Convert.stat(attributes)
            fuse_reply_attr(req, &st, ctx.fs.attributeTimeout)
        }
    }

    static func readlink(_ req: fuse_req_t?, _ ino: fuse_ino_t) {
        let ctx = FUSEContext.from(req)
        ctx.serve(req, "readlink") {
            let target = try ctx.fs.readlink(ino: UInt64(ino))
            fuse_reply_readlink(req, target)
        }
    }

    static func mknod(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t, _ rdev: dev_t) {
        let ctx = FUSEContext.from(req)
        let name = Convert.name(name)
        if let replay = ctx.replaying(req) { return reply(req, ctx, "mknod") { try replay.made(parent: UInt64(parent), name: name) } }
        ctx.serve(req, "mknod") {
            var e = Convert.entry(try ctx.fs.mknod(parent: UInt64(parent), name: name, mode: UInt32(mode),
                                                   rdev: UInt64(rdev), caller: FUSEContext.caller(req)))
            fuse_reply_entry(req, &e)
        }
    }

    static func mkdir(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t) {
        let ctx = FUSEContext.from(req)
        let name = Convert.name(name)
        if let replay = ctx.replaying(req) { return reply(req, ctx, "mkdir") { try replay.made(parent: UInt64(parent), name: name) } }
        ctx.serve(req, "mkdir") {
            var e = Convert.entry(try ctx.fs.mkdir(parent: UInt64(parent), name: name, mode: UInt32(mode),
                                                   caller: FUSEContext.caller(req)))
            fuse_reply_entry(req, &e)
        }
    }

    static func unlink(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        let ctx = FUSEContext.from(req)
        let name = Convert.name(name)
        // The replay's removal is already in the replica.
        if ctx.replaying(req) != nil { fuse_reply_err(req, 0); return }
        ctx.serve(req, "unlink") {
            try ctx.fs.unlink(parent: UInt64(parent), name: name)
            fuse_reply_err(req, 0)
        }
    }

    static func rmdir(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        let ctx = FUSEContext.from(req)
        let name = Convert.name(name)
        // The replay's removal is already in the replica.
        if ctx.replaying(req) != nil { fuse_reply_err(req, 0); return }
        ctx.serve(req, "rmdir") {
            try ctx.fs.rmdir(parent: UInt64(parent), name: name)
            fuse_reply_err(req, 0)
        }
    }

    static func symlink(_ req: fuse_req_t?, _ link: UnsafePointer<CChar>?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        let ctx = FUSEContext.from(req)
        let target = Convert.string(link)
        let name = Convert.name(name)
        if let replay = ctx.replaying(req) { return reply(req, ctx, "symlink") { try replay.made(parent: UInt64(parent), name: name) } }
        ctx.serve(req, "symlink") {
            var e = Convert.entry(try ctx.fs.symlink(target: target, parent: UInt64(parent), name: name,
                                                     caller: FUSEContext.caller(req)))
            fuse_reply_entry(req, &e)
        }
    }

    static func rename(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ newParent: fuse_ino_t, _ newName: UnsafePointer<CChar>?, _ flags: UInt32) {
        let ctx = FUSEContext.from(req)
        let name = Convert.name(name)
        let newName = Convert.name(newName)
        if ctx.replaying(req) != nil { fuse_reply_err(req, 0); return }
        ctx.serve(req, "rename") {
            try ctx.fs.rename(parent: UInt64(parent), name: name, newParent: UInt64(newParent), newName: newName,
                              flags: RenameFlags(rawValue: flags))
            fuse_reply_err(req, 0)
        }
    }

    static func link(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ newParent: fuse_ino_t, _ newName: UnsafePointer<CChar>?) {
        let ctx = FUSEContext.from(req)
        let newName = Convert.name(newName)
        if let replay = ctx.replaying(req) { return reply(req, ctx, "link") { try replay.made(parent: UInt64(newParent), name: newName) } }
        ctx.serve(req, "link") {
            var e = Convert.entry(try ctx.fs.link(ino: UInt64(ino), newParent: UInt64(newParent), newName: newName))
            fuse_reply_entry(req, &e)
        }
    }

    static func open(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        ReceiveBufferPages.smallRequest()
        guard let fi else { fuse_reply_err(req, EINVAL); return }
        let flags = fi.pointee.flags
        let replay = ctx.replaying(req)
        ctx.serve(req, "open") {
            let opened = try replay?.openReply() ?? ctx.fs.open(ino: UInt64(ino), flags: flags, backing: ctx.backingFiles)
            fi.pointee.fh = opened.handle
            ubq_fi_set_keep_cache(fi, opened.keepCache ? 1 : 0)
            ubq_fi_set_noflush(fi, opened.acknowledgedWithoutFlush ? 1 : 0)
            switch opened.kernelIO {
            case .cached: break
            case .passthrough(let backing): ubq_next_open_reply(UInt32(UBQ_FOPEN_PASSTHROUGH), backing)
            case .direct(let backing): ubq_next_open_reply(UInt32(UBQ_FOPEN_PASSTHROUGH | UBQ_FOPEN_DIRECT_IO), backing)
            }
            let replied = fuse_reply_open(req, fi)
            ubq_forget_open_reply()
            if replied == -ENOENT {
                // The request was interrupted: nobody will release this handle.
                try? ctx.fs.release(handle: opened.handle)
            }
        }
    }

    static func create(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        guard let fi else { fuse_reply_err(req, EINVAL); return }
        let name = Convert.name(name)
        let flags = fi.pointee.flags
        let replay = ctx.replaying(req)
        ctx.serve(req, "create") {
            let (entry, opened) = try replay.map { (try $0.made(parent: UInt64(parent), name: name), $0.openReply()) }
                ?? ctx.fs.create(parent: UInt64(parent), name: name, mode: UInt32(mode), flags: flags, caller: FUSEContext.caller(req))
            fi.pointee.fh = opened.handle
            ubq_fi_set_keep_cache(fi, opened.keepCache ? 1 : 0)
            ubq_fi_set_noflush(fi, opened.acknowledgedWithoutFlush ? 1 : 0)
            var e = Convert.entry(entry)
            if fuse_reply_create(req, &e, fi) == -ENOENT {
                try? ctx.fs.release(handle: opened.handle)
                ctx.fs.forget(ino: entry.ino, count: 1)
            }
        }
    }

    static func read(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        ReceiveBufferPages.smallRequest()
        guard let fi else { fuse_reply_err(req, EBADF); return }
        let handle = UInt64(fi.pointee.fh)
        if KernelEventReplay.isReplayHandle(handle) { fuse_reply_err(req, EBADF); return }
        ctx.serve(req, "read") {
            switch try ctx.fs.read(handle: handle, offset: Int64(offset), size: size) {
            case .fileRange(let fd, let offset, let size, let passed):
                _ = ubq_reply_fd_range(req, fd, off_t(offset), size)
                // After the reply: the pages of this read are unlocked by now.
                if let passed { ctx.session?.dropCachedPages(ino: ino, passed) }
            case .memory(let pinned, let passed):
                _ = withExtendedLifetime(pinned) {
                    fuse_reply_buf(req, pinned.base.assumingMemoryBound(to: CChar.self), pinned.count)
                }
                if let passed { ctx.session?.dropCachedPages(ino: ino, passed) }
            case .bytes(let bytes, let passed):
                _ = bytes.withUnsafeBytes { fuse_reply_buf(req, $0.baseAddress?.assumingMemoryBound(to: CChar.self), $0.count) }
                if let passed { ctx.session?.dropCachedPages(ino: ino, passed) }
            }
        }
    }

    static func write(_ req: fuse_req_t?, _ _: fuse_ino_t, _ buffer: UnsafePointer<CChar>?, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        guard let fi, let buffer else { fuse_reply_err(req, EBADF); return }
        let handle = UInt64(fi.pointee.fh)
        if KernelEventReplay.isReplayHandle(handle) { fuse_reply_err(req, EBADF); return }
        ctx.serve(req, "write") {
            let written = try ctx.fs.write(handle: handle, offset: Int64(offset), bytes: UnsafeRawPointer(buffer), count: size)
            fuse_reply_write(req, written)
        }
        ReceiveBufferPages.written(UnsafeRawPointer(buffer), count: size)
    }

    static func flush(_ req: fuse_req_t?, _ _: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        ReceiveBufferPages.smallRequest()
        guard let fi else { fuse_reply_err(req, EBADF); return }
        let handle = UInt64(fi.pointee.fh)
        if KernelEventReplay.isReplayHandle(handle) { fuse_reply_err(req, 0); return }
        ctx.serve(req, "flush") {
            try ctx.fs.flush(handle: handle)
            fuse_reply_err(req, 0)
        }
    }

    static func release(_ req: fuse_req_t?, _ _: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        ReceiveBufferPages.smallRequest()
        guard let fi else { fuse_reply_err(req, EBADF); return }
        let handle = UInt64(fi.pointee.fh)
        if KernelEventReplay.isReplayHandle(handle) { fuse_reply_err(req, 0); return }
        ctx.serve(req, "release") {
            try ctx.fs.release(handle: handle)
            fuse_reply_err(req, 0)
        }
    }

    static func fsync(_ req: fuse_req_t?, _ _: fuse_ino_t, _ datasync: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        guard let fi else { fuse_reply_err(req, EBADF); return }
        let handle = UInt64(fi.pointee.fh)
        if KernelEventReplay.isReplayHandle(handle) { fuse_reply_err(req, 0); return }
        ctx.serve(req, "fsync") {
            try ctx.fs.fsync(handle: handle, dataOnly: datasync != 0)
            fuse_reply_err(req, 0)
        }
    }

    static func fallocate(_ req: fuse_req_t?, _ _: fuse_ino_t, _ mode: Int32, _ offset: off_t, _ length: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        guard let fi else { fuse_reply_err(req, EBADF); return }
        let handle = UInt64(fi.pointee.fh)
        if KernelEventReplay.isReplayHandle(handle) { fuse_reply_err(req, EBADF); return }
        ctx.serve(req, "fallocate") {
            try ctx.fs.fallocate(handle: handle, mode: mode, offset: Int64(offset), length: Int64(length))
            fuse_reply_err(req, 0)
        }
    }

    static func opendir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        guard let fi else { fuse_reply_err(req, EINVAL); return }
        ctx.serve(req, "opendir") {
            fi.pointee.fh = try ctx.fs.opendir(ino: UInt64(ino))
            switch ctx.fs.listingCache(ino: UInt64(ino)) {
            case .off: break
            case .refill: fi.pointee.cache_readdir = 1
            case .keep:
                fi.pointee.cache_readdir = 1
                fi.pointee.keep_cache = 1
            }
            if fuse_reply_open(req, fi) == -ENOENT { ctx.fs.releasedir(handle: fi.pointee.fh) }
        }
    }

    static func readdir(_ req: fuse_req_t?, _ _: fuse_ino_t, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        listDirectory(req, size: size, offset: offset, fi: fi)
    }

    static func releasedir(_ req: fuse_req_t?, _ _: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        if let fi { ctx.fs.releasedir(handle: UInt64(fi.pointee.fh)) }
        fuse_reply_err(req, 0)
    }

    static func fsyncdir(_ req: fuse_req_t?, _ _: fuse_ino_t, _ _: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        let ctx = FUSEContext.from(req)
        ctx.serve(req, "fsyncdir") {
            try ctx.fs.fsyncdir(handle: UInt64(fi?.pointee.fh ?? 0))
            fuse_reply_err(req, 0)
        }
    }

    static func statfs(_ req: fuse_req_t?, _ _: fuse_ino_t) {
        let ctx = FUSEContext.from(req)
        ctx.serve(req, "statfs") {
            let s = try ctx.fs.statfs()
            var st = statvfs()
            st.f_bsize = UInt(s.blockSize)
            st.f_frsize = UInt(s.blockSize)
            st.f_blocks = fsblkcnt_t(s.blocks)
            st.f_bfree = fsblkcnt_t(s.blocksFree)
            st.f_bavail = fsblkcnt_t(s.blocksAvailable)
            st.f_files = fsfilcnt_t(s.files)
            st.f_ffree = fsfilcnt_t(s.filesFree)
            st.f_favail = fsfilcnt_t(s.filesFree)
            st.f_namemax = UInt(s.nameMax)
            fuse_reply_statfs(req, &st)
        }
    }

    static func setxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ value: UnsafePointer<CChar>?, _ size: Int, _ flags: Int32) {
        let ctx = FUSEContext.from(req)
        let name = Convert.string(name)
        let data = value.map { Data(bytes: $0, count: size) } ?? Data()
        ctx.serve(req, "setxattr") {
            try ctx.fs.setxattr(ino: UInt64(ino), name: name, value: data, flags: flags)
            fuse_reply_err(req, 0)
        }
    }

    static func getxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ size: Int) {
        let ctx = FUSEContext.from(req)
        let name = Convert.string(name)
        ctx.serve(req, "getxattr") {
            try replyXattr(req, Array(try ctx.fs.getxattr(ino: UInt64(ino), name: name)), size: size)
        }
    }

    static func listxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int) {
        let ctx = FUSEContext.from(req)
        ctx.serve(req, "listxattr") {
            var list = [UInt8]()
            for name in try ctx.fs.listxattr(ino: UInt64(ino)) { list += Array(name.utf8) + [0] }
            try replyXattr(req, list, size: size)
        }
    }

    static func removexattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        let ctx = FUSEContext.from(req)
        let name = Convert.string(name)
        ctx.serve(req, "removexattr") {
            try ctx.fs.removexattr(ino: UInt64(ino), name: name)
            fuse_reply_err(req, 0)
        }
    }
}

/// Answer an entry made by the event replay (`KernelEventReplay.made`).
func reply(_ req: fuse_req_t?, _ ctx: FUSEContext, _ operation: StaticString, _ body: () throws -> EntryReply) {
    ctx.serve(req, operation) {
        var e = Convert.entry(try body())
        fuse_reply_entry(req, &e)
    }
}

/// The xattr reply protocol: size 0 asks for the length; a smaller buffer is ERANGE.
func replyXattr(_ req: fuse_req_t?, _ bytes: [UInt8], size: Int) throws {
    if size == 0 {
        fuse_reply_xattr(req, bytes.count)
    } else if size < bytes.count {
        throw UbiquityError(ERANGE)
    } else {
        _ = bytes.withUnsafeBytes { fuse_reply_buf(req, $0.baseAddress?.assumingMemoryBound(to: CChar.self), $0.count) }
    }
}

/// readdir: fill one reply buffer of at most `size` bytes. There is no
/// readdirplus (DESIGN.md, "What the kernel keeps").
func listDirectory(_ req: fuse_req_t?, size: Int, offset: off_t, fi: UnsafeMutablePointer<fuse_file_info>?) {
    let ctx = FUSEContext.from(req)
    guard let fi else { fuse_reply_err(req, EBADF); return }
    let handle = UInt64(fi.pointee.fh)
    ctx.serve(req, "readdir") {
        let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: size)
        defer { buffer.deallocate() }
        var used = 0
        try ctx.fs.readdir(handle: handle, offset: Int64(offset)) { item in
            // libfuse takes a NUL-terminated name.
            let needed = withUnsafeTemporaryAllocation(of: CChar.self, capacity: item.name.count + 1) { name in
                let name = name.baseAddress!
                if let bytes = item.name.baseAddress { memcpy(name, bytes, item.name.count) }
                name[item.name.count] = 0
                var st = Glibc.stat()
                st.st_ino = ino_t(item.ino)
                st.st_mode = mode_t(item.type)
                return fuse_add_direntry(req, buffer + used, size - used, name, &st, off_t(item.nextOffset))
            }
            guard needed <= size - used else { return false }
            used += needed
            return true
        }
        fuse_reply_buf(req, buffer, used)
    }
}
