import UbiquityReplica
import UbiquityModel
#if canImport(Glibc)
import Glibc
#endif

/// Turns what a pull changed into the operations a local program would
/// have made to get there — the *script* a mount's `KernelEventReplay`
/// performs through the mount so that its kernel raises inotify and
/// fanotify events (docs/DESIGN.md, "Events for remote changes").
///
/// Input: for every entry the pull touched, what it named before
/// (`ReplicaChanges.history`) and what it names now (the namespace), and
/// the nodes whose state changed (`ReplicaChanges.edited`). Only entries in
/// folders this kernel holds count (a folder it does not hold cannot be
/// watched), plus the other end of a move into or out of one.
///
/// The script walks a *virtual* tree from the before state to the after
/// state, one step at a time, each step a single system call's worth:
/// removals (deepest first) of what leaves without a replacement; then each
/// entry's new node is put in place — moved from where it was (`rename`,
/// replacing a leaving file as `mv` does), or created (a new file replacing
/// another is created under a temporary name and renamed over it, as an
/// editor's atomic save does); then content changes (`modify`) and
/// metadata changes (`attrib`). Each step carries the path of its folder
/// in the virtual tree at that moment, and what the kernel holds at the
/// names it changes afterwards (the replay answers the kernel's lookups
/// from that, not from the after state).
///
/// Two devices' views of one move agree: a node is known by its inode
/// number, so a rename is a rename however many names changed around it.
/// Cycles (two names swapped) go through a temporary name.
public struct KernelEventScript: Sendable {
    /// What the kernel is shown at each name the script changes, before it.
    public var initial: [KernelKey: Holding] = [:]
    public var steps: [ReplayStep] = []
    public var isEmpty: Bool { steps.isEmpty }

    public init(initial: [KernelKey: Holding] = [:], steps: [ReplayStep] = []) {
        self.initial = initial
        self.steps = steps
    }

    /// The script for `changes`, as the mount showing `view` sees them.
    /// Called under the namespace lock, right after the pull.
    public static func build(_ changes: ReplicaChanges, in ns: Namespace, view: KernelView) -> KernelEventScript {
        guard !changes.history.isEmpty || !changes.edited.isEmpty else { return KernelEventScript() }
        var builder = Builder(ns: ns, view: view)
        builder.run(changes)
        return KernelEventScript(initial: builder.initial, steps: builder.steps)
    }
}

extension KernelEventScript {
    /// A drive's container folders appearing, disappearing or renamed (each
    /// folder: its name at the drive's root and its kernel inode number).
    public static func driveFolders(before: [FileName: UInt64], after: [FileName: UInt64]) -> KernelEventScript {
        var script = KernelEventScript()
        let mode = UInt32(S_IFDIR) | 0o755
        func key(_ name: FileName) -> KernelKey { KernelKey(parent: 1, name: name) }
        func place(_ name: FileName) -> KernelPlace { KernelPlace(folder: [], key: key(name)) }
        let renamedFrom = Dictionary(before.compactMap { name, ino in after[name] == nil ? (ino, name) : nil },
                                     uniquingKeysWith: { a, _ in a })
        for name in Set(before.keys).union(after.keys) {
            script.initial[key(name)] = before[name].map { .node(ino: $0, mode: mode) } ?? .absent
        }
        var moved = Set<FileName>()
        for (name, ino) in after.sorted(by: { $0.key < $1.key }) where before[name] != ino {
            if let old = renamedFrom[ino] {
                moved.insert(old)
                script.steps.append(ReplayStep(action: .rename(from: place(old), to: place(name)),
                                               updates: [(key(old), .absent), (key(name), .node(ino: ino, mode: mode))]))
            } else {
                script.steps.append(ReplayStep(action: .create(place(name), mode: mode, rdev: 0, target: "", size: 0, fresh: false),
                                               updates: [(key(name), .node(ino: ino, mode: mode))]))
            }
        }
        for name in before.keys.sorted() where after[name] == nil && !moved.contains(name) {
            script.steps.append(ReplayStep(action: .remove(place(name), directory: true), updates: [(key(name), .absent)]))
        }
        return script
    }
}

/// How one container's replica shows in one mount.
public struct KernelView: Sendable {
    /// The replica inode shown at `prefix` (a scope's root).
    public var root: UInt64
    /// A name directly in `root` that this mount does not show.
    public var hidden: FileName?
    /// The path from the mountpoint to `root` (a drive's container folder).
    public var prefix: [FileName]
    /// The kernel's inode number of a replica inode (nil: not in this mount).
    public var kernelIno: @Sendable (UInt64) -> UInt64?

    public init(root: UInt64, hidden: FileName?, prefix: [FileName], kernelIno: @escaping @Sendable (UInt64) -> UInt64?) {
        self.root = root
        self.hidden = hidden
        self.prefix = prefix
        self.kernelIno = kernelIno
    }
}

