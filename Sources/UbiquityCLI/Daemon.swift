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
        let known = FileManager.default.fileExists(atPath: knownFile.path)
        let store = try FolderStore(root: path, create: isDefault, initializeEmpty: !known || isDefault)
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
        let device = try DeviceIdentity.load(dataHome: locations.dataHome)
        let store = try openStore()
        if try store.containerConfig(request.container) == nil {
            try store.createContainer(ContainerConfig(id: request.container,
                                                      displayName: request.container == Self.defaultContainer ? "Documents" : request.container))
        }
        let replicaDir = locations.replica(storeID: store.storeID, container: request.container)
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

        let engine = SyncEngine(replica: replica, store: store, container: request.container, device: device, logger: logger)
        do {
            let changed = try engine.pull()
            logger.info("caught up with the store: \(changed.count) changes applied")
        } catch {
            logger.warning("could not catch up with the store, serving the local replica: \(error)")
        }
        let fileSystem = FileSystem(replica: replica, hooks: engine)
        let session = FUSESession(fileSystem: fileSystem, mountpoint: mountpoint, logger: logger)
        var options = ["default_permissions", "fsname=ubiquityfs", "subtype=ubiquityfs"]
        if geteuid() == 0 { options.append("allow_other") }
        options += request.fuseOptions
        try session.mount(options: options)

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
        if let waiter = unmountWaiter.withLock({ $0 }) {
            do {
                try engine.drain(progress: { items, bytes in
                    waiter.send(["progress": ["items": items, "bytes": bytes]])
                })
                waiter.send(["ok": true])
            } catch {
                waiter.send(["error": "\(error)"])
            }
            waiter.close()
        }
        try? replica.persist()
        let pending = replica.withNamespace { ns in ns.pendingSummary() }
        logger.info("stopped; \(pending.items) items (\(pending.bytes) bytes) left in the queue for the next mount")
    }

    func handleControl(_ req: [String: String], _ connection: ControlConnection, engine: SyncEngine,
                       replica: Replica, mountpoint: String) {
        switch req["command"] {
        case "status":
            let pending = replica.withNamespace { ns in ns.pendingSummary() }
            let s = engine.currentStatus
            var out: [String: Any] = [
                "pid": Int(getpid()), "mountpoint": mountpoint, "container": request.container,
                "pendingItems": pending.items, "pendingBytes": pending.bytes,
                "storeReachable": s.storeReachable, "pushedChangeSets": s.pushedChangeSets,
            ]
            if let d = s.lastSync { out["lastSync"] = ISO8601DateFormatter().string(from: d) }
            if let e = s.lastError { out["lastError"] = e }
            if let d = s.lastErrorDate { out["lastErrorDate"] = ISO8601DateFormatter().string(from: d) }
            connection.send(["status": out])
            connection.close()
        case "unmount":
            let clientAlive = Mutex(true)
            do {
                try engine.drain(progress: { items, bytes in
                    if !connection.send(["progress": ["items": items, "bytes": bytes]]) { clientAlive.withLock { $0 = false } }
                }, shouldContinue: { clientAlive.withLock { $0 } })
                guard clientAlive.withLock({ $0 }) else { connection.close(); return }
                // Anything still pending is held open for writing: the unmount below reports EBUSY.
                unmountWaiter.withLock { $0 = connection }
                try Unmounter.unmount(mountpoint, lazy: false)
                // The FUSE loop ends now; `run` finishes the queue and answers.
            } catch {
                unmountWaiter.withLock { $0 = nil }
                connection.send(["error": "\(UbiquityError.wrap(error))"])
                connection.close()
            }
        default:
            connection.send(["error": "unknown command"])
            connection.close()
        }
    }

    static func notify(_ fd: Int32, _ message: String) {
        let line = message + "\n"
        _ = line.withCString { write(fd, $0, strlen($0)) }
        close(fd)
    }
}
