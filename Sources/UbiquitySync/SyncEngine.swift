import Foundation
import Logging
import UbiquityLocks
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// The sync engine of one mount: pushes local changes to the store and
/// applies the store's journal to the replica.
///
/// **Push.** A dedicated thread wakes on local changes, waits the
/// write-back delay, then: snapshots the content of every changed file that
/// has no open writer (hashing it chunk by chunk, uploading what the store
/// lacks), checks that the file's content generation did not move meanwhile
/// (coordinated access: an open for writing, a write or a truncation moves
/// it, so a torn snapshot is detected and dropped), flushes the blobs, and
/// commits one change set with the current state of every changed node and
/// entry.
/// The commit creates `journal/<applied+1>` exclusively; losing that race
/// means another device committed first: the engine applies its records and
/// retries.
///
/// **Pull.** Records after the replica's `appliedSeq` are applied in order;
/// the device's own records are skipped (already applied locally), and a
/// record that fails validation is quarantined (see `pull`).
///
/// **Held content.** When started, a thread checks once that the store
/// holds every file this device holds, and puts back what it lost
/// (`checkHeldContent`).
///
/// Threads: the push thread and the caller of `drain` share `pushLock`, so
/// one push runs at a time. Lock order: `pushLock` → `commitGate` → replica
/// locks (a pull takes `commitGate` alone, before `pullLock`);
/// `cacheLimitPass` → replica locks; the download pool's monitor →
/// `Replica.namespace`; `status`, `uploadFailures` and `limitRefusals` are
/// leaves.
public final class SyncEngine: Sendable {
    public let replica: Replica
    public let store: any Store
    public let container: String
    public let device: DeviceIdentity
    let logger: Logger
    let writeBackDelay: Double
    /// Bytes of content to keep at most (nil: no limit).
    public let cacheLimit: UInt64?

    let pushLock = Lock<Int>(0)
    /// Held by a push from its commit until it is settled (`appliedSeq` moved past it).
    let commitGate = Lock<Int>(0)
    let pullLock = Lock<Int>(0)
    let observer = Lock<(any ReplicaObserver)?>(nil)
    let pullThreadDone = DispatchSemaphore(value: 0)
    let pulling = Lock(false)
    let downloads = DownloadBoard()
    let wake = DispatchSemaphore(value: 0)
    let status = Lock(SyncStatus())
    let stopped = Lock(false)
    let pushThreadDone = DispatchSemaphore(value: 0)
    /// Files whose content the store would not take (full, a failing write):
    /// each is retried with its own back-off while the others go ahead.
    let uploadFailures = Lock<[UInt64: UploadFailure]>([:])
    /// Files the cache limit could not evict, and when (monotonic ns) it may try again.
    let limitRefusals = Lock<[UInt64: UInt64]>([:])
    let checkThreadDone = DispatchSemaphore(value: 0)
    let checking = Lock(false)
    /// Held by a cache-limit pass (`enforceCacheLimit`), over its evictions.
    let cacheLimitPass = Lock(0)
    /// Journal records between snapshots, at least (0: never read or write one).
    let snapshotInterval: UInt64
    /// The newest snapshot this device knows of (nil: not asked yet).
    let latestSnapshot = Lock<UInt64?>(nil)
    /// Where packed content is (`Packs.swift`).
    let packs: PackIndex
    /// The container's history as read from the journal (`History.swift`).
    let history: HistoryIndex
    /// The wall clock records are dated by and retention periods measured
    /// with (tests move it: a week of edits in a second).
    let clock: @Sendable () -> Timespec
    /// What downloads time their progress, streams and stalls by (tests move it).
    let downloadClock: @Sendable () -> Date
    /// When `catchUpHistory` last made sure the history reaches back to the retention limit.
    let historyBackfilled = Lock<Date?>(nil)
    /// When the journal's base was last read (nil: read it at the next chance; `Rejoin.swift`).
    let baseChecked = Lock<Date?>(nil)

