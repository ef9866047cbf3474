import Foundation
import Logging
import Synchronization
import UbiquityStore
#if canImport(Glibc)
import Glibc
#endif

/// The mount's control socket: a Unix stream socket (owner-only) in the
/// runtime directory (`$XDG_RUNTIME_DIR/ubiquityfs/`, checked to be the
/// user's own and private by `Locations.prepareRuntimeDirectory`). Requests and replies are JSON objects,
/// one per line. A request may get several lines back (progress) before
/// its final `{"ok":…}` or `{"error":…}`.
final class ControlServer: Sendable {
    typealias Handler = @Sendable (_ request: [String: Any], _ reply: ControlConnection) -> Void

    let path: String
    let listener: Int32
    let handler: Handler
    let logger: Logger

    init(path: String, logger: Logger, handler: @escaping Handler) throws {
        self.path = path
        self.handler = handler
        self.logger = logger
        unlink(path)
        let fd = try syscallRetrying("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        var address = try ControlClient.address(path)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0, chmod(path, 0o600) == 0, listen(fd, 16) == 0 else {
            let error = UbiquityError.posix("control socket \(path)")
            close(fd)
            throw error
        }
        listener = fd
    }

    func start() {
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "ubiquityfs-control"
        thread.start()
    }

    func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                return   // listener closed
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            let connection = ControlConnection(fd: client)
            let thread = Thread { [self] in
                if let request = connection.readRequest() {
                    handler(request, connection)
                } else {
                    connection.close()
                }
            }
            thread.start()
        }
    }

    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        unlink(path)
    }
}

/// One client of the control socket.
final class ControlConnection: Sendable {
    let fd: Int32
    let closed = Mutex(false)
    /// Set when another thread answers later (the unmount waiter): `close()` leaves it open.
    let heldOpen = Mutex(false)

    func keepOpen() { heldOpen.withLock { $0 = true } }

    init(fd: Int32) { self.fd = fd }

    /// The longest request line accepted (a query's predicate is the only
    /// part that grows); a longer one is answered with an error.
    static let maximumRequest = 1 << 20
    /// How long a client may take to send its request line.
    static let requestTimeout: Int = 30

    /// Read the request line. What is not a request (too long, not a JSON
    /// object, never finished) is answered with an error here, and nil
    /// returned: nothing a client sends reaches a handler unchecked.
    func readRequest() -> [String: Any]? {
        var timeout = timeval(tv_sec: Self.requestTimeout, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(fd, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                send(["error": "no complete request line within \(Self.requestTimeout) s"])
                return nil
            }
            if n <= 0 { break }   // the client closed its side: the request is what came
            let newline = buffer[0..<n].firstIndex(of: 0x0a)
            data.append(contentsOf: buffer[0..<(newline ?? n)])
            if data.count > Self.maximumRequest {
                send(["error": "request too large (more than \(Self.maximumRequest >> 20) MiB)"])
                return nil
            }
            if newline != nil { break }
        }
        if data.isEmpty { return nil }
        guard let request = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] else {
            send(["error": "the request is not a JSON object"])
            return nil
        }
        return request
    }

    /// Send one JSON line; false if the client went away.
    @discardableResult
    func send(_ object: [String: Any]) -> Bool {
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return false }
        return sendRaw(data)
    }

    /// Send text that already is JSON lines (without the final newline).
    @discardableResult
    func sendRaw(_ data: Data) -> Bool {
        closed.withLock { isClosed in
            guard !isClosed else { return false }
            var line = data
            line.append(0x0a)
            return line.withUnsafeBytes { raw in
                var sent = 0
                while sent < raw.count {
                    let n = Glibc.send(fd, raw.baseAddress! + sent, raw.count - sent, Int32(MSG_NOSIGNAL))
                    if n <= 0 { return false }
                    sent += n
                }
                return true
            }
        }
    }

    func close(force: Bool = false) {
        if !force && heldOpen.withLock({ $0 }) { return }
        closed.withLock { isClosed in
            if !isClosed { Glibc.close(fd) }
            isClosed = true
        }
    }
}

/// The CLI side of the control socket.
enum ControlClient {
    static func address(_ path: String) throws -> sockaddr_un {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            throw UbiquityError(ENAMETOOLONG, "control socket path too long: \(path)")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return address
    }

    /// Send `request`, call `onLine` for every JSON line until the daemon
    /// closes the connection. Throws ECONNREFUSED/ENOENT if nobody listens.
    /// `raw`, if given, sees each line first and returns true when it took
    /// it as is (no JSON parsing: bulk query output is printed verbatim).
    static func call(socket path: String, _ request: [String: Any], raw: ((Data) -> Bool)? = nil,
                     onLine: ([String: Any]) -> Void) throws {
        let fd = try syscallRetrying("socket") { socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0) }
        defer { close(fd) }
        var address = try address(path)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else { throw UbiquityError.posix("connect to \(path)") }
        var data = try JSONSerialization.data(withJSONObject: request)
        data.append(0x0a)
        _ = data.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var buffer = [UInt8](repeating: 0, count: 65536)
        var pending = Data()
        while true {
            let n = read(fd, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            pending.append(contentsOf: buffer[0..<n])
            while let newline = pending.firstIndex(of: 0x0a) {
                let line = pending[pending.startIndex..<newline]
                pending.removeSubrange(pending.startIndex...newline)
                if let raw, raw(Data(line)) { continue }
                if let object = try? JSONSerialization.jsonObject(with: line) as? [String: Any] { onLine(object) }
            }
        }
    }
}
