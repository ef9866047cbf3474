import Foundation
import UbiquityReplica
import UbiquityModel

/// Applies one change set committed by another device to the replica, and
/// resolves what meets a local change not pushed yet. The conflict rules are
/// written once, in docs/SEMANTICS.md ("Sync"); each keeps every version
/// somewhere, and every device ends with the same tree because the device
/// that commits second resolves here and pushes the result.
///
/// How local intent is known: a node with unpushed content or metadata, and
/// a *pending entry* — a (folder, name) changed here and not pushed — which
/// remembers its *base*, the node the store had there before this device
/// changed it. A remote entry that restates a pending entry's base changes
/// nothing (ours is newer); a remote entry that moves the base elsewhere
/// while our pending entry also took it away means both devices renamed one
/// node (`movedByBoth`): the committed rename wins (`undoLocalMoves`).
///
/// Order within a change set: nodes first (content conflicts split here),
/// then entries, then nodes left nameless that hold local work come back
/// (`resurrect`), then deletions, deepest first (`applyDeletions`).
let traceApply = ProcessInfo.processInfo.environment["UBQ_TRACE_APPLY"] != nil
func trace(_ text: @autoclosure () -> String) { if traceApply { print("APPLY " + text()) } }

struct ChangeApplier {
    let seq: UInt64
    let deviceName: String
    /// The device whose change set is being applied.
    var author = ""
    let now: Date
    var changes = ReplicaChanges()
    /// Nodes left without a name that hold work not pushed from here, or deleted
    /// here and edited there: brought back where they were after the entries are applied.
    var resurrections: [UInt64] = []
    /// Files that this change set moves away from an entry that a move here
    /// (not pushed yet) also took them from: both devices renamed one file.
    var movedByBoth: Set<UInt64> = []
    /// Entries this change set sets (to a node), and the nodes it names.
    var remoteKeys: Set<EntryKey> = []
    var remoteChildren: Set<NodeID> = []
    /// Files this device brought back from a deletion (version 0, to be
    /// pushed as made again) that this change set describes: the other
    /// device brought them back too. Where it names them wins over the
    /// names given here, so a file never ends with a name from each.
    var revivedHere: Set<UInt64> = []
    /// Applying a record this device committed that its replica lost (a
    /// crash or power cut between the commit and the index recording it):
    /// what it holds is this device's own work, never a conflict with it.
    var ownRecord = false
    /// For `ownRecord`: the hash of the local content of files changed here
    /// and not pushed (as far as this device knows), to tell whether that
    /// content is what the record holds.
    var localHashes: [UInt64: String] = [:]
    /// Set when applying a snapshot part (`SnapshotPart`): a node's `base` is
    /// its version, and these are the devices that made each file's content.
    var snapshotAuthors: [NodeID: String]?

    init(seq: UInt64, deviceName: String, now: Date = Date()) {
        self.seq = seq
        self.deviceName = deviceName
        self.now = now
    }