/// An entry as the kernel names it: its folder's kernel inode number and its name.
public struct KernelKey: Hashable, Sendable {
    public var parent: UInt64
    public var name: FileName
}

/// What the kernel is shown at a name while the replay walks the virtual tree.
public enum Holding: Sendable, Equatable {
    case absent
    /// The node (kernel inode number) and its type and permission bits
    /// (used if the node is gone from the replica by the time it is asked for).
    case node(ino: UInt64, mode: UInt32)
}

/// Where a step acts: a name in a folder (its path from the mountpoint and
/// its kernel key), or the folder itself (`key` nil).
public struct KernelPlace: Sendable {
    public var folder: [FileName]
    public var key: KernelKey?
}

public struct ReplayStep: Sendable {
    public enum Action: Sendable {
        /// Make the entry: a file is created and closed written (`fresh`: with
        /// its size set, as a copy would leave it), anything else made by its call.
        case create(KernelPlace, mode: UInt32, rdev: UInt64, target: String, size: UInt64, fresh: Bool)
        case remove(KernelPlace, directory: Bool)
        case rename(from: KernelPlace, to: KernelPlace)
        /// A file's content changed: open for writing, set the size, close.
        case modify(KernelPlace, size: UInt64)
        /// Metadata changed (or a folder must be looked at again): touch its times.
        case attrib(KernelPlace)
    }
    public var action: Action
    /// What the kernel holds at each name this step changes, after it.
    public var updates: [(KernelKey, Holding)]

    public init(action: Action, updates: [(KernelKey, Holding)]) {
        self.action = action
        self.updates = updates
    }

    /// The folder the step acts in (for a rename, where it lands).
    var folder: [FileName] {
        switch action {
        case .create(let p, _, _, _, _, _), .remove(let p, _), .modify(let p, _), .attrib(let p): return p.folder
        case .rename(_, let to): return to.folder
        }
    }
}

extension KernelEventScript {
    struct Builder {
        let ns: Namespace
        let view: KernelView
        var steps: [ReplayStep] = []
        var initial: [KernelKey: Holding] = [:]

        /// The virtual tree: what each entry of the script names now (0: nothing).
        var virtual: [EntryKey: UInt64] = [:]
        /// The entries of the virtual tree naming each node.
        var holders: [UInt64: Set<EntryKey>] = [:]
        /// What each entry of the script names at the end.
        var after: [EntryKey: UInt64] = [:]
        /// Where each directory of the script is in the virtual tree (nil: nowhere yet, or removed).
        var dirPlace: [UInt64: EntryKey?] = [:]
        /// Entries still to be given their final node, by that node.
        var placements: [UInt64: [EntryKey]] = [:]
        var inProgress: Set<EntryKey> = []
        /// Type and permission bits of nodes the replica may no longer have.
        var earlierModes: [UInt64: UInt32] = [:]
        /// Nodes that did not exist in this view before (created by the script).
        var fresh: Set<UInt64> = []
        var temporaries = 0

        init(ns: Namespace, view: KernelView) {
            self.ns = ns
            self.view = view
        }

        /// Whether this kernel may cache entries of `dir` (and so may watch it).
        func holds(_ dir: UInt64) -> Bool {
            dir == view.root || (ns.node(dir)?.lookups ?? 0) > 0
        }

        func mode(of ino: UInt64) -> UInt32 {
            if let node = ns.node(ino) { return node.kind.typeBits | (node.mode & 0o7777) }
            return earlierModes[ino] ?? UInt32(S_IFREG) | 0o644
        }

        func isDirectory(_ ino: UInt64) -> Bool { mode(of: ino) & UInt32(S_IFMT) == UInt32(S_IFDIR) }

        /// Where `dir` is in the virtual tree (nil: not there).
        func place(of dir: UInt64) -> EntryKey? {
            if let known = dirPlace[dir] { return known }
            guard let parent = ns.directoryParent[dir], let node = ns.node(dir) else { return nil }
            return EntryKey(parent: parent, name: node.lastName)
        }

        /// The path from the mountpoint to `dir` in the virtual tree (nil: not shown here).
        func path(of dir: UInt64) -> [FileName]? {
            var names: [FileName] = []
            var current = dir
            while current != view.root {
                guard names.count < 4096, let up = place(of: current) else { return nil }
                if up.parent == view.root, let hidden = view.hidden, up.name == hidden { return nil }
                names.append(up.name)
                current = up.parent
            }
            return view.prefix + names.reversed()
        }

        func kernelKey(_ key: EntryKey) -> KernelKey? {
            view.kernelIno(key.parent).map { KernelKey(parent: $0, name: key.name) }
        }