    public init(replica: Replica, store: any Store, container: String, device: DeviceIdentity,
                logger: Logger, writeBackDelay: Double = 0.2, cacheLimit: UInt64? = nil,
                snapshotInterval: UInt64 = SyncEngine.defaultSnapshotInterval,
                clock: @escaping @Sendable () -> Timespec = { .now() },
                downloadClock: @escaping @Sendable () -> Date = { Date() }) {
        self.clock = clock
        self.downloadClock = downloadClock
        self.replica = replica
        self.store = store
        self.container = container
        self.device = device
        self.logger = logger
        self.writeBackDelay = writeBackDelay
        self.cacheLimit = cacheLimit
        self.snapshotInterval = snapshotInterval
        self.packs = PackIndex(directory: replica.directory, logger: logger)
        self.history = HistoryIndex(directory: replica.directory, logger: logger)
    }

    // MARK: - Lifecycle

    /// Start pushing, and following the journal: woken by the store's
    /// watcher when it has one, and every `pollInterval` seconds regardless.
    /// Longest a push waits for a busy mount to become quiet.
    static let maxBatchDelay = 2.0
    /// Longest the journal goes unread when a watcher keeps saying "nothing new".
    static let maxQuietPoll = 30.0
    /// Most nodes in one change set: bounds the memory and size of a commit
    /// (a burst of 100,000 new files becomes a series of commits).
    static let maxBatchNodes = 4000

    public func start(pollInterval: Double, observer: (any ReplicaObserver)?) {
        self.observer.withLock { $0 = observer }
        Thread.run(named: "ubq-push") { [self] in pushLoop() }
        pulling.withLock { $0 = true }
        Thread.run(named: "ubq-pull") { [self] in pullLoop(pollInterval: pollInterval) }
        checking.withLock { $0 = true }
        Thread.run(named: "ubq-check") { [self] in
            checkHeldContent()
            do {
                try catchUpHistory()
            } catch {
                logger.warning("\(container): the history could not be read back from the store for now: \(UbiquityError.wrap(error).message)")
            }
            checkThreadDone.signal()
        }
    }

    /// Stop the push and pull threads (waits for the current round to finish).
    public func stop() {
        let wasStopped = stopped.withLock { s -> Bool in defer { s = true }; return s }
        guard !wasStopped else { return }
        wake.signal()
        pushThreadDone.wait()
        if pulling.withLock({ $0 }) { pullThreadDone.wait() }
        if checking.withLock({ $0 }) { checkThreadDone.wait() }
        observer.withLock { $0 = nil }
    }

    func pullLoop(pollInterval: Double) {
        var watcher = store.watchJournal(container: container)
        defer { watcher?.close(); pullThreadDone.signal() }
        // The last error logged: the same error every poll is logged once.
        var lastError: String?
        var mayHaveChanged = true
        var lastPull = DispatchTime.now().uptimeNanoseconds
        while !stopped.withLock({ $0 }) {
            // A watcher that looked and saw nothing new saves a round, but
            // never for long: the journal is read at least every `maxQuietPoll`.
            let quiet = Double(DispatchTime.now().uptimeNanoseconds - lastPull) / 1e9
            if !mayHaveChanged && quiet < Self.maxQuietPoll {
                enforceCacheLimit()
                writeSnapshotIfDue()
                mayHaveChanged = watcher?.wait(timeout: pollInterval) ?? true
                continue
            }
            lastPull = DispatchTime.now().uptimeNanoseconds
            do {
                let wasReachable = status.withLock { $0.storeReachable }
                // Away for who knows how long: the journal's end is checked against its base.
                if !wasReachable { baseChecked.withLock { $0 = nil } }
                try pull()
                lastError = nil
                if !wasReachable {
                    logger.info("the store is reachable again; pushing what was queued")
                    wake.signal()
                }
                // The journal folder may have come back (or been replaced): watch it anew.
                if watcher == nil || !wasReachable {
                    watcher?.close()
                    watcher = store.watchJournal(container: container)
                }
            } catch {
                let text = "\(error)"
                record(error: error, log: text != lastError)
                lastError = text
                watcher?.close()
                watcher = nil
            }
            enforceCacheLimit()
            if lastError == nil { writeSnapshotIfDue() }
            if let watcher {
                mayHaveChanged = watcher.wait(timeout: pollInterval)
            } else {
                Thread.sleep(forTimeInterval: pollInterval)
                mayHaveChanged = true
            }
        }
    }

