import CFuseWire
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// CFuseWire's OPEN reply patch (`ubq_next_open_reply`) on fabricated
/// requests and replies: it changes the reply to the OPEN or CREATE it was
/// armed for, and nothing else this thread writes.
@Suite(.serialized) struct FuseWireTests {
    static let openOpcode: UInt32 = 14
    static let createOpcode: UInt32 = 35
    static let lookupOpcode: UInt32 = 1

    /// Have this thread read a request (a fuse_in_header and a few bytes of
    /// body) through `ubq_io_read`, as the FUSE loop does.
    func read(opcode: UInt32, unique: UInt64) {
        var request = [UInt8](repeating: 0, count: 64)
        func put<T: FixedWidthInteger>(_ value: T, at offset: Int) {
            withUnsafeBytes(of: value.littleEndian) { for (i, b) in $0.enumerated() { request[offset + i] = b } }
        }
        put(UInt32(request.count), at: 0)
        put(opcode, at: 4)
        put(unique, at: 8)
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        #expect(write(fds[1], request, request.count) == request.count)
        var buffer = [UInt8](repeating: 0, count: 256)
        #expect(ubq_io_read(fds[0], &buffer, buffer.count, nil) == request.count)
    }

    /// Write a reply with a `fuse_open_out` body (zeroed) for `unique`
    /// through `ubq_io_writev`; the body as it went out: (open_flags, backing_id).
    func reply(unique: UInt64) -> (flags: UInt32, backing: Int32) {
        var header = [UInt8](repeating: 0, count: 16)
        withUnsafeBytes(of: UInt32(32).littleEndian) { for (i, b) in $0.enumerated() { header[i] = b } }
        withUnsafeBytes(of: unique.littleEndian) { for (i, b) in $0.enumerated() { header[8 + i] = b } }
        var body = [UInt8](repeating: 0, count: 16)
        let sink = open("/dev/null", O_WRONLY | O_CLOEXEC)
        defer { close(sink) }
        header.withUnsafeMutableBytes { h in
            body.withUnsafeMutableBytes { b in
                var iov = [iovec(iov_base: h.baseAddress, iov_len: h.count), iovec(iov_base: b.baseAddress, iov_len: b.count)]
                #expect(ubq_io_writev(sink, &iov, 2, nil) == 32)
            }
        }
        let flags = body[8..<12].withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }
        let backing = body[12..<16].withUnsafeBytes { $0.loadUnaligned(as: Int32.self) }
        return (flags, backing)
    }

    @Test func thePatchGoesIntoTheReplyOfTheOpenItWasArmedFor() {
        read(opcode: Self.openOpcode, unique: 70)
        ubq_next_open_reply(UInt32(UBQ_FOPEN_PASSTHROUGH), 5)
        let patched = reply(unique: 70)
        #expect(patched.flags == UInt32(UBQ_FOPEN_PASSTHROUGH) && patched.backing == 5)
        // Once only.
        #expect(reply(unique: 70) == (0, 0))
        read(opcode: Self.createOpcode, unique: 72)
        ubq_next_open_reply(UInt32(UBQ_FOPEN_PASSTHROUGH | UBQ_FOPEN_DIRECT_IO), 9)
        #expect(reply(unique: 72) == (UInt32(UBQ_FOPEN_PASSTHROUGH | UBQ_FOPEN_DIRECT_IO), 9))
    }

    @Test func aReplyToAnotherRequestIsNotPatchedAndDisarms() {
        read(opcode: Self.openOpcode, unique: 80)
        ubq_next_open_reply(UInt32(UBQ_FOPEN_PASSTHROUGH), 5)
        // Whatever else this thread writes first is left alone...
        #expect(reply(unique: 81) == (0, 0), "the reply to another request was patched")
        // ...and the patch is gone: it was for a reply that did not come next.
        #expect(reply(unique: 80) == (0, 0))
        #expect(reply(unique: 82) == (0, 0))
    }

    @Test func aPatchArmedWhileAnsweringSomethingElseThanAnOpenIsNeverApplied() {
        read(opcode: Self.lookupOpcode, unique: 90)
        ubq_next_open_reply(UInt32(UBQ_FOPEN_PASSTHROUGH), 5)
        #expect(reply(unique: 90) == (0, 0), "a LOOKUP's reply was patched as an OPEN's")
        ubq_forget_open_reply()
    }

    @Test func forgettingDisarms() {
        read(opcode: Self.openOpcode, unique: 100)
        ubq_next_open_reply(UInt32(UBQ_FOPEN_PASSTHROUGH), 5)
        ubq_forget_open_reply()
        #expect(reply(unique: 100) == (0, 0))
    }
}