    mutating func apply(_ changeSet: ChangeSet, to ns: inout Namespace) {
        author = changeSet.deviceName
        trace("[\(deviceName)] seq \(seq) from \(changeSet.deviceName): \(changeSet.changes.map(Self.describe))")
        let deleted = Set(changeSet.changes.compactMap { change -> NodeID? in
            if case .deleteNode(let id, _) = change { return id }
            return nil
        })
        for change in changeSet.changes {
            guard case .entry(let parentID, let name, let child) = change else { continue }
            // A folder this change set creates is not known yet: what it names still counts.
            let key = ns.inoByID[parentID].map { EntryKey(parent: $0, name: name) }
            // (An entry that restates what a pending change here replaced changes nothing.)
            if let child, !(key.flatMap { ns.pendingEntries[$0] }.map { ns.inoByID[child] == nonZero($0.base) } ?? false) {
                if let key { remoteKeys.insert(key) }
                remoteChildren.insert(child)
            }
            guard let key else { continue }
            let parent = key.parent
            // Both took the file that was here away (a removal, or another node put here).
            if let base = ns.pendingEntries[key]?.base, base != 0,
               let node = ns.node(base), node.kind != .directory, node.id != child, ns.lookup(parent, name) != base {
                movedByBoth.insert(base)
            }
        }
        for change in changeSet.changes {
            guard case .node(let state) = change, let ino = ns.inoByID[state.id], let node = ns.node(ino),
                  node.version == 0, node.kind != .directory else { continue }
            revivedHere.insert(ino)
        }
        for change in changeSet.changes {
            if case .node(let state) = change { applyNode(state, to: &ns) }
        }
        for change in changeSet.changes {
            if case .entry(let parent, let name, let child) = change {
                applyEntry(parentID: parent, name: name, childID: child, deleted: deleted, to: &ns)
            }
        }
        // Unless the change set named them somewhere, they come back where they were.
        for ino in resurrections where ns.node(ino)?.unlinked == true { resurrect(ino, to: &ns) }
        applyDeletions(deleted, to: &ns)
    }

    /// Why `changeSet` cannot be applied to this replica, or nil. Its fields
    /// were checked when it was read (`ChangeSet.validate`); this checks what
    /// it refers to, before anything is applied, so a record is applied whole
    /// or not at all: a node keeps its kind; an entry's folder is one this
    /// device knows (or the record describes) and is a folder; an entry's
    /// child is known or described. Every device that applied the journal up
    /// to this record knows these nodes (the device that wrote the record
    /// had applied it too, and describes every node it made since).
    /// Removals and deletions of nodes this device no longer has are fine:
    /// they change nothing. Cycles are not refused: `applyEntry` breaks them.
    static func problem(with changeSet: ChangeSet, in ns: Namespace) -> String? {
        var described: [NodeID: NodeKind] = [:]
        for (index, change) in changeSet.changes.enumerated() {
            guard case .node(let state) = change else { continue }
            if let ino = ns.inoByID[state.id], let local = ns.node(ino), local.kind != state.kind {
                return "node \(state.id) is a \(local.kind.rawValue) here, the record makes it a \(state.kind.rawValue) (change \(index + 1))"
            }
            described[state.id] = state.kind
        }
        func kind(_ id: NodeID) -> NodeKind? { described[id] ?? ns.inoByID[id].flatMap { ns.node($0)?.kind } }
        for (index, change) in changeSet.changes.enumerated() {
            guard case .entry(let parent, _, let child) = change, let child else { continue }
            guard let parentKind = kind(parent) else {
                return "entry parent \(parent) is not a known folder (change \(index + 1))"
            }
            guard parentKind == .directory else {
                return "entry parent \(parent) is a \(parentKind.rawValue), not a folder (change \(index + 1))"
            }
            guard kind(child) != nil else { return "entry child \(child) is not a known node (change \(index + 1))" }
        }
        return nil
    }

    static func describe(_ change: Change) -> String {
        switch change {
        case .node(let s): return "node \(s.id.suffix(6)) \(s.hash?.prefix(4) ?? "-")"
        case .entry(let p, let n, let c): return "entry \(p.suffix(6))/\(n)=\(c?.suffix(6) ?? "nil")"
        case .deleteNode(let id, _): return "delete \(id.suffix(6))"
        }
    }

    // MARK: Nodes

