import Foundation
import Logging
import UbiquityLocks
import UbiquityFS
import UbiquityFUSE
import UbiquityLocator
import UbiquityProtocol
import UbiquityReplica
import UbiquityS3
import UbiquityModel
import UbiquityLinux
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// One mountpoint served by the daemon: a FUSE session on its own thread,
/// its control socket, and the containers it shows — one container's scope,
/// or the drive (the home container plus a folder per public container).
///
/// Control requests name items by path below the mountpoint; `locate`
/// turns a path into the container and inode it names.
final class MountHost: @unchecked Sendable {
    enum Kind {
        case container(id: String, scope: Scope)
        case drive(DriveFileSystem)
    }

    let mountpoint: String
    let kind: Kind
    let session: FUSESession
    let daemon: Daemon
    var logger: Logger { daemon.logger }
    /// The containers this mount shows (the drive: the home container first,
    /// then each container that has had a folder). Each counts as one user.
    /// `ended`: the mount is gone and has let go of them.
    let containers: Lock<(hosts: [ContainerHost], ended: Bool)>

    var hosts: [ContainerHost] { containers.withLock { $0.hosts } }

    /// Show one more container (a drive's new folder); false once the mount has ended.
    func adopt(_ host: ContainerHost) -> Bool {
        containers.withLock { c in
            if !c.ended { c.hosts.append(host) }
            return !c.ended
        }
    }
    /// A client waiting for the unmount to finish (told when everything is pushed).
    let unmountWaiter = Lock<ControlConnection?>(nil)
    var control: ControlServer?
    /// Signalled when `serve` has ended the mount and let go of everything.
    let ended = DispatchSemaphore(value: 0)

    /// The FUSE session ended (or failed) as soon as it was started: `serve`
    /// has already undone the mount, so the caller only reports `reason`.
    struct EndedAtOnce: Error {
        let reason: UbiquityError
    }

    init(mountpoint: String, kind: Kind, fileSystem: any MountedFileSystem, containers: [ContainerHost], daemon: Daemon) {
        self.mountpoint = mountpoint
        self.kind = kind
        self.daemon = daemon
        self.containers = Lock((containers, false))
        // Recently Deleted at the mount's root, where file managers look for a volume's trash.
        let trashSource = WeakMountHost()
        let served = TrashFolder(base: fileSystem, owner: (geteuid(), getegid())) { trashSource.host?.trashFolderItems() ?? [] }
        session = FUSESession(fileSystem: served, mountpoint: mountpoint, logger: daemon.logger)
        session.events = KernelEventReplay(mountpoint: mountpoint, fs: served, logger: daemon.logger) {
            [weak session] parent, name in session?.dropEntry(parent: parent, name: name)
        }
        trashSource.host = self
    }

    final class WeakMountHost: @unchecked Sendable {
        weak var host: MountHost?
    }

    var drive: DriveFileSystem? {
        if case .drive(let drive) = kind { return drive }
        return nil
    }

    var label: String {
        switch kind {
        case .container(let id, let scope): return "\(id) (\(scope.rawValue) scope)"
        case .drive: return "the drive"
        }
    }

    /// Mount, open the control socket, and serve on a thread of its own.
    /// The mount's source names the daemon (`ubiquityfs:PID`) and the
    /// device records it (`MountRecord`): that is how commands find the
    /// daemon of a mount, and tell this device's mounts from others'.
    func start(fuseOptions: [String]) throws {
        let socket = daemon.locations.controlSocket(mountpoint: mountpoint).path
        try daemon.locations.prepareRuntimeDirectory()
        var options = ["default_permissions", "fsname=\(MountTable.source(daemonPID: getpid()))", "subtype=ubiquityfs"]
        if geteuid() == 0 { options.append("allow_other") }
        try session.mount(options: options + fuseOptions)
        do {
            control = try ControlServer(path: socket, logger: logger) {
                [self] command, connection in handleControl(command, connection)
            }
            try MountRecord(mountpoint: mountpoint, pid: getpid(), socket: socket).save(daemon.locations)
        } catch {
            control?.stop()
            session.close()
            throw error
        }
        control?.start()
        Thread.run(named: "ubq-fuse") { [self] in serve() }
        // The kernel's INIT is answered by the loop. A session that libfuse
        // or the kernel ends there would otherwise look mounted, and the
        // next writes would land in the directory underneath.
        if let problem = session.firstRoundTrip() {
            logger.error("\(mountpoint): the FUSE session does not serve: \(problem)")
            session.stop()
            ended.wait()
            throw EndedAtOnce(reason: UbiquityError(EIO, "the FUSE session at \(mountpoint) ended as it started (\(problem)); the daemon's log says why"))
        }
        session.events?.start()
        logger.info("mounted \(label) at \(mountpoint)")
    }

