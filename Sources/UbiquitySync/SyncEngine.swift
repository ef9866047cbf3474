import Foundation
import Logging
import Synchronization
import UbiquityReplica
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// The sync engine of one mount: pushes local changes to the store and
/// applies the store's journal to the replica.
///
/// **Push.** A dedicated thread wakes on local changes, waits the
/// write-back delay, then: snapshots the content of every changed file that
/// has no open writer into the staging area (hashing it as it copies),
/// checks that the file's content generation did not move meanwhile
/// (coordinated access: an open for writing or a truncation bumps it, so a
/// torn snapshot is detected and dropped), uploads the blobs, and commits one
/// change set with the current state of every changed node and entry.
/// The commit creates `journal/<applied+1>` exclusively; losing that race
/// means another device committed first: the engine applies its records and
/// retries.
///
/// **Pull.** Records after the replica's `appliedSeq` are applied in order;
/// the device's own records are skipped (already applied locally).
///
/// Threads: the push thread and the caller of `drain` share `pushLock`, so
/// one push runs at a time. Lock order: `pushLock` → replica locks;
/// `status` is a leaf.
public final class SyncEngine: Sendable {
    public let replica: Replica
    public let store: any Store
    public let container: String
    public let device: DeviceIdentity
    let logger: Logger
    let writeBackDelay: Double

    let pushLock = Mutex<Int>(0)
    let pullLock = Mutex<Int>(0)
    let observer = Mutex<(any ReplicaObserver)?>(nil)
    let pullThreadDone = DispatchSemaphore(value: 0)
    let pulling = Mutex(false)
    let fetchLock = Mutex<Int>(0)
    let wake = DispatchSemaphore(value: 0)
    let status = Mutex(SyncStatus())
    let stopped = Mutex(false)
    let pushThreadDone = DispatchSemaphore(value: 0)

    public init(replica: Replica, store: any Store, container: String, device: DeviceIdentity,
                logger: Logger, writeBackDelay: Double = 0.2) {
        self.replica = replica
        self.store = store
        self.container = container
        self.device = device
        self.logger = logger
        self.writeBackDelay = writeBackDelay
    }

    // MARK: - Lifecycle

    /// Start pushing, and following the journal: woken by the store's
    /// watcher when it has one, and every `pollInterval` seconds regardless.
    public func start(pollInterval: Double, observer: (any ReplicaObserver)?) {
        self.observer.withLock { $0 = observer }
        let push = Thread { [self] in pushLoop() }
        push.name = "ubiquityfs-push"
        push.start()
        pulling.withLock { $0 = true }
        let pull = Thread { [self] in pullLoop(pollInterval: pollInterval) }
        pull.name = "ubiquityfs-pull"
        pull.start()
    }

    /// Stop the push and pull threads (waits for the current round to finish).
    public func stop() {
        let wasStopped = stopped.withLock { s -> Bool in defer { s = true }; return s }
        guard !wasStopped else { return }
        wake.signal()
        pushThreadDone.wait()
        if pulling.withLock({ $0 }) { pullThreadDone.wait() }
        observer.withLock { $0 = nil }
    }

    func pullLoop(pollInterval: Double) {
        let watcher = store.watchJournal(container: container)
        defer { watcher?.close(); pullThreadDone.signal() }
        while !stopped.withLock({ $0 }) {
            do {
                try pull()
            } catch {
                record(error: error)
            }
            if let watcher {
                watcher.wait(timeout: pollInterval)
            } else {
                Thread.sleep(forTimeInterval: pollInterval)
            }
        }
    }

    func pushLoop() {
        // Pushing is background work: it yields CPU and disk to the programs using the mount.
        LinuxCalls.lowerThreadPriority()
        var backoff = 1.0
        while !stopped.withLock({ $0 }) {
            _ = wake.wait(timeout: .now() + 1)
            if stopped.withLock({ $0 }) { break }
            // One round serves every change signalled so far.
            while wake.wait(timeout: .now()) == .success {}
            // Let writers settle: a burst of changes becomes one commit.
            Thread.sleep(forTimeInterval: writeBackDelay)
            do {
                while try pushOnce(ignoreDelay: false), !stopped.withLock({ $0 }) {}
                backoff = 1
            } catch {
                record(error: error)
                Thread.sleep(forTimeInterval: backoff)
                backoff = min(backoff * 2, 30)
            }
        }
        pushThreadDone.signal()
    }

    func record(error: any Error) {
        let text = "\(error)"
        logger.error("sync: \(text)")
        status.withLock { s in
            s.lastError = text
            s.lastErrorDate = Date()
            s.storeReachable = !(error is UbiquityError && (error as! UbiquityError).errno == EHOSTDOWN)
        }
    }

