import Foundation
import UbiquityReplica
import UbiquityModel

/// Rejoining the journal after the collector removed records this replica
/// had not applied (docs/STORE-FORMAT.md, "Compacting the journal").
///
/// The store says how far records may be gone: its *journal base* `B`, a
/// record whose snapshot holds the state the removed records led to. A
/// replica that applied only up to `M < B` (a device offline longer than
/// the retention period) cannot read `M+1…B` any more. It rejoins at `B`:
/// the snapshot is compared with what this replica last had from the store,
/// and the difference is applied as one change set of record `B`, through
/// the same `ChangeApplier` as every record, so local work not pushed yet
/// meets it under the usual conflict rules (both versions of a file edited
/// on both sides are kept; an item deleted there and edited here stays).
///
/// The difference, from the snapshot's node states (each with its version)
/// and entries:
/// - every node whose version is after `M` (made or changed since);
/// - every entry whose child differs from what the store had there as this
///   replica last saw it (the base of an entry changed here, or the entry),
///   and a removal for each such entry the snapshot no longer has;
/// - a deletion of every node the store had (version > 0) that the
///   snapshot no longer describes.
///
/// Committing is safe too: a device behind the base could create a record
/// number the collector removed. Every commit reads the base after its
/// record is created; one at or below the base is withdrawn, and the device
/// rejoins and commits again (`withdrawIfBelowBase`). The collector sets the
/// base before it removes records, so a record created over a removed one
/// always finds the base that covers it.
extension SyncEngine {
    /// How long a base read stays trusted when the journal has nothing new.
    /// Records are removed only when older than a retention period (a day
    /// at least) plus the collector's grace, so a device that reads the
    /// journal often cannot fall behind the base between two looks.
    static let journalBaseRecheck: TimeInterval = 600

    /// The store's journal base, if it is past what this replica applied
    /// (then the replica must rejoin). Asks the store when a commit found
    /// itself below the base, or when the last look is older than
    /// `journalBaseRecheck` (wall clock: a device that slept for weeks looks
    /// at once).
    func journalBaseAhead() throws -> UInt64? {
        guard store.compactsJournal else { return nil }
        let due = baseChecked.withLock { last in last.map { Date().timeIntervalSince($0) >= Self.journalBaseRecheck || $0 > Date() } ?? true }
        guard due else { return nil }
        let base = try store.journalBase(container: container)
        baseChecked.withLock { $0 = Date() }
        let applied = replica.read { $0.appliedSeq }
        return base > applied ? base : nil
    }

    /// After record `seq` was created: if it lies at or below the journal
    /// base (this device was behind and took a number the collector
    /// removed), remove it again and make the next pull rejoin. True when
    /// it was withdrawn.
    func withdrawIfBelowBase(_ seq: UInt64) throws -> Bool {
        guard store.compactsJournal, seq <= (try store.journalBase(container: container)) else { return false }
        try store.removeRecord(container: container, seq: seq)
        baseChecked.withLock { $0 = nil }
        logger.warning("\(container): journal record \(seq) was below the journal's base (records up to it were removed while this device was away): withdrawn; rejoining from the snapshot, then committing again")
        return true
    }

