import Foundation
import UbiquityLocks

/// The data model shared by the store, the replica and the sync engine.
///
/// A container is a tree of *nodes* (inode-like: stable ID, kind, mode,
/// owner, times, content hash, xattrs) joined by *entries*
/// (`parent node ID, name → node ID`). Hard links are extra entries, a
/// rename moves an entry, an edit changes a node. IDs are stable strings
/// (UUIDs; the container root is `NodeID.root`); paths never appear in the
/// store.

public typealias NodeID = String

extension NodeID {
    /// The well-known ID of every container's root directory.
    public static let root: NodeID = "root"

    /// A new random ID: a version 4 UUID, lowercase. From the system's
    /// generator (`getrandom`), not Foundation's `UUID()`, which opens
    /// `/dev/urandom` for every UUID — one `open` per created file.
    public static func random() -> NodeID {
        var generator = SystemRandomNumberGenerator()
        let high: UInt64 = generator.next()
        let low: UInt64 = generator.next()
        return uuid((high & ~0xF000) | 0x4000,                 // version 4
                    (low & ~(0xC0 << 56)) | (0x80 << 56))      // RFC 4122 variant
    }

    /// The ID of a node made here: a UUID of version 8 whose first 80 bits
    /// (74 of them random) name this process's *series* and whose last 48
    /// count the IDs made in it. Unique like a random one (two processes
    /// share a series with a chance of 2⁻⁷⁴), and cheap to keep: a replica
    /// holds such an ID as a series number and the count, in 8 bytes
    /// instead of 16 (`NodeStore`). A series that reaches 2⁴⁸ IDs is
    /// followed by a new one.
    public static func next() -> NodeID {
        let (high, low) = Minting.shared.withLock { state -> (UInt64, UInt64) in
            if state.count == 0 || state.count > seriesCountMask {
                var generator = SystemRandomNumberGenerator()
                let high: UInt64 = generator.next()
                let top: UInt16 = generator.next()
                state = Minting(high: (high & ~0xF000) | 0x8000,           // version 8
                                lowTop: (top & 0x3FFF) | 0x8000,          // RFC 4122 variant
                                count: 1)
            }
            defer { state.count += 1 }
            return (state.high, UInt64(state.lowTop) << 48 | state.count)
        }
        return uuid(high, low)
    }

    /// The bits of an ID made by `next()` that count (the rest is its series).
    public static let seriesCountMask: UInt64 = 0xFFFF_FFFF_FFFF

    /// Whether a UUID whose first 64 bits are `high` may be one made by
    /// `next()` (it is of version 8).
    public static func mayBeOfASeries(high: UInt64) -> Bool { (high >> 12) & 0xF == 8 }

    /// This process's series and how many of its IDs were made.
    private struct Minting {
        var high: UInt64 = 0
        var lowTop: UInt16 = 0
        var count: UInt64 = 0
        static let shared = Lock(Minting())
    }

    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    /// The canonical text of the UUID whose two 64-bit halves are `high` and `low`.
    public static func uuid(_ high: UInt64, _ low: UInt64) -> NodeID {
        String(unsafeUninitializedCapacity: 36) { out in
            hexDigits.withUnsafeBufferPointer { digits in
                var o = 0
                for position in 0..<32 {
                    if position == 8 || position == 12 || position == 16 || position == 20 {
                        out[o] = 0x2d
                        o += 1
                    }
                    let word = position < 16 ? high : low
                    out[o] = digits[Int((word >> UInt64(60 - 4 * (position & 15))) & 0xF)]
                    o += 1
                }
                return o
            }
        }
    }
}

public enum NodeKind: String, Codable, Sendable {
    case file, directory, symlink, fifo, socket, charDevice, blockDevice
}

/// A point in time with nanoseconds, as `struct timespec` has it.
public struct Timespec: Codable, Hashable, Sendable, Comparable {
    public var sec: Int64
    public var nsec: Int64

    public init(sec: Int64, nsec: Int64) {
        self.sec = sec
        self.nsec = nsec
    }

