import Foundation
import Logging
import UbiquityLocks
import Testing
import UbiquityControl
@testable import UbiquityDaemon
import UbiquityProtocol
#if canImport(Glibc)
import Glibc
#endif

/// The control server on a real Unix socket: requests decoded into typed
/// commands, and everything that is not a request of this protocol answered
/// with a typed error while the server keeps serving.
@Suite struct ControlServerTests {
    /// A server whose handler records each command and answers `download`
    /// with two updates and `status`-less commands with `NoResult`.
    final class Fixture: Sendable {
        final class Received: Sendable {
            let commands = Lock<[Command]>([])
        }

        let path = "/tmp/ubq-test-\(UUID().uuidString.prefix(8)).sock"
        let server: ControlServer
        let received = Received()

        init() throws {
            let received = self.received
            server = try ControlServer(path: path, logger: Logger(label: "test")) { command, connection in
                defer { connection.close() }
                received.commands.withLock { $0.append(command) }
                if case .download = command {
                    connection.send(.downloading(DownloadProgress(items: 1, totalItems: 2, bytes: 10, totalBytes: 20)))
                    connection.send(.downloading(DownloadProgress(items: 2, totalItems: 2, bytes: 20, totalBytes: 20)))
                }
                if case .evict = command {
                    connection.fail(ControlServerTests.busy)
                    return
                }
                connection.finish(NoResult())
            }
            server.start()
        }

        deinit { server.stop() }

        /// Still serving: a well-formed request gets its answer.
        func answers() throws -> Bool {
            let before = received.commands.withLock { $0.count }
            _ = try ControlClient.call(socket: path, ControlRequest(.pin(paths: [["a"]])), expecting: NoResult.self)
            return received.commands.withLock { $0.count } == before + 1
        }
    }

    /// What the fixture answers `evict` with.
    static let busy = ControlError(.failed, "a.txt is open for writing", errno: EBUSY)

