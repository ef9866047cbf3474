import ArgumentParser
import Foundation
import UbiquityDaemon
import UbiquityFUSE
import UbiquityReplica
import UbiquityModel
#if canImport(Glibc)
import Glibc
#endif

/// The write end of the pipe the service's signal handler writes to.
nonisolated(unsafe) private var serviceSignalPipe: Int32 = -1

/// `ubiquityfs service`: what the systemd user unit `ubiquityfs.service`
/// runs. It mounts what this device remembers (each mount through `mount`,
/// so one daemon serves each store), says READY=1, copies the daemons' logs
/// to its output (the journal), and on SIGTERM unmounts as `unmount` does.
struct Service: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount the mounts this device remembers and keep them until stopped (the systemd user service).",
        discussion: """
            Run by the systemd user unit (systemctl --user enable --now ubiquityfs). It mounts each line of \
            $XDG_CONFIG_HOME/ubiquityfs/service.conf — a mountpoint, then any `ubiquityfs mount` options, e.g. \
            "~/Cloud" or "~/Notes --container com.example.notes --scope documents" (# starts a comment; no quoting) — \
            and each mountpoint of $XDG_CONFIG_HOME/ubiquityfs/mounts.json not named there (the mountpoints mounted \
            with --store: the drive of the store each used last). One daemon serves all mounts of a store. Once \
            every mount was tried it tells systemd it is ready (sd_notify READY=1) and copies the daemons' logs to \
            its output (the journal). SIGTERM or SIGINT unmounts each as `ubiquityfs unmount` does, waiting until \
            every change is in the store (a store that cannot take them: detached, changes stay queued), then exits. \
            A mountpoint already mounted by this device is kept as it is and unmounted with the others; a mount \
            made by hand while the service runs, of a store it serves, joins that daemon and ends with the service. \
            A daemon that dies makes the service fail (systemd restarts it); one whose mounts were all unmounted by \
            hand is let go, and the service ends when none is left.
            """)

    @Option(help: "The mounts to make (default: $XDG_CONFIG_HOME/ubiquityfs/service.conf, if it exists).")
    var config: String?
    @Flag(help: "Leave out the mountpoints remembered in mounts.json.")
    var noRemembered = false

    /// One mount to make: the mountpoint and the rest of `mount`'s arguments.
    struct Entry: Equatable {
        var mountpoint: String
        var options: [String]
    }

    static var defaultConfig: URL {
        RememberedStores.file.deletingLastPathComponent().appendingPathComponent("service.conf")
    }

    /// The lines of a service.conf: `MOUNTPOINT [mount options…]`; `~/` is the home folder.
    static func parse(_ text: String, home: String) -> [Entry] {
        text.split(whereSeparator: \.isNewline).compactMap { line in
            let uncommented = line.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            var words = uncommented.split(whereSeparator: \.isWhitespace).map(String.init)
            guard !words.isEmpty else { return nil }
            words = words.map { $0 == "~" ? home : $0.hasPrefix("~/") ? home + $0.dropFirst(1) : $0 }
            return Entry(mountpoint: words[0], options: Array(words.dropFirst()))
        }
    }

    func entries() throws -> [Entry] {
        let file = config.map { URL(fileURLWithPath: absolutePath($0)) } ?? Self.defaultConfig
        var list: [Entry] = []
        if let data = FileManager.default.contents(atPath: file.path) {
            list = Self.parse(String(decoding: data, as: UTF8.self), home: StoreAddress.home)
        } else if config != nil {
            throw UbiquityError(ENOENT, "cannot read \(file.path)")
        }
        if !noRemembered {
            let named = Set(list.map { absolutePath($0.mountpoint) })
            for mountpoint in try RememberedStores.load().keys.sorted() where !named.contains(mountpoint) {
                list.append(Entry(mountpoint: mountpoint, options: []))
            }
        }
        return list
    }

    /// A line to the journal (what `mount` and `unmount` printed first: stdout is buffered).
    func say(_ text: String) {
        fflush(nil)
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    func run() throws {
        let notifySocket = ProcessInfo.processInfo.environment["NOTIFY_SOCKET"]
        unsetenv("NOTIFY_SOCKET")   // the daemons are not the service's main process
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw UbiquityError.posix("pipe") }
        _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
        _ = fcntl(fds[1], F_SETFL, O_NONBLOCK)
        serviceSignalPipe = fds[1]
        let handler: @convention(c) (Int32) -> Void = { signal in
            var byte = UInt8(truncatingIfNeeded: signal)
            _ = write(serviceSignalPipe, &byte, 1)
        }
        signal(SIGTERM, handler)
        signal(SIGINT, handler)
        signal(SIGHUP, handler)

        let list = try entries()
        var mounted: [String] = []
        var daemons: [Int32: (log: LogFollower?, mountpoints: Set<String>)] = [:]
        var failed: [String] = []
        var already = 0
        for entry in list {
            let mountpoint = absolutePath(entry.mountpoint)
            cleanDeadMount(mountpoint)
            do {
                if Unmounter.isMountpoint(mountpoint), let record = try? MountLocator.daemon(of: mountpoint) {
                    // Mounted by hand before the service started: the service looks after it from now on.
                    say("\(mountpoint): already mounted by this device (daemon pid \(record.pid)); the service keeps it")
                    already += 1
                    mounted.append(mountpoint)
                    if daemons[record.pid] == nil { daemons[record.pid] = (LogFollower(pid: record.pid), []) }
                    daemons[record.pid]?.mountpoints.insert(mountpoint)
                    continue
                }
                var command = try Mount.parse([mountpoint] + entry.options)
                guard !command.foreground else { throw ValidationError("--foreground has no place in the service") }
                command.mountpoint = mountpoint
                try command.run()
                fflush(nil)
                let record = try MountLocator.daemon(of: mountpoint)
                mounted.append(mountpoint)
                if daemons[record.pid] == nil {
                    daemons[record.pid] = (LogFollower(pid: record.pid), [])
                }
                daemons[record.pid]?.mountpoints.insert(mountpoint)
            } catch {
                say("\(mountpoint): not mounted: \(Mount.message(for: error))")
                failed.append(mountpoint)
            }
        }
        let summary = list.isEmpty
            ? "nothing to mount: no line in \(Self.defaultConfig.path) and no mountpoint in \(RememberedStores.file.path)"
            : "\(mounted.count) of \(list.count) mounted" + (already > 0 ? " (\(already) already were)" : "")
                + (failed.isEmpty ? "" : "; not mounted: " + failed.joined(separator: ", "))
        say(summary)
        SystemdNotify.send("READY=1\nSTATUS=\(summary)", socketPath: notifySocket)
        if !list.isEmpty && mounted.isEmpty && !failed.isEmpty {
            throw ExitCode.failure   // nothing could be mounted: let systemd try again
        }
        if daemons.isEmpty { return }

        // Serve: follow the logs, notice daemons that end, until a signal.
        var byte: UInt8 = 0
        var stopRequested = false
        while !stopRequested {
            var poller = pollfd(fd: fds[0], events: Int16(POLLIN), revents: 0)
            if poll(&poller, 1, 1000) > 0, read(fds[0], &byte, 1) == 1 {
                say("signal \(byte): unmounting \(mounted.filter(Unmounter.isMountpoint).joined(separator: ", "))")
                stopRequested = true
            }
            for (pid, daemon) in daemons {
                daemon.log?.forward()
                guard let exitedCleanly = Self.ended(pid) else { continue }
                daemon.log?.forward()
                daemons[pid] = nil
                let left = daemon.mountpoints.filter { Unmounter.isMountpoint($0) }
                if exitedCleanly && left.isEmpty {
                    say("daemon \(pid) ended: its mounts (\(daemon.mountpoints.sorted().joined(separator: ", "))) were unmounted")
                    mounted.removeAll { daemon.mountpoints.contains($0) }
                } else {
                    say("daemon \(pid) died (\(exitedCleanly ? "exit status 0, its mounts left dead" : "killed or failed")); its mounts: \(daemon.mountpoints.sorted().joined(separator: ", "))")
                    for mountpoint in left { cleanDeadMount(mountpoint) }
                    SystemdNotify.send("STOPPING=1", socketPath: notifySocket)
                    stop(mounted, daemons: &daemons)
                    throw ExitCode.failure
                }
            }
            if daemons.isEmpty && !stopRequested {
                say("every mount was unmounted; the service ends")
                return
            }
        }
        SystemdNotify.send("STOPPING=1", socketPath: notifySocket)
        stop(mounted, daemons: &daemons)
    }

    /// Unmount `mountpoints` as `unmount` does (waiting for the pushes; a
    /// store that cannot take them: detached, the queue kept), then wait for
    /// the daemons to end.
    func stop(_ mountpoints: [String], daemons: inout [Int32: (log: LogFollower?, mountpoints: Set<String>)]) {
        // Its daemons' other mounts too (made by hand meanwhile, joining them): they end with the service.
        let others = MountTable.ubiquityMounts().filter { entry in
            entry.daemonPID.map { daemons[$0] != nil } == true && !mountpoints.contains(entry.mountpoint)
        }.map(\.mountpoint)
        for mountpoint in mountpoints + others where Unmounter.isMountpoint(mountpoint) {
            guard (try? MountLocator.daemon(of: mountpoint)) != nil else { continue }
            do {
                try Unmount.parse([mountpoint]).run()
                fflush(nil)
            } catch {
                say("\(mountpoint): \(Unmount.message(for: error)); detaching it (changes stay queued for the next mount)")
                try? Unmount.parse([mountpoint, "--force"]).run()
            }
        }
        // The daemons exit with their last mount.
        let deadline = Date().addingTimeInterval(30)
        while !daemons.isEmpty && Date() < deadline {
            for (pid, daemon) in daemons {
                daemon.log?.forward()
                if Self.ended(pid) != nil {
                    daemon.log?.forward()
                    daemons[pid] = nil
                }
            }
            if !daemons.isEmpty { usleep(100_000) }
        }
        for pid in daemons.keys {
            say("daemon \(pid) did not end; sending SIGTERM (what is not pushed stays queued)")
            kill(pid, SIGTERM)
        }
    }

    /// Whether daemon `pid` has ended (nil: it runs): true if it exited with
    /// status 0. A daemon that is not the service's child (mounted before
    /// the service started) is polled; its status is unknown, taken as 0
    /// (its mounts, left dead or not, say the rest).
    static func ended(_ pid: Int32) -> Bool? {
        var status: Int32 = 0
        let waited = waitpid(pid, &status, WNOHANG)
        if waited == pid { return (status & 0x7f) == 0 && ((status >> 8) & 0xff) == 0 }
        if waited == -1 && errno == ECHILD && kill(pid, 0) != 0 && errno == ESRCH { return true }
        return nil
    }

    /// A dead FUSE mount of this user's (its daemon died): lazily unmounted,
    /// so that the mountpoint can be mounted again.
    func cleanDeadMount(_ mountpoint: String) {
        var st = stat()
        guard stat(mountpoint, &st) != 0, errno == ENOTCONN || errno == ECONNABORTED else { return }
        guard let entry = MountTable.entry(at: mountpoint), entry.type == MountTable.ubiquityType else { return }
        say("\(mountpoint): its daemon is gone; detaching the dead mount")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/fusermount3")
        process.arguments = ["-u", "-z", mountpoint]
        try? process.run()
        process.waitUntilExit()
    }
}

/// Copies what a daemon appends to its log (its stderr is the log file) to
/// the service's output, line by line.
final class LogFollower {
    let path: String
    let fd: Int32
    var pending = Data()

    init?(pid: Int32) {
        guard let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/2"), path.hasPrefix("/") else { return nil }
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        lseek(fd, 0, SEEK_END)
        self.path = path
        self.fd = fd
    }

    deinit { close(fd) }

    func forward() {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(fd, &buffer, buffer.count)
            if n <= 0 { break }
            pending.append(contentsOf: buffer[0..<n])
        }
        guard let last = pending.lastIndex(of: 0x0a) else { return }
        FileHandle.standardOutput.write(pending[pending.startIndex...last])
        pending.removeSubrange(pending.startIndex...last)
    }
}
