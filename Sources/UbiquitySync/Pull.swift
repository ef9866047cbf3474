import Foundation
import UbiquityReplica
import UbiquityModel
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// Applying the store's journal to the replica, and fetching content.
extension SyncEngine {
    /// Apply every journal record after the replica's `appliedSeq`, then
    /// tell the observer (the kernel's caches) what changed.
    /// If the index cannot record what was applied, it stays applied (and
    /// queued for the next commit): the kernel's caches are told all the
    /// same, then the error is thrown.
    ///
    /// A record that is not a valid change set (`JournalRecord.invalid`), or
    /// that cannot apply to this replica (`ChangeApplier.problem`), is
    /// quarantined: nothing of it is applied, the cursor moves past it (so
    /// the next commit takes a free number after it), and it is recorded
    /// with the reason in the index (shown by `status`, logged once).
    @discardableResult
    public func pull() throws -> ReplicaChanges {
        var all = ReplicaChanges()
        var unrecorded: (any Error)?
        var quarantined: [QuarantinedRecord] = []
        var reapplied: [UInt64] = []
        var releases: [@Sendable () -> Void] = []
        defer { for release in releases { release() } }
        // A commit of this device's under way: once settled, it is not read back.
        commitGate.withLock { _ in }
        try pullLock.withLock { _ in
            if let joined = try joinFromSnapshot() { all.merge(joined.changes) }
            while true {
                let after = replica.read { ns in ns.appliedSeq }
                let records = try store.journal(container: container, after: after, limit: 256)
                if records.isEmpty {
                    // The end of the journal, or records removed that this replica lacks.
                    guard let base = try journalBaseAhead() else { break }
                    all.merge(try rejoin(at: base))
                    continue
                }
                // Where packed content is, known before the replica records a node needing it.
                try packs.record(records.reduce(into: [:]) { all, record in
                    all.merge(PackIndex.locations(in: record.changeSet?.changes ?? [])) { $1 }
                }, own: false)
                if let release = observer.withLock({ $0 })?.pullWillChange({ affectedPaths(records.compactMap(\.changeSet)) }) { releases.append(release) }
                let ownHashes = hashesOfLocalContent(namedBy: records)
                for record in records {
                    let changed = replica.record { ns -> ReplicaChanges in
                        guard record.seq == ns.appliedSeq + 1 else { return ReplicaChanges() }
                        // This device's own records were applied when it made them, unless
                        // its replica lost that (a crash or power cut before the index had it):
                        // then they apply like another device's, as this device's own work.
                        let remote = record.changeSet
                        let problem: String?
                        switch record.content {
                        case .invalid(let reason): problem = reason
                        case .changeSet: problem = remote.flatMap { ChangeApplier.problem(with: $0, in: ns) }
                        }
                        if let problem {
                            let skipped = QuarantinedRecord(seq: record.seq, reason: problem)
                            quarantined.append(skipped)
                            ns.quarantine(skipped)
                            return ReplicaChanges()
                        }
                        var changed = ReplicaChanges()
                        if let remote {
                            var applier = ChangeApplier(seq: record.seq, deviceName: device.name)
                            if remote.device == device.id {
                                reapplied.append(record.seq)
                                applier.ownRecord = true
                                applier.localHashes = ownHashes
                            }
                            ns.entryHistory = EntryHistory()
                            applier.apply(remote, to: &ns)
                            changed = applier.changes
                            changed.history = ns.entryHistory ?? EntryHistory()
                            ns.entryHistory = nil
                        }
                        ns.setAppliedSeq(record.seq)
                        return changed
                    }
                    all.merge(changed)
                }
                indexHistory(records.map { ($0.seq, $0.changeSet) })
                // Recorded as it is applied; if the index has no room, it
                // stays queued (and is pulled again after a restart).
                do {
                    try replica.persist(.grows)
                } catch {
                    unrecorded = error
                    break
                }
            }
        }
        if let first = reapplied.first {
            logger.warning("\(container): journal records \(first)…\(reapplied.last!) (\(reapplied.count)) were committed by this device but its replica lost them (a crash or power loss): applied again")
        }
        for record in quarantined {
            logger.error("quarantined journal record \(record.seq) of \(container) (not applied, skipped): \(record.reason)")
        }
        status.withLock { s in s.lastSync = Date(); s.storeReachable = true }
        if !all.isEmpty, let observer = observer.withLock({ $0 }) { observer.replicaChanged(all) }
        for ino in all.refresh { startDownload(ino: ino, background: true) }
        for ino in all.dropped { replica.cache.retire(ino) }
        if let unrecorded { throw unrecorded }
        return all
    }

    /// For this device's own records among `records` (read back only when
    /// the replica lost them): the hash of each file they describe that
    /// has local content not pushed as far as the replica knows, so the
    /// applier can tell this device's pushed content from newer work.
    func hashesOfLocalContent(namedBy records: [JournalRecord]) -> [UInt64: String] {
        let states = records.compactMap { $0.changeSet }.filter { $0.device == device.id }.flatMap { set in
            set.changes.compactMap { change -> NodeState? in
                if case .node(let state) = change, state.kind == .file, state.hash != nil, state.chunked != true { return state }
                return nil
            }
        }
        guard !states.isEmpty else { return [:] }
        let candidates = replica.read { ns in
            states.compactMap { state -> (UInt64, UInt64)? in
                guard let ino = ns.inoByID[state.id], let node = ns.node(ino), node.hasContent, node.hasUnpushedContent,
                      node.size == state.size else { return nil }
                return (ino, state.size)
            }
        }
        var hashes: [UInt64: String] = [:]
        for (ino, size) in candidates {
            guard let data = FileManager.default.contents(atPath: replica.cache.path(ino)), UInt64(data.count) == size else { continue }
            hashes[ino] = ContentCopy.hash(of: data)
        }
        return hashes
    }

    /// The paths (in the container) that other devices' change sets among
    /// `changeSets` change: each changed or deleted node's, each entry's,
    /// and where each moved node was.
    func affectedPaths(_ changeSets: [ChangeSet]) -> [String] {
        replica.read { ns in
            var paths: Set<String> = []
            func add(_ id: NodeID) {
                if let ino = ns.inoByID[id], let path = ns.path(of: ino) { paths.insert(path) }
            }
            for changeSet in changeSets {
                guard changeSet.device != device.id else { continue }
                for change in changeSet.changes {
                    switch change {
                    case .node(let state): add(state.id)
                    case .deleteNode(let id, _): add(id)
                    case .entry(let parent, let name, let child):
                        if let ino = ns.inoByID[parent], let up = ns.path(of: ino) {
                            paths.insert(up == "/" ? "/\(name)" : "\(up)/\(name)")
                        }
                        if let child { add(child) }
                    }
                }
            }
            return paths.sorted()
        }
    }

    /// The journal records this replica skipped because they failed validation.
    public var quarantinedRecords: [QuarantinedRecord] { replica.read { $0.quarantined } }
}

/// Told after a pull changed the replica (the FUSE session invalidates the
/// kernel's caches).
public protocol ReplicaObserver: Sendable {
    func replicaChanged(_ changes: ReplicaChanges)
    /// Before a pull changes items (`paths`, in the container: worked out
    /// only if asked): wait until nobody holds coordinated access to them,
    /// as a coordinated writer; the result ends the pull's access, once the
    /// change is applied and told. Nil: nothing to wait for.
    func pullWillChange(_ paths: () -> [String]) -> (@Sendable () -> Void)?
}

extension ReplicaObserver {
    public func pullWillChange(_ paths: () -> [String]) -> (@Sendable () -> Void)? { nil }
}
