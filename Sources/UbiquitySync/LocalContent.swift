import Foundation
import UbiquityReplica
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// What this device keeps: downloading, evicting, pinning, and the cache limit.
///
/// Eviction turns a downloaded file back into a placeholder. It drops only
/// content the store is verified to hold: the local copy is known to be the
/// version the store has (`LocalNode.verifiedHash`; a copy never verified is
/// read and checked first), and the store holds every blob of it with the
/// right size (asked at the time of eviction). If the store lacks part of it,
/// eviction is refused (`EAGAIN`) and the device uploads what is missing from
/// its copy (see `StoreCopies.swift`). It is also refused for a file open for
/// writing (`EBUSY`) or with changes not yet in the store (`EAGAIN`). Under a
/// cache limit, the least recently opened files that are clean, closed and
/// not pinned are evicted first. Pinned items (and everything that arrives
/// later in a pinned directory) are downloaded and never evicted by the limit.
///
/// An eviction and an open never interleave badly: an open is counted as
/// under way (`LocalNode.opening`: eviction refuses with `EBUSY`) from
/// looking at the node until it counts its writer, which it does in the same
/// critical section that checks the content's epoch (see
/// `FileSystem.openLocal`); the eviction unlinks the cache file under the
/// namespace lock after checking those counts and that the content did not
/// change since the store was asked.
extension SyncEngine {
    /// Make file `ino` a placeholder again. Returns false if it already was
    /// one; its download then stops (`stopDownloads`) unless someone waits
    /// for the whole file, once no reader streams it.
    /// The content is removed only once the index has recorded the eviction.
    @discardableResult
    public func evict(ino: UInt64) throws -> Bool {
        let candidate = try replica.read { ns -> LocalNode? in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            guard node.kind == .file else { throw UbiquityError(EISDIR, "only files can be evicted") }
            guard node.hasContent else { return nil }
            try Self.checkEvictable(node)
            return node
        }
        guard let candidate else {
            stopDownloads(ino: ino)
            return false
        }
        // The last local copy goes only if the store holds this version (no lock held: store calls).
        if case .repaired(let problems) = try checkStoreCopy(of: candidate, verifyLocal: candidate.verifiedHash != candidate.hash) {
            throw UbiquityError(EAGAIN, "the store did not hold this version (\(problems.joined(separator: "; "))); "
                                + "it was uploaded again from this device's copy — evict again to drop the local copy")
        }
        let evicted = try replica.transaction(.mayUseReserve, { ns -> Bool in
            guard let node = ns.node(ino), node.hasContent else { return false }
            try Self.checkEvictable(node)
            guard node.contentGeneration == candidate.contentGeneration, node.contentEpoch == candidate.contentEpoch,
                  node.hash == candidate.hash else {
                throw UbiquityError(EAGAIN, "it changed while its copy in the store was checked")
            }
            ns.update(ino, local: false) { $0.hasContent = false; $0.contentEpoch &+= 1 }
            return true
        }, committed: { _, evicted in
            // Under the lock (one unlink), so no download or writer interleaves.
            if evicted { unlink(replica.cache.path(ino)) }
        })
        if evicted {
            var changes = ReplicaChanges()
            changes.nodes[ino] = true
            changes.count = 1
            observer.withLock { $0 }?.replicaChanged(changes)
        }
        return evicted
    }

    /// Refuse to evict a file being written or not yet pushed.
    static func checkEvictable(_ node: LocalNode) throws {
        guard node.openWriters == 0 else { throw UbiquityError(EBUSY, "it is open for writing") }
        guard node.opening == 0 else { throw UbiquityError(EBUSY, "it is being opened") }
        guard !node.hasUnpushedContent, !node.unacknowledgedWrites, node.hash != nil || node.hashSize == 0 else {
            throw UbiquityError(EAGAIN, "it has changes not yet pushed to the store")
        }
    }

    /// Pin or unpin `ino`; pinning downloads it (a directory: everything in it).
    public func setPinned(ino: UInt64, _ pinned: Bool) throws {
        try replica.transaction(.mayUseReserve) { ns in
            guard ns.node(ino) != nil else { throw UbiquityError(ENOENT) }
            ns.update(ino, local: false) { $0.pinned = pinned }
            if ns.node(ino)?.kind == .directory { ns.structureChanged() }   // everything below follows
        }
        if pinned {
            for file in replica.read({ ns in ns.files(under: ino).filter { ns.node($0)?.isPlaceholder == true } }) {
                startDownload(ino: file, background: true)
            }
        }
    }

    /// Bytes of content this device holds (local files' sizes).
    public func cacheUsage() -> UInt64 {
        replica.read { ns in ns.localContentBytes() }
    }

    /// Evict least recently used clean, closed, unpinned files until the
    /// content fits the cache limit (if one is set).
    public func enforceCacheLimit() {
        guard let limit = cacheLimit else { return }
        // One pass at a time (the pull thread and finished downloads both
        // ask): two passes over the same usage would each evict the excess.
        cacheLimitPass.withLock { _ in enforceCacheLimit(limit) }
    }

    func enforceCacheLimit(_ limit: UInt64) {
        let (usage, candidates) = replica.read { ns -> (UInt64, [(UInt64, UInt64, UInt64)]) in
            var usage: UInt64 = 0
            var candidates: [(UInt64, UInt64, UInt64)] = []
            for node in ns.nodes.values where node.kind == .file && node.hasContent {
                usage += node.size
                if node.openCount == 0, node.opening == 0, !node.hasUnpushedContent, node.hash != nil, !ns.isPinned(node.ino) {
                    candidates.append((node.ino, UInt64(node.lastAccess), node.size))
                }
            }
            return (usage, candidates)
        }
        guard usage > limit else { return }
        var excess = usage - limit
        let now = MonotonicClock.now()
        let waiting = limitRefusals.withLock { refusals in
            refusals = refusals.filter { $0.value > now }
            return Set(refusals.keys)
        }
        for (ino, _, size) in candidates.sorted(by: { $0.1 < $1.1 }) where excess > 0 && !waiting.contains(ino) {
            do {
                if try evict(ino: ino) { excess -= min(excess, size) }
            } catch {
                // (The store lacked it and got it back, the copy did not check out,
                // the store cannot be reached…): other files go first for a while.
                limitRefusals.withLock { $0[ino] = now + UInt64(Self.limitRetryDelay * 1e9) }
                logger.info("cache limit: not evicting inode \(ino) for now: \(UbiquityError.wrap(error))")
            }
        }
    }

    /// Seconds before the cache limit tries again a file it could not evict.
    static let limitRetryDelay = 60.0
}
