import Foundation
import Logging
import UbiquityFS
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// One entry of a listing, its name copied out.
struct ListedName {
    var name: FileName
    var ino: UInt64
    var nextOffset: Int64
}

extension MountedFileSystem {
    /// At most `limit` entries of a listing after `offset`: one page, as
    /// the kernel reads it.
    func page(handle: UInt64, offset: Int64, limit: Int) throws -> [ListedName] {
        var page: [ListedName] = []
        try readdir(handle: handle, offset: offset) { item in
            guard page.count < limit else { return false }
            page.append(ListedName(name: FileName(bytes: Array(item.name)), ino: item.ino, nextOffset: item.nextOffset))
            return true
        }
        return page
    }
}

/// One device for core tests: a replica in a temporary folder, a sync
/// engine on a shared store, and the filesystem core — no kernel.
final class TestDevice: @unchecked Sendable {   // lets only; used from one test at a time
    let directory: URL
    let replica: Replica
    let engine: SyncEngine
    let fs: FileSystem
    static let container = "com.example.test"

    init(store: any Store, name: String = "device", directory: URL? = nil,
         snapshotInterval: UInt64 = SyncEngine.defaultSnapshotInterval,
         clock: @escaping @Sendable () -> Timespec = { .now() }, retentionDays: Int? = nil, boot: String? = nil,
         downloadClock: @escaping @Sendable () -> Date = { Date() }) throws {
        self.directory = directory ?? FileManager.default.temporaryDirectory
            .appendingPathComponent("ubq-core-\(UUID().uuidString)")
        replica = try Replica(directory: self.directory, rootOwner: (0, 0), boot: boot)
        if try store.containerConfig(Self.container) == nil {
            try store.createContainer(ContainerConfig(id: Self.container, displayName: "Test", retentionDays: retentionDays))
        }
        engine = SyncEngine(replica: replica, store: store, container: Self.container,
                            device: DeviceIdentity(id: "\(name)-\(UUID().uuidString)", name: name),
                            logger: Logger(label: "test"), writeBackDelay: 0, snapshotInterval: snapshotInterval, clock: clock,
                            downloadClock: downloadClock)
        // As the daemon does when it opens a replica.
        try engine.recoverInterruptedWrites()
        fs = FileSystem(replica: replica, hooks: engine)
    }

    func cleanUp() { try? FileManager.default.removeItem(at: directory) }

    // Path-level helpers on top of the inode-level core.

    func resolve(_ path: String) throws -> UInt64 {
        var ino = Namespace.rootIno
        for part in path.split(separator: "/") {
            ino = try fs.lookup(parent: ino, name: FileName(String(part))).ino
        }
        return ino
    }

    func split(_ path: String) throws -> (UInt64, FileName) {
        let parts = path.split(separator: "/")
        let parent = try resolve(parts.dropLast().joined(separator: "/"))
        return (parent, FileName(String(parts.last!)))
    }

    @discardableResult
    func write(_ path: String, _ text: String, mode: UInt32 = 0o644) throws -> UInt64 {
        let (parent, name) = try split(path)
        let handle: UInt64
        let ino: UInt64
        if let existing = try? fs.lookup(parent: parent, name: name) {
            ino = existing.ino
            handle = try fs.open(ino: ino, flags: O_WRONLY | O_TRUNC).handle
        } else {
            let (entry, opened) = try fs.create(parent: parent, name: name, mode: mode, flags: O_WRONLY, caller: .root)
            ino = entry.ino
            handle = opened.handle
        }
        let bytes = Array(text.utf8)
        _ = try bytes.withUnsafeBytes { try fs.write(handle: handle, offset: 0, bytes: $0.baseAddress!, count: $0.count) }
        try fs.flush(handle: handle)
        try fs.release(handle: handle)
        return ino
    }

    func read(_ path: String) throws -> String {
        let ino = try resolve(path)
        let handle = try fs.open(ino: ino, flags: O_RDONLY).handle
        defer { try? fs.release(handle: handle) }
        let size = Int(try fs.getattr(ino: ino).size)
        return String(decoding: Self.bytes(of: try fs.read(handle: handle, offset: 0, size: size)), as: UTF8.self)
    }

    /// What the FUSE adapter would send for `reply`.
    static func bytes(of reply: ReadReply) -> Data {
        switch reply {
        case .fileRange(let fd, let at, let size, _):
            var buffer = [UInt8](repeating: 0, count: size)
            let n = pread(fd, &buffer, size, off_t(at))
            return Data(buffer[0..<max(0, n)])
        case .memory(let pinned, _):
            return Data(bytes: pinned.base, count: pinned.count)
        case .bytes(let bytes, _):
            return Data(bytes)
        }
    }

    func mkdir(_ path: String) throws {
        let (parent, name) = try split(path)
        _ = try fs.mkdir(parent: parent, name: name, mode: 0o755, caller: .root)
    }

    func list(_ path: String) throws -> [String] {
        let handle = try fs.opendir(ino: try resolve(path))
        defer { fs.releasedir(handle: handle) }
        return try fs.page(handle: handle, offset: 0, limit: .max)
            .map(\.name.description).filter { $0 != "." && $0 != ".." }.sorted()
    }

    /// Every path with its kind and content (files) or target (symlinks).
    func tree(_ path: String = "") throws -> [String: String] {
        var out: [String: String] = [:]
        for name in try list(path) {
            let child = path.isEmpty ? name : path + "/" + name
            let attributes = try fs.getattr(ino: try resolve(child))
            switch attributes.mode & UInt32(S_IFMT) {
            case UInt32(S_IFDIR):
                out[child] = "dir \(String(attributes.mode & 0o7777, radix: 8))"
                out.merge(try tree(child)) { a, _ in a }
            case UInt32(S_IFLNK): out[child] = "link " + (try fs.readlink(ino: try resolve(child)))
            default: out[child] = "file \(String(attributes.mode & 0o7777, radix: 8)) " + (try read(child))
            }
        }
        return out
    }
}
