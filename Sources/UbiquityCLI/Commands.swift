import ArgumentParser
import Foundation
import UbiquityDaemon
import UbiquityLocator
import UbiquityFUSE
import UbiquityProtocol
import UbiquityReplica
import UbiquityModel
#if canImport(Glibc)
import Glibc
#endif

/// `ubiquityfs` — the command-line interface. `main.swift` only calls `UbiquityCommand.main()`.
public struct UbiquityCommand: ParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "ubiquityfs",
        abstract: "Mount synced containers (iCloud Documents for Linux).",
        version: "ubiquityfs \(ubiquityVersion)",
        subcommands: [Mount.self, Unmount.self, Status.self, Download.self, Evict.self, Pin.self, Unpin.self,
                      Versions.self, Restore.self, Trash.self, Resolve.self, Container.self, CollectGarbage.self, QueryCommand.self, Service.self])

    public init() {}

    /// Every command runs with umask 077: what ubiquityfs creates (data
    /// home, replicas, runtime files, a private store) is its owner's only.
    /// A shared store sets its own modes explicitly.
    ///
    /// Commands fail by throwing: ArgumentParser prints the error
    /// (`UbiquityError`, `ControlError`: their message) and exits with 1, or
    /// with 64 for a `ValidationError` (usage).
    public static func main() {
        umask(0o077)
        main(nil)
    }
}

func absolutePath(_ path: String) -> String {
    let url = URL(fileURLWithPath: path, relativeTo: URL(fileURLWithPath: FileManager.default.currentDirectoryPath))
    return url.standardizedFileURL.path
}