    func pushLoop() {
        // Pushing is background work: it yields CPU and disk to the programs using the mount.
        LinuxCalls.lowerThreadPriority()
        var backoff = 1.0
        var lastRelease = Date.distantPast
        while !stopped.withLock({ $0 }) {
            _ = wake.wait(timeout: .now() + 1)
            if stopped.withLock({ $0 }) { break }
            // Let writers settle: wait until the mount has been quiet for the
            // write-back delay (at most `maxBatchDelay`), so a burst of changes
            // becomes one commit and pushing does not compete with the burst.
            var waited = 0.0
            repeat {
                while wake.wait(timeout: .now()) == .success {}
                Thread.sleep(forTimeInterval: writeBackDelay)
                waited += writeBackDelay
            } while wake.wait(timeout: .now()) == .success && waited < Self.maxBatchDelay
            do {
                var rounds = 0
                // Each round (up to `maxBatchNodes` nodes) waits for a pause in the
                // programs' requests, a second at most: a burst of metadata
                // operations does not share the CPUs with the pushes it causes.
                while !stopped.withLock({ $0 }) {
                    replica.foreground.waitForQuiet(longest: ForegroundActivity.longestDeferral)
                    guard try pushOnce(ignoreDelay: false) else { break }
                    rounds += 1
                }
                // Pushing leaves freed buffers behind (change sets, their JSON,
                // packs): return them, at most once a second while the pushes go on.
                if rounds > 0, Date().timeIntervalSince(lastRelease) >= 1 {
                    LinuxCalls.releaseFreeMemory()
                    lastRelease = Date()
                }
                // Nothing to push: the pack index's SQLite caches go back too, if
                // used since (pulls and downloads fill them again from the file).
                if rounds == 0, packs.releaseMemoryIfUsed() { LinuxCalls.releaseFreeMemory() }
                backoff = 1
            } catch {
                record(error: error)
                Thread.sleep(forTimeInterval: backoff)
                backoff = min(backoff * 2, 5)
            }
        }
        pushThreadDone.signal()
    }

    /// Note a failure in the status (and the log, unless `log` is false:
    /// the same failure again).
    public func record(error: any Error, log: Bool = true) {
        let text = "\(error)"
        if log { logger.error("sync: \(text)") }
        status.withLock { s in
            s.lastError = text
            s.lastErrorDate = Date()
            if s.recentErrors.last?.message == text {
                s.recentErrors[s.recentErrors.count - 1].date = Date()
            } else {
                s.recentErrors.append(SyncStatus.Failure(date: Date(), message: text))
            }
            if s.recentErrors.count > 10 { s.recentErrors.removeFirst(s.recentErrors.count - 10) }
            s.storeReachable = !(error is UbiquityError && (error as! UbiquityError).errno == EHOSTDOWN)
        }
    }

    public var currentStatus: SyncStatus { status.withLock { $0 } }

    struct UploadFailure: Sendable {
        var attempts: Int
        /// The content generation that failed: content changed since is tried at once.
        var generation: UInt64
        /// Monotonic nanoseconds before which the file is not tried again.
        var retryAt: UInt64
        var message: String
    }

    /// Longest wait between two tries of a file the store does not take.
    static let maxUploadBackoff = 300.0

    func uploadFailed(_ ino: UInt64, generation: UInt64, _ error: any Error) {
        let message = "\(UbiquityError.wrap(error))"
        let attempts = uploadFailures.withLock { failures -> Int in
            let attempts = (failures[ino]?.attempts ?? 0) + 1
            let wait = min(Self.maxUploadBackoff, pow(2, Double(min(attempts, 16))))
            failures[ino] = UploadFailure(attempts: attempts, generation: generation,
                                          retryAt: MonotonicClock.now() + UInt64(wait * 1e9), message: message)
            return attempts
        }
        if attempts == 1 { record(error: UbiquityError(EIO, "cannot upload \(replica.read { $0.path(of: ino) } ?? "inode \(ino)"): \(message)")) }
    }