    /// The FUSE loop, then the orderly end: unmount, let go of the
    /// containers, finish pushing if `ubiquityfs unmount` waits for it.
    func serve() {
        let status = session.run()
        logger.info("FUSE loop of \(mountpoint) ended (status \(status))")
        // A replay step waiting for this loop returns when the session closes.
        session.events?.stop(wait: false)
        // No pull, download or drive refresh may notify this kernel any more
        // before the session is destroyed.
        let hosts = containers.withLock { c -> [ContainerHost] in
            c.ended = true
            return c.hosts
        }
        for host in hosts { host.removeViewer(session) }
        session.close()
        // What the kernel still held (it sends no forgets once detached) is given back.
        let release = session.fileSystem.releaseKernelReferences()
        if release.excessForgets > 0 {
            logger.error("\(mountpoint): the kernel forgot more references than it was given, \(release.excessForgets) times (ignored)")
        }
        if release.held > 0 {
            logger.info("\(mountpoint): the kernel still held \(release.held) nodes at the end; \(release.dropped) deleted ones dropped")
        }
        control?.stop()
        MountRecord.remove(daemon.locations, mountpoint: mountpoint, pid: getpid())
        let waiter = unmountWaiter.withLock { $0 }
        do {
            try daemon.release(hosts, drain: waiter.map { waiter in
                { items, bytes in _ = waiter.send(.pushing(PushProgress(itemsLeft: items, bytesLeft: bytes))) }
            })
            waiter?.finish(NoResult())
        } catch {
            waiter?.fail(error)
        }
        waiter?.close(force: true)
        daemon.mountEnded(self)
        ended.signal()
    }

    // MARK: - Paths

    /// The container and inode that `path` (names below the mountpoint) is.
    func locate(_ path: [FileName]) throws -> (ContainerHost, UInt64) {
        let hosts = self.hosts
        switch kind {
        case .container(_, let scope):
            return (hosts[0], try hosts[0].resolve(path, scope: scope))
        case .drive(let drive):
            if let first = path.first, let folder = drive.currentFolders().first(where: { $0.name == first }),
               let host = hosts.first(where: { $0.id == folder.containerID }) {
                return (host, try host.resolve(Array(path.dropFirst()), scope: .documents))
            }
            return (hosts[0], try hosts[0].resolve(path, scope: .all))
        }
    }

    /// Where a container's items show in this mount: its path from the
    /// container's root → its absolute path on this machine (the mountpoint
    /// and the path below it), so that a result can be opened as it is.
    func visibleSources(scopes: [Scope]) throws -> [QuerySource] {
        let hosts = self.hosts
        let root = mountpoint == "/" ? "" : mountpoint
        switch kind {
        case .container(_, .all):
            return [QuerySource(key: 0, engine: hosts[0].engine, scopes: scopes, rewrite: { root + $0 })]
        case .container(_, let shown):
            // A scoped mount shows that scope only; a Documents mount's root is the Documents folder.
            guard scopes.contains(.all) || scopes.contains(shown) else {
                throw UbiquityError(EINVAL, "this mount shows the \(shown.rawValue) scope only: query another with --container ID --scope")
            }
            let strip = shown == .documents ? "/Documents".count : 0
            return [QuerySource(key: 0, engine: hosts[0].engine, scopes: [shown], rewrite: { root + $0.dropFirst(strip) })]
        case .drive(let drive):
            if scopes.contains(.data) {
                throw UbiquityError(EINVAL, "the drive shows Documents only: query a Data scope with --container ID --scope data")
            }
            var sources = [QuerySource(key: 0, engine: hosts[0].engine, scopes: [.all], rewrite: { root + $0 })]
            for folder in drive.currentFolders() {
                guard let host = hosts.first(where: { $0.id == folder.containerID }) else { continue }
                let prefix = root + "/" + folder.name.description
                sources.append(QuerySource(key: UInt64(folder.slot), engine: host.engine, scopes: [.documents],
                                           rewrite: { prefix + $0.dropFirst("/Documents".count) }))
            }
            return sources
        }
    }

