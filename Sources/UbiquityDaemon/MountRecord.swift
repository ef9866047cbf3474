import Foundation
@_exported import UbiquityLocator
import UbiquityReplica
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

extension MountRecord {
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
        load(dataHome: locations.dataHome, mountpoint: mountpoint)
    }

    /// Remove the record of `mountpoint` if it still names `pid` (a new
    /// mount there has its own).
    package static func remove(_ locations: Locations, mountpoint: String, pid: Int32) {
        if load(locations, mountpoint: mountpoint)?.pid == pid {
            unlink(locations.mountRecord(mountpoint: mountpoint).path)
        }
    }
}
