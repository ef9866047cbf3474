import Foundation
import UbiquityLocks
import UbiquityReplica
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// The filesystem core: every FUSE operation as a plain Swift method that
/// returns a reply value or throws `UbiquityError` (whose errno the adapter
/// answers). No C binding here; tests drive it without a kernel.
///
/// State lives in the replica's namespace (nodes, entries, lookup and open
/// counts) and in `handles` (open files and directory listings).
///
/// Lock order: `handles` and the replica's locks are never held together —
/// a method takes one, copies what it needs, and lets go. `passthrough` is
/// taken only inside the namespace lock, as a leaf. Nothing here
/// blocks on the store except `open` of a placeholder (which waits for the
/// download on the calling FUSE worker thread, as documented).
///
/// Durability: a change is committed to the index before the method
/// returns, except content writes, which are committed at `flush` (close),
/// `fsync` and `release`. That is what survives `kill -9` of the daemon.
///
/// Failure: a namespace change runs as a replica transaction (`change`):
/// if the index cannot record it, it is taken back and the method throws
/// (`ENOSPC` on a full disk), so a failed operation has no effect, here or
/// in the store. Content I/O on the cache file happens after the commit
/// that announces it, so a crash never leaves modified content that the
/// index believes clean.
///
/// Writes to a file the store has are marked unacknowledged in the index
/// until then (see `Namespace.beginWrite`): a crash in between makes them a
/// recovered copy beside the good version instead of a new version.
public final class FileSystem: Sendable {
    public let replica: Replica
    let hooks: any SyncHooks
    let options: FileSystemOptions
    let handles = Lock(HandleTable())
    /// Inodes with opens the kernel serves in passthrough mode, by inode.
    /// Taken only under the namespace lock, and nothing is taken under it.
    let passthrough = Lock<[UInt64: PassthroughInode]>([:])
    let siblingPrefetch = SiblingPrefetch()
    /// What the kernel of the mount showing this view holds.
    let kernel = KernelReferences()

    public init(replica: Replica, hooks: any SyncHooks, options: FileSystemOptions = FileSystemOptions()) {
        self.replica = replica
        self.hooks = hooks
        self.options = options
    }

    static let nameMax = 255

    // MARK: - Helpers

    var view: ViewRoot { options.view }

    /// Attributes as the kernel sees them (inode numbers through the view).
    func kernelAttributes(_ node: LocalNode) -> Attributes {
        var attributes = node.attributes
        attributes.ino = view.swap(node.ino)
        return attributes
    }

    func entryReply(_ node: LocalNode) -> EntryReply {
        EntryReply(ino: view.swap(node.ino), attributes: kernelAttributes(node),
                   entryTimeout: options.entryTimeout, attributeTimeout: options.attributeTimeout)
    }

    /// The kernel's inode number for replica inode `ino` (for invalidations).
    public func kernelIno(_ ino: UInt64) -> UInt64 { view.swap(ino) }

    /// How this view shows in a mount: at `prefix` below its root, with
    /// `outward` turning this view's inode numbers into the mount's.
    public func kernelView(prefix: [FileName] = [], outward: @escaping @Sendable (UInt64) -> UInt64? = { $0 }) -> KernelView {
        let view = self.view
        return KernelView(root: view.root, hidden: view.hidden, prefix: prefix, kernelIno: { outward(view.swap($0)) })
    }

    /// Refuse names the view keeps for itself, and directories deeper than it allows.
    func checkPlacement(parent: UInt64, name: FileName, directoryHeight: Int?, in ns: Namespace) throws {
        if parent == view.root, let hidden = view.hidden, name == hidden {
            throw UbiquityError(EPERM, "'\(name)' is reserved in this scope")
        }
        if let limit = view.folderLimit, let height = directoryHeight {
            var depth = 0
            var current = parent
            while current != view.root, let up = ns.directoryParent[current], depth < 100_000 {
                depth += 1
                current = up
            }
            if depth + height > limit {
                throw UbiquityError(EPERM, "this container allows \(limit == 0 ? "no folders" : "\(limit) folder level(s)") in Documents")
            }
        }
    }

    /// Levels of directories in the subtree of directory `ino` (itself included).
    func directoryHeight(_ ino: UInt64, in ns: Namespace) -> Int {
        var height = 1
        for entry in ns.entries(of: ino).values where ns.node(entry.ino)?.kind == .directory {
            height = max(height, 1 + directoryHeight(entry.ino, in: ns))
        }
        return height
    }