    /// Failures of files that have nothing left to upload (pushed, deleted) are forgotten.
    func forgetSettledUploadFailures() {
        let inos = uploadFailures.withLock { Array($0.keys) }
        guard !inos.isEmpty else { return }
        let settled = replica.read { ns in inos.filter { ns.node($0)?.hasUnpushedContent != true } }
        uploadFailures.withLock { failures in settled.forEach { failures[$0] = nil } }
    }

    /// Files the store does not take for now: inode, tries so far, the last error.
    public func failingUploads() -> [(ino: UInt64, attempts: Int, message: String)] {
        uploadFailures.withLock { $0.map { ($0.key, $0.value.attempts, $0.value.message) } }.sorted { $0.ino < $1.ino }
    }

    /// Where the store is, for status (a folder store's path, an S3 URL).
    public var storePath: String { store.locationDescription }

    /// Push until nothing is pending, reporting progress. Returns the number
    /// of items still pending: 0, or items that cannot be pushed because a
    /// program keeps them open for writing (the caller decides what to do).
    /// Files the store refuses (full, a failing write) are an error: they
    /// are not in the store, and the caller must not say otherwise.
    @discardableResult
    public func drain(progress: (_ items: Int, _ bytes: UInt64) -> Void, shouldContinue: () -> Bool = { true }) throws -> Int {
        while shouldContinue() {
            let pending = replica.read { ns in ns.pendingSummary() }
            progress(pending.items, pending.bytes)
            if pending.items == 0 { return 0 }
            do {
                if try !pushOnce(ignoreDelay: true) {
                    let refused = failingUploads()
                    guard let first = refused.first else { return pending.items }
                    let path = replica.read { ns in ns.path(of: first.ino) } ?? "inode \(first.ino)"
                    let others = refused.count > 1 ? " and \(refused.count - 1) other file(s)" : ""
                    throw UbiquityError(EIO, "the store refuses \(path)\(others): \(first.message)")
                }
            } catch {
                record(error: error)
                throw error
            }
        }
        return replica.read { ns in ns.pendingSummary() }.items
    }

    // MARK: - SyncHooks

    public func localChangeRecorded() { wake.signal() }

    // MARK: - Push

    struct ContentSnapshot {
        var ino: UInt64
        var generation: UInt64
        var hash: String
        var size: UInt64
        var chunked: Bool
        /// Blobs were written to the store (they must be flushed before the commit).
        var uploaded: Bool
        /// Where the content is in a pack (nil: a blob of its own, or chunks).
        var pack: PackLocation? = nil
        /// Handed to the round's `PackWriter`: the location is known when it finishes.
        var packing = false
    }

    /// One round of pushing. Returns whether anything was committed.
    @discardableResult
    public func pushOnce(ignoreDelay: Bool) throws -> Bool {
        try pushLock.withLock { _ in try pushLocked(ignoreDelay: ignoreDelay) }
    }