    mutating func applyNode(_ state: NodeState, to ns: inout Namespace) {
        guard let ino = ns.inoByID[state.id], let local = ns.node(ino) else {
            createNode(state, to: &ns)
            return
        }
        let contentDiffers = local.kind == .file && (state.hash != local.hash || state.size != local.hashSize)
        if ownRecord, local.hasUnpushedContent, !local.unlinked, let hash = state.hash,
           localHashes[ino] == hash, local.size == state.size {
            // This very content was pushed: it is the stored version now.
            ns.update(ino, local: false) { n in
                n.version = seq
                n.hash = hash
                n.hashSize = state.size
                n.chunked = state.chunked ?? false
                n.pushedGeneration = n.contentGeneration
                n.verifiedHash = hash
            }
            return
        }
        if contentDiffers && local.hasUnpushedContent && !local.unlinked {
            splitConflict(ino, remote: state, to: &ns)
            return
        }
        var refresh = false
        let keepLocalMetadata = local.hasUnpushedMetadata && !local.unlinked
        ns.update(ino, local: false) { n in
            if !keepLocalMetadata {
                n.mode = state.mode; n.uid = state.uid; n.gid = state.gid
                n.mtime = state.mtime; n.ctime = state.ctime; n.btime = state.btime
                n.target = state.target; n.rdev = state.rdev; n.xattrs = state.xattrs
                n.conflicts = state.conflicts ?? []
            }
            n.version = version(of: state)
            if contentDiffers {
                refresh = n.hasContent || n.pinned
                Self.takeContent(state, into: &n)
                n.author = author(of: state)
            }
        }
        if local.unlinked && contentDiffers { resurrections.append(ino) }
        changes.node(ino, contentChanged: contentDiffers, in: ns)
        // What a program sees change: not the ctime a rename sends, nor a
        // folder's times, which move with what is put in it; the conflict
        // versions show in the item's status attribute (a document presenting
        // the file learns its conflict was resolved elsewhere).
        let metadataDiffers = !keepLocalMetadata && (local.mode != state.mode || local.uid != state.uid || local.gid != state.gid
            || (local.kind != .directory && local.mtime != state.mtime) || local.target != state.target || local.xattrs != state.xattrs
            || local.conflicts != (state.conflicts ?? []))
        if contentDiffers || metadataDiffers { changes.edited[ino] = (changes.edited[ino] ?? false) || contentDiffers }
        if refresh || (contentDiffers && ns.isPinned(ino)) { changes.refresh.append(ino) }
    }

    static func takeContent(_ state: NodeState, into n: inout LocalNode) {
        n.hash = state.hash
        n.hashSize = state.size
        n.chunked = state.chunked ?? false
        n.size = state.size
        n.hasContent = false   // fetched (or created empty) when opened
        n.pushedGeneration = n.contentGeneration
        n.contentEpoch &+= 1
    }

    mutating func createNode(_ state: NodeState, to ns: inout Namespace) {
        let ino = ns.createNode(id: state.id, kind: state.kind, mode: state.mode, uid: state.uid, gid: state.gid,
                                rdev: state.rdev, target: state.target, time: state.mtime, local: false)
        ns.update(ino, local: false) { n in
            n.ctime = state.ctime; n.btime = state.btime; n.atime = state.mtime
            n.xattrs = state.xattrs
            n.conflicts = state.conflicts ?? []
            n.author = author(of: state)
            Self.takeContent(state, into: &n)
            if state.kind != .file {
                n.hasContent = true
                n.size = state.kind == .symlink ? UInt64(state.target?.utf8.count ?? 0) : 0
            }
            n.version = version(of: state)
            n.unlinked = true   // until an entry names it
        }
    }

    /// The journal record a node's state is of: this one, or in a snapshot the one it names.
    func version(of state: NodeState) -> UInt64 {
        snapshotAuthors != nil && state.base > 0 ? state.base : seq
    }

    func author(of state: NodeState) -> String {
        snapshotAuthors?[state.id] ?? author
    }