    /// Make a namespace change as a replica transaction (taken back whole if
    /// the index cannot record it; see `Replica.transaction`), then tell the
    /// sync engine.
    func change<T: Sendable>(_ use: DiskUse, notify: Bool = true, _ body: (inout Namespace) throws -> T) throws -> T {
        replica.foreground.noteChange()
        let value = try replica.transaction(use, body)
        if notify { hooks.localChangeRecorded() }
        return value
    }

    /// Commit what the namespace recorded outside transactions (write marks,
    /// sizes and times from writes) and, with `notify`, tell the sync engine.
    /// Recording bytes already in the cache file may use the space reserve;
    /// if even that fails the records stay queued for the next commit (and a
    /// restart reads the size from the cache file). A mark announcing content
    /// about to be written `.grows` the replica.
    func commit(_ use: DiskUse = .mayUseReserve, notify: Bool = true) throws {
        try replica.persist(use)
        if notify { hooks.localChangeRecorded() }
    }

    static func checkName(_ name: FileName) throws {
        guard !name.isEmpty, name != ".", name != "..", !name.bytes.contains(0x2f) else { throw UbiquityError(EINVAL) }
        guard name.count <= nameMax else { throw UbiquityError(ENAMETOOLONG) }
    }

    // MARK: - Lookup and attributes

    public func lookup(parent: UInt64, name: FileName) throws -> EntryReply {
        let parent = view.swap(parent)
        guard name.count <= Self.nameMax else { throw UbiquityError(ENAMETOOLONG) }
        replica.foreground.note()
        return try replica.record { ns in
            guard let dir = ns.node(parent) else { throw UbiquityError(ENOENT) }
            guard dir.kind == .directory else { throw UbiquityError(ENOTDIR) }
            guard let ino = ns.lookup(parent, name), let node = ns.node(ino),
                  !(parent == view.root && name == view.hidden) else { throw UbiquityError(ENOENT) }
            kernel.hold(ino, in: &ns)
            return entryReply(node)
        }
    }

    /// Whether the view's root holds `name`.
    public func rootHasEntry(_ name: FileName) -> Bool {
        replica.read { ns in ns.lookup(view.root, name) != nil && name != view.hidden }
    }

    /// The view's root as a lookup answers it (taking a lookup reference):
    /// what the drive lists for a container's folder.
    public func rootEntry() throws -> EntryReply {
        try replica.record { ns in
            guard let node = ns.node(view.root) else { throw UbiquityError(ENOENT) }
            kernel.hold(view.root, in: &ns)
            return entryReply(node)
        }
    }

    /// The directory `name` at the container's root, created (owned by
    /// `owner`) if missing. `id` is the same on every device, so two devices
    /// creating it before they sync make one folder, not a conflict.
    public func wellKnownDirectory(_ name: FileName, id: NodeID, owner: Caller) throws -> UInt64 {
        let root = Namespace.rootIno
        func existing(_ ns: Namespace) throws -> UInt64? {
            guard let existing = ns.lookup(root, name) else { return nil }
            guard ns.node(existing)?.kind == .directory else {
                throw UbiquityError(ENOTDIR, "'\(name)' at the container's root is not a folder")
            }
            return existing
        }
        if let ino = try replica.read({ ns in try existing(ns) }) { return ino }
        return try change(.grows) { ns in
            if let ino = try existing(ns) { return ino }
            let now = Timespec.now()
            let ino = ns.createNode(id: ns.inoByID[id] == nil ? id : .next(), kind: .directory,
                                    mode: 0o755, uid: owner.uid, gid: owner.gid, time: now)
            ns.linkEntry(root, name, ino)
            ns.update(root) { $0.mtime = now; $0.ctime = now }
            return ino
        }
    }

    public func entry(ino: UInt64) throws -> EntryReply {
        let ino = view.swap(ino)
        return try replica.record { ns in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            kernel.hold(ino, in: &ns)
            return entryReply(node)
        }
    }

