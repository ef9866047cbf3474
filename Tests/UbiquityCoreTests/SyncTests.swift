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

/// Push and pull through a store, without a kernel.
@Suite struct SyncTests {
    @Test func secondDeviceRebuildsTheTreeFromTheStore() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        try a.mkdir("docs")
        try a.write("docs/one.txt", "first")
        try a.write("two.txt", "second", mode: 0o600)
        _ = try a.fs.symlink(target: "docs/one.txt", parent: Namespace.rootIno, name: "link", caller: .root)
        _ = try a.fs.link(ino: try a.resolve("two.txt"), newParent: try a.resolve("docs"), newName: "hard", )
        try a.fs.setxattr(ino: try a.resolve("two.txt"), name: "user.tag", value: Data("v".utf8), flags: 0)
        try a.fs.rename(parent: Namespace.rootIno, name: "two.txt", newParent: Namespace.rootIno, newName: "2.txt", flags: [])
        try a.engine.drain(progress: { _, _ in })
        #expect(a.replica.read { $0.pendingSummary().items } == 0)

        let b = try TestDevice(store: store, name: "b")
        defer { b.cleanUp() }
        try b.engine.pull()
        #expect(try b.tree() == a.tree())
        #expect(try b.fs.getxattr(ino: try b.resolve("2.txt"), name: "user.tag") == Data("v".utf8))
        #expect(try b.fs.getattr(ino: try b.resolve("2.txt")).nlink == 2)
    }

    /// A file deleted on another device, which this device had downloaded and
    /// the kernel does not know, leaves no cache file behind when pulled.
    @Test func aFileDeletedElsewhereLeavesNoCacheFileBehind() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("f", "content")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.pull()
        let ino = try #require(b.replica.read { $0.lookup(Namespace.rootIno, "f") })
        try b.engine.download(ino: ino)
        #expect(FileManager.default.fileExists(atPath: b.replica.cache.path(ino)))
        try a.fs.unlink(parent: Namespace.rootIno, name: "f")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.pull()
        #expect(b.replica.read { $0.node(ino) } == nil)
        #expect(!FileManager.default.fileExists(atPath: b.replica.cache.path(ino)))
    }

    @Test func aBurstLargerThanOneChangeSetArrivesWhole() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        for d in 0..<10 {
            try a.mkdir("d\(d)")
            try a.mkdir("d\(d)/sub")
            for f in 0..<500 { try a.write("d\(d)/sub/f\(f)", "\(d)-\(f)") }
        }
        try a.engine.drain(progress: { _, _ in })
        #expect(store.journalLength > 1, "more than one change set")
        try b.engine.pull()
        #expect(try b.tree() == a.tree())
    }

    /// While a backlog lasts, a round passes over the entries of new nodes
    /// outside its batch by a hint (`PendingEntry.newChild`). Every round's
    /// change set still leaves the store whole as far as it goes, and an
    /// entry whose node went first (its folder is newer than the file)
    /// still arrives; the pending count reaches zero exactly.
    @Test func aBacklogRoundByRoundLeavesTheStoreWhole() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("early", "moved into a newer folder")
        try a.mkdir("d")
        for f in 0..<8_100 { try a.write("d/f\(f)", "\(f)") }
        try a.mkdir("late")
        try a.fs.rename(parent: Namespace.rootIno, name: "early", newParent: try a.resolve("late"), newName: "early", flags: [])
        let expected = try a.tree()
        var rounds = 0
        while a.replica.read({ $0.pendingSummary().items }) > 0 {
            #expect(try a.engine.pushOnce(ignoreDelay: true))
            rounds += 1
            try b.engine.pull()
            // What b lists is what a has, as far as it goes.
            for name in try b.list("d") { #expect(expected["d/\(name)"] != nil, "d/\(name) after round \(rounds)") }
            if try b.list("").contains("late") { #expect(try b.list("late").allSatisfy { $0 == "early" }) }
            #expect(try !b.list("").contains("early"), "the file shows at its old name")
            try #require(rounds < 20)
        }
        #expect(rounds >= 3, "the backlog took more than one round")
        #expect(try b.tree() == expected)
        #expect(try b.read("late/early") == "moved into a newer folder")
    }

    @Test func deletionsAndMovesPropagate() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        try a.mkdir("x")
        try a.mkdir("x/y")
        try a.write("x/y/f", "data")
        try a.write("gone", "bye")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.pull()
        #expect(try b.read("x/y/f") == "data")
        try a.fs.rename(parent: try a.resolve("x"), name: "y", newParent: Namespace.rootIno, newName: "y2", flags: [])
        try a.fs.unlink(parent: Namespace.rootIno, name: "gone")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.pull()
        #expect(try b.tree() == a.tree())
        #expect(try b.list("") == ["x", "y2"])
    }

    @Test func aDamagedBlobIsNeverServed() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("f", "precious")
        try a.engine.drain(progress: { _, _ in })
        let hash = ContentCopy.hash(of: Data("precious".utf8))
        store.corruptBlob(hash, with: Data("tampered".utf8))
        try b.engine.pull()
        #expect(throws: UbiquityError.self) { _ = try b.read("f") }
        #expect(b.engine.currentStatus.lastError != nil)
    }

    @Test func anUnreachableStoreKeepsTheQueue() throws {
        let store = FaultyStore(InMemoryStore())
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        store.fail([.commit, .putBlob])
        try a.write("f", "queued")
        #expect(throws: UbiquityError.self) { try a.engine.pushOnce(ignoreDelay: true) }
        #expect(a.replica.read { $0.pendingSummary().items } > 0)
        store.fail([])
        try a.engine.drain(progress: { _, _ in })
        #expect(a.replica.read { $0.pendingSummary().items } == 0)
    }

    @Test func contentTheStoreRefusesWaitsAloneAndBlocksTheUnmount() throws {
        let store = FaultyStore(InMemoryStore())
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        store.refuseBlobs(largerThan: 1000)
        try a.write("big", String(repeating: "x", count: 2000))
        try a.write("small", "fits")
        try a.engine.pushOnce(ignoreDelay: false)
        #expect(a.engine.failingUploads().map(\.ino) == [try a.resolve("big")])
        try b.engine.pull()
        #expect(try b.list("") == ["small"], "the refused file is not pushed in part")
        // What the store refuses is not in the store: draining (unmount) must say so.
        let error = #expect(throws: UbiquityError.self) { try a.engine.drain(progress: { _, _ in }) }
        #expect(error?.description.contains("/big") == true)
        // New content of the refused file is tried at once, not after the back-off.
        try a.write("big", String(repeating: "y", count: 500))
        try a.engine.pushOnce(ignoreDelay: false)
        #expect(a.engine.failingUploads().isEmpty)
        try b.engine.pull()
        #expect(try b.read("big") == String(repeating: "y", count: 500))
        try a.engine.drain(progress: { _, _ in })
    }

    @Test func contentUnderAnOpenWriterWaitsForTheLastClose() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        let ino = try a.write("f", "v1")
        let handle = try a.fs.open(ino: ino, flags: O_WRONLY).handle
        // A writer is open: content must not be pushed, only metadata.
        try a.engine.pushOnce(ignoreDelay: true)
        let node = a.replica.read { $0.node(ino)! }
        #expect(node.hasUnpushedContent)
        #expect(node.hash == nil)
        let bytes = Array("v2".utf8)
        _ = try bytes.withUnsafeBytes { try a.fs.write(handle: handle, offset: 0, bytes: $0.baseAddress!, count: 2) }
        try a.fs.release(handle: handle)
        try a.engine.drain(progress: { _, _ in })
        #expect(a.replica.read { $0.node(ino)!.hash } == ContentCopy.hash(of: Data("v2".utf8)))
    }

    @Test func losingTheCommitRaceCatchesUpAndRetries() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("from-a", "a")
        try b.write("from-b", "b")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.drain(progress: { _, _ in })   // journal 1 is taken: b must pull then commit 2
        try a.engine.pull()
        #expect(try a.tree() == b.tree())
        #expect(try a.list("") == ["from-a", "from-b"])
    }
}

