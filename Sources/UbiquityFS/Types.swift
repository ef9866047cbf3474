import Foundation
import UbiquityReplica
import UbiquityModel
import UbiquityStore

/// Plain reply types of the filesystem core. The FUSE adapter turns them
/// into `struct stat`, `fuse_entry_param` and `fuse_reply_*` calls; tests
/// use them directly.

public struct Attributes: Sendable, Equatable {
    public var ino: UInt64
    /// File type bits (S_IFREG…) and permission bits.
    public var mode: UInt32
    public var nlink: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var rdev: UInt64
    public var size: UInt64
    public var blocks: UInt64
    public var atime: Timespec
    public var mtime: Timespec
    public var ctime: Timespec

    public static let blockSize: UInt32 = 128 * 1024
}

public struct EntryReply: Sendable {
    public var ino: UInt64
    public var attributes: Attributes
    public var entryTimeout: Double
    public var attributeTimeout: Double
}

/// Who is asking (from `fuse_req_ctx`).
public struct Caller: Sendable {
    public var uid: UInt32
    public var gid: UInt32
    public var pid: Int32
    public init(uid: UInt32, gid: UInt32, pid: Int32) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
    }
    public static let root = Caller(uid: 0, gid: 0, pid: 0)
}

public enum TimeChange: Sendable, Equatable {
    case now
    case at(Timespec)
}

public struct AttributeChanges: Sendable {
    public var mode: UInt32?
    public var uid: UInt32?
    public var gid: UInt32?
    public var size: UInt64?
    public var atime: TimeChange?
    public var mtime: TimeChange?
    public var ctime: Timespec?
    public init(mode: UInt32? = nil, uid: UInt32? = nil, gid: UInt32? = nil, size: UInt64? = nil,
                atime: TimeChange? = nil, mtime: TimeChange? = nil, ctime: Timespec? = nil) {
        self.mode = mode; self.uid = uid; self.gid = gid; self.size = size
        self.atime = atime; self.mtime = mtime; self.ctime = ctime
    }
}

/// What the kernel may do with a folder's listing at an `opendir`.
public enum ListingCache: Sendable, Equatable {
    /// List it from the daemon every time (a listing that changes with no
    /// entry changing: the drive's root, the virtual trash folders).
    case off
    /// Cache it (`cache_readdir`), dropping what was cached before.
    case refill
    /// Cache it and keep what was cached (`keep_cache`): it is current.
    case keep
}

public struct OpenReply: Sendable {
    public var handle: UInt64
    /// Keep the kernel's page cache from the previous open (content unchanged since).
    public var keepCache: Bool
    /// Nothing to acknowledge at `close` (`flush`): a reader, or a file
    /// whose writes are kept as they are made (`FileSystem.create`). The
    /// kernel then skips the FLUSH round trip (FOPEN_NOFLUSH).
    public var acknowledgedWithoutFlush = false
    /// Who serves the reads and writes of this open (`keepCache` only counts for `.cached`).
    public var kernelIO = KernelIO.cached

    public init(handle: UInt64, keepCache: Bool, acknowledgedWithoutFlush: Bool = false) {
        self.handle = handle
        self.keepCache = keepCache
        self.acknowledgedWithoutFlush = acknowledgedWithoutFlush
    }
}

/// How the kernel does the I/O of one open file.
///
/// FUSE passthrough (Linux 6.9 and later): the kernel reads the cache file
/// itself, as fast as a local file, and the daemon sees only the open and
/// the release. The kernel holds each inode in one mode at a time: while
/// any open of an inode is in passthrough, every other open of it must name
/// the same backing file, and none may use the mounted file's page cache.
/// `FileSystem.chooseKernelIO` keeps to that.
public enum KernelIO: Sendable, Equatable {
    /// Through the mounted file's page cache; the daemon serves each miss.
    case cached
    /// The kernel reads (and writes) the registered cache file `backing` itself.
    case passthrough(backing: Int32)
    /// Every read and write comes to the daemon (FOPEN_DIRECT_IO), while the
    /// inode stays in passthrough mode for the other opens (`backing`): how
    /// an inode in that mode is opened for writing, or after its content
    /// changed. Only a memory mapping uses `backing`.
    case direct(backing: Int32)
}

/// The kernel's registry of backing files for one FUSE session (passthrough).
public protocol BackingFiles: AnyObject, Sendable {
    /// Register the open file `fd`: the id an open reply names it by.
    func register(fd: Int32) throws -> Int32
    /// Forget a registration (the kernel keeps the file while opens use it).
    func unregister(_ id: Int32)
}