    /// Change the content of `ino` through this view (under the namespace
    /// lock): this kernel's pages that were current stay current, every
    /// other view's become stale (`KernelReferences`). `node`: the node as it
    /// is now, if the caller holds it already (a write: spares a lookup).
    func changeContent(_ ino: UInt64, from node: LocalNode? = nil, written: Range<UInt64>? = nil, in ns: inout Namespace,
                       _ change: (inout Namespace) -> Void) {
        guard let before = node ?? ns.node(ino) else { return change(&ns) }
        change(&ns)
        ns.trackContentChange(ino, from: before, written: written)
        if let after = ns.node(ino) { kernel.changedHere(ino, from: KernelReferences.CachedContent(before), to: after) }
    }

    /// The kernel forgets `count` references to `ino`.
    public func forget(ino: UInt64, count: UInt64) {
        let ino = view.swap(ino)
        let dropped = replica.record { ns in kernel.forget(ino, count: count, in: &ns) }
        if dropped { replica.cache.retire(ino) }
    }

    /// The mount's session ended: give back what its kernel still held (see
    /// `KernelReferences`). Nothing may reach this view afterwards.
    public func releaseKernelReferences() -> KernelRelease {
        let (dropped, held, excess) = replica.record { ns in kernel.releaseAll(in: &ns) }
        for ino in dropped { replica.cache.retire(ino) }
        return KernelRelease(held: held, dropped: dropped.count, excessForgets: excess)
    }

    public func getattr(ino: UInt64) throws -> Attributes {
        let ino = view.swap(ino)
        return try replica.read { ns in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            return kernelAttributes(node)
        }
    }

    public var attributeTimeout: Double { options.attributeTimeout }
    public var entryTimeout: Double { options.entryTimeout }

    public func setattr(ino: UInt64, changes: AttributeChanges, handle: UInt64?) throws -> Attributes {
        kernelAttributes(try setAttributes(ino: view.swap(ino), changes: changes, handle: handle))
    }

    /// `setattr` on replica inode `ino`. A new size is committed with the
    /// other attributes (and the "changed" mark) first; the cache file is
    /// resized after, so a failed commit leaves the content untouched.
    func setAttributes(ino: UInt64, changes: AttributeChanges, handle: UInt64?) throws -> LocalNode {
        if let size = changes.size { try truncate(ino: ino, size: size, handle: handle) }
        let now = Timespec.now()
        return try change(.mayUseReserve) { ns -> LocalNode in
            guard ns.node(ino) != nil else { throw UbiquityError(ENOENT) }
            ns.update(ino) { n in
                if let mode = changes.mode { n.mode = mode & 0o7777 }
                if let uid = changes.uid { n.uid = uid }
                if let gid = changes.gid { n.gid = gid }
                switch changes.atime {
                case .now?: n.atime = now
                case .at(let t)?: n.atime = t
                case nil: break
                }
                switch changes.mtime {
                case .now?: n.mtime = now
                case .at(let t)?: n.mtime = t
                case nil: break
                }
                n.ctime = changes.ctime ?? now
            }
            return ns.node(ino)!
        }
    }

    /// Set the size of file `ino`.
    ///
    /// Through an open writer's descriptor (`ftruncate`) it counts as a
    /// write of that session. By path, it counts as a writer while it runs
    /// — registered in the same critical section that finds the content
    /// local, so an eviction either sees it or happened before — and its
    /// "changing" mark is committed before the cache file is touched.
    ///
    /// Growing a file is content about to be written: refused with `ENOSPC`
    /// while the space reserve is not whole (see `SpaceReserve`).
    func truncate(ino: UInt64, size: UInt64, handle: UInt64?) throws {
        let current = try replica.read { ns -> LocalNode in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            return node
        }
        guard current.kind == .file else { throw UbiquityError(current.kind == .directory ? EISDIR : EINVAL) }
        guard size <= UInt64(Int64.max) else { throw UbiquityError(EFBIG) }
        let use: DiskUse = size > current.size ? .grows : .mayUseReserve
        if use == .grows { try replica.requireRoomForContent() }
        if let handle, let fd = handles.withLock({ $0.files[handle]?.fd }) {
            let mark = replica.record { ns in ns.beginWrite(ino) }
            do {
                if mark { try commit(use, notify: false) }
                try syscallRetrying("truncate") { ftruncate(fd, off_t(size)) }
            } catch {
                replica.record { ns in ns.endWrite(ino) }
                throw error
            }
            let now = Timespec.now()
            replica.record { ns in
                ns.endWrite(ino)
                changeContent(ino, in: &ns) {
                    $0.beginContentChange(ino, monotonic: MonotonicClock.now())
                    $0.contentChanged(ino, size: size, time: now, monotonic: MonotonicClock.now())
                }
            }
            return
        }
        try whileOpening(ino) { try truncateByPath(ino: ino, size: size, use: use) }
    }