    @Test func aRequestMakesTheRoundTripWithItsUpdates() throws {
        let fixture = try Fixture()
        var updates: [Update] = []
        let request = ControlRequest(.download(paths: [["Notes", "a b.txt"], []], recursive: true))
        let result = try ControlClient.call(socket: fixture.path, request, expecting: NoResult.self, onUpdate: { updates.append($0) })
        #expect(result == NoResult())
        #expect(fixture.received.commands.withLock { $0 } == [request.command])
        #expect(updates == [.downloading(DownloadProgress(items: 1, totalItems: 2, bytes: 10, totalBytes: 20)),
                            .downloading(DownloadProgress(items: 2, totalItems: 2, bytes: 20, totalBytes: 20))])
    }

    @Test func theDaemonsErrorIsThrownWithItsCodeAndErrno() throws {
        let fixture = try Fixture()
        #expect(throws: Self.busy) {
            _ = try ControlClient.call(socket: fixture.path, ControlRequest(.evict(paths: [["a.txt"]])), expecting: Evicted.self)
        }
    }

    @Test func anotherMajorIsRefusedWithBothVersionsAndTheWayOut() throws {
        let fixture = try Fixture()
        let reply = try Self.onlyError(exchange(fixture.path, Data(#"{"protocol":"2.0","command":"status"}"#.utf8 + [0x0a])))
        #expect(reply.code == .protocolMismatch)
        #expect(reply.message.contains("this ubiquityfs (protocol 2.0) cannot talk to the running daemon (pid \(getpid()), protocol \(ProtocolVersion.current))"))
        #expect(reply.message.contains("then mount again with this one"))
        #expect(fixture.received.commands.withLock { $0.isEmpty }, "a request of another major reached the handler")
        #expect(try fixture.answers())
    }

    @Test func aNewerMinorIsServed() throws {
        let fixture = try Fixture()
        let newer = ProtocolVersion(major: ProtocolVersion.current.major, minor: ProtocolVersion.current.minor + 1)
        _ = try ControlClient.call(socket: fixture.path, ControlRequest(.unmount, version: newer), expecting: NoResult.self)
        #expect(fixture.received.commands.withLock { $0 } == [.unmount])
    }

    @Test func aRequestWithoutAVersionIsAnOlderClients() throws {
        let fixture = try Fixture()
        let reply = try Self.onlyError(exchange(fixture.path, Data(#"{"command":"status"}"#.utf8 + [0x0a])))
        #expect(reply.code == .protocolMismatch)
        #expect(reply.message.contains("an older protocol without versions"))
        #expect(try fixture.answers())
    }

    @Test(arguments: [
        (#"{"protocol":"1.0","command":"evict","paths":"a.txt"}"#, "field paths: expected Array"),
        (#"{"protocol":"1.0","command":"evict","paths":[["a",7]]}"#, "field paths[0][1]: expected String"),
        (#"{"protocol":"1.0","command":"evict"}"#, "field paths is missing"),
        (#"{"protocol":"1.0","command":"query","watch":"yes"}"#, "field watch: expected Bool"),
        (#"{"protocol":"1.0","command":"resolve","paths":[["a"]],"keep":"newest"}"#, "field keep: takes current, both, or a version number"),
        (#"{"protocol":1,"command":"status"}"#, "field protocol: expected String"),
        (#"{"protocol":"one","command":"status"}"#, "'one' is not a protocol version"),
        (#"{"protocol":"1.0","command":null}"#, "field command: expected String, not null"),
        (#"["protocol","1.0"]"#, "the request is not a JSON object"),
        ("\u{FF}\u{FE}", "the request is not a JSON object"),
        (String(repeating: "[", count: 500_000), "the request is not a JSON object"),
    ])
    func malformedRequestsAreNamedAndRefused(request: String, message: String) throws {
        let fixture = try Fixture()
        let reply = try Self.onlyError(exchange(fixture.path, Data(request.utf8) + [0x0a]))
        #expect(reply.code == .malformedRequest)
        #expect(reply.message.contains(message), "\(reply.message)")
        #expect(fixture.received.commands.withLock { $0.isEmpty })
        #expect(try fixture.answers())
    }

    @Test func anUnknownCommandIsRefused() throws {
        let fixture = try Fixture()
        let reply = try Self.onlyError(exchange(fixture.path, Data(#"{"protocol":"1.0","command":"format-disk"}"#.utf8 + [0x0a])))
        #expect(reply.code == .unknownCommand)
        #expect(reply.message.contains("unknown command 'format-disk'"))
        #expect(try fixture.answers())
    }

    @Test func anOversizedRequestIsRefusedUnread() throws {
        let fixture = try Fixture()
        let huge = Data(#"{"protocol":"1.0","command":"status","pad":""#.utf8) + Data(repeating: 0x78, count: 2 << 20) + Data(#""}"#.utf8 + [0x0a])
        let reply = try Self.onlyError(exchange(fixture.path, huge))
        #expect(reply.code == .requestTooLarge)
        #expect(reply.message == "request too large (more than 1 MiB)")
        #expect(try fixture.answers())
    }

    @Test func aRequestJustUnderTheLimitIsServed() throws {
        let fixture = try Fixture()
        let predicate = String(repeating: "x", count: ControlLimits.maximumRequestBytes - 200)
        _ = try ControlClient.call(socket: fixture.path, ControlRequest(.query(QueryParameters(predicate: predicate))),
                                   expecting: NoResult.self)
        #expect(fixture.received.commands.withLock { $0 } == [.query(QueryParameters(predicate: predicate))])
    }

    @Test func manyHostileClientsAtOnceLeaveTheServerServing() throws {
        let fixture = try Fixture()
        let requests = ["{", "null", #"{"protocol":"9.9"}"#, #"{"protocol":"1.0","command":7}"#, "\u{0}"]
        DispatchQueue.concurrentPerform(iterations: 40) { i in
            _ = try? exchange(fixture.path, Data(requests[i % requests.count].utf8) + [0x0a])
        }
        #expect(fixture.received.commands.withLock { $0.isEmpty })
        #expect(try fixture.answers())
    }

    static func onlyError(_ lines: [Data]) throws -> ControlError {
        try #require(lines.count == 1, "expected one line, got \(lines.map { String(decoding: $0, as: UTF8.self) })")
        let reply = try JSONDecoder().decode(Reply<NoResult>.self, from: lines[0])
        guard case .failed(let error) = reply else {
            Issue.record("not an error: \(String(decoding: lines[0], as: UTF8.self))")
            return ControlError(.failed, "")
        }
        return error
    }
}

/// The client's side of the version rule, against a fake daemon that
/// answers with canned lines.
@Suite struct ControlClientTests {
    @Test(arguments: [
        (#"{"ok":true}"#, "the running daemon (another protocol)"),                 // a daemon from before versions
        (#"{"error":"unknown command"}"#, "the running daemon (another protocol)"),
        (#"{"ok":true,"protocol":"2.0"}"#, "the running daemon (protocol 2.0)"),
        (#"{"status":{"pid":1}}"#, "the running daemon (another protocol)"),         // a line of no known kind
    ])
    func anAnswerOfAnotherProtocolIsRefused(answer: String, expected: String) throws {
        let path = try fakeDaemon(answering: answer)
        let error = try #require(throws: ControlError.self) {
            _ = try ControlClient.call(socket: path, ControlRequest(.status), expecting: NoResult.self)
        }
        #expect(error.code == .protocolMismatch)
        #expect(error.message.contains("this ubiquityfs (protocol \(ProtocolVersion.current)) cannot talk to \(expected)"), "\(error)")
    }

    @Test func noFinalLineIsNoAnswer() throws {
        let path = try fakeDaemon(answering: #"{"pushing":{"itemsLeft":1,"bytesLeft":2}}"#)
        let error = try #require(throws: ControlError.self) {
            _ = try ControlClient.call(socket: path, ControlRequest(.unmount), expecting: NoResult.self)
        }
        #expect(error.code == .noAnswer)
    }

    @Test func nobodyListeningIsUnreachable() throws {
        let error = try #require(throws: ControlError.self) {
            _ = try ControlClient.call(socket: "/tmp/ubq-test-nobody-\(UUID().uuidString.prefix(8)).sock", ControlRequest(.ping),
                                       expecting: DaemonInfo.self)
        }
        #expect(error.code == .unreachable && error.errno == ENOENT)
    }

    /// A socket that answers one connection with `answer` and closes.
    func fakeDaemon(answering answer: String) throws -> String {
        let path = "/tmp/ubq-test-\(UUID().uuidString.prefix(8)).sock"
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = try ControlClient.address(path)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        try #require(bound == 0 && listen(fd, 1) == 0)
        Thread {
            let client = accept(fd, nil, nil)
            var byte: UInt8 = 0
            while read(client, &byte, 1) == 1 && byte != 0x0a {}
            let line = answer + "\n"
            _ = line.withCString { send(client, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
            close(client)
            close(fd)
            unlink(path)
        }.start()
        return path
    }
}

/// Every request survives encoding and decoding unchanged; the daemon's
/// hand-written query lines are `QueryEvent`s.
@Suite struct ProtocolCodingTests {
    @Test(arguments: [
        Command.ping, .status, .describe, .unmount,
        .mount(MountParameters(mountpoint: "/m n", container: "com.example.notes", scope: .data, fuseOptions: ["ro"],
                               deviceName: "laptop", sharedStore: true)),
        .mount(MountParameters(mountpoint: "/m")),
        .download(paths: [["a", "b"], []], recursive: true), .evict(paths: [["é"]]), .pin(paths: []), .unpin(paths: [["x"]]),
        .versions(path: ["doc.txt"]), .resolve(paths: [["d"]], keep: .version(2)), .resolve(paths: [["d"]], keep: .both),
        .query(QueryParameters(predicate: "size > 1", sort: "-name", scopes: [.documents, .data], container: "c", watch: true,
                               throttle: 0.5)),
    ])
    func requestsRoundTrip(command: Command) throws {
        let request = ControlRequest(command)
        let decoded = try JSONDecoder().decode(ControlRequest.self, from: JSONEncoder().encode(request))
        #expect(decoded == request)
    }

    @Test func finalLinesCarryTheVersionAndTheResultsFields() throws {
        let line = try JSONEncoder().encode(Reply.done(MountReady(pid: 7, log: "/l", created: ["c"])))
        let object = try #require(try JSONSerialization.jsonObject(with: line) as? [String: Any])
        #expect(object["ok"] as? Bool == true && object["protocol"] as? String == ProtocolVersion.current.description)
        #expect(object["pid"] as? Int == 7 && object["created"] as? [String] == ["c"])
        guard case .done(let ready) = try JSONDecoder().decode(Reply<MountReady>.self, from: line) else {
            Issue.record("not a final line")
            return
        }
        #expect(ready == MountReady(pid: 7, log: "/l", created: ["c"]))
    }

    @Test func handWrittenEventLinesDecodeAsQueryEvents() throws {
        let item = MetadataItem(values: [
            "name": .string("a \"quoted\"\n\u{1}name/é"), "size": .number(1234), "ratio": .number(0.25),
            "isDirectory": .bool(false), "modificationDate": .date(1_700_000_000.5), "uploadingError": .null,
        ])
        let line = QueryService.eventLine(.changed, item, id: 1 << 48 | 42)
        let event = try JSONDecoder().decode(QueryEvent.self, from: Data(line.utf8))
        #expect(event == QueryEvent(.changed, id: 1 << 48 | 42, item: QueryService.json(item)))
        #expect(event.item?["modificationDate"] == .string("2023-11-14T22:13:20Z"))
    }
}

/// Send `data` on a fresh connection (from another thread: the server may
/// stop reading), then read every line of the answer until the server closes.
func exchange(_ path: String, _ data: Data) throws -> [Data] {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = try ControlClient.address(path)
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    try #require(connected == 0, "connect: \(String(cString: strerror(errno)))")
    let sent = DispatchSemaphore(value: 0)
    Thread {
        data.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
                if n <= 0 { return }
                offset += n
            }
            shutdown(fd, Int32(SHUT_WR))
        }
        sent.signal()
    }.start()
    defer { sent.wait() }   // before the descriptor is closed (and its number reused)
    var answer = Data()
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = read(fd, &buffer, buffer.count)
        if n <= 0 { break }
        answer.append(contentsOf: buffer[0..<n])
    }
    return answer.split(separator: 0x0a).map { Data($0) }
}