    public static func now() -> Timespec {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Timespec(sec: Int64(ts.tv_sec), nsec: Int64(ts.tv_nsec))
    }

    /// Nanoseconds since the epoch (fits in Int64 until 2262).
    public var nanoseconds: Int64 { sec &* 1_000_000_000 &+ nsec }

    public init(nanoseconds: Int64) {
        var s = nanoseconds / 1_000_000_000
        var n = nanoseconds % 1_000_000_000
        if n < 0 { n += 1_000_000_000; s -= 1 }
        self.init(sec: s, nsec: n)
    }

    public static func < (a: Timespec, b: Timespec) -> Bool { a.nanoseconds < b.nanoseconds }

    // Encoded as one integer of nanoseconds: compact in the journal.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if let nanoseconds = try? c.decode(Int64.self) {
            self.init(nanoseconds: nanoseconds)
            return
        }
        if let value = try? c.decode(Double.self) {
            throw DecodingError.dataCorruptedError(in: c, debugDescription: value.rounded() != value
                ? "\(value) is not an integer" : "\(value) is out of range (nanoseconds since 1970, 64 bits)")
        }
        self.init(nanoseconds: try c.decode(Int64.self))   // not a number: its own error
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(nanoseconds)
    }
}

/// The full shared state of one node, as committed to the journal.
///
/// `base` is the journal sequence number of the version this change was
/// made from (0 for a new node): a receiver that holds a newer version
/// than `base` has a conflict to resolve.
public struct NodeState: Codable, Hashable, Sendable {
    public var id: NodeID
    public var kind: NodeKind
    /// Permission bits including set-uid, set-gid and sticky (no file type bits).
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    /// Size of the content named by `hash` (files), or of the symlink target.
    public var size: UInt64
    /// SHA-256 of the content (lower-case hex), `nil` for empty or non-file nodes.
    public var hash: String?
    public var target: String?
    public var rdev: UInt64
    public var mtime: Timespec
    public var ctime: Timespec
    public var btime: Timespec
    public var xattrs: [String: Data]
    public var base: UInt64
    /// Set when the content is chunked: `hash` then names a `ChunkManifest` blob.
    public var chunked: Bool?
    /// Unresolved conflict versions of this node: the IDs of the conflicted copies.
    public var conflicts: [NodeID]?
    /// Where the content is when it is not a blob of its own: `size` bytes
    /// at `offset` in pack blob `hash` (record version 2; see `PackLocation`).
    public var pack: PackLocation?

    public init(id: NodeID, kind: NodeKind, mode: UInt32, uid: UInt32, gid: UInt32, size: UInt64,
                hash: String?, target: String?, rdev: UInt64, mtime: Timespec, ctime: Timespec,
                btime: Timespec, xattrs: [String: Data], base: UInt64, chunked: Bool = false, conflicts: [NodeID] = [],
                pack: PackLocation? = nil) {
        self.id = id; self.kind = kind; self.mode = mode; self.uid = uid; self.gid = gid
        self.size = size; self.hash = hash; self.target = target; self.rdev = rdev
        self.mtime = mtime; self.ctime = ctime; self.btime = btime; self.xattrs = xattrs; self.base = base
        self.chunked = chunked ? true : nil
        self.conflicts = conflicts.isEmpty ? nil : conflicts
        self.pack = pack
    }

    enum CodingKeys: String, CodingKey {
        case id, kind, mode, uid, gid, size, hash, target, rdev, mtime, ctime, btime, xattrs, base, chunked, conflicts, pack
    }

