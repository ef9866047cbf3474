import Foundation
import UbiquityLocks
import UbiquityReplica
import UbiquityModel
#if canImport(Glibc)
import Glibc
#endif

/// The drive view (`ubiquityfs mount MOUNTPOINT`): the home container — the
/// drive's own, like iCloud Drive's `com.apple.CloudDocs` — at the root,
/// and one folder per container whose Documents scope is public, showing
/// that container's Documents. A container's Data scope never shows here.
///
/// Each container is served by its own `FileSystem` (a view of its
/// replica); this class only routes. Kernel inode and handle numbers carry
/// the container's slot in their top 16 bits: slot 0 is the home container
/// (numbers unchanged), slot k ≥ 1 an app container, whose folder is inode
/// `k << 48 | 1` (its FileSystem's root). Replica inodes stay below 2^48.
/// Slots come from the daemon, which keeps them per device: numbers are
/// stable across remounts.
///
/// Folders are named by display name. When two containers share one, the
/// container first by ID keeps it and the others show as `NAME (ID)`; an
/// item of the home container with that name wins the same way (the folder
/// shows as `NAME (ID)`), so nothing of the user's is ever hidden. A
/// container folder behaves like a mount point: removing or renaming it, or
/// renaming onto it, is EBUSY; creating its name is EEXIST; moves and links
/// between containers are EXDEV (`mv` then copies).
///
/// Lock order: `table` is taken alone, never while calling a FileSystem.
public final class DriveFileSystem: MountedFileSystem {
    public let home: FileSystem

    struct Table {
        /// Slot ≥ 1 → the FileSystem of that container (kept while the daemon
        /// runs, so the kernel's inodes stay valid when a folder is hidden).
        var slots: [Int: FileSystem] = [:]
        var slotByContainer: [String: Int] = [:]
        /// Shown folders, ordered by container ID.
        var visible: [(containerID: String, displayName: String, slot: Int)] = []
        /// The folders as listed when each root listing began (handle → folders).
        var rootListings: [UInt64: [(name: FileName, slot: Int)]] = [:]
    }
    let table = Lock(Table())

    static let slotShift: UInt64 = 48
    /// The top bit of a handle is `KernelEventReplay`'s.
    static let maxSlot = 0x7fff
    static let localMask: UInt64 = (1 << 48) - 1
    /// Listing offsets at and above this are container folders (after the home entries).
    static let folderOffsetBase: Int64 = 1 << 62

    /// The slot of a container (the daemon keeps them, so that inode numbers
    /// stay the same across remounts).
    let slotFor: @Sendable (String) -> Int

    public init(home: FileSystem, slotFor: @escaping @Sendable (String) -> Int) {
        self.home = home
        self.slotFor = slotFor
    }

    public var entryTimeout: Double { home.entryTimeout }
    public var attributeTimeout: Double { home.attributeTimeout }

    // MARK: - Folders

    /// Show exactly these containers' folders. `fileSystem` gives the view of
    /// a container not seen before (nil: not shown). Returns every name that
    /// appeared or disappeared at the root (for the kernel's caches).
    public func update(folders: [(containerID: String, displayName: String)],
                       fileSystem: (String) -> FileSystem?) -> [FileName] {
        let before = Set(currentFolders().map(\.name))
        var known = table.withLock { $0.slotByContainer }
        var made: [String: FileSystem] = [:]
        for folder in folders where known[folder.containerID] == nil {
            if let fs = fileSystem(folder.containerID) { made[folder.containerID] = fs }
        }
        // The daemon's slot file is read and written with no lock of this table held.
        let remembered = made.keys.sorted().map { ($0, slotFor($0)) }
        table.withLock { t in
            for (id, remembered) in remembered {
                guard let fs = made[id] else { continue }
                var slot = remembered
                if slot < 1 || slot > Self.maxSlot || t.slots[slot] != nil { slot = (t.slots.keys.max() ?? 0) + 1 }
                t.slots[slot] = fs
                t.slotByContainer[id] = slot
            }
            known = t.slotByContainer
            t.visible = folders.compactMap { f in known[f.containerID].map { (f.containerID, f.displayName, $0) } }
                .sorted { $0.containerID < $1.containerID }
        }
        let after = Set(currentFolders().map(\.name))
        return Array(before.symmetricDifference(after))
    }

