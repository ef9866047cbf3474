import Foundation
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityLinux

/// Snapshots (`SnapshotRecord`): a new replica starts from the newest one
/// it can use, then replays only the records after it; a device whose
/// replica holds exactly the store's state writes one when the journal has
/// grown enough since the last.
///
/// Both run on the pull thread (`pull`, `pullLoop`), under `pullLock`.
extension SyncEngine {
    /// Records between snapshots, at least: a new device replays at most
    /// about this many records (plus `nodes / snapshotNodesPerRecord`, so a
    /// large container is not described again too often).
    public static let defaultSnapshotInterval: UInt64 = 1000
    static let snapshotNodesPerRecord = 100
    /// About how many bytes of description go in one part (a part is one
    /// blob, at most one chunk).
    static let snapshotPartBytes = 2 << 20

    // MARK: Joining

    /// If this replica is new (nothing applied, nothing of its own), start
    /// it from the newest snapshot that reads, checks and applies whole; an
    /// older one if the newest is damaged. Returns the record it started
    /// from, or nil (the journal is then replayed from the start). Throws
    /// only when the store cannot be reached.
    func joinFromSnapshot() throws -> (seq: UInt64, changes: ReplicaChanges)? {
        guard snapshotInterval > 0, replica.read({ Self.isNew($0) }) else { return nil }
        let available = try store.snapshots(container: container)
        latestSnapshot.withLock { $0 = max($0 ?? 0, available.last ?? 0) }
        // One below the journal's base has lost the records after it (the pull then rejoins at the base).
        let base = store.compactsJournal ? try store.journalBase(container: container) : 0
        for seq in available.reversed().prefix(3) where seq >= base {
            do {
                guard let record = try store.snapshot(container: container, seq: seq) else { continue }
                let parts = try readParts(of: record)
                try recordPackLocations(in: parts)
                let changes = replica.record { ns -> ReplicaChanges? in
                    guard Self.isNew(ns) else { return nil }
                    var all = ReplicaChanges()
                    for part in parts {
                        var applier = ChangeApplier(seq: seq, deviceName: device.name)
                        applier.snapshotAuthors = part.authors
                        applier.apply(part.changeSet, to: &ns)
                        all.merge(applier.changes)
                    }
                    ns.setAppliedSeq(seq)
                    return all
                }
                guard let changes else { return nil }
                try snapshotApplied(parts, of: record)
                logger.info("\(container): started from the snapshot of journal record \(seq) (\(record.nodes) items, written by \(record.deviceName)); replaying the records after it")
                return (seq, changes)
            } catch let error as UbiquityError where error.errno == EHOSTDOWN {
                throw error
            } catch {
                logger.warning("\(container): the snapshot of journal record \(seq) cannot be used (\(UbiquityError.wrap(error).message)); \(seq == available.first ? "replaying the journal from the start" : "trying an older one")")
            }
        }
        return nil
    }

    /// Where the packed content the parts name is: known before any node needing it is recorded.
    func recordPackLocations(in parts: [SnapshotPart]) throws {
        try packs.record(parts.reduce(into: [:]) { all, part in
            all.merge(PackIndex.locations(in: part.changeSet.changes)) { $1 }
        }, own: false)
    }

    /// A snapshot was applied: record it, and index it in the history (if
    /// that fails, the history reads it again later).
    func snapshotApplied(_ parts: [SnapshotPart], of record: SnapshotRecord) throws {
        try replica.persist(.grows)
        do {
            try history.indexSnapshot(parts, seq: record.seq, date: record.date)
        } catch {
            logger.warning("\(container): history of the snapshot not indexed (\(UbiquityError.wrap(error).message)); read again later")
        }
    }

    /// Nothing applied and nothing made here: only the root.
    static func isNew(_ ns: Namespace) -> Bool {
        ns.appliedSeq == 0 && ns.unpushed.isEmpty && ns.pendingEntries.isEmpty && ns.nodes.count <= 1
    }