    /// Both edited the content: the remote version takes the node's ID and
    /// names; the local version (inode `ino`, open descriptors and all)
    /// becomes a new node under a conflicted-copy name in the same places.
    mutating func splitConflict(_ ino: UInt64, remote: NodeState, to ns: inout Namespace) {
        let places = ns.entriesNaming(ino)
        trace("[\(deviceName)]   split \(remote.id.suffix(6)) at \(places.map { "\($0.name)" })")
        ns.rekey(ino, to: .next())
        createNode(remote, to: &ns)
        guard let original = ns.inoByID[remote.id], let copyID = ns.node(ino)?.id else { return }
        ns.rebasePendingEntries(from: ino, to: original)
        ns.update(original, local: true) { n in
            if !n.conflicts.contains(copyID) { n.conflicts.append(copyID) }
        }
        // Where this change set puts the node, it goes there (a move there wins
        // over a move here); otherwise it takes the local version's places.
        let movedThere = remoteChildren.contains(remote.id)
        for place in places {
            ns.unlinkEntry(place.parent, place.name, local: movedThere)
            if !movedThere { ns.linkEntry(place.parent, place.name, original, local: false) }
            let copyName = conflictName(place.name, in: place.parent, ns: ns)
            ns.linkEntry(place.parent, copyName, ino, local: true)
            changes.entry(place.parent, place.name, in: ns)
            changes.entry(place.parent, copyName, in: ns)
        }
        changes.node(ino, contentChanged: false, in: ns)
    }

    /// `NAME (conflicted copy DEVICE YYYY-MM-DD HHMMSS).EXT`, unique in `parent`.
    func conflictName(_ name: FileName, in parent: UInt64, ns: Namespace) -> FileName {
        Self.copyName(name, label: "conflicted copy", deviceName: deviceName, date: now, in: parent, ns: ns)
    }

    /// `NAME (LABEL DEVICE YYYY-MM-DD HHMMSS).EXT` (a number added if taken),
    /// unique in `parent`; `LABEL UUID8.EXT` if that would be too long.
    static func copyName(_ name: FileName, label: String, deviceName: String, date: Date,
                         in parent: UInt64, ns: Namespace) -> FileName {
        let text = name.description
        let dot = text.lastIndex(of: ".").flatMap { $0 == text.startIndex ? nil : $0 }
        let stem = dot.map { String(text[..<$0]) } ?? text
        let ext = dot.map { String(text[$0...]) } ?? ""
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "yyyy-MM-dd HHmmss"
        let stamp = formatter.string(from: date)
        var counter = 1
        while true {
            let suffix = counter == 1 ? "" : " \(counter)"
            let candidate = FileName("\(stem) (\(label) \(deviceName) \(stamp)\(suffix))\(ext)")
            if ns.lookup(parent, candidate) == nil && candidate.count <= 255 { return candidate }
            if candidate.count > 255 {
                return FileName("\(label) \(UUID().uuidString.prefix(8))\(ext)")
            }
            counter += 1
        }
    }

    // MARK: Entries