    /// Rejoin at journal base `base`: apply the difference between its
    /// snapshot and this replica (see above). Runs under `pullLock`.
    func rejoin(at base: UInt64) throws -> ReplicaChanges {
        guard let record = try store.snapshot(container: container, seq: base) else {
            throw UbiquityError(EIO, "the journal of \(container) was compacted up to record \(base), but its snapshot is missing: this device cannot catch up (its work stays here, unpushed)")
        }
        let parts: [SnapshotPart]
        do {
            parts = try readParts(of: record)
        } catch let error as UbiquityError where error.errno == EHOSTDOWN {
            throw error
        } catch {
            throw UbiquityError(EIO, "the journal of \(container) was compacted up to record \(base), and its snapshot cannot be used (\(UbiquityError.wrap(error).message)): this device cannot catch up (its work stays here, unpushed)")
        }
        try recordPackLocations(in: parts)
        let authors = parts.reduce(into: [NodeID: String]()) { all, part in all.merge(part.authors) { $1 } }
        let (difference, behind) = replica.read { ns in (Self.difference(from: parts, to: ns, snapshot: record), ns.appliedSeq) }
        guard behind < base else { return ReplicaChanges() }
        let release = observer.withLock({ $0 })?.pullWillChange { affectedPaths([difference]) }
        defer { release?() }
        let changes = replica.record { ns -> ReplicaChanges in
            // Worked out again under this lock: local work may have moved on meanwhile.
            let difference = Self.difference(from: parts, to: ns, snapshot: record)
            var applier = ChangeApplier(seq: base, deviceName: device.name)
            applier.snapshotAuthors = authors
            ns.entryHistory = EntryHistory()
            applier.apply(difference, to: &ns)
            var changes = applier.changes
            changes.history = ns.entryHistory ?? EntryHistory()
            ns.entryHistory = nil
            ns.setAppliedSeq(base)
            return changes
        }
        try snapshotApplied(parts, of: record)
        logger.warning("\(container): this device had applied the journal up to record \(behind), and records up to \(base) were removed meanwhile (older than the retention period): rejoined from the snapshot of record \(base) (\(difference.changes.count) changes); work not pushed from here is kept")
        return changes
    }

    /// The change set that takes `ns` from what it last had from the store
    /// to the snapshot's state (see the type's comment).
    static func difference(from parts: [SnapshotPart], to ns: Namespace, snapshot record: SnapshotRecord) -> ChangeSet {
        struct Place: Hashable { var parent: NodeID; var name: FileName }
        let applied = ns.appliedSeq
        var states: [NodeID: NodeState] = [:]
        var order: [NodeID] = []
        var entries: [Place: NodeID] = [:]
        var entryOrder: [Place] = []
        for part in parts {
            for change in part.changeSet.changes {
                switch change {
                case .node(let state):
                    if states.updateValue(state, forKey: state.id) == nil { order.append(state.id) }
                case .entry(let parent, let name, let child?):
                    let place = Place(parent: parent, name: name)
                    if entries.updateValue(child, forKey: place) == nil { entryOrder.append(place) }
                default: break
                }
            }
        }
        // What the store had at each name as this replica last saw it.
        var stored: [Place: NodeID] = [:]
        for (dir, directory) in ns.children {
            guard let dirID = ns.id(of: dir) else { continue }
            for (name, entry) in directory where ns.pendingEntries[EntryKey(parent: dir, name: name)] == nil {
                if let child = ns.id(of: entry.ino) { stored[Place(parent: dirID, name: name)] = child }
            }
        }
        for (key, pending) in ns.pendingEntries where pending.base != 0 {
            if let dirID = ns.id(of: key.parent), let child = ns.id(of: pending.base) { stored[Place(parent: dirID, name: key.name)] = child }
        }
        var changes: [Change] = []
        var described: Set<NodeID> = []
        for id in order {
            guard let state = states[id], state.base > applied || (state.base == 0 && ns.inoByID[id] == nil) else { continue }
            changes.append(.node(state))
            described.insert(id)
        }
        func known(_ id: NodeID) -> Bool { described.contains(id) || ns.inoByID[id] != nil }
        for place in entryOrder {
            guard let child = entries[place], stored[place] != child, known(place.parent), known(child) else { continue }
            changes.append(.entry(parent: place.parent, name: place.name, child: child))
        }
        for (place, _) in stored where entries[place] == nil && known(place.parent) {
            changes.append(.entry(parent: place.parent, name: place.name, child: nil))
        }
        for (ino, node) in ns.nodes where ino != Namespace.rootIno && node.version > 0 && states[node.id] == nil {
            changes.append(.deleteNode(id: node.id, base: node.version))
        }
        return ChangeSet(device: record.device, deviceName: record.deviceName, date: record.date, changes: changes)
    }
}
