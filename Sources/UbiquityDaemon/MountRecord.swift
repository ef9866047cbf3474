import Foundation
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
package struct MountRecord: Codable, Equatable {
    package var mountpoint: String
    package var pid: Int32
    package var socket: String

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

    package static func load(_ locations: Locations, mountpoint: String) -> MountRecord? {
        guard let data = FileManager.default.contents(atPath: locations.mountRecord(mountpoint: mountpoint).path) else { return nil }
        return try? JSONDecoder().decode(MountRecord.self, from: data)
    }

    /// Remove the record of `mountpoint` if it still names `pid` (a new
    /// mount there has its own).
    package static func remove(_ locations: Locations, mountpoint: String, pid: Int32) {
        if load(locations, mountpoint: mountpoint)?.pid == pid {
            unlink(locations.mountRecord(mountpoint: mountpoint).path)
        }
    }
}
