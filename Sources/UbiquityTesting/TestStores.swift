import Foundation
import UbiquityLocks
import UbiquityModel
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// A store held in memory: the reference implementation of the `Store`
/// protocol's semantics, for core and model tests.
public final class InMemoryStore: Store {
    struct State {
        var configs: [String: ContainerConfig] = [:]
        var journals: [String: [UInt64: Data]] = [:]
        var snapshots: [String: [UInt64: Data]] = [:]
        var blobs: [String: Data] = [:]
        var blobDates: [String: Date] = [:]
        var collectorState: Data?
        var journalBases: [String: Data] = [:]
    }

    /// The store's clock (`Date()` unless a test moves it).
    public let clock = Lock<Date?>(nil)
    var now: Date { clock.withLock { $0 } ?? Date() }

    public let storeID = UUID().uuidString.lowercased()
    /// As a store of format 2 (small files packed), unless made without.
    public let packsSmallContent: Bool
    let state = Lock(State())

    public init(packsSmallContent: Bool = true) { self.packsSmallContent = packsSmallContent }

    public func containerConfig(_ container: String) throws -> ContainerConfig? {
        state.withLock { $0.configs[container] }
    }

    public func createContainer(_ config: ContainerConfig) throws {
        try config.validate()
        try state.withLock { s in
            guard s.configs[config.id] == nil else { throw UbiquityError(EEXIST, "container \(config.id) already exists") }
            s.configs[config.id] = config
        }
    }

    public func updateContainer(_ config: ContainerConfig) throws {
        try config.validate()
        try state.withLock { s in
            guard s.configs[config.id] != nil else { throw UbiquityError(ENOENT, "no container \(config.id)") }
            s.configs[config.id] = config
        }
    }

    public func containers() throws -> ContainerListing {
        ContainerListing(configs: state.withLock { Array($0.configs.values) }.sorted { $0.id < $1.id })
    }

    public func commit(container: String, seq: UInt64, changeSet: ChangeSet) throws -> Bool {
        let data = try changeSet.encodedRecord(seq: seq)
        return state.withLock { s in
            if s.journals[container, default: [:]][seq] != nil { return false }
            s.journals[container, default: [:]][seq] = data
            return true
        }
    }

    public func journal(container: String, after seq: UInt64, limit: Int) throws -> [JournalRecord] {
        let records: [(UInt64, Data)] = state.withLock { s in
            var out: [(UInt64, Data)] = []
            var next = seq + 1
            while out.count < limit, let data = s.journals[container]?[next] {
                out.append((next, data))
                next += 1
            }
            return out
        }
        return records.map { JournalRecord(seq: $0.0, data: $0.1) }
    }

    public func snapshots(container: String) throws -> [UInt64] {
        state.withLock { $0.snapshots[container].map { $0.keys.sorted() } ?? [] }
    }

    public func snapshot(container: String, seq: UInt64) throws -> SnapshotRecord? {
        guard let data = state.withLock({ $0.snapshots[container]?[seq] }) else { return nil }
        return try SnapshotRecord.decode(data, seq: seq)
    }

    public func publishSnapshot(container: String, _ snapshot: SnapshotRecord) throws -> Bool {
        let data = try snapshot.encoded()
        return state.withLock { s in
            if s.snapshots[container, default: [:]][snapshot.seq] != nil { return false }
            s.snapshots[container, default: [:]][snapshot.seq] = data
            return true
        }
    }

    /// Test helper: put `data` as snapshot record `seq` as it is, unchecked.
    public func putSnapshotRecord(container: String, seq: UInt64, data: Data) {
        state.withLock { $0.snapshots[container, default: [:]][seq] = data }
    }

    /// Test helper: replace journal record `seq` with `data` (a store whose
    /// old records were damaged, or that only a snapshot can still describe).
    public func overwriteRecord(container: String, seq: UInt64, data: Data) {
        state.withLock { $0.journals[container, default: [:]][seq] = data }
    }

