import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The mounts of this process's namespace, from /proc/self/mountinfo.
public enum MountTable {
    /// One line of the table.
    public struct Entry: Sendable, Equatable {
        public var mountpoint: String
        /// `fuse.ubiquityfs` for ours.
        public var type: String
        /// The mount's source (`fsname`): `ubiquityfs:PID` for ours.
        public var source: String

        /// The pid of the daemon serving a ubiquityfs mount, from its source
        /// (`ubiquityfs:PID`); nil for other mounts and for mounts made by
        /// versions that did not record it.
        public var daemonPID: pid_t? {
            guard type == MountTable.ubiquityType, source.hasPrefix(MountTable.sourcePrefix) else { return nil }
            return pid_t(source.dropFirst(MountTable.sourcePrefix.count))
        }
    }

    /// The filesystem type of ubiquityfs mounts (`subtype=ubiquityfs`).
    public static let ubiquityType = "fuse.ubiquityfs"
    /// How the source of a ubiquityfs mount starts; the daemon's pid follows.
    public static let sourcePrefix = "ubiquityfs:"

    /// The `fsname` a daemon gives its mounts: names the daemon (its pid),
    /// so that any command can tell whose mount it is.
    public static func source(daemonPID: pid_t) -> String { sourcePrefix + String(daemonPID) }

    /// Every mount, in mount order (a later entry at the same mountpoint is
    /// stacked on an earlier one). The table is read whole: on a desktop with
    /// snaps and containers it is far longer than one page.
    public static func entries() -> [Entry] {
        guard let data = readWhole("/proc/self/mountinfo") else { return [] }
        return parse(String(decoding: data, as: UTF8.self))
    }

    /// Lines of `mountinfo`: "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS…] - TYPE SOURCE SUPEROPTS".
    public static func parse(_ text: String) -> [Entry] {
        text.split(separator: "\n").compactMap { line in
            let halves = line.components(separatedBy: " - ")
            let fields = halves[0].split(separator: " ")
            guard halves.count == 2, fields.count > 4 else { return nil }
            let tail = halves[1].split(separator: " ")
            guard tail.count >= 2 else { return nil }
            return Entry(mountpoint: unescape(fields[4]), type: unescape(tail[0]), source: unescape(tail[1]))
        }
    }

    /// The mount at `path` (the topmost, if several are stacked), or nil.
    public static func entry(at path: String) -> Entry? {
        entries().last { $0.mountpoint == path }
    }

    /// Every ubiquityfs mount.
    public static func ubiquityMounts() -> [Entry] {
        entries().filter { $0.type == ubiquityType }
    }

    /// The kernel writes space, tab, newline and backslash (and any other
    /// awkward byte) as a backslash and three octal digits.
    static func unescape(_ field: Substring) -> String {
        guard field.contains("\\") else { return String(field) }
        var bytes: [UInt8] = []
        let utf8 = Array(field.utf8)
        var i = 0
        while i < utf8.count {
            if utf8[i] == UInt8(ascii: "\\"), i + 3 < utf8.count,
               let value = UInt8(String(decoding: utf8[(i + 1)...(i + 3)], as: UTF8.self), radix: 8) {
                bytes.append(value)
                i += 4
            } else {
                bytes.append(utf8[i])
                i += 1
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// A file /proc writes as it is read (its size says 0), read to its end.
    static func readWhole(_ path: String) -> Data? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return n == 0 ? data : nil }
            data.append(contentsOf: buffer[0..<n])
        }
    }
}
