import Foundation
import Logging
import UbiquityModel
import UbiquityStore

/// The store's garbage collector: removes the blobs (content, chunk
/// manifests and chunks, packs) that nothing within any container's
/// retention period needs any more. Blobs are shared by the store's
/// containers, so what one needs is kept for all.
///
/// **What is needed** (per container, replaying its journal from the
/// newest snapshot before the retention limit): every blob of every node
/// state as of the limit — the tree as it was then, so every version that
/// was current at some moment within the period restores — and of every
/// state committed within the period; every snapshot's parts. Not needed:
/// the content of items removed from Recently Deleted for good (`trash
/// --empty`: deleted at or before `trashEmptiedThrough`, not brought back,
/// and not replaced by a save), once no other state names it.
///
/// **Safe with devices at work.** A blob is removed only when it was
/// unneeded and unchanged (not written or kept alive) for `grace` in two
/// runs at least `grace` apart: the first *marks* it (`gc/state.json`), a
/// later one *sweeps* what is still unneeded, checking each blob's time
/// again just before removing it. A device that relies on a blob without
/// writing it (deduplicated content, a pack it reuses) keeps it alive
/// (`Store.needsUpload`, `Store.keepAlive`): a blob a record is about to
/// name is never one unchanged for `grace`. A device offline for a long
/// time uploads what it pushes (its own content) and needs nothing old; a
/// snapshot being read is kept (all snapshots are, until the journal is
/// compacted past them).
///
/// **Compacting the journal** (stores of format 3): records older than the
/// retention period plus `grace` go, up to the newest snapshot among them,
/// which becomes the journal's *base* (`Store.setJournalBase`, set before
/// anything is removed), with the snapshots older than it. A device that had
/// not applied them rejoins from that snapshot (`Rejoin.swift`).
public struct Collector: Sendable {
    public let store: any Store
    let logger: Logger

    /// How long a blob must stay unneeded and unchanged before it goes
    /// (and at least how far apart the marking and the sweeping runs are).
    public static let defaultGrace: TimeInterval = 2 * BlobLifetime.refreshAge

    public init(store: any Store, logger: Logger) {
        self.store = store
        self.logger = logger
    }

    public struct Report: Sendable, Codable, Equatable {
        /// Blobs the store holds, and how many bytes.
        public var blobs = 0
        public var bytes: UInt64 = 0
        /// Blobs something within a retention period needs.
        public var needed = 0
        /// Unneeded blobs marked by this run (removed by a run `grace` later).
        public var marked = 0
        /// Blobs removed by this run, and their bytes.
        public var removed = 0
        public var removedBytes: UInt64 = 0
        /// Journal records and snapshot records removed by this run.
        public var recordsRemoved = 0
        public var snapshotsRemoved = 0
    }

    /// What `gc/state.json` holds: when the blobs were marked, and which.
    struct State: Codable {
        var version = 1
        var marked: Date
        var blobs: [String]
    }

    /// One run: compute what is needed, sweep what an earlier run (at
    /// least `grace` ago) marked and is still unneeded, mark the rest.
    /// `now` is the clock the retention periods are measured by.
    public func run(now: Date = Date(), grace: TimeInterval = Collector.defaultGrace) throws -> Report {
        let needed = try neededBlobs(now: now)
        var report = Report()
        if store.compactsJournal {
            for config in try store.containers().configs {
                try compactJournal(of: config, now: now, grace: grace, report: &report)
            }
        }
        let blobs = try store.listBlobs()
        report.blobs = blobs.count
        report.bytes = blobs.reduce(0) { $0 + $1.size }
        report.needed = blobs.filter { needed.contains($0.hash) }.count
        let unneeded = blobs.filter { !needed.contains($0.hash) && now.timeIntervalSince($0.modified) >= grace }
        let previous = try store.collectorState().flatMap { try? Self.decoder.decode(State.self, from: $0) }
        var swept: Set<String> = []
        if let previous, now.timeIntervalSince(previous.marked) >= grace {
            let marked = Set(previous.blobs)
            for blob in unneeded where marked.contains(blob.hash) {
                // Unchanged since it was marked: nobody wrote it or kept it alive.
                if try store.removeBlob(blob.hash, unchangedSince: previous.marked) {
                    report.removed += 1
                    report.removedBytes += blob.size
                }
                swept.insert(blob.hash)
            }
        } else if let previous {
            // Marked less than `grace` ago: its marks stand until a later run sweeps them.
            report.marked = previous.blobs.count
            return report
        }
        let marks = unneeded.map(\.hash).filter { !swept.contains($0) }
        report.marked = marks.count
        try store.setCollectorState(try Self.encoder.encode(State(marked: now, blobs: marks.sorted())))
        logger.info("collector: \(report.blobs) blobs (\(report.bytes) bytes), \(report.needed) needed, \(report.removed) removed (\(report.removedBytes) bytes), \(report.marked) marked; \(report.recordsRemoved) journal records and \(report.snapshotsRemoved) snapshots removed")
        return report
    }