    /// The parts of `record`, fetched (verified), decoded and checked: each
    /// entry's folder and child described by this part or an earlier one,
    /// no node described with two kinds. Nothing is applied before all of
    /// it checks, so a snapshot is used whole or not at all.
    func readParts(of record: SnapshotRecord) throws -> [SnapshotPart] {
        let store = self.store
        let fetched = Parallel.map(record.parts, width: max(store.downloadConcurrency, store.uploadConcurrency)) { hash in
            Result { try store.fetchBlob(hash) }
        }
        var parts: [SnapshotPart] = []
        var kinds: [NodeID: NodeKind] = [.root: .directory]
        var described = 0
        for (index, result) in fetched.enumerated() {
            let part = try SnapshotPart.decode(try result.get(), index: index, seq: record.seq)
            for change in part.changeSet.changes {
                guard case .node(let state) = change else { continue }
                if let kind = kinds[state.id], kind != state.kind {
                    throw UbiquityError(EBADMSG, "node \(state.id) is described as a \(kind.rawValue) and as a \(state.kind.rawValue)")
                }
                kinds[state.id] = state.kind
                described += 1
            }
            for change in part.changeSet.changes {
                guard case .entry(let parent, let name, let child) = change else { continue }
                guard let child else { throw UbiquityError(EBADMSG, "part \(index + 1) removes an entry") }
                guard kinds[parent] == .directory else { throw UbiquityError(EBADMSG, "entry \(RecordFormat.quoted(name.description)): its folder \(parent) is not a folder described before") }
                guard kinds[child] != nil else { throw UbiquityError(EBADMSG, "entry \(RecordFormat.quoted(name.description)): node \(child) is not described") }
            }
            parts.append(part)
        }
        guard described == record.nodes else {
            throw UbiquityError(EBADMSG, "it says \(record.nodes) items, its parts describe \(described)")
        }
        return parts
    }

    // MARK: Writing

    /// Write a snapshot if the journal grew by the interval since the newest
    /// one, and this replica holds exactly the store's state (caught up,
    /// nothing of its own to push). Another device's newer snapshot found
    /// meanwhile makes it not due. Failures are logged, never fatal: the
    /// journal is all anyone needs.
    public func writeSnapshotIfDue() {
        guard snapshotInterval > 0, status.withLock({ $0.storeReachable }) else { return }
        do {
            let known: UInt64
            if let latest = latestSnapshot.withLock({ $0 }) {
                known = latest
            } else {
                known = try store.snapshots(container: container).last ?? 0
                latestSnapshot.withLock { $0 = known }
            }
            guard isSnapshotDue(after: known) else { return }
            // Another device may have written one since this device looked.
            let newest = try store.snapshots(container: container).last ?? 0
            latestSnapshot.withLock { $0 = max($0 ?? 0, newest) }
            guard isSnapshotDue(after: newest), let written = try writeSnapshot() else { return }
            latestSnapshot.withLock { $0 = max($0 ?? 0, written) }
        } catch {
            logger.warning("\(container): could not write a snapshot (the journal stays complete): \(UbiquityError.wrap(error).message)")
        }
    }

    /// Due when the journal grew by the interval, plus a share of a quarter
    /// of it that depends on the device: devices following one journal come
    /// due one after another, so the first one's snapshot spares the others
    /// theirs (each looks again just before it writes).
    func isSnapshotDue(after latest: UInt64) -> Bool {
        replica.read { ns in
            let interval = max(snapshotInterval, UInt64(ns.nodes.count / Self.snapshotNodesPerRecord))
            let stagger = device.id.utf8.reduce(UInt64(0)) { ($0 &* 31) &+ UInt64($1) } % (interval / 4 + 1)
            return ns.appliedSeq >= latest + interval + stagger
        }
    }

