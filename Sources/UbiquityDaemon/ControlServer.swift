import Foundation
import Logging
import UbiquityLocks
import UbiquityProtocol
import UbiquityModel
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// A control socket of the daemon: a Unix stream socket (owner-only) in the
/// runtime directory (`$XDG_RUNTIME_DIR/ubiquityfs/`, checked to be the
/// user's own and private by `Locations.prepareRuntimeDirectory`), speaking
/// the protocol of `UbiquityProtocol` (docs/PROTOCOL.md): one request line
/// per connection, answered by JSON lines.
///
/// Each connection is served on a thread of its own. Nothing a client sends
/// reaches a handler unchecked: a request that is too long, too slow, not a
/// JSON object, of the wrong types, of another protocol major or for a
/// command this build does not know is answered here with a `ControlError`.
final class ControlServer: Sendable {
    typealias Handler = @Sendable (_ command: Command, _ connection: ControlConnection) -> Void

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
        var address: sockaddr_un
        do { address = try ControlClient.address(path) } catch {
            close(fd)
            throw UbiquityError(error.errno ?? EINVAL, error.message)
        }
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

    /// Whether the accept loop was started (then it closes the listener
    /// itself when it ends), and whether the listener is closed. If `stop`
    /// closed it while the loop was between two `accept`s, its number could
    /// be reused by another socket (another server's listener) before the
    /// loop called `accept` on it again — and the loop would take that
    /// server's clients.
    let listenerState = Lock<(loopStarted: Bool, closed: Bool, stopped: Bool)>((false, false, false))

    func start() {
        listenerState.withLock { $0.loopStarted = true }
        Thread.run(named: "ubq-control") { [self] in
            acceptLoop()
            listenerState.withLock { state in
                if !state.closed { close(listener) }
                state.closed = true
            }
        }
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
            Thread.run(named: "ubq-request") { [self] in
                if let command = connection.readRequest() {
                    handler(command, connection)
                } else {
                    connection.close()
                }
            }
        }
    }

    /// Stop accepting: `shutdown` makes every `accept` on the listener fail,
    /// so the loop ends (and closes it). Calling it again does nothing (the
    /// path may be another server's by then).
    func stop() {
        listenerState.withLock { state in
            guard !state.stopped else { return }
            state.stopped = true
            unlink(path)
            guard !state.closed else { return }
            shutdown(listener, Int32(SHUT_RDWR))
            if !state.loopStarted {
                close(listener)
                state.closed = true
            }
        }
    }
}

/// One client of a control socket: its request, then the lines of its answer.
final class ControlConnection: Sendable {
    let fd: Int32
    /// Whether the connection is closed, and whether a send uses `fd` now
    /// (then that send closes it when it returns). Never held across a
    /// system call that may block.
    private let state = Lock(State())
    struct State {
        var closed = false
        var sending = false
    }
    /// Keeps whole lines whole: held across a send, never taken by `close`.
    private let sendLock = Lock(())
    /// Set when another thread answers later (the unmount waiter): `close()` leaves it open.
    let heldOpen = Lock(false)
    /// A client that reads nothing for this long is dropped (a `watch`
    /// that stopped reading): a send never blocks longer.
    static let sendTimeoutSeconds: Double = 10

    func keepOpen() { heldOpen.withLock { $0 = true } }