/// The replica's index survives a restart and the lock refuses a second daemon.
@Suite struct ReplicaTests {
    @Test func stateSurvivesReopenAndTheLockIsExclusive() throws {
        let store = InMemoryStore()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-core-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        var ino: UInt64 = 0
        do {
            let a = try TestDevice(store: store, name: "a", directory: directory)
            ino = try a.write("kept", "across restarts")
            #expect(throws: UbiquityError.self) { _ = try Replica(directory: directory, rootOwner: (0, 0)) }
        }
        let again = try TestDevice(store: store, name: "a", directory: directory)
        #expect(try again.read("kept") == "across restarts")
        #expect(try again.resolve("kept") == ino, "inode numbers are stable")
        #expect(again.replica.read { $0.pendingSummary().items } > 0, "the unpushed queue survived")
        let fresh = try again.write("new", "")
        #expect(fresh > ino, "inode numbers are never reused")
    }
}

@Suite struct FolderStoreTests {
    func temp() -> URL { FileManager.default.temporaryDirectory.appendingPathComponent("ubq-store-\(UUID().uuidString)") }

    @Test func commitsAreExclusive() throws {
        let root = temp()
        defer { try? FileManager.default.removeItem(at: root) }
        let store = try FolderStore(root: root, create: true, initializeEmpty: true)
        try store.createContainer(ContainerConfig(id: "com.example.a", displayName: "A"))
        let set = ChangeSet(device: "d", deviceName: "d", changes: [.entry(parent: .root, name: "n", child: nil)])
        #expect(try store.commit(container: "com.example.a", seq: 1, changeSet: set))
        #expect(try !store.commit(container: "com.example.a", seq: 1, changeSet: set))
        let records = try store.journal(container: "com.example.a", after: 0, limit: 10)
        #expect(records.count == 1 && records[0].changeSet?.changes == set.changes)
    }