    /// Describe the replica (if it holds exactly the store's state), store
    /// the parts, then publish the record. Returns the record's number, or
    /// nil when the replica has work of its own to push.
    ///
    /// The namespace is described from a copy taken under the lock, which
    /// shares the live namespace's storage until that changes (copy on
    /// write: `NodeStore`), one part at a time, each part stored as soon as
    /// a round of them is ready: a large container is neither described
    /// under the lock nor held in memory whole, as change sets or as encoded
    /// parts. (Parts stored before a later part fails are blobs no record
    /// names, as after a failed upload.)
    @discardableResult
    public func writeSnapshot() throws -> UInt64? {
        let captured = replica.read { ns -> Namespace? in
            guard ns.appliedSeq > 0, ns.unpushed.isEmpty, ns.pendingEntries.isEmpty else { return nil }
            return ns
        }
        guard let captured else { return nil }
        // The parts' buffers are freed by now: give them back to the system.
        defer { LinuxCalls.releaseFreeMemory() }
        let seq = captured.appliedSeq
        let store = self.store
        var hashes: [String] = []
        var queued: [(String, Data)] = []
        func storeQueued() throws {
            for result in Parallel.map(queued, width: store.uploadConcurrency, { blob in Result { try store.putBlob(blob.0, data: blob.1) } }) {
                try result.get()
            }
            queued = []
        }
        let nodes = try Self.describe(captured, device: device) { part in
            var part = part
            // A part says where packed content is, as a journal record does.
            part.changeSet.changes = namingPacks(part.changeSet.changes)
            part.changeSet.version = part.changeSet.requiredVersion
            try part.changeSet.validate(seq: seq + 1)
            let data = try part.encoded()
            guard data.count <= ContentLayout.chunkSize else {
                throw UbiquityError(EFBIG, "part \(hashes.count + 1) is \(data.count) bytes, more than a chunk")
            }
            let hash = ContentCopy.hash(of: data)
            hashes.append(hash)
            queued.append((hash, data))
            if queued.count >= max(1, store.uploadConcurrency) { try storeQueued() }
        }
        try storeQueued()
        try store.flushBlobs()
        let record = SnapshotRecord(seq: seq, device: device.id, deviceName: device.name, nodes: nodes, parts: hashes)
        guard try store.publishSnapshot(container: container, record) else { return nil }
        logger.info("\(container): wrote the snapshot of journal record \(seq) (\(nodes) items, \(hashes.count) parts)")
        return seq
    }

    /// Every node reachable from the root and every entry, parents first:
    /// a folder's node comes before the entries in it, a node before the
    /// first entry naming it; cut into parts of about `snapshotPartBytes`,
    /// handed to `part` one by one. Returns the number of nodes described.
    @discardableResult
    static func describe(_ ns: Namespace, device: DeviceIdentity, _ part: (SnapshotPart) throws -> Void) throws -> Int {
        var changes: [Change] = []
        var authors: [NodeID: String] = [:]
        var bytes = 0
        var nodes = 0
        func flush() throws {
            guard !changes.isEmpty else { return }
            try part(SnapshotPart(changeSet: ChangeSet(device: device.id, deviceName: device.name, changes: changes), authors: authors))
            changes = []; authors = [:]; bytes = 0
        }
        func describe(_ node: LocalNode) {
            changes.append(.node(node.sharedState(hash: node.hash, size: node.hashSize, chunked: node.chunked)))
            if node.kind == .file, !node.author.isEmpty, RecordFormat.problem(deviceName: node.author) == nil { authors[node.id] = node.author }
            let mayBePacked = node.kind == .file && !node.chunked && node.hash != nil && node.hashSize < UInt64(PackLayout.memberLimit)
            bytes += (mayBePacked ? 500 : 400) + (node.target?.utf8.count ?? 0) + node.xattrs.reduce(0) { $0 + $1.key.utf8.count + $1.value.count * 4 / 3 + 8 }
            nodes += 1
        }
        guard let root = ns.node(Namespace.rootIno) else { return 0 }
        describe(root)
        var seen: Set<UInt64> = [Namespace.rootIno]
        var folders: [UInt64] = [Namespace.rootIno]
        var next = 0
        while next < folders.count {
            let folder = folders[next]
            next += 1
            guard let folderID = ns.node(folder)?.id else { continue }
            for (name, entry) in ns.entries(of: folder) {
                guard let child = ns.node(entry.ino) else { continue }
                if seen.insert(entry.ino).inserted {
                    describe(child)
                    if child.isDirectory { folders.append(entry.ino) }
                }
                changes.append(.entry(parent: folderID, name: name, child: child.id))
                bytes += 120 + name.bytes.count
                if bytes >= snapshotPartBytes { try flush() }
            }
        }
        try flush()
        return nodes
    }
}
