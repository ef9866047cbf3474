import Foundation
import UbiquityLocks
import UbiquityModel
#if canImport(Glibc)
import Glibc
#endif

/// Recently Deleted inside the mount, where file managers look for a
/// volume's trash: the freedesktop.org trash layout at the mount's root,
/// `.Trash-UID/files/NAME` (each deleted item, by its name) and
/// `.Trash-UID/info/NAME.trashinfo` (where it was and when it was deleted),
/// so gvfs lists it in `trash:///` and Nautilus's Trash shows it.
///
/// Read-only: the items are in the store's history, not in the replica, so
/// the folder is made up from the mount's trash listing (refreshed at most
/// every 2 seconds) and every change in it is refused with `EROFS`;
/// `ubiquityfs restore --deleted` and `trash --empty` change it. A deleted
/// file shows its size but its content is not readable here (`EACCES`): it
/// is not downloaded until restored. A deleted folder shows empty. A
/// file manager's "Move to Trash" on the mount finds a trash it cannot
/// write and offers to delete instead — which keeps the item in Recently
/// Deleted all the same — rather than making a real `.Trash-UID` folder
/// that would sync to every device.
///
/// The folder is found by name (`lookup`) but not listed at the root, as
/// ZFS's hidden `.zfs`: tree walkers and comparisons do not see it.
///
/// A wrapper around the mount's file system: inode numbers at or above
/// `virtualBase` and handle numbers from `handleBase` up are this folder's;
/// everything else passes through.
public final class TrashFolder: MountedFileSystem {
    /// One deleted item as the mount shows it.
    public struct Item: Sendable {
        public var id: String
        /// Where it was, relative to the mount's root.
        public var path: String
        public var isDirectory: Bool
        public var size: UInt64
        public var deleted: Date

        public init(id: String, path: String, isDirectory: Bool, size: UInt64, deleted: Date) {
            self.id = id
            self.path = path
            self.isDirectory = isDirectory
            self.size = size
            self.deleted = deleted
        }
    }

    let base: any MountedFileSystem
    let owner: (uid: UInt32, gid: UInt32)
    let items: @Sendable () -> [Item]
    /// `.Trash-UID`.
    public let name: FileName

    static let virtualBase: UInt64 = 0xFFFF << 48
    static let folderIno = virtualBase + 1
    static let filesIno = virtualBase + 2
    static let infoIno = virtualBase + 3
    static let firstItemIno = virtualBase + 16
    /// Handles of this folder's opens (the drive's are below: slot << 48).
    static let handleBase: UInt64 = 1 << 62

    /// A node of the folder.
    enum Node: Sendable {
        case folder, files, infoFolder
        case item(Item)
        case info(Item, [UInt8])
    }

    struct State {
        var shownAt = Date.distantPast
        /// Each item's number (two inodes: its entry in `files`, its `.trashinfo`), kept across refreshes.
        var numbers: [String: UInt64] = [:]
        var nextNumber: UInt64 = 0
        /// Name in `files` → item, as last listed.
        var byName: [FileName: Item] = [:]
        var names: [String: FileName] = [:]
        var handles: [UInt64: Node] = [:]
        var nextHandle: UInt64 = 0
    }
    let state = Lock(State())

    public init(base: any MountedFileSystem, owner: (uid: UInt32, gid: UInt32), items: @escaping @Sendable () -> [Item]) {
        self.base = base
        self.owner = owner
        self.items = items
        name = FileName(".Trash-\(owner.uid)")
    }

    public var entryTimeout: Double { 1 }
    public var attributeTimeout: Double { 1 }

    static func isVirtual(_ number: UInt64) -> Bool { number >= virtualBase }

    /// The items as last listed, refreshed when older than 2 seconds.
    func current() -> (byName: [FileName: Item], numbers: [String: UInt64]) {
        let stale = state.withLock { -$0.shownAt.timeIntervalSinceNow > 2 }
        if stale {
            let listed = items()
            state.withLock { s in
                s.shownAt = Date()
                s.byName = [:]
                s.names = [:]
                for item in listed.sorted(by: { $0.deleted > $1.deleted }) {
                    if s.numbers[item.id] == nil {
                        s.numbers[item.id] = Self.firstItemIno + 2 * s.nextNumber
                        s.nextNumber += 1
                    }
                    let base = (item.path as NSString).lastPathComponent
                    var name = FileName(base.isEmpty ? item.id : base)
                    var counter = 2
                    while s.byName[name] != nil {
                        name = FileName("\(base).\(counter)")
                        counter += 1
                    }
                    s.byName[name] = item
                    s.names[item.id] = name
                }
            }
        }
        return state.withLock { ($0.byName, $0.numbers) }
    }

