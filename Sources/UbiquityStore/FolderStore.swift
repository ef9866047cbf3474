import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A store kept in a local (or shared) folder — the embedded default.
///
/// Layout:
/// ```
/// STORE/ubiquityfs-store.json          marker: format and store ID
/// STORE/containers/ID/container.json   container configuration
/// STORE/containers/ID/journal/SEQ      one JSON change set per record (SEQ: 16 digits)
/// STORE/blobs/AB/SHA256                immutable content, AB = first two hex digits
/// STORE/tmp/                           staging for atomic publication
/// ```
/// Journal records are published by `link(2)` of a fully written temporary
/// file, which fails with `EEXIST` if the sequence number is taken: readers
/// never see a partial record and two devices never both win.
public final class FolderStore: Store {
    public static let markerName = "ubiquityfs-store.json"
    static let formatVersion = 1

    struct Marker: Codable {
        var format: Int
        var storeID: String
    }

    public let root: URL
    public let storeID: String

    /// Open the store at `root`.
    ///
    /// A missing folder is created only when `create` is set (the default
    /// store). An existing empty folder becomes a new store only when
    /// `initializeEmpty` is set — a replica that already knows this store
    /// must see an empty folder as "unreachable", never as "everything was
    /// deleted".
    public init(root: URL, create: Bool, initializeEmpty: Bool) throws {
        self.root = root.standardizedFileURL
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
            guard let marker = try? JSONDecoder().decode(Marker.self, from: data), !marker.storeID.isEmpty else {
                throw UbiquityError(EINVAL, "store marker \(markerURL.path) is damaged; refusing to use this folder as a store")
            }
            guard marker.format <= Self.formatVersion else {
                throw UbiquityError(EPROTONOSUPPORT, "store \(self.root.path) has format \(marker.format); this ubiquityfs reads format \(Self.formatVersion) — upgrade it")
            }
            storeID = marker.storeID
        } else {
            guard access(self.root.path, R_OK) == 0 else {
                throw UbiquityError(EACCES, "store \(self.root.path) is not readable")
            }
            let contents = (try? fm.contentsOfDirectory(atPath: self.root.path)) ?? []
            guard contents.isEmpty else {
                throw UbiquityError(EINVAL, "\(self.root.path) is not a ubiquityfs store (no \(Self.markerName)) and is not empty")
            }
            guard create || initializeEmpty else {
                throw UbiquityError(ENOENT, "store \(self.root.path) is empty: it is not reachable (no \(Self.markerName))")
            }
            storeID = UUID().uuidString.lowercased()
            try Self.ensureWritable(self.root)
            let marker = try JSONEncoder().encode(Marker(format: Self.formatVersion, storeID: storeID))
            try Self.publish(marker, at: markerURL, tmpDir: self.root, exclusive: true)
        }
        try Self.ensureWritable(self.root)
        for dir in ["containers", "blobs", "tmp"] {
            try? fm.createDirectory(at: self.root.appendingPathComponent(dir), withIntermediateDirectories: true)
        }
    }

    /// A store this device knows (`storeID`) whose folder is not reachable
    /// now: every call fails with `EHOSTDOWN` until the folder and its marker
    /// are back. The mount works offline meanwhile.
    public init(unreachableAt root: URL, storeID: String) {
        self.root = root.standardizedFileURL
        self.storeID = storeID
    }

    static func ensureWritable(_ root: URL) throws {
        guard access(root.path, W_OK | X_OK) == 0 else {
            throw UbiquityError(EACCES, "store \(root.path) is not writable")
        }
    }

    /// Whether `root` currently looks like this store (the marker decides).
    public var isReachable: Bool {
        guard let data = FileManager.default.contents(atPath: root.appendingPathComponent(Self.markerName).path),
              let marker = try? JSONDecoder().decode(Marker.self, from: data) else { return false }
        return marker.storeID == storeID
    }

    func containerDir(_ id: String) -> URL { root.appendingPathComponent("containers").appendingPathComponent(id) }
    func journalURL(_ container: String, _ seq: UInt64) -> URL {
        containerDir(container).appendingPathComponent("journal").appendingPathComponent(Self.seqName(seq))
    }
    static func seqName(_ seq: UInt64) -> String {
        let digits = String(seq)
        return String(repeating: "0", count: max(0, 16 - digits.count)) + digits
    }
    func blobURL(_ hash: String) -> URL {
        root.appendingPathComponent("blobs").appendingPathComponent(String(hash.prefix(2))).appendingPathComponent(hash)
    }

    func checkReachable() throws {
        guard isReachable else { throw UbiquityError(EHOSTDOWN, "store \(root.path) is not reachable") }
    }

    public func containerConfig(_ container: String) throws -> ContainerConfig? {
        try checkReachable()
        let url = containerDir(container).appendingPathComponent("container.json")
        guard let data = FileManager.default.contents(atPath: url.path) else { return nil }
        do {
            return try JSONDecoder().decode(ContainerConfig.self, from: data)
        } catch {
            throw UbiquityError(EINVAL, "container configuration \(url.path) is damaged: \(error)")
        }
    }

    /// Create a container; `EEXIST` if it exists (two devices creating one race safely).
    public func createContainer(_ config: ContainerConfig) throws {
        try config.validate()
        try checkReachable()
        let dir = containerDir(config.id)
        try FileManager.default.createDirectory(at: dir.appendingPathComponent("journal"), withIntermediateDirectories: true)
        do {
            try Self.publish(try Self.encode(config), at: dir.appendingPathComponent("container.json"),
                             tmpDir: root.appendingPathComponent("tmp"), exclusive: true)
        } catch let error as UbiquityError where error.errno == EEXIST {
            throw UbiquityError(EEXIST, "container \(config.id) already exists")
        }
    }

    public func updateContainer(_ config: ContainerConfig) throws {
        try config.validate()
        guard try containerConfig(config.id) != nil else { throw UbiquityError(ENOENT, "no container \(config.id)") }
        try Self.publish(try Self.encode(config), at: containerDir(config.id).appendingPathComponent("container.json"),
                         tmpDir: root.appendingPathComponent("tmp"), exclusive: false)
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

    static func encode(_ config: ContainerConfig) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        return try encoder.encode(config)
    }

    public func commit(container: String, seq: UInt64, changeSet: ChangeSet) throws -> Bool {
        try checkReachable()
        let data = try JSONEncoder().encode(changeSet)
        do {
            try Self.publish(data, at: journalURL(container, seq), tmpDir: root.appendingPathComponent("tmp"), exclusive: true)
            return true
        } catch let error as UbiquityError where error.errno == EEXIST {
            return false
        }
    }

    public func journal(container: String, after seq: UInt64, limit: Int) throws -> [(seq: UInt64, changeSet: ChangeSet)] {
        try checkReachable()
        var records: [(seq: UInt64, changeSet: ChangeSet)] = []
        var next = seq + 1
        let decoder = JSONDecoder()
        while records.count < limit {
            let url = journalURL(container, next)
            guard let data = FileManager.default.contents(atPath: url.path) else { break }
            do {
                records.append((next, try decoder.decode(ChangeSet.self, from: data)))
            } catch {
                throw UbiquityError(EIO, "journal record \(url.path) is damaged: \(error)")
            }
            next += 1
        }
        return records
    }

    public func blobSize(_ hash: String) throws -> UInt64? {
        try checkReachable()
        var st = stat()
        guard stat(blobURL(hash).path, &st) == 0 else {
            let code = errno
            if code == ENOENT || code == ENOTDIR { return nil }
            throw UbiquityError(EIO, "stat blob \(hash): \(String(cString: strerror(code)))")
        }
        return UInt64(st.st_size)
    }

    public func putBlob(_ hash: String, data: Data) throws {
        precondition(ContentCopy.isValidHash(hash))
        try checkReachable()
        let destination = blobURL(hash)
        if let size = try blobSize(hash) {
            if size == UInt64(data.count) { return }
            // Cut short or damaged: replace it (rename over it; readers keep what they opened).
            try Self.publish(data, at: destination, tmpDir: root.appendingPathComponent("tmp"), exclusive: false, sync: false)
            return
        }
        do {
            try Self.publish(data, at: destination, tmpDir: root.appendingPathComponent("tmp"), exclusive: true, sync: false)
        } catch let error as UbiquityError where error.errno == EEXIST {
            return
        } catch let error as UbiquityError where error.errno == ENOENT || error.errno == EHOSTDOWN {
            try FileManager.default.createDirectory(at: destination.deletingLastPathComponent(), withIntermediateDirectories: true)
            do {
                try Self.publish(data, at: destination, tmpDir: root.appendingPathComponent("tmp"), exclusive: true, sync: false)
            } catch let error as UbiquityError where error.errno == EEXIST {}
        }
    }

    /// One `syncfs(2)` of the store's filesystem makes every blob written
    /// since durable: far cheaper than an fsync per small blob.
    public func flushBlobs() throws {
        let fd = open(root.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw UbiquityError(EHOSTDOWN, "store \(root.path) is not reachable") }
        defer { close(fd) }
        try syscallRetrying("syncfs \(root.path)") { LinuxCalls.syncfs(fd) }
    }

    public func fetchBlob(_ hash: String) throws -> Data {
        try checkReachable()
        let path = blobURL(hash).path
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            throw UbiquityError(EIO, "blob \(hash) missing from the store: \(String(cString: strerror(code)))")
        }
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
            throw UbiquityError(EIO, "blob \(hash) in the store is damaged (its content does not match its name)")
        }
        return data
    }

    /// Write `data` to a temporary file, fsync it, then publish it at `url`:
    /// with `link(2)` when `exclusive` (fails with EEXIST), else `rename(2)`.
    static func publish(_ data: Data, at url: URL, tmpDir: URL, exclusive: Bool, sync: Bool = true) throws {
        let tmp = tmpDir.appendingPathComponent(".tmp-\(UUID().uuidString)")
        let fd = try syscallRetrying("create \(tmp.path)") { open(tmp.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644) }
        defer { unlink(tmp.path) }
        do {
            try data.withUnsafeBytes { raw in
                var written = 0
                while written < raw.count {
                    written += try syscallRetrying("write \(tmp.path)") { write(fd, raw.baseAddress! + written, raw.count - written) }
                }
            }
            if sync { try syscallRetrying("fsync \(tmp.path)") { fsync(fd) } }
        } catch {
            close(fd)
            throw error
        }
        close(fd)
        if exclusive {
            guard link(tmp.path, url.path) == 0 else {
                let code = errno
                if code == ENOENT { throw UbiquityError(EHOSTDOWN, "store folder \(url.deletingLastPathComponent().path) vanished") }
                throw UbiquityError(code, "publish \(url.path): \(String(cString: strerror(code)))")
            }
        } else {
            guard rename(tmp.path, url.path) == 0 else { throw UbiquityError.posix("publish \(url.path)") }
        }
    }
}