    mutating func applyEntry(parentID: NodeID, name: FileName, childID: NodeID?, deleted: Set<NodeID>,
                             to ns: inout Namespace) {
        guard let parent = ns.inoByID[parentID], ns.node(parent)?.kind == .directory else { return }
        let existing = ns.lookup(parent, name)
        let child = childID.flatMap { ns.inoByID[$0] }
        let key = EntryKey(parent: parent, name: name)
        if existing == child {
            ns.entryMatchesStore(key)
            return
        }
        // Changed here, and the change set only restates what it was before: ours stands.
        if let pending = ns.pendingEntries[key], child == nonZero(pending.base) { return }
        if let existing, let node = ns.node(existing) {
            // This name was set here and not pushed yet: our intent is newer.
            let ours = ns.pendingEntries[key] != nil
            if child == nil {
                // Removal of an entry whose node is deleted there: decided with the deletions.
                if ours && !remoteChildren.contains(node.id) {
                    ns.rebaseEntry(key, on: 0)
                    return
                }
                if deleted.contains(node.id) { return }
                ns.unlinkEntry(parent, name, local: false)
                // Content edited here must not end up nameless: checked after all entries.
                if node.hasUnpushedContent { resurrections.append(existing) }
            } else if remoteChildren.contains(node.id) {
                // This change set names it elsewhere: it moves there.
                ns.unlinkEntry(parent, name, local: false)
            } else if ours || node.hasUnpushedContent {
                // Both put something at this name (or it replaces content edited here): ours moves aside.
                ns.unlinkEntry(parent, name, local: false)
                let copyName = conflictName(name, in: parent, ns: ns)
                trace("[\(deviceName)]   aside \(node.id.suffix(6)) \(name) -> \(copyName)")
                ns.linkEntry(parent, copyName, existing, local: true)
                changes.entry(parent, copyName, in: ns)
                // A file saved over the other's file (an atomic save on each
                // side): ours is an unresolved conflict version of theirs.
                if node.kind == .file, let child, ns.node(child)?.kind == .file {
                    ns.update(child, local: true) { n in
                        if !n.conflicts.contains(node.id) { n.conflicts.append(node.id) }
                    }
                }
            } else {
                ns.unlinkEntry(parent, name, local: false)
            }
        }
        changes.entry(parent, name, in: ns)
        guard let child, let node = ns.node(child) else { return }
        if node.kind == .directory {
            if child == parent { return }   // never inside itself
            if isAncestor(child, of: parent, in: ns) {
                breakCycle(moving: child, into: parent, to: &ns)
            }
            // A directory has one entry: a move elsewhere removes the old one.
            if let oldParent = ns.directoryParent[child] {
                let oldName = node.lastName
                if ns.lookup(oldParent, oldName) == child {
                    ns.unlinkEntry(oldParent, oldName, local: false)
                    changes.entry(oldParent, oldName, in: ns)
                }
            }
        }
        ns.linkEntry(parent, name, child, local: false)
        ns.entryMatchesStore(key)
        if node.unlinked { ns.update(child, local: false) { _ in } }
        // Moved there, deleted here (not pushed yet): the move wins, and the
        // folder comes back with what it held.
        if node.unlinked && node.kind == .directory { restoreContents(deletedHereFrom: child, to: &ns) }
        // Put in a folder removed here (not pushed yet): the folder survives with it.
        if ns.node(parent)?.unlinked == true { resurrections.append(parent) }
        if movedByBoth.contains(child) || revivedHere.contains(child) { undoLocalMoves(of: child, keeping: key, to: &ns) }
        // What arrives in a pinned directory is kept on this device.
        if node.kind == .file, ns.node(child)?.isPlaceholder == true, ns.isPinned(child) { changes.refresh.append(child) }
        changes.node(child, contentChanged: false, in: ns)
        changes.node(parent, contentChanged: false, in: ns)
    }

    /// Both devices renamed file `ino` away from the same entry (or both
    /// brought it back from a deletion): the committed name wins, so the
    /// names given to it here (not pushed yet) go, and whatever such a
    /// rename replaced comes back.
    mutating func undoLocalMoves(of ino: UInt64, keeping kept: EntryKey, to ns: inout Namespace) {
        for place in ns.entriesNaming(ino) where place != kept && ns.pendingEntries[place] != nil && !remoteKeys.contains(place) {
            trace("[\(deviceName)]   undo local move of \(ns.node(ino)?.id.suffix(6) ?? "?") to \(place.name)")
            ns.unlinkEntry(place.parent, place.name)
            if let replaced = ns.pendingEntries[place]?.base, replaced != 0, replaced != ino,
               let node = ns.node(replaced), node.unlinked, node.kind != .directory, !remoteChildren.contains(node.id) {
                ns.linkEntry(place.parent, place.name, replaced)
            }
            // The entry is back to what the store has there.
            if ns.lookup(place.parent, place.name) == nonZero(ns.pendingEntries[place]?.base) { ns.entryMatchesStore(place) }
            changes.entry(place.parent, place.name, in: ns)
        }
    }

