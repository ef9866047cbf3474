import Foundation
import UbiquityLocator
import UbiquityModel
#if canImport(Glibc)
import Glibc
#endif

/// Where this device keeps things, from the XDG base directories.
///
/// `$XDG_DATA_HOME/ubiquityfs/` holds `device.json` (this device's identity),
/// `store/` (the default folder store) and `replicas/STORE-ID/CONTAINER/`.
/// Two processes with different `XDG_DATA_HOME` are two devices.
public struct Locations: Sendable {
    public var dataHome: URL

    public init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        dataHome = LocatorPaths.dataHome(environment)
        runtimeDirectory = LocatorPaths.runtimeDirectory(environment)
    }

    public var runtimeDirectory: URL

    public var defaultStore: URL { dataHome.appendingPathComponent("store") }

    public func replica(storeID: String, container: String) -> URL {
        dataHome.appendingPathComponent("replicas").appendingPathComponent(storeID).appendingPathComponent(container)
    }

    /// The runtime directory, created owner-only if missing. One that exists
    /// must be a real directory (not a symlink) owned by this user with no
    /// access for group or others — as ssh-agent and systemd require: the
    /// /tmp fallback has a name anyone can guess, and whoever owns the
    /// directory could put a fake daemon's socket in it.
    @discardableResult
    public func prepareRuntimeDirectory() throws -> URL {
        let path = runtimeDirectory.path
        if mkdir(path, 0o700) != 0 && errno != EEXIST {
            throw UbiquityError.posix("create the runtime directory \(path)")
        }
        var st = stat()
        guard lstat(path, &st) == 0 else { throw UbiquityError.posix("runtime directory \(path)") }
        let advice = "remove it, or set XDG_RUNTIME_DIR to a directory of your own"
        guard (st.st_mode & S_IFMT) == S_IFDIR else {
            throw UbiquityError(EPERM, "refusing the runtime directory \(path): it is not a directory (a symlink?); \(advice)")
        }
        guard st.st_uid == geteuid() else {
            throw UbiquityError(EPERM, "refusing the runtime directory \(path): it belongs to uid \(st.st_uid), not to you (uid \(geteuid())), so its sockets cannot be trusted; \(advice)")
        }
        guard st.st_mode & 0o077 == 0 else {
            throw UbiquityError(EPERM, "refusing the runtime directory \(path): its mode is \(String(st.st_mode & 0o7777, radix: 8)), others may reach or replace its sockets; make it 0700 (chmod 700 \(path)) or \(advice)")
        }
        return runtimeDirectory
    }

    /// The data home (`…/ubiquityfs`), created if missing and made owner-only:
    /// it holds every replica (names and content of the user's files).
    public func prepareDataHome() throws {
        do {
            try FileManager.default.createDirectory(at: dataHome, withIntermediateDirectories: true)
        } catch {
            throw UbiquityError(EACCES, "cannot create \(dataHome.path): \(error.localizedDescription)")
        }
        var st = stat()
        if stat(dataHome.path, &st) == 0, st.st_uid == geteuid(), st.st_mode & 0o077 != 0 {
            chmod(dataHome.path, 0o700)
        }
    }

    /// Where this device records the daemon of its mount at `mountpoint`
    /// (see `MountRecord`).
    public func mountRecord(mountpoint: String) -> URL {
        LocatorPaths.mountRecord(dataHome: dataHome, mountpoint: mountpoint)
    }

    /// The socket of the daemon serving this device's mounts of the store at
    /// `store` (its path as given to `mount`), and the lock `mount` holds
    /// while it finds or starts that daemon.
    public func daemonSocket(store: String) -> URL {
        runtimeDirectory.appendingPathComponent("daemon-\(daemonKey(store)).sock")
    }

    public func daemonLock(store: String) -> URL {
        runtimeDirectory.appendingPathComponent("daemon-\(daemonKey(store)).lock")
    }

    func daemonKey(_ store: String) -> String {
        LocatorPaths.key(dataHome.path + "\n" + store)
    }

    /// The control socket of the mount at `mountpoint` (absolute, resolved).
    public func controlSocket(mountpoint: String) -> URL {
        runtimeDirectory.appendingPathComponent("\(LocatorPaths.key(mountpoint)).sock")
    }
}

/// This device's identity: a stable ID and a human name (for conflict copies).
public struct DeviceIdentity: Codable, Sendable {
    public var id: String
    public var name: String

    public init(id: String, name: String) {
        self.id = id
        self.name = name
    }

    /// Load `device.json` under `dataHome`, creating it on first use (named
    /// `name`, or after the host). A `name` given later renames the device.
    public static func load(dataHome: URL, name: String? = nil) throws -> DeviceIdentity {
        let url = dataHome.appendingPathComponent("device.json")
        if let data = FileManager.default.contents(atPath: url.path) {
            guard var identity = try? JSONDecoder().decode(DeviceIdentity.self, from: data) else {
                throw UbiquityError(EINVAL, "device identity \(url.path) is damaged; remove it to make this a new device")
            }
            identity.name = usableName(identity.name)
            if let name, name != identity.name {
                identity.name = name
                try JSONEncoder().encode(identity).write(to: url, options: .atomic)
            }
            return identity
        }
        var buffer = [CChar](repeating: 0, count: 256)
        gethostname(&buffer, 255)
        let host = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let identity = DeviceIdentity(id: UUID().uuidString.lowercased(), name: name ?? usableName(host))
        try FileManager.default.createDirectory(at: dataHome, withIntermediateDirectories: true)
        try JSONEncoder().encode(identity).write(to: url, options: .atomic)
        return identity
    }

    /// A name every reader of this device's records accepts (see
    /// `RecordFormat.problem(deviceName:)`): a host name or an older
    /// identity's name gets '-' for control characters and '/', and is cut
    /// to 64 characters and 255 bytes.
    static func usableName(_ name: String) -> String {
        var cleaned = ""
        for scalar in name.unicodeScalars {
            let kept: Unicode.Scalar = scalar == "/" || scalar.properties.generalCategory == .control ? "-" : scalar
            guard cleaned.unicodeScalars.count < 64, cleaned.utf8.count + kept.utf8.count <= 255 else { break }
            cleaned.unicodeScalars.append(kept)
        }
        return cleaned.isEmpty ? "device" : cleaned
    }
}
