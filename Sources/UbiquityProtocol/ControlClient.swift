import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The client side of a control socket: one request, its answer read line
/// by line (see `Reply`). Every failure is a `ControlError` (thrown
/// untyped: Swift 6.3 crashes compiling typed catches with `where` clauses).
public enum ControlClient {
    /// Send `request` to the socket at `path` and read the answer: each
    /// update goes to `onUpdate`, the final line is the result (or the
    /// daemon's error, thrown). `rawLine`, if given, sees each line first and
    /// returns true when it took it as is (`query --json` prints result lines
    /// verbatim, without decoding 100,000 of them). `connected` gets the
    /// connection's descriptor: `shutdown` on it from another thread ends a
    /// call that would go on (a query's watch) with `noAnswer`.
    public static func call<Result: Codable & Sendable>(
        socket path: String, _ request: ControlRequest, expecting: Result.Type = Result.self,
        rawLine: ((Data) -> Bool)? = nil, connected: (Int32) -> Void = { _ in }, onUpdate: (Update) -> Void = { _ in }
    ) throws -> Result {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ControlError(.unreachable, "socket: \(String(cString: strerror(errno)))", errno: errno) }
        defer { close(fd) }
        var address = try address(path)
        let connectResult = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connectResult == 0 else {
            let code = errno
            throw ControlError(.unreachable, "connect to \(path): \(String(cString: strerror(code)))", errno: code)
        }
        connected(fd)
        var data: Data
        do { data = try JSONEncoder().encode(request) } catch {
            throw ControlError(.malformedRequest, "cannot encode the request: \(error)")
        }
        data.append(0x0a)
        // A daemon that refuses a request may stop reading it: its answer still says why.
        _ = data.withUnsafeBytes { raw -> Bool in
            var offset = 0
            while offset < raw.count {
                let n = send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return false }
                offset += n
            }
            return true
        }
        let decoder = JSONDecoder()
        var buffer = [UInt8](repeating: 0, count: 65536)
        var pending = Data()
        while true {
            let n = read(fd, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            pending.append(contentsOf: buffer[0..<n])
            while let newline = pending.firstIndex(of: 0x0a) {
                let line = Data(pending[pending.startIndex..<newline])
                pending.removeSubrange(pending.startIndex...newline)
                if let rawLine, rawLine(line) { continue }
                let reply: Reply<Result>
                do {
                    reply = try decoder.decode(Reply<Result>.self, from: line)
                } catch let error as ControlError {
                    throw error
                } catch {
                    throw ControlError.protocolMismatch(client: .current, daemon: nil)
                }
                switch reply {
                case .update(let update): onUpdate(update)
                case .done(let result): return result
                case .failed(let error): throw error
                }
            }
        }
        throw ControlError(.noAnswer, "the daemon at \(path) closed the connection without an answer")
    }

    /// The socket address of `path` (shorter than `sun_path`).
    public static func address(_ path: String) throws(ControlError) -> sockaddr_un {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            throw ControlError(.unreachable, "control socket path too long: \(path)", errno: ENAMETOOLONG)
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return address
    }
}