    func pushLocked(ignoreDelay: Bool) throws -> Bool {
        let now = MonotonicClock.now()
        let delay = ignoreDelay ? 0 : UInt64(writeBackDelay * 1e9)
        // Files waiting after a failure (inode → the generation that failed).
        let backingOff = ignoreDelay ? [:] : uploadFailures.withLock { failures in
            failures.filter { $0.value.retryAt > now }.mapValues(\.generation)
        }
        let contentCandidates = replica.read { ns in
            ns.unpushedNodes(limit: Self.maxBatchNodes).filter { n in
                n.hasUnpushedContent && n.hasContent && !n.unlinked && n.openWriters == 0
                    && now &- n.lastContentChange >= delay && backingOff[n.ino] != n.contentGeneration
            }.map { ($0.ino, $0.contentGeneration) }
        }
        var snapshots: [UInt64: ContentSnapshot] = [:]
        // Small files of this round go into packs (a few blobs, not one each).
        let packer = contentCandidates.count > 1 && store.packsSmallContent ? PackWriter(store: store) : nil
        let uploads = Parallel.map(contentCandidates, width: store.uploadConcurrency) { [self] candidate in
            Result { try uploadContent(ino: candidate.0, generation: candidate.1, packer: packer) }
        }
        let packed = packer?.finish() ?? [:]
        var unreachable: (any Error)?
        for ((ino, generation), result) in zip(contentCandidates, uploads) {
            do {
                if var snapshot = try result.get() {
                    if snapshot.packing {
                        switch packed[snapshot.hash] {
                        case .success(let location)?: snapshot.pack = location
                        case .failure(let error)?: throw error
                        case nil: throw UbiquityError(EIO, "content \(snapshot.hash) was not packed")
                        }
                    }
                    snapshots[ino] = snapshot
                }
                uploadFailures.withLock { _ = $0.removeValue(forKey: ino) }
            } catch let error as UbiquityError where error.errno == EHOSTDOWN {
                unreachable = error   // the store is gone: nothing can be pushed
            } catch {
                // This file waits (with back-off); the others still go.
                uploadFailed(ino, generation: generation, error)
            }
        }
        if let unreachable { throw unreachable }
        forgetSettledUploadFailures()
        if snapshots.values.contains(where: \.uploaded) {
            // Flushing a large file's chunks writes them all out: after the programs' I/O.
            if snapshots.values.contains(where: { $0.chunked && $0.uploaded }) { replica.foreground.waitForQuiet() }
            try store.flushBlobs()
        }
        // Known before the replica records the nodes (`settle`): a node whose
        // content is packed never lacks its location.
        var newLocations: [String: PackLocation] = [:]
        for snapshot in snapshots.values { if let pack = snapshot.pack { newLocations[snapshot.hash] = pack } }
        try packs.record(newLocations, own: true)

        while true {
            // Only what the index holds is pushed: this device never puts in
            // the store a change it could lose (or that a failed operation made).
            let batch = try replica.committedView { ns in buildBatch(ns, snapshots: snapshots) }
            guard !batch.changes.isEmpty || !batch.nodes.isEmpty || !batch.entries.isEmpty else { return false }
            if batch.changes.isEmpty {
                // Only things the store never saw (created and deleted locally): settle them.
                try settle(batch, seq: nil, snapshots: snapshots)
                return true
            }
            let seq = batch.appliedSeq + 1
            let changeSet = ChangeSet(device: device.id, deviceName: device.name, date: clock(),
                                      changes: namingPacks(batch.changes, known: newLocations))
            // Settled under `commitGate`: a pull woken by this very record
            // waits, then finds it applied instead of reading it back.
            let committed = try commitGate.withLock { _ -> Bool in
                guard try store.commit(container: container, seq: seq, changeSet: changeSet),
                      try !withdrawIfBelowBase(seq) else { return false }
                try settle(batch, seq: seq, snapshots: snapshots)
                indexHistory([(seq, changeSet)])
                return true
            }
            if committed {
                trace("PUSH [\(device.name)] seq \(seq): \(batch.changes.map(ChangeApplier.describe))")
                status.withLock { s in
                    s.lastSync = Date()
                    s.storeReachable = true
                    s.pushedChangeSets += 1
                }
                logger.debug("pushed journal \(seq): \(batch.changes.count) changes")
                return true
            }
            // Another device committed first (or something else took the
            // number: a record the pull quarantines): catch up, then rebuild
            // the batch for the next free number.
            try pull()
            guard replica.read({ $0.appliedSeq }) >= seq else {
                throw UbiquityError(EIO, "journal record \(seq) of \(container) exists but was not read; pushing waits for it")
            }
        }
    }

