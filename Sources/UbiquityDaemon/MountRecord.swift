import Foundation
import UbiquityFUSE
import UbiquityReplica
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// What this device knows of one of its mounts: the daemon serving it and
/// that daemon's control socket, in `$XDG_DATA_HOME/ubiquityfs/mounts/`
/// (owner-only, keyed by mountpoint). The daemon writes it once the mount is
/// ready and removes it when the mount ends.
///
/// The mount names its daemon too (its source is `ubiquityfs:PID`). A mount
/// whose pid matches this device's record is this device's mount; any other
/// ubiquityfs mount belongs to another device or user, and a record the mount
/// does not name is stale. So a command finds the daemon of a mount from the
/// mount and the data home, never from the environment's runtime directory:
/// `su`, cron or another shell reach the same daemon, and never mistake a
/// live mount for a dead one.
struct MountRecord: Codable, Equatable {
    var mountpoint: String
    var pid: Int32
    var socket: String

    /// Write the record (owner-only, replaced atomically).
    func save(_ locations: Locations) throws {
        let url = locations.mountRecord(mountpoint: mountpoint)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let data = try JSONEncoder().encode(self)
        let tmp = url.path + ".tmp-\(getpid())"
        let fd = try syscallRetrying("create \(tmp)") { open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600) }
        let written = data.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        guard written == data.count, rename(tmp, url.path) == 0 else {
            let error = UbiquityError.posix("write \(url.path)")
            unlink(tmp)
            throw error
        }
    }

    static func load(_ locations: Locations, mountpoint: String) -> MountRecord? {
        guard let data = FileManager.default.contents(atPath: locations.mountRecord(mountpoint: mountpoint).path) else { return nil }
        return try? JSONDecoder().decode(MountRecord.self, from: data)
    }

    /// Remove the record of `mountpoint` if it still names `pid` (a new
    /// mount there has its own).
    static func remove(_ locations: Locations, mountpoint: String, pid: Int32) {
        if load(locations, mountpoint: mountpoint)?.pid == pid {
            unlink(locations.mountRecord(mountpoint: mountpoint).path)
        }
    }
}

/// Finding which mount a path belongs to, and the daemon serving it.
enum MountLocator {
    /// Every ubiquityfs mountpoint (this device's or not).
    static func mounts() -> [String] { MountTable.ubiquityMounts().map(\.mountpoint) }

    /// The daemon of this device's mount at `mountpoint`. Anything else is
    /// refused, saying what it is: not mounted, not a ubiquityfs mount, or
    /// another device's or user's mount.
    static func daemon(of mountpoint: String) throws -> MountRecord {
        guard let entry = MountTable.entry(at: mountpoint) else {
            throw UbiquityError(EINVAL, "\(mountpoint) is not mounted")
        }
        guard entry.type == MountTable.ubiquityType else {
            throw UbiquityError(EINVAL, "\(mountpoint) is not a ubiquityfs mount (it is \(entry.type) from \(entry.source)); ubiquityfs leaves it alone")
        }
        let locations = Locations()
        guard let pid = entry.daemonPID, let record = MountRecord.load(locations, mountpoint: mountpoint), record.pid == pid else {
            let who = entry.daemonPID.map { "its daemon is pid \($0)" } ?? "made by an older ubiquityfs"
            throw UbiquityError(EPERM, "\(mountpoint) is a ubiquityfs mount of another device or user (\(who)), not of this device (data home \(locations.dataHome.path)); run the command as that user, with that XDG_DATA_HOME")
        }
        return record
    }

    /// Whether the mount's daemon is gone: the kernel answers ENOTCONN for
    /// the mount, or the pid no longer exists.
    static func isDead(_ record: MountRecord) -> Bool {
        var fs = statvfs()
        if statvfs(record.mountpoint, &fs) != 0 && [ENOTCONN, ECONNABORTED].contains(errno) { return true }
        return kill(record.pid, 0) != 0 && errno == ESRCH
    }

    /// The mount holding `path`, and the path's names below the mount's root.
    static func locate(_ path: String) throws -> (mountpoint: String, components: [String]) {
        let absolute = resolvedPath(path)
        for mountpoint in mounts().sorted(by: { $0.count > $1.count }) {
            if absolute == mountpoint { return (mountpoint, []) }
            let prefix = mountpoint == "/" ? "/" : mountpoint + "/"
            if absolute.hasPrefix(prefix) {
                return (mountpoint, absolute.dropFirst(prefix.count).split(separator: "/").map(String.init))
            }
        }
        throw UbiquityError(EINVAL, "\(absolute) is not inside a ubiquityfs mount")
    }

    /// Send a request about `paths` to the daemon(s) serving them, printing
    /// progress; fails with the daemon's message.
    static func run(_ command: String, paths: [String], extra: [String: Any] = [:],
                    progress: (([String: Any]) -> Void)? = nil, onLine: (([String: Any]) -> Void)? = nil) throws {
        var byMount: [String: [[String]]] = [:]
        for path in paths {
            let (mountpoint, components) = try locate(path)
            byMount[mountpoint, default: []].append(components)
        }
        for (mountpoint, components) in byMount.sorted(by: { $0.key < $1.key }) {
            let daemon = try daemon(of: mountpoint)
            var request = extra
            request["command"] = command
            request["paths"] = components
            var failure: UbiquityError?
            var ok = false
            try ControlClient.call(socket: daemon.socket, request) { line in
                if let p = line["progress"] as? [String: Any] { progress?(p) }
                onLine?(line)
                if let e = line["error"] as? String { failure = UbiquityError(Int32(line["errno"] as? Int ?? Int(EIO)), e) }
                if line["ok"] != nil { ok = true }
            }
            if let failure { throw failure }
            guard ok else { throw UbiquityError(EIO, "the daemon of \(mountpoint) did not answer") }
        }
    }
}

/// `path` made absolute with its folder's symlinks resolved (as the mount
/// table names mountpoints); the last name is kept as given, so that a dead
/// mount (whose root cannot be looked at) is still named.
func resolvedPath(_ path: String) -> String {
    let absolute = absolutePath(path)
    guard absolute != "/" else { return absolute }
    let url = URL(fileURLWithPath: absolute)
    let parent = url.deletingLastPathComponent().path
    guard let resolved = realpath(parent, nil) else { return absolute }
    defer { free(resolved) }
    let folder = String(cString: resolved)
    return (folder == "/" ? "" : folder) + "/" + url.lastPathComponent
}