/// What a read answers: a range of a local file (sent with splice, no copy
/// through this process), memory a download holds, or bytes. `passed`:
/// bytes of the file the kernel may now drop from its page cache, because
/// the reader streamed past them (`StreamedRun`); nil almost always.
public enum ReadReply: Sendable {
    case fileRange(fd: Int32, offset: Int64, size: Int, passed: Range<Int64>? = nil)
    /// Held by a download for a streaming reader (released after the reply).
    case memory(PinnedBytes, passed: Range<Int64>?)
    case bytes([UInt8], passed: Range<Int64>? = nil)
}

/// One entry of a listing, handed to a `ListingSink`.
public struct ListedEntry {
    /// The name's bytes: valid only during the call to the sink.
    public var name: UnsafeRawBufferPointer
    public var ino: UInt64
    /// File type bits (S_IFDIR…).
    public var type: UInt32
    /// Offset of the *next* entry (what `telldir` gives after this one).
    public var nextOffset: Int64
}

/// Where `readdir` puts a listing's entries, in order: the adapter's reply
/// buffer. It answers false when the entry does not fit: the listing stops
/// there. Called with the replica's lock held: it only copies bytes.
public typealias ListingSink = (ListedEntry) -> Bool

public struct FilesystemStatistics: Sendable {
    public var blockSize: UInt64
    public var blocks: UInt64
    public var blocksFree: UInt64
    public var blocksAvailable: UInt64
    public var files: UInt64
    public var filesFree: UInt64
    public var nameMax: UInt64
}

/// Rename flags (`renameat2`).
public struct RenameFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let noReplace = RenameFlags(rawValue: 1)   // RENAME_NOREPLACE
    public static let exchange = RenameFlags(rawValue: 2)    // RENAME_EXCHANGE
    public static let whiteout = RenameFlags(rawValue: 4)    // RENAME_WHITEOUT
}

/// What part of the container a mount shows (`mount --scope`).
///
/// The kernel's root inode (1) is the view's root; the FS swaps the two
/// numbers at its boundary, so the container's own root never shows in a
/// documents view. `hidden` is a name the view leaves out of its root (the
/// Data scope hides `Documents`); `folderLimit` bounds how deep directories
/// may go below the root (a container's `supportedFolderLevels`).
public struct ViewRoot: Sendable {
    public var root: UInt64
    public var hidden: FileName?
    public var folderLimit: Int?

    public init(root: UInt64 = 1, hidden: FileName? = nil, folderLimit: Int? = nil) {
        self.root = root
        self.hidden = hidden
        self.folderLimit = folderLimit
    }

    /// Kernel inode ↔ replica inode (the same swap both ways).
    @inline(__always) public func swap(_ ino: UInt64) -> UInt64 {
        ino == 1 ? root : (ino == root ? 1 : ino)
    }
}

public struct FileSystemOptions: Sendable {
    /// Seconds the kernel may cache entries and attributes.
    public var entryTimeout: Double = 5
    public var attributeTimeout: Double = 5
    public var view = ViewRoot()
    /// Called on a thread about to wait for a download: a FUSE worker that
    /// reads the mount's requests hands the reading to another first
    /// (`FUSESession.beforeLongWait`), so the mount goes on answering.
    public var beforeLongWait: @Sendable () -> Void = {}
    public init() {}
}

extension NodeKind {
    public var typeBits: UInt32 {
        switch self {
        case .file: return UInt32(S_IFREG)
        case .directory: return UInt32(S_IFDIR)
        case .symlink: return UInt32(S_IFLNK)
        case .fifo: return UInt32(S_IFIFO)
        case .socket: return UInt32(S_IFSOCK)
        case .charDevice: return UInt32(S_IFCHR)
        case .blockDevice: return UInt32(S_IFBLK)
        }
    }

    public init?(typeBits: UInt32) {
        switch typeBits & UInt32(S_IFMT) {
        case UInt32(S_IFREG): self = .file
        case UInt32(S_IFDIR): self = .directory
        case UInt32(S_IFLNK): self = .symlink
        case UInt32(S_IFIFO): self = .fifo
        case UInt32(S_IFSOCK): self = .socket
        case UInt32(S_IFCHR): self = .charDevice
        case UInt32(S_IFBLK): self = .blockDevice
        default: return nil
        }
    }
}

extension LocalNode {
    public var attributes: Attributes {
        let blocks: UInt64 = (kind == .file && hasContent) ? (size + 511) / 512 : 0
        return Attributes(ino: ino, mode: kind.typeBits | (mode & 0o7777), nlink: nlink, uid: uid, gid: gid,
                          rdev: rdev, size: size, blocks: blocks, atime: atime, mtime: mtime, ctime: ctime)
    }
}