    /// Remove the records of `config`'s container older than the retention
    /// period plus `grace`, up to the newest snapshot among them (which must
    /// read whole first), and the snapshots before it; that snapshot's
    /// record becomes the journal's base, set before anything is removed.
    func compactJournal(of config: ContainerConfig, now: Date, grace: TimeInterval, report: inout Report) throws {
        let container = config.id
        let base = try store.journalBase(container: container)
        let cutoff = Timespec(nanoseconds: Int64((now.timeIntervalSince1970 - config.retention - grace) * 1e9))
        let limit = try JournalSearch.firstRecord(in: store, container: container, since: cutoff, after: base)
        let snapshots = try store.snapshots(container: container)
        guard let target = snapshots.last(where: { $0 > base && $0 < limit }) else { return }
        guard let record = try store.snapshot(container: container, seq: target),
              (try? record.parts.enumerated().map({ try SnapshotPart.decode(try store.fetchBlob($0.element), index: $0.offset, seq: target) })) != nil else {
            logger.warning("collector: the snapshot of record \(target) of \(container) cannot be read whole: the journal is not compacted")
            return
        }
        try store.setJournalBase(container: container, target)
        for seq in (base + 1)...target {
            try store.removeRecord(container: container, seq: seq)
            report.recordsRemoved += 1
        }
        for seq in snapshots where seq < target {
            try store.removeSnapshot(container: container, seq: seq)
            report.snapshotsRemoved += 1
        }
        logger.info("collector: journal of \(container) compacted up to record \(target) (its snapshot is the base now)")
    }

    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }()
    static let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }()

    /// Every blob something within a retention period needs, in every
    /// container. A container whose journal or configuration cannot be
    /// read stops the run: nothing is removed on a partial view.
    func neededBlobs(now: Date) throws -> Set<String> {
        let listing = try store.containers()
        if let damaged = listing.damaged.first {
            throw UbiquityError(EIO, "container \(damaged.id)'s configuration is damaged (\(damaged.problem)): nothing collected")
        }
        var needed: Set<String> = []
        var manifests: [String: [String]] = [:]
        for config in listing.configs {
            try needed.formUnion(neededBlobs(of: config, now: now, manifests: &manifests))
        }
        return needed
    }

    func neededBlobs(of config: ContainerConfig, now: Date, manifests: inout [String: [String]]) throws -> Set<String> {
        let container = config.id
        let cutoff = Timespec(nanoseconds: Int64((now.timeIntervalSince1970 - config.retention) * 1e9))
        let emptiedThrough = config.trashEmptiedThrough ?? 0
        var needed: Set<String> = []
        var states: [NodeID: NodeState] = [:]
        // Snapshots are kept whole: a new device may be reading one.
        let snapshots = try store.snapshots(container: container)
        for seq in snapshots {
            guard let record = try store.snapshot(container: container, seq: seq) else { continue }
            needed.formUnion(record.parts)
        }
        let base = store.compactsJournal ? try store.journalBase(container: container) : 0
        let limit = try JournalSearch.firstRecord(in: store, container: container, since: cutoff, after: base)
        var next: UInt64 = base + 1
        if let start = snapshots.last(where: { $0 >= base && $0 < limit }), let record = try store.snapshot(container: container, seq: start) {
            for (index, hash) in record.parts.enumerated() {
                guard let part = try? SnapshotPart.decode(try store.fetchBlob(hash), index: index, seq: start) else {
                    throw UbiquityError(EIO, "snapshot \(start) of \(container) cannot be read: nothing collected")
                }
                for case .node(let state) in part.changeSet.changes { states[state.id] = state }
            }
            next = start + 1
        }
        // Replay: the tree at the limit, then every state within the period.
        var atLimit: [NodeID: NodeState]?
        var withinPeriod: [NodeState] = []
        var deletedAt: [NodeID: UInt64] = [:]
        var entries: [String: NodeID] = [:]
        var replaced: Set<NodeID> = []
        while true {
            let records = try store.journal(container: container, after: next - 1, limit: 256)
            guard let last = records.last else { break }
            for record in records {
                if record.seq >= limit && atLimit == nil { atLimit = states }
                guard let set = record.changeSet else { continue }
                for change in set.changes {
                    switch change {
                    case .node(let state):
                        states[state.id] = state
                        deletedAt[state.id] = nil
                        if record.seq >= limit { withinPeriod.append(state) }
                    case .entry(let parent, let name, let child):
                        let key = parent + "/" + name.description
                        if let child, let previous = entries[key], previous != child, states[child]?.kind == .file { replaced.insert(previous) }
                        entries[key] = child
                    case .deleteNode(let id, _):
                        states[id] = nil
                        deletedAt[id] = record.seq
                    }
                }
            }
            next = last.seq + 1
        }
        let tree = atLimit ?? states
        // Emptied from Recently Deleted for good: their content goes.
        let emptied = Set(deletedAt.filter { $0.value <= emptiedThrough && !replaced.contains($0.key) }.keys)
        for state in Array(tree.values) + withinPeriod + Array(states.values) where !emptied.contains(state.id) {
            guard state.kind == .file, let hash = state.hash else { continue }
            needed.insert(hash)
            if let pack = state.pack { needed.insert(pack.hash) }
            if state.chunked == true {
                if manifests[hash] == nil {
                    guard let manifest = try? ChunkManifest.decode(try store.fetchBlob(hash)) else {
                        // A lost manifest: its chunks cannot be told apart; nothing is removed.
                        throw UbiquityError(EIO, "chunk manifest \(hash) of \(container) cannot be read: nothing collected")
                    }
                    manifests[hash] = manifest.chunks
                }
                needed.formUnion(manifests[hash] ?? [])
            }
        }
        return needed
    }
}

/// Finding journal records by date.
enum JournalSearch {
    /// The first record of `container` after `base` (the journal's base:
    /// records up to it may be gone) committed at `cutoff` or later (head + 1
    /// when none is), by bisection: dates follow record numbers, give or
    /// take the devices' clocks.
    static func firstRecord(in store: any Store, container: String, since cutoff: Timespec,
                            after base: UInt64 = 0, below upper: UInt64? = nil) throws -> UInt64 {
        var high: UInt64
        if let upper {
            high = upper
        } else {
            // The head: doubling, then bisection.
            var step: UInt64 = 1
            while try !store.journal(container: container, after: base + step - 1, limit: 1).isEmpty { step *= 2 }
            var low = base + step / 2, top = base + step
            while low + 1 < top {
                let middle = low + (top - low) / 2
                if try store.journal(container: container, after: middle - 1, limit: 1).isEmpty { top = middle } else { low = middle }
            }
            high = low + 1
        }
        var low: UInt64 = base + 1
        while low < high {
            let middle = low + (high - low) / 2
            let record = try store.journal(container: container, after: middle - 1, limit: 1).first
            if let date = record?.changeSet?.date, date < cutoff { low = middle + 1 } else { high = middle }
        }
        return low
    }
}
