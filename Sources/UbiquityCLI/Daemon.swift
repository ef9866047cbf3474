import Foundation
import Logging
import Synchronization
import UbiquityFS
import UbiquityFUSE
import UbiquityReplica
import UbiquityStore
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// What `mount` needs, after argument parsing.
struct MountRequest: Sendable {
    var mountpoint: String
    var storePath: String?
    var container: String
    var fuseOptions: [String]
    var foreground: Bool
    /// Seconds between journal polls (the folder store also wakes the puller through inotify).
    var pollInterval: Double
    /// Bytes of downloaded content to keep at most.
    var cacheLimit: UInt64?
    /// This device's name (shown in conflicted-copy names); default: the host name.
    var deviceName: String?
    /// What part of the container the mount shows.
    var scope: QueryService.Scope = .all
    /// Write "ready"/"error" here (the background parent waits on it).
    var notifyFD: Int32?
}

/// One mounted container: opens the store and the replica, mounts FUSE,
/// serves the control socket, runs the sync engine, and shuts all of it
/// down in order when the filesystem is unmounted or a signal arrives.
final class Daemon: @unchecked Sendable {
    static let defaultContainer = "com.ubiquityfs.default"

    let request: MountRequest
    let locations = Locations()
    var logger = Logger(label: "ubiquityfs")
    /// A client waiting for the unmount to finish (told when everything is pushed).
    let unmountWaiter = Mutex<ControlConnection?>(nil)
    /// Why the store could not be reached at mount time (the mount then starts offline).
    var offlineReason: String?

    init(request: MountRequest) {
        self.request = request
    }

