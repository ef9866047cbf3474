import Foundation
import UbiquityReplica
import UbiquityModel

/// Recently Deleted: what was deleted on any device within the retention
/// period, read from the history (`History.swift`), and bringing it back.
///
/// A deleted item is a node the journal deleted that no device brought
/// back since, and that no other file replaced at its name (a save by
/// rename: its content is among that file's versions). Its last state and the place it had come from the history;
/// the store still holds its content (the collector keeps what the
/// retention period covers). Items deleted *with* a folder — by the same
/// device, at most `togetherWindow` before the folder itself, as `rm -r`
/// does one by one — are listed inside it and come back with it.
///
/// A restored item keeps its node ID (so its versions stay its own) and is
/// committed as made again: every device gets it back, under its old name,
/// or `NAME (restored N)` when something took the name meanwhile. A file
/// comes back as a placeholder of its last version, downloaded when opened.
/// `trash --empty` records in the container's configuration
/// (`trashEmptiedThrough`) that deletions up to the newest record are gone
/// for good, for every device.
public struct TrashItem: Sendable {
    public var id: NodeID
    /// Where it was in the container when it was deleted (`/`-separated).
    public var path: String
    public var kind: NodeKind
    /// A file's size; a folder's files' sizes added up.
    public var size: UInt64
    /// Items deleted with a folder (0 for a file).
    public var items: Int
    public var deleted: Timespec
    public var device: String
}

extension SyncEngine {
    /// How long before a folder's deletion its items' deletions by the same
    /// device count as made with it.
    static let togetherWindow: Int64 = 600 * 1_000_000_000

    /// A deleted node as the history has it.
    struct Deleted {
        var row: HistoryIndex.DeletionRow
        var state: NodeState
        var parent: NodeID
        var name: FileName
    }

    /// The container's configuration, or the defaults if the store does not answer.
    public func containerConfigOrDefault() -> ContainerConfig {
        ((try? store.containerConfig(container)) ?? nil) ?? ContainerConfig(id: container, displayName: container)
    }

    /// Every node deleted within the retention period that is still gone,
    /// by ID (its latest deletion).
    func deletedNodes(_ config: ContainerConfig, settled: Bool = true) -> [NodeID: Deleted] {
        if settled { history.settled() }
        let cutoff = Timespec(nanoseconds: clock().nanoseconds - Int64(config.retention * 1e9))
        let emptied = config.trashEmptiedThrough ?? 0
        var out: [NodeID: Deleted] = [:]
        let rows = history.deletions(since: cutoff).filter { $0.seq > emptied }
        let alive = replica.read { ns in
            Set(rows.map(\.node).filter { id in ns.inoByID[id].flatMap { ns.node($0) }.map { !$0.unlinked } ?? false })
        }
        for row in rows where out[row.node] == nil && !alive.contains(row.node) && !history.wasSucceeded(row.node) {
            guard let state = history.state(of: row.node, before: row.seq)?.state,
                  let place = history.place(of: row.node, before: row.seq) else { continue }
            out[row.node] = Deleted(row: row, state: state, parent: place.parent, name: place.name)
        }
        return out
    }

    /// Whether `item` was deleted with folder `folder` (see the type).
    static func deletedTogether(_ item: Deleted, with folder: Deleted) -> Bool {
        folder.state.kind == .directory && item.row.deviceName == folder.row.deviceName && item.row.seq <= folder.row.seq
            && folder.row.date.nanoseconds - item.row.date.nanoseconds <= togetherWindow
    }

    /// The path `id` had before record `seq`, through the history (the
    /// current path for a folder the history does not name).
    func pathBefore(_ id: NodeID, seq: UInt64, depth: Int = 0) -> String {
        if id == .root || depth > 4096 { return "" }
        guard let place = history.place(of: id, before: seq) else {
            return replica.read { ns in ns.inoByID[id].flatMap { ns.path(of: $0) } } ?? "?"
        }
        let parent = pathBefore(place.parent, seq: seq, depth: depth + 1)
        return parent.isEmpty ? place.name.description : parent + "/" + place.name.description
    }

    /// Recently Deleted: the items deleted within the retention period and
    /// not brought back, newest first; what was deleted with a folder is
    /// counted in it, not listed. `config`: the container's configuration
    /// as the caller knows it (nil: read from the store). `settled`: wait
    /// for the records handed to the history to be indexed (not on a FUSE
    /// worker: a large push may be indexing).
    public func trash(config: ContainerConfig? = nil, settled: Bool = true) -> [TrashItem] {
        let deleted = deletedNodes(config ?? containerConfigOrDefault(), settled: settled)
        var inside: [NodeID: [NodeID]] = [:]
        var top: [Deleted] = []
        for item in deleted.values {
            if let folder = deleted[item.parent], Self.deletedTogether(item, with: folder) {
                inside[item.parent, default: []].append(item.state.id)
            } else {
                top.append(item)
            }
        }
        func totals(_ id: NodeID) -> (items: Int, size: UInt64) {
            var items = 0, size: UInt64 = 0
            for child in inside[id] ?? [] {
                let sub = totals(child)
                items += 1 + sub.items
                size += (deleted[child]?.state.kind == .file ? deleted[child]!.state.size : 0) + sub.size
            }
            return (items, size)
        }
        return top.sorted { $0.row.seq > $1.row.seq }.map { item in
            let sub = totals(item.state.id)
            let parentPath = pathBefore(item.parent, seq: item.row.seq)
            return TrashItem(id: item.state.id, path: parentPath.isEmpty ? item.name.description : parentPath + "/" + item.name.description,
                             kind: item.state.kind, size: item.state.kind == .file ? item.state.size : sub.size,
                             items: sub.items, deleted: item.row.date, device: item.row.deviceName)
        }
    }