    init(fd: Int32, sendTimeout: Double = ControlConnection.sendTimeoutSeconds) {
        self.fd = fd
        var timeout = timeval(tv_sec: Int(sendTimeout), tv_usec: Int((sendTimeout - sendTimeout.rounded(.down)) * 1e6))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    /// Read and decode the request line. What is not a request of this
    /// protocol is answered with an error here, and nil returned.
    func readRequest() -> Command? {
        var timeout = timeval(tv_sec: ControlLimits.requestTimeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(fd, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                fail(ControlError(.requestTimeout, "no complete request line within \(ControlLimits.requestTimeoutSeconds) s"))
                return nil
            }
            if n <= 0 { break }   // the client closed its side: the request is what came
            let newline = buffer[0..<n].firstIndex(of: 0x0a)
            data.append(contentsOf: buffer[0..<(newline ?? n)])
            if data.count > ControlLimits.maximumRequestBytes {
                fail(ControlError(.requestTooLarge, "request too large (more than \(ControlLimits.maximumRequestBytes >> 20) MiB)"))
                return nil
            }
            if newline != nil { break }
        }
        if data.isEmpty { return nil }
        do {
            return try JSONDecoder().decode(ControlRequest.self, from: data).command
        } catch let refused as UnsupportedProtocol {
            fail(.protocolMismatch(client: refused.requested, daemon: .current, daemonPID: getpid()))
        } catch let unknown as UnknownCommand {
            fail(ControlError(.unknownCommand, "unknown command '\(unknown.name)' (protocol \(ProtocolVersion.current))"))
        } catch {
            fail(Self.malformed(error))
        }
        return nil
    }

    /// What is wrong with a request that did not decode, naming the field.
    static func malformed(_ error: any Error) -> ControlError {
        /// `paths[0][1]`
        func field(_ path: [any CodingKey]) -> String {
            path.enumerated().map { index, key in
                key.intValue.map { "[\($0)]" } ?? (index == 0 ? key.stringValue : "." + key.stringValue)
            }.joined()
        }
        let problem: (path: [any CodingKey], text: String)? = switch error as? DecodingError {
        case .typeMismatch(let type, let context)?: (context.codingPath, ": expected \(type)")
        case .valueNotFound(let type, let context)?: (context.codingPath, ": expected \(type), not null")
        case .keyNotFound(let key, let context)?: (context.codingPath + [key], " is missing")
        case .dataCorrupted(let context)?: (context.codingPath, ": " + context.debugDescription)
        default: nil
        }
        // A problem with no field is the request's own: not JSON, or not an object.
        guard let problem, !problem.path.isEmpty else { return ControlError(.malformedRequest, "the request is not a JSON object") }
        return ControlError(.malformedRequest, "field \(field(problem.path))\(problem.text)")
    }

    /// Send an update line; false if the client went away.
    @discardableResult
    func send(_ update: Update) -> Bool { send(Reply<NoResult>.update(update)) }

    /// Send the final line of a success.
    @discardableResult
    func finish<Result: Codable & Sendable>(_ result: Result) -> Bool { send(Reply.done(result)) }

    /// Send the final line of a failure.
    @discardableResult
    func fail(_ error: ControlError) -> Bool { send(Reply<NoResult>.failed(error)) }

    /// The final line of a command that failed with `error` (its errno kept).
    @discardableResult
    func fail(_ error: any Error) -> Bool {
        let failure = UbiquityError.wrap(error)
        return fail(ControlError(.failed, failure.description, errno: failure.errno))
    }

    private func send<Result>(_ reply: Reply<Result>) -> Bool {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        guard let data = try? encoder.encode(reply) else { return false }
        return sendRaw(data)
    }

    /// Send text that already is JSON lines (without the final newline).
    /// False if the client went away, or read nothing for
    /// `sendTimeoutSeconds`: then it is dropped (the socket shut down; a
    /// reader of it sees the end). `close` does not wait for a send: it
    /// shuts the socket down, which ends the send at once.
    @discardableResult
    func sendRaw(_ data: Data) -> Bool {
        sendLock.withLock { _ in
            let open = state.withLock { s -> Bool in
                guard !s.closed else { return false }
                s.sending = true
                return true
            }
            guard open else { return false }
            var line = data
            line.append(0x0a)
            let sent = line.withUnsafeBytes { raw -> Bool in
                var sent = 0
                while sent < raw.count {
                    let n = Glibc.send(fd, raw.baseAddress! + sent, raw.count - sent, Int32(MSG_NOSIGNAL))
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { return false }
                    sent += n
                }
                return true
            }
            state.withLock { s in
                s.sending = false
                if !sent && !s.closed { shutdown(fd, Int32(SHUT_RDWR)) }   // half a line went out: nothing more can follow
                if s.closed { Glibc.close(fd) }   // `close` came meanwhile and left the descriptor to this send
            }
            return sent
        }
    }

    /// The client's process (`SO_PEERCRED`), nil if the kernel does not say.
    var peerPID: Int32? {
        var credentials: (pid: Int32, uid: UInt32, gid: UInt32) = (0, 0, 0)   // struct ucred (Glibc hides it)
        var length = socklen_t(MemoryLayout<(Int32, UInt32, UInt32)>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 else { return nil }
        return credentials.pid
    }

    /// The lines a client sends after its request (`present`'s answers),
    /// one at a time, until it closes the connection (nil). A line longer
    /// than a request may be ends the connection.
    func readLines(_ body: (Data) -> Void) {
        var timeout = timeval(tv_sec: 0, tv_usec: 0)   // no timeout: the client answers when asked
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var pending = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(fd, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return }
            pending.append(contentsOf: buffer[0..<n])
            while let newline = pending.firstIndex(of: 0x0a) {
                body(Data(pending[pending.startIndex..<newline]))
                pending.removeSubrange(pending.startIndex...newline)
            }
            if pending.count > ControlLimits.maximumRequestBytes { return }
        }
    }

    /// Whether the client has closed its side (or sent more, which it must
    /// not): wait for that at most `seconds` (nil: for as long as it takes).
    func peerClosed(waitingAtMost seconds: Double?) -> Bool {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let timeout = seconds.map { Int32($0 * 1000) } ?? -1
        while true {
            let n = poll(&pfd, 1, timeout)
            if n < 0 && errno == EINTR { continue }
            return n != 0
        }
    }

    func close(force: Bool = false) {
        if !force && heldOpen.withLock({ $0 }) { return }
        state.withLock { s in
            guard !s.closed else { return }
            s.closed = true
            if s.sending {
                // A send blocked on a client that does not read returns at
                // once, and closes the descriptor itself.
                shutdown(fd, Int32(SHUT_RDWR))
            } else {
                Glibc.close(fd)
            }
        }
    }
}
