import Foundation
import UbiquityModel

/// What the sync engine needs from "the cloud": an append-only journal per
/// container and content-addressed blobs.
///
/// The store is the only arbiter between devices: a device commits a change
/// set by creating `journal/<head+1>` *exclusively*; the loser of a race
/// catches up and retries. Blobs are immutable and named by their SHA-256,
/// so uploading the same content twice is harmless.
///
/// Calls block the calling thread (the sync engine runs them on its own
/// threads, never on a FUSE worker that answers a request).
public protocol Store: Sendable {
    /// A stable identifier of this store (from its marker), used to key replicas.
    var storeID: String { get }
    /// Where the store is, for people: a folder's path, `s3://bucket/prefix`.
    var locationDescription: String { get }
    /// Whether the store answers now and is still this store (its marker).
    /// Asks the store: not for hot paths.
    var isReachable: Bool { get }

    func containerConfig(_ container: String) throws -> ContainerConfig?
    func createContainer(_ config: ContainerConfig) throws
    func updateContainer(_ config: ContainerConfig) throws
    /// Every container, by ID; one whose configuration cannot be read is
    /// listed as damaged instead of failing the whole list.
    func containers() throws -> ContainerListing

    /// Append `changeSet` as journal record `seq` (`ChangeSet.encodedRecord`).
    /// Returns `false` (and writes nothing) when `seq` already exists:
    /// another device won, or something else took the number.
    func commit(container: String, seq: UInt64, changeSet: ChangeSet) throws -> Bool
    /// Journal records after `seq`, in order, at most `limit`, each decoded
    /// and checked (`JournalRecord(seq:data:)`): a record that is there but
    /// not a valid change set is returned `.invalid`, never thrown, so the
    /// reader can skip it. Throws only when the journal cannot be read now.
    func journal(container: String, after seq: UInt64, limit: Int) throws -> [JournalRecord]

    /// The journal records that have a snapshot (`SnapshotRecord`), ascending.
    func snapshots(container: String) throws -> [UInt64]
    /// Snapshot record `seq`, decoded and checked (`EBADMSG` when it is
    /// damaged), or nil if there is none.
    func snapshot(container: String, seq: UInt64) throws -> SnapshotRecord?
    /// Publish `snapshot` exclusively (like a commit): false, writing
    /// nothing, when one of that record exists. Its parts are stored and
    /// flushed before.
    func publishSnapshot(container: String, _ snapshot: SnapshotRecord) throws -> Bool

    /// The size in bytes of blob `hash` as stored, or nil if the store does
    /// not have it. Cheap (a `stat`, a HEAD request): it does not read or
    /// verify the content. Eviction asks it before dropping the last local
    /// copy (see `SyncEngine.evict`).
    func blobSize(_ hash: String) throws -> UInt64?
    /// Store `data` as blob `hash` (the caller hashed exactly these bytes).
    /// Blobs are at most one chunk (`ContentLayout.chunkSize`) or a manifest.
    /// A blob already there with another size (cut short, damaged) is
    /// replaced; one of the right size is kept as it is.
    func putBlob(_ hash: String, data: Data) throws
    /// Make every blob stored so far durable before a journal record names
    /// it (called once per commit, not once per blob).
    func flushBlobs() throws
    /// The bytes of blob `hash`, verified against it: a damaged or missing
    /// blob is `EIO`, never data.
    func fetchBlob(_ hash: String) throws -> Data

    /// Bytes `offset ..< offset + count` of blob `hash` (a pack), NOT
    /// verified: the caller checks them against the hash of the content
    /// they hold (`fetchPacked`). A missing blob, or one shorter than the
    /// range, is `EIO` naming it, as a missing blob is for `fetchBlob`.
    func fetchBlobRange(_ hash: String, offset: UInt64, count: Int) throws -> Data

    /// A way to sleep until the container's journal may have grown, if the
    /// store has one cheaper than polling (nil: poll).
    func watchJournal(container: String) -> (any JournalWatcher)?