    /// The kernel's inode number for `ino` (a kernel number of the
    /// container's own FileSystem), or nil if the container has no folder here.
    public func kernelIno(container: String, _ ino: UInt64) -> UInt64? {
        guard let slot = table.withLock({ $0.slotByContainer[container] }) else { return nil }
        return Self.outward(ino, slot)
    }

    /// The shown folders with their names now (clashes settled as described above).
    public func currentFolders() -> [(name: FileName, containerID: String, slot: Int)] {
        let visible = table.withLock { $0.visible }
        var taken = Set<FileName>()
        var out: [(name: FileName, containerID: String, slot: Int)] = []
        for folder in visible {
            var name = FileName(folder.displayName)
            if taken.contains(name) || home.rootHasEntry(name) {
                let suffix = " (\(folder.containerID))"
                name = FileName(String(decoding: Array(folder.displayName.utf8.prefix(255 - suffix.utf8.count)), as: UTF8.self) + suffix)
            }
            taken.insert(name)
            out.append((name, folder.containerID, folder.slot))
        }
        return out
    }

    /// The shown folders' names and kernel inode numbers.
    public func folderInodes() -> [FileName: UInt64] {
        Dictionary(currentFolders().map { ($0.name, UInt64($0.slot) << Self.slotShift | 1) }, uniquingKeysWith: { a, _ in a })
    }

    /// The container folder named `name` at the root, if any.
    func folder(named name: FileName) -> (containerID: String, slot: Int)? {
        currentFolders().first { $0.name == name }.map { ($0.containerID, $0.slot) }
    }

    // MARK: - Routing

    static func slot(of number: UInt64) -> Int { Int(number >> slotShift) }

    static func outward(_ number: UInt64, _ slot: Int) -> UInt64 {
        slot == 0 ? number : (UInt64(slot) << slotShift) | (number & localMask)
    }

    /// The FileSystem serving kernel inode or handle `number`, and the number as it knows it.
    func route(_ number: UInt64) throws -> (fs: FileSystem, local: UInt64, slot: Int) {
        let slot = Self.slot(of: number)
        if slot == 0 { return (home, number, 0) }
        guard let fs = table.withLock({ $0.slots[slot] }) else { throw UbiquityError(ESTALE) }
        return (fs, number & Self.localMask, slot)
    }

    static func outward(_ a: Attributes, _ slot: Int) -> Attributes {
        var a = a
        a.ino = outward(a.ino, slot)
        return a
    }

    static func outward(_ e: EntryReply, _ slot: Int) -> EntryReply {
        var e = e
        e.ino = outward(e.ino, slot)
        e.attributes = outward(e.attributes, slot)
        return e
    }

    static let root: UInt64 = 1

    /// EEXIST when `name` at the root is a container folder (creating it).
    func refuseFolderName(_ parent: UInt64, _ name: FileName) throws {
        if parent == Self.root, folder(named: name) != nil { throw UbiquityError(EEXIST) }
    }

    // MARK: - Lookup and attributes

    public func lookup(parent: UInt64, name: FileName) throws -> EntryReply {
        if parent == Self.root, let folder = folder(named: name) {
            let (fs, _, slot) = try route(UInt64(folder.slot) << Self.slotShift | 1)
            return Self.outward(try fs.rootEntry(), slot)
        }
        let (fs, local, slot) = try route(parent)
        return Self.outward(try fs.lookup(parent: local, name: name), slot)
    }

    public func entry(ino: UInt64) throws -> EntryReply {
        let (fs, local, slot) = try route(ino)
        return Self.outward(try fs.entry(ino: local), slot)
    }

    public func forget(ino: UInt64, count: UInt64) {
        guard let (fs, local, _) = try? route(ino) else { return }
        fs.forget(ino: local, count: count)
    }

    /// Every container this drive showed, shown still or not (its kernel may hold their nodes).
    public func releaseKernelReferences() -> KernelRelease {
        let shown = table.withLock { Array($0.slots.values) }
        return shown.reduce(home.releaseKernelReferences()) { $0 + $1.releaseKernelReferences() }
    }

    public func getattr(ino: UInt64) throws -> Attributes {
        let (fs, local, slot) = try route(ino)
        var attributes = Self.outward(try fs.getattr(ino: local), slot)
        if ino == Self.root { attributes.nlink += UInt32(currentFolders().count) }
        return attributes
    }

