import Foundation
import UbiquityReplica
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Open files and directory listings.
struct HandleTable: Sendable {
    struct OpenFile: Sendable {
        var ino: UInt64
        var fd: Int32
        var writable: Bool
        /// The node's content epoch when opened: reads of an older epoch may
        /// have put old pages in the kernel's cache (dropped at release).
        var epoch: UInt32 = 0
        /// Opened while a placeholder: reads wait for the download of this
        /// version (up to its size).
        var streamingSize: UInt64?
        var streamingVersion: String?
    }

    struct Listing: Sendable {
        var ino: UInt64
        /// Snapshot of the directory, ordered by cookie (taken at opendir and at rewind).
        var entries: [(name: FileName, ino: UInt64, cookie: UInt64)]
    }

    var nextHandle: UInt64 = 1
    var files: [UInt64: OpenFile] = [:]
    var listings: [UInt64: Listing] = [:]

    mutating func allocate() -> UInt64 {
        defer { nextHandle += 1 }
        return nextHandle
    }
}

extension FileSystem {
    // MARK: - Files

    public func open(ino: UInt64, flags: Int32) throws -> OpenReply {
        let ino = view.swap(ino)
        let node = try replica.withNamespace { ns -> LocalNode in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            return node
        }
        switch node.kind {
        case .directory: throw UbiquityError(EISDIR)
        case .file: break
        default: throw UbiquityError(ENXIO)   // the kernel opens special files itself
        }
        if flags & O_TRUNC != 0 && flags & O_ACCMODE == O_RDONLY {
            // Linux truncates on O_RDONLY|O_TRUNC too (the kernel checked write permission).
            _ = try setAttributes(ino: ino, changes: AttributeChanges(size: 0), handle: nil)
            var opened = try openFile(node: node, flags: flags & ~O_TRUNC)
            opened.keepCache = false
            return opened
        }
        guard node.isPlaceholder else { return try openFile(node: node, flags: flags) }
        var opened: OpenReply
        if flags & O_ACCMODE == O_RDONLY {
            // Return at once; reads wait for the ranges they need.
            opened = try openStreaming(ino: ino, flags: flags)
        } else {
            if flags & O_TRUNC != 0 {
                _ = try setAttributes(ino: ino, changes: AttributeChanges(size: 0), handle: nil)
            } else {
                try hooks.download(ino: ino)
            }
            opened = try openFile(node: node, flags: flags)
        }
        // New content: the kernel must drop pages it may still hold from an older version.
        opened.keepCache = false
        return opened
    }

    func openFile(node: LocalNode, flags: Int32) throws -> OpenReply {
        let ino = node.ino
        let writable = flags & O_ACCMODE != O_RDONLY
        let fd = Glibc.open(replica.cachePath(ino), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            throw UbiquityError(code == ENOENT ? EIO : code, "open cache file of inode \(ino): \(String(cString: strerror(code)))")
        }
        if writable {
            // The "changed" mark (and the new size 0) is committed before the
            // content changes and the open is acknowledged. Truncating frees
            // space, so it may use the reserve; other opens for writing are
            // about to add content.
            let truncating = flags & O_TRUNC != 0
            let now = Timespec.now()
            do {
                try change(truncating ? .mayUseReserve : .grows, notify: false) { ns in
                    guard ns.node(ino) != nil else { throw UbiquityError(ENOENT) }
                    ns.beginContentChange(ino, monotonic: Self.monotonicNow())
                    if truncating { ns.contentChanged(ino, size: 0, time: now, monotonic: Self.monotonicNow()) }
                }
                if truncating { try resizeCacheFile(ino: ino, fd: fd, size: 0) }
            } catch {
                close(fd)
                throw error
            }
        }
        return register(ino: ino, fd: fd, writable: writable)
    }