    /// Snapshot the cache file of `ino` and upload what the store lacks (a
    /// blob it does not hold with the right size: missing, or cut short).
    /// Content up to one chunk is read into memory, hashed, and uploaded only
    /// if the generation did not move meanwhile. Larger content is read chunk
    /// by chunk, each chunk uploaded as it is hashed, then the manifest; a
    /// snapshot torn by a write leaves only unreferenced chunks behind. Nil
    /// when the content changed during the snapshot: the next round retries.
    /// A snapshot kept records its hash as verified (`LocalNode.verifiedHash`).
    /// Content under `PackLayout.memberLimit` goes to `packer` (when given)
    /// unless the store holds it already, or this device knows it is packed.
    func uploadContent(ino: UInt64, generation: UInt64, packer: PackWriter? = nil) throws -> ContentSnapshot? {
        let source: CacheFileReader
        do {
            source = try CacheFileReader(path: replica.cache.path(ino))
        } catch {
            // Gone with a change (the file deleted, its content replaced): the
            // next round has a new generation. Otherwise this file's upload
            // fails, with back-off, in the status and the log.
            let unchanged = replica.read { ns in
                ns.node(ino).map { $0.contentGeneration == generation && $0.hasContent && !$0.unlinked } ?? false
            }
            guard unchanged else { return nil }
            throw error
        }
        defer { source.close() }
        let chunkSize = ContentLayout.chunkSize
        func stillUnchanged() -> Bool {
            replica.read { ns in
                guard let node = ns.node(ino) else { return false }
                return node.contentGeneration == generation && node.openWriters == 0
            }
        }
        // A read comes back short (nil) if the file shrank meanwhile; growth and
        // every other change are caught by the generation check.
        let size = source.size
        if size <= chunkSize {
            guard let data = try source.read(at: 0, count: size), stillUnchanged() else { return nil }
            let hash = ContentCopy.hash(of: data)
            if let packer, !data.isEmpty, data.count < PackLayout.memberLimit {
                if let known = packs.location(of: hash, ownOnly: true), try store.keepAlive(known.hash) {
                    return ContentSnapshot(ino: ino, generation: generation, hash: hash, size: UInt64(data.count),
                                           chunked: false, uploaded: false, pack: known)
                }
                if try store.needsUpload(hash, size: data.count) {
                    packer.add(hash, data)
                    return ContentSnapshot(ino: ino, generation: generation, hash: hash, size: UInt64(data.count),
                                           chunked: false, uploaded: true, packing: true)
                }
                return ContentSnapshot(ino: ino, generation: generation, hash: hash, size: UInt64(data.count),
                                       chunked: false, uploaded: false)
            }
            let upload = try store.needsUpload(hash, size: data.count)
            if upload { try store.putBlob(hash, data: data) }
            return ContentSnapshot(ino: ino, generation: generation, hash: hash, size: UInt64(data.count),
                                   chunked: false, uploaded: upload)
        }
        var chunks: [String] = []
        var offset = 0
        var uploaded = false
        while offset < size {
            // A large file is background work worth pausing for programs using the mount.
            replica.foreground.waitForQuiet()
            let count = min(chunkSize, size - offset)
            guard let data = try source.read(at: offset, count: count) else { return nil }
            let hash = ContentCopy.hash(of: data)
            if try store.needsUpload(hash, size: count) {
                try store.putBlob(hash, data: data)
                uploaded = true
            }
            chunks.append(hash)
            offset += count
        }
        guard stillUnchanged() else { return nil }
        let manifest = try ChunkManifest(chunkSize: UInt64(chunkSize), size: UInt64(size), chunks: chunks).encoded()
        let hash = ContentCopy.hash(of: manifest)
        if try store.needsUpload(hash, size: manifest.count) {
            try store.putBlob(hash, data: manifest)
            uploaded = true
        }
        return ContentSnapshot(ino: ino, generation: generation, hash: hash, size: UInt64(size),
                               chunked: true, uploaded: uploaded)
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
        let candidates = ns.unpushedNodes(limit: Self.maxBatchNodes)
        let inBatch = Set(candidates.map(\.ino))
        for node in candidates {
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
            let chunked = snapshot?.chunked ?? node.chunked
            nodeChanges.append(.node(node.sharedState(hash: hash, size: size, chunked: chunked)))
        }
        var entryChanges: [Change] = []
        var entries: [(EntryKey, UInt64)] = []
        // While a backlog lasts (a full batch of nodes), an entry that names a
        // new node outside this batch, by its `newChild` hint, waits without a
        // lookup: at a million pending entries the lookups were most of the
        // pusher's time. The last round of a backlog looks at every entry, so
        // an entry held back by a stale hint still goes then.
        let backlog = candidates.count >= Self.maxBatchNodes
        for (key, pending) in ns.pendingEntries {
            if backlog, pending.newChild != 0, !inBatch.contains(pending.newChild) { continue }
            let change = pending.change
            let childIno = ns.lookup(key.parent, key.name)
            // An entry naming a new node that waits for its content, or that is
            // not in this batch, waits with it; so does one in a new directory
            // not in this batch.
            // (Single fields, not whole nodes: this runs under the lock for every pending entry.)
            if let childIno, ns.version(of: childIno) == 0,
               waitingForContent.contains(childIno) || !inBatch.contains(childIno) { continue }
            let parentVersion = ns.version(of: key.parent)
            if key.parent != Namespace.rootIno, parentVersion == 0, !inBatch.contains(key.parent) { continue }
            entries.append((key, change))
            guard let parentVersion, let parentID = ns.id(of: key.parent) else { continue }
            let child = childIno.flatMap { ns.id(of: $0) }
            if ns.isUnlinked(key.parent) == true && child == nil && parentVersion == 0 { continue }
            entryChanges.append(.entry(parent: parentID, name: key.name, child: child))
        }
        return Batch(appliedSeq: ns.appliedSeq, changes: nodeChanges + entryChanges + deletions, nodes: nodes, entries: entries)
    }