    func truncateByPath(ino: UInt64, size: UInt64, use: DiskUse) throws {
        for _ in 0..<Self.contentAttempts {
            let node = try replica.read { ns -> LocalNode in
                guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
                return node
            }
            guard node.kind == .file else { throw UbiquityError(node.kind == .directory ? EISDIR : EINVAL) }
            if node.isPlaceholder {
                if size == 0 {
                    // Nothing of the old content survives: no need to fetch it.
                    close(try replica.cache.create(ino))
                    replica.record { ns in
                        // (A download that finished meanwhile is truncated below all the same.)
                        guard ns.node(ino)?.isPlaceholder == true else { return }
                        ns.update(ino, local: false) { $0.hasContent = true }
                        ns.updateRuntime(ino) { $0.contentEpoch &+= 1 }
                    }
                } else {
                    try hooks.download(ino: ino, beforeWaiting: options.beforeLongWait)
                }
                continue
            }
            let registered = replica.record { ns -> Bool in
                guard ns.node(ino)?.hasContent == true else { return false }
                ns.countWriter(ino)
                changeContent(ino, in: &ns) { $0.beginContentChange(ino, monotonic: MonotonicClock.now()) }
                return true
            }
            guard registered else { continue }
            do {
                try commit(use, notify: false)
                try syscallRetrying("truncate") { Glibc.truncate(replica.cache.path(ino), off_t(size)) }
            } catch {
                replica.record { ns in ns.writerLeft(ino) }
                throw error
            }
            let now = Timespec.now()
            replica.record { ns in
                changeContent(ino, in: &ns) { $0.contentChanged(ino, size: size, time: now, monotonic: MonotonicClock.now()) }
                ns.writerLeft(ino)
            }
            return
        }
        throw UbiquityError(EIO, "the content of inode \(ino) keeps changing; try again")
    }

    public func readlink(ino: UInt64) throws -> String {
        let ino = view.swap(ino)
        return try replica.read { ns in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            guard node.kind == .symlink, let target = node.target else { throw UbiquityError(EINVAL) }
            return target
        }
    }

    // MARK: - Creating nodes

    /// Create a node named `name` in `parent` with the caller as owner
    /// (group from a set-gid parent, which new directories inherit). For a
    /// regular file the cache file is created first (outside the lock, under
    /// a reserved inode number) and its descriptor returned, open read-write.
    /// The node is committed before this returns; if it cannot be, nothing
    /// of it is left (the cache file is removed).
    func makeNode(parent: UInt64, name: FileName, kind: NodeKind, mode: UInt32, caller: Caller,
                  rdev: UInt64 = 0, target: String? = nil) throws -> (node: LocalNode, fd: Int32?) {
        try Self.checkName(name)
        let parent = view.swap(parent)
        var reserved: UInt64?
        var fd: Int32?
        if kind == .file {
            let ino = replica.record { ns in ns.reserveIno() }
            fd = try replica.cache.create(ino)
            reserved = ino
        }
        let node: LocalNode
        do {
            node = try change(.grows) { ns -> LocalNode in
                guard let dir = ns.node(parent) else { throw UbiquityError(ENOENT) }
                guard dir.kind == .directory, !dir.unlinked else { throw UbiquityError(dir.unlinked ? ENOENT : ENOTDIR) }
                try checkPlacement(parent: parent, name: name, directoryHeight: kind == .directory ? 1 : nil, in: ns)
                guard ns.lookup(parent, name) == nil else { throw UbiquityError(EEXIST) }
                var gid = caller.gid
                var permissions = mode & 0o7777
                if dir.mode & UInt32(S_ISGID) != 0 {
                    gid = dir.gid
                    if kind == .directory { permissions |= UInt32(S_ISGID) }
                }
                let now = Timespec.now()
                let ino = ns.createNode(ino: reserved, kind: kind, mode: permissions, uid: caller.uid, gid: gid,
                                        rdev: rdev, target: target, time: now)
                if kind == .file { ns.beginContentChange(ino, monotonic: MonotonicClock.now()) }
                ns.linkEntry(parent, name, ino)
                ns.update(parent) { $0.mtime = now; $0.ctime = now }
                return ns.node(ino)!
            }
        } catch {
            if let fd, let reserved {
                close(fd)
                replica.cache.retire(reserved)
            }
            throw error
        }
        // The kernel's reference, once the node is recorded (a refused change leaves none).
        replica.record { ns in
            kernel.hold(node.ino, in: &ns)
            // Empty, and its name is in the log: an fsync may journal what is written from here.
            if kind == .file { ns.contentOnDisk(node.ino) }
        }
        return (node, fd)
    }