    /// Test helper: put `data` as journal record `seq` as it is, unchecked
    /// (a damaged record, or a hostile client's). `false` if `seq` is taken.
    @discardableResult
    public func putRecord(container: String, seq: UInt64, data: Data) -> Bool {
        state.withLock { s in
            if s.journals[container, default: [:]][seq] != nil { return false }
            s.journals[container, default: [:]][seq] = data
            return true
        }
    }

    /// Test helper: write `data` at a store key as the folder store lays
    /// them out (`containers/ID/journal/SEQ`, `…/snapshots/SEQ`,
    /// `…/journal-base`, `blobs/AB/HASH`), unchecked: damage for the store
    /// conformance tests. False for a key this store keeps as values, not
    /// bytes (a container's configuration).
    public func writeRaw(_ key: String, _ data: Data) -> Bool {
        let parts = key.split(separator: "/").map(String.init)
        return state.withLock { s in
            switch (parts.first, parts.count) {
            case ("blobs", 3):
                s.blobs[parts[2]] = data
            case ("containers", 3) where parts[2] == "journal-base":
                s.journalBases[parts[1]] = data
            case ("containers", 4):
                guard let seq = UInt64(parts[3]) else { return false }
                switch parts[2] {
                case "journal": s.journals[parts[1], default: [:]][seq] = data
                case "snapshots": s.snapshots[parts[1], default: [:]][seq] = data
                default: return false
                }
            default:
                return false
            }
            return true
        }
    }

    /// Test helper: the highest journal record number of `container` (0: none).
    public func journalHead(container: String) -> UInt64 {
        state.withLock { $0.journals[container]?.keys.max() ?? 0 }
    }

    public func blobSize(_ hash: String) throws -> UInt64? { state.withLock { $0.blobs[hash].map { UInt64($0.count) } } }

    public func putBlob(_ hash: String, data: Data) throws {
        guard ContentCopy.hash(of: data) == hash else { throw UbiquityError(EIO, "content does not match its hash") }
        let now = self.now
        state.withLock { s in
            if s.blobs[hash]?.count != data.count { s.blobs[hash] = data }
            s.blobDates[hash] = now
        }
    }

    /// Held already: kept alive (as the folder store does).
    public func needsUpload(_ hash: String, size: Int) throws -> Bool {
        let now = self.now
        return state.withLock { s in
            guard s.blobs[hash]?.count == size else { return true }
            s.blobDates[hash] = now
            return false
        }
    }

    public func listBlobs() throws -> [StoredBlob] {
        state.withLock { s in
            s.blobs.map { StoredBlob(hash: $0.key, size: UInt64($0.value.count), modified: s.blobDates[$0.key] ?? .distantPast) }
        }
    }

    public func removeBlob(_ hash: String, unchangedSince: Date) throws -> Bool {
        state.withLock { s in
            guard s.blobs[hash] != nil, (s.blobDates[hash] ?? .distantPast) < unchangedSince else { return false }
            s.blobs[hash] = nil
            s.blobDates[hash] = nil
            return true
        }
    }

    public func keepAlive(_ hash: String) throws -> Bool {
        let now = self.now
        return state.withLock { s in
            guard s.blobs[hash] != nil else { return false }
            s.blobDates[hash] = now
            return true
        }
    }

    public func collectorState() throws -> Data? { state.withLock { $0.collectorState } }
    public func setCollectorState(_ data: Data) throws { state.withLock { $0.collectorState = data } }

    public var compactsJournal: Bool { true }
    public func journalBase(container: String) throws -> UInt64 {
        guard let data = state.withLock({ $0.journalBases[container] }) else { return 0 }
        return try JournalBaseFormat.decode(data, at: "containers/\(container)/journal-base")
    }
    public func setJournalBase(container: String, _ base: UInt64) throws {
        let data = try JournalBaseFormat.encode(base)
        state.withLock { $0.journalBases[container] = data }
    }
    public func removeRecord(container: String, seq: UInt64) throws { _ = state.withLock { $0.journals[container]?.removeValue(forKey: seq) } }
    public func removeSnapshot(container: String, seq: UInt64) throws { _ = state.withLock { $0.snapshots[container]?.removeValue(forKey: seq) } }