    /// An item's path as the user sees it on this machine (the mountpoint
    /// and the path below it), for messages: never the container-internal
    /// path (`/Documents/…` of a drive folder or a Documents mount).
    func shownPath(_ host: ContainerHost, _ ino: UInt64) -> String {
        guard let inner = host.replica.read({ ns in ns.path(of: ino) }) else { return "inode \(ino)" }
        return shownPath(host, inner: inner)
    }

    /// `shownPath` of a path in the container (`/`-prefixed), whether or
    /// not it exists now.
    func shownPath(_ host: ContainerHost, inner: String) -> String {
        let root = mountpoint == "/" ? "" : mountpoint
        func belowDocuments(_ prefix: String) -> String? {
            guard inner == "/Documents" || inner.hasPrefix("/Documents/") else { return nil }
            let rest = inner.dropFirst("/Documents".count)
            return rest.isEmpty ? (prefix.isEmpty ? "/" : prefix) : prefix + rest
        }
        switch kind {
        case .container(_, .documents):
            return belowDocuments(root) ?? root + inner
        case .container:
            return root + inner
        case .drive(let drive):
            if let folder = drive.currentFolders().first(where: { $0.containerID == host.id }),
               let shown = belowDocuments(root + "/" + folder.name.description) {
                return shown
            }
            return root + inner
        }
    }

    // MARK: - Control requests