    @Test func refusesWhatIsNotAStore() throws {
        let root = temp()
        defer { try? FileManager.default.removeItem(at: root) }
        #expect(throws: UbiquityError.self) { _ = try FolderStore(root: root, create: false, initializeEmpty: true) }
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        try Data("x".utf8).write(to: root.appendingPathComponent("unrelated"))
        #expect(throws: UbiquityError.self) { _ = try FolderStore(root: root, create: false, initializeEmpty: true) }
        try Data("{broken".utf8).write(to: root.appendingPathComponent(FolderStore.markerName))
        #expect(throws: UbiquityError.self) { _ = try FolderStore(root: root, create: false, initializeEmpty: true) }
    }

    /// A private store is its owner's only whatever the umask; a shared one
    /// is its group's (folders 0770 keeping the inherited set-gid bit, files
    /// 0640); a private store refuses to be opened as shared.
    @Test func storeFilesAreOwnerOnlyUnlessShared() throws {
        func modes(_ root: URL) -> [String: mode_t] {
            var out: [String: mode_t] = [:]
            let paths = [""] + (FileManager.default.subpaths(atPath: root.path) ?? [])
            for path in paths {
                var st = stat()
                lstat(root.appendingPathComponent(path).path, &st)
                out[path] = st.st_mode & 0o7777
            }
            return out
        }
        let hash = ContentCopy.hash(of: Data("content".utf8))
        let set = ChangeSet(device: "d", deviceName: "d", changes: [.entry(parent: .root, name: "n", child: nil)])
        for shared in [false, true] {
            let root = temp()
            defer { try? FileManager.default.removeItem(at: root) }
            try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
            if shared { chmod(root.path, 0o2770) }
            let store = try FolderStore(root: root, create: false, initializeEmpty: true, shared: shared)
            #expect(store.shared == shared)
            try store.createContainer(ContainerConfig(id: "com.example.a", displayName: "A"))
            #expect(try store.commit(container: "com.example.a", seq: 1, changeSet: set))
            try store.putBlob(hash, data: Data("content".utf8))
            for (path, mode) in modes(root) {
                var isDirectory: ObjCBool = false
                _ = FileManager.default.fileExists(atPath: root.appendingPathComponent(path).path, isDirectory: &isDirectory)
                let expected: mode_t = isDirectory.boolValue ? (shared ? 0o2770 : 0o700)
                                                             : (path == FolderStore.markerName && shared ? 0o644 : (shared ? 0o640 : 0o600))
                #expect(mode == expected, "\(shared ? "shared" : "private") store: \(path) is \(String(mode, radix: 8))")
            }
            let reopened = try FolderStore(root: root, create: false, initializeEmpty: false)
            #expect(reopened.shared == shared)
            if !shared {
                #expect(throws: UbiquityError.self) { _ = try FolderStore(root: root, create: false, initializeEmpty: false, shared: true) }
            }
        }
    }

    @Test func damagedBlobsAreDetected() throws {
        let root = temp()
        defer { try? FileManager.default.removeItem(at: root) }
        let store = try FolderStore(root: root, create: true, initializeEmpty: true)
        let hash = ContentCopy.hash(of: Data("content".utf8))
        try store.putBlob(hash, data: Data("content".utf8))
        #expect(try store.fetchBlob(hash) == Data("content".utf8))
        let blob = root.appendingPathComponent("blobs/\(hash.prefix(2))/\(hash)")
        chmod(blob.path, 0o644)
        try Data("CONTENT".utf8).write(to: blob)
        #expect(throws: UbiquityError.self) { _ = try store.fetchBlob(hash) }
    }

    @Test func blobSizeAndACutShortBlobReplaced() throws {
        let root = temp()
        defer { try? FileManager.default.removeItem(at: root) }
        let store = try FolderStore(root: root, create: true, initializeEmpty: true)
        let content = Data("content".utf8)
        let hash = ContentCopy.hash(of: content)
        #expect(try store.blobSize(hash) == nil)
        try store.putBlob(hash, data: content)
        #expect(try store.blobSize(hash) == 7)
        let blob = root.appendingPathComponent("blobs/\(hash.prefix(2))/\(hash)")
        try Data("cont".utf8).write(to: blob)
        #expect(try !store.holdsBlob(hash, size: 7))
        try store.putBlob(hash, data: content)
        #expect(try store.fetchBlob(hash) == content, "a cut-short blob is replaced")
    }

    @Test func nonUTF8NamesRoundTripThroughTheJournal() throws {
        let name = FileName(bytes: [0x66, 0xff, 0xfe])
        let data = try JSONEncoder().encode(Change.entry(parent: .root, name: name, child: "c"))
        #expect(try JSONDecoder().decode(Change.self, from: data) == .entry(parent: .root, name: name, child: "c"))
    }
}