    /// Open a placeholder for reading while it downloads. If the download
    /// finished (or a newer version replaced it) between starting it and
    /// opening its file, look again: the content is local now, or the newer
    /// version's download starts.
    func openStreaming(ino: UInt64, flags: Int32) throws -> OpenReply {
        for attempt in 0..<50 {
            if attempt > 0 { usleep(5_000) }
            let node = try replica.withNamespace { ns -> LocalNode in
                guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
                return node
            }
            guard node.isPlaceholder else { return try openFile(node: node, flags: flags) }
            let path = hooks.startDownload(ino: ino, background: false)
            let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
            if fd >= 0 {
                return register(ino: ino, fd: fd, writable: false, streaming: (node.hashSize, node.hash))
            }
            guard errno == ENOENT else { throw UbiquityError.posix("open download of inode \(ino)") }
        }
        throw UbiquityError(EIO, "the content of inode \(ino) keeps changing; try again")
    }

    /// Count the open and hand out a handle for `fd`.
    func register(ino: UInt64, fd: Int32, writable: Bool, streaming: (size: UInt64, version: String?)? = nil) -> OpenReply {
        // Keep the kernel's pages only if they were filled from this very content
        // (and by this mount's kernel: asked before the namespace lock is taken).
        let soleView = options.soleView()
        let (epoch, keepCache) = replica.withNamespace { ns -> (UInt32, Bool) in
            let now = Self.monotonicNow()
            var result: (UInt32, Bool) = (0, true)
            ns.updateRuntime(ino) {
                $0.openCount += 1
                $0.lastAccess = now
                if writable { $0.openWriters += 1 }
                result = ($0.contentEpoch, $0.kernelEpoch == $0.contentEpoch && streaming == nil && soleView)
                $0.kernelEpoch = $0.contentEpoch
            }
            return result
        }
        let handle = handles.withLock { table in
            let handle = table.allocate()
            table.files[handle] = HandleTable.OpenFile(ino: ino, fd: fd, writable: writable, epoch: epoch,
                                                       streamingSize: streaming?.size, streamingVersion: streaming?.version)
            return handle
        }
        return OpenReply(handle: handle, keepCache: keepCache)
    }

    func openFileFor(_ handle: UInt64) throws -> HandleTable.OpenFile {
        guard let file = handles.withLock({ $0.files[handle] }) else { throw UbiquityError(EBADF) }
        return file
    }

    public func read(handle: UInt64, offset: Int64, size: Int) throws -> ReadReply {
        let file = try openFileFor(handle)
        if let total = file.streamingSize, UInt64(offset) < total {
            try hooks.waitForContent(ino: file.ino, version: file.streamingVersion, upTo: min(total, UInt64(offset) + UInt64(size)))
        }
        return .fileRange(fd: file.fd, offset: offset, size: size)
    }

    /// Write `count` bytes at `offset`; returns the bytes written.
    public func write(handle: UInt64, offset: Int64, bytes: UnsafeRawPointer, count: Int) throws -> Int {
        let file = try openFileFor(handle)
        guard file.writable else { throw UbiquityError(EBADF) }
        // The last bytes of a full disk are kept for deletions (see `SpaceReserve`).
        try replica.requireRoomForContent()
        var written = 0
        while written < count {
            let n = pwrite(file.fd, bytes + written, count - written, off_t(offset) + off_t(written))
            if n < 0 {
                if errno == EINTR { continue }
                let code = errno
                if written > 0 { break }
                throw UbiquityError(code == ENOSPC || code == EDQUOT || code == EFBIG ? code : EIO,
                                    "write to cache file: \(String(cString: strerror(code)))")
            }
            written += n
        }
        let end = UInt64(offset) + UInt64(written)
        let now = Timespec.now()
        let monotonic = Self.monotonicNow()
        replica.withNamespace { ns in
            guard let node = ns.node(file.ino) else { return }
            ns.contentChanged(file.ino, size: max(node.size, end), time: now, monotonic: monotonic)
        }
        return written
    }

    /// `close(2)` of one file descriptor: what was written is committed.
    public func flush(handle: UInt64) throws {
        let file = try openFileFor(handle)
        if file.writable { try commitContent() }
    }

    public func fsync(handle: UInt64, dataOnly: Bool) throws {
        let file = try openFileFor(handle)
        try syscallRetrying("fsync cache file") { dataOnly ? fdatasync(file.fd) : Glibc.fsync(file.fd) }
        try commitContent()
    }