    func handleControl(_ command: Command, _ connection: ControlConnection) {
        defer { connection.close() }
        switch command {
        case .status:
            connection.finish(statusReport())
        case .describe:
            // What `query --container` needs to find a mount, without counting items.
            var scope: Scope?
            if case .container(_, let shown) = kind { scope = shown }
            connection.finish(MountDescription(containers: hosts.map(\.id), store: daemon.storePath,
                                               dataHome: daemon.locations.dataHome.path, scope: scope))
        case .coordinate(let reads, let writes, let deletes, let metadataOnly):
            coordinate(reads: reads, writes: writes, deletes: deletes, download: !metadataOnly, connection)
        case .present(let path):
            present(path, connection)
        case .recordConflict(let path, let copy):
            contentCommand([path, copy], connection) { items in
                guard items[0].0 === items[1].0 else { throw UbiquityError(EXDEV, "the conflict version is in another container") }
                try items[0].0.engine.recordConflict(ino: items[0].1, copy: items[1].1)
                return NoResult()
            }
        case .download(let paths, let recursive):
            contentCommand(paths, connection) { items in
                try downloadAll(items, recursive: recursive, connection: connection)
                return NoResult()
            }
        case .evict(let paths):
            // An eviction is a coordinated write: not under a coordinated reader.
            let coordinator = daemon.coordinator
            guard let token = coordinator.acquire(reads: [], writes: paths.map(coordinationKey),
                                                  deadline: Date().addingTimeInterval(ContainerHost.pullWaitLimit),
                                                  abandoned: { connection.peerClosed(waitingAtMost: 0) }) else {
                connection.fail(UbiquityError(EBUSY, "not evicted: a coordinated access holds it (NSFileCoordinator)"))
                return
            }
            defer { coordinator.release(token) }
            contentCommand(paths, connection) { items in
                var evicted = 0
                var refused: [(path: String, error: UbiquityError)] = []
                for (host, ino) in items {
                    for file in host.replica.read({ ns in ns.files(under: ino) }) {
                        do {
                            if try host.engine.evict(ino: file) { evicted += 1 }
                        } catch {
                            refused.append((shownPath(host, file), UbiquityError.wrap(error)))
                        }
                    }
                }
                if !refused.isEmpty {
                    // One errno for the request: the refusals' own if they agree.
                    let codes = Set(refused.map(\.error.errno))
                    throw UbiquityError(codes.count == 1 ? codes.first! : EBUSY,
                                        "not evicted: " + refused.map { "\($0.path): \($0.error.errnoName): \($0.error)" }
                                            .joined(separator: "; "))
                }
                return Evicted(evicted: evicted)
            }
        case .pin(let paths), .unpin(let paths):
            let pin = command.name == "pin"
            contentCommand(paths, connection) { items in
                for (host, ino) in items { try host.engine.setPinned(ino: ino, pin) }
                return ItemCount(items: items.count)
            }
        case .query(let parameters):
            serveQuery(parameters, connection)
        case .versions(let path, let all):
            contentCommand([path], connection) { items in
                let (host, ino) = items[0]
                let versions = try host.engine.versions(ino: ino).map { v in
                    ItemVersion(label: v.label, path: v.path, device: v.device, size: UInt64(v.size),
                                modified: isoDate(Date(timeIntervalSince1970: Double(v.modified.sec))))
                }
                guard all else { return ItemVersions(versions: versions) }
                try? host.engine.catchUpHistory()
                func iso(_ t: Timespec) -> String { isoDate(Date(timeIntervalSince1970: Double(t.nanoseconds) / 1e9)) }
                let history = try host.engine.history(ino: ino).map { v in
                    HistoryEntry(id: v.id, committed: iso(v.committed), modified: iso(v.modified), size: v.size,
                                 device: v.device, current: v.isCurrent)
                }
                return ItemVersions(versions: versions, history: history)
            }
        case .restore(let path, let version, let to):
            contentCommand([path], connection) { items in
                let (host, ino) = items[0]
                var destination: (parent: UInt64, name: FileName)?
                if let to {
                    guard let name = to.last else { throw UbiquityError(EINVAL, "restore --to needs a file name") }
                    let (folderHost, parent) = try locate(to.dropLast().map { FileName($0) })
                    guard folderHost === host else { throw UbiquityError(EXDEV, "restore --to must name a place in the same container") }
                    destination = (parent, FileName(name))
                }
                let restored = try host.engine.restoreVersion(ino: ino, id: version, to: destination)
                return RestoredItem(path: shownPath(host, restored))
            }
        case .fetchVersion(let path, let version, let destination):
            contentCommand([path], connection) { items in
                guard destination.hasPrefix("/"), !MountTable.ubiquityMounts().contains(where: {
                    destination == $0.mountpoint || destination.hasPrefix($0.mountpoint == "/" ? "/" : $0.mountpoint + "/")
                }) else {
                    throw UbiquityError(EINVAL, "\(destination): a version is written to an absolute path outside every ubiquityfs mount")
                }
                try items[0].0.engine.writeVersion(ino: items[0].1, id: version, to: destination)
                return NoResult()
            }
        case .trash:
            connection.finish(trashListing())
        case .restoreDeleted(let item):
            do {
                connection.finish(try restoreDeleted(item))
            } catch {
                connection.fail(error)
            }
        case .emptyTrash:
            do {
                var count = 0
                for host in hosts {
                    count += host.engine.trash().count
                    try host.engine.emptyTrash()
                }
                connection.finish(ItemCount(items: count))
            } catch {
                connection.fail(error)
            }
        case .resolve(let paths, let keep):
            let choice: ConflictChoice = switch keep {
            case .current: .current
            case .both: .both
            case .version(let number): .version(number)
            }
            contentCommand(paths, connection) { items in
                for (host, ino) in items { try host.engine.resolve(ino: ino, keep: choice) }
                return NoResult()
            }
        case .unmount:
            unmount(connection)
        case .ping, .mount:
            connection.fail(ControlError(.unknownCommand, "a mount's socket does not serve \(command.name) (ask the store's daemon socket)"))
        }
    }

    /// Push everything, then unmount; the FUSE thread answers once the
    /// containers are let go (`serve`).
    func unmount(_ connection: ControlConnection) {
        let hosts = self.hosts
        let clientAlive = Lock(true)
        do {
            for host in hosts {
                try host.engine.drain(progress: { items, bytes in
                    if !connection.send(.pushing(PushProgress(itemsLeft: items, bytesLeft: bytes))) {
                        clientAlive.withLock { $0 = false }
                    }
                }, shouldContinue: { clientAlive.withLock { $0 } })
            }
            guard clientAlive.withLock({ $0 }) else { return }
            // Anything still pending is held open for writing (what the store
            // refuses made `drain` throw): the unmount below reports EBUSY.
            unmountWaiter.withLock { $0 = connection }
            // The event replay lets go of the mount first (it would make it busy).
            session.events?.stop(wait: true)
            try Unmounter.unmount(mountpoint, lazy: false)
            connection.keepOpen()
        } catch let error as UbiquityError where error.errno == EBUSY {
            unmountWaiter.withLock { $0 = nil }
            session.events?.start()
            connection.fail(error)
        } catch {
            unmountWaiter.withLock { $0 = nil }
            let pending = hosts.map { host in host.replica.read { ns in ns.pendingSummary() }.items }.reduce(0, +)
            let failure = UbiquityError.wrap(error)
            connection.fail(UbiquityError(failure.errno, "cannot push to the store (\(failure)); \(counted(pending, "item")) stay queued. `ubiquityfs unmount --force` detaches now and keeps them for the next mount"))
        }
    }

