import Foundation
import Logging
import UbiquityLocks
import UbiquityFS
import UbiquityFUSE
import UbiquityLocator
import UbiquityProtocol
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityLinux
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// What the daemon process runs with (from the `mount` that started it).
package struct DaemonSettings: Sendable {
    /// nil: the default folder store.
    package var store: StoreAddress?
    package var foreground: Bool
    /// Seconds between journal polls (the folder store also wakes the puller through inotify).
    package var pollInterval: Double
    /// Bytes of downloaded content to keep at most, per container.
    package var cacheLimit: UInt64?
    /// This device's name (shown in conflicted-copy names); default: the host name.
    package var deviceName: String?
    /// A new store is made shared by its folder's group (`FolderStore.shared`).
    package var sharedStore: Bool
    /// Write "ready"/"error" here (the background parent waits on it).
    package var notifyFD: Int32?

    package init(store: StoreAddress?, foreground: Bool = false, pollInterval: Double = 1, cacheLimit: UInt64? = nil,
                 deviceName: String? = nil, sharedStore: Bool = false, notifyFD: Int32? = nil) {
        self.store = store
        self.foreground = foreground
        self.pollInterval = pollInterval
        self.cacheLimit = cacheLimit
        self.deviceName = deviceName
        self.sharedStore = sharedStore
        self.notifyFD = notifyFD
    }
}

