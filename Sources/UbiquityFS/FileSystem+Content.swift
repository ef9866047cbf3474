import Foundation
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityLinux
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
        /// A streaming reader's run: what the kernel may drop behind it.
        var run = StreamedRun()
        /// Passthrough or direct: counted in `FileSystem.passthrough`, with the registry to release it to.
        var kernelIO = KernelIO.cached
        var backing: (any BackingFiles)?
    }

    struct Listing: Sendable {
        var ino: UInt64
        /// Snapshot of the directory (copy-on-write: nothing is copied unless
        /// it changes), taken at the first read and at each rewind; nil before.
        var directory: Directory?
        /// Its positions in cookie order.
        var order: [Int] = []
        /// The folder's listing stamp when taken: while it holds, every entry
        /// of the snapshot is still in the folder.
        var stamp: UInt64 = 0
    }

    var nextHandle: UInt64 = 1
    var files: [UInt64: OpenFile] = [:]
    var listings: [UInt64: Listing] = [:]

    mutating func allocate() -> UInt64 {
        defer { nextHandle += 1 }
        return nextHandle
    }
}

/// The opens of one inode the kernel serves in passthrough mode
/// (`FileSystem.chooseKernelIO`).
struct PassthroughInode: Sendable {
    /// The cache file's registration with the kernel, shared by these opens.
    var backing: Int32
    /// The content epoch it was registered for.
    var epoch: UInt32
    /// Opens in passthrough or direct mode not yet released.
    var opens: Int
    /// A writer was among them.
    var wrote = false
}

/// A streaming reader of a placeholder, and how much of its run the kernel
/// may forget.
///
/// The kernel caches a placeholder's bytes for the mounted file as the
/// reader gets them, although the daemon can serve them again (from the
/// cache file, or on a folder store from the chunks its download holds or
/// fetches again). Behind a reader that streams, the pages it passed are
/// given back, so the rest of the stream reuses warm memory instead of
/// touching fresh (dear on a VM whose host takes back free memory:
/// bench/RESULTS.md, "Chunked content and streaming downloads", has the figures). A random reader never
/// builds a run longer than `lag` and drops nothing.
struct StreamedRun: Sendable {
    /// Kept behind the furthest byte read: what the kernel's read-ahead and
    /// a reader that steps back a little still use.
    static let lag: Int64 = 16 << 20
    /// Given back at a time (one notification to the kernel each).
    static let step: Int64 = 8 << 20

    /// How far out of order a read may be and still continue the run: the
    /// kernel's read-ahead requests arrive out of order on several threads.
    /// A read further than this from the run's end begins a new run.
    static let slack: Int64 = 2 << 20

    /// The furthest byte of the run read so far.
    var end: Int64 = 0
    /// Where the part not dropped yet begins (at first, where the run began).
    var passedUpTo: Int64 = 0

    /// Note a read; the range the kernel may drop now, if any.
    mutating func read(offset: Int64, size: Int) -> Range<Int64>? {
        let readEnd = offset + Int64(size)
        if offset >= end - Self.slack && offset <= end + Self.slack {
            end = max(end, readEnd)
        } else {
            (end, passedUpTo) = (readEnd, offset)
        }
        let upTo = (end - Self.lag) / Self.step * Self.step
        guard upTo - passedUpTo >= Self.step else { return nil }
        defer { passedUpTo = upTo }
        return passedUpTo..<upTo
    }
}

extension FileSystem {
    // MARK: - Files

    /// How often an open (or a truncation) looks again after losing a race
    /// with an eviction, a download or a newer version replacing the content.
    static let contentAttempts = 50

    public func open(ino: UInt64, flags: Int32, backing: (any BackingFiles)? = nil) throws -> OpenReply {
        let ino = view.swap(ino)
        let kind = try replica.read { ns -> NodeKind in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            return node.kind
        }
        switch kind {
        case .directory: throw UbiquityError(EISDIR)
        case .file: break
        default: throw UbiquityError(ENXIO)   // the kernel opens special files itself
        }
        if flags & O_TRUNC != 0 && flags & O_ACCMODE == O_RDONLY {
            // Linux truncates on O_RDONLY|O_TRUNC too (the kernel checked write permission).
            try truncate(ino: ino, size: 0, handle: nil)
            try commit()
            var opened = try openContent(ino: ino, flags: flags & ~O_TRUNC, backing: backing)
            opened.keepCache = false
            return opened
        }
        return try openContent(ino: ino, flags: flags, backing: backing)
    }

