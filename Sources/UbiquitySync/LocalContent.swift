import Foundation
import UbiquityReplica
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// What this device keeps: downloading, evicting, pinning, and the cache limit.
///
/// Eviction turns a downloaded file back into a placeholder. It is refused
/// for a file open for writing (`EBUSY`) or with changes not yet in the store
/// (`EAGAIN`). Under a cache limit, the least recently opened files that are
/// clean, closed and not pinned are evicted first. Pinned items (and
/// everything that arrives later in a pinned directory) are downloaded and
/// never evicted by the limit.
extension SyncEngine {
    /// Make file `ino` a placeholder again. Returns false if it already was one.
    /// The content is removed only once the index has recorded the eviction.
    @discardableResult
    public func evict(ino: UInt64) throws -> Bool {
        let evicted = try replica.transaction(.mayUseReserve, { ns -> Bool in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            guard node.kind == .file else { throw UbiquityError(EISDIR, "only files can be evicted") }
            guard node.hasContent else { return false }
            guard node.openWriters == 0 else { throw UbiquityError(EBUSY, "it is open for writing") }
            guard !node.hasUnpushedContent, node.hash != nil || node.hashSize == 0 else {
                throw UbiquityError(EAGAIN, "it has changes not yet pushed to the store")
            }
            ns.update(ino, local: false) { $0.hasContent = false; $0.contentEpoch &+= 1 }
            return true
        }, committed: { _, evicted in
            // Under the lock (one unlink), so no download or writer interleaves.
            if evicted { unlink(replica.cachePath(ino)) }
        })
        if evicted {
            var changes = ReplicaChanges()
            changes.nodes[ino] = true
            changes.count = 1
            observer.withLock { $0 }?.replicaChanged(changes)
        }
        return evicted
    }

    /// Pin or unpin `ino`; pinning downloads it (a directory: everything in it).
    public func setPinned(ino: UInt64, _ pinned: Bool) throws {
        try replica.transaction(.mayUseReserve) { ns in
            guard ns.node(ino) != nil else { throw UbiquityError(ENOENT) }
            ns.update(ino, local: false) { $0.pinned = pinned }
            if ns.node(ino)?.kind == .directory { ns.structureChanged() }   // everything below follows
        }
        if pinned {
            for file in replica.withNamespace({ ns in ns.files(under: ino).filter { ns.node($0)?.isPlaceholder == true } }) {
                startDownload(ino: file, background: true)
            }
        }
    }

    /// Bytes of content this device holds (local files' sizes).
    public func cacheUsage() -> UInt64 {
        replica.withNamespace { ns in
            ns.nodes.values.reduce(0) { $0 + ($1.kind == .file && $1.hasContent ? $1.size : 0) }
        }
    }

    /// Evict least recently used clean, closed, unpinned files until the
    /// content fits the cache limit (if one is set).
    public func enforceCacheLimit() {
        guard let limit = cacheLimit else { return }
        let (usage, candidates) = replica.withNamespace { ns -> (UInt64, [(UInt64, UInt64, UInt64)]) in
            var usage: UInt64 = 0
            var candidates: [(UInt64, UInt64, UInt64)] = []
            for node in ns.nodes.values where node.kind == .file && node.hasContent {
                usage += node.size
                if node.openCount == 0, !node.hasUnpushedContent, node.hash != nil, !ns.isPinned(node.ino) {
                    candidates.append((node.ino, node.lastAccess, node.size))
                }
            }
            return (usage, candidates)
        }
        guard usage > limit else { return }
        var excess = usage - limit
        for (ino, _, size) in candidates.sorted(by: { $0.1 < $1.1 }) where excess > 0 {
            if (try? evict(ino: ino)) == true {
                excess -= min(excess, size)
            }
        }
    }
}
