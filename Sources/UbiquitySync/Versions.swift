import Foundation
import UbiquityReplica
import UbiquityStore

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
        try replica.withNamespace { ns in
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