    func nonZero(_ ino: UInt64?) -> UInt64? { ino == 0 ? nil : ino }

    /// Folder `dir`, deleted here and not pushed yet, was moved by the
    /// other device: what this device removed from it (and from its
    /// folders, all the way down) goes back where it was, as the store
    /// still has it.
    mutating func restoreContents(deletedHereFrom dir: UInt64, to ns: inout Namespace) {
        let removed = ns.pendingEntries.filter { $0.key.parent == dir && $0.value.base != 0 }
        for (key, pending) in removed {
            guard ns.lookup(dir, key.name) == nil, let node = ns.node(pending.base), node.unlinked else { continue }
            trace("[\(deviceName)]   restore \(node.id.suffix(6)) at \(key.name): its folder moved there")
            ns.linkEntry(dir, key.name, pending.base, local: false)
            ns.entryMatchesStore(key)
            changes.entry(dir, key.name, in: ns)
            changes.node(pending.base, contentChanged: false, in: ns)
            if node.kind == .directory { restoreContents(deletedHereFrom: pending.base, to: &ns) }
        }
    }

    func isAncestor(_ ancestor: UInt64, of ino: UInt64, in ns: Namespace) -> Bool {
        var current: UInt64? = ino
        var steps = 0
        while let c = current, steps < 100_000 {
            if c == ancestor { return true }
            current = ns.directoryParent[c]
            steps += 1
        }
        return false
    }

    /// Linking `dir` into `parent` would put it inside itself: the local
    /// move that made `parent` a descendant of `dir` is undone by moving the
    /// top of that chain (a child of `dir` on the path) to the root.
    mutating func breakCycle(moving dir: UInt64, into parent: UInt64, to ns: inout Namespace) {
        var current = parent
        while let up = ns.directoryParent[current], up != dir { current = up }
        guard ns.directoryParent[current] == dir, let node = ns.node(current) else { return }
        let oldParent = ns.directoryParent[current] ?? dir
        ns.unlinkEntry(oldParent, node.lastName, local: true)
        let name = ns.lookup(Namespace.rootIno, node.lastName) == nil
            ? node.lastName : conflictName(node.lastName, in: Namespace.rootIno, ns: ns)
        ns.linkEntry(Namespace.rootIno, name, current, local: true)
        changes.entry(oldParent, node.lastName, in: ns)
        changes.entry(Namespace.rootIno, name, in: ns)
    }

    // MARK: Deletions

    /// Delete what the other device deleted — except what holds local work
    /// not pushed yet (edited content; a directory with such items or with
    /// items created here), which survives and is pushed again, and what was
    /// moved or renamed here (not pushed yet), which survives with
    /// everything below it: the move wins.
    mutating func applyDeletions(_ deleted: Set<NodeID>, to ns: inout Namespace) {
        // Deepest first, so a directory is decided after its contents.
        let inos = deleted.compactMap { ns.inoByID[$0] }.sorted { depth($0, ns) > depth($1, ns) }
        let movedHere = Set(inos.filter { ino in ns.entriesNaming(ino).contains { ns.pendingEntries[$0] != nil } })
        for ino in inos {
            guard let node = ns.node(ino) else { continue }
            let survives: Bool
            if !movedHere.isEmpty && isInside(ino, anyOf: movedHere, in: ns) {
                survives = true
            } else if node.kind == .directory {
                survives = !ns.entries(of: ino).isEmpty
            } else {
                // This device's own deletion (`ownRecord`) stands over what it wrote before.
                survives = node.hasUnpushedContent && !ownRecord
            }
            trace("[\(deviceName)]   delete \(node.id.suffix(6)) survives=\(survives)")
            if survives {
                // Push the node and its entries again: the other devices re-create them.
                ns.update(ino) { $0.version = 0 }
                let places = ns.entriesNaming(ino)
                for place in places {
                    ns.unlinkEntry(place.parent, place.name, local: false)
                    ns.linkEntry(place.parent, place.name, ino, local: true)
                }
                if places.isEmpty { resurrect(ino, to: &ns) }
                // The device that deleted a folder dropped everything it held: what it
                // still holds is pushed again too (its entries, and its nodes' states).
                if node.kind == .directory { repush(contentsOf: ino, to: &ns) }
                continue
            }
            for place in ns.entriesNaming(ino) {
                ns.unlinkEntry(place.parent, place.name, local: false)
                changes.entry(place.parent, place.name, in: ns)
            }
            ns.update(ino, local: false) { $0.unlinked = true; $0.nlink = 0 }
            changes.node(ino, contentChanged: true, in: ns)
            if ns.dropIfUnreferenced(ino) { changes.dropped.append(ino) }
        }
    }

