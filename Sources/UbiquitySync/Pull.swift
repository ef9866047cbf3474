import Foundation
import UbiquityReplica
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Applying the store's journal to the replica, and fetching content.
extension SyncEngine {
    /// Apply every journal record after the replica's `appliedSeq`, then
    /// tell the observer (the kernel's caches) what changed.
    @discardableResult
    public func pull() throws -> ReplicaChanges {
        var all = ReplicaChanges()
        try pullLock.withLock { _ in
            while true {
                let after = replica.withNamespace { ns in ns.appliedSeq }
                let records = try store.journal(container: container, after: after, limit: 256)
                if records.isEmpty { break }
                for record in records {
                    let changed = replica.withNamespace { ns -> ReplicaChanges in
                        guard record.seq == ns.appliedSeq + 1 else { return ReplicaChanges() }
                        var changed = ReplicaChanges()
                        if record.changeSet.device != device.id {
                            changed = Self.apply(record.changeSet, seq: record.seq, to: &ns)
                        }
                        ns.setAppliedSeq(record.seq)
                        return changed
                    }
                    all.merge(changed)
                }
                try replica.persist()
            }
        }
        status.withLock { s in s.lastSync = Date(); s.storeReachable = true }
        if !all.isEmpty, let observer = observer.withLock({ $0 }) { observer.replicaChanged(all) }
        for ino in all.refresh { startDownload(ino: ino, background: true) }
        return all
    }

    /// Apply one foreign change set: nodes, then entries, then deletions.
    static func apply(_ changeSet: ChangeSet, seq: UInt64, to ns: inout Namespace) -> ReplicaChanges {
        var touched = ReplicaChanges()
        for change in changeSet.changes {
            guard case .node(let state) = change else { continue }
            if let ino = ns.inoByID[state.id] {
                var contentChanged = false
                var refresh = false
                ns.update(ino, local: false) { n in
                    contentChanged = n.kind == .file && (state.hash != n.hash || state.size != n.hashSize)
                        && !n.hasUnpushedContent
                    n.mode = state.mode; n.uid = state.uid; n.gid = state.gid
                    n.mtime = state.mtime; n.ctime = state.ctime; n.btime = state.btime
                    n.target = state.target; n.rdev = state.rdev; n.xattrs = state.xattrs
                    n.version = seq
                    if contentChanged {
                        if n.hasContent { refresh = true }
                        n.hash = state.hash
                        n.hashSize = state.size
                        n.chunked = state.chunked ?? false
                        n.size = state.size
                        n.hasContent = false   // fetched (or created empty) on open
                        n.pushedGeneration = n.contentGeneration
                    }
                }
                touched.node(ino, contentChanged: contentChanged, in: ns)
                // Content this device had stays downloaded: fetch the new version in the background.
                if refresh { touched.refresh.append(ino) }
            } else {
                let ino = ns.createNode(id: state.id, kind: state.kind, mode: state.mode, uid: state.uid, gid: state.gid,
                                        rdev: state.rdev, target: state.target, time: state.mtime, local: false)
                ns.update(ino, local: false) { n in
                    n.ctime = state.ctime; n.btime = state.btime; n.atime = state.mtime
                    n.xattrs = state.xattrs
                    n.hash = state.hash
                    n.hashSize = state.size
                    n.chunked = state.chunked ?? false
                    n.size = state.kind == .symlink ? UInt64(state.target?.utf8.count ?? 0) : state.size
                    n.hasContent = state.kind != .file
                    n.version = seq
                    n.unlinked = true   // until an entry names it
                }
            }
        }
        for change in changeSet.changes {
            guard case .entry(let parentID, let name, let childID) = change,
                  let parent = ns.inoByID[parentID], ns.node(parent)?.kind == .directory else { continue }
            let existing = ns.lookup(parent, name)
            let child = childID.flatMap { ns.inoByID[$0] }
            if existing == child { continue }
            touched.entry(parent, name, in: ns)
            if existing != nil { ns.unlinkEntry(parent, name, local: false) }
            if let child, let node = ns.node(child) {
                // A directory has one entry: a move elsewhere removes the old one.
                if node.kind == .directory, let oldParent = ns.directoryParent[child],
                   let oldName = ns.entries(of: oldParent).first(where: { $0.value.ino == child })?.key {
                    touched.entry(oldParent, oldName, in: ns)
                    ns.unlinkEntry(oldParent, oldName, local: false)
                }
                ns.linkEntry(parent, name, child, local: false)
                touched.node(child, contentChanged: false, in: ns)
            }
            touched.node(parent, contentChanged: false, in: ns)
        }
        for change in changeSet.changes {
            guard case .deleteNode(let id, _) = change, let ino = ns.inoByID[id] else { continue }
            ns.update(ino, local: false) { $0.unlinked = true }
            touched.node(ino, contentChanged: true, in: ns)
            ns.dropIfUnreferenced(ino)
        }
        return touched
    }

}

/// What a pull changed, limited to what the kernel may have cached (nodes
/// and directories it holds references to): the entries to invalidate and
/// the inodes whose attributes (and, if their content changed, pages) to drop.
public struct ReplicaChanges: Sendable {
    public var entries: [(parent: UInt64, name: FileName)] = []
    public var nodes: [UInt64: Bool] = [:]   // ino → content changed
    /// Files whose local content was replaced by a newer remote version.
    public var refresh: [UInt64] = []
    public var count = 0                      // every change applied, cached or not

    public var isEmpty: Bool { count == 0 }

    mutating func entry(_ parent: UInt64, _ name: FileName, in ns: Namespace) {
        count += 1
        if parent == Namespace.rootIno || (ns.node(parent)?.lookups ?? 0) > 0 { entries.append((parent, name)) }
    }

    mutating func node(_ ino: UInt64, contentChanged: Bool, in ns: Namespace) {
        count += 1
        if ino == Namespace.rootIno || (ns.node(ino)?.lookups ?? 0) > 0 {
            nodes[ino] = (nodes[ino] ?? false) || contentChanged
        }
    }

    mutating func merge(_ other: ReplicaChanges) {
        entries += other.entries
        nodes.merge(other.nodes) { $0 || $1 }
        refresh += other.refresh
        count += other.count
    }
}

/// Told after a pull changed the replica (the FUSE session invalidates the
/// kernel's caches).
public protocol ReplicaObserver: Sendable {
    func replicaChanged(_ changes: ReplicaChanges)
}
