import Foundation
import Synchronization
import UbiquityLocks
import CLinux
#if canImport(Glibc)
import Glibc
import UbiquityModel
import UbiquityLinux
#endif

/// A store kept in a local (or shared) folder — the embedded default.
///
/// Layout:
/// ```
/// STORE/ubiquityfs-store.json          marker: format and store ID
/// STORE/containers/ID/container.json   container configuration
/// STORE/containers/ID/journal/SEQ      one JSON change set per record (SEQ: 16 digits)
/// STORE/containers/ID/snapshots/SEQ    the container's state at record SEQ (`SnapshotRecord`)
/// STORE/blobs/AB/SHA256                immutable content, AB = first two hex digits
/// STORE/tmp/                           staging for atomic publication
/// ```
/// Everything in it is owner-only (folders 0700, files 0600) whatever the
/// umask: blobs are the users' file content and the journal names every file.
/// A *shared* store (made with `shared`, recorded in the marker so every
/// device follows it) is for a group of users instead: folders 0770 (keeping
/// the set-gid bit they inherit), files 0640.
/// Journal records are published by `link(2)` of a fully written temporary
/// file, which fails with `EEXIST` if the sequence number is taken: readers
/// never see a partial record and two devices never both win.
public final class FolderStore: Store {
    /// Monotonic nanoseconds of the last time the marker was found (`checkReachable`).
    let reachableConfirmedAt = Atomic<UInt64>(0)
    public static let markerName = "ubiquityfs-store.json"
    /// The format new stores are made with (2: small files may be packed;
    /// docs/STORE-FORMAT.md). Stores of format 1 are read and written as
    /// format 1 (no packs), so devices that read only format 1 can share them.
    static let formatVersion = 3

    struct Marker: Codable {
        var format: Int
        var storeID: String
        /// Made for a group of users (absent: private).
        var shared: Bool?
    }

    public let root: URL
    /// `root/blobs` as a path: blob paths are built as strings, since
    /// `URL.appendingPathComponent` stats each component it appends.
    let blobsPath: String
    public let storeID: String
    /// The format in the marker (1 or 2; 0 while it was never read: a store
    /// opened unreachable), read again with the marker.
    public var format: Int { formatFlag.load(ordering: .relaxed) }
    let formatFlag: Atomic<Int>
    public var packsSmallContent: Bool { format >= 2 }
    /// Whether the store is shared by a group (see the type's notes): from
    /// the marker, read again whenever reachability is checked (a store
    /// unreachable at start learns it when it comes back).
    public var shared: Bool { sharedFlag.load(ordering: .relaxed) }
    let sharedFlag: Atomic<Bool>
    /// Permissions of what the store creates.
    var directoryMode: mode_t { shared ? 0o770 : 0o700 }
    var fileMode: mode_t { shared ? 0o640 : 0o600 }

    /// Open the store at `root`.
    ///
    /// A missing folder is created only when `create` is set (the default
    /// store). An existing empty folder becomes a new store only when
    /// `initializeEmpty` is set — a replica that already knows this store
    /// must see an empty folder as "unreachable", never as "everything was
    /// deleted". `shared`: a new store is made for a group of users; an
    /// existing private store is then refused (the marker decides).
    public init(root: URL, create: Bool, initializeEmpty: Bool, shared: Bool = false) throws {
        self.root = root.standardizedFileURL
        blobsPath = self.root.path + "/blobs"
        let fm = FileManager.default
        let markerURL = self.root.appendingPathComponent(Self.markerName)
        var isDir: ObjCBool = false
        if !fm.fileExists(atPath: self.root.path, isDirectory: &isDir) {
            guard create else { throw UbiquityError(ENOENT, "store \(self.root.path) does not exist") }
            do {
                try fm.createDirectory(at: self.root, withIntermediateDirectories: true)
            } catch {
                throw UbiquityError(EACCES, "cannot create store \(self.root.path): \(error.localizedDescription)")
            }
        } else if !isDir.boolValue {
            throw UbiquityError(ENOTDIR, "store \(self.root.path) is not a folder")
        }
        if let data = fm.contents(atPath: markerURL.path) {
            guard let marker = try? JSONDecoder().decode(Marker.self, from: data), RecordFormat.isValidID(marker.storeID) else {
                throw UbiquityError(EINVAL, "store marker \(markerURL.path) is damaged; refusing to use this folder as a store")
            }
            guard marker.format <= Self.formatVersion else {
                throw UbiquityError(store: .unsupported, "store \(self.root.path) has format \(marker.format); this ubiquityfs reads format \(Self.formatVersion) — upgrade it")
            }
            storeID = marker.storeID
            formatFlag = Atomic(marker.format)
            sharedFlag = Atomic(marker.shared ?? false)
            if shared && !self.shared {
                throw UbiquityError(EPERM, "store \(self.root.path) is private (made without --shared-store); its files are its owner's only")
            }
            if !self.shared { Self.makePrivate(self.root) }
        } else {
            guard access(self.root.path, R_OK) == 0 else {
                throw UbiquityError(store: .refused, "store \(self.root.path) is not readable")
            }
            let contents = (try? fm.contentsOfDirectory(atPath: self.root.path)) ?? []
            guard contents.isEmpty else {
                throw UbiquityError(EINVAL, "\(self.root.path) is not a ubiquityfs store (no \(Self.markerName)) and is not empty")
            }
            guard create || initializeEmpty else {
                throw UbiquityError(ENOENT, "store \(self.root.path) is empty: it is not reachable (no \(Self.markerName))")
            }
            storeID = UUID().uuidString.lowercased()
            formatFlag = Atomic(Self.formatVersion)
            sharedFlag = Atomic(shared)
            try Self.ensureWritable(self.root)
            // A new private store: its folder is its owner's only.
            if !shared { chmod(self.root.path, 0o700) }
            let marker = try JSONEncoder().encode(Marker(format: Self.formatVersion, storeID: storeID, shared: shared ? true : nil))
            try Self.publish(marker, at: markerURL, tmpDir: self.root, exclusive: true, mode: shared ? 0o644 : 0o600)
        }
        try Self.ensureWritable(self.root)
        for dir in ["containers", "blobs", "tmp"] {
            try? makeDirectory(self.root.appendingPathComponent(dir))
        }
    }

