import Foundation
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityTesting
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// Eviction never drops the last copy; a crash during a rewrite never
/// replaces the good version with a torn one.
@Suite struct RecoveryTests {
    static let big = Data((0..<(9 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 13) })

    /// Open `path` for writing (creating it), write `data` at 0, and leave the
    /// handle open: the caller decides between close, fsync and a "crash".
    func openAndWrite(_ device: TestDevice, _ path: String, _ data: Data, flags: Int32 = O_WRONLY | O_TRUNC) throws -> UInt64 {
        let (parent, name) = try device.split(path)
        let handle: UInt64
        if let existing = try? device.fs.lookup(parent: parent, name: name) {
            handle = try device.fs.open(ino: existing.ino, flags: flags).handle
        } else {
            handle = try device.fs.create(parent: parent, name: name, mode: 0o644, flags: O_WRONLY, caller: .root).1.handle
        }
        let written = try data.withUnsafeBytes { raw in
            try device.fs.write(handle: handle, offset: 0, bytes: raw.baseAddress!, count: raw.count)
        }
        #expect(written == data.count)
        return handle
    }

    func readAll(_ device: TestDevice, _ path: String) throws -> Data {
        let ino = try device.resolve(path)
        try device.engine.download(ino: ino)
        let size = Int(try device.fs.getattr(ino: ino).size)
        let handle = try device.fs.open(ino: ino, flags: O_RDONLY).handle
        defer { try? device.fs.release(handle: handle) }
        guard case .fileRange(let fd, let offset, _, _) = try device.fs.read(handle: handle, offset: 0, size: size) else { return Data() }
        var buffer = [UInt8](repeating: 0, count: size)
        let n = pread(fd, &buffer, size, off_t(offset))
        return Data(buffer[0..<max(0, n)])
    }

    func chunkHashes(_ data: Data) -> [String] {
        stride(from: 0, to: data.count, by: ContentLayout.chunkSize).map {
            ContentCopy.hash(of: data.subdata(in: $0..<min(data.count, $0 + ContentLayout.chunkSize)))
        }
    }

    // MARK: Evict