        func kernelPlace(_ key: EntryKey) -> KernelPlace? {
            guard let folder = path(of: key.parent), let kernel = kernelKey(key) else { return nil }
            return KernelPlace(folder: folder, key: kernel)
        }

        func holding(_ ino: UInt64) -> Holding {
            guard ino != 0, let kernel = view.kernelIno(ino) else { return .absent }
            return .node(ino: kernel, mode: mode(of: ino))
        }

        /// Set entries of the virtual tree and record the step that did it.
        mutating func emit(_ action: ReplayStep.Action?, setting changes: [(EntryKey, UInt64)]) {
            var updates: [(KernelKey, Holding)] = []
            for (key, ino) in changes {
                if let old = virtual[key], old != 0 {
                    holders[old]?.remove(key)
                    if isDirectory(old), dirPlace[old] == key { dirPlace[old] = .some(nil) }
                }
                virtual[key] = ino
                if ino != 0 {
                    holders[ino, default: []].insert(key)
                    if isDirectory(ino) { dirPlace[ino] = key }
                }
                if let kernel = kernelKey(key) { updates.append((kernel, holding(ino))) }
            }
            if let action { steps.append(ReplayStep(action: action, updates: updates)) }
        }

        // MARK: The entries

        mutating func run(_ changes: ReplicaChanges) {
            let history = changes.history
            for key in history.order {
                if let earlier = history.before[key] ?? nil {
                    earlierModes[earlier.ino] = earlier.kind.typeBits | (earlier.mode & 0o7777)
                }
            }
            var keys: [EntryKey] = history.order.filter { holds($0.parent) }
            var involved = Set<UInt64>()
            for key in keys {
                involved.insert(history.before[key]??.ino ?? 0)
                involved.insert(ns.lookup(key.parent, key.name) ?? 0)
            }
            involved.remove(0)
            // The other end of a move into or out of a folder this kernel holds.
            let chosen = Set(keys)
            for key in history.order where !chosen.contains(key) {
                let before = history.before[key]??.ino ?? 0
                let now = ns.lookup(key.parent, key.name) ?? 0
                if involved.contains(before) || involved.contains(now) { keys.append(key) }
            }
            var beforeNodes = Set<UInt64>()
            for key in keys {
                let before = history.before[key]??.ino ?? 0
                let now = ns.lookup(key.parent, key.name) ?? 0
                guard before != now else { continue }
                virtual[key] = before
                after[key] = now
                if before != 0 {
                    holders[before, default: []].insert(key)
                    beforeNodes.insert(before)
                    if isDirectory(before) { dirPlace[before] = key }
                }
            }
            for (key, ino) in virtual {
                if let kernel = kernelKey(key) { initial[kernel] = holding(ino) }
            }
            for (key, ino) in after where ino != 0 {
                placements[ino, default: []].append(key)
                if isDirectory(ino), dirPlace[ino] == nil { dirPlace[ino] = .some(nil) }
                if !beforeNodes.contains(ino) { fresh.insert(ino) }
            }
            placements = placements.mapValues { $0.sorted { depth($0) < depth($1) || depth($0) == depth($1) && $0.name < $1.name } }

            removeWhatLeaves(replaced: false)
            // Shallow first, so that a new folder is there before what moves into it.
            let targets = placements.values.flatMap { $0 }.sorted { depth($0) < depth($1) || depth($0) == depth($1) && $0.name < $1.name }
            for key in targets { place(key) }
            removeWhatLeaves(replaced: true)
            edits(changes.edited)
        }

        func depth(_ key: EntryKey) -> Int {
            var depth = 0
            var current = key.parent
            while current != view.root, depth < 4096, let up = place(of: current) ?? finalPlace(of: current) {
                depth += 1
                current = up.parent
            }
            return depth
        }

        func finalPlace(of dir: UInt64) -> EntryKey? { placements[dir]?.first }

        /// Remove entries whose node leaves and is not moving somewhere else
        /// (deepest first). Without `replaced`, an entry that gets a new node
        /// stays for it (a file is then replaced by a rename over it).
        mutating func removeWhatLeaves(replaced: Bool) {
            let leaving = virtual.filter { key, ino in
                guard ino != 0, after[key] != ino else { return false }
                if !replaced {
                    if placements[ino] != nil { return false }      // moves: the entry is its source
                    if let next = after[key], next != 0, !isDirectory(next), !isDirectory(ino) { return false }
                }
                return true
            }.map(\.key).sorted { depth($0) > depth($1) || depth($0) == depth($1) && $0.name < $1.name }
            for key in leaving where virtual[key] != 0 && virtual[key] != after[key] { remove(key) }
        }

