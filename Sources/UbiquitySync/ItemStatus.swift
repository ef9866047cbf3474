import Foundation
import UbiquityReplica
import UbiquityProtocol
import UbiquityModel

/// One item as a metadata query sees it.
public struct ItemRecord: Sendable {
    public var ino: UInt64
    /// Path from the container's root, starting with "/".
    public var path: String
    public var name: String
    public var isDirectory: Bool
    public var size: UInt64
    public var created: Timespec
    public var modified: Timespec
    public var status: ItemStatus

    public init(ino: UInt64, path: String, name: String, isDirectory: Bool, size: UInt64,
                created: Timespec, modified: Timespec, status: ItemStatus) {
        self.ino = ino
        self.path = path
        self.name = name
        self.isDirectory = isDirectory
        self.size = size
        self.created = created
        self.modified = modified
        self.status = status
    }
}

/// One item as a query's scan sees it (`SyncEngine.scanItems`): what the
/// node says, read in place, its name as stored and its directory's path; the
/// name and path strings are made only when read.
public struct ItemView: Sendable {
    public let ino: UInt64
    public let fileName: FileName
    /// The path of the item's directory from the container's root ("" for the root).
    public let directory: String
    /// The directory's path as the caller of the scan shows it (`showDirectory`).
    public let shownDirectory: String
    public let isDirectory: Bool
    public let size: UInt64
    public let created: Timespec
    public let modified: Timespec
    /// Its sync status, if the scan was asked for it.
    public let status: ItemStatus?

    public var name: String { fileName.description }
    /// The path from the container's root.
    public var path: String { directory + "/" + fileName.description }
}

extension ItemStatus {
    /// A status that was not read (what a view without status reports):
    /// current and uploaded.
    public static let unread = ItemStatus(
        downloadingStatus: "current", isDownloading: false, percentDownloaded: 100, isUploaded: true, isUploading: false,
        hasUnresolvedConflicts: false, conflicts: 0, downloadingError: nil, uploadingError: nil, pinned: false)

    static func make(_ node: LocalNode, pinned: Bool, download: DownloadBoard.Job?, sync: SyncStatus) -> ItemStatus {
        let local = node.kind != .file || node.hasContent
        let downloading = download.map { !$0.done && $0.error == nil } ?? false
        var percent = local ? 100 : 0
        if let download, download.total > 0, !local {
            percent = Int(min(100, download.verified * 100 / download.total))
        }
        let unpushed = node.hasUnpushedMetadata || node.hasUnpushedContent
        return ItemStatus(
            downloadingStatus: local ? (downloading ? "downloaded" : "current") : "notDownloaded",
            isDownloading: downloading,
            percentDownloaded: percent,
            isUploaded: !unpushed,
            isUploading: unpushed && node.openWriters == 0 && sync.storeReachable,
            hasUnresolvedConflicts: !node.conflicts.isEmpty,
            conflicts: node.conflicts.count,
            downloadingError: download?.error?.message,
            uploadingError: unpushed && !sync.storeReachable ? sync.lastError : nil,
            pinned: pinned)
    }
}

extension SyncEngine {
    public func itemStatus(ino: UInt64) -> ItemStatus? {
        let jobs = downloads.withJobs { $0 }
        let sync = currentStatus
        return replica.read { ns -> ItemStatus? in
            guard let node = ns.node(ino) else { return nil }
            return ItemStatus.make(node, pinned: ns.isPinned(ino), download: jobs[DownloadBoard.JobKey(ino: ino, hash: node.hash)], sync: sync)
        }
    }

    /// Every item of the container (below `root`), with its status — one
    /// pass under the namespace lock.
    public func items(under root: UInt64 = Namespace.rootIno) -> [ItemRecord] {
        scanItems(under: root, status: true) { _ in true }
    }

    /// The records of the items (below `root`) that `keep` keeps, in one pass
    /// under the namespace lock. `keep` sees each item as an `ItemView`, read
    /// in place: no path, no name string and no status are made for an item
    /// unless `keep` asks for them (`status`: whether views carry their status,
    /// for a test that reads it); whole records are built for the kept items only.
    /// `showDirectory` gives, once per directory, the directory's path as the
    /// caller shows it (`ItemView.shownDirectory`; by default as it is).
    public func scanItems(under root: UInt64 = Namespace.rootIno, status: Bool,
                          showDirectory: (String) -> String = { $0 },
                          _ keep: (ItemView) -> Bool) -> [ItemRecord] {
        let jobs = downloads.withJobs { $0 }
        let sync = currentStatus
        return replica.read { ns in
            Self.scanItems(in: ns, under: root, sync: sync, jobs: jobs, status: status, showDirectory: showDirectory, keep)
        }
    }

    /// Items of a namespace (also for a replica read without a daemon).
    public static func collectItems(in ns: Namespace, under root: UInt64 = Namespace.rootIno,
                                    sync: SyncStatus = SyncStatus()) -> [ItemRecord] {
        scanItems(in: ns, under: root, sync: sync, jobs: [:], status: true) { _ in true }
    }