    @Test func evictRefusesAndPutsBackABlobTheStoreLost() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        let ino = try a.write("f", "precious")
        try a.engine.drain(progress: { _, _ in })
        let hash = ContentCopy.hash(of: Data("precious".utf8))
        store.loseBlob(hash)
        let refusal = #expect(throws: UbiquityError.self) { try a.engine.evict(ino: ino) }
        #expect(refusal?.errno == EAGAIN)
        #expect(refusal?.message.contains("uploaded again") == true)
        #expect(store.blobHashes.contains(hash), "the device put the blob back")
        #expect(a.replica.read { $0.node(ino)!.hasContent }, "nothing was evicted")
        try b.engine.pull()
        #expect(try b.read("f") == "precious")
        #expect(try a.engine.evict(ino: ino), "with the store whole again, evict goes through")
        #expect(a.replica.read { $0.node(ino)!.isPlaceholder })
    }

    @Test func evictPutsBackAMissingChunkAndACutShortManifest() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        try a.fs.release(handle: try openAndWrite(a, "big", Self.big))
        try a.engine.drain(progress: { _, _ in })
        let ino = try a.resolve("big")
        let manifest = try #require(a.replica.read { $0.node(ino)!.hash })
        let chunks = chunkHashes(Self.big)
        store.loseBlob(chunks[1])
        let refusal = #expect(throws: UbiquityError.self) { try a.engine.evict(ino: ino) }
        #expect(refusal?.errno == EAGAIN)
        #expect(store.blobHashes.isSuperset(of: chunks))
        store.corruptBlob(manifest, with: Data("{".utf8))
        #expect(throws: UbiquityError.self) { try a.engine.evict(ino: ino) }
        #expect(try store.fetchBlob(manifest).count > 1, "the manifest was put back")
        try b.engine.pull()
        #expect(try readAll(b, "big") == Self.big)
        #expect(try a.engine.evict(ino: ino))
        #expect(try readAll(a, "big") == Self.big)
    }

    @Test func aLocalCopyThatIsNotTheVersionIsNeverUploadedNorEvicted() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        let ino = try a.write("f", "original")
        try a.engine.drain(progress: { _, _ in })
        store.loseBlob(ContentCopy.hash(of: Data("original".utf8)))
        // The local copy rots behind the index's back.
        try Data("ORIGINAL".utf8).write(to: URL(fileURLWithPath: a.replica.cache.path(ino)))
        let refusal = #expect(throws: UbiquityError.self) { try a.engine.evict(ino: ino) }
        #expect(refusal?.errno == EIO)
        #expect(store.blobHashes.isEmpty, "nothing uploaded under a hash its bytes do not have")
        #expect(a.replica.read { $0.node(ino)!.hasContent })
    }

    @Test func evictRefusesWhileTheStoreIsUnreachable() throws {
        let store = FaultyStore(InMemoryStore())
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        let ino = try a.write("f", "kept")
        try a.engine.drain(progress: { _, _ in })
        store.fail([.blobSize])
        let refusal = #expect(throws: UbiquityError.self) { try a.engine.evict(ino: ino) }
        #expect(refusal?.errno == EHOSTDOWN)
        store.fail([])
        #expect(try a.engine.evict(ino: ino))
    }

    @Test func theCheckOfHeldContentPutsBackWhatTheStoreLost() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        try a.write("small", "small content")
        try a.fs.release(handle: try openAndWrite(a, "big", Self.big))
        try a.engine.drain(progress: { _, _ in })
        let all = store.blobHashes
        for hash in all { store.loseBlob(hash) }
        a.engine.checkHeldContent()
        #expect(store.blobHashes == all)
    }

    // MARK: Crash recovery

    /// Reopen the replica of `device` as the daemon does after `kill -9`:
    /// what the index holds is all that survived.
    func restart(_ device: TestDevice, store: any Store) throws -> TestDevice {
        try device.replica.persist()   // (as any other file's commit would have)
        device.replica.releaseLock()
        return try TestDevice(store: store, name: "a", directory: device.directory)
    }

    func recoveredCopies(_ device: TestDevice) throws -> [String] {
        try device.list("").filter { $0.hasPrefix("f (recovered copy a ") && $0.hasSuffix(").txt") }
    }

    @Test func aRewriteInterruptedByACrashBecomesARecoveredCopy() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        try a.write("f.txt", "good version")
        try a.engine.drain(progress: { _, _ in })
        _ = try openAndWrite(a, "f.txt", Data("torn".utf8))   // never closed
        let again = try restart(a, store: store)
        let listing = try again.list("")
        #expect(try recoveredCopies(again).count == 1, "listing: \(listing)")
        let copy = try #require(try recoveredCopies(again).first)
        #expect(try again.read(copy) == "torn")
        #expect(try String(decoding: readAll(again, "f.txt"), as: UTF8.self) == "good version")
        let conflicts = try again.engine.versions(ino: try again.resolve("f.txt"))
        #expect(conflicts.count == 2 && conflicts[1].path == "/" + copy, "the copy is a conflict version of f.txt")
        try again.engine.drain(progress: { _, _ in })
        let b = try TestDevice(store: store, name: "b")
        defer { b.cleanUp() }
        try b.engine.pull()
        #expect(try b.tree() == again.tree())
        #expect(try b.read("f.txt") == "good version")
    }

    /// A power cut kept a pushed file's new bytes (its cache file) and lost
    /// the log record that marked the rewrite: a replica that was open when
    /// the machine went down checks its clean copies before serving them —
    /// only then, and once.
    @Test func aCopyChangedBehindTheIndexIsFoundAfterTheMachineWentDown() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a", boot: "boot-1")
        defer { a.cleanUp() }
        try a.write("f.txt", "good version")
        try a.engine.drain(progress: { _, _ in })
        let ino = try a.resolve("f.txt")
        try Data("torn bytes".utf8).write(to: URL(fileURLWithPath: a.replica.cache.path(ino)))
        a.replica.releaseLock()
        // The same boot: the daemon died, the machine did not (its page cache kept every mark).
        let sameBoot = try TestDevice(store: store, name: "a", directory: a.directory, boot: "boot-1")
        #expect(!sameBoot.replica.openedAfterSystemCrash)
        #expect(try recoveredCopies(sameBoot).isEmpty)
        sameBoot.replica.releaseLock()
        // Another boot: checked, and the copy that is not the store's version is split.
        let again = try TestDevice(store: store, name: "a", directory: a.directory, boot: "boot-2")
        #expect(again.replica.openedAfterSystemCrash)
        let copy = try #require(try recoveredCopies(again).first)
        #expect(try again.read(copy) == "torn bytes")
        #expect(try String(decoding: readAll(again, "f.txt"), as: UTF8.self) == "good version")
        again.replica.releaseLock()
        // Checked once: the lock file names this boot now.
        let checked = try TestDevice(store: store, name: "a", directory: a.directory, boot: "boot-2")
        #expect(!checked.replica.openedAfterSystemCrash)
        try checked.replica.commitAndCheckpoint()
        try checked.replica.closedCleanly()
        checked.replica.releaseLock()
        // Closed cleanly: the next boot trusts the copies.
        let later = try TestDevice(store: store, name: "a", directory: a.directory, boot: "boot-3")
        #expect(!later.replica.openedAfterSystemCrash)
        later.replica.releaseLock()
    }

    @Test func cacheFilesThatNeverReachedTheDiskAreReplacedAfterTheMachineWentDown() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a", boot: "boot-1")
        defer { a.cleanUp() }
        try a.write("pushed.txt", "the store's version")
        try a.engine.drain(progress: { _, _ in })
        let rewrite = try openAndWrite(a, "pushed.txt", Data("a change never synced".utf8))
        try a.fs.release(handle: rewrite)
        try a.write("new.txt", "never synced either")
        try a.replica.persist()
        // The log reached the disk (another file's fsync synced it); these cache files did not.
        for name in ["pushed.txt", "new.txt"] { unlink(a.replica.cache.path(try a.resolve(name))) }
        a.replica.releaseLock()
        let again = try TestDevice(store: store, name: "a", directory: a.directory, boot: "boot-2")
        defer { again.replica.releaseLock() }
        #expect(try again.list("").sorted() == ["new.txt", "pushed.txt"])
        #expect(try readAll(again, "new.txt").isEmpty, "a file never pushed nor synced is empty")
        #expect(try String(decoding: readAll(again, "pushed.txt"), as: UTF8.self) == "the store's version")
    }

    @Test func writesAfterAnFsyncAreUnacknowledgedAgain() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        try a.write("f.txt", "good version")
        try a.engine.drain(progress: { _, _ in })
        let handle = try openAndWrite(a, "f.txt", Data("synced".utf8))
        try a.fs.fsync(handle: handle, dataOnly: false)
        _ = try Data("+more".utf8).withUnsafeBytes { try a.fs.write(handle: handle, offset: 6, bytes: $0.baseAddress!, count: 5) }
        let again = try restart(a, store: store)
        #expect(try recoveredCopies(again).count == 1)
        #expect(try again.read(try #require(try recoveredCopies(again).first)) == "synced+more")
        #expect(try String(decoding: readAll(again, "f.txt"), as: UTF8.self) == "good version")
    }

    @Test func aRewriteClosedOrFsyncedBeforeTheCrashIsPushed() throws {
        for how in ["fsync", "close"] {
            let store = InMemoryStore()
            let a = try TestDevice(store: store, name: "a")
            defer { a.cleanUp() }
            try a.write("f.txt", "good version")
            try a.engine.drain(progress: { _, _ in })
            let handle = try openAndWrite(a, "f.txt", Data("acknowledged".utf8))
            if how == "fsync" { try a.fs.fsync(handle: handle, dataOnly: true) } else { try a.fs.flush(handle: handle) }
            let again = try restart(a, store: store)
            let listing = try again.list("")
            #expect(try recoveredCopies(again).isEmpty, "\(how): \(listing)")
            #expect(try again.read("f.txt") == "acknowledged", "\(how)")
            try again.engine.drain(progress: { _, _ in })
            let b = try TestDevice(store: store, name: "b")
            defer { b.cleanUp() }
            try b.engine.pull()
            #expect(try b.read("f.txt") == "acknowledged", "\(how)")
        }
    }

    @Test func opensThatWroteNothingAndNewFilesKeepTheirName() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        try a.write("f.txt", "good version")
        try a.engine.drain(progress: { _, _ in })
        _ = try a.fs.open(ino: try a.resolve("f.txt"), flags: O_RDWR).handle   // opened for writing, nothing written
        _ = try openAndWrite(a, "new.txt", Data("never pushed".utf8))          // created, written, never closed
        let again = try restart(a, store: store)
        #expect(try again.list("") == ["f.txt", "new.txt"])
        #expect(try again.read("f.txt") == "good version")
        #expect(try again.read("new.txt") == "never pushed")
        #expect(again.replica.read { ns in ns.nodes.values.allSatisfy { !$0.unacknowledgedWrites } })
    }

    // MARK: Open and evict

    @Test func evictKeepsOffAFileBeingOpenedOrWritten() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        let ino = try a.write("f", "content")
        try a.engine.drain(progress: { _, _ in })
        a.replica.record { ns in ns.beginOpening(ino) }
        let refusal = #expect(throws: UbiquityError.self) { try a.engine.evict(ino: ino) }
        #expect(refusal?.errno == EBUSY)
        a.replica.record { ns in ns.endOpening(ino) }
        let handle = try a.fs.open(ino: ino, flags: O_RDWR).handle
        #expect(throws: UbiquityError.self) { try a.engine.evict(ino: ino) }
        try a.fs.release(handle: handle)
        try a.engine.drain(progress: { _, _ in })
        #expect(try a.engine.evict(ino: ino))
        // A writer opening an evicted file downloads it and writes to the content that stays.
        let writer = try a.fs.open(ino: ino, flags: O_RDWR).handle
        _ = try Data("C".utf8).withUnsafeBytes { try a.fs.write(handle: writer, offset: 0, bytes: $0.baseAddress!, count: 1) }
        try a.fs.release(handle: writer)
        #expect(try a.read("f") == "Content")
    }
}