struct Mount: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount the drive, or one container; returns once the mount is ready.",
        discussion: """
            Without --container: the drive view — this device's own container (com.ubiquityfs.default) at the \
            root, and a folder per container whose Documents scope is public, named by its display name. \
            With --container: that container, or one --scope of it.
            Without --store: the store this mountpoint used last (remembered in \
            $XDG_CONFIG_HOME/ubiquityfs/mounts.json), else the folder store in $XDG_DATA_HOME/ubiquityfs/store \
            (created on first use). An S3 store: --store s3://BUCKET/PREFIX [--endpoint URL] [--region R], \
            with credentials from the environment or ~/.aws (AWS_PROFILE or --profile).
            All mounts of one store on this device are served by one daemon.
            """)

    @Argument(help: "An existing, empty directory.") var mountpoint: String
    @OptionGroup var storeOptions: StoreOptions
    @Option(help: "Mount this container instead of the drive.") var container: String?
    @Flag(help: "Stay in the foreground and log to stderr.") var foreground = false
    @Option(name: .customShort("o"), help: "Extra FUSE mount options, comma-separated.") var options: [String] = []
    @Option(help: "Seconds between checks of the store for other devices' changes (the folder store also notifies at once through inotify).")
    var pollInterval: Double = 1
    @Option(parsing: .unconditional,
            help: "Keep at most this much downloaded content per container (e.g. 500M, 20G); least recently used files are evicted first.")
    var cacheSize: String?
    @Option(help: "This device's name, used in conflicted-copy names (default: the host name; remembered).")
    var deviceName: String?
    @Option(help: "With --container: documents (the Documents folder, folder levels enforced), data (all but Documents) or all (the default).")
    var scope: Scope?
    @Flag(help: "When the store is new, make it shared by the group of its folder (store folders 0770, files 0640) instead of private to you (0700, 0600).")
    var sharedStore = false
    @Option(help: .hidden) var notifyFd: Int32?

    func validate() throws {
        guard !mountpoint.isEmpty else { throw ValidationError("the mountpoint is empty: name an existing, empty directory") }
        guard pollInterval > 0, pollInterval <= 3600 else {
            throw ValidationError("--poll-interval must be more than 0 and at most 3600 seconds (got \(pollInterval.formatted()))")
        }
        if let deviceName, deviceName.count > 64 || deviceName.contains("/") || RecordFormat.problem(deviceName: deviceName) != nil {
            throw ValidationError("--device-name must be 1 to 64 characters (at most 255 bytes) without '/' or control characters")
        }
        if let cacheSize, parseSize(cacheSize) == nil {
            throw ValidationError("--cache-size: '\(cacheSize)' is not a size (examples: 500M, 20G, 1048576)")
        }
        if scope != nil && container == nil {
            throw ValidationError("--scope needs --container (the drive shows each public container's Documents)")
        }
    }

    func run() throws {
        let mountpoint = absolutePath(self.mountpoint)
        let explicitStore = storeOptions.address
        let settings = DaemonSettings(store: try explicitStore ?? RememberedStores.store(for: mountpoint),
                                      foreground: foreground || notifyFd != nil,
                                      pollInterval: pollInterval, cacheLimit: cacheSize.flatMap(parseSize),
                                      deviceName: deviceName, sharedStore: sharedStore, notifyFD: notifyFd)
        let request = MountParameters(mountpoint: mountpoint, container: container, scope: scope ?? .all,
                                      fuseOptions: options.flatMap { $0.split(separator: ",").map(String.init) },
                                      deviceName: deviceName, sharedStore: sharedStore)
        let locations = Locations()
        let storeKey = settings.store?.key ?? locations.defaultStore.path
        let socket = locations.daemonSocket(store: storeKey).path
        if settings.foreground {
            do {
                try locations.prepareRuntimeDirectory()
                if notifyFd == nil, let pid = try runningDaemon(socket: socket) {
                    throw UbiquityError(EBUSY, "a daemon (pid \(pid)) already serves this store on this device; mount without --foreground to add to it")
                }
                chdir("/")
                try Daemon(settings: settings).run(first: request)
            } catch {
                if let fd = notifyFd { Daemon.notify(fd, "error \(UbiquityError.wrap(error))") }
                throw error
            }
            return
        }
        // Check what can be checked before starting a daemon, for a clear message.
        _ = try Daemon.validateMountpoint(request.mountpoint)
        let what = container.map { "\($0)\(scope.map { " (\($0.rawValue) scope)" } ?? "")" } ?? "the drive"
        let from = settings.store.map { " from \($0.description)" } ?? ""
        func joined(_ ready: MountReady) {
            if explicitStore != nil { RememberedStores.remember(explicitStore, for: request.mountpoint) }
            reportCreated(ready.created)
            print("Mounted \(what)\(from) at \(request.mountpoint) (daemon pid \(ready.pid))")
        }
        // A running daemon takes mounts side by side (a slow one does not hold up the others).
        if let ready = try join(request, socket: socket) { return joined(ready) }
        // None runs: one `mount` at a time starts it (the others then join it).
        let lockPath = locations.daemonLock(store: storeKey).path
        try locations.prepareRuntimeDirectory()
        let lock = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lock >= 0 else { throw UbiquityError.posix("open \(lockPath)") }
        defer { close(lock) }
        while flock(lock, LOCK_EX) != 0 && errno == EINTR {}
        if let ready = try join(request, socket: socket) { return joined(ready) }
        let (pid, message) = try spawnDaemon(request, settings)
        guard message.hasPrefix("ready") else {
            throw UbiquityError(EIO, message.hasPrefix("error ") ? String(message.dropFirst(6)) : message)
        }
        if explicitStore != nil { RememberedStores.remember(explicitStore, for: request.mountpoint) }
        let log = message.components(separatedBy: " log ").last ?? ""
        let words = message.components(separatedBy: " log ").first?.split(separator: " ") ?? []
        if let index = words.firstIndex(of: "created"), index + 1 < words.count {
            reportCreated(words[index + 1].split(separator: ",").map(String.init))
        }
        print("Mounted \(what)\(from) at \(request.mountpoint) (daemon pid \(pid); log: \(log))")
    }

    /// Say so when the mount made a container the store did not have (a
    /// mistyped ID would otherwise go unnoticed).
    func reportCreated(_ created: [String]) {
        for id in created {
            print("Created container \(id) in the store: it did not exist (if you meant another, unmount and run `ubiquityfs container list`)")
        }
    }

    /// The pid of the daemon serving the store, or nil if none runs.
    func runningDaemon(socket: String) throws -> Int32? {
        try askDaemon(socket: socket, .ping, expecting: DaemonInfo.self)?.pid
    }

    /// Ask the store's running daemon to add this mount; nil if no daemon runs.
    func join(_ request: MountParameters, socket: String) throws -> MountReady? {
        try askDaemon(socket: socket, .mount(request), expecting: MountReady.self)
    }

    /// Send `command` to the store's daemon; nil if none listens. A daemon
    /// that is stopping (its last mount just ended) is waited for.
    func askDaemon<Result: Codable & Sendable>(socket: String, _ command: Command, expecting: Result.Type) throws -> Result? {
        for _ in 0..<100 {
            do {
                return try ControlClient.call(socket: socket, ControlRequest(command), expecting: Result.self)
            } catch let error as ControlError where error.code == .unreachable && [ENOENT, ECONNREFUSED].contains(error.errno) {
                return nil
            } catch let error as ControlError where error.code == .noAnswer || error.message.contains("stopping") {
                usleep(100_000)   // it is exiting
            }
        }
        throw UbiquityError(ETIMEDOUT, "the daemon at \(socket) neither answers nor exits")
    }

    /// Start `ubiquityfs mount … --notify-fd 3` in its own session and wait
    /// for its first line: "ready pid N …" or "error MESSAGE".
    func spawnDaemon(_ request: MountParameters, _ settings: DaemonSettings) throws -> (pid: pid_t, message: String) {
        // Close-on-exec pipe: only the dup2'ed copy (fd 3) reaches the daemon,
        // so the parent sees EOF as soon as the daemon closes it.
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw UbiquityError.posix("pipe") }
        _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
        if fds[1] == 3 {
            let moved = fcntl(3, F_DUPFD_CLOEXEC, 10)
            close(3)
            fds[1] = moved
        }
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var arguments = [exe, "mount", request.mountpoint, "--notify-fd", "3", "--poll-interval", String(settings.pollInterval)]
        if let container = request.container { arguments += ["--container", container, "--scope", request.scope.rawValue] }
        if let store = settings.store { arguments += store.arguments }
        if let limit = settings.cacheLimit { arguments += ["--cache-size", String(limit)] }
        if let name = settings.deviceName { arguments += ["--device-name", name] }
        if settings.sharedStore { arguments.append("--shared-store") }
        if !request.fuseOptions.isEmpty { arguments += ["-o", request.fuseOptions.joined(separator: ",")] }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addclose(&actions, fds[0])
        posix_spawn_file_actions_adddup2(&actions, fds[1], 3)
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // POSIX_SPAWN_SETSID: survive the terminal. Not over an automount
        // trigger (fstab's x-systemd.automount): systemd's automount lets only
        // its mount's process group walk to the mountpoint while the mount is
        // pending, and the daemon must, to mount there.
        let absolute = (try? Daemon.validateMountpoint(request.mountpoint)) ?? request.mountpoint
        let overAutomount = MountTable.entries().last(where: { $0.mountpoint == absolute })?.type == "autofs"
        if !overAutomount { posix_spawnattr_setflags(&attributes, Int16(0x80)) }

        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, exe, &actions, &attributes, &argv, environ)
        close(fds[1])
        guard rc == 0 else {
            close(fds[0])
            throw UbiquityError(rc, "cannot start the daemon: \(String(cString: strerror(rc)))")
        }
        var output = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(fds[0], &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            output.append(contentsOf: buffer[0..<n])
        }
        close(fds[0])
        let message = String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if message.isEmpty {
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            throw UbiquityError(EIO, "the daemon exited before the mount was ready (status \(status)); see its log under $XDG_DATA_HOME/ubiquityfs/replicas")
        }
        return (pid, message)
    }
}