    public var currentStatus: SyncStatus { status.withLock { $0 } }

    /// Push until nothing is pending, reporting progress. Returns the number
    /// of items still pending: 0, or items that cannot be pushed because a
    /// program keeps them open for writing (the caller decides what to do).
    @discardableResult
    public func drain(progress: (_ items: Int, _ bytes: UInt64) -> Void, shouldContinue: () -> Bool = { true }) throws -> Int {
        while shouldContinue() {
            let pending = replica.withNamespace { ns in ns.pendingSummary() }
            progress(pending.items, pending.bytes)
            if pending.items == 0 { return 0 }
            do {
                if try !pushOnce(ignoreDelay: true) { return pending.items }
            } catch {
                record(error: error)
                throw error
            }
        }
        return replica.withNamespace { ns in ns.pendingSummary() }.items
    }

    // MARK: - SyncHooks

    public func localChangeRecorded() { wake.signal() }

    // MARK: - Push

    struct ContentSnapshot {
        var ino: UInt64
        var generation: UInt64
        var hash: String
        var size: UInt64
    }

    /// One round of pushing. Returns whether anything was committed.
    @discardableResult
    public func pushOnce(ignoreDelay: Bool) throws -> Bool {
        try pushLock.withLock { _ in try pushLocked(ignoreDelay: ignoreDelay) }
    }

    func pushLocked(ignoreDelay: Bool) throws -> Bool {
        let now = Self.monotonicNow()
        let delay = ignoreDelay ? 0 : UInt64(writeBackDelay * 1e9)
        let contentCandidates = replica.withNamespace { ns in
            ns.unpushedNodes().filter { n in
                n.hasUnpushedContent && n.hasContent && !n.unlinked && n.openWriters == 0
                    && now &- n.lastContentChange >= delay
            }.map { ($0.ino, $0.contentGeneration, $0.hash) }
        }
        var snapshots: [UInt64: ContentSnapshot] = [:]
        var uploaded = false
        for (ino, generation, oldHash) in contentCandidates {
            guard let snapshot = try snapshotContent(ino: ino, generation: generation) else { continue }
            if snapshot.hash != oldHash {
                switch snapshot.content {
                case .bytes(let data): try store.putBlob(snapshot.hash, data: data)
                case .staged(let url): try store.putBlob(snapshot.hash, from: url)
                }
                uploaded = true
            }
            if case .staged(let url) = snapshot.content { unlink(url.path) }
            snapshots[ino] = ContentSnapshot(ino: ino, generation: generation, hash: snapshot.hash, size: snapshot.size)
        }
        if uploaded { try store.flushBlobs() }

        while true {
            let batch = replica.withNamespace { ns in buildBatch(ns, snapshots: snapshots) }
            guard !batch.changes.isEmpty || !batch.nodes.isEmpty || !batch.entries.isEmpty else { return false }
            if batch.changes.isEmpty {
                // Only things the store never saw (created and deleted locally): settle them.
                try settle(batch, seq: nil, snapshots: snapshots)
                return true
            }
            let seq = batch.appliedSeq + 1
            let changeSet = ChangeSet(device: device.id, deviceName: device.name, changes: batch.changes)
            if try store.commit(container: container, seq: seq, changeSet: changeSet) {
                try settle(batch, seq: seq, snapshots: snapshots)
                status.withLock { s in
                    s.lastSync = Date()
                    s.storeReachable = true
                    s.pushedChangeSets += 1
                }
                logger.debug("pushed journal \(seq): \(batch.changes.count) changes")
                return true
            }
            // Another device committed first: catch up, then rebuild the batch.
            try pull()
        }
    }

    enum SnapshotContent {
        case bytes(Data)
        case staged(URL)
    }

    /// Content up to this size is snapshotted in memory: no staging file.
    static let inMemorySnapshotLimit = 4 << 20

