import Foundation
import UbiquityStore
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
        if let xdg = environment["XDG_DATA_HOME"], xdg.hasPrefix("/") {
            dataHome = URL(fileURLWithPath: xdg).appendingPathComponent("ubiquityfs")
        } else {
            let home = environment["HOME"] ?? NSHomeDirectory()
            dataHome = URL(fileURLWithPath: home).appendingPathComponent(".local/share/ubiquityfs")
        }
        runtimeDirectory = Self.runtimeDirectory(environment)
    }

    public var runtimeDirectory: URL

    public var defaultStore: URL { dataHome.appendingPathComponent("store") }

    public func replica(storeID: String, container: String) -> URL {
        dataHome.appendingPathComponent("replicas").appendingPathComponent(storeID).appendingPathComponent(container)
    }

    /// `$XDG_RUNTIME_DIR/ubiquityfs`, or a private folder in /tmp when it is unset.
    static func runtimeDirectory(_ env: [String: String]) -> URL {
        if let dir = env["XDG_RUNTIME_DIR"], dir.hasPrefix("/"), access(dir, W_OK) == 0 {
            return URL(fileURLWithPath: dir).appendingPathComponent("ubiquityfs")
        }
        return URL(fileURLWithPath: "/tmp/ubiquityfs-\(getuid())")
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

    func daemonKey(_ store: String) -> Substring {
        ContentCopy.hash(of: Data((dataHome.path + "\n" + store).utf8)).prefix(24)
    }

    /// The control socket of the mount at `mountpoint` (absolute, resolved).
    public func controlSocket(mountpoint: String) -> URL {
        let name = ContentCopy.hash(of: Data(mountpoint.utf8)).prefix(24)
        return runtimeDirectory.appendingPathComponent("\(name).sock")
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
            if let name, name != identity.name {
                identity.name = name
                try JSONEncoder().encode(identity).write(to: url, options: .atomic)
            }
            return identity
        }
        var buffer = [CChar](repeating: 0, count: 256)
        gethostname(&buffer, 255)
        let host = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let identity = DeviceIdentity(id: UUID().uuidString.lowercased(), name: name ?? (host.isEmpty ? "device" : host))
        try FileManager.default.createDirectory(at: dataHome, withIntermediateDirectories: true)
        try JSONEncoder().encode(identity).write(to: url, options: .atomic)
        return identity
    }
}