    public func mknod(parent: UInt64, name: FileName, mode: UInt32, rdev: UInt64, caller: Caller) throws -> EntryReply {
        guard let kind = NodeKind(typeBits: mode), kind != .directory, kind != .symlink else { throw UbiquityError(EINVAL) }
        let made = try makeNode(parent: parent, name: name, kind: kind, mode: mode, caller: caller,
                                rdev: (kind == .charDevice || kind == .blockDevice) ? rdev : 0)
        if let fd = made.fd { close(fd) }
        return entryReply(made.node)
    }

    public func mkdir(parent: UInt64, name: FileName, mode: UInt32, caller: Caller) throws -> EntryReply {
        entryReply(try makeNode(parent: parent, name: name, kind: .directory, mode: mode, caller: caller).node)
    }

    public func symlink(target: String, parent: UInt64, name: FileName, caller: Caller) throws -> EntryReply {
        guard target.utf8.count < 4096 else { throw UbiquityError(ENAMETOOLONG) }
        return entryReply(try makeNode(parent: parent, name: name, kind: .symlink, mode: 0o777, caller: caller, target: target).node)
    }

    /// Create and open a new file. Its `close` needs no round trip
    /// (`OpenReply.acknowledgedWithoutFlush`): the node is committed here,
    /// and what is written to it later is in its cache file, which the
    /// replica trusts after a crash for content it has not pushed
    /// (`Replica.recover`). A new file has no pushed version to protect.
    public func create(parent: UInt64, name: FileName, mode: UInt32, flags: Int32, caller: Caller) throws -> (EntryReply, OpenReply) {
        let made = try makeNode(parent: parent, name: name, kind: .file, mode: mode, caller: caller)
        let writable = flags & O_ACCMODE != O_RDONLY
        guard var opened = register(ino: made.node.ino, fd: made.fd!, writable: writable) else {
            close(made.fd!)
            throw UbiquityError(ENOENT)
        }
        opened.acknowledgedWithoutFlush = true
        return (entryReply(made.node), opened)
    }

    public func link(ino: UInt64, newParent: UInt64, newName: FileName) throws -> EntryReply {
        let ino = view.swap(ino)
        let newParent = view.swap(newParent)
        try Self.checkName(newName)
        let node = try change(.grows) { ns -> LocalNode in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            guard node.kind != .directory else { throw UbiquityError(EPERM) }
            guard let dir = ns.node(newParent) else { throw UbiquityError(ENOENT) }
            guard dir.kind == .directory else { throw UbiquityError(ENOTDIR) }
            guard ns.lookup(newParent, newName) == nil else { throw UbiquityError(EEXIST) }
            guard !node.unlinked else { throw UbiquityError(ENOENT) }
            try checkPlacement(parent: newParent, name: newName, directoryHeight: nil, in: ns)
            let now = Timespec.now()
            ns.linkEntry(newParent, newName, ino)
            ns.update(ino) { $0.ctime = now }
            ns.update(newParent) { $0.mtime = now; $0.ctime = now }
            return ns.node(ino)!
        }
        replica.record { ns in kernel.hold(ino, in: &ns) }
        return entryReply(node)
    }

    // MARK: - Removing and renaming

    public func unlink(parent: UInt64, name: FileName) throws {
        let parent = view.swap(parent)
        try remove(parent: parent, name: name, directory: false)
    }

    public func rmdir(parent: UInt64, name: FileName) throws {
        let parent = view.swap(parent)
        try remove(parent: parent, name: name, directory: true)
    }