    /// Snapshot the cache file of `ino` (in memory if small, else into a
    /// staging file) while hashing it; nil if the content changed meanwhile
    /// — the snapshot would be torn.
    func snapshotContent(ino: UInt64, generation: UInt64) throws -> (content: SnapshotContent, hash: String, size: UInt64)? {
        let source = open(replica.cachePath(ino), O_RDONLY | O_CLOEXEC)
        guard source >= 0 else { return nil }
        defer { close(source) }
        var st = stat()
        guard fstat(source, &st) == 0 else { return nil }
        let result: (content: SnapshotContent, hash: String, size: UInt64)
        if st.st_size <= Self.inMemorySnapshotLimit {
            var data = Data(count: Int(st.st_size) + 1)
            let n = data.withUnsafeMutableBytes { pread(source, $0.baseAddress, $0.count, 0) }
            guard n >= 0, n <= Int(st.st_size) else { return nil }   // grew meanwhile: retry later
            data.count = n
            result = (.bytes(data), ContentCopy.hash(of: data), UInt64(n))
        } else {
            let staged = replica.stagingPath()
            let destination = try syscallRetrying("create staging file") { open(staged.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o444) }
            do {
                let copied = try ContentCopy.copy(from: source, to: destination)
                close(destination)
                result = (.staged(staged), copied.hash, copied.size)
            } catch {
                close(destination)
                unlink(staged.path)
                throw error
            }
        }
        let unchanged = replica.withNamespace { ns in
            guard let node = ns.node(ino) else { return false }
            return node.contentGeneration == generation && node.openWriters == 0
        }
        guard unchanged else {
            if case .staged(let url) = result.content { unlink(url.path) }
            return nil
        }
        return result
    }

    struct Batch {
        var appliedSeq: UInt64
        var changes: [Change]
        /// Nodes in the batch with the change counter they were captured at.
        var nodes: [(ino: UInt64, change: UInt64)]
        var entries: [(key: EntryKey, change: UInt64)]
    }

    /// The change set for everything unpushed. A file whose new content is
    /// not snapshotted yet (a writer has it open, or it was written within the
    /// write-back delay) waits for its content: other devices get its new
    /// state in one piece, and a new file never appears empty first.
    func buildBatch(_ ns: Namespace, snapshots: [UInt64: ContentSnapshot]) -> Batch {
        var nodeChanges: [Change] = []
        var deletions: [Change] = []
        var nodes: [(UInt64, UInt64)] = []
        var waitingForContent = Set<UInt64>()
        for node in ns.unpushedNodes() {
            let snapshot = snapshots[node.ino].flatMap { $0.generation == node.contentGeneration ? $0 : nil }
            if node.hasUnpushedContent && snapshot == nil && !node.unlinked {
                waitingForContent.insert(node.ino)
                continue
            }
            guard node.hasUnpushedMetadata || snapshot != nil else { continue }
            nodes.append((node.ino, node.change))
            if node.unlinked {
                if node.version > 0 { deletions.append(.deleteNode(id: node.id, base: node.version)) }
                continue
            }
            let hash = snapshot?.hash ?? node.hash
            let size = snapshot?.size ?? node.hashSize
            nodeChanges.append(.node(node.sharedState(hash: hash, size: size)))
        }
        var entryChanges: [Change] = []
        var entries: [(EntryKey, UInt64)] = []
        for (key, change) in ns.pendingEntries {
            let childIno = ns.lookup(key.parent, key.name)
            // An entry naming a new node that waits for its content waits with it.
            if let childIno, waitingForContent.contains(childIno), ns.node(childIno)?.version == 0 { continue }
            entries.append((key, change))
            guard let parent = ns.node(key.parent) else { continue }
            let child = childIno.flatMap { ns.node($0)?.id }
            if parent.unlinked && child == nil && parent.version == 0 { continue }
            entryChanges.append(.entry(parent: parent.id, name: key.name, child: child))
        }
        return Batch(appliedSeq: ns.appliedSeq, changes: nodeChanges + entryChanges + deletions, nodes: nodes, entries: entries)
    }

    /// Record that `batch` is in the store as journal record `seq`.
    func settle(_ batch: Batch, seq: UInt64?, snapshots: [UInt64: ContentSnapshot]) throws {
        let dropped = replica.withNamespace { ns -> [UInt64] in
            if let seq { ns.setAppliedSeq(seq) }
            var dropped: [UInt64] = []
            for (ino, change) in batch.nodes {
                ns.update(ino, local: false) { n in
                    n.pushed = max(n.pushed, change)
                    if let seq { n.version = seq }
                    if let snapshot = snapshots[ino], snapshot.generation == n.contentGeneration {
                        n.hash = snapshot.hash
                        n.hashSize = snapshot.size
                        n.pushedGeneration = snapshot.generation
                    }
                    if n.unlinked { n.pushedGeneration = n.contentGeneration }
                }
                if ns.dropIfUnreferenced(ino) { dropped.append(ino) }
            }
            for (key, change) in batch.entries { ns.entryPushed(key, change: change) }
            return dropped
        }
        for ino in dropped { unlink(replica.cachePath(ino)) }
        try replica.persist()
    }

    static func monotonicNow() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }
}

/// What `ubiquityfs status` shows about sync.
public struct SyncStatus: Sendable, Codable {
    public var lastSync: Date?
    public var lastError: String?
    public var lastErrorDate: Date?
    public var storeReachable = true
    public var pushedChangeSets = 0
}