    public func release(handle: UInt64) throws {
        guard let file = handles.withLock({ $0.files.removeValue(forKey: handle) }) else { throw UbiquityError(EBADF) }
        close(file.fd)
        let dropped = replica.withNamespace { ns -> Bool in
            // Reads through a handle of older content may have refilled the
            // kernel's cache with it: make the next open drop that cache.
            if let node = ns.node(file.ino), node.contentEpoch != file.epoch {
                ns.updateRuntime(file.ino) { $0.kernelEpoch = $0.contentEpoch &- 1 }
            }
            ns.updateRuntime(file.ino) {
                $0.openCount -= 1
                if file.writable {
                    $0.openWriters -= 1
                    $0.lastContentChange = Self.monotonicNow()
                }
            }
            return ns.dropIfUnreferenced(file.ino)
        }
        if dropped { Glibc.unlink(replica.cachePath(file.ino)) }
        if file.writable { try commitContent() }
    }

    public func fallocate(handle: UInt64, mode: Int32, offset: Int64, length: Int64) throws {
        guard mode == 0 else { throw UbiquityError(EOPNOTSUPP) }
        let file = try openFileFor(handle)
        guard file.writable else { throw UbiquityError(EBADF) }
        try replica.requireRoomForContent()
        let rc = posix_fallocate(file.fd, off_t(offset), off_t(length))
        guard rc == 0 else { throw UbiquityError(rc) }
        let end = UInt64(offset + length)
        let now = Timespec.now()
        replica.withNamespace { ns in
            guard let node = ns.node(file.ino), end > node.size else { return }
            ns.contentChanged(file.ino, size: end, time: now, monotonic: Self.monotonicNow())
        }
    }

    // MARK: - Directories

    public func opendir(ino: UInt64) throws -> UInt64 {
        let ino = view.swap(ino)
        let listing = try snapshot(ino)
        return handles.withLock { table in
            let handle = table.allocate()
            table.listings[handle] = listing
            return handle
        }
    }

    func snapshot(_ ino: UInt64) throws -> HandleTable.Listing {
        try replica.withNamespace { ns in
            guard let dir = ns.node(ino) else { throw UbiquityError(ENOENT) }
            guard dir.kind == .directory else { throw UbiquityError(ENOTDIR) }
            let entries = ns.entries(of: ino).map { (name: $0.key, ino: $0.value.ino, cookie: $0.value.cookie) }
            return HandleTable.Listing(ino: ino, entries: entries.sorted { $0.cookie < $1.cookie })
        }
    }

    /// Entries after `offset`, at most `limit`. With `plus`, each real entry
    /// carries attributes and takes a lookup reference; the adapter gives
    /// back (`forget`) the references of entries that did not fit.
    public func readdir(handle: UInt64, offset: Int64, limit: Int, plus: Bool) throws -> [DirectoryEntry] {
        var listing = try handles.withLock { table -> HandleTable.Listing in
            guard let listing = table.listings[handle] else { throw UbiquityError(EBADF) }
            return listing
        }
        if offset == 0 {
            // rewinddir: see the directory as it is now.
            listing = try snapshot(listing.ino)
            let fresh = listing
            handles.withLock { $0.listings[handle] = fresh }
        }
        var out: [DirectoryEntry] = []
        let dirIno = listing.ino
        if offset < 1 {
            out.append(DirectoryEntry(name: ".", ino: view.swap(dirIno), type: UInt32(S_IFDIR), nextOffset: 1, entry: nil))
        }
        if offset < 2 {
            let parent = dirIno == view.root ? dirIno : replica.withNamespace { ns in ns.directoryParent[dirIno] ?? dirIno }
            out.append(DirectoryEntry(name: "..", ino: view.swap(parent), type: UInt32(S_IFDIR), nextOffset: 2, entry: nil))
        }
        // First entry with a cookie above the offset (binary search: entries are sorted).
        var low = 0
        var high = listing.entries.count
        while low < high {
            let mid = (low + high) / 2
            if Int64(listing.entries[mid].cookie) <= offset { low = mid + 1 } else { high = mid }
        }
        replica.withNamespace { ns in
            // Entries removed since the snapshot are skipped (not counted against
            // the limit: an empty answer means the end of the directory).
            for item in listing.entries[low...] {
                if out.count >= limit { break }
                guard let node = ns.node(item.ino), ns.lookup(dirIno, item.name) == item.ino,
                      !(dirIno == view.root && item.name == view.hidden) else { continue }
                var entry: EntryReply?
                if plus {
                    ns.updateRuntime(item.ino) { $0.lookups += 1 }
                    entry = entryReply(node)
                }
                out.append(DirectoryEntry(name: item.name, ino: view.swap(item.ino), type: node.kind.typeBits,
                                          nextOffset: Int64(item.cookie), entry: entry))
            }
        }
        return out
    }