    public func setattr(ino: UInt64, changes: AttributeChanges, handle: UInt64?) throws -> Attributes {
        let (fs, local, slot) = try route(ino)
        return Self.outward(try fs.setattr(ino: local, changes: changes, handle: handle.map { $0 & Self.localMask }), slot)
    }

    public func readlink(ino: UInt64) throws -> String {
        let (fs, local, _) = try route(ino)
        return try fs.readlink(ino: local)
    }

    // MARK: - Creating, removing, renaming

    public func mknod(parent: UInt64, name: FileName, mode: UInt32, rdev: UInt64, caller: Caller) throws -> EntryReply {
        try refuseFolderName(parent, name)
        let (fs, local, slot) = try route(parent)
        return Self.outward(try fs.mknod(parent: local, name: name, mode: mode, rdev: rdev, caller: caller), slot)
    }

    public func mkdir(parent: UInt64, name: FileName, mode: UInt32, caller: Caller) throws -> EntryReply {
        try refuseFolderName(parent, name)
        let (fs, local, slot) = try route(parent)
        return Self.outward(try fs.mkdir(parent: local, name: name, mode: mode, caller: caller), slot)
    }

    public func symlink(target: String, parent: UInt64, name: FileName, caller: Caller) throws -> EntryReply {
        try refuseFolderName(parent, name)
        let (fs, local, slot) = try route(parent)
        return Self.outward(try fs.symlink(target: target, parent: local, name: name, caller: caller), slot)
    }

    public func create(parent: UInt64, name: FileName, mode: UInt32, flags: Int32, caller: Caller) throws -> (EntryReply, OpenReply) {
        try refuseFolderName(parent, name)
        let (fs, local, slot) = try route(parent)
        var (entry, opened) = try fs.create(parent: local, name: name, mode: mode, flags: flags, caller: caller)
        opened.handle = Self.outward(opened.handle, slot)
        return (Self.outward(entry, slot), opened)
    }

    public func link(ino: UInt64, newParent: UInt64, newName: FileName) throws -> EntryReply {
        try refuseFolderName(newParent, newName)
        let (fs, local, slot) = try route(ino)
        let (_, localParent, parentSlot) = try route(newParent)
        guard slot == parentSlot else { throw UbiquityError(EXDEV) }
        return Self.outward(try fs.link(ino: local, newParent: localParent, newName: newName), slot)
    }

    public func unlink(parent: UInt64, name: FileName) throws {
        if parent == Self.root, folder(named: name) != nil { throw UbiquityError(EISDIR) }
        let (fs, local, _) = try route(parent)
        try fs.unlink(parent: local, name: name)
    }

    public func rmdir(parent: UInt64, name: FileName) throws {
        if parent == Self.root, folder(named: name) != nil { throw UbiquityError(EBUSY, "a container's folder cannot be removed") }
        let (fs, local, _) = try route(parent)
        try fs.rmdir(parent: local, name: name)
    }

    public func rename(parent: UInt64, name: FileName, newParent: UInt64, newName: FileName, flags: RenameFlags) throws {
        if (parent == Self.root && folder(named: name) != nil) || (newParent == Self.root && folder(named: newName) != nil) {
            throw UbiquityError(EBUSY, "a container's folder cannot be renamed or replaced")
        }
        let (fs, local, slot) = try route(parent)
        let (_, localNewParent, newSlot) = try route(newParent)
        guard slot == newSlot else { throw UbiquityError(EXDEV) }
        try fs.rename(parent: local, name: name, newParent: localNewParent, newName: newName, flags: flags)
    }

    // MARK: - Files

    public func open(ino: UInt64, flags: Int32, backing: (any BackingFiles)? = nil) throws -> OpenReply {
        let (fs, local, slot) = try route(ino)
        var opened = try fs.open(ino: local, flags: flags, backing: backing)
        opened.handle = Self.outward(opened.handle, slot)
        return opened
    }

    public func read(handle: UInt64, offset: Int64, size: Int) throws -> ReadReply {
        let (fs, local, _) = try route(handle)
        return try fs.read(handle: local, offset: offset, size: size)
    }