    /// Coordinated access: ask the items' presenters in other processes to
    /// let go, wait for the items, say `granted`, hold them until the client
    /// closes the connection, then give the presenters their items back. A
    /// reader of a placeholder gets it downloaded first (unless `download` is false).
    func coordinate(reads: [[String]], writes: [[String]], deletes: [[String]], download: Bool, _ connection: ControlConnection) {
        let placeholders = download ? reads.compactMap { names in try? locate(names.map { FileName($0) }) } : []
        if !placeholders.isEmpty { try? downloadAll(placeholders, recursive: false, connection: connection) }
        let coordinator = daemon.coordinator
        let asks = coordinator.askPresenters(reads: reads.map(coordinationKey), writes: (writes + deletes).map(coordinationKey),
                                             deletes: deletes.map(coordinationKey), except: connection.peerPID)
        defer { coordinator.reacquire(asks) }
        guard let token = coordinator.acquire(reads: reads.map(coordinationKey), writes: (writes + deletes).map(coordinationKey),
                                              abandoned: { connection.peerClosed(waitingAtMost: 0) }) else { return }
        defer { coordinator.release(token) }
        guard connection.send(.granted) else { return }
        _ = connection.peerClosed(waitingAtMost: nil)
    }

    /// Present an item until the client closes the connection (`granted`
    /// once it is known), passing its answers to the coordinator.
    func present(_ path: [String], _ connection: ControlConnection) {
        let coordinator = daemon.coordinator
        let id = coordinator.addPresenter(key: coordinationKey(path), pid: connection.peerPID ?? -1, connection: connection)
        defer { coordinator.removePresenter(id) }
        guard connection.send(.granted) else { return }   // known from now on
        connection.readLines { line in
            if let answer = try? JSONDecoder().decode(PresenterAnswer.self, from: line) { coordinator.answered(answer.relinquished) }
        }
    }

    /// The coordinator's key of an item below the mountpoint: its container
    /// and its path there, whichever mount names it.
    func coordinationKey(_ names: [String]) -> String {
        func key(_ container: String, _ path: [String]) -> String { ([container] + path).joined(separator: "/") }
        switch kind {
        case .container(let id, .documents):
            return key(id, [ContainerHost.documents.description] + names)
        case .container(let id, _):
            return key(id, names)
        case .drive(let drive):
            if let first = names.first, let folder = drive.currentFolders().first(where: { $0.name.description == first }) {
                return key(folder.containerID, [ContainerHost.documents.description] + names.dropFirst())
            }
            return key(hosts[0].id, names)
        }
    }

    /// Resolve `paths` (names below the mountpoint) and run `body` on their
    /// items; its result, or its error, is the answer's final line.
    func contentCommand<Result: Codable & Sendable>(_ paths: [[String]], _ connection: ControlConnection,
                                                    _ body: ([(ContainerHost, UInt64)]) throws -> Result) {
        do {
            connection.finish(try body(try paths.map { path in try locate(path.map { FileName($0) }) }))
        } catch {
            connection.fail(error)
        }
    }

    /// The container and the path in it (`/`-separated, no leading `/`) of
    /// `path`, an absolute path below this mountpoint that need not exist
    /// (the reverse of `shownPath`).
    func containerPath(_ path: String) throws -> (ContainerHost, String) {
        let root = mountpoint == "/" ? "" : mountpoint
        guard path == root || path.hasPrefix(root + "/") else {
            throw UbiquityError(EINVAL, "\(path) is not inside the mount at \(mountpoint)")
        }
        let names = path.dropFirst(root.count).split(separator: "/").map(String.init)
        let hosts = self.hosts
        switch kind {
        case .container(_, .documents):
            return (hosts[0], (["Documents"] + names).joined(separator: "/"))
        case .container:
            return (hosts[0], names.joined(separator: "/"))
        case .drive(let drive):
            if let first = names.first, let folder = drive.currentFolders().first(where: { $0.name.description == first }),
               let host = hosts.first(where: { $0.id == folder.containerID }) {
                return (host, (["Documents"] + names.dropFirst()).joined(separator: "/"))
            }
            return (hosts[0], names.joined(separator: "/"))
        }
    }

