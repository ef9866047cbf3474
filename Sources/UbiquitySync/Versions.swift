import Foundation
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityLinux

/// Conflict versions of an item (`NSFileVersion`'s unresolved conflict
/// versions) and resolving them. The versions of an item are its current
/// version and the conflicted copies recorded in its `conflicts`.
public struct VersionInfo: Sendable {
    /// "current", or 1, 2, … for the conflict versions.
    public var label: String
    public var path: String
    public var device: String
    public var modified: Timespec
    public var size: UInt64
}

public enum ConflictChoice: Sendable {
    /// Keep the current version; delete the conflicted copies.
    case current
    /// Keep conflict version N (1-based): it takes the item's name; the current
    /// version and the other copies are deleted.
    case version(Int)
    /// Keep every version as its own file; only the conflict record is cleared.
    case both
}

extension SyncEngine {
    public func versions(ino: UInt64) throws -> [VersionInfo] {
        try replica.read { ns in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            var out = [VersionInfo(label: "current", path: ns.path(of: ino) ?? "?", device: node.author,
                                   modified: node.mtime, size: node.size)]
            for (index, id) in node.conflicts.enumerated() {
                guard let copy = ns.inoByID[id], let copyNode = ns.node(copy) else { continue }
                out.append(VersionInfo(label: String(index + 1), path: ns.path(of: copy) ?? "(removed)",
                                       device: copyNode.author, modified: copyNode.mtime, size: copyNode.size))
            }
            return out
        }
    }

    public func resolve(ino: UInt64, keep choice: ConflictChoice) throws {
        let changes = try replica.transaction(.mayUseReserve) { ns -> ReplicaChanges in
            guard let node = ns.node(ino) else { throw UbiquityError(ENOENT) }
            guard !node.conflicts.isEmpty else { throw UbiquityError(EINVAL, "it has no unresolved conflicts") }
            let copies = node.conflicts.compactMap { ns.inoByID[$0] }
            var changes = ReplicaChanges()
            func remove(_ victim: UInt64) {
                for place in ns.entriesNaming(victim) {
                    ns.unlinkEntry(place.parent, place.name)
                    changes.entry(place.parent, place.name, in: ns)
                }
                changes.node(victim, contentChanged: false, in: ns)
            }
            switch choice {
            case .current:
                copies.forEach(remove)
                ns.update(ino) { $0.conflicts = [] }
            case .version(let number):
                guard number >= 1, number <= node.conflicts.count, let chosen = ns.inoByID[node.conflicts[number - 1]] else {
                    throw UbiquityError(EINVAL, "no conflict version \(number) (see `ubiquityfs versions`)")
                }
                let places = ns.entriesNaming(ino)
                for copy in copies where copy != chosen { remove(copy) }
                remove(chosen)
                for place in places {
                    ns.unlinkEntry(place.parent, place.name)
                    ns.linkEntry(place.parent, place.name, chosen)
                    changes.entry(place.parent, place.name, in: ns)
                }
                ns.update(chosen) { $0.conflicts = [] }
                changes.node(ino, contentChanged: true, in: ns)
            case .both:
                ns.update(ino) { $0.conflicts = [] }
            }
            changes.node(ino, contentChanged: false, in: ns)
            return changes
        }
        observer.withLock { $0 }?.replicaChanged(changes)
        wake.signal()
    }

    /// Record file `copy` as an unresolved conflict version of file `ino`
    /// (an app saved its edit beside a version another device made meanwhile:
    /// `UIDocument`); pushed like any change, so every device lists it.
    public func recordConflict(ino: UInt64, copy: UInt64) throws {
        let changes = try replica.transaction(.mayUseReserve) { ns -> ReplicaChanges in
            guard let node = ns.node(ino), let copied = ns.node(copy), !node.unlinked, !copied.unlinked else { throw UbiquityError(ENOENT) }
            guard node.kind == .file, copied.kind == .file, ino != copy else {
                throw UbiquityError(EINVAL, "a conflict version is a file beside another file")
            }
            ns.update(ino) { if !$0.conflicts.contains(copied.id) { $0.conflicts.append(copied.id) } }
            var changes = ReplicaChanges()
            changes.node(ino, contentChanged: false, in: ns)
            return changes
        }
        observer.withLock { $0 }?.replicaChanged(changes)
        wake.signal()
    }
}