    /// Mark everything below directory `dir` (entries and nodes) to be pushed
    /// again, as if made here: for another device that dropped the subtree.
    mutating func repush(contentsOf dir: UInt64, to ns: inout Namespace) {
        for (name, entry) in ns.entries(of: dir) {
            ns.unlinkEntry(dir, name, local: false)
            ns.linkEntry(dir, name, entry.ino, local: true)
            ns.update(entry.ino) { _ in }
            changes.entry(dir, name, in: ns)
            if ns.node(entry.ino)?.kind == .directory { repush(contentsOf: entry.ino, to: &ns) }
        }
    }

    /// `ino` is one of `tops` or below one of them (through any of its names).
    func isInside(_ ino: UInt64, anyOf tops: Set<UInt64>, in ns: Namespace) -> Bool {
        var frontier = [ino]
        var seen: Set<UInt64> = []
        while let current = frontier.popLast(), seen.count < 100_000 {
            if tops.contains(current) { return true }
            guard seen.insert(current).inserted, current != Namespace.rootIno else { continue }
            if ns.node(current)?.kind == .directory {
                if let up = ns.directoryParent[current] { frontier.append(up) }
            } else {
                frontier += ns.entriesNaming(current).map(\.parent)
            }
        }
        return false
    }

    func depth(_ ino: UInt64, _ ns: Namespace) -> Int {
        var depth = 0
        var current = ns.node(ino)?.kind == .directory ? ns.directoryParent[ino] : ns.node(ino)?.lastParent
        while let c = current, c != Namespace.rootIno, depth < 100_000 {
            depth += 1
            current = ns.directoryParent[c]
        }
        return depth
    }

    // MARK: Resurrection

    /// Bring an unlinked node back at the entry that named it last (and its
    /// parent directories, if they were deleted here too).
    mutating func resurrect(_ ino: UInt64, to ns: inout Namespace) {
        guard let node = ns.node(ino), node.unlinked, node.lastParent != 0 else { return }
        if let parent = ns.node(node.lastParent), parent.unlinked { resurrect(node.lastParent, to: &ns) }
        guard ns.node(node.lastParent) != nil else { return }
        let occupant = ns.lookup(node.lastParent, node.lastName)
        let name = occupant == nil ? node.lastName : conflictName(node.lastName, in: node.lastParent, ns: ns)
        ns.linkEntry(node.lastParent, name, ino, local: true)
        trace("[\(deviceName)]   resurrect \(node.id.suffix(6)) at \(name)")
        ns.update(ino) { _ in }
        changes.entry(node.lastParent, name, in: ns)
        // Edited there, saved over here (an atomic save replaced the file):
        // the edit is an unresolved conflict version of the file at its name,
        // whose presenters hear of it (an attribute change).
        if let occupant, node.kind == .file, ns.node(occupant)?.kind == .file {
            ns.update(occupant, local: true) { n in
                if !n.conflicts.contains(node.id) { n.conflicts.append(node.id) }
            }
            changes.node(occupant, contentChanged: false, in: ns)
            changes.edited[occupant] = changes.edited[occupant] ?? false
        }
    }
}