    /// The items of the mount's trash folder (`TrashFolder`): paths
    /// relative to the mount's root. From the history as it is and the
    /// configurations last seen: no store reads, it answers a lookup.
    func trashFolderItems() -> [TrashFolder.Item] {
        let root = mountpoint == "/" ? "" : mountpoint
        return trashListing(catchUp: false).items.map { entry in
            TrashFolder.Item(id: entry.id, path: String(entry.path.dropFirst(root.count + 1)), isDirectory: entry.kind == "directory",
                             size: entry.size, deleted: ISO8601DateFormatter().date(from: entry.deleted) ?? Date())
        }
    }

    /// Recently Deleted of what this mount shows, as `trash` lists it;
    /// `catchUp`: the history first reads what it lacks from the store.
    func trashListing(catchUp: Bool = true) -> TrashListing {
        var entries: [(date: Timespec, entry: TrashEntry)] = []
        var retention = ContainerConfig.defaultRetentionDays
        for host in hosts {
            let config = catchUp ? host.engine.containerConfigOrDefault()
                : daemon.lastSeenConfigs.withLock({ $0 })?[host.id] ?? ContainerConfig(id: host.id, displayName: host.id)
            retention = config.retentionDays ?? ContainerConfig.defaultRetentionDays
            if catchUp { try? host.engine.catchUpHistory() }
            for item in host.engine.trash(config: config, settled: catchUp) {
                let shown = shownPath(host, inner: "/" + item.path)
                // Only what this mount shows (a Documents mount: not the Data scope).
                if case .container(_, .documents) = kind, !item.path.hasPrefix("Documents/") { continue }
                if case .drive = kind, host !== hosts[0], !item.path.hasPrefix("Documents/") { continue }
                entries.append((item.deleted, TrashEntry(
                    id: item.id, path: shown, kind: item.kind.rawValue, size: item.size, items: item.items,
                    deleted: isoDate(Date(timeIntervalSince1970: Double(item.deleted.nanoseconds) / 1e9)), device: item.device)))
            }
        }
        return TrashListing(items: entries.sorted { $0.date > $1.date }.map(\.entry), retentionDays: retention)
    }

    /// Bring back `item` (a path as `trash` lists it, or an ID).
    func restoreDeleted(_ item: String) throws -> RestoredItem {
        if item.hasPrefix("/") {
            let (host, path) = try containerPath(item)
            try? host.engine.catchUpHistory()
            let restored = try host.engine.restoreDeleted(path)
            return RestoredItem(path: shownPath(host, inner: "/" + restored))
        }
        var failure: (any Error)?
        for host in hosts {
            do {
                try? host.engine.catchUpHistory()
                let restored = try host.engine.restoreDeleted(item)
                return RestoredItem(path: shownPath(host, inner: "/" + restored))
            } catch {
                failure = failure ?? error
            }
        }
        throw failure ?? UbiquityError(ENOENT, "\(item) is not in Recently Deleted")
    }

    /// Download every placeholder file named (directories: with `recursive`),
    /// a few at a time, reporting progress.
    func downloadAll(_ items: [(ContainerHost, UInt64)], recursive: Bool, connection: ControlConnection) throws {
        var files: [(host: ContainerHost, ino: UInt64, size: UInt64, version: String?)] = []
        for (host, ino) in items {
            let isDirectory = host.replica.read { ns in ns.node(ino)?.kind == .directory }
            if isDirectory && !recursive {
                throw UbiquityError(EISDIR, "\(shownPath(host, ino)) is a folder: use --recursive")
            }
            files += host.replica.read { ns in
                ns.files(under: ino).compactMap { file in
                    guard let node = ns.node(file), node.isPlaceholder else { return nil }
                    return (host, file, node.hashSize, node.hash)
                }
            }
        }
        let totalBytes = files.map(\.size).reduce(0, +)
        var doneBytes: UInt64 = 0
        var failures: [String] = []
        let wave = 4
        var index = 0
        while index < files.count {
            let batch = files[index..<min(files.count, index + wave)]
            for file in batch { file.host.engine.startDownload(ino: file.ino, keep: true) }
            for (offset, file) in batch.enumerated() {
                do {
                    try file.host.engine.waitUntilDownloaded(ino: file.ino, version: file.version, size: file.size)
                } catch {
                    let path = shownPath(file.host, file.ino)
                    failures.append("\(path): \(UbiquityError.wrap(error))")
                }
                doneBytes += file.size
                connection.send(.downloading(DownloadProgress(items: index + offset + 1, totalItems: files.count,
                                                              bytes: doneBytes, totalBytes: totalBytes)))
            }
            index += batch.count
        }
        if !failures.isEmpty { throw UbiquityError(EIO, "not downloaded: " + failures.joined(separator: "; ")) }
    }

