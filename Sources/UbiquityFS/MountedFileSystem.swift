import Foundation
import UbiquityModel

/// What the FUSE adapter serves at one mountpoint: a view of one container
/// (`FileSystem`) or the drive (`DriveFileSystem`, which routes to several).
/// Inode and handle numbers here are the kernel's; every method answers a
/// value or throws `UbiquityError`.
public protocol MountedFileSystem: AnyObject, Sendable {
    var entryTimeout: Double { get }
    var attributeTimeout: Double { get }

    func lookup(parent: UInt64, name: FileName) throws -> EntryReply
    /// The entry of inode `ino` (linked or not), counted as a lookup: for
    /// telling a kernel about a node again (`KernelEventReplay`).
    func entry(ino: UInt64) throws -> EntryReply
    func forget(ino: UInt64, count: UInt64)
    func getattr(ino: UInt64) throws -> Attributes
    func setattr(ino: UInt64, changes: AttributeChanges, handle: UInt64?) throws -> Attributes
    func readlink(ino: UInt64) throws -> String

    func mknod(parent: UInt64, name: FileName, mode: UInt32, rdev: UInt64, caller: Caller) throws -> EntryReply
    func mkdir(parent: UInt64, name: FileName, mode: UInt32, caller: Caller) throws -> EntryReply
    func symlink(target: String, parent: UInt64, name: FileName, caller: Caller) throws -> EntryReply
    func create(parent: UInt64, name: FileName, mode: UInt32, flags: Int32, caller: Caller) throws -> (EntryReply, OpenReply)
    func link(ino: UInt64, newParent: UInt64, newName: FileName) throws -> EntryReply
    func unlink(parent: UInt64, name: FileName) throws
    func rmdir(parent: UInt64, name: FileName) throws
    func rename(parent: UInt64, name: FileName, newParent: UInt64, newName: FileName, flags: RenameFlags) throws

    /// `backing`: the session's registry when the kernel does passthrough.
    func open(ino: UInt64, flags: Int32, backing: (any BackingFiles)?) throws -> OpenReply
    func read(handle: UInt64, offset: Int64, size: Int) throws -> ReadReply
    func write(handle: UInt64, offset: Int64, bytes: UnsafeRawPointer, count: Int) throws -> Int
    func flush(handle: UInt64) throws
    func fsync(handle: UInt64, dataOnly: Bool) throws
    func release(handle: UInt64) throws
    func fallocate(handle: UInt64, mode: Int32, offset: Int64, length: Int64) throws

    func opendir(ino: UInt64) throws -> UInt64
    /// What the kernel may do with folder `ino`'s listing at this open:
    /// called after `opendir`, before the kernel reads the listing.
    func listingCache(ino: UInt64) -> ListingCache
    /// The entries after `offset` into `sink`, until it is full or the listing ends.
    func readdir(handle: UInt64, offset: Int64, into sink: ListingSink) throws
    func releasedir(handle: UInt64)
    func fsyncdir(handle: UInt64) throws

    func setxattr(ino: UInt64, name: String, value: Data, flags: Int32) throws
    func getxattr(ino: UInt64, name: String) throws -> Data
    func listxattr(ino: UInt64) throws -> [String]
    func removexattr(ino: UInt64, name: String) throws

    func statfs() throws -> FilesystemStatistics

    /// The session ended: give back what the kernel still held.
    func releaseKernelReferences() -> KernelRelease
}

/// What a mount's kernel still held when its session ended.
public struct KernelRelease: Sendable {
    /// Nodes it held, and of those, unlinked ones dropped as a result.
    public var held = 0
    public var dropped = 0
    /// Forgets beyond the references it was given.
    public var excessForgets = 0

    public init(held: Int = 0, dropped: Int = 0, excessForgets: Int = 0) {
        self.held = held
        self.dropped = dropped
        self.excessForgets = excessForgets
    }

    static func + (a: KernelRelease, b: KernelRelease) -> KernelRelease {
        KernelRelease(held: a.held + b.held, dropped: a.dropped + b.dropped, excessForgets: a.excessForgets + b.excessForgets)
    }
}

extension FileSystem: MountedFileSystem {}