    /// Open the content of file `ino`: its cache file when local; a
    /// placeholder opened for reading returns at once and streams, opened
    /// for writing is downloaded first (or made empty, with `O_TRUNC`).
    /// An open that loses a race (the content evicted, downloaded or replaced
    /// between looking at the node and counting the open) looks again.
    func openContent(ino: UInt64, flags: Int32, backing: (any BackingFiles)?) throws -> OpenReply {
        try whileOpening(ino) { try openContentOnce(ino: ino, flags: flags, backing: backing) }
    }

    /// Run `body` counted as an open under way on `ino` (`ContentOpens.swift`):
    /// eviction refuses meanwhile.
    func whileOpening<T>(_ ino: UInt64, _ body: () throws -> T) throws -> T {
        replica.record { ns in ns.beginOpening(ino) }
        defer { replica.record { ns in ns.endOpening(ino) } }
        return try body()
    }

    func openContentOnce(ino: UInt64, flags: Int32, backing: (any BackingFiles)?) throws -> OpenReply {
        let writable = flags & O_ACCMODE != O_RDONLY
        var wasPlaceholder = false
        // Each turn after the first follows a change that moved the content
        // forward (see `ContentOpens.swift`): look again at once.
        for _ in 0..<Self.contentAttempts {
            let node = try replica.read { ns -> LocalNode in
                guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
                return node
            }
            if node.isPlaceholder {
                wasPlaceholder = true
                if !writable {
                    // Return at once; reads wait for the ranges they need.
                    if var opened = try openStreaming(node, backing: backing) {
                        opened.keepCache = false
                        return opened
                    }
                } else if flags & O_TRUNC != 0 {
                    try truncate(ino: ino, size: 0, handle: nil)
                } else {
                    try hooks.download(ino: ino, beforeWaiting: options.beforeLongWait)
                }
                continue
            }
            if var opened = try openLocal(node, flags: flags, backing: backing) {
                // New content: the kernel must drop pages it may still hold from an older version.
                if wasPlaceholder { opened.keepCache = false }
                return opened
            }
        }
        throw UbiquityError(EIO, "the content of inode \(ino) keeps changing; try again")
    }

    /// Open the cache file of `node` (local content) and count the open.
    /// Nil when the content changed before the open was counted (look again).
    ///
    /// The open and writer are counted — and for a writer the content
    /// change begun — in one critical section that first checks that the
    /// content is still the one the descriptor opened (its epoch: every
    /// eviction, download and newer version moves it). So an eviction either
    /// happened before (the epoch moved: this open looks again) or sees the
    /// writer and refuses: a writer never writes to an evicted file.
    func openLocal(_ node: LocalNode, flags: Int32, backing: (any BackingFiles)?) throws -> OpenReply? {
        let ino = node.ino
        let writable = flags & O_ACCMODE != O_RDONLY
        let fd = Glibc.open(replica.cache.path(ino), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            if code == ENOENT {
                // Evicted or replaced meanwhile (look again) — or lost behind the index's back.
                let same = replica.read { ns in
                    ns.node(ino).map { $0.hasContent && $0.contentEpoch == node.contentEpoch } ?? false
                }
                if !same { return nil }
            }
            throw UbiquityError(code == ENOENT ? EIO : code, "open cache file of inode \(ino): \(String(cString: strerror(code)))")
        }
        guard let opened = register(ino: ino, fd: fd, writable: writable, epoch: node.contentEpoch, backing: backing) else {
            close(fd)
            return nil
        }
        guard writable else {
            prefetchSiblings(of: node)
            return opened
        }
        // The "changed" mark (and for a node the store has, the
        // "unacknowledged writes" mark) is committed before the open is
        // acknowledged, and before `O_TRUNC` touches the content.
        do {
            // Truncating frees space, so it may use the reserve; other opens
            // for writing are about to add content.
            try commit(flags & O_TRUNC != 0 ? .mayUseReserve : .grows, notify: false)
            if flags & O_TRUNC != 0 {
                try syscallRetrying("truncate on open") { ftruncate(fd, 0) }
                let now = Timespec.now()
                replica.record { ns in
                    changeContent(ino, in: &ns) { $0.contentChanged(ino, size: 0, time: now, monotonic: MonotonicClock.now()) }
                }
            }
        } catch {
            try? release(handle: opened.handle)
            throw error
        }
        return opened
    }