    /// Bring back deleted item `which` (a node ID, or the path `trash`
    /// lists), with everything deleted with it, at its old place (its
    /// folders brought back too if they were deleted), on every device.
    /// Returns the path it has now.
    @discardableResult
    public func restoreDeleted(_ which: String) throws -> String {
        let deleted = deletedNodes(containerConfigOrDefault())
        let wanted = which.split(separator: "/").joined(separator: "/")
        let target = deleted[which] ?? deleted.values
            .filter { pathBefore($0.state.id, seq: $0.row.seq) == wanted }
            .max { $0.row.seq < $1.row.seq }
        guard let target else {
            throw UbiquityError(ENOENT, "\(which) is not in Recently Deleted (see `ubiquityfs trash`)")
        }
        // Everything deleted with it, folders before what they held.
        var plan: [Deleted] = []
        func add(_ item: Deleted) {
            plan.append(item)
            for child in deleted.values where child.parent == item.state.id && Self.deletedTogether(child, with: item) {
                add(child)
            }
        }
        add(target)
        let missing = plan.filter { $0.state.kind == .file }
        for item in missing { try requireInStore(item.state, what: pathBefore(item.state.id, seq: item.row.seq)) }

        let (path, changes) = try replica.transaction(.mayUseReserve) { ns -> (String, ReplicaChanges) in
            var changes = ReplicaChanges()
            var revived: [NodeID: UInt64] = [:]
            /// The folder `id` now: alive, brought back with this item, or
            /// brought back alone (deleted before it, not with it).
            func folder(_ id: NodeID, depth: Int) throws -> UInt64 {
                if let ino = revived[id] { return ino }
                if let ino = ns.inoByID[id], let node = ns.node(ino), !node.unlinked, node.kind == .directory { return ino }
                guard depth < 4096, let gone = deleted[id], gone.state.kind == .directory else {
                    throw UbiquityError(ENOENT, "the folder it was in is gone for good")
                }
                return try revive(gone, depth: depth + 1)
            }
            func revive(_ item: Deleted, depth: Int) throws -> UInt64 {
                let parent = try folder(item.parent, depth: depth)
                let state = item.state
                let ino: UInt64
                if let existing = ns.inoByID[state.id], let node = ns.node(existing), node.kind == state.kind {
                    ino = existing
                } else {
                    ino = ns.createNode(id: state.id, kind: state.kind, mode: state.mode, uid: state.uid, gid: state.gid,
                                        rdev: state.rdev, target: state.target, time: state.mtime)
                }
                ns.update(ino) { n in
                    n.mode = state.mode; n.uid = state.uid; n.gid = state.gid
                    n.mtime = state.mtime; n.ctime = clock(); n.btime = state.btime
                    n.xattrs = state.xattrs; n.target = state.target
                    n.version = 0   // made again, for the store
                    n.conflicts = []
                    if state.kind == .file {
                        ChangeApplier.takeContent(state, into: &n)
                    } else {
                        n.hasContent = true
                    }
                }
                var name = item.name
                var counter = 1
                while ns.lookup(parent, name) != nil {
                    name = ChangeApplier.restoredName(item.name, counter)
                    counter += 1
                }
                ns.linkEntry(parent, name, ino)
                changes.entry(parent, name, in: ns)
                changes.node(ino, contentChanged: true, in: ns)
                revived[state.id] = ino
                return ino
            }
            for item in plan where revived[item.state.id] == nil { _ = try revive(item, depth: 0) }
            let restored = revived[target.state.id].flatMap { ns.path(of: $0) }.map { String($0.drop { $0 == "/" }) } ?? wanted
            return (restored, changes)
        }
        observer.withLock { $0 }?.replicaChanged(changes)
        wake.signal()
        return path
    }

    /// Remove everything in Recently Deleted for good, on every device
    /// (the collector may then remove its content from the store).
    public func emptyTrash() throws {
        guard var config = try store.containerConfig(container) else {
            throw UbiquityError(ENOENT, "container \(container) has no configuration in the store")
        }
        let through = replica.read { $0.appliedSeq }
        config.trashEmptiedThrough = max(config.trashEmptiedThrough ?? 0, through)
        try store.updateContainer(config)
    }
}

extension ChangeApplier {
    /// `NAME (restored).EXT`, then `NAME (restored 2).EXT`, …
    static func restoredName(_ name: FileName, _ counter: Int) -> FileName {
        let text = name.description
        let dot = text.lastIndex(of: ".").flatMap { $0 == text.startIndex ? nil : $0 }
        let stem = dot.map { String(text[..<$0]) } ?? text
        let ext = dot.map { String(text[$0...]) } ?? ""
        return FileName("\(stem) (restored\(counter == 1 ? "" : " \(counter)"))\(ext)")
    }
}