    public func releasedir(handle: UInt64) {
        _ = handles.withLock { $0.listings.removeValue(forKey: handle) }
    }

    /// Namespace changes are committed before each operation returns; this
    /// commits anything still buffered (nothing, normally).
    public func fsyncdir(handle: UInt64) throws {
        try replica.persist()
    }

    // MARK: - Extended attributes

    /// Namespaces stored and pushed. Others are refused with EOPNOTSUPP.
    static func checkXattrName(_ name: String, writing: Bool) throws {
        guard name.hasPrefix("user.") else { throw UbiquityError(EOPNOTSUPP) }
        guard name.utf8.count <= 255 else { throw UbiquityError(ERANGE) }
        if writing && name.hasPrefix("user.ubiquity.") { throw UbiquityError(EPERM, "user.ubiquity.* is reserved for status") }
    }

    static let statusAttributePrefix = "user.ubiquity."
    public static let xattrCreate: Int32 = 1   // XATTR_CREATE
    public static let xattrReplace: Int32 = 2  // XATTR_REPLACE

    public func setxattr(ino: UInt64, name: String, value: Data, flags: Int32) throws {
        let ino = view.swap(ino)
        try Self.checkXattrName(name, writing: true)
        try change(.grows) { ns in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            let exists = node.xattrs[name] != nil
            if flags & Self.xattrCreate != 0 && exists { throw UbiquityError(EEXIST) }
            if flags & Self.xattrReplace != 0 && !exists { throw UbiquityError(ENODATA) }
            let now = Timespec.now()
            ns.update(ino) { $0.xattrs[name] = value; $0.ctime = now }
        }
    }

    /// `user.ubiquity.*` are read-only status attributes computed on demand;
    /// `listxattr` does not list them, so `cp -a` and `rsync -X` never copy them.
    public func getxattr(ino: UInt64, name: String) throws -> Data {
        let ino = view.swap(ino)
        guard name.hasPrefix("user.") else { throw UbiquityError(name.contains(".") ? ENODATA : EOPNOTSUPP) }
        if name.hasPrefix(Self.statusAttributePrefix) {
            guard let value = hooks.statusAttribute(ino: ino, name: name) else { throw UbiquityError(ENODATA) }
            return value
        }
        return try replica.withNamespace { ns in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            guard let value = node.xattrs[name] else { throw UbiquityError(ENODATA) }
            return value
        }
    }

    public func listxattr(ino: UInt64) throws -> [String] {
        let ino = view.swap(ino)
        return try replica.withNamespace { ns in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            return node.xattrs.keys.sorted()
        }
    }

    public func removexattr(ino: UInt64, name: String) throws {
        let ino = view.swap(ino)
        try Self.checkXattrName(name, writing: true)
        try change(.mayUseReserve) { ns in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            guard node.xattrs[name] != nil else { throw UbiquityError(ENODATA) }
            let now = Timespec.now()
            ns.update(ino) { $0.xattrs[name] = nil; $0.ctime = now }
        }
    }

    // MARK: - Filesystem

    /// Space is the space of the disk holding the replica's cache.
    public func statfs() throws -> FilesystemStatistics {
        var st = statvfs()
        try syscallRetrying("statvfs") { statvfs(replica.cacheDirectory.path, &st) }
        let count = replica.withNamespace { ns in UInt64(ns.nodes.count) }
        let filesFree = max(UInt64(st.f_ffree), 1_000_000)
        return FilesystemStatistics(blockSize: UInt64(st.f_bsize), blocks: UInt64(st.f_blocks),
                                    blocksFree: UInt64(st.f_bfree), blocksAvailable: UInt64(st.f_bavail),
                                    files: count + filesFree, filesFree: filesFree, nameMax: UInt64(Self.nameMax))
    }
}