    func remove(parent: UInt64, name: FileName, directory: Bool) throws {
        let dropped = try change(.mayUseReserve) { ns -> UInt64? in
            guard let ino = ns.lookup(parent, name), let node = ns.node(ino),
                  !(parent == view.root && name == view.hidden) else { throw UbiquityError(ENOENT) }
            if directory {
                guard node.kind == .directory else { throw UbiquityError(ENOTDIR) }
                guard ns.entries(of: ino).isEmpty else { throw UbiquityError(ENOTEMPTY) }
            } else if node.kind == .directory {
                throw UbiquityError(EISDIR)
            }
            let now = Timespec.now()
            ns.unlinkEntry(parent, name)
            ns.update(ino) { $0.ctime = now }
            ns.update(parent) { $0.mtime = now; $0.ctime = now }
            return ns.dropIfUnreferenced(ino) ? ino : nil
        }
        if let dropped { replica.cache.retire(dropped) }
    }

    public func rename(parent: UInt64, name: FileName, newParent: UInt64, newName: FileName, flags: RenameFlags) throws {
        try Self.checkName(newName)
        let parent = view.swap(parent)
        let newParent = view.swap(newParent)
        guard flags.isSubset(of: [.noReplace, .exchange]), flags != [.noReplace, .exchange] else { throw UbiquityError(EINVAL) }
        let dropped = try change(.mayUseReserve) { ns -> UInt64? in
            guard let source = ns.lookup(parent, name), let sourceNode = ns.node(source) else { throw UbiquityError(ENOENT) }
            guard let destinationDir = ns.node(newParent), destinationDir.kind == .directory else { throw UbiquityError(ENOTDIR) }
            let target = ns.lookup(newParent, newName)
            if sourceNode.kind == .directory, try isAncestor(source, of: newParent, in: ns) {
                throw UbiquityError(EINVAL)
            }
            if parent == view.root && name == view.hidden { throw UbiquityError(ENOENT) }
            try checkPlacement(parent: newParent, name: newName,
                               directoryHeight: sourceNode.kind == .directory ? directoryHeight(source, in: ns) : nil, in: ns)
            let now = Timespec.now()
            if flags.contains(.exchange) {
                guard let target, let targetNode = ns.node(target) else { throw UbiquityError(ENOENT) }
                if targetNode.kind == .directory, try isAncestor(target, of: parent, in: ns) { throw UbiquityError(EINVAL) }
                ns.unlinkEntry(parent, name)
                ns.unlinkEntry(newParent, newName)
                ns.linkEntry(newParent, newName, source)
                ns.linkEntry(parent, name, target)
                ns.update(source) { $0.ctime = now }
                ns.update(target) { $0.ctime = now }
                ns.update(parent) { $0.mtime = now; $0.ctime = now }
                ns.update(newParent) { $0.mtime = now; $0.ctime = now }
                return nil
            }
            var replaced: UInt64?
            if let target {
                if target == source { return nil }   // two links to one file: nothing to do
                guard !flags.contains(.noReplace) else { throw UbiquityError(EEXIST) }
                guard let targetNode = ns.node(target) else { throw UbiquityError(EIO) }
                if sourceNode.kind == .directory {
                    guard targetNode.kind == .directory else { throw UbiquityError(ENOTDIR) }
                    guard ns.entries(of: target).isEmpty else { throw UbiquityError(ENOTEMPTY) }
                } else if targetNode.kind == .directory {
                    throw UbiquityError(EISDIR)
                }
                ns.unlinkEntry(newParent, newName)
                ns.update(target) { $0.ctime = now }
                replaced = target
            }
            ns.unlinkEntry(parent, name)
            ns.linkEntry(newParent, newName, source)
            ns.update(source) { $0.ctime = now }
            ns.update(parent) { $0.mtime = now; $0.ctime = now }
            if newParent != parent { ns.update(newParent) { $0.mtime = now; $0.ctime = now } }
            if let replaced, ns.dropIfUnreferenced(replaced) { return replaced }
            return nil
        }
        if let dropped { replica.cache.retire(dropped) }
    }

    /// Whether `ancestor` is `ino` or one of its ancestors (directories have one entry).
    func isAncestor(_ ancestor: UInt64, of ino: UInt64, in ns: Namespace) throws -> Bool {
        var current = ino
        var seen = 0
        while current != Namespace.rootIno {
            if current == ancestor { return true }
            guard let parent = parentOfDirectory(current, in: ns) else { return false }
            current = parent
            seen += 1
            if seen > 100_000 { throw UbiquityError(ELOOP) }
        }
        return ancestor == Namespace.rootIno
    }

    func parentOfDirectory(_ ino: UInt64, in ns: Namespace) -> UInt64? { ns.directoryParent[ino] }
}