    /// `scanItems` over a namespace read without a daemon.
    public static func scanItems(in ns: Namespace, under root: UInt64 = Namespace.rootIno, sync: SyncStatus = SyncStatus(),
                                 status: Bool, showDirectory: (String) -> String = { $0 },
                                 _ keep: (ItemView) -> Bool) -> [ItemRecord] {
        scanItems(in: ns, under: root, sync: sync, jobs: [:], status: status, showDirectory: showDirectory, keep)
    }

    static func scanItems(in ns: Namespace, under root: UInt64, sync: SyncStatus,
                          jobs: [DownloadBoard.JobKey: DownloadBoard.Job], status: Bool,
                          showDirectory: (String) -> String = { $0 },
                          _ keep: (ItemView) -> Bool) -> [ItemRecord] {
        var out: [ItemRecord] = []
        var stack: [(UInt64, String, Bool)] = [(root, "", ns.node(root)?.pinned ?? false)]
        while let (dir, prefix, pinnedAbove) = stack.popLast() {
            guard let entries = ns.children[dir] else { continue }
            let shownPrefix = showDirectory(prefix)
            for (name, entry) in entries {
                // Only what the view shows is read, in place: a whole node
                // (`LocalNode`) is made for a status or a kept item only.
                guard let summary = ns.nodes.summary(entry.ino) else { continue }
                let pinned = pinnedAbove || summary.pinned
                let isDirectory = summary.kind == .directory
                func itemStatus() -> ItemStatus {
                    let node = ns.nodes[entry.ino]!
                    // (No job key to hash when nothing downloads, the usual case.)
                    let job = jobs.isEmpty ? nil : jobs[DownloadBoard.JobKey(ino: entry.ino, hash: node.hash)]
                    return ItemStatus.make(node, pinned: pinned, download: job, sync: sync)
                }
                let view = ItemView(ino: entry.ino, fileName: name, directory: prefix, shownDirectory: shownPrefix,
                                    isDirectory: isDirectory, size: summary.size,
                                    created: summary.btime, modified: summary.mtime,
                                    status: status ? itemStatus() : nil)
                if keep(view) {
                    out.append(ItemRecord(ino: entry.ino, path: view.path, name: view.name,
                                          isDirectory: isDirectory, size: summary.size,
                                          created: summary.btime, modified: summary.mtime,
                                          status: view.status ?? itemStatus()))
                }
                if isDirectory { stack.append((entry.ino, view.path, pinned)) }
            }
        }
        return out
    }

    /// What a watch needs to look at again since `seq` and `structure` (the
    /// values it got last time): the items changed, plus those downloading
    /// (their progress moves without a change of their node); nil inos when
    /// it must read every item again.
    public func itemChanges(since seq: UInt64, structure: UInt64) -> (seq: UInt64, structure: UInt64, inos: Set<UInt64>?) {
        let downloading = downloads.withJobs { Set($0.keys.map(\.ino)) }
        return replica.read { ns in
            let changed = ns.structureSeq == structure ? ns.itemsChanged(since: seq) : nil
            return (ns.itemChangeSeq, ns.structureSeq, changed.map { $0.union(downloading) })
        }
    }

    /// The items `inos` as a query sees them (one record per name of each).
    public func items(_ inos: Set<UInt64>) -> [ItemRecord] {
        let jobs = downloads.withJobs { $0 }
        let sync = currentStatus
        return replica.read { ns in
            var out: [ItemRecord] = []
            for ino in inos {
                guard let node = ns.node(ino) else { continue }
                for key in ns.entriesNaming(ino) {
                    guard let prefix = ns.directoryPath(key.parent) else { continue }
                    out.append(ItemRecord(ino: ino, path: prefix + "/" + key.name.description, name: key.name.description,
                                          isDirectory: node.kind == .directory, size: node.size,
                                          created: node.btime, modified: node.mtime,
                                          status: ItemStatus.make(node, pinned: ns.isPinned(ino),
                                                                  download: jobs[DownloadBoard.JobKey(ino: ino, hash: node.hash)], sync: sync)))
                }
            }
            return out
        }
    }

    /// Moves whenever what a query could see may have changed (local
    /// changes, pulls, download progress, evictions, pins): a watch
    /// recomputes only then.
    public var changeGeneration: UInt64 {
        let local = replica.read { ns in
            ns.pushWork &+ ns.appliedSeq &* 1_000_003 &+ ns.itemChangeSeq &* 8_191 &+ ns.structureSeq &* 131_071
        }
        let transfers = downloads.withJobs { jobs in jobs.values.reduce(UInt64(jobs.count)) { $0 &+ $1.verified } }
        return local &+ transfers &* 7
    }

    /// The read-only `user.ubiquity.*` attributes: `status` (the item's
    /// status as JSON), `percent` (downloaded, 0–100), `conflicts` (number of
    /// unresolved conflict versions).
    public func statusAttribute(ino: UInt64, name: String) -> Data? {
        guard let status = itemStatus(ino: ino) else { return nil }
        switch name {
        case "user.ubiquity.status":
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            return try? encoder.encode(status)
        case "user.ubiquity.percent": return Data(String(status.percentDownloaded).utf8)
        case "user.ubiquity.conflicts": return Data(String(status.conflicts).utf8)
        default: return nil
        }
    }
}