    /// Test helper: the bytes of every blob held.
    public var blobBytes: UInt64 { state.withLock { $0.blobs.values.reduce(0) { $0 + UInt64($1.count) } } }

    public func flushBlobs() throws {}

    public func fetchBlob(_ hash: String) throws -> Data {
        guard let data = state.withLock({ $0.blobs[hash] }) else { throw UbiquityError(store: .damaged, "blob \(hash) missing from store") }
        guard ContentCopy.hash(of: data) == hash else { throw UbiquityError(store: .damaged, "blob \(hash) in the store is damaged") }
        return data
    }

    /// Test helper: replace a blob's bytes (to simulate damage in the store).
    public func corruptBlob(_ hash: String, with data: Data) {
        state.withLock { $0.blobs[hash] = data }
    }

    /// Test helper: forget a blob (a store restored from an older backup).
    public func loseBlob(_ hash: String) {
        _ = state.withLock { $0.blobs.removeValue(forKey: hash) }
    }

    /// Test helper: the hashes of every blob held.
    public var blobHashes: Set<String> { state.withLock { Set($0.blobs.keys) } }

    public var journalLength: Int { state.withLock { $0.journals.values.reduce(0) { $0 + $1.count } } }
}

/// Wraps a store and fails chosen operations, for fault-injection tests.
public final class FaultyStore: Store, CustomStringConvertible {
    public var description: String { base.locationDescription }
    public var locationDescription: String { base.locationDescription }
    public var isReachable: Bool { base.isReachable }
    public var packsSmallContent: Bool { base.packsSmallContent }
    public enum Operation: Sendable, Hashable { case commit, journal, blobSize, putBlob, fetchBlob }

    let base: any Store
    let failing = Lock<Set<Operation>>([])
    let delay = Lock<Double?>(nil)
    let journalDelay = Lock<Double?>(nil)
    let blobLimit = Lock<Int?>(nil)
    public var storeID: String { base.storeID }
    public var downloadConcurrency: Int { base.downloadConcurrency }
    /// As the wrapped store's; its chunks are then read (`readBlob`) through
    /// `fetchBlob`, so a fault injected there reaches a streamed download too.
    public var cheapToFetchAgain: Bool { base.cheapToFetchAgain }

    public init(_ base: any Store) { self.base = base }

    /// Make `operations` fail with EHOSTDOWN (the store is unreachable) until cleared.
    public func fail(_ operations: Set<Operation>) { failing.withLock { $0 = operations } }

    func check(_ operation: Operation) throws {
        if failing.withLock({ $0.contains(operation) }) { throw UbiquityError(store: .unreachable, "injected fault: store unreachable") }
    }