    public func write(handle: UInt64, offset: Int64, bytes: UnsafeRawPointer, count: Int) throws -> Int {
        let (fs, local, _) = try route(handle)
        return try fs.write(handle: local, offset: offset, bytes: bytes, count: count)
    }

    public func flush(handle: UInt64) throws {
        let (fs, local, _) = try route(handle)
        try fs.flush(handle: local)
    }

    public func fsync(handle: UInt64, dataOnly: Bool) throws {
        let (fs, local, _) = try route(handle)
        try fs.fsync(handle: local, dataOnly: dataOnly)
    }

    public func release(handle: UInt64) throws {
        let (fs, local, _) = try route(handle)
        try fs.release(handle: local)
    }

    public func fallocate(handle: UInt64, mode: Int32, offset: Int64, length: Int64) throws {
        let (fs, local, _) = try route(handle)
        try fs.fallocate(handle: local, mode: mode, offset: offset, length: length)
    }

    // MARK: - Directories

    public func opendir(ino: UInt64) throws -> UInt64 {
        let (fs, local, slot) = try route(ino)
        let handle = try fs.opendir(ino: local)
        if ino == Self.root {
            let folders = currentFolders().map { (name: $0.name, slot: $0.slot) }
            table.withLock { $0.rootListings[handle] = folders }
        }
        return Self.outward(handle, slot)
    }

    /// Not the root: its container folders come and go with the store's list.
    public func listingCache(ino: UInt64) -> ListingCache {
        guard ino != Self.root, let (fs, local, _) = try? route(ino) else { return .off }
        return fs.listingCache(ino: local)
    }

    /// The root lists the home container's entries, then the container folders.
    public func readdir(handle: UInt64, offset: Int64, into sink: ListingSink) throws {
        let (fs, local, slot) = try route(handle)
        guard slot == 0, table.withLock({ $0.rootListings[local] != nil }) else {
            return try fs.readdir(handle: local, offset: offset) { entry in
                var entry = entry
                entry.ino = Self.outward(entry.ino, slot)
                return sink(entry)
            }
        }
        var start = 0
        if offset < Self.folderOffsetBase {
            if offset == 0 {
                let folders = currentFolders().map { (name: $0.name, slot: $0.slot) }
                table.withLock { $0.rootListings[local] = folders }
            }
            var full = false
            try home.readdir(handle: local, offset: offset) { entry in
                full = !sink(entry)
                return !full
            }
            if full { return }
        } else {
            start = Int(offset - Self.folderOffsetBase)
        }
        let folders = table.withLock { $0.rootListings[local] ?? [] }
        for (index, folder) in folders.enumerated().dropFirst(start) where table.withLock({ $0.slots[folder.slot] != nil }) {
            let taken = folder.name.bytes.withUnsafeBytes { name in
                sink(ListedEntry(name: name, ino: Self.outward(1, folder.slot), type: UInt32(S_IFDIR),
                                 nextOffset: Self.folderOffsetBase + Int64(index) + 1))
            }
            if !taken { return }
        }
    }

    public func releasedir(handle: UInt64) {
        guard let (fs, local, slot) = try? route(handle) else { return }
        if slot == 0 { _ = table.withLock { $0.rootListings.removeValue(forKey: local) } }
        fs.releasedir(handle: local)
    }

    public func fsyncdir(handle: UInt64) throws {
        let (fs, local, _) = try route(handle)
        try fs.fsyncdir(handle: local)
    }

    // MARK: - Extended attributes and statistics

    public func setxattr(ino: UInt64, name: String, value: Data, flags: Int32) throws {
        let (fs, local, _) = try route(ino)
        try fs.setxattr(ino: local, name: name, value: value, flags: flags)
    }

    public func getxattr(ino: UInt64, name: String) throws -> Data {
        let (fs, local, _) = try route(ino)
        return try fs.getxattr(ino: local, name: name)
    }

    public func listxattr(ino: UInt64) throws -> [String] {
        let (fs, local, _) = try route(ino)
        return try fs.listxattr(ino: local)
    }

    public func removexattr(ino: UInt64, name: String) throws {
        let (fs, local, _) = try route(ino)
        try fs.removexattr(ino: local, name: name)
    }

    public func statfs() throws -> FilesystemStatistics {
        try home.statfs()
    }
}