    /// A query over what this mount shows, or over a whole container
    /// (`container` in the request: `query --container ID`).
    func serveQuery(_ parameters: QueryParameters, _ connection: ControlConnection) {
        let scopes = parameters.scopes
        let sources: () throws -> [QuerySource]
        if let id = parameters.container {
            guard let host = hosts.first(where: { $0.id == id }) else {
                connection.fail(UbiquityError(ENOENT, "this mount does not show container \(id)"))
                return
            }
            sources = { [QuerySource(key: 0, engine: host.engine, scopes: scopes, rewrite: { $0 })] }
        } else {
            sources = { [self] in try visibleSources(scopes: scopes) }
        }
        QueryService.serve(parameters, connection: connection, sources: sources)
    }

    /// Counts per container and scope, transfers, reachability, errors.
    func statusReport() -> MountStatus {
        let hosts = self.hosts
        let folders = drive?.currentFolders() ?? []
        var perContainer: [ContainerStatus] = []
        var errors: [(Date, String)] = daemon.recentErrors.withLock { $0 }
        var failing: [FailingUpload] = []
        var quarantined: [QuarantinedRecordStatus] = []
        var lastSync: Date?
        var reachable = true
        for host in hosts {
            let engine = host.engine
            // The Documents folder itself is in neither scope; the drive's own
            // container is all documents (its whole tree is the user's).
            let isDriveRoot = drive != nil && host === hosts[0]
            let (items, documentsItems, dataItems) = host.replica.read { ns in QueryService.countItems(in: ns) }
            let pending = host.replica.read { ns in ns.pendingSummary() }
            let downloads = engine.downloadSummary()
            let folder = isDriveRoot ? "/" : folders.first(where: { $0.containerID == host.id })?.name.description
            perContainer.append(ContainerStatus(
                id: host.id, folder: folder, items: items,
                documentsItems: isDriveRoot ? items : documentsItems,
                dataItems: isDriveRoot ? 0 : dataItems,
                pendingItems: pending.items, pendingBytes: pending.bytes,
                downloadingItems: downloads.items, downloadingBytes: downloads.bytes,
                cachedBytes: engine.cacheUsage()))
            let s = engine.currentStatus
            reachable = reachable && s.storeReachable
            errors += s.recentErrors.map { ($0.date, "\(host.id): \($0.message)") }
            for failure in engine.failingUploads() {
                let path = host.replica.read { ns in ns.path(of: failure.ino) } ?? "inode \(failure.ino)"
                failing.append(FailingUpload(container: host.id, path: path, attempts: failure.attempts, error: failure.message))
            }
            for record in engine.quarantinedRecords {
                quarantined.append(QuarantinedRecordStatus(container: host.id, seq: record.seq, reason: record.reason,
                                                     date: isoDate(record.date)))
            }
            if let d = s.lastSync, d > (lastSync ?? .distantPast) { lastSync = d }
        }
        let (view, scope): (MountStatus.View, Scope?) = switch kind {
        case .container(_, let scope): (.container, scope)
        case .drive: (.drive, nil)
        }
        return MountStatus(
            pid: getpid(), mountpoint: mountpoint, view: view, container: hosts[0].id, scope: scope,
            store: daemon.storePath, dataHome: daemon.locations.dataHome.path, storeReachable: reachable,
            storeLatencyMs: (daemon.store as? S3Store)?.client.roundTripMilliseconds, containers: perContainer,
            cacheLimitBytes: daemon.settings.cacheLimit, lastSync: lastSync.map(isoDate),
            failingUploads: failing, quarantinedRecords: quarantined,
            recentErrors: errors.sorted { $0.0 < $1.0 }.suffix(20).map { RecentError(date: isoDate($0.0), message: $0.1) })
    }
}
