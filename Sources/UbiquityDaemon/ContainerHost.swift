import Foundation
import Logging
import UbiquityLocks
import UbiquityFS
import UbiquityFUSE
import UbiquityProtocol
import UbiquityReplica
import UbiquityModel
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// One container open in the daemon: its replica and sync engine, shared by
/// every mount that shows part of it (a drive's folder, a `--scope data`
/// mount…). Pulled changes are passed on to each of those mounts' kernels.
///
/// Lock order: `sessions` is taken alone (copied, then used).
final class ContainerHost: @unchecked Sendable, ReplicaObserver {
    let id: String
    let replica: Replica
    let engine: SyncEngine
    /// The whole container, as the daemon itself edits it (the Documents folder).
    let base: FileSystem
    /// Mounts using this container (the daemon closes it when none is left).
    let users = Lock(0)

    /// A mount's kernel: its session, how replica inodes map to its numbers,
    /// and how the container shows in it now (nil: not shown).
    struct Viewer {
        var session: FUSESession
        var kernelIno: @Sendable (UInt64) -> UInt64?
        var view: @Sendable () -> KernelView?
    }
    let viewers = Lock<[ObjectIdentifier: Viewer]>([:])

    static let documents = FileName("Documents")
    /// The Documents folder's node ID, the same on every device (see `wellKnownDirectory`).
    static let documentsID: NodeID = "documents"

    /// The device's coordinator: a pull writes as a coordinated writer.
    let coordinator: Coordinator
    let logger: Logger

    init(id: String, replica: Replica, engine: SyncEngine, coordinator: Coordinator, logger: Logger) {
        self.id = id
        self.replica = replica
        self.engine = engine
        self.coordinator = coordinator
        self.logger = logger
        base = FileSystem(replica: replica, hooks: engine)
    }

    /// Longest a pull waits for coordinated readers and writers of what it changes.
    static let pullWaitLimit = 30.0

    /// A pull changes items as a coordinated writer: their presenters in
    /// every process are asked to let go, then it waits for coordinated
    /// accesses to them to end (at most `pullWaitLimit`: a client holding an
    /// item longer does not stop this device's sync; logged).
    func pullWillChange(_ paths: () -> [String]) -> (@Sendable () -> Void)? {
        guard !coordinator.isIdle(container: id) else { return nil }
        let keys = paths().map { $0 == "/" ? id : id + $0 }
        guard !keys.isEmpty else { return nil }
        let coordinator = self.coordinator
        let asks = coordinator.askPresenters(reads: [], writes: keys, deletes: [], except: nil)
        let token = coordinator.acquire(reads: [], writes: keys, deadline: Date().addingTimeInterval(Self.pullWaitLimit),
                                        abandoned: { false })
        if token == nil {
            logger.warning("\(id): coordinated access to \(keys.prefix(3).joined(separator: ", ")) held more than \(Int(Self.pullWaitLimit)) s: the pulled changes are applied under it")
        }
        return {
            if let token { coordinator.release(token) }
            coordinator.reacquire(asks)
        }
    }

    /// Drop what each mount's kernel cached of what a pull changed, then
    /// have it raise the events a local program's changes would have
    /// (`KernelEventScript`, performed by the mount's `KernelEventReplay`).
    func replicaChanged(_ changes: ReplicaChanges) {
        for viewer in viewers.withLock({ Array($0.values) }) {
            // (A drive's hidden container folder: its inodes may still be held, by a cwd or a descriptor.)
            viewer.session.invalidate(changes, kernelIno: viewer.kernelIno)
            guard let view = viewer.view(), let events = viewer.session.events else { continue }
            events.enqueue(replica.read { ns in KernelEventScript.build(changes, in: ns, view: view) })
        }
    }

    func addViewer(_ session: FUSESession, kernelIno: @escaping @Sendable (UInt64) -> UInt64?,
                   view: @escaping @Sendable () -> KernelView?) {
        viewers.withLock { $0[ObjectIdentifier(session)] = Viewer(session: session, kernelIno: kernelIno, view: view) }
    }

    func removeViewer(_ session: FUSESession) {
        _ = viewers.withLock { $0.removeValue(forKey: ObjectIdentifier(session)) }
    }

    /// The Documents folder's inode, created if missing.
    func documentsFolder() throws -> UInt64 {
        try base.wellKnownDirectory(Self.documents, id: Self.documentsID,
                                    owner: Caller(uid: getuid(), gid: getgid(), pid: getpid()))
    }

    /// A FileSystem showing `scope` of this container, for one mount.
    /// `documents` enforces the container's folder levels.
    func view(_ scope: Scope, folderLevels: ContainerConfig.FolderLevels) throws -> FileSystem {
        var options = FileSystemOptions()
        options.beforeLongWait = FUSESession.beforeLongWait
        switch scope {
        case .all:
            break
        case .data:
            options.view = ViewRoot(hidden: Self.documents)
        case .documents:
            let limit: Int? = switch folderLevels {
            case .none: 0
            case .one: 1
            case .any: nil
            }
            options.view = ViewRoot(root: try documentsFolder(), folderLimit: limit)
        }
        return FileSystem(replica: replica, hooks: engine, options: options)
    }

    /// Paths from the container's root of the items a scope shows.
    func resolve(_ path: [FileName], scope: Scope) throws -> UInt64 {
        var full = path
        switch scope {
        case .documents: full = [Self.documents] + path
        case .data: if path.first == Self.documents { throw UbiquityError(ENOENT, "Documents is not in the Data scope") }
        case .all: break
        }
        guard let ino = replica.read({ ns in ns.resolve(full) }) else {
            throw UbiquityError(ENOENT, "/\(path.map(\.description).joined(separator: "/")): no such item")
        }
        return ino
    }
}