    /// Stores made before permissions were enforced have world-readable
    /// folders: close the three top folders (the rest is only reached
    /// through them). Only the owner can; nothing else is changed.
    static func makePrivate(_ root: URL) {
        for dir in ["containers", "blobs", "tmp"] {
            let path = root.appendingPathComponent(dir).path
            var st = stat()
            if lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR, st.st_uid == geteuid(), st.st_mode & 0o077 != 0 {
                chmod(path, 0o700)
            }
        }
    }

    /// Create `url` and any missing folders above it (below the store's
    /// root) with the store's folder mode, whatever the umask.
    func makeDirectory(_ url: URL) throws {
        var st = stat()
        if stat(url.path, &st) == 0 { return }
        let parent = url.deletingLastPathComponent()
        if parent.path.count > root.path.count { try makeDirectory(parent) }
        guard mkdir(url.path, directoryMode) == 0 else {
            if errno == EEXIST { return }
            let code = errno
            if code == ENOENT { throw UbiquityError(store: .unreachable, "store folder \(parent.path) vanished") }
            throw UbiquityError(code, "create \(url.path): \(String(cString: strerror(code)))")
        }
        // The umask may have taken bits away; a set-gid bit inherited from the
        // parent (a shared store's group) is kept.
        if stat(url.path, &st) == 0 { chmod(url.path, directoryMode | (st.st_mode & S_ISGID)) }
    }

    /// A store this device knows (`storeID`) whose folder is not reachable
    /// now: every call fails with `EHOSTDOWN` until the folder and its marker
    /// are back. The mount works offline meanwhile.
    public init(unreachableAt root: URL, storeID: String) {
        self.root = root.standardizedFileURL
        blobsPath = self.root.path + "/blobs"
        self.storeID = storeID
        sharedFlag = Atomic(false)
        formatFlag = Atomic(0)
    }

    static func ensureWritable(_ root: URL) throws {
        guard access(root.path, W_OK | X_OK) == 0 else {
            throw UbiquityError(store: .refused, "store \(root.path) is not writable")
        }
    }

    public var locationDescription: String { root.path }

    /// Whether `root` currently looks like this store (the marker decides).
    public var isReachable: Bool {
        guard let data = FileManager.default.contents(atPath: root.appendingPathComponent(Self.markerName).path),
              let marker = try? JSONDecoder().decode(Marker.self, from: data), marker.storeID == storeID else { return false }
        sharedFlag.store(marker.shared ?? false, ordering: .relaxed)
        formatFlag.store(marker.format, ordering: .relaxed)
        return true
    }

