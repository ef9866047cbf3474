import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The service manager's readiness protocol (sd_notify(3)) without
/// libsystemd: one datagram of `KEY=VALUE` lines to the Unix socket named by
/// `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace). Nothing
/// happens when the variable is unset (not started by systemd as
/// `Type=notify`).
package enum SystemdNotify {
    /// Send `state` (e.g. "READY=1\nSTATUS=…"); false when there is no
    /// socket to tell or the datagram could not be sent.
    @discardableResult
    package static func send(_ state: String, socketPath: String? = ProcessInfo.processInfo.environment["NOTIFY_SOCKET"]) -> Bool {
        guard let path = socketPath, path.hasPrefix("/") || path.hasPrefix("@") else { return false }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            if bytes[0] == UInt8(ascii: "@") { raw[0] = 0 }   // abstract: a leading NUL, no trailing one
        }
        let length = socklen_t(MemoryLayout.offset(of: \sockaddr_un.sun_path)! + bytes.count + (bytes[0] == UInt8(ascii: "@") ? 0 : 1))
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        let message = Array(state.utf8)
        let sent = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sockaddr in
                message.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), sockaddr, length) }
            }
        }
        return sent == message.count
    }

    /// The service is ready (`READY=1`), with a line for `systemctl status`.
    @discardableResult
    package static func ready(status: String) -> Bool {
        send("READY=1\nSTATUS=\(status.replacingOccurrences(of: "\n", with: " "))")
    }
}
