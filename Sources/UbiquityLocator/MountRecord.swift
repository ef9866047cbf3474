import Crypto
import Foundation
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
/// does not name is stale. So a client finds the daemon of a mount from the
/// mount and the data home, never from the environment's runtime directory:
/// `su`, cron or another shell reach the same daemon, and never mistake a
/// live mount for a dead one.
public struct MountRecord: Codable, Equatable, Sendable {
    public var mountpoint: String
    public var pid: Int32
    public var socket: String

    public init(mountpoint: String, pid: Int32, socket: String) {
        self.mountpoint = mountpoint
        self.pid = pid
        self.socket = socket
    }

    public static func load(dataHome: URL, mountpoint: String) -> MountRecord? {
        guard let data = FileManager.default.contents(atPath: LocatorPaths.mountRecord(dataHome: dataHome, mountpoint: mountpoint).path)
        else { return nil }
        return try? JSONDecoder().decode(MountRecord.self, from: data)
    }

    /// The record of this device's live mount at `mountpoint` (the mount
    /// names the record's daemon), or nil.
    public static func live(dataHome: URL, mountpoint: String) -> MountRecord? {
        guard let entry = MountTable.entry(at: mountpoint), let pid = entry.daemonPID,
              let record = load(dataHome: dataHome, mountpoint: mountpoint), record.pid == pid else { return nil }
        return record
    }

    /// This device's live mounts.
    public static func all(dataHome: URL) -> [MountRecord] {
        MountTable.ubiquityMounts().compactMap { live(dataHome: dataHome, mountpoint: $0.mountpoint) }
    }
}

/// Where a device keeps what clients look for: its data home (two processes
/// with different `XDG_DATA_HOME` are two devices), its runtime directory
/// (sockets), and the names derived from a mountpoint or a store.
public enum LocatorPaths {
    /// `$XDG_DATA_HOME/ubiquityfs`, else `~/.local/share/ubiquityfs`.
    public static func dataHome(_ environment: [String: String] = ProcessInfo.processInfo.environment) -> URL {
        if let xdg = environment["XDG_DATA_HOME"], xdg.hasPrefix("/") {
            return URL(fileURLWithPath: xdg).appendingPathComponent("ubiquityfs")
        }
        let home = environment["HOME"] ?? NSHomeDirectory()
        return URL(fileURLWithPath: home).appendingPathComponent(".local/share/ubiquityfs")
    }

    /// `$XDG_RUNTIME_DIR/ubiquityfs`, or `/tmp/ubiquityfs-UID` when it is
    /// unset (checked by the daemon and the CLI before use).
    public static func runtimeDirectory(_ environment: [String: String] = ProcessInfo.processInfo.environment) -> URL {
        if let dir = environment["XDG_RUNTIME_DIR"], dir.hasPrefix("/"), access(dir, W_OK) == 0 {
            return URL(fileURLWithPath: dir).appendingPathComponent("ubiquityfs")
        }
        return URL(fileURLWithPath: "/tmp/ubiquityfs-\(getuid())")
    }

    /// The first 24 hex digits of SHA-256 of `text`: how a mountpoint or a
    /// store names its files.
    public static func key(_ text: String) -> String {
        SHA256.hash(data: Data(text.utf8)).prefix(12).map { String(format: "%02x", $0) }.joined()
    }

    public static func mountRecord(dataHome: URL, mountpoint: String) -> URL {
        dataHome.appendingPathComponent("mounts").appendingPathComponent("\(key(mountpoint)).json")
    }
}