    public func containerConfig(_ container: String) throws -> ContainerConfig? { try base.containerConfig(container) }
    public func createContainer(_ config: ContainerConfig) throws { try base.createContainer(config) }
    public func updateContainer(_ config: ContainerConfig) throws { try base.updateContainer(config) }
    public func containers() throws -> ContainerListing { try base.containers() }
    /// Commits succeed in the store but answer an error (a reply lost on the way back).
    public let loseCommitReplies = Lock(false)
    public func commit(container: String, seq: UInt64, changeSet: ChangeSet) throws -> Bool {
        try check(.commit)
        let committed = try base.commit(container: container, seq: seq, changeSet: changeSet)
        if committed, loseCommitReplies.withLock({ $0 }) { throw UbiquityError(store: .unreachable, "injected fault: the commit's reply was lost") }
        return committed
    }
    public func journal(container: String, after seq: UInt64, limit: Int) throws -> [JournalRecord] {
        try check(.journal)
        if let delay = journalDelay.withLock({ $0 }) { Thread.sleep(forTimeInterval: delay) }
        return try base.journal(container: container, after: seq, limit: limit)
    }
    public func snapshots(container: String) throws -> [UInt64] {
        try check(.journal)
        return try base.snapshots(container: container)
    }
    public func snapshot(container: String, seq: UInt64) throws -> SnapshotRecord? {
        try check(.journal)
        return try base.snapshot(container: container, seq: seq)
    }
    public func publishSnapshot(container: String, _ snapshot: SnapshotRecord) throws -> Bool {
        try check(.commit)
        return try base.publishSnapshot(container: container, snapshot)
    }
    public func blobSize(_ hash: String) throws -> UInt64? {
        try check(.blobSize)
        return try base.blobSize(hash)
    }
    public func putBlob(_ hash: String, data: Data) throws {
        try check(.putBlob)
        if let limit = blobLimit.withLock({ $0 }), data.count > limit {
            throw UbiquityError(ENOSPC, "injected fault: no room in the store for \(data.count) bytes")
        }
        try base.putBlob(hash, data: data)
    }
    public func flushBlobs() throws { try base.flushBlobs() }
    public func watchJournal(container: String) -> (any JournalWatcher)? { base.watchJournal(container: container) }
    public func fetchBlob(_ hash: String) throws -> Data {
        try check(.fetchBlob)
        if let delay = delay.withLock({ $0 }) { Thread.sleep(forTimeInterval: delay) }
        return try base.fetchBlob(hash)
    }
    public func fetchBlobRange(_ hash: String, offset: UInt64, count: Int) throws -> Data {
        try check(.fetchBlob)
        if let delay = delay.withLock({ $0 }) { Thread.sleep(forTimeInterval: delay) }
        return try base.fetchBlobRange(hash, offset: offset, count: count)
    }

    /// Refuse blobs larger than `bytes` with ENOSPC (a store with little room left), or nil.
    public func refuseBlobs(largerThan bytes: Int?) { blobLimit.withLock { $0 = bytes } }

    /// Make every blob fetch take this long (a slow store), or nil.
    public func slowFetches(by seconds: Double?) { delay.withLock { $0 = seconds } }
    /// Run before each `listBlobs` (a device at work while the collector runs).
    public let beforeListingBlobs = Lock<(@Sendable () throws -> Void)?>(nil)
    public func listBlobs() throws -> [StoredBlob] {
        try beforeListingBlobs.withLock { $0 }?()
        return try base.listBlobs()
    }
    public func removeBlob(_ hash: String, unchangedSince: Date) throws -> Bool { try base.removeBlob(hash, unchangedSince: unchangedSince) }
    public func keepAlive(_ hash: String) throws -> Bool {
        try check(.blobSize)
        return try base.keepAlive(hash)
    }
    public func collectorState() throws -> Data? { try base.collectorState() }
    public func setCollectorState(_ data: Data) throws { try base.setCollectorState(data) }
    public var compactsJournal: Bool { base.compactsJournal }
    public func journalBase(container: String) throws -> UInt64 {
        try check(.journal)
        return try base.journalBase(container: container)
    }
    public func setJournalBase(container: String, _ base: UInt64) throws { try self.base.setJournalBase(container: container, base) }
    public func removeRecord(container: String, seq: UInt64) throws { try base.removeRecord(container: container, seq: seq) }
    public func removeSnapshot(container: String, seq: UInt64) throws { try base.removeSnapshot(container: container, seq: seq) }
    public func needsUpload(_ hash: String, size: Int) throws -> Bool {
        try check(.blobSize)
        return try base.needsUpload(hash, size: size)
    }

    /// Make every journal read take `seconds` longer (a slow store under a pull).
    public func slowJournalReads(by seconds: Double?) { journalDelay.withLock { $0 = seconds } }
}