    /// The node of virtual inode `ino`.
    func node(_ ino: UInt64) throws -> Node {
        switch ino {
        case Self.folderIno: return .folder
        case Self.filesIno: return .files
        case Self.infoIno: return .infoFolder
        default:
            let (byName, numbers) = current()
            for item in byName.values {
                guard let number = numbers[item.id] else { continue }
                if ino == number { return .item(item) }
                if ino == number + 1 { return .info(item, Self.trashInfo(item)) }
            }
            throw UbiquityError(ENOENT)
        }
    }

    /// `[Trash Info]`, `Path=` (relative to the mount's root, URL-escaped),
    /// `DeletionDate=` (local time), as the trash specification has them.
    static func trashInfo(_ item: Item) -> [UInt8] {
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: "%;?#")
        let path = item.path.addingPercentEncoding(withAllowedCharacters: allowed) ?? item.path
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "yyyy-MM-dd'T'HH:mm:ss"
        return Array("[Trash Info]\nPath=\(path)\nDeletionDate=\(formatter.string(from: item.deleted))\n".utf8)
    }

    func attributes(_ ino: UInt64, _ node: Node) -> Attributes {
        let now = Timespec.now()
        var mode: UInt32, size: UInt64 = 0, time = now
        switch node {
        case .folder, .files, .infoFolder:
            mode = UInt32(S_IFDIR) | 0o700
        case .item(let item):
            mode = item.isDirectory ? UInt32(S_IFDIR) | 0o500 : UInt32(S_IFREG) | 0o400
            size = item.isDirectory ? 0 : item.size
            time = Timespec(nanoseconds: Int64(item.deleted.timeIntervalSince1970 * 1e9))
        case .info(let item, let bytes):
            mode = UInt32(S_IFREG) | 0o400
            size = UInt64(bytes.count)
            time = Timespec(nanoseconds: Int64(item.deleted.timeIntervalSince1970 * 1e9))
        }
        let isDirectory = mode & UInt32(S_IFMT) == UInt32(S_IFDIR)
        return Attributes(ino: ino, mode: mode, nlink: isDirectory ? 2 : 1, uid: owner.uid, gid: owner.gid, rdev: 0,
                          size: size, blocks: (size + 511) / 512, atime: time, mtime: time, ctime: time)
    }

    func entry(_ ino: UInt64, _ node: Node) -> EntryReply {
        EntryReply(ino: ino, attributes: attributes(ino, node), entryTimeout: entryTimeout, attributeTimeout: attributeTimeout)
    }

    static let readOnly = UbiquityError(EROFS, "Recently Deleted is read-only here: use `ubiquityfs restore --deleted` or `ubiquityfs trash --empty`")

    // MARK: - Lookup and attributes

    public func lookup(parent: UInt64, name: FileName) throws -> EntryReply {
        if parent == 1 && name == self.name { return entry(Self.folderIno, .folder) }
        guard Self.isVirtual(parent) else { return try base.lookup(parent: parent, name: name) }
        switch try node(parent) {
        case .folder:
            if name == FileName("files") { return entry(Self.filesIno, .files) }
            if name == FileName("info") { return entry(Self.infoIno, .infoFolder) }
        case .files:
            let (byName, numbers) = current()
            if let item = byName[name], let number = numbers[item.id] { return entry(number, .item(item)) }
        case .infoFolder:
            let (byName, numbers) = current()
            let text = name.description
            if text.hasSuffix(".trashinfo"), let item = byName[FileName(String(text.dropLast(".trashinfo".count)))],
               let number = numbers[item.id] {
                return entry(number + 1, .info(item, Self.trashInfo(item)))
            }
        case .item, .info:
            break
        }
        throw UbiquityError(ENOENT)
    }

    public func entry(ino: UInt64) throws -> EntryReply {
        Self.isVirtual(ino) ? entry(ino, try node(ino)) : try base.entry(ino: ino)
    }

    public func forget(ino: UInt64, count: UInt64) {
        if !Self.isVirtual(ino) { base.forget(ino: ino, count: count) }
    }

    public func getattr(ino: UInt64) throws -> Attributes {
        Self.isVirtual(ino) ? attributes(ino, try node(ino)) : try base.getattr(ino: ino)
    }

    public func setattr(ino: UInt64, changes: AttributeChanges, handle: UInt64?) throws -> Attributes {
        if Self.isVirtual(ino) { throw Self.readOnly }
        return try base.setattr(ino: ino, changes: changes, handle: handle)
    }

    public func readlink(ino: UInt64) throws -> String {
        if Self.isVirtual(ino) { throw UbiquityError(EINVAL) }
        return try base.readlink(ino: ino)
    }

    // MARK: - Changes: refused in the folder, and its name at the root

    func refuse(parent: UInt64, name: FileName) throws {
        if Self.isVirtual(parent) { throw Self.readOnly }
        if parent == 1 && name == self.name { throw UbiquityError(EEXIST, "\(name) is Recently Deleted") }
    }

    public func mknod(parent: UInt64, name: FileName, mode: UInt32, rdev: UInt64, caller: Caller) throws -> EntryReply {
        try refuse(parent: parent, name: name)
        return try base.mknod(parent: parent, name: name, mode: mode, rdev: rdev, caller: caller)
    }

    public func mkdir(parent: UInt64, name: FileName, mode: UInt32, caller: Caller) throws -> EntryReply {
        try refuse(parent: parent, name: name)
        return try base.mkdir(parent: parent, name: name, mode: mode, caller: caller)
    }

    public func symlink(target: String, parent: UInt64, name: FileName, caller: Caller) throws -> EntryReply {
        try refuse(parent: parent, name: name)
        return try base.symlink(target: target, parent: parent, name: name, caller: caller)
    }

    public func create(parent: UInt64, name: FileName, mode: UInt32, flags: Int32, caller: Caller) throws -> (EntryReply, OpenReply) {
        try refuse(parent: parent, name: name)
        return try base.create(parent: parent, name: name, mode: mode, flags: flags, caller: caller)
    }

    public func link(ino: UInt64, newParent: UInt64, newName: FileName) throws -> EntryReply {
        if Self.isVirtual(ino) { throw Self.readOnly }
        try refuse(parent: newParent, name: newName)
        return try base.link(ino: ino, newParent: newParent, newName: newName)
    }

    public func unlink(parent: UInt64, name: FileName) throws {
        try refuse(parent: parent, name: name)
        try base.unlink(parent: parent, name: name)
    }

    public func rmdir(parent: UInt64, name: FileName) throws {
        try refuse(parent: parent, name: name)
        try base.rmdir(parent: parent, name: name)
    }

    public func rename(parent: UInt64, name: FileName, newParent: UInt64, newName: FileName, flags: RenameFlags) throws {
        try refuse(parent: parent, name: name)
        try refuse(parent: newParent, name: newName)
        try base.rename(parent: parent, name: name, newParent: newParent, newName: newName, flags: flags)
    }

    // MARK: - Content

    func virtualHandle(_ node: Node) -> UInt64 {
        state.withLock { s in
            s.nextHandle += 1
            let handle = Self.handleBase | s.nextHandle
            s.handles[handle] = node
            return handle
        }
    }

    func handleNode(_ handle: UInt64) throws -> Node {
        guard let node = state.withLock({ $0.handles[handle] }) else { throw UbiquityError(EBADF) }
        return node
    }

    public func open(ino: UInt64, flags: Int32, backing: (any BackingFiles)?) throws -> OpenReply {
        guard Self.isVirtual(ino) else { return try base.open(ino: ino, flags: flags, backing: backing) }
        if flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0 { throw Self.readOnly }
        switch try node(ino) {
        case .info(let item, let bytes):
            return OpenReply(handle: virtualHandle(.info(item, bytes)), keepCache: false, acknowledgedWithoutFlush: true)
        case .item:
            throw UbiquityError(EACCES, "a deleted file's content is not readable here: `ubiquityfs restore --deleted` brings it back")
        case .folder, .files, .infoFolder:
            throw UbiquityError(EISDIR)
        }
    }

    public func read(handle: UInt64, offset: Int64, size: Int) throws -> ReadReply {
        guard handle >= Self.handleBase else { return try base.read(handle: handle, offset: offset, size: size) }
        guard case .info(_, let bytes) = try handleNode(handle) else { throw UbiquityError(EISDIR) }
        let start = min(Int(max(0, offset)), bytes.count)
        return .bytes(Array(bytes[start..<min(bytes.count, start + size)]))
    }

    public func write(handle: UInt64, offset: Int64, bytes: UnsafeRawPointer, count: Int) throws -> Int {
        if handle >= Self.handleBase { throw Self.readOnly }
        return try base.write(handle: handle, offset: offset, bytes: bytes, count: count)
    }

    public func flush(handle: UInt64) throws {
        if handle < Self.handleBase { try base.flush(handle: handle) }
    }

    public func fsync(handle: UInt64, dataOnly: Bool) throws {
        if handle < Self.handleBase { try base.fsync(handle: handle, dataOnly: dataOnly) }
    }

    public func release(handle: UInt64) throws {
        guard handle >= Self.handleBase else { return try base.release(handle: handle) }
        _ = state.withLock { $0.handles.removeValue(forKey: handle) }
    }

    public func fallocate(handle: UInt64, mode: Int32, offset: Int64, length: Int64) throws {
        if handle >= Self.handleBase { throw Self.readOnly }
        try base.fallocate(handle: handle, mode: mode, offset: offset, length: length)
    }

    // MARK: - Listings

    public func opendir(ino: UInt64) throws -> UInt64 {
        guard Self.isVirtual(ino) else { return try base.opendir(ino: ino) }
        let node = try node(ino)
        switch node {
        case .folder, .files, .infoFolder: return virtualHandle(node)
        case .item(let item) where item.isDirectory: return virtualHandle(node)
        default: throw UbiquityError(ENOTDIR)
        }
    }

    public func listingCache(ino: UInt64) -> ListingCache {
        Self.isVirtual(ino) ? .off : base.listingCache(ino: ino)
    }

    public func readdir(handle: UInt64, offset: Int64, into sink: ListingSink) throws {
        guard handle >= Self.handleBase else { return try base.readdir(handle: handle, offset: offset, into: sink) }
        let node = try handleNode(handle)
        var entries: [(FileName, UInt64, Node)] = []
        switch node {
        case .folder:
            entries = [(FileName("files"), Self.filesIno, .files), (FileName("info"), Self.infoIno, .infoFolder)]
        case .files, .infoFolder:
            let (byName, numbers) = current()
            for (name, item) in byName.sorted(by: { $0.key.bytes.lexicographicallyPrecedes($1.key.bytes) }) {
                guard let number = numbers[item.id] else { continue }
                if case .files = node {
                    entries.append((name, number, .item(item)))
                } else {
                    entries.append((FileName(name.description + ".trashinfo"), number + 1, .info(item, Self.trashInfo(item))))
                }
            }
        default:
            break
        }
        let (own, up): (UInt64, UInt64) = switch node {
        case .folder: (Self.folderIno, 1)
        case .files: (Self.filesIno, Self.folderIno)
        case .infoFolder: (Self.infoIno, Self.folderIno)
        case .item(let item): (current().numbers[item.id] ?? Self.filesIno, Self.filesIno)
        case .info: (Self.infoIno, Self.folderIno)
        }
        var all: [(FileName, UInt64, UInt32)] = [(FileName("."), own, UInt32(S_IFDIR)), (FileName(".."), up, UInt32(S_IFDIR))]
        all += entries.map { name, ino, node in (name, ino, attributes(ino, node).mode & UInt32(S_IFMT)) }
        for (index, element) in all.enumerated().dropFirst(Int(max(0, offset))) {
            let taken = element.0.bytes.withUnsafeBytes { name in
                sink(ListedEntry(name: name, ino: element.1, type: element.2, nextOffset: Int64(index + 1)))
            }
            if !taken { return }
        }
    }

    public func releasedir(handle: UInt64) {
        guard handle >= Self.handleBase else { return base.releasedir(handle: handle) }
        _ = state.withLock { $0.handles.removeValue(forKey: handle) }
    }

    public func fsyncdir(handle: UInt64) throws {
        if handle < Self.handleBase { try base.fsyncdir(handle: handle) }
    }

    // MARK: - Extended attributes, statistics, the session's end

    public func setxattr(ino: UInt64, name: String, value: Data, flags: Int32) throws {
        if Self.isVirtual(ino) { throw Self.readOnly }
        try base.setxattr(ino: ino, name: name, value: value, flags: flags)
    }

    public func getxattr(ino: UInt64, name: String) throws -> Data {
        if Self.isVirtual(ino) { throw UbiquityError(ENODATA) }
        return try base.getxattr(ino: ino, name: name)
    }

    public func listxattr(ino: UInt64) throws -> [String] {
        Self.isVirtual(ino) ? [] : try base.listxattr(ino: ino)
    }

    public func removexattr(ino: UInt64, name: String) throws {
        if Self.isVirtual(ino) { throw Self.readOnly }
        try base.removexattr(ino: ino, name: name)
    }

    public func statfs() throws -> FilesystemStatistics { try base.statfs() }

    public func releaseKernelReferences() -> KernelRelease { base.releaseKernelReferences() }
}
