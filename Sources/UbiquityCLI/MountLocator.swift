import Foundation
import UbiquityDaemon
import UbiquityFUSE
import UbiquityProtocol
import UbiquityReplica
import UbiquityModel
#if canImport(Glibc)
import Glibc
#endif

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

    /// Send a request about `paths` to the daemon(s) serving them (one
    /// request per mount, made by `command` from the paths below it), passing
    /// updates to `onUpdate`; fails with the daemon's error.
    static func run(paths: [String], onUpdate: (Update) -> Void = { _ in },
                    _ command: (_ paths: [[String]]) -> Command) throws {
        var byMount: [String: [[String]]] = [:]
        for path in paths {
            let (mountpoint, components) = try locate(path)
            byMount[mountpoint, default: []].append(components)
        }
        for (mountpoint, components) in byMount.sorted(by: { $0.key < $1.key }) {
            let daemon = try daemon(of: mountpoint)
            do {
                _ = try ControlClient.call(socket: daemon.socket, ControlRequest(command(components)), expecting: NoResult.self,
                                           onUpdate: onUpdate)
            } catch let error as ControlError where error.code == .noAnswer {
                throw UbiquityError(EIO, "the daemon of \(mountpoint) did not answer")
            }
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