        mutating func remove(_ key: EntryKey) {
            guard let ino = virtual[key], ino != 0 else { return }
            let action = kernelPlace(key).map { ReplayStep.Action.remove($0, directory: isDirectory(ino)) }
            emit(action, setting: [(key, 0)])
        }

        /// Give entry `key` its final node: move it there, or create it.
        mutating func place(_ key: EntryKey) {
            guard let ino = after[key], ino != 0, virtual[key] != ino, !inProgress.contains(key) else { return }
            inProgress.insert(key)
            defer {
                inProgress.remove(key)
                placements[ino]?.removeAll { $0 == key }
                if placements[ino]?.isEmpty == true { placements[ino] = nil }
            }
            // The folder must be there: one that moves or is new is placed first.
            if place(of: key.parent) == nil, key.parent != view.root, let parentKey = finalPlace(of: key.parent) { place(parentKey) }
            guard key.parent == view.root || path(of: key.parent) != nil else { return }
            // What is here and moves elsewhere goes first (through a temporary name in a cycle).
            if let occupant = virtual[key], occupant != 0, let elsewhere = placements[occupant]?.first(where: { $0 != key }) {
                if inProgress.contains(elsewhere) || elsewhere == key {
                    moveAside(key)
                } else {
                    place(elsewhere)
                }
            }
            let occupant = virtual[key] ?? 0
            let source = holders[ino]?.filter { after[$0] != ino }.min { $0.name < $1.name }
            if let source, !isDirectory(ino), let next = after[source], next != 0, fresh.contains(next), !isDirectory(next) {
                // A conflicted copy: the local version gets a new name (created
                // there), and the remote version replaces it at its old name.
                create(key, ino, fresh: false)
                return
            }
            if occupant != 0, isDirectory(occupant) != isDirectory(ino) || (source == nil && isDirectory(ino)) {
                remove(key)
            }
            if let source {
                let action = kernelPlace(source).flatMap { from in kernelPlace(key).map { ReplayStep.Action.rename(from: from, to: $0) } }
                emit(action, setting: [(source, 0), (key, ino)])
            } else if virtual[key] ?? 0 != 0 {
                // A new file replacing one that leaves: created beside it, renamed over it.
                let temporary = temporaryKey(in: key.parent)
                virtual[temporary] = 0
                create(temporary, ino, fresh: fresh.contains(ino))
                let action = kernelPlace(temporary).flatMap { from in kernelPlace(key).map { ReplayStep.Action.rename(from: from, to: $0) } }
                emit(action, setting: [(temporary, 0), (key, ino)])
            } else {
                create(key, ino, fresh: fresh.contains(ino))
            }
        }

        mutating func create(_ key: EntryKey, _ ino: UInt64, fresh: Bool) {
            let node = ns.node(ino)
            let action = kernelPlace(key).map {
                ReplayStep.Action.create($0, mode: mode(of: ino), rdev: node?.rdev ?? 0, target: node?.target ?? "",
                                         size: node?.size ?? 0, fresh: fresh)
            }
            emit(action, setting: [(key, ino)])
        }

        /// Move what is at `key` to a temporary name beside it.
        mutating func moveAside(_ key: EntryKey) {
            guard let ino = virtual[key], ino != 0 else { return }
            let temporary = temporaryKey(in: key.parent)
            let action = kernelPlace(key).flatMap { from in kernelPlace(temporary).map { ReplayStep.Action.rename(from: from, to: $0) } }
            emit(action, setting: [(key, 0), (temporary, ino)])
            after[temporary] = 0
        }

        mutating func temporaryKey(in parent: UInt64) -> EntryKey {
            while true {
                temporaries += 1
                let key = EntryKey(parent: parent, name: FileName(".ubiquityfs-incoming-\(temporaries)"))
                if virtual[key] == nil && ns.lookup(parent, key.name) == nil { return key }
            }
        }

        // MARK: Content and metadata

        mutating func edits(_ edited: [UInt64: Bool]) {
            for (ino, contentChanged) in edited.sorted(by: { $0.key < $1.key }) where !fresh.contains(ino) {
                guard let node = ns.node(ino), !node.unlinked else { continue }
                // Where it is now, in a folder this kernel holds.
                let key = holders[ino]?.min { $0.name < $1.name }
                    ?? ns.entriesNaming(ino).first { holds($0.parent) }
                if ino == view.root {
                    if let folder = path(of: ino) { steps.append(ReplayStep(action: .attrib(KernelPlace(folder: folder, key: nil)), updates: [])) }
                    continue
                }
                guard let key, let place = kernelPlace(key) else { continue }
                if contentChanged && node.kind == .file {
                    steps.append(ReplayStep(action: .modify(place, size: node.size), updates: []))
                } else {
                    steps.append(ReplayStep(action: .attrib(place), updates: []))
                }
            }
        }
    }
}