/// A version of a file from its history (`ubiquityfs versions --all`):
/// a content it was committed with, identified by the journal record.
public struct HistoryVersion: Sendable {
    /// The journal record that committed this content (what `restore --version` takes).
    public var id: UInt64
    /// When it was committed, and by which device.
    public var committed: Timespec
    public var device: String
    public var modified: Timespec
    public var size: UInt64
    /// The version the file has now.
    public var isCurrent: Bool
}

extension SyncEngine {
    /// Every content file `ino` was committed with that the retention
    /// period keeps (each one that was current at some moment within it),
    /// oldest first. A version survives renames: it belongs to the item.
    public func history(ino: UInt64) throws -> [HistoryVersion] {
        history.settled()
        let node = try replica.read { ns -> LocalNode in
            guard let node = ns.node(ino), !node.unlinked else { throw UbiquityError(ENOENT) }
            guard node.kind == .file else { throw UbiquityError(EISDIR, "only files have versions") }
            return node
        }
        var versions: [(version: HistoryVersion, hash: String?)] = []
        for row in history.states(of: node.id, lineage: true) where row.state.kind == .file {
            if let last = versions.last, last.hash == row.state.hash, last.version.size == row.state.size { continue }
            versions.append((HistoryVersion(id: row.seq, committed: row.date, device: row.deviceName, modified: row.state.mtime,
                                            size: row.state.size, isCurrent: false), row.state.hash))
        }
        let cutoff = Timespec(nanoseconds: clock().nanoseconds - Int64(retention() * 1e9))
        var kept: [HistoryVersion] = []
        for (index, entry) in versions.enumerated() {
            let replaced = index + 1 < versions.count ? versions[index + 1].version.committed : nil
            guard replaced.map({ $0 >= cutoff }) ?? true else { continue }
            var version = entry.version
            version.isCurrent = index == versions.count - 1 && entry.hash == node.hash && !node.hasUnpushedContent
            kept.append(version)
        }
        return kept
    }

    /// Restore version `id` of file `ino` (from `history(ino:)`): as the
    /// file's current content — a change like an edit, pushed to every
    /// device, the replaced version staying in the history — or, with
    /// `destination`, as a new file there. Nothing is downloaded: the file
    /// names the version's content, which the store holds, and is fetched
    /// when opened. Returns the restored file's inode.
    @discardableResult
    public func restoreVersion(ino: UInt64, id: UInt64, to destination: (parent: UInt64, name: FileName)? = nil) throws -> UInt64 {
        history.settled()
        let nodeID = try replica.read { ns -> NodeID in
            guard let node = ns.node(ino), !node.unlinked else { throw UbiquityError(ENOENT) }
            guard node.kind == .file else { throw UbiquityError(EISDIR, "only files have versions") }
            return node.id
        }
        guard let row = history.states(of: nodeID, lineage: true).last(where: { $0.seq == id && $0.state.kind == .file }) else {
            throw UbiquityError(ENOENT, "it has no version \(id) (see `ubiquityfs versions --all`)")
        }
        try requireInStore(row.state, what: "version \(id)")
        let now = clock()
        let (restored, changes) = try replica.transaction(.mayUseReserve) { ns -> (UInt64, ReplicaChanges) in
            var changes = ReplicaChanges()
            let target: UInt64
            if let destination {
                guard ns.node(destination.parent)?.kind == .directory, ns.node(destination.parent)?.unlinked == false else {
                    throw UbiquityError(ENOENT, "the folder to restore into does not exist")
                }
                guard ns.lookup(destination.parent, destination.name) == nil else {
                    throw UbiquityError(EEXIST, "\(destination.name) exists: restore to a free name")
                }
                let state = row.state
                target = ns.createNode(kind: .file, mode: state.mode, uid: state.uid, gid: state.gid, time: now)
                ns.update(target) { n in n.xattrs = state.xattrs }
                ns.linkEntry(destination.parent, destination.name, target)
                changes.entry(destination.parent, destination.name, in: ns)
            } else {
                guard let node = ns.node(ino), !node.unlinked else { throw UbiquityError(ENOENT) }
                guard node.openWriters == 0 else { throw UbiquityError(EBUSY, "it is open for writing") }
                guard !node.hasUnpushedContent else {
                    throw UbiquityError(EAGAIN, "it has changes not yet pushed (they would be lost): wait, or restore with --to")
                }
                target = ino
            }
            ns.update(target) { n in
                ChangeApplier.takeContent(row.state, into: &n)
                n.mtime = now
                n.ctime = now
                n.author = device.name
            }
            changes.node(target, contentChanged: true, in: ns)
            changes.edited[target] = true
            return (target, changes)
        }
        observer.withLock { $0 }?.replicaChanged(changes)
        if replica.read({ $0.isPinned(restored) }) { startDownload(ino: restored, background: true) }
        wake.signal()
        return restored
    }

