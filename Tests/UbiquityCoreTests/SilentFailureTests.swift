import Foundation
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityModel
import UbiquityTesting
@testable import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// Failures that used to be swallowed (`try?`) reach the status (and so
/// `ubiquityfs status`'s "Recent errors" and the log).
@Suite struct SilentFailureTests {
    /// A push that cannot open a file's cache file said nothing and tried
    /// again every round, for ever: it is a failing upload, in the status.
    @Test func aPushThatCannotOpenTheCacheFileIsAFailureInTheStatus() throws {
        let device = try TestDevice(store: InMemoryStore(), name: "a")
        defer { device.cleanUp() }
        let handle = try device.fs.create(parent: Namespace.rootIno, name: FileName("doc.txt"), mode: 0o644,
                                          flags: O_WRONLY, caller: .root).1.handle
        let bytes = Data("hello\n".utf8)
        _ = try bytes.withUnsafeBytes { try device.fs.write(handle: handle, offset: 0, bytes: $0.baseAddress!, count: $0.count) }
        try device.fs.release(handle: handle)
        let ino = try device.resolve("doc.txt")
        // The cache file is gone (a disk error, a user's rm in the data home).
        #expect(unlink(device.replica.cache.path(ino)) == 0)
        _ = try device.engine.pushOnce(ignoreDelay: true)
        let failing = device.engine.failingUploads()
        #expect(failing.map(\.ino) == [ino], "the push did not count the file as failing: \(failing)")
        let errors = device.engine.currentStatus.recentErrors.map(\.message)
        #expect(errors.contains { $0.contains("doc.txt") }, "status says nothing about doc.txt: \(errors)")
        #expect(device.replica.read { $0.node(ino)!.hasUnpushedContent }, "the file counts as pushed")
    }
}