    // Decoded by hand for clear reasons ("size -5 is negative"); the field
    // rules are checked after decoding (`ChangeSet.validate`).
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(NodeID.self, forKey: .id)
        let kindName = try c.decode(String.self, forKey: .kind)
        guard let kind = NodeKind(rawValue: kindName) else {
            throw DecodingError.dataCorruptedError(forKey: .kind, in: c, debugDescription: "unknown kind \(RecordFormat.quoted(kindName))")
        }
        self.kind = kind
        mode = try c.decodeUnsigned(UInt32.self, forKey: .mode)
        uid = try c.decodeUnsigned(UInt32.self, forKey: .uid)
        gid = try c.decodeUnsigned(UInt32.self, forKey: .gid)
        size = try c.decodeUnsigned(UInt64.self, forKey: .size)
        hash = try c.decodeIfPresent(String.self, forKey: .hash)
        target = try c.decodeIfPresent(String.self, forKey: .target)
        rdev = try c.decodeUnsigned(UInt64.self, forKey: .rdev)
        mtime = try c.decode(Timespec.self, forKey: .mtime)
        ctime = try c.decode(Timespec.self, forKey: .ctime)
        btime = try c.decode(Timespec.self, forKey: .btime)
        xattrs = try c.decode([String: Data].self, forKey: .xattrs)
        base = try c.decodeUnsigned(UInt64.self, forKey: .base)
        chunked = try c.decodeIfPresent(Bool.self, forKey: .chunked)
        conflicts = try c.decodeIfPresent([NodeID].self, forKey: .conflicts)
        pack = try c.decodeIfPresent(PackLocation.self, forKey: .pack)
    }
}

/// Where packed content is: bytes `offset ..< offset + size` (the node's
/// `size`) of the pack blob `hash`. A pack is a blob (at most one chunk,
/// named by the SHA-256 of all its bytes) holding the content of several
/// small files one after another; a member is verified against the node's
/// own content `hash` when it is read. See `PackLayout` and docs/STORE-FORMAT.md.
public struct PackLocation: Codable, Hashable, Sendable {
    public var hash: String
    public var offset: UInt64

    public init(hash: String, offset: UInt64) {
        self.hash = hash
        self.offset = offset
    }

    enum CodingKeys: String, CodingKey { case hash, offset }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        hash = try c.decode(String.self, forKey: .hash)
        offset = try c.decodeUnsigned(UInt64.self, forKey: .offset)
    }
}

/// How small files are packed when pushed.
public enum PackLayout {
    /// Content smaller than this goes into a pack; larger content keeps its own blob(s).
    public static let memberLimit = 1 << 20
    /// A pack is one blob: at most one chunk (`ContentLayout.chunkSize`).
    public static let maxPackSize = ContentLayout.chunkSize
}

extension KeyedDecodingContainer {
    /// A non-negative integer that fits `T`, with a reason that says what is wrong.
    func decodeUnsigned<T: FixedWidthInteger & UnsignedInteger & Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        if let value = try? decode(T.self, forKey: key) { return value }
        func corrupted(_ text: String) -> DecodingError { DecodingError.dataCorruptedError(forKey: key, in: self, debugDescription: text) }
        if let value = try? decode(Int64.self, forKey: key) { throw corrupted(value < 0 ? "\(value) is negative" : "\(value) is too large") }
        if let value = try? decode(Double.self, forKey: key) {
            throw corrupted(value.rounded() != value ? "\(value) is not an integer" : value < 0 ? "\(value) is negative" : "\(value) is too large")
        }
        return try decode(T.self, forKey: key)   // absent, null or not a number: its own error
    }
}

/// One change inside a change set. Receivers apply all `node` changes
/// first, then `entry` changes, then `deleteNode` changes, so a change set
/// never references a node it has not described.
public enum Change: Hashable, Sendable {
    /// Create or update a node to exactly this state.
    case node(NodeState)
    /// Set (`child != nil`) or remove (`child == nil`) the entry `name` in `parent`.
    case entry(parent: NodeID, name: FileName, child: NodeID?)
    /// The node has no entries left anywhere: forget it.
    case deleteNode(id: NodeID, base: UInt64)
}

