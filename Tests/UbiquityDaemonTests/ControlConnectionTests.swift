import Foundation
import Testing
@testable import UbiquityDaemon
#if canImport(Glibc)
import Glibc
#endif

/// A control client that stops reading: the daemon's send blocks, and must
/// neither keep the connection from being closed nor last for ever.
@Suite struct ControlConnectionTests {
    /// A connected pair: the daemon's end (a `ControlConnection`) and the
    /// client's raw descriptor, whose receive buffer is kept small.
    func pair(sendTimeout: Double = ControlConnection.sendTimeoutSeconds) -> (ControlConnection, Int32) {
        var fds: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0)
        var small: Int32 = 4096
        setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        return (ControlConnection(fd: fds[0], sendTimeout: sendTimeout), fds[1])
    }

    /// Send lines until a send fails (or the connection is closed): on another thread.
    func sendUntilRefused(_ connection: ControlConnection) -> DispatchSemaphore {
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let line = Data(repeating: UInt8(ascii: "x"), count: 64 << 10)
            while connection.sendRaw(line) {}
            done.signal()
        }
        return done
    }

    @Test func closingTheConnectionDoesNotWaitForASendBlockedOnAClientThatDoesNotRead() throws {
        let (connection, client) = pair()
        defer { close(client) }
        let sender = sendUntilRefused(connection)
        // Let the sender fill the socket and block in send.
        Thread.sleep(forTimeInterval: 0.5)
        #expect(sender.wait(timeout: .now()) == .timedOut, "the send did not block: the test shows nothing")
        let closed = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            connection.close(force: true)
            closed.signal()
        }
        let closedInTime = closed.wait(timeout: .now() + 3) == .success
        #expect(closedInTime, "close(force:) waited for a send blocked on a client that does not read")
        if !closedInTime {
            // Unblock the sender (and so the close) before the test ends.
            shutdown(client, Int32(SHUT_RDWR))
            _ = closed.wait(timeout: .now() + 10)
        }
        #expect(sender.wait(timeout: .now() + 3) == .success, "the blocked send did not give up once the connection closed")
    }

    @Test func aClientThatReadsNothingForTheSendTimeoutIsDropped() throws {
        let (connection, client) = pair(sendTimeout: 0.5)
        defer { close(client); connection.close(force: true) }
        let sender = sendUntilRefused(connection)
        // The socket fills, the send waits 0.5 s for the client, then gives up (once more
        // if it had moved some bytes).
        #expect(sender.wait(timeout: .now() + 5) == .success, "a send to a client that reads nothing did not give up")
        // The client finds what was sent, then the end: it was dropped.
        var timeout = timeval(tv_sec: 3, tv_usec: 0)
        setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var n = 0
        repeat { n = read(client, &buffer, buffer.count) } while n > 0
        #expect(n == 0, "the connection is still open (read: \(n), errno \(errno))")
        #expect(!connection.sendRaw(Data("late".utf8)))
    }
}
