import UbiquityLocks
import UbiquityReplica

/// The references one kernel holds on a container's nodes through one view
/// (a mount of the container, or its folder in a drive): what that kernel
/// looked up and has not forgotten. A node's `lookups` in the replica is
/// the sum over every kernel viewing the container (what keeps an unlinked
/// node and its local copy); this table is one kernel's share, so that
///
/// - a session that ends gives back exactly what its kernel still held
///   (a kernel detached lazily, or whose daemon stopped serving it, never
///   sends those forgets), and an unlinked node the others do not hold is
///   dropped then, with its local copy;
/// - a kernel forgetting more than it was given is caught (counted, and
///   logged by the mount at its end) instead of taking another kernel's
///   references.
///
/// It also remembers which content each file's pages in that kernel were
/// filled from (`CachedContent`: the node's content epoch and generation),
/// so an open keeps the kernel's page cache only if nothing changed the
/// content since, except through this same kernel (its writes went through
/// its cache). A change through another view, or from another device,
/// makes this kernel drop its pages at its next open; several mounts of one
/// container each keep their own cache.
///
/// Folder listings the same way: the stamp of each folder's entries
/// (`Namespace.listingStamp`) when this kernel last opened it. An open keeps
/// the kernel's cached listing only if the stamp has not moved since; the
/// kernel drops its own listing when it changes the folder itself.
///
/// Lock order: taken inside the namespace lock (each change of a count and
/// of the node's sum is one step under it); a leaf.
final class KernelReferences: Sendable {
    /// What a file's pages in this kernel were filled from.
    struct CachedContent: Equatable {
        var epoch: UInt32
        var generation: UInt64
        init(_ node: LocalNode) {
            epoch = node.contentEpoch
            generation = node.contentGeneration
        }
    }

    struct State {
        var counts: [UInt64: UInt64] = [:]
        var cached: [UInt64: CachedContent] = [:]
        /// Folders: the listing stamp at this kernel's last open.
        var listings: [UInt64: UInt64] = [:]
        /// Forgets beyond what this kernel held (a kernel or adapter bug).
        var excessForgets = 0
        var released = false
    }
    let state = Lock(State())

    /// The kernel got a reference to `ino` (a lookup, create, mkdir…).
    func hold(_ ino: UInt64, in ns: inout Namespace) {
        let counted = state.withLock { s -> Bool in
            guard !s.released else { return false }
            s.counts[ino, default: 0] += 1
            return true
        }
        if counted { ns.addLookups(ino, 1) }
    }

    /// The kernel forgot `count` references to `ino`; true if the node was
    /// dropped (unlinked, and nothing holds it any more).
    func forget(_ ino: UInt64, count: UInt64, in ns: inout Namespace) -> Bool {
        let given = state.withLock { s -> UInt64 in
            let held = s.counts[ino] ?? 0
            let given = min(held, count)
            if count > held { s.excessForgets += 1 }
            if held - given == 0 {
                // The kernel forgot the inode, and its pages with it.
                s.counts[ino] = nil
                s.cached[ino] = nil
                s.listings[ino] = nil
            } else {
                s.counts[ino] = held - given
            }
            return given
        }
        guard given > 0 else { return false }
        ns.addLookups(ino, -Int(given))
        return ns.dropIfUnreferenced(ino)
    }

    /// The session ended: give back everything still held. Returns the nodes
    /// dropped (their local copies to remove), how many nodes were still
    /// held, and the excess forgets seen.
    func releaseAll(in ns: inout Namespace) -> (dropped: [UInt64], held: Int, excessForgets: Int) {
        let (counts, excess) = state.withLock { s -> ([UInt64: UInt64], Int) in
            defer { s.counts = [:]; s.cached = [:]; s.listings = [:]; s.released = true }
            return (s.counts, s.excessForgets)
        }
        var dropped: [UInt64] = []
        for (ino, count) in counts {
            ns.updateRuntime(ino) { $0.lookups = $0.lookups >= count ? $0.lookups - count : 0 }
            if ns.dropIfUnreferenced(ino) { dropped.append(ino) }
        }
        return (dropped, counts.count, excess)
    }

    // MARK: The kernel's page cache

    /// An open of `node` (under the namespace lock): whether this kernel's
    /// pages of it may be kept, because they were filled from this very
    /// content. They are from now on.
    func opened(_ node: LocalNode) -> Bool {
        let now = CachedContent(node)
        return state.withLock { s in
            defer { s.cached[node.ino] = now }
            return s.cached[node.ino] == now
        }
    }

    /// The content of `ino` changed through this kernel, from `before` to
    /// `node`: pages that were current still are (the change went through them).
    func changedHere(_ ino: UInt64, from before: CachedContent, to node: LocalNode) {
        state.withLock { s in
            if s.cached[ino] == before { s.cached[ino] = CachedContent(node) }
        }
    }

    /// This kernel's pages of `ino` may hold other content (read through
    /// an older handle, or bypassed by passthrough writes): its next open drops them.
    func pagesStale(_ ino: UInt64) {
        state.withLock { _ = $0.cached.removeValue(forKey: ino) }
    }

    // MARK: The kernel's folder listings

    /// An open of folder `dir`, whose entries now have listing stamp `stamp`:
    /// whether this kernel's cached listing of it may be kept, because no
    /// change reached the folder since its last open. It may from now on.
    func openedFolder(_ dir: UInt64, stamp: UInt64) -> Bool {
        state.withLock { s in
            defer { s.listings[dir] = stamp }
            return s.listings[dir] == stamp
        }
    }
}