/// In the journal a change is one flat JSON object tagged by `op`:
/// `{"op":"node", …NodeState}`, `{"op":"entry","parent","name","child"}`
/// (no `child`: removal), `{"op":"delete","id","base"}`.
extension Change: Codable {
    private enum Keys: String, CodingKey { case op, parent, name, child, id, base }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        switch try c.decode(String.self, forKey: .op) {
        case "node": self = .node(try NodeState(from: decoder))
        case "entry":
            self = .entry(parent: try c.decode(NodeID.self, forKey: .parent), name: try c.decode(FileName.self, forKey: .name),
                          child: try c.decodeIfPresent(NodeID.self, forKey: .child))
        case "delete": self = .deleteNode(id: try c.decode(NodeID.self, forKey: .id), base: try c.decodeUnsigned(UInt64.self, forKey: .base))
        case let op: throw DecodingError.dataCorruptedError(forKey: .op, in: c, debugDescription: "unknown change \(RecordFormat.quoted(op))")
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        switch self {
        case .node(let state):
            try c.encode("node", forKey: .op)
            try state.encode(to: encoder)
        case .entry(let parent, let name, let child):
            try c.encode("entry", forKey: .op)
            try c.encode(parent, forKey: .parent)
            try c.encode(name, forKey: .name)
            try c.encodeIfPresent(child, forKey: .child)
        case .deleteNode(let id, let base):
            try c.encode("delete", forKey: .op)
            try c.encode(id, forKey: .id)
            try c.encode(base, forKey: .base)
        }
    }
}

/// One committed journal record: everything one device pushed at once.
/// The format is docs/STORE-FORMAT.md; `RecordFormat` reads and checks it.
public struct ChangeSet: Codable, Sendable {
    /// The record format version (`RecordFormat.version`; absent in records
    /// written before it was recorded, which are version 1).
    public var version: Int
    public var device: String
    public var deviceName: String
    public var date: Timespec
    public var changes: [Change]

    public init(device: String, deviceName: String, date: Timespec = .now(), changes: [Change]) {
        self.device = device
        self.deviceName = deviceName
        self.date = date
        self.changes = changes
        self.version = 1
        self.version = requiredVersion
    }

    /// The record version this change set needs: 2 when a node names a
    /// pack (a device that reads only version 1 must refuse it, not read
    /// the node's content as a blob of its own), 1 otherwise (every device reads it).
    public var requiredVersion: Int {
        changes.contains { if case .node(let state) = $0 { state.pack != nil } else { false } } ? 2 : 1
    }

    enum CodingKeys: String, CodingKey { case version, device, deviceName, date, changes }

    /// The version is read first: a record of another version may have any shape.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        version = try c.decodeIfPresent(Int.self, forKey: .version) ?? 1
        guard RecordFormat.readableVersions.contains(version) else {
            throw DecodingError.dataCorruptedError(forKey: .version, in: c, debugDescription:
                "record version \(version) is not supported (this ubiquityfs reads versions \(RecordFormat.readableVersions.lowerBound) to \(RecordFormat.version))")
        }
        device = try c.decode(String.self, forKey: .device)
        deviceName = try c.decode(String.self, forKey: .deviceName)
        date = try c.decode(Timespec.self, forKey: .date)
        changes = try c.decode([Change].self, forKey: .changes)
    }
}

/// The configuration of a container, kept in the store so every device agrees.
public struct ContainerConfig: Codable, Hashable, Sendable {
    public enum FolderLevels: String, Codable, Sendable { case none, one, any }
    public var id: String
    public var displayName: String
    public var documentScopePublic: Bool
    public var supportedFolderLevels: FolderLevels
    /// How many days earlier versions and deleted items are kept
    /// (absent: `defaultRetentionDays`).
    public var retentionDays: Int?
    /// Deleted items of journal records up to this one were removed from
    /// the trash for good (`trash --empty`); absent: none.
    public var trashEmptiedThrough: UInt64?

    public static let defaultRetentionDays = 30
    public static let retentionDaysRange = 1...36_500

    /// How long earlier versions and deleted items are kept.
    public var retention: TimeInterval { Double(retentionDays ?? Self.defaultRetentionDays) * 86_400 }

    public init(id: String, displayName: String, documentScopePublic: Bool = false,
                supportedFolderLevels: FolderLevels = .any, retentionDays: Int? = nil) {
        self.id = id
        self.displayName = displayName
        self.documentScopePublic = documentScopePublic
        self.supportedFolderLevels = supportedFolderLevels
        self.retentionDays = retentionDays
    }