    /// How many blobs the sync engine uploads at once (1: one after the
    /// other). A store across a network wants many requests in flight.
    var uploadConcurrency: Int { get }
    /// How many chunks of one download are fetched at once (and ahead of
    /// the reader): 4 for a local folder, so that while some wait for the
    /// disk others hash and write (with 2, a download alone of 1 GiB ran at
    /// 480–690 MiB/s on 2 CPUs, with 4 at 650–820); more across a network,
    /// where each waits on a round trip.
    var downloadConcurrency: Int { get }
    /// Write blob `hash`, which must be `size` bytes, into `fd` at `offset`,
    /// verified: when this returns, those bytes of `fd` are the blob's (a
    /// blob of another size or content throws, leaving whatever it wrote).
    /// Default: `fetchBlob` and `pwrite`. The folder store reads the blob
    /// into a kept buffer (`O_DIRECT`) and hashes and writes it from there.
    func copyBlob(_ hash: String, size: Int, into fd: Int32, at offset: UInt64) throws
    /// Read blob `hash`, which must be `size` bytes (at most
    /// `ChunkBuffer.size`), into `buffer`, verified. Default: `fetchBlob`
    /// and a copy.
    func readBlob(_ hash: String, size: Int, into buffer: UnsafeMutableRawPointer) throws
    /// Whether fetching a chunk a second time costs less than writing it to
    /// the cache while a reader streams it: then a streamed download holds
    /// the chunks in memory for the reader and fetches them again for the
    /// cache after the stream (`DownloadBoard`). Default: false (a store
    /// across a network: every fetch is a round trip and a bill).
    var cheapToFetchAgain: Bool { get }

    /// Whether blob `hash` of `size` bytes must be uploaded: false when the
    /// store certainly holds it. A store may answer true without asking when
    /// asking costs about as much as uploading (a small blob over a network).
    func needsUpload(_ hash: String, size: Int) throws -> Bool

    /// Whether small files are pushed in packs (`PackLocation`): a store of
    /// format 2 or later, which devices that read only format 1 refuse to
    /// open, so that none of them ever meets a record naming a pack.
    /// Default: false (every file a blob of its own, as in format 1).
    var packsSmallContent: Bool { get }

    /// Whether the list of containers or a configuration may have changed
    /// since the last call: a cheap check (an S3 HEAD) before a full
    /// `containers()` (a LIST and a GET per container). Default: true.
    func containersMayHaveChanged() -> Bool

    // The collector's (`Collector`): see docs/STORE-FORMAT.md, "Collecting".

    /// Every blob the store holds, with its size and when it was last
    /// written or kept alive (a device that stores content the store
    /// already has keeps that blob alive: `needsUpload`).
    func listBlobs() throws -> [StoredBlob]
    /// Remove blob `hash` if nothing wrote or kept it alive since
    /// `unchangedSince` (checked as close to the removal as the store
    /// allows); whether it was removed.
    func removeBlob(_ hash: String, unchangedSince: Date) throws -> Bool
    /// Keep blob `hash` alive for the collector because a record is about
    /// to name it without writing it (a pack this device stored before):
    /// false when the store does not hold it, or cannot keep it alive
    /// cheaply (then the caller stores the content anew).
    func keepAlive(_ hash: String) throws -> Bool
    /// The collector's state (`gc/state.json`), or nil if there is none.
    func collectorState() throws -> Data?
    func setCollectorState(_ data: Data) throws

    // The journal's base (docs/STORE-FORMAT.md, "Compacting the journal").

    /// Whether journal records may be removed from this store: format 3
    /// or later, which every device that reads it honours the base in.
    var compactsJournal: Bool { get }
    /// Records 1…base of `container` may be gone: the snapshot of record
    /// `base` holds the state they led to. 0 when none were removed.
    /// `EBADMSG` when the base is there but damaged.
    func journalBase(container: String) throws -> UInt64
    /// Raise the base to `base` (durable when this returns). The collector
    /// sets it before it removes any record at or below it.
    func setJournalBase(container: String, _ base: UInt64) throws
    /// Remove journal record `seq` (nothing if it is not there).
    func removeRecord(container: String, seq: UInt64) throws
    /// Remove snapshot record `seq` (nothing if it is not there).
    func removeSnapshot(container: String, seq: UInt64) throws
}

/// The content of `containers/ID/journal-base`: `{"base": N, "version": 1}`.
public enum JournalBaseFormat {
    struct Stored: Codable {
        var version: Int
        var base: UInt64
    }

    public static func encode(_ base: UInt64) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return try encoder.encode(Stored(version: 1, base: base))
    }

    public static func decode(_ data: Data, at place: String) throws -> UInt64 {
        guard data.count <= 4096, let stored = try? JSONDecoder().decode(Stored.self, from: data), stored.version == 1 else {
            throw UbiquityError(EBADMSG, "the journal base \(place) is damaged: nothing is read below it until it is mended")
        }
        return stored.base
    }
}