/// The daemon: one process per device (data home) and store, serving every
/// mount of that store on this device. A `mount` finds it through its
/// socket (`Locations.daemonSocket`) and asks it to add a mountpoint; the
/// first `mount` starts it. It exits when its last mount is gone.
///
/// It keeps one `ContainerHost` (replica + sync engine) per container in
/// use, however many mounts show it: a drive and a `--scope data` mount of
/// one container share its replica, which has room for one daemon only
/// (its lock).
///
/// Threads: each mount's FUSE loop has its own (`MountHost.serve`); one
/// thread turns SIGTERM/SIGINT/SIGHUP into stopping every mount; one
/// refreshes the drives' folders from the store's container list.
/// Lock order: a container's `opening` lock (held while that container
/// opens or closes: its catch-up pull, its drain) before `state`; neither is
/// held while serving a request, and one container opening or closing never
/// holds up another's.
package final class Daemon: Sendable {
    static let defaultContainer = "com.ubiquityfs.default"

    let settings: DaemonSettings
    let locations = Locations()
    /// Coordinated access for every mount of this daemon (`NSFileCoordinator`).
    let coordinator = Coordinator()

    /// What `run` finds out as the daemon starts (before any other thread
    /// runs) and every thread reads after: behind a lock, a leaf.
    struct Started {
        var logger = Logger(label: "ubiquityfs")
        var device = DeviceIdentity(id: "", name: "")
        var store: (any Store)?
        var syncStore: (any Store)?
        var offlineReason: String?
        var logPath = ""
        /// The known-store marker could not be written (reported once logging is set up).
        var markerProblem: String?
    }
    let started = Lock(Started())

    /// Failures of the daemon's own (not a container's sync): shown by every
    /// mount's `status` under "Recent errors", and logged.
    let recentErrors = Lock<[(Date, String)]>([])

    func recordError(_ message: String) {
        logger.error("\(message)")
        recentErrors.withLock { errors in
            errors.append((Date(), message))
            if errors.count > 20 { errors.removeFirst(errors.count - 20) }
        }
    }

    var logger: Logger {
        get { started.withLock { $0.logger } }
        set { started.withLock { $0.logger = newValue } }
    }
    var device: DeviceIdentity {
        get { started.withLock { $0.device } }
        set { started.withLock { $0.device = newValue } }
    }
    var store: any Store {
        get { started.withLock { $0.store! } }
        set { started.withLock { $0.store = newValue } }
    }
    /// The store as the sync engines use it (with injected faults in tests).
    var syncStore: any Store {
        get { started.withLock { $0.syncStore! } }
        set { started.withLock { $0.syncStore = newValue } }
    }
    /// Why the store could not be reached at start (the mounts then start offline).
    var offlineReason: String? {
        get { started.withLock { $0.offlineReason } }
        set { started.withLock { $0.offlineReason = newValue } }
    }
    var logPath: String {
        get { started.withLock { $0.logPath } }
        set { started.withLock { $0.logPath = newValue } }
    }
    var markerProblem: String? {
        get { started.withLock { $0.markerProblem } }
        set { started.withLock { $0.markerProblem = newValue } }
    }

    struct State {
        var containers: [String: ContainerHost] = [:]
        var mounts: [String: MountHost] = [:]
        /// Mountpoints being mounted (the daemon does not stop under them).
        var mounting: Set<String> = []
        /// Set when the last mount ended: new mounts go to a new daemon.
        var stopping = false
    }
    let state = Lock(State())
    /// One lock per container ID, for opening and closing it.
    let openingLocks = Lock<[String: OpeningLock]>([:])
    final class OpeningLock: Sendable {
        let mutex = Lock(())
    }

    /// Run `body` holding container `id`'s opening lock.
    func opening<T>(_ id: String, _ body: () throws -> T) rethrows -> T {
        let lock = openingLocks.withLock { locks in
            if let lock = locks[id] { return lock }
            let lock = OpeningLock()
            locks[id] = lock
            return lock
        }
        return try lock.mutex.withLock { _ in try body() }
    }
    /// The store's containers as last seen (`containerConfigs`), loaded from disk once.
    let lastSeenConfigs = Lock<[String: ContainerConfig]?>(nil)
    /// Containers this daemon created because a mount named them (reported to that `mount`).
    let createdContainers = Lock<[String]>([])
    /// When the store's container list was last read in full (monotonic ns).
    let lastFullContainerList = Lock<UInt64>(0)
    /// Damaged container configurations already logged.
    let reportedDamage = Lock(Set<String>())
    /// Container → drive slot (see `driveSlot`).
    let driveSlots = Lock([String: Int]())
    let everyMountEnded = DispatchSemaphore(value: 0)

    package init(settings: DaemonSettings) {
        self.settings = settings
    }

    /// Where the store is, for status and messages.
    var storePath: String { store.locationDescription }

    /// Check the mountpoint: exists, is a directory, is empty, is not mounted.
    package static func validateMountpoint(_ path: String) throws -> String {
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
        // An autofs trigger there (fstab's x-systemd.automount) is where systemd
        // wants this mount, on first access: mounted over, its contents never
        // looked at (listing it would wait for this very mount).
        if let top = MountTable.entries().last(where: { $0.mountpoint == absolute }) {
            guard top.type == "autofs" else { throw UbiquityError(EBUSY, "\(absolute) is already mounted") }
            return absolute
        }
        let contents = (try? FileManager.default.contentsOfDirectory(atPath: absolute)) ?? []
        guard contents.isEmpty else { throw UbiquityError(ENOTEMPTY, "mountpoint \(absolute) is not empty") }
        return absolute
    }

    /// Open the store: the default one is created on first use; an explicit
    /// one must exist, and an empty folder (an S3 prefix with no marker)
    /// becomes a store only if this device has never used a store there.
    /// A store this device has used that cannot be reached now is opened
    /// offline (`offlineReason`).
    func openStore() throws -> any Store {
        let address = settings.store ?? StoreAddress(url: locations.defaultStore.path)
        // A marker that cannot be read is an error: taking it for "never used"
        // could make an emptied store a new one.
        let knownID = try address.readKnownStoreID(locations)
        let store: any Store
        if address.isS3 {
            let s3 = try address.openS3(knownStoreID: knownID)
            offlineReason = s3.startupProblem
            store = s3
        } else {
            let path = URL(fileURLWithPath: address.url).standardizedFileURL
            do {
                store = try FolderStore(root: path, create: settings.store == nil && knownID == nil, initializeEmpty: knownID == nil,
                                        shared: settings.sharedStore)
            } catch let error as UbiquityError where knownID != nil && [ENOENT, EHOSTDOWN, EACCES, ENOTDIR, EINVAL].contains(error.errno) {
                // A store this device has used: missing, emptied, unreadable or unmounted
                // means unreachable — never "everything was deleted". Work offline.
                offlineReason = error.description
                return FolderStore(unreachableAt: path, storeID: knownID!)
            }
        }
        if let knownID, knownID != store.storeID {
            throw UbiquityError(EINVAL, "\(address.description) now holds a different store than the one this device used there; refusing to mix them")
        }
        if let error = address.rememberStoreID(store.storeID, locations) {
            markerProblem = "cannot record that this device uses \(address.description): \(error)"
        }
        return store
    }

    /// Mount `request`; returns the containers created in the store for it.
    func mountReportingCreated(_ request: MountParameters) throws -> [String] {
        let before = createdContainers.withLock { $0.count }
        try mount(request)
        return createdContainers.withLock { Array($0.dropFirst(before)) }
    }

    /// Serve `first`, then every mount that joins, until the last one ends.
    package func run(first: MountParameters) throws {
        LinuxCalls.tuneMallocForLongLivedData()
        _ = try Self.validateMountpoint(first.mountpoint)
        try locations.prepareRuntimeDirectory()
        try locations.prepareDataHome()
        device = try DeviceIdentity.load(dataHome: locations.dataHome, name: settings.deviceName)
        store = try openStore()
        syncStore = Self.wrapSyncStore.withLock { $0 }?(store) ?? store

        // Logs: the store's daemon.log, plus stderr in the foreground.
        let logDirectory = locations.dataHome.appendingPathComponent("replicas").appendingPathComponent(store.storeID)
        try? FileManager.default.createDirectory(at: logDirectory, withIntermediateDirectories: true)
        logPath = logDirectory.appendingPathComponent("daemon.log").path
        let logFD = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        var descriptors: [Int32] = logFD >= 0 ? [logFD] : []
        if settings.foreground && settings.notifyFD == nil { descriptors.append(STDERR_FILENO) }
        if settings.notifyFD != nil, logFD >= 0 { dup2(logFD, STDERR_FILENO) }   // crash reports land in the log
        LogSetup.bootstrap(descriptors: descriptors, level: ProcessInfo.processInfo.environment["UBIQUITYFS_DEBUG"] != nil ? .debug : .info)
        logger = Logger(label: "ubiquityfs")
        logger.info("daemon \(getpid()) for store \(storePath) (device \(device.name) \(device.id))")
        if let offlineReason { logger.warning("the store is unreachable (\(offlineReason)); working offline, changes are queued") }
        if let problem = markerProblem { recordError(problem) }

        try forwardSignals()
        let socketPath = locations.daemonSocket(store: storeKeyPath).path
        let server = try ControlServer(path: socketPath, logger: logger) { [self] command, connection in
            handleDaemonRequest(command, connection)
        }
        let created: [String]
        do {
            created = try mountReportingCreated(first)
        } catch {
            server.stop()
            throw error
        }
        server.start()
        startDriveRefresher()
        startCollector()
        // Started by systemd (`Type=notify`, `ubiquityfs mount --foreground`): ready now.
        if settings.notifyFD == nil { SystemdNotify.ready(status: "serving \(first.mountpoint) from \(storePath)") }
        if let fd = settings.notifyFD {
            Self.notify(fd, "ready pid \(getpid())\(created.isEmpty ? "" : " created " + created.joined(separator: ",")) log \(logPath)")
            let devNull = open("/dev/null", O_RDWR)
            dup2(devNull, STDIN_FILENO)
            dup2(devNull, STDOUT_FILENO)
            close(devNull)
        }
        everyMountEnded.wait()
        server.stop()
        logger.info("daemon \(getpid()) stopped: no mount left")
    }

    /// The store as `mount` names it (the daemon's socket is keyed on it).
    var storeKeyPath: String { settings.store?.key ?? locations.defaultStore.path }

    /// A request on the store's socket: `ping`, or `mount` of a daemon
    /// already running (add the mountpoint).
    func handleDaemonRequest(_ command: Command, _ connection: ControlConnection) {
        defer { connection.close() }
        switch command {
        case .ping:
            connection.finish(DaemonInfo(pid: getpid()))
        case .mount(let request):
            if request.sharedStore, (store as? FolderStore)?.shared != true {
                connection.fail(UbiquityError(EPERM, "store \(storePath) is private (made without --shared-store); its files are its owner's only"))
            } else if let name = request.deviceName, name != device.name {
                connection.fail(UbiquityError(EINVAL, "this device's daemon (pid \(getpid())) runs as device '\(device.name)'; unmount its mounts to rename the device"))
            } else {
                do {
                    let created = try mountReportingCreated(request)
                    connection.finish(MountReady(pid: getpid(), log: logPath, created: created))
                } catch {
                    connection.fail(error)
                }
            }
        default:
            connection.fail(ControlError(.unknownCommand, "the store's daemon socket serves ping and mount, not \(command.name) (ask the mount's socket)"))
        }
    }

    // MARK: - Mounts

    func mount(_ request: MountParameters) throws {
        let mountpoint = try Self.validateMountpoint(request.mountpoint)
        try state.withLock { s in
            if s.stopping { throw UbiquityError(EAGAIN, "the daemon is stopping; try again") }
            if s.mounts[mountpoint] != nil || s.mounting.contains(mountpoint) {
                throw UbiquityError(EBUSY, "\(mountpoint) is already mounted")
            }
            s.mounting.insert(mountpoint)
        }
        do {
            try mount(request, at: mountpoint)
        } catch {
            settle { $0.mounting.remove(mountpoint) }
            throw error
        }
    }

    func mount(_ request: MountParameters, at mountpoint: String) throws {
        let host: MountHost
        if let id = request.container {
            let container = try openContainer(id, create: true)
            do {
                let levels = containerConfigs()[id]?.supportedFolderLevels ?? .any
                // A mount of a whole container shows its Documents folder, as an iCloud container has one.
                if request.scope == .all { _ = try container.documentsFolder() }
                let view = try container.view(request.scope, folderLevels: levels)
                host = MountHost(mountpoint: mountpoint, kind: .container(id: id, scope: request.scope), fileSystem: view,
                                 containers: [container], daemon: self)
                let shown = view.kernelView()
                container.addViewer(host.session, kernelIno: { view.kernelIno($0) }, view: { shown })
            } catch {
                try? release([container], drain: nil)
                throw error
            }
        } else {
            let home = try openContainer(Self.defaultContainer, create: true)
            do {
                let view = try home.view(.all, folderLevels: .any)
                let drive = DriveFileSystem(home: view, slotFor: { [self] in driveSlot($0) })
                host = MountHost(mountpoint: mountpoint, kind: .drive(drive), fileSystem: drive, containers: [home], daemon: self)
                let shown = view.kernelView()
                home.addViewer(host.session, kernelIno: { view.kernelIno($0) }, view: { shown })
            } catch {
                try? release([home], drain: nil)
                throw error
            }
            refreshDrive(host)
        }
        // Listed before it serves: its loop may end (and unlist it) at once.
        settle { s in
            s.mounting.remove(mountpoint)
            s.mounts[mountpoint] = host
        }
        do {
            try host.start(fuseOptions: request.fuseOptions)
        } catch let failure as MountHost.EndedAtOnce {
            throw failure.reason   // `serve` undid the mount
        } catch {
            let hosts = host.hosts
            for container in hosts { container.removeViewer(host.session) }
            try? release(hosts, drain: nil)
            settle { $0.mounts[mountpoint] = nil }
            throw error
        }
    }

    /// A mount's FUSE loop has ended and its containers are let go.
    func mountEnded(_ host: MountHost) {
        settle { $0.mounts[host.mountpoint] = nil }
    }

    /// Change the list of mounts; when none is left or coming, the daemon stops.
    func settle(_ change: (inout State) -> Void) {
        let last = state.withLock { s -> Bool in
            change(&s)
            guard s.mounts.isEmpty, s.mounting.isEmpty, !s.stopping else { return false }
            s.stopping = true
            return true
        }
        if last { everyMountEnded.signal() }
    }

    /// Stop every mount (a signal arrived): each loop ends and unmounts.
    func stopAll(reason: String) {
        let mounts = state.withLock { Array($0.mounts.values) }
        logger.info("\(reason): stopping \(mounts.count) mount(s)")
        for mount in mounts { mount.session.stop() }
    }

    func forwardSignals() throws {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw UbiquityError.posix("pipe") }
        _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
        guard LinuxCalls.forwardShutdownSignals(to: fds[1]) else { throw UbiquityError.posix("sigaction") }
        let reader = fds[0]
        Thread.run(named: "ubq-signals") { [self] in
            var byte: UInt8 = 0
            while true {
                let n = read(reader, &byte, 1)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return }
                stopAll(reason: "signal \(byte)")
            }
        }
    }

    // MARK: - Containers

    /// The container's host, opened (replica, catch-up pull, sync engine) if
    /// no mount uses it yet; counts one more user. `create`: a container the
    /// store does not have is created (named after its ID).
    func openContainer(_ id: String, create: Bool) throws -> ContainerHost {
        try opening(id) {
            if let host = state.withLock({ $0.containers[id] }) {
                host.users.withLock { $0 += 1 }
                return host
            }
            try ContainerConfig.validate(id: id)
            let replicaDir = locations.replica(storeID: store.storeID, container: id)
            if offlineReason == nil, try store.containerConfig(id) == nil {
                guard create else { throw UbiquityError(ENOENT, "the store has no container \(id)") }
                do {
                    try store.createContainer(ContainerConfig(id: id, displayName: id == Self.defaultContainer ? "Documents" : id))
                    if id != Self.defaultContainer {
                        createdContainers.withLock { $0.append(id) }
                        logger.info("created container \(id) in the store (a mount named it and the store did not have it)")
                    }
                } catch let error as UbiquityError where error.errno == EEXIST {}   // another device created it just now
            } else if let offlineReason, !FileManager.default.fileExists(atPath: replicaDir.appendingPathComponent("index.sqlite").path) {
                throw UbiquityError(EHOSTDOWN, "\(offlineReason); this device has no replica of \(id) to work offline with")
            }
            let replica = try Replica(directory: replicaDir, rootOwner: (getuid(), getgid()),
                                      sparesAhead: Replica.defaultSparesAhead)
            if replica.playedJournaledFiles > 0 {
                logger.info("\(id): the machine went down with the replica open; played back the journaled fsyncs of \(replica.playedJournaledFiles) files")
            }
            if replica.replayedRecords > 0 {
                logger.info("\(id): the daemon stopped before the index took \(replica.replayedRecords) operation log records; replayed them")
            }
            // UBIQUITYFS_SNAPSHOT_INTERVAL: records between snapshots (tests make it small; 0: none).
            let snapshotInterval = ProcessInfo.processInfo.environment["UBIQUITYFS_SNAPSHOT_INTERVAL"].flatMap { UInt64($0) }
            let engine = SyncEngine(replica: replica, store: syncStore, container: id, device: device,
                                    logger: logger, cacheLimit: settings.cacheLimit,
                                    snapshotInterval: snapshotInterval ?? SyncEngine.defaultSnapshotInterval)
            // Files being rewritten when the daemon last died: before anything else sees them.
            try engine.recoverInterruptedWrites()
            do {
                let changed = try engine.pull()
                logger.info("\(id): caught up with the store, \(changed.count) changes applied")
            } catch {
                logger.warning("\(id): could not catch up with the store, serving the local replica: \(error)")
                engine.record(error: error)
            }
            let host = ContainerHost(id: id, replica: replica, engine: engine, coordinator: coordinator, logger: logger)
            host.users.withLock { $0 = 1 }
            engine.start(pollInterval: settings.pollInterval, observer: host)
            state.withLock { $0.containers[id] = host }
            return host
        }
    }

    /// Each of `hosts` loses a user; one left with none is closed: its engine
    /// stops, its replica is committed and unlocked (so mounting it again at
    /// once works). With `drain`, everything pending is pushed first.
    func release(_ hosts: [ContainerHost], drain: ((Int, UInt64) -> Void)?) throws {
        var failure: (any Error)?
        for host in hosts {
            opening(host.id) {
                let unused = host.users.withLock { users -> Bool in
                    users -= 1
                    return users <= 0
                }
                if unused {
                    state.withLock { _ = $0.containers.removeValue(forKey: host.id) }
                    host.engine.stop()
                }
                if let drain {
                    do { _ = try host.engine.drain(progress: drain) } catch { failure = failure ?? error }
                }
                if unused {
                    do {
                        try host.replica.commitAndCheckpoint()
                        try host.replica.closedCleanly()
                    } catch {
                        recordError("\(host.id): the replica did not close cleanly (\(error)); the operation log keeps what the index lacks, and the next mount replays it (checking the local copies if the machine restarts first)")
                    }
                    let pending = host.replica.read { ns in ns.pendingSummary() }
                    logger.info("\(host.id) closed; \(counted(pending.items, "item")) (\(pending.bytes) bytes) left in the queue for the next mount")
                    host.replica.releaseLock()
                }
            }
        }
        if let failure { throw failure }
    }

    // MARK: - The drive's folders

    /// The store's containers by ID; when the store cannot be read, the list
    /// last seen (kept beside the replicas), so a drive works offline. A
    /// container whose configuration is damaged keeps the one last seen (and
    /// the log says so, once).
    func containerConfigs() -> [String: ContainerConfig] {
        let cache = locations.dataHome.appendingPathComponent("replicas").appendingPathComponent(store.storeID)
            .appendingPathComponent("containers.json")
        // The file is read once; after that the list in memory is the last seen.
        let lastSeen = lastSeenConfigs.withLock { known in
            if known == nil {
                let list = (try? JSONDecoder().decode([ContainerConfig].self, from: Data(contentsOf: cache))) ?? []
                known = Dictionary(list.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
            }
            return known!
        }
        // The full list costs a LIST and a GET per container on S3: read it
        // when the store says it may have changed, and every few minutes.
        let now = DispatchTime.now().uptimeNanoseconds
        let due = lastFullContainerList.withLock { last in
            guard store.containersMayHaveChanged() || last == 0 || now - last > 300_000_000_000 else { return false }
            last = now
            return true
        }
        guard due else { return lastSeen }
        guard store.isReachable, let listing = try? store.containers() else {
            lastFullContainerList.withLock { $0 = 0 }   // read again at the next refresh
            return lastSeen
        }
        let damaged = Set(listing.damaged.map(\.id))
        var configs = lastSeen.filter { damaged.contains($0.key) }
        for config in listing.configs { configs[config.id] = config }
        for (id, problem) in listing.damaged where reportedDamage.withLock({ $0.insert(id + problem).inserted }) {
            logger.error("container \(id): \(problem); using the configuration last seen")
        }
        if configs != lastSeen {
            lastSeenConfigs.withLock { $0 = configs }
            if let data = try? JSONEncoder().encode(configs.values.sorted { $0.id < $1.id }) {
                try? data.write(to: cache, options: .atomic)
            }
        }
        return configs
    }

    /// Show a folder in `mount` (a drive) for each container whose Documents
    /// scope is public, opening containers not open yet; tell the kernel
    /// which names at the root changed.
    func refreshDrive(_ mount: MountHost) {
        guard let drive = mount.drive else { return }
        let shown = containerConfigs().values.filter { $0.documentScopePublic && $0.id != Self.defaultContainer }
        var views: [String: FileSystem] = [:]
        let known = Set(mount.hosts.map(\.id))
        for config in shown where !known.contains(config.id) {
            do {
                let host = try openContainer(config.id, create: false)
                guard mount.adopt(host) else {   // the mount ended meanwhile
                    try? release([host], drain: nil)
                    return
                }
                let view = try host.view(.documents, folderLevels: config.supportedFolderLevels)
                views[config.id] = view
                let outward: @Sendable (UInt64) -> UInt64? = { [weak drive] ino in drive?.kernelIno(container: config.id, ino) }
                host.addViewer(mount.session, kernelIno: { outward(view.kernelIno($0)) }) { [weak drive] in
                    guard let drive, let folder = drive.currentFolders().first(where: { $0.containerID == config.id }) else { return nil }
                    return view.kernelView(prefix: [folder.name], outward: outward)
                }
            } catch {
                logger.warning("the drive at \(mount.mountpoint) cannot show \(config.id): \(error)")
            }
        }
        let before = drive.folderInodes()
        let changed = drive.update(folders: shown.map { ($0.id, $0.displayName) }, fileSystem: { views[$0] })
        for name in changed { mount.session.invalidateEntry(parent: 1, name: name) }
        // Folders that come and go raise the events a mkdir or rmdir would.
        if !changed.isEmpty { mount.session.events?.enqueue(.driveFolders(before: before, after: drive.folderInodes())) }
        if !changed.isEmpty { logger.info("drive at \(mount.mountpoint): folders changed (\(changed.map(\.description).sorted()))") }
    }

    /// The slot of a container in this device's drives (inode numbers
    /// `slot << 48 | n`), kept in `drive-slots.json` beside the replicas so
    /// that numbers stay the same across remounts. A file that cannot be
    /// read or written is logged: the slots then hold for this daemon only
    /// (a remount may number a folder's items differently).
    /// `driveSlots` is a leaf, held across the file's read and write.
    func driveSlot(_ container: String) -> Int {
        driveSlots.withLock { slots in
            let file = locations.dataHome.appendingPathComponent("replicas").appendingPathComponent(store.storeID)
                .appendingPathComponent("drive-slots.json")
            if slots.isEmpty, let data = FileManager.default.contents(atPath: file.path) {
                do {
                    slots = try JSONDecoder().decode([String: Int].self, from: data)
                } catch {
                    recordError("\(file.path) is damaged (\(error)); the drive's folders are numbered afresh")
                }
            }
            if let slot = slots[container] { return slot }
            let slot = (slots.values.max() ?? 0) + 1
            slots[container] = slot
            do {
                try JSONEncoder().encode(slots).write(to: file, options: .atomic)
            } catch {
                recordError("cannot record the drive's folder numbers in \(file.path): \(error)")
            }
            return slot
        }
    }

    /// The store's collector (`Collector`), about once a day while the
    /// daemon runs: first 1–2 hours after it starts (a laptop that is on
    /// for an hour a day still collects), then every 20–28 hours. Several
    /// devices collecting one store is safe (marks are shared, removals
    /// checked). A failed run (the store unreachable, a damaged container)
    /// is logged and tried again at the next time.
    func startCollector() {
        Thread.run(named: "ubq-collector") { [self] in
            var wait = Double.random(in: 3600...7200)
            while true {
                let deadline = Date().addingTimeInterval(wait)
                while Date() < deadline {
                    if state.withLock({ $0.stopping }) { return }
                    Thread.sleep(forTimeInterval: min(5, deadline.timeIntervalSinceNow))
                }
                do {
                    _ = try Collector(store: syncStore, logger: logger).run()
                } catch {
                    logger.warning("collector: \(UbiquityError.wrap(error).message) (tried again in a day)")
                }
                wait = Double.random(in: 72_000...100_800)
            }
        }
    }

    func startDriveRefresher() {
        Thread.run(named: "ubq-drive") { [self] in
            while !state.withLock({ $0.stopping }) {
                Thread.sleep(forTimeInterval: settings.pollInterval)
                for mount in state.withLock({ Array($0.mounts.values) }) where mount.drive != nil { refreshDrive(mount) }
            }
        }
    }

    /// What the sync engines see of the store: the store itself, unless a
    /// test build of the command (`ubiquityfs-testing`, never installed)
    /// wraps it to inject faults. Set once, before the daemon starts.
    package static let wrapSyncStore = Lock<(@Sendable (any Store) -> any Store)?>(nil)

    package static func notify(_ fd: Int32, _ message: String) {
        let line = message + "\n"
        _ = line.withCString { write(fd, $0, strlen($0)) }
        close(fd)
    }
}

/// "1 item", "2 items".
package func counted(_ count: Int, _ noun: String) -> String { "\(count) \(noun)\(count == 1 ? "" : "s")" }