    /// A small file opened for reading: if its reader goes through the
    /// directory in order, ask the disk for the next siblings (`SiblingPrefetch`).
    func prefetchSiblings(of node: LocalNode) {
        guard node.kind == .file, node.size <= SiblingPrefetch.largest else { return }
        let inos: [UInt64] = replica.read { ns in
            let directory = ns.entries(of: node.lastParent)
            guard let range = siblingPrefetch.opened(node, in: directory) else { return [] }
            return range.compactMap { position in
                let ino = directory.ino(at: position)
                guard let sibling = ns.node(ino), sibling.kind == .file, sibling.hasContent,
                      sibling.size > 0, sibling.size <= SiblingPrefetch.largest else { return nil }
                return ino
            }
        }
        SiblingPrefetch.prefetch(inos.map { replica.cache.path($0) })
    }

    /// Open a placeholder for reading while it downloads. Nil if the
    /// download finished (or a newer version replaced it) between starting
    /// it and opening its file: look again (the content is local now, or
    /// the newer version's download starts).
    func openStreaming(_ node: LocalNode, backing: (any BackingFiles)?) throws -> OpenReply? {
        let ino = node.ino
        // Counted before the download starts, so that its first chunks are held for the reader too.
        hooks.beginStream(ino: ino, version: node.hash)
        let path = hooks.startDownload(ino: ino, background: false, keep: false)
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            hooks.endStream(ino: ino, version: node.hash)
            guard code == ENOENT else { throw UbiquityError.posix("open download of inode \(ino)", errno: code) }
            return nil
        }
        guard let opened = register(ino: ino, fd: fd, writable: false, streaming: (node.hashSize, node.hash), backing: backing) else {
            close(fd)
            hooks.endStream(ino: ino, version: node.hash)
            throw UbiquityError(ENOENT)
        }
        return opened
    }

    /// Count the open and hand out a handle for `fd`. With `epoch`, only if
    /// the node's content is still local and of that epoch (nil otherwise);
    /// a writer also begins a content change, in the same critical section.
    /// With `backing`, the kernel may serve the open itself (`chooseKernelIO`).
    func register(ino: UInt64, fd: Int32, writable: Bool, epoch expected: UInt32? = nil,
                  streaming: (size: UInt64, version: String?)? = nil, backing: (any BackingFiles)? = nil) -> OpenReply? {
        var kernelIO = KernelIO.cached
        let counted = replica.record { ns -> (UInt32, Bool)? in
            guard let node = ns.openable(ino, epoch: expected) else { return nil }
            if let backing {
                kernelIO = chooseKernelIO(node, fd: fd, localReader: expected != nil && !writable, writable: writable, backing: backing)
            }
            let now = MonotonicClock.now()
            ns.countOpen(ino, writable: writable)
            // Keep the kernel's pages only if they were filled from this very content.
            let keepCache = kernel.opened(node) && streaming == nil
            if writable && expected != nil { changeContent(ino, from: node, in: &ns) { $0.beginContentChange(ino, monotonic: now) } }
            return (node.contentEpoch, keepCache)
        }
        guard let (epoch, keepCache) = counted else { return nil }
        let handle = handles.withLock { table in
            let handle = table.allocate()
            table.files[handle] = HandleTable.OpenFile(ino: ino, fd: fd, writable: writable, epoch: epoch,
                                                       streamingSize: streaming?.size, streamingVersion: streaming?.version,
                                                       kernelIO: kernelIO, backing: kernelIO == .cached ? nil : backing)
            return handle
        }
        if case .passthrough = kernelIO { replica.foreground.watchUnseenReads(fd: fd) }
        var opened = OpenReply(handle: handle, keepCache: keepCache && kernelIO == .cached, acknowledgedWithoutFlush: !writable)
        opened.kernelIO = kernelIO
        return opened
    }

    /// Files smaller than this are never served by passthrough: registering
    /// and forgetting the cache file costs two system calls, and a small
    /// file is read in a request or two anyway.
    static let passthroughSmallest: UInt64 = 1 << 20

    /// How the kernel does the I/O of a new open of `node` (`KernelIO`).
    /// Called under the namespace lock, so that no other open or release of
    /// the node moves its counts meanwhile; takes `passthrough` inside it.
    ///
    /// - An inode with opens in passthrough (an entry here) stays in that
    ///   mode: a reader of the same content shares its backing file; any
    ///   other open (a writer, a reader after the content changed, a
    ///   streaming placeholder) is `.direct`, so the daemon sees its I/O.
    /// - Otherwise a reader of local content of at least
    ///   `passthroughSmallest` with no other open (none may be using the
    ///   mounted file's page cache) registers the cache file and passes through.
    /// - Everything else is `.cached`.
    ///
    /// The daemon's counts lag the kernel's (the kernel forgets an open
    /// before its RELEASE arrives), so the mode chosen here is one the
    /// kernel accepts.
    func chooseKernelIO(_ node: LocalNode, fd: Int32, localReader: Bool, writable: Bool,
                        backing: any BackingFiles) -> KernelIO {
        passthrough.withLock { table in
            if var inode = table[node.ino] {
                inode.opens += 1
                inode.wrote = inode.wrote || writable
                table[node.ino] = inode
                return localReader && inode.epoch == node.contentEpoch
                    ? .passthrough(backing: inode.backing) : .direct(backing: inode.backing)
            }
            guard localReader, node.openCount == 0, node.size >= Self.passthroughSmallest,
                  let id = try? backing.register(fd: fd) else { return .cached }
            table[node.ino] = PassthroughInode(backing: id, epoch: node.contentEpoch, opens: 1)
            return .passthrough(backing: id)
        }
    }

    /// A passthrough or direct open of `ino` is released. Under the
    /// namespace lock. The last one's registration is returned to be forgotten.
    func passthroughReleased(_ ino: UInt64, in ns: inout Namespace) -> Int32? {
        let last = passthrough.withLock { table -> PassthroughInode? in
            guard var inode = table[ino] else { return nil }
            inode.opens -= 1
            if inode.opens > 0 {
                table[ino] = inode
                return nil
            }
            table[ino] = nil
            return inode
        }
        guard let last else { return nil }
        // Writes went to the cache file without the mounted file's page
        // cache: the next cached open must not keep what it holds, and
        // the next fsync syncs the cache file (the daemon did not see them).
        if last.wrote {
            kernel.pagesStale(ino)
            ns.contentChangedUnseen(ino)
        }
        return last.backing
    }

    func openFileFor(_ handle: UInt64) throws -> HandleTable.OpenFile {
        guard let file = handles.withLock({ $0.files[handle] }) else { throw UbiquityError(EBADF) }
        return file
    }

    public func read(handle: UInt64, offset: Int64, size: Int) throws -> ReadReply {
        let file = try openFileFor(handle)
        replica.foreground.note()
        // Local content: the kernel's own read-ahead of the cache file serves a sequential reader.
        guard let total = file.streamingSize else { return .fileRange(fd: file.fd, offset: offset, size: size) }
        let end = min(total, UInt64(offset) + UInt64(size))
        var held: [PinnedBytes] = []
        if UInt64(offset) < total {
            held = try hooks.waitToRead(ino: file.ino, version: file.streamingVersion, from: UInt64(offset), upTo: end,
                                        beforeWaiting: options.beforeLongWait)
        }
        let passed = handles.withLock { $0.files[handle]?.run.read(offset: offset, size: size) }
        if held.isEmpty { return .fileRange(fd: file.fd, offset: offset, size: size, passed: passed) }
        if held.count == 1, held[0].offset == UInt64(offset), held[0].offset + UInt64(held[0].count) == end {
            return .memory(held[0], passed: passed)
        }
        // Across a chunk boundary: held parts copied, the rest read from the file.
        var bytes = [UInt8](repeating: 0, count: Int(end - UInt64(offset)))
        try bytes.withUnsafeMutableBytes { out in
            func fromFile(_ lower: UInt64, _ upper: UInt64) throws {
                guard upper > lower else { return }
                let n = pread(file.fd, out.baseAddress! + Int(lower - UInt64(offset)), Int(upper - lower), off_t(lower))
                guard n == Int(upper - lower) else { throw UbiquityError(EIO, "read of inode \(file.ino): its download's file is short") }
            }
            var at = UInt64(offset)
            for part in held {
                try fromFile(at, part.offset)
                (out.baseAddress! + Int(part.offset - UInt64(offset))).copyMemory(from: part.base, byteCount: part.count)
                at = part.offset + UInt64(part.count)
            }
            try fromFile(at, end)
        }
        return .bytes(bytes, passed: passed)
    }

    /// Write `count` bytes at `offset`; returns the bytes written.
    public func write(handle: UInt64, offset: Int64, bytes: UnsafeRawPointer, count: Int) throws -> Int {
        let file = try openFileFor(handle)
        guard file.writable else { throw UbiquityError(EBADF) }
        replica.foreground.note()
        // The last bytes of a full disk are kept for deletions (see `SpaceReserve`).
        try replica.requireRoomForContent()
        // The first write since the last acknowledgement marks the content in
        // the index before any of its bytes reaches the cache file.
        let mark = replica.record { ns in ns.beginWrite(file.ino) }
        var written = 0
        do {
            if mark { try commit(notify: false) }
            while written < count {
                let n = pwrite(file.fd, bytes + written, min(count - written, ContentCopy.writePiece), off_t(offset) + off_t(written))
                if n < 0 {
                    if errno == EINTR { continue }
                    let code = errno
                    if written > 0 { break }
                    throw UbiquityError(code == ENOSPC || code == EDQUOT || code == EFBIG ? code : EIO,
                                        "write to cache file: \(String(cString: strerror(code)))")
                }
                written += n
            }
        } catch {
            replica.record { ns in ns.endWrite(file.ino) }
            throw error
        }
        let end = UInt64(offset) + UInt64(written)
        let now = Timespec.now()
        let monotonic = MonotonicClock.now()
        replica.record { ns in
            ns.endWrite(file.ino)
            guard let node = ns.node(file.ino) else { return }
            changeContent(file.ino, from: node, written: UInt64(offset)..<end, in: &ns) {
                $0.contentChanged(file.ino, size: max(node.size, end), time: now, monotonic: monotonic)
            }
        }
        return written
    }

    /// `close(2)` of one file descriptor: what was written is committed and
    /// acknowledged. Readers and new files have nothing to acknowledge here
    /// (`OpenReply.acknowledgedWithoutFlush`: the kernel never asks).
    public func flush(handle: UInt64) throws {
        let file = try openFileFor(handle)
        guard file.writable else { return }
        replica.record { ns in ns.acknowledgeWrites(file.ino) }
        try commit()
    }

    /// `fsync(2)`, `fdatasync(2)`: the content is made durable, then what
    /// was written is committed and (through a writer's descriptor)
    /// acknowledged, and every committed change — the file's size, its
    /// name and its folder's entries among them — is made to survive a
    /// power loss (`Replica.makeDurable`), as ext4's journal commit does.
    ///
    /// The content: a small change since the cache file was last known on
    /// disk is journaled (its bytes go into the operation log, and the log's
    /// one flush covers everything: `JournaledContent`); otherwise the cache
    /// file is synced, and the log records that it was.
    public func fsync(handle: UInt64, dataOnly: Bool) throws {
        let file = try openFileFor(handle)
        if try journalContent(of: file) { return }
        let synced = replica.read { ns in ns.node(file.ino).map { ($0.contentGeneration, $0.contentEpoch) } }
        try syscallRetrying("fsync cache file") { dataOnly ? fdatasync(file.fd) : Glibc.fsync(file.fd) }
        replica.record { ns in
            if file.writable { ns.acknowledgeWrites(file.ino) }
            if let (generation, epoch) = synced { ns.cacheFileSynced(file.ino, generation: generation, epoch: epoch) }
        }
        try commit()
        try replica.makeDurable(cacheFolders: true)
    }

    /// The journaled `fsync` of `file`, if its change since the cache file
    /// was last on disk is small and all seen by the daemon (no passthrough
    /// open of the inode, whose writes would not be). False: sync the cache file.
    func journalContent(of file: HandleTable.OpenFile) throws -> Bool {
        guard file.kernelIO == .cached, file.streamingSize == nil,
              passthrough.withLock({ $0[file.ino] == nil }),
              let change = replica.read({ ns in ns.journalableChange(file.ino) }) else { return false }
        var pieces: [JournaledContent.Piece] = []
        for range in change.ranges {
            var bytes = [UInt8](repeating: 0, count: range.count)
            let n = bytes.withUnsafeMutableBytes { pread(file.fd, $0.baseAddress!, $0.count, off_t(range.lowerBound)) }
            guard n == range.count else { return false }   // cut meanwhile: sync the file instead
            pieces.append(JournaledContent.Piece(offset: range.lowerBound, bytes: bytes))
        }
        replica.record { ns in
            if file.writable { ns.acknowledgeWrites(file.ino) }
            ns.journal(JournaledContent(ino: file.ino, version: change.version, smallestSize: change.smallestSize,
                                        size: change.size, pieces: pieces))
        }
        try commit()
        try replica.makeDurable()
        replica.record { ns in ns.journaled(file.ino, generation: change.generation) }
        return true
    }

    public func release(handle: UInt64) throws {
        guard let file = handles.withLock({ $0.files.removeValue(forKey: handle) }) else { throw UbiquityError(EBADF) }
        if case .passthrough = file.kernelIO { replica.foreground.unwatchUnseenReads(fd: file.fd) }
        close(file.fd)
        if file.streamingSize != nil { hooks.endStream(ino: file.ino, version: file.streamingVersion) }
        var unregister: Int32?
        let dropped = replica.record { ns -> Bool in
            // Reads through a handle of older content may have refilled the
            // kernel's cache with it: make the next open drop that cache.
            if let node = ns.node(file.ino), node.contentEpoch != file.epoch { kernel.pagesStale(file.ino) }
            if file.kernelIO != .cached { unregister = passthroughReleased(file.ino, in: &ns) }
            ns.countClose(file.ino, writable: file.writable)
            return ns.dropIfUnreferenced(file.ino)
        }
        if let unregister { file.backing?.unregister(unregister) }
        if dropped { replica.cache.retire(file.ino) }
        if file.writable { try commit() }
    }

    public func fallocate(handle: UInt64, mode: Int32, offset: Int64, length: Int64) throws {
        guard mode == 0 else { throw UbiquityError(EOPNOTSUPP) }
        let file = try openFileFor(handle)
        guard file.writable else { throw UbiquityError(EBADF) }
        try replica.requireRoomForContent()
        let mark = replica.record { ns in ns.beginWrite(file.ino) }
        do {
            if mark { try commit(notify: false) }
            let rc = posix_fallocate(file.fd, off_t(offset), off_t(length))
            guard rc == 0 else { throw UbiquityError(rc) }
        } catch {
            replica.record { ns in ns.endWrite(file.ino) }
            throw error
        }
        let end = UInt64(offset + length)
        let now = Timespec.now()
        replica.record { ns in
            ns.endWrite(file.ino)
            guard let node = ns.node(file.ino), end > node.size else { return }
            changeContent(file.ino, from: node, in: &ns) { $0.contentChanged(file.ino, size: end, time: now, monotonic: MonotonicClock.now()) }
        }
    }

    // MARK: - Directories

    public func opendir(ino: UInt64) throws -> UInt64 {
        let ino = view.swap(ino)
        try replica.read { ns in
            guard let kind = ns.kind(of: ino) else { throw UbiquityError(ENOENT) }
            guard kind == .directory else { throw UbiquityError(ENOTDIR) }
        }
        // The snapshot is taken by the first read (at offset 0, as a rewind).
        let listing = HandleTable.Listing(ino: ino)
        return handles.withLock { table in
            let handle = table.allocate()
            table.listings[handle] = listing
            return handle
        }
    }

    /// The kernel keeps its listing if no change reached the folder since
    /// its last open (`KernelReferences.openedFolder`): changes through
    /// another mount of the container, or pulled, move the folder's stamp.
    public func listingCache(ino: UInt64) -> ListingCache {
        let dir = view.swap(ino)
        let stamp = replica.read { ns in ns.listingStamp(of: dir) }
        return kernel.openedFolder(dir, stamp: stamp) ? .keep : .refill
    }

    func snapshot(_ ino: UInt64) throws -> HandleTable.Listing {
        let (directory, stamp) = try replica.read { ns in
            guard let kind = ns.kind(of: ino) else { throw UbiquityError(ENOENT) }
            guard kind == .directory else { throw UbiquityError(ENOTDIR) }
            return (ns.entries(of: ino), ns.listingStamp(of: ino))
        }
        return HandleTable.Listing(ino: ino, directory: directory, order: directory.positionsByCookie(), stamp: stamp)
    }

    /// The entries after `offset` into `sink`, names read in place.
    public func readdir(handle: UInt64, offset: Int64, into sink: ListingSink) throws {
        var listing = try handles.withLock { table -> HandleTable.Listing in
            guard let listing = table.listings[handle] else { throw UbiquityError(EBADF) }
            return listing
        }
        if offset == 0 || listing.directory == nil {
            // The first read, or rewinddir: see the directory as it is now.
            listing = try snapshot(listing.ino)
            let fresh = listing
            handles.withLock { $0.listings[handle] = fresh }
        }
        guard let directory = listing.directory else { return }
        let dirIno = listing.ino
        func dots(_ name: StaticString, _ ino: UInt64, next: Int64) -> Bool {
            sink(ListedEntry(name: UnsafeRawBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount),
                             ino: view.swap(ino), type: UInt32(S_IFDIR), nextOffset: next))
        }
        if offset < 1, !dots(".", dirIno, next: 1) { return }
        if offset < 2 {
            let parent = dirIno == view.root ? dirIno : replica.read { ns in ns.directoryParent[dirIno] ?? dirIno }
            if !dots("..", parent, next: 2) { return }
        }
        // First entry with a cookie above the offset (binary search: positions are in cookie order).
        var low = 0
        var high = listing.order.count
        while low < high {
            let mid = (low + high) / 2
            if Int64(directory.cookie(at: listing.order[mid])) <= offset { low = mid + 1 } else { high = mid }
        }
        let hidden = dirIno == view.root ? view.hidden : nil
        directory.withNames { names in
            replica.read { ns in
                // Entries removed since the snapshot are skipped; while the
                // folder's stamp holds, none was.
                let unchanged = ns.listingStamp(of: dirIno) == listing.stamp
                for position in listing.order[low...] {
                    let value = directory.value(at: position)
                    let name = names.name(at: position)
                    guard unchanged || ns.lookup(dirIno, FileName(bytes: Array(name))) == value.ino,
                          hidden.map({ !name.elementsEqual($0.bytes) }) ?? true else { continue }
                    guard let kind = ns.kind(of: value.ino) else { continue }
                    guard sink(ListedEntry(name: name, ino: view.swap(value.ino), type: kind.typeBits,
                                           nextOffset: Int64(value.cookie))) else { return }
                }
            }
        }
    }

    public func releasedir(handle: UInt64) {
        _ = handles.withLock { $0.listings.removeValue(forKey: handle) }
    }

    /// Namespace changes are committed before each operation returns; this
    /// commits anything still buffered (nothing, normally) and makes every
    /// committed change survive a power loss (`Replica.makeDurable`).
    public func fsyncdir(handle: UInt64) throws {
        try replica.persist()
        try replica.makeDurable()
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
        // Asked on every write (`security.capability`, to drop privileges): kept cheap.
        guard name.hasPrefix("user.") else { throw UbiquityError(name.utf8.contains(UInt8(ascii: ".")) ? ENODATA : EOPNOTSUPP) }
        if name.hasPrefix(Self.statusAttributePrefix) {
            guard let value = hooks.statusAttribute(ino: ino, name: name) else { throw UbiquityError(ENODATA) }
            return value
        }
        return try replica.read { ns in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            guard let value = node.xattrs[name] else { throw UbiquityError(ENODATA) }
            return value
        }
    }

    public func listxattr(ino: UInt64) throws -> [String] {
        let ino = view.swap(ino)
        return try replica.read { ns in
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
        try syscallRetrying("statvfs") { statvfs(replica.cache.directory.path, &st) }
        let count = replica.read { ns in UInt64(ns.nodes.count) }
        let filesFree = max(UInt64(st.f_ffree), 1_000_000)
        return FilesystemStatistics(blockSize: UInt64(st.f_bsize), blocks: UInt64(st.f_blocks),
                                    blocksFree: UInt64(st.f_bfree), blocksAvailable: UInt64(st.f_bavail),
                                    files: count + filesFree, filesFree: filesFree, nameMax: UInt64(Self.nameMax))
    }
}