    func containerDir(_ id: String) -> URL { root.appendingPathComponent("containers").appendingPathComponent(id) }
    func journalURL(_ container: String, _ seq: UInt64) -> URL {
        containerDir(container).appendingPathComponent("journal").appendingPathComponent(Self.seqName(seq))
    }
    static func seqName(_ seq: UInt64) -> String {
        let digits = String(seq)
        return String(repeating: "0", count: max(0, 16 - digits.count)) + digits
    }
    func blobPath(_ hash: String) -> String {
        blobsPath + "/" + hash.prefix(2) + "/" + hash
    }
    func blobURL(_ hash: String) -> URL {
        URL(fileURLWithPath: blobPath(hash), isDirectory: false)
    }

    func checkReachable() throws {
        guard isReachable else {
            reachableConfirmedAt.store(0, ordering: .relaxed)
            throw UbiquityError(store: .unreachable, "store \(root.path) is not reachable")
        }
        reachableConfirmedAt.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)
    }

    /// `checkReachable` for blobs, trusting a marker found within the last
    /// second: a push of thousands of small blobs reads it once a second, not
    /// once per blob. Blobs are content-addressed, so one written to a folder
    /// that stopped being this store a moment ago harms nothing; journal
    /// records and configurations always check (`checkReachable`).
    func checkReachableForBlobs() throws {
        if DispatchTime.now().uptimeNanoseconds &- reachableConfirmedAt.load(ordering: .relaxed) < 1_000_000_000 { return }
        try checkReachable()
    }

    public func containerConfig(_ container: String) throws -> ContainerConfig? {
        try checkReachable()
        let url = containerDir(container).appendingPathComponent("container.json")
        guard let data = FileManager.default.contents(atPath: url.path) else { return nil }
        return try ContainerConfig.decodeStored(data, id: container, at: url.path)
    }

    /// Create a container; `EEXIST` if it exists (two devices creating one race safely).
    public func createContainer(_ config: ContainerConfig) throws {
        try config.validate()
        try checkReachable()
        let dir = containerDir(config.id)
        try makeDirectory(dir.appendingPathComponent("journal"))
        do {
            try Self.publish(try config.encodedForStore(), at: dir.appendingPathComponent("container.json"),
                             tmpDir: root.appendingPathComponent("tmp"), exclusive: true, mode: fileMode)
        } catch let error as UbiquityError where error.errno == EEXIST {
            throw UbiquityError(EEXIST, "container \(config.id) already exists")
        }
    }

    public func updateContainer(_ config: ContainerConfig) throws {
        try config.validate()
        guard try containerConfig(config.id) != nil else { throw UbiquityError(ENOENT, "no container \(config.id)") }
        try Self.publish(try config.encodedForStore(), at: containerDir(config.id).appendingPathComponent("container.json"),
                         tmpDir: root.appendingPathComponent("tmp"), exclusive: false, mode: fileMode)
    }

    public func containers() throws -> ContainerListing {
        try checkReachable()
        let names = (try? FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("containers").path)) ?? []
        var listing = ContainerListing(configs: [])
        for name in names.sorted() {
            do {
                if let config = try containerConfig(name) { listing.configs.append(config) }
            } catch {
                listing.damaged.append((name, "\(UbiquityError.wrap(error))"))
            }
        }
        return listing
    }

    public func commit(container: String, seq: UInt64, changeSet: ChangeSet) throws -> Bool {
        try checkReachable()
        return try publishExclusively(try changeSet.encodedRecord(seq: seq), at: journalURL(container, seq))
    }

    /// Publish `data` at `url` unless something is there: false if it is.
    func publishExclusively(_ data: Data, at url: URL) throws -> Bool {
        do {
            try Self.publish(data, at: url, tmpDir: root.appendingPathComponent("tmp"), exclusive: true, mode: fileMode)
            return true
        } catch let error as UbiquityError where error.errno == EEXIST {
            return false
        }
    }

    public func journal(container: String, after seq: UInt64, limit: Int) throws -> [JournalRecord] {
        try checkReachable()
        var records: [JournalRecord] = []
        var next = seq + 1
        while records.count < limit, let record = try readRecord(container: container, seq: next) {
            records.append(record)
            next += 1
        }
        return records
    }

    func snapshotURL(_ container: String, _ seq: UInt64) -> URL {
        containerDir(container).appendingPathComponent("snapshots").appendingPathComponent(Self.seqName(seq))
    }

    public func snapshots(container: String) throws -> [UInt64] {
        try checkReachable()
        let dir = containerDir(container).appendingPathComponent("snapshots").path
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
        return names.compactMap { $0.utf8.count == 16 ? UInt64($0) : nil }.filter { $0 > 0 }.sorted()
    }

    public func snapshot(container: String, seq: UInt64) throws -> SnapshotRecord? {
        try checkReachable()
        let url = snapshotURL(container, seq)
        guard let data = FileManager.default.contents(atPath: url.path) else { return nil }
        return try SnapshotRecord.decode(data, seq: seq)
    }

    public func publishSnapshot(container: String, _ snapshot: SnapshotRecord) throws -> Bool {
        try checkReachable()
        let url = snapshotURL(container, snapshot.seq)
        try makeDirectory(url.deletingLastPathComponent())
        return try publishExclusively(try snapshot.encoded(), at: url)
    }

    /// Journal record `seq`, or nil if there is none (the end of the
    /// journal). Whatever holds the number but is not a readable change set
    /// (a symlink, a folder, a FIFO, a file too large, bytes that do not
    /// decode or check) is an `.invalid` record: its number is taken, and
    /// readers skip it. A file that cannot be read *now* (permissions, an
    /// I/O error) throws: it may be readable later, and skipping it would
    /// lose its changes for good.
    func readRecord(container: String, seq: UInt64) throws -> JournalRecord? {
        let path = journalURL(container, seq).path
        // O_NONBLOCK: opening a FIFO must not wait for a writer.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        if fd < 0 {
            let code = errno
            switch code {
            case ENOENT: return nil
            case ELOOP: return JournalRecord(seq: seq, content: .invalid(reason: "a symbolic link, not a file"))
            default: throw UbiquityError(code == EACCES ? EACCES : EIO, "cannot read journal record \(path): \(String(cString: strerror(code)))")
            }
        }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw UbiquityError.posix("stat journal record \(path)") }
        guard (st.st_mode & S_IFMT) == S_IFREG else {
            return JournalRecord(seq: seq, content: .invalid(reason: "not a regular file"))
        }
        guard st.st_size <= RecordFormat.maxRecordBytes else {
            return JournalRecord(seq: seq, content: .invalid(reason: "record is \(st.st_size) bytes (at most \(RecordFormat.maxRecordBytes))"))
        }
        var data = Data(count: Int(st.st_size))
        var done = 0
        try data.withUnsafeMutableBytes { raw in
            while done < raw.count {
                let n = try syscallRetrying("read journal record \(path)") { pread(fd, raw.baseAddress! + done, raw.count - done, off_t(done)) }
                if n == 0 { break }
                done += n
            }
        }
        data.count = done
        return JournalRecord(seq: seq, data: data)
    }

    public func blobSize(_ hash: String) throws -> UInt64? {
        try checkReachableForBlobs()
        var st = stat()
        guard stat(blobPath(hash), &st) == 0 else {
            let code = errno
            if code == ENOENT || code == ENOTDIR { return nil }
            throw UbiquityError(EIO, "stat blob \(hash): \(String(cString: strerror(code)))")
        }
        return UInt64(st.st_size)
    }

    /// Held with the right size: kept alive (its time set to now, for the
    /// collector), and not uploaded — unless its time cannot be set (in a
    /// shared store, another member's blob): then it is written again.
    public func needsUpload(_ hash: String, size: Int) throws -> Bool {
        guard try blobSize(hash) == UInt64(size) else { return true }
        return !keepAlive(hash)
    }

    /// Set blob `hash`'s modification time to now: a device relies on it.
    @discardableResult
    public func keepAlive(_ hash: String) -> Bool {
        blobPath(hash).withCString { utimensat(AT_FDCWD, $0, nil, 0) } == 0
    }

    public func putBlob(_ hash: String, data: Data) throws {
        precondition(ContentHash.isValid(hash))
        try checkReachableForBlobs()
        let destination = blobURL(hash)
        if let size = try blobSize(hash) {
            // Held: kept alive, and done.
            if size == UInt64(data.count), keepAlive(hash) { return }
            // Cut short or damaged, or another member's whose time cannot be set
            // (a shared store): replace it (rename over it; readers keep what they opened).
            try Self.publish(data, at: destination, tmpDir: root.appendingPathComponent("tmp"), exclusive: false, sync: false, mode: fileMode)
            return
        }
        do {
            try Self.publish(data, at: destination, tmpDir: root.appendingPathComponent("tmp"), exclusive: true, sync: false, mode: fileMode)
        } catch let error as UbiquityError where error.errno == EEXIST {
            return
        } catch let error as UbiquityError where error.errno == ENOENT || error.errno == EHOSTDOWN {
            try makeDirectory(destination.deletingLastPathComponent())
            do {
                try Self.publish(data, at: destination, tmpDir: root.appendingPathComponent("tmp"), exclusive: true, sync: false, mode: fileMode)
            } catch let error as UbiquityError where error.errno == EEXIST {}
        }
    }

    // MARK: Collecting

    public func listBlobs() throws -> [StoredBlob] {
        try checkReachableForBlobs()
        let folder = root.appendingPathComponent("blobs").path
        var out: [StoredBlob] = []
        let buckets = (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []
        for bucket in buckets where bucket.count == 2 {
            for name in (try? FileManager.default.contentsOfDirectory(atPath: folder + "/" + bucket)) ?? [] {
                guard ContentHash.isValid(name), name.hasPrefix(bucket) else { continue }
                var st = stat()
                guard stat(folder + "/" + bucket + "/" + name, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { continue }
                out.append(StoredBlob(hash: name, size: UInt64(st.st_size),
                                      modified: Date(timeIntervalSince1970: Double(st.st_mtim.tv_sec) + Double(st.st_mtim.tv_nsec) / 1e9)))
            }
        }
        return out
    }

    public func removeBlob(_ hash: String, unchangedSince: Date) throws -> Bool {
        precondition(ContentHash.isValid(hash))
        try checkReachableForBlobs()
        var st = stat()
        guard stat(blobPath(hash), &st) == 0 else { return false }
        let modified = Date(timeIntervalSince1970: Double(st.st_mtim.tv_sec) + Double(st.st_mtim.tv_nsec) / 1e9)
        guard modified < unchangedSince else { return false }
        guard unlink(blobPath(hash)) == 0 else {
            if errno == ENOENT { return false }
            throw UbiquityError.posix("remove blob \(hash)")
        }
        return true
    }

    var collectorStateURL: URL { root.appendingPathComponent("gc").appendingPathComponent("state.json") }

    public func collectorState() throws -> Data? {
        try checkReachable()
        do {
            return try Data(contentsOf: collectorStateURL)
        } catch let error as CocoaError where error.code == .fileReadNoSuchFile {
            return nil
        }
    }

    public func setCollectorState(_ data: Data) throws {
        try checkReachable()
        try makeDirectory(collectorStateURL.deletingLastPathComponent())
        try Self.publish(data, at: collectorStateURL, tmpDir: root.appendingPathComponent("tmp"), exclusive: false, mode: fileMode)
    }

    public var compactsJournal: Bool { format >= 3 }

    func journalBaseURL(_ container: String) -> URL { containerDir(container).appendingPathComponent("journal-base") }

    public func journalBase(container: String) throws -> UInt64 {
        try checkReachable()
        let url = journalBaseURL(container)
        do {
            return try JournalBaseFormat.decode(try Data(contentsOf: url), at: url.path)
        } catch let error as CocoaError where error.code == .fileReadNoSuchFile {
            return 0
        }
    }

    public func setJournalBase(container: String, _ base: UInt64) throws {
        try checkReachable()
        let url = journalBaseURL(container)
        try Self.publish(try JournalBaseFormat.encode(base), at: url, tmpDir: root.appendingPathComponent("tmp"), exclusive: false, mode: fileMode)
        // The new name durable before any record goes.
        try LinuxCalls.syncDirectory(url.deletingLastPathComponent().path)
    }

    public func removeRecord(container: String, seq: UInt64) throws {
        try checkReachable()
        try Self.removeIfPresent(journalURL(container, seq))
    }

    public func removeSnapshot(container: String, seq: UInt64) throws {
        try checkReachable()
        try Self.removeIfPresent(snapshotURL(container, seq))
    }

    static func removeIfPresent(_ url: URL) throws {
        guard unlink(url.path) == 0 || errno == ENOENT else { throw UbiquityError.posix("remove \(url.path)") }
    }

    /// One `syncfs(2)` of the store's filesystem makes every blob written
    /// since durable: far cheaper than an fsync per small blob.
    public func flushBlobs() throws {
        let fd = open(root.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw UbiquityError(store: .unreachable, "store \(root.path) is not reachable") }
        defer { close(fd) }
        try syscallRetrying("syncfs \(root.path)") { LinuxCalls.syncfs(fd) }
    }

    /// One `pread` of the range (the caller verifies what it holds).
    public func fetchBlobRange(_ hash: String, offset: UInt64, count: Int) throws -> Data {
        try checkReachable()
        let fd = try openBlob(hash, naming: "pack")
        defer { close(fd) }
        var data = Data(count: count)
        var done = 0
        try data.withUnsafeMutableBytes { raw in
            while done < raw.count {
                let n = try syscallRetrying("read pack \(hash)") { pread(fd, raw.baseAddress! + done, raw.count - done, off_t(offset) + off_t(done)) }
                if n == 0 { break }
                done += n
            }
        }
        guard done == count else {
            throw UbiquityError(store: .damaged, "pack \(hash) in the store ends before bytes \(offset) to \(offset + UInt64(count)) (cut short or damaged)")
        }
        return data
    }

    /// The blob read into a kept 4 MiB buffer (`ChunkBuffer`), a window at
    /// a time, then hashed 256 KiB at a time while that is in the CPU's
    /// cache, and each piece written on. A window the page cache holds whole
    /// (`cachestat`: a blob another device on this machine just wrote) is
    /// read from there; any other with `O_DIRECT`, straight into the buffer,
    /// as one request, so the download does not take a second copy of the
    /// content in memory. Where the store's filesystem refuses `O_DIRECT`,
    /// the window is read through the page cache, asked of the disk at once
    /// (`POSIX_FADV_WILLNEED`). DESIGN.md, "Chunked content and streaming
    /// downloads", says what was tried instead; bench/RESULTS.md has the
    /// measurements.
    public func copyBlob(_ hash: String, size: Int, into fd: Int32, at offset: UInt64) throws {
        try ChunkBuffer.with { buffer in
            try readVerified(hash, size: size, through: buffer) { piece, at in
                try ContentCopy.write(piece, to: fd, at: offset + UInt64(at))
            }
        }
    }

    /// A blob that fits a `ChunkBuffer` read into one (one window),
    /// verified: hashed whole, paired with another worker's chunk where one
    /// is ready or on its way (`HashPairs`).
    public func readBlob(_ hash: String, size: Int, into buffer: UnsafeMutableRawPointer) throws {
        guard size <= ChunkBuffer.size else { throw UbiquityError(EINVAL, "blob \(hash) does not fit a chunk buffer") }
        let pairs = HashPairs.shared
        pairs.expect()
        var digest: String?
        do {
            try readWindows(hash, size: size, through: buffer) { _, count in
                digest = pairs.digest(of: UnsafeRawBufferPointer(start: buffer, count: count))
            }
        } catch {
            if digest == nil { pairs.cancel() }
            throw error
        }
        if digest == nil {   // an empty blob: no window
            pairs.cancel()
            digest = HashPairs.alone(UnsafeRawBufferPointer(start: buffer, count: 0))
        }
        guard digest == hash else { throw Self.damaged(hash) }
    }

    /// A folder store on a local filesystem (by `statfs`'s type: ext4, xfs,
    /// btrfs, tmpfs, …): fetching a chunk again costs less than writing it
    /// while a reader streams (`SyncEngine`'s streams). One across a network
    /// (NFS, SMB, a FUSE mount such as sshfs or rclone, 9p, Ceph) or on a
    /// type not listed here is not: its downloads write each chunk as it
    /// arrives, as an S3 store's do, for a second fetch is another trip
    /// across the wire. Asked of the folder once it answers, then kept.
    public var cheapToFetchAgain: Bool {
        let known = onLocalDisk.load(ordering: .relaxed)
        if known != 0 { return known == 1 }
        let type = ubq_filesystem_type(blobsPath)
        guard type != -1 else { return false }
        let local = Self.localFilesystemTypes.contains(UInt32(truncatingIfNeeded: type))
        onLocalDisk.store(local ? 1 : 2, ordering: .relaxed)
        return local
    }

    /// Whether the folder is on a local filesystem: 0 not known yet, 1 yes, 2 no.
    let onLocalDisk = Atomic<Int>(0)

    /// `statfs` types (`f_type`) of filesystems on local disks or in memory.
    static let localFilesystemTypes: Set<UInt32> = [
        0xEF53,       // ext2, ext3, ext4
        0x5846_5342,  // xfs
        0x9123_683E,  // btrfs
        0x0102_1994,  // tmpfs
        0x8584_58F6,  // ramfs
        0xF2F5_2010,  // f2fs
        0x2FC1_2FC1,  // zfs
        0xCA45_1A4E,  // bcachefs
        0x794C_7630,  // overlayfs
        0x4D44,       // vfat
        0x2011_BAB0,  // exfat
        0x5346_544E,  // ntfs3
        0x3153_464A,  // jfs
        0x5265_4973,  // reiserfs
        0x3434,       // nilfs2
        0x482B,       // hfsplus
    ]

    /// Read blob `hash` through `buffer` a window at a time, hashing each
    /// 256 KiB piece and then handing it to `piece` (with its offset in the
    /// blob); throws, after the last piece, if the blob is not `hash`.
    private func readVerified(_ hash: String, size: Int, through buffer: UnsafeMutableRawPointer,
                              piece body: (UnsafeRawBufferPointer, Int) throws -> Void) throws {
        var hasher = ContentHasher()
        try readWindows(hash, size: size, through: buffer) { window, count in
            var at = 0
            while at < count {
                let piece = UnsafeRawBufferPointer(start: buffer + at, count: min(256 << 10, count - at))
                hasher.update(piece)
                try body(piece, window + at)
                at += piece.count
            }
        }
        guard hasher.finish() == hash else { throw Self.damaged(hash) }
    }

    static func damaged(_ hash: String) -> UbiquityError {
        UbiquityError(store: .damaged, "blob \(hash) in the store is damaged (its content does not match its name)")
    }

    /// Read blob `hash` into `buffer` a window (`ChunkBuffer.size`) at a
    /// time, calling `each` with the window's offset and length once it is
    /// there. A window the page cache holds whole (a blob another device on
    /// this machine just wrote) is read from there; any other with `O_DIRECT`.
    private func readWindows(_ hash: String, size: Int, through buffer: UnsafeMutableRawPointer,
                             _ each: (_ window: Int, _ count: Int) throws -> Void) throws {
        try checkReachableForBlobs()
        let source = try openBlob(hash)
        defer { close(source) }
        var st = stat()
        guard fstat(source, &st) == 0 else { throw UbiquityError.posix("stat blob \(hash)") }
        guard st.st_size == size else { throw UbiquityError(store: .damaged, "blob \(hash) has the wrong size") }
        var direct: Int32?      // opened when the page cache lacks something
        defer { if let direct, direct >= 0 { close(direct) } }
        var window = 0
        while window < size {
            let count = min(ChunkBuffer.size, size - window)
            let pages = (count + ChunkBuffer.alignment - 1) / ChunkBuffer.alignment
            if direct == nil && ubq_cached_pages(source, UInt(window), UInt(count)) < pages {
                direct = open(blobPath(hash), O_RDONLY | O_CLOEXEC | ubq_o_direct())
            }
            try readBlob(hash, direct ?? -1, source, into: buffer, from: window, upTo: window + count)
            try each(window, count)
            window += count
        }
    }

    /// `O_DIRECT` reads of blobs, one at a time in the process: a disk
    /// reads large files faster one after the other than several at once
    /// (bench/RESULTS.md, "Chunked content and streaming downloads", has
    /// the figures). The download workers hash beside the one read.
    static let directReads = DispatchSemaphore(value: 1)

    /// Read bytes `start..<end` of a blob into `buffer`: with `direct` (an
    /// `O_DIRECT` descriptor; -1 for none, or if the filesystem refused
    /// one) in aligned requests, one such read at a time (`directReads`),
    /// else through `buffered`.
    private func readBlob(_ hash: String, _ direct: Int32, _ buffered: Int32, into buffer: UnsafeMutableRawPointer,
                          from start: Int, upTo end: Int) throws {
        var done = start
        var useDirect = direct >= 0
        if !useDirect { _ = posix_fadvise(buffered, off_t(done), off_t(end - done), POSIX_FADV_WILLNEED) }
        if direct >= 0 { Self.directReads.wait() }
        defer { if direct >= 0 { Self.directReads.signal() } }
        while done < end {
            let ask = useDirect ? (end - done + ChunkBuffer.alignment - 1) & ~(ChunkBuffer.alignment - 1) : end - done
            let n = pread(useDirect ? direct : buffered, buffer + (done - start), ask, off_t(done))
            if n < 0 {
                let code = errno
                if code == EINTR { continue }
                if code == EINVAL && useDirect { useDirect = false; continue }   // alignment refused
                throw UbiquityError.posix("read blob \(hash)", errno: code)
            }
            guard n > 0 else { throw UbiquityError(store: .damaged, "blob \(hash) in the store was cut short while read") }
            done += min(n, end - done)
            // O_DIRECT reads whole blocks; a short one (end of file) ends unaligned.
            if useDirect && done % ChunkBuffer.alignment != 0 && done < end { useDirect = false }
        }
    }

    /// Open blob `hash` for reading; a missing one is damage naming it (a
    /// blob, or a pack): the store lost something it said it held.
    func openBlob(_ hash: String, naming kind: String = "blob") throws -> Int32 {
        let fd = open(blobPath(hash), O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            guard code == ENOENT else { throw UbiquityError(EIO, "open \(kind) \(hash) in the store: \(String(cString: strerror(code)))") }
            throw UbiquityError(store: .damaged, "\(kind) \(hash) missing from the store")
        }
        return fd
    }

    public func fetchBlob(_ hash: String) throws -> Data {
        try checkReachableForBlobs()
        let fd = try openBlob(hash)
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw UbiquityError.posix("stat blob \(hash)") }
        var data = Data(count: Int(st.st_size))
        var done = 0
        try data.withUnsafeMutableBytes { raw in
            while done < raw.count {
                let n = try syscallRetrying("read blob \(hash)") { pread(fd, raw.baseAddress! + done, raw.count - done, off_t(done)) }
                if n == 0 { break }
                done += n
            }
        }
        data.count = done
        guard ContentCopy.hash(of: data) == hash else {
            throw Self.damaged(hash)
        }
        return data
    }

    /// Write `data` to a temporary file, fsync it, then publish it at `url`:
    /// with `link(2)` when `exclusive` (fails with EEXIST), else `rename(2)`.
    /// The file gets `mode` exactly (the umask does not apply).
    static func publish(_ data: Data, at url: URL, tmpDir: URL, exclusive: Bool, sync: Bool = true, mode: mode_t) throws {
        let tmp = tmpDir.appendingPathComponent(".tmp-\(NodeID.random())")
        let fd = try syscallRetrying("create \(tmp.path)") { open(tmp.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode) }
        defer { unlink(tmp.path) }
        do {
            try syscallRetrying("chmod \(tmp.path)") { fchmod(fd, mode) }
            try ContentCopy.write(data, to: fd, at: 0)
            if sync { try syscallRetrying("fsync \(tmp.path)") { fsync(fd) } }
        } catch {
            close(fd)
            throw error
        }
        close(fd)
        if exclusive {
            guard link(tmp.path, url.path) == 0 else {
                let code = errno
                if code == ENOENT { throw UbiquityError(store: .unreachable, "store folder \(url.deletingLastPathComponent().path) vanished") }
                throw UbiquityError(code, "publish \(url.path): \(String(cString: strerror(code)))")
            }
        } else {
            guard rename(tmp.path, url.path) == 0 else { throw UbiquityError.posix("publish \(url.path)") }
        }
    }
}