/// A blob as `listBlobs` sees it.
public struct StoredBlob: Sendable, Hashable {
    public var hash: String
    public var size: UInt64
    /// When it was last written or kept alive.
    public var modified: Date

    public init(hash: String, size: UInt64, modified: Date) {
        self.hash = hash
        self.size = size
        self.modified = modified
    }
}

/// How long a blob a device relies on without writing it (deduplicated
/// content) may go without being kept alive: a store that cannot refresh
/// a blob cheaply writes it again once it is this old (see `Collector`).
public enum BlobLifetime {
    public static let refreshAge: TimeInterval = 86_400
}

extension Store {
    public func watchJournal(container: String) -> (any JournalWatcher)? { nil }
    public var locationDescription: String { storeID }
    public var isReachable: Bool { true }
    public func containersMayHaveChanged() -> Bool { true }
    public var uploadConcurrency: Int { 1 }
    public var packsSmallContent: Bool { false }
    public var downloadConcurrency: Int { 4 }
    public func needsUpload(_ hash: String, size: Int) throws -> Bool { try !holdsBlob(hash, size: size) }

    public func copyBlob(_ hash: String, size: Int, into fd: Int32, at offset: UInt64) throws {
        let data = try fetchBlob(hash)
        guard data.count == size else { throw UbiquityError(store: .damaged, "blob \(hash) has the wrong size") }
        try ContentCopy.write(data, to: fd, at: offset)
    }

    public func readBlob(_ hash: String, size: Int, into buffer: UnsafeMutableRawPointer) throws {
        let data = try fetchBlob(hash)
        guard data.count == size, size <= ChunkBuffer.size else { throw UbiquityError(store: .damaged, "blob \(hash) has the wrong size") }
        data.withUnsafeBytes { if let bytes = $0.baseAddress { buffer.copyMemory(from: bytes, byteCount: size) } }
    }

    public var cheapToFetchAgain: Bool { false }

    /// Default: the whole blob, verified, then the range (a store that can
    /// read a range alone does: a pread, an HTTP `Range` GET).
    public func fetchBlobRange(_ hash: String, offset: UInt64, count: Int) throws -> Data {
        let whole = try fetchBlob(hash)
        guard offset <= UInt64(whole.count), UInt64(count) <= UInt64(whole.count) - offset else {
            throw UbiquityError(store: .damaged, "pack \(hash) in the store has \(whole.count) bytes, not the \(offset + UInt64(count)) a record says")
        }
        return whole.subdata(in: Int(offset)..<Int(offset) + count)
    }

    /// The content `contentHash` of `size` bytes stored at `location` in a
    /// pack, verified against `contentHash`: a missing pack, a range beyond
    /// its end or bytes that do not match are `EIO` naming the pack, never data.
    public func fetchPacked(_ location: PackLocation, contentHash: String, size: UInt64) throws -> Data {
        guard size < UInt64(PackLayout.memberLimit), location.offset <= UInt64(PackLayout.maxPackSize) - size else {
            throw UbiquityError(store: .damaged, "pack \(location.hash): bytes \(location.offset) + \(size) cannot be in a pack")
        }
        let data = try fetchBlobRange(location.hash, offset: location.offset, count: Int(size))
        guard data.count == Int(size), ContentCopy.hash(of: data) == contentHash else {
            throw UbiquityError(store: .damaged, "pack \(location.hash) in the store is damaged: bytes \(location.offset) to \(location.offset + size) do not match content \(contentHash)")
        }
        return data
    }

    /// Whether the store holds blob `hash` with exactly `size` bytes.
    public func holdsBlob(_ hash: String, size: Int) throws -> Bool {
        try blobSize(hash) == UInt64(size)
    }
}

/// The containers of a store: those whose configuration reads, and those
/// whose configuration is damaged (ID and what is wrong).
public struct ContainerListing: Sendable {
    public var configs: [ContainerConfig]
    public var damaged: [(id: String, problem: String)]

    public init(configs: [ContainerConfig], damaged: [(id: String, problem: String)] = []) {
        self.configs = configs
        self.damaged = damaged
    }
}

/// Wakes the puller when new journal records may exist.
public protocol JournalWatcher: Sendable {
    /// Return when the journal may have changed, or after `timeout` seconds.
    /// Returns false only when the watcher looked and saw nothing new (the
    /// puller may then skip a round); true when it may have changed.
    func wait(timeout: Double) -> Bool
    func close()
}