struct Unmount: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Wait until every change is in the store, then unmount.",
        discussion: """
            Only this device's ubiquityfs mounts: any other filesystem, and another device's or user's \
            ubiquityfs mount, is refused. The daemon is found from the mount itself, whatever the \
            environment (another shell, su, cron).
            """)

    @Argument(help: "The mountpoint.") var mountpoint: String
    @Flag(help: "Detach at once; pending changes stay queued for the next mount.") var force = false

    func run() throws {
        let path = resolvedPath(mountpoint)
        let daemon = try MountLocator.daemon(of: path)
        let locations = Locations()
        if force {
            try Unmounter.unmount(path, lazy: true)
            if MountLocator.isDead(daemon) { MountRecord.remove(locations, mountpoint: path, pid: daemon.pid) }
            print("Detached \(path); changes not yet pushed stay queued for the next mount.")
            return
        }
        var lastLine = ""
        let isTTY = isatty(STDERR_FILENO) != 0
        defer { if isTTY && !lastLine.isEmpty { FileHandle.standardError.write(Data("\n".utf8)) } }
        do {
            _ = try ControlClient.call(socket: daemon.socket, ControlRequest(.unmount), expecting: NoResult.self, onUpdate: { update in
                guard case .pushing(let progress) = update else { return }
                let text = "Pushing to the store: \(counted(progress.itemsLeft, "item")), \(formatBytes(progress.bytesLeft)) left"
                // Nothing to report while nothing was ever pending (each container answers once).
                if text != lastLine && !(progress.itemsLeft == 0 && lastLine.isEmpty) {
                    FileHandle.standardError.write(Data(((isTTY ? "\r\u{1b}[K" : "") + text + (isTTY ? "" : "\n")).utf8))
                    lastLine = text
                }
            })
        } catch let error as ControlError where error.code == .unreachable && [ENOENT, ECONNREFUSED].contains(error.errno) {
            guard MountLocator.isDead(daemon) else {
                throw UbiquityError(EAGAIN, "the daemon of \(path) (pid \(daemon.pid)) runs but does not answer at \(daemon.socket) (\(error)); `kill \(daemon.pid)` stops it (changes stay queued), or `ubiquityfs unmount --force` detaches the mount")
            }
            // Its daemon died: unmount what is left; the replica keeps the queue.
            try Unmounter.unmount(path, lazy: false)
            MountRecord.remove(locations, mountpoint: path, pid: daemon.pid)
            print("Unmounted \(path) (its daemon was not running; pending changes are pushed at the next mount).")
            return
        } catch let error as ControlError where error.code == .noAnswer {
            throw UbiquityError(EIO, "the daemon stopped before confirming; pending changes stay queued")
        }
        print("Unmounted \(path); every change is in the store.")
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the sync status of a mount (or of every mount of this device).",
        discussion: "Without a mountpoint: every ubiquityfs mount this device's daemons serve; the others (other devices' or users') are named on stderr.")

    @Argument(help: "The mountpoint (default: every ubiquityfs mount of this device).") var mountpoint: String?
    @Flag(help: "Print JSON (one object per mount).") var json = false

    func run() throws {
        let mountpoints = mountpoint.map { [resolvedPath($0)] } ?? MountLocator.mounts()
        if mountpoints.isEmpty { throw UbiquityError(ENOENT, "no ubiquityfs mount") }
        var shown = 0
        var others: [String] = []       // other devices' or users' mounts
        var unreachable: [String] = []  // this device's, whose daemon did not answer
        for path in mountpoints {
            let status: MountStatus
            do {
                let daemon = try MountLocator.daemon(of: path)
                do {
                    status = try ControlClient.call(socket: daemon.socket, ControlRequest(.status), expecting: MountStatus.self)
                } catch let error as ControlError where error.code == .unreachable || error.code == .noAnswer {
                    throw UbiquityError(ENOTCONN, "its daemon (pid \(daemon.pid)) does not answer (\(error))")
                }
            } catch {
                // One mountpoint asked for: its error is the answer. Every mount: say which were left out.
                if mountpoint != nil { throw error }
                if (error as? UbiquityError)?.errno == EPERM {
                    others.append(path)
                } else {
                    unreachable.append("\(path) (\(error))")
                }
                continue
            }
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
                print(String(decoding: try encoder.encode(status), as: UTF8.self))
                shown += 1
                continue
            }
            if shown > 0 { print() }
            shown += 1
            printStatus(status, path: path)
        }
        if !others.isEmpty {
            FileHandle.standardError.write(Data("ubiquityfs: not shown, \(others.count) mount\(others.count == 1 ? "" : "s") of other devices or users: \(others.joined(separator: ", "))\n".utf8))
        }
        if !unreachable.isEmpty {
            FileHandle.standardError.write(Data("ubiquityfs: not shown, not answering: \(unreachable.joined(separator: "; "))\n".utf8))
        }
        if shown == 0 { throw UbiquityError(ENOENT, "no ubiquityfs mount of this device (data home \(Locations().dataHome.path))") }
    }

    func printStatus(_ status: MountStatus, path: String) {
        let view = status.view == .drive ? "the drive" : "container \(status.container), \((status.scope ?? .all).rawValue) scope"
        print("Mount:        \(path) (\(view), daemon pid \(status.pid))")
        let latency = status.storeLatencyMs.map { String(format: ", %.0f ms", $0) } ?? ""
        let reachable = status.storeReachable ? "reachable\(latency)" : "UNREACHABLE (working offline; changes are queued)"
        print("Store:        \(status.store) (\(reachable))")
        print("Items:        \(status.items) (Documents scope \(status.documentsItems), Data scope \(status.dataItems))")
        for container in status.containers {
            let folder = container.folder.map { " in \($0 == "/" ? "the root" : "folder \"\($0)\"")" } ?? ""
            print("  \(container.id)\(folder): \(counted(container.items, "item")) (Documents \(container.documentsItems), Data \(container.dataItems)), \(container.pendingItems) to upload, \(container.downloadingItems) downloading")
        }
        print("Uploads:      \(counted(status.pendingItems, "item")), \(formatBytes(status.pendingBytes)) pending")
        print("Downloads:    \(counted(status.downloadingItems, "item")), \(formatBytes(status.downloadingBytes)) to go")
        let limit = status.cacheLimitBytes.map { " of \(formatBytes($0))" } ?? ""
        print("Local:        \(formatBytes(status.cachedBytes))\(limit) downloaded")
        print("Last sync:    \(status.lastSync ?? "never")")
        let failing = status.failingUploads
        if !failing.isEmpty {
            print("Not uploaded: \(failing.count) item\(failing.count == 1 ? "" : "s") the store refused (retried with back-off; the others go ahead)")
            for f in failing.prefix(10) { print("  \(f.path) (\(f.attempts) tries): \(f.error)") }
        }
        // Journal records skipped because they failed validation (the reasons are printable).
        let quarantined = status.quarantinedRecords
        for q in quarantined.suffix(10) {
            print("Quarantined:  record \(q.seq) of \(q.container): \(q.reason)")
        }
        if quarantined.count > 10 { print("  and \(quarantined.count - 10) earlier quarantined records (status --json lists them all)") }
        let errors = status.recentErrors
        if !errors.isEmpty {
            print("Recent errors:")
            for e in errors.suffix(5) { print("  \(e.date) \(e.message)") }
        }
    }
}

/// This build's version (`ubiquityfs --version`).
let ubiquityVersion = "0.5.0"


func formatBytes(_ bytes: UInt64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var value = Double(bytes)
    var unit = 0
    while value >= 1024 && unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    return unit == 0 ? "\(bytes) B" : String(format: "%.1f %@", value, units[unit])
}

/// "500M" → 524288000. Suffixes K, M, G, T (powers of 1024), optional "iB"/"B".
func parseSize(_ text: String) -> UInt64? {
    var s = text.trimmingCharacters(in: .whitespaces).uppercased()
    for suffix in ["IB", "B"] where s.hasSuffix(suffix) && s.count > suffix.count { s.removeLast(suffix.count) }
    let units: [Character: UInt64] = ["K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40]
    var multiplier: UInt64 = 1
    if let last = s.last, let unit = units[last] {
        multiplier = unit
        s.removeLast()
    }
    guard let value = Double(s), value >= 0, value * Double(multiplier) < 1.8e19 else { return nil }
    return UInt64(value * Double(multiplier))
}