/// The 4 MiB buffers `copyBlob` reads blobs into, kept between chunks (a
/// new one's pages cost the kernel a fault and a zeroing each: more than
/// the copy they save) and freed by `trim` when downloads are over: at
/// most one per download worker, plus the chunks a download holds for
/// streaming readers (`take`/`give`). Aligned to, and asked to be made of,
/// 2 MiB huge pages: an `O_DIRECT` request takes at most `max_segments`
/// separate pieces of memory (254 on a virtio disk), so into 4 KiB pages a
/// 4 MiB read would reach the disk as four requests; into two huge pages it
/// is one.
public enum ChunkBuffer {
    public static let size = 4 << 20
    static let alignment = 4096
    static let hugePage = 2 << 20
    private static let idle = Lock<[UInt]>([])   // addresses: pointers are not Sendable

    static func with<T>(_ body: (UnsafeMutableRawPointer) throws -> T) throws -> T {
        let buffer = try take()
        defer { give(buffer) }
        return try body(buffer)
    }

    /// A buffer for the caller alone until it `give`s it back.
    public static func take() throws -> UnsafeMutableRawPointer {
        if let kept = idle.withLock({ $0.popLast() }).flatMap({ UnsafeMutableRawPointer(bitPattern: $0) }) {
            return kept
        }
        var allocated: UnsafeMutableRawPointer?
        guard posix_memalign(&allocated, hugePage, size) == 0, let allocated else {
            throw UbiquityError(ENOMEM, "no memory for a \(size >> 20) MiB read buffer")
        }
        _ = madvise(allocated, size, MADV_HUGEPAGE)
        return allocated
    }

    public static func give(_ buffer: UnsafeMutableRawPointer) {
        idle.withLock { $0.append(UInt(bitPattern: buffer)) }
    }

    /// Free every buffer not in use.
    public static func trim() {
        for address in idle.withLock({ kept -> [UInt] in defer { kept = [] }; return kept }) {
            free(UnsafeMutableRawPointer(bitPattern: address))
        }
    }
}

/// Bytes `offset ..< offset + count` of a file, served to a reader from
/// memory (a chunk a download holds): the memory stays valid until this is
/// released (`deinit` calls `unpin`).
public final class PinnedBytes: @unchecked Sendable {
    public let offset: UInt64
    public let base: UnsafeRawPointer
    public let count: Int
    private let unpin: @Sendable () -> Void

    public init(offset: UInt64, base: UnsafeRawPointer, count: Int, unpin: @escaping @Sendable () -> Void) {
        self.offset = offset
        self.base = base
        self.count = count
        self.unpin = unpin
    }

    deinit { unpin() }
}