    /// Write the content of version `id` of file `ino` (from
    /// `history(ino:)`) into a new file at `path`, outside any mount
    /// (`NSFileVersion.url` of an earlier version): every byte verified
    /// against its hash, written to `path.part` and renamed into place.
    public func writeVersion(ino: UInt64, id: UInt64, to path: String) throws {
        history.settled()
        let nodeID = try replica.read { ns -> NodeID in
            guard let node = ns.node(ino), !node.unlinked, node.kind == .file else { throw UbiquityError(ENOENT) }
            return node.id
        }
        guard let state = history.states(of: nodeID, lineage: true).last(where: { $0.seq == id && $0.state.kind == .file })?.state else {
            throw UbiquityError(ENOENT, "it has no version \(id)")
        }
        let partial = path + ".part"
        let fd = try syscallRetrying("create \(partial)") { open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600) }
        var done = false
        defer {
            close(fd)
            if !done { unlink(partial) }
        }
        if let hash = state.hash, state.size > 0 {
            if state.chunked == true {
                let manifest = try ChunkManifest.decode(try store.fetchBlob(hash))
                for (index, chunk) in manifest.chunks.enumerated() {
                    let offset = UInt64(index) * manifest.chunkSize
                    try store.copyBlob(chunk, size: Int(min(manifest.chunkSize, manifest.size - offset)), into: fd, at: offset)
                }
            } else {
                try ContentCopy.write(try fetchContent(hash, size: state.size), to: fd, at: 0)
            }
        }
        try syscallRetrying("rename \(partial)") { rename(partial, path) }
        done = true
    }

    /// Throw unless the store holds content `state` names (its blob, its
    /// pack, or its manifest and every chunk, with the right sizes).
    func requireInStore(_ state: NodeState, what: String) throws {
        guard let hash = state.hash, state.size > 0 else { return }
        func missing(_ blob: String) -> UbiquityError {
            UbiquityError(EIO, "the store no longer holds the content of \(what) (blob \(blob.prefix(12))… is missing)")
        }
        if state.chunked == true {
            let manifest: ChunkManifest
            do {
                manifest = try ChunkManifest.decode(try store.fetchBlob(hash))
            } catch let error as UbiquityError where error.errno == EHOSTDOWN {
                throw error
            } catch {
                throw missing(hash)
            }
            for (index, chunk) in manifest.chunks.enumerated() {
                let expected = min(manifest.chunkSize, manifest.size - UInt64(index) * manifest.chunkSize)
                guard try store.blobSize(chunk) == expected else { throw missing(chunk) }
            }
            return
        }
        if try store.blobSize(hash) == state.size { return }
        let packed = ([state.pack].compactMap { $0 } + packs.allLocations(of: hash))
        for location in packed where try (store.blobSize(location.hash) ?? 0) >= location.offset + state.size { return }
        throw missing(hash)
    }
}