    /// Check the mountpoint: exists, is a directory, is empty, is not mounted.
    static func validateMountpoint(_ path: String) throws -> String {
        var st = stat()
        guard stat(path, &st) == 0 else {
            let code = errno
            if code == ENOTCONN { throw UbiquityError(EBUSY, "\(path) is a dead FUSE mount; clean it with: fusermount3 -u -z \(path)") }
            throw UbiquityError(code, "mountpoint \(path): \(String(cString: strerror(code)))")
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else { throw UbiquityError(ENOTDIR, "mountpoint \(path) is not a directory") }
        guard let resolved = realpath(path, nil) else { throw UbiquityError.posix("resolve \(path)") }
        let absolute = String(cString: resolved)
        free(resolved)
        if Unmounter.isMountpoint(absolute) { throw UbiquityError(EBUSY, "\(absolute) is already mounted") }
        let contents = (try? FileManager.default.contentsOfDirectory(atPath: absolute)) ?? []
        guard contents.isEmpty else { throw UbiquityError(ENOTEMPTY, "mountpoint \(absolute) is not empty") }
        return absolute
    }

    /// Open the store: the default one is created on first use; an explicit
    /// one must exist, and an empty folder becomes a store only if this
    /// device has never used a store there.
    func openStore() throws -> FolderStore {
        let isDefault = request.storePath == nil
        let path = request.storePath.map { URL(fileURLWithPath: $0).standardizedFileURL } ?? locations.defaultStore
        let knownFile = locations.dataHome.appendingPathComponent("known-stores")
            .appendingPathComponent(ContentCopy.hash(of: Data(path.path.utf8)))
        let knownID = (try? String(contentsOf: knownFile, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        let store: FolderStore
        do {
            store = try FolderStore(root: path, create: isDefault && knownID == nil, initializeEmpty: knownID == nil)
        } catch let error as UbiquityError where knownID != nil && [ENOENT, EHOSTDOWN, EACCES, ENOTDIR, EINVAL].contains(error.errno) {
            // A store this device has used: missing, emptied, unreadable or unmounted
            // means unreachable — never "everything was deleted". Work offline.
            offlineReason = error.description
            return FolderStore(unreachableAt: path, storeID: knownID!)
        }
        if let knownID, knownID != store.storeID {
            throw UbiquityError(EINVAL, "\(path.path) now holds a different store than the one this device used there; refusing to mix them")
        }
        try? FileManager.default.createDirectory(at: knownFile.deletingLastPathComponent(), withIntermediateDirectories: true)
        try? store.storeID.write(to: knownFile, atomically: true, encoding: .utf8)
        return store
    }

    /// Run until unmounted. Calls `ready` once the mount is usable.
    func run() throws {
        // Few malloc arenas: 16 FUSE threads must not each keep their own heap.
        LinuxCalls.limitMallocArenas(2)
        let mountpoint = try Self.validateMountpoint(request.mountpoint)
        try ContainerConfig.validate(id: request.container)
        let device = try DeviceIdentity.load(dataHome: locations.dataHome, name: request.deviceName)
        let store = try openStore()
        let replicaDir = locations.replica(storeID: store.storeID, container: request.container)
        if offlineReason == nil, try store.containerConfig(request.container) == nil {
            do {
                try store.createContainer(ContainerConfig(id: request.container,
                                                          displayName: request.container == Self.defaultContainer ? "Documents" : request.container))
            } catch let error as UbiquityError where error.errno == EEXIST {}   // another device created it just now
        } else if let offlineReason, !FileManager.default.fileExists(atPath: replicaDir.appendingPathComponent("index.sqlite").path) {
            throw UbiquityError(EHOSTDOWN, "\(offlineReason); this device has no replica of \(request.container) to work offline with")
        }
        let replica = try Replica(directory: replicaDir, rootOwner: (getuid(), getgid()))

        // Logs: the replica's daemon.log, plus stderr in the foreground.
        let logPath = replicaDir.appendingPathComponent("daemon.log").path
        let logFD = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        var descriptors: [Int32] = logFD >= 0 ? [logFD] : []
        if request.foreground && request.notifyFD == nil { descriptors.append(STDERR_FILENO) }
        if request.notifyFD != nil, logFD >= 0 { dup2(logFD, STDERR_FILENO) }   // crash reports land in the log
        LogSetup.bootstrap(descriptors: descriptors, level: ProcessInfo.processInfo.environment["UBIQUITYFS_DEBUG"] != nil ? .debug : .info)
        logger = Logger(label: "ubiquityfs")
        logger.info("mounting \(request.container) of store \(store.root.path) at \(mountpoint) (device \(device.name) \(device.id))")
        if let offlineReason { logger.warning("the store is unreachable (\(offlineReason)); working offline, changes are queued") }

        let engine = SyncEngine(replica: replica, store: Self.withInjectedFaults(store), container: request.container, device: device,
                                logger: logger, cacheLimit: request.cacheLimit)
        do {
            let changed = try engine.pull()
            logger.info("caught up with the store: \(changed.count) changes applied")
        } catch {
            logger.warning("could not catch up with the store, serving the local replica: \(error)")
            engine.record(error: error)
        }
        var options = FileSystemOptions()
        options.view = try viewRoot(replica: replica, engine: engine, store: store)
        let fileSystem = FileSystem(replica: replica, hooks: engine, options: options)
        let session = FUSESession(fileSystem: fileSystem, mountpoint: mountpoint, logger: logger)
        var mountOptions = ["default_permissions", "fsname=ubiquityfs", "subtype=ubiquityfs"]
        if geteuid() == 0 { mountOptions.append("allow_other") }
        mountOptions += request.fuseOptions
        try session.mount(options: mountOptions)

        let socketPath = locations.controlSocket(mountpoint: mountpoint).path
        let control: ControlServer
        do {
            control = try ControlServer(path: socketPath, logger: logger) { [self] req, connection in
                handleControl(req, connection, engine: engine, replica: replica, mountpoint: mountpoint)
            }
        } catch {
            session.close()
            throw error
        }
        control.start()
        engine.start(pollInterval: request.pollInterval, observer: session)
        logger.info("mounted at \(mountpoint)")
        if let fd = request.notifyFD {
            Self.notify(fd, "ready pid \(getpid()) log \(logPath)")
            let devNull = open("/dev/null", O_RDWR)
            dup2(devNull, STDIN_FILENO)
            dup2(devNull, STDOUT_FILENO)
            close(devNull)
        }

        let status = session.run()
        logger.info("FUSE loop ended (status \(status)); shutting down")
        session.close()
        control.stop()
        engine.stop()
        // A waiting `ubiquityfs unmount` asked for everything to be pushed.
        let waiter = unmountWaiter.withLock { $0 }
        var answer: [String: Any] = ["ok": true]
        if let waiter {
            do {
                try engine.drain(progress: { items, bytes in
                    waiter.send(["progress": ["items": items, "bytes": bytes]])
                })
            } catch {
                answer = ["error": "\(error)"]
            }
        }
        try? replica.persist()
        let pending = replica.withNamespace { ns in ns.pendingSummary() }
        logger.info("stopped; \(pending.items) items (\(pending.bytes) bytes) left in the queue for the next mount")
        // The replica is free before `unmount` returns: mounting again at once works.
        replica.releaseLock()
        waiter?.send(answer)
        waiter?.close(force: true)
    }

    func handleControl(_ req: [String: Any], _ connection: ControlConnection, engine: SyncEngine,
                       replica: Replica, mountpoint: String) {
        defer { connection.close() }
        let paths = (req["paths"] as? [[String]] ?? []).map { $0.map { FileName($0) } }
        switch req["command"] as? String {
        case "status":
            connection.send(["status": statusReport(engine: engine, replica: replica, mountpoint: mountpoint)])
        case "download":
            contentCommand(paths, connection, replica) { inos in
                try downloadAll(inos, recursive: req["recursive"] as? Bool ?? false, engine: engine, replica: replica,
                                connection: connection)
            }
        case "evict":
            contentCommand(paths, connection, replica) { inos in
                var evicted = 0
                var refused: [String] = []
                for ino in inos {
                    for file in replica.withNamespace({ ns in ns.files(under: ino) }) {
                        do {
                            if try engine.evict(ino: file) { evicted += 1 }
                        } catch {
                            let path = replica.withNamespace { ns in ns.path(of: file) } ?? "inode \(file)"
                            refused.append("\(path): \(UbiquityError.wrap(error))")
                        }
                    }
                }
                if !refused.isEmpty { throw UbiquityError(EBUSY, "not evicted: " + refused.joined(separator: "; ")) }
                connection.send(["done": ["evicted": evicted]])
            }
        case "pin", "unpin":
            let pin = req["command"] as? String == "pin"
            contentCommand(paths, connection, replica) { inos in
                for ino in inos { try engine.setPinned(ino: ino, pin) }
                connection.send(["done": ["items": inos.count]])
            }
        case "query":
            QueryService.serve(req, connection: connection, engine: engine)
        case "versions":
            contentCommand(paths, connection, replica) { inos in
                for ino in inos {
                    let list = try engine.versions(ino: ino).map { v -> [String: Any] in
                        ["label": v.label, "path": v.path, "device": v.device, "size": v.size,
                         "modified": isoDate( Date(timeIntervalSince1970: Double(v.modified.sec)))]
                    }
                    connection.send(["versions": list])
                }
            }
        case "resolve":
            contentCommand(paths, connection, replica) { inos in
                let keep = req["keep"] as? String ?? ""
                let choice: ConflictChoice
                switch keep {
                case "current": choice = .current
                case "both": choice = .both
                default:
                    guard let number = Int(keep) else {
                        throw UbiquityError(EINVAL, "--keep takes current, both, or a version number from `ubiquityfs versions`")
                    }
                    choice = .version(number)
                }
                for ino in inos { try engine.resolve(ino: ino, keep: choice) }
            }
        case "unmount":
            let clientAlive = Mutex(true)
            do {
                try engine.drain(progress: { items, bytes in
                    if !connection.send(["progress": ["items": items, "bytes": bytes]]) { clientAlive.withLock { $0 = false } }
                }, shouldContinue: { clientAlive.withLock { $0 } })
                guard clientAlive.withLock({ $0 }) else { return }
                // Anything still pending is held open for writing: the unmount below reports EBUSY.
                unmountWaiter.withLock { $0 = connection }
                try Unmounter.unmount(mountpoint, lazy: false)
                // The FUSE loop ends now; `run` finishes the queue, answers and closes.
                connection.keepOpen()
            } catch let error as UbiquityError where error.errno == EBUSY {
                unmountWaiter.withLock { $0 = nil }
                connection.send(["error": "\(error)"])
            } catch {
                unmountWaiter.withLock { $0 = nil }
                let pending = replica.withNamespace { ns in ns.pendingSummary() }
                connection.send(["error": "cannot push to the store (\(UbiquityError.wrap(error))); \(pending.items) items stay queued. `ubiquityfs unmount --force` detaches now and keeps them for the next mount"])
            }
        default:
            connection.send(["error": "unknown command"])
        }
    }

    /// Resolve `paths` (relative to the mount) and run `body` on their inodes;
    /// errors become the reply.
    func contentCommand(_ paths: [[FileName]], _ connection: ControlConnection, _ replica: Replica,
                        _ body: ([UInt64]) throws -> Void) {
        do {
            let inos = try paths.map { path -> UInt64 in
                guard let ino = replica.withNamespace({ ns in ns.resolve(path) }) else {
                    throw UbiquityError(ENOENT, "/\(path.map(\.description).joined(separator: "/")): no such item")
                }
                return ino
            }
            try body(inos)
            connection.send(["ok": true])
        } catch {
            connection.send(["error": "\(UbiquityError.wrap(error))"])
        }
    }

    /// Download every placeholder file named (directories: with `recursive`),
    /// a few at a time, reporting progress.
    func downloadAll(_ inos: [UInt64], recursive: Bool, engine: SyncEngine, replica: Replica,
                     connection: ControlConnection) throws {
        var files: [UInt64] = []
        for ino in inos {
            let isDirectory = replica.withNamespace { ns in ns.node(ino)?.kind == .directory }
            if isDirectory && !recursive {
                throw UbiquityError(EISDIR, "\(replica.withNamespace { ns in ns.path(of: ino) } ?? "item") is a folder: use --recursive")
            }
            files += replica.withNamespace { ns in ns.files(under: ino).filter { ns.node($0)?.isPlaceholder == true } }
        }
        let sizes = replica.withNamespace { ns in files.map { ns.node($0)?.hashSize ?? 0 } }
        let versions = replica.withNamespace { ns in files.map { ns.node($0)?.hash } }
        let totalBytes = sizes.reduce(0, +)
        var doneBytes: UInt64 = 0
        var failures: [String] = []
        var index = 0
        let wave = 4
        while index < files.count {
            let batch = Array(files[index..<min(files.count, index + wave)])
            for file in batch { engine.startDownload(ino: file) }
            for (offset, file) in batch.enumerated() {
                let size = sizes[index + offset]
                var waited = false
                while !waited {
                    do {
                        try engine.waitForContent(ino: file, version: versions[index + offset], upTo: size)
                        waited = true
                    } catch {
                        failures.append("\(replica.withNamespace { ns in ns.path(of: file) } ?? "inode \(file)"): \(UbiquityError.wrap(error))")
                        waited = true
                    }
                }
                doneBytes += size
                connection.send(["progress": ["items": index + offset + 1, "total": files.count,
                                              "bytes": doneBytes, "totalBytes": totalBytes]])
            }
            index += batch.count
        }
        if !failures.isEmpty { throw UbiquityError(EIO, "not downloaded: " + failures.joined(separator: "; ")) }
    }

    func statusReport(engine: SyncEngine, replica: Replica, mountpoint: String) -> [String: Any] {
        let paths = engine.items().map(\.path)
        let documents = paths.filter { QueryService.inScopes($0, [.documents]) }.count
        let pending = replica.withNamespace { ns in ns.pendingSummary() }
        let downloads = engine.downloadSummary()
        let s = engine.currentStatus
        var out: [String: Any] = [
            "pid": Int(getpid()), "mountpoint": mountpoint, "container": request.container,
            "store": engine.storePath, "dataHome": locations.dataHome.path, "items": paths.count, "documentsItems": documents, "dataItems": paths.count - documents,
            "pendingItems": pending.items, "pendingBytes": pending.bytes,
            "downloadingItems": downloads.items, "downloadingBytes": downloads.bytes,
            "cachedBytes": engine.cacheUsage(), "storeReachable": s.storeReachable,
            "pushedChangeSets": s.pushedChangeSets,
            "recentErrors": s.recentErrors.map { ["date": isoDate( $0.date), "message": $0.message] },
        ]
        if let limit = engine.cacheLimit { out["cacheLimitBytes"] = limit }
        if let d = s.lastSync { out["lastSync"] = isoDate( d) }
        return out
    }

    /// The part of the container this mount shows: `documents` is its
    /// Documents folder (created if missing) with the container's folder
    /// levels enforced; `data` is the container without Documents; `all` is
    /// everything.
    func viewRoot(replica: Replica, engine: SyncEngine, store: any Store) throws -> ViewRoot {
        let documents = FileName("Documents")
        switch request.scope {
        case .all:
            return ViewRoot()
        case .data:
            return ViewRoot(hidden: documents)
        case .documents:
            let existing = replica.withNamespace { ns in
                ns.lookup(Namespace.rootIno, documents).flatMap { ns.node($0)?.kind == .directory ? $0 : nil }
            }
            let root: UInt64
            if let existing {
                root = existing
            } else {
                let creator = FileSystem(replica: replica, hooks: engine)
                root = try creator.mkdir(parent: Namespace.rootIno, name: documents, mode: 0o755,
                                         caller: Caller(uid: getuid(), gid: getgid(), pid: getpid())).ino
            }
            let levels = (try? store.containerConfig(request.container))??.supportedFolderLevels ?? .any
            let limit: Int? = switch levels {
            case .none: 0
            case .one: 1
            case .any: nil
            }
            return ViewRoot(root: root, folderLimit: limit)
        }
    }

    /// `UBIQUITYFS_FAULTS=fetch-delay=SECONDS` makes every blob fetch slow —
    /// for tests of streaming placeholder reads on a real mount, never set otherwise.
    static func withInjectedFaults(_ store: any Store) -> any Store {
        guard let spec = ProcessInfo.processInfo.environment["UBIQUITYFS_FAULTS"], !spec.isEmpty else { return store }
        let faulty = FaultyStore(store)
        for item in spec.split(separator: ",") {
            let parts = item.split(separator: "=", maxSplits: 1).map(String.init)
            if parts.count == 2, parts[0] == "fetch-delay", let seconds = Double(parts[1]) { faulty.slowFetches(by: seconds) }
        }
        return faulty
    }

    static func notify(_ fd: Int32, _ message: String) {
        let line = message + "\n"
        _ = line.withCString { write(fd, $0, strlen($0)) }
        close(fd)
    }
}