    /// `container.json` as stores hold it: pretty-printed, sorted keys.
    public func encodedForStore() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        return try encoder.encode(self)
    }

    /// A stored `container.json` of container `id`, checked as it is read
    /// (the display name becomes a folder's name on every drive); `location`
    /// names it in the error when it is damaged.
    public static func decodeStored(_ data: Data, id: String, at location: String) throws -> ContainerConfig {
        do {
            let config = try JSONDecoder().decode(ContainerConfig.self, from: data)
            try config.validate()
            guard config.id == id else { throw UbiquityError(EINVAL, "its ID is \(RecordFormat.quoted(config.id))") }
            return config
        } catch {
            let problem = (error as? DecodingError).map(ChangeSet.describe) ?? UbiquityError.wrap(error).message
            throw UbiquityError(EINVAL, "container configuration \(location) is damaged: \(RecordFormat.printable(problem))")
        }
    }

    /// A valid ID, and a display name that can be a folder name (a drive
    /// shows it as one): the rules of an entry name (`RecordFormat.problem(name:)`).
    public func validate() throws {
        try Self.validate(id: id)
        if let problem = RecordFormat.problem(name: FileName(displayName)) {
            throw UbiquityError(EINVAL, "invalid display name \(RecordFormat.quoted(displayName)): it \(problem) (1 to 255 bytes, no '/' or NUL, not '.' or '..')")
        }
        if let days = retentionDays, !Self.retentionDaysRange.contains(days) {
            throw UbiquityError(EINVAL, "invalid retention of \(days) days: \(Self.retentionDaysRange.lowerBound) to \(Self.retentionDaysRange.upperBound)")
        }
    }

    /// Container IDs are reverse-DNS style: letters, digits, `-`, `_`, separated by dots.
    public static func validate(id: String) throws {
        let allowed = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
        guard !id.isEmpty, id.count <= 200, id.unicodeScalars.allSatisfy({ allowed.contains($0) }),
              !id.hasPrefix("."), !id.hasSuffix("."), !id.contains("..") else {
            throw UbiquityError(EINVAL, "invalid container ID '\(id)': use letters, digits, '-', '_' and dots, like com.example.notes")
        }
    }
}

/// How content is laid out in blobs. Content up to `chunkSize` is one blob
/// named by its SHA-256. Larger content is cut into `chunkSize` chunks, each a
/// blob, listed by a manifest blob that the node's `hash` names: a device
/// can verify and serve the first chunk of a large file long before the
/// last one has arrived, and resume an interrupted download chunk by chunk.
public enum ContentLayout {
    public static let chunkSize = 4 << 20
}

/// The manifest of chunked content (a blob, JSON with sorted keys, so equal
/// content has an equal manifest and an equal hash).
public struct ChunkManifest: Codable, Sendable, Equatable {
    public var chunkSize: UInt64
    public var size: UInt64
    public var chunks: [String]

    public init(chunkSize: UInt64, size: UInt64, chunks: [String]) {
        self.chunkSize = chunkSize
        self.size = size
        self.chunks = chunks
    }

    public func encoded() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return try encoder.encode(self)
    }

    public static func decode(_ data: Data) throws -> ChunkManifest {
        do {
            let manifest = try JSONDecoder().decode(ChunkManifest.self, from: data)
            let expected = manifest.chunkSize == 0 ? 0 : (manifest.size + manifest.chunkSize - 1) / manifest.chunkSize
            guard manifest.chunkSize > 0, UInt64(manifest.chunks.count) == expected,
                  manifest.chunks.allSatisfy(ContentHash.isValid) else {
                throw UbiquityError(EIO, "chunk manifest is inconsistent")
            }
            return manifest
        } catch let error as UbiquityError {
            throw error
        } catch {
            throw UbiquityError(EIO, "chunk manifest is damaged: \(error)")
        }
    }
}

/// Content names in the store: the SHA-256 of the bytes.
public enum ContentHash {
    /// A blob name must be exactly 64 lower-case hex digits.
    public static func isValid(_ hash: String) -> Bool {
        hash.utf8.count == 64 && hash.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}