    /// Record that `batch` is in the store as journal record `seq`.
    func settle(_ batch: Batch, seq: UInt64?, snapshots: [UInt64: ContentSnapshot]) throws {
        let dropped = replica.record { ns -> [UInt64] in
            if let seq { ns.setAppliedSeq(seq) }
            var dropped: [UInt64] = []
            for (ino, change) in batch.nodes {
                ns.update(ino, local: false) { n in
                    n.pushed = max(n.pushed, change)
                    if let seq { n.version = seq }
                    if let snapshot = snapshots[ino], snapshot.generation == n.contentGeneration {
                        n.hash = snapshot.hash
                        n.hashSize = snapshot.size
                        n.chunked = snapshot.chunked
                        n.author = device.name
                        n.pushedGeneration = snapshot.generation
                        n.verifiedHash = snapshot.hash
                    }
                    if n.unlinked {
                        // Content written here and deleted before it was pushed is no
                        // version the store has: if the node comes back (moved on
                        // another device: the move wins), it comes with the store's.
                        if n.hasUnpushedContent && n.hasContent { n.hash = nil; n.hashSize = 0 }
                        n.pushedGeneration = n.contentGeneration
                    }
                }
                if seq != nil { ns.nodeStored(ino) }
                if ns.dropIfUnreferenced(ino) { dropped.append(ino) }
            }
            for (key, change) in batch.entries { ns.entryPushed(key, change: change) }
            return dropped
        }
        for ino in dropped { replica.cache.retire(ino) }
        // The store has the change set: recording that is bookkeeping (may use the
        // space reserve). If it still fails, the record stays queued; after a
        // restart the same state is pushed again, which is harmless.
        try replica.persist(.mayUseReserve)
    }

}

/// What `ubiquityfs status` shows about sync.
public struct SyncStatus: Sendable, Codable {
    public var lastSync: Date?
    public var lastError: String?
    public var lastErrorDate: Date?
    public var storeReachable = true
    public var pushedChangeSets = 0
    public var recentErrors: [Failure] = []

    public init() {}

    public struct Failure: Sendable, Codable {
        public var date: Date
        public var message: String
    }
}

/// The engine is what the filesystem calls into (`SyncHooks`).
extension SyncEngine: SyncHooks {}
