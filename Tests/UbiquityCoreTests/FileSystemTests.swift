import Foundation
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityModel
import UbiquityTesting
#if canImport(Glibc)
import Glibc
#endif

/// The filesystem core without a kernel: POSIX rules the core itself enforces.
@Suite struct FileSystemTests {
    func withDevice(_ body: (TestDevice) throws -> Void) throws {
        let device = try TestDevice(store: InMemoryStore())
        defer { device.cleanUp() }
        try body(device)
    }

    func errno(_ body: () throws -> Void) -> Int32? {
        do { try body(); return nil } catch let e as UbiquityError { return e.errno } catch { return -1 }
    }

    /// Two mounts of one container (two views, two kernels) each keep
    /// their own page cache: an open keeps it only if that kernel filled it
    /// from the current content, and a write through one mount makes only
    /// the other drop its pages.
    @Test func eachMountKeepsItsOwnPageCache() throws {
        try withDevice { d in
            let other = FileSystem(replica: d.replica, hooks: d.engine)
            let ino = try d.write("f.txt", "one")
            func keeps(_ fs: FileSystem) throws -> Bool {
                let opened = try fs.open(ino: ino, flags: O_RDONLY)
                try fs.release(handle: opened.handle)
                return opened.keepCache
            }
            #expect(try keeps(d.fs), "the mount that wrote it holds its pages")
            #expect(try !keeps(other), "the other mount never read it")
            #expect(try keeps(other))
            let writer = try other.open(ino: ino, flags: O_WRONLY)
            _ = try Array("two".utf8).withUnsafeBytes { try other.write(handle: writer.handle, offset: 0, bytes: $0.baseAddress!, count: 3) }
            try other.release(handle: writer.handle)
            #expect(try !keeps(d.fs), "written through the other mount: this one's pages are stale")
            #expect(try keeps(other), "its own writes went through its pages")
            #expect(try keeps(d.fs))
        }
    }

    @Test func eachMountKeepsItsOwnListingsUntilTheFolderChanges() throws {
        try withDevice { d in
            let other = FileSystem(replica: d.replica, hooks: d.engine)
            try d.mkdir("dir")
            try d.write("dir/a", "a")
            let dir = try d.resolve("dir")
            func opened(_ fs: FileSystem) throws -> ListingCache {
                let handle = try fs.opendir(ino: dir)
                defer { fs.releasedir(handle: handle) }
                return fs.listingCache(ino: dir)
            }
            #expect(try opened(other) == .refill, "the other mount never listed it")
            #expect(try opened(other) == .keep)
            #expect(try opened(d.fs) == .refill)
            #expect(try opened(d.fs) == .keep)
            try d.write("dir/b", "b")
            #expect(try opened(other) == .refill, "an entry added through the first mount")
            #expect(try opened(other) == .keep)
            try d.fs.unlink(parent: dir, name: "a")
            #expect(try opened(other) == .refill, "an entry removed through the first mount")
            try d.write("dir/b", "rewritten")
            #expect(try opened(other) == .keep, "a file's content is not its folder's listing")
            try other.rename(parent: dir, name: "b", newParent: Namespace.rootIno, newName: "b", flags: [])
            #expect(try opened(d.fs) == .refill, "an entry moved out through the other mount")
            #expect(try opened(d.fs) == .keep)
        }
    }

    @Test func createWriteReadBack() throws {
        try withDevice { d in
            try d.write("a.txt", "hello")
            #expect(try d.read("a.txt") == "hello")
            #expect(try d.fs.getattr(ino: try d.resolve("a.txt")).size == 5)
        }
    }

    @Test func namesAreExactBytes() throws {
        try withDevice { d in
            try d.write("caf\u{e9}", "nfc")           // é precomposed
            try d.write("cafe\u{301}", "nfd")         // e + combining acute
            #expect(try d.read("caf\u{e9}") == "nfc")
            #expect(try d.read("cafe\u{301}") == "nfd")
            #expect(try d.list("").count == 2)
        }
    }

    @Test func renameRules() throws {
        try withDevice { d in
            try d.mkdir("dir")
            try d.mkdir("dir/sub")
            try d.mkdir("full")
            try d.write("full/x", "x")
            try d.write("f", "f")
            let root = Namespace.rootIno
            let dir = try d.resolve("dir")
            let sub = try d.resolve("dir/sub")
            #expect(errno { try d.fs.rename(parent: root, name: "dir", newParent: sub, newName: "loop", flags: []) } == EINVAL)
            #expect(errno { try d.fs.rename(parent: root, name: "dir", newParent: root, newName: "full", flags: []) } == ENOTEMPTY)
            #expect(errno { try d.fs.rename(parent: root, name: "f", newParent: root, newName: "dir", flags: []) } == EISDIR)
            #expect(errno { try d.fs.rename(parent: root, name: "dir", newParent: root, newName: "f", flags: []) } == ENOTDIR)
            #expect(errno { try d.fs.rename(parent: root, name: "f", newParent: root, newName: "full", flags: .noReplace) } == EEXIST)
            try d.fs.rename(parent: root, name: "f", newParent: root, newName: "full", flags: .exchange)
            #expect(try d.read("full") == "f")
            #expect(try d.read("f/x") == "x")
            try d.fs.rename(parent: dir, name: "sub", newParent: root, newName: "moved", flags: [])
            #expect(try d.fs.getattr(ino: dir).nlink == 2)
            #expect(try d.list("").contains("moved"))
        }
    }

    @Test func unlinkedOpenFileStaysReadableUntilRelease() throws {
        try withDevice { d in
            let ino = try d.write("gone", "still here")
            let handle = try d.fs.open(ino: ino, flags: O_RDONLY).handle
            try d.fs.unlink(parent: Namespace.rootIno, name: "gone")
            #expect(errno { _ = try d.fs.lookup(parent: Namespace.rootIno, name: "gone") } == ENOENT)
            #expect(try d.fs.getattr(ino: ino).nlink == 0)
            guard case .fileRange(let fd, _, _, _) = try d.fs.read(handle: handle, offset: 0, size: 10) else { Issue.record("no range"); return }
            var buffer = [UInt8](repeating: 0, count: 10)
            #expect(pread(fd, &buffer, 10, 0) == 10)
            #expect(String(decoding: buffer, as: UTF8.self) == "still here")
            try d.fs.release(handle: handle)
        }
    }

    /// The cache file of a file that is gone is kept, emptied, in `spare/`,
    /// and the next new file takes it: the same inode on the replica's disk,
    /// none of the old bytes.
    @Test func aRemovedFilesCacheFileIsEmptiedAndTakenByTheNextNewFile() throws {
        try withDevice { d in
            let spareDirectory = d.replica.directory.appendingPathComponent("spare").path
            func spares() -> [String] { (try? FileManager.default.contentsOfDirectory(atPath: spareDirectory)) ?? [] }
            func diskInode(_ path: String) -> UInt64? {
                var st = stat()
                return stat(path, &st) == 0 ? UInt64(st.st_ino) : nil
            }
            let first = try d.write("a", "the old content, longer than the new")
            let inode = diskInode(d.replica.cache.path(first))
            #expect(inode != nil)
            try d.engine.drain(progress: { _, _ in })
            try d.fs.unlink(parent: Namespace.rootIno, name: "a")
            d.fs.forget(ino: first, count: 1)
            #expect(spares().isEmpty)   // its removal is not in the store yet
            try d.engine.drain(progress: { _, _ in })
            #expect(diskInode(d.replica.cache.path(first)) == nil)
            #expect(spares().count == 1)
            #expect(spares().first.flatMap { diskInode(spareDirectory + "/" + $0) } == inode)
            #expect(spares().first.map { (try? FileManager.default.attributesOfItem(atPath: spareDirectory + "/" + $0))?[.size] as? Int } == 0)

            let second = try d.write("b", "new")
            #expect(diskInode(d.replica.cache.path(second)) == inode)
            #expect(spares().isEmpty)
            #expect(try d.read("b") == "new")
            let (_, opened) = try d.fs.create(parent: Namespace.rootIno, name: "c", mode: 0o644, flags: O_WRONLY, caller: .root)
            try d.fs.release(handle: opened.handle)
            #expect(try d.read("c") == "")
        }
    }

    @Test func hardLinksShareOneNode() throws {
        try withDevice { d in
            let ino = try d.write("a", "shared")
            let linked = try d.fs.link(ino: ino, newParent: Namespace.rootIno, newName: "b")
            #expect(linked.ino == ino)
            #expect(linked.attributes.nlink == 2)
            try d.fs.unlink(parent: Namespace.rootIno, name: "a")
            #expect(try d.read("b") == "shared")
            #expect(try d.fs.getattr(ino: ino).nlink == 1)
            try d.mkdir("dir")
            #expect(errno { _ = try d.fs.link(ino: try d.resolve("dir"), newParent: Namespace.rootIno, newName: "dl") } == EPERM)
        }
    }

    @Test func xattrFlagsAndReservedNames() throws {
        try withDevice { d in
            let ino = try d.write("x", "")
            try d.fs.setxattr(ino: ino, name: "user.a", value: Data([0, 255]), flags: 0)
            #expect(errno { try d.fs.setxattr(ino: ino, name: "user.a", value: Data(), flags: FileSystem.xattrCreate) } == EEXIST)
            #expect(errno { try d.fs.setxattr(ino: ino, name: "user.b", value: Data(), flags: FileSystem.xattrReplace) } == ENODATA)
            #expect(errno { try d.fs.setxattr(ino: ino, name: "user.ubiquity.status", value: Data(), flags: 0) } == EPERM)
            #expect(errno { try d.fs.setxattr(ino: ino, name: "security.selinux", value: Data(), flags: 0) } == EOPNOTSUPP)
            #expect(try d.fs.getxattr(ino: ino, name: "user.a") == Data([0, 255]))
            #expect(try d.fs.listxattr(ino: ino) == ["user.a"])
            try d.fs.removexattr(ino: ino, name: "user.a")
            #expect(errno { _ = try d.fs.getxattr(ino: ino, name: "user.a") } == ENODATA)
        }
    }

    /// A listing stops where the reply is full and goes on from there: no
    /// entry twice, none left out.
    @Test func aListingGoesOnWhereTheReplyWasFull() throws {
        try withDevice { d in
            for i in 0..<10 { try d.write("f\(i)", "") }
            let handle = try d.fs.opendir(ino: Namespace.rootIno)
            defer { d.fs.releasedir(handle: handle) }
            let first = try d.fs.page(handle: handle, offset: 0, limit: 5)
            #expect(first.map(\.name.description) == [".", "..", "f0", "f1", "f2"])
            let rest = try d.fs.page(handle: handle, offset: first.last!.nextOffset, limit: .max)
            #expect(rest.map(\.name.description) == (3..<10).map { "f\($0)" })
        }
    }

    @Test func readdirOffsetsSurviveConcurrentChanges() throws {
        try withDevice { d in
            for i in 0..<50 { try d.write("f\(i)", "") }
            let handle = try d.fs.opendir(ino: Namespace.rootIno)
            defer { d.fs.releasedir(handle: handle) }
            var seen: [String] = []
            var offset: Int64 = 0
            var round = 0
            while true {
                let page = try d.fs.page(handle: handle, offset: offset, limit: 7)
                if page.isEmpty { break }
                seen += page.map(\.name.description)
                offset = page.last!.nextOffset
                // Churn between pages: remove an entry not yet listed, add new ones.
                try? d.fs.unlink(parent: Namespace.rootIno, name: FileName("f\(49 - round)"))
                try d.write("new\(round)", "")
                round += 1
            }
            let names = seen.filter { $0 != "." && $0 != ".." }
            #expect(Set(names).count == names.count, "no entry listed twice")
            let stable = (0..<50).map { "f\($0)" }.filter { name in
                try! d.list("").contains(name)
            }
            #expect(stable.allSatisfy { names.contains($0) }, "every entry present throughout was listed")
        }
    }

    @Test func nameLimits() throws {
        try withDevice { d in
            let long = String(repeating: "a", count: 255)
            try d.write(long, "ok")
            #expect(errno { try d.write(String(repeating: "b", count: 256), "") } == ENAMETOOLONG)
        }
    }

    @Test func setgidDirectoryGivesItsGroup() throws {
        try withDevice { d in
            let dir = try d.fs.mkdir(parent: Namespace.rootIno, name: "shared", mode: 0o2775, caller: .root)
            _ = try d.fs.setattr(ino: dir.ino, changes: AttributeChanges(mode: 0o2775, gid: 500), handle: nil)
            let user = Caller(uid: 1000, gid: 1000, pid: 1)
            let file = try d.fs.mknod(parent: dir.ino, name: "f", mode: UInt32(S_IFREG) | 0o644, rdev: 0, caller: user)
            let sub = try d.fs.mkdir(parent: dir.ino, name: "sub", mode: 0o755, caller: user)
            #expect(file.attributes.uid == 1000 && file.attributes.gid == 500)
            #expect(sub.attributes.gid == 500 && sub.attributes.mode & UInt32(S_ISGID) != 0)
        }
    }
}

/// The kernel's passthrough rules, kept by `FileSystem.chooseKernelIO`
/// (the same on a real mount: Tests/mount/test_passthrough.py).
@Suite struct PassthroughModeTests {
    /// Records registrations as the kernel would hand out ids.
    final class Registry: BackingFiles, @unchecked Sendable {
        let lock = NSLock()
        var next: Int32 = 1
        var live: Set<Int32> = []
        var registered = 0

        func register(fd: Int32) throws -> Int32 {
            lock.lock(); defer { lock.unlock() }
            let id = next
            next += 1
            live.insert(id)
            registered += 1
            return id
        }

        func unregister(_ id: Int32) {
            lock.lock(); defer { lock.unlock() }
            #expect(live.remove(id) != nil, "unregistered \(id) twice or never registered")
        }
    }

    func filledFile(_ d: TestDevice, _ name: String, size: Int) throws -> UInt64 {
        let ino = try d.write(name, "")
        let handle = try d.fs.open(ino: ino, flags: O_WRONLY).handle
        let bytes = [UInt8](repeating: 7, count: size)
        _ = try bytes.withUnsafeBytes { try d.fs.write(handle: handle, offset: 0, bytes: $0.baseAddress!, count: size) }
        try d.fs.release(handle: handle)
        return ino
    }

    @Test func readersShareOneBackingAndWritersComeToTheDaemon() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        let registry = Registry()
        let big = try filledFile(d, "big", size: 2 << 20)

        let first = try d.fs.open(ino: big, flags: O_RDONLY, backing: registry)
        guard case .passthrough(let id) = first.kernelIO else { Issue.record("first reader: \(first.kernelIO)"); return }
        #expect(!first.keepCache, "the kernel refuses keep_cache with passthrough")
        let second = try d.fs.open(ino: big, flags: O_RDONLY, backing: registry)
        #expect(second.kernelIO == .passthrough(backing: id))
        let writer = try d.fs.open(ino: big, flags: O_RDWR, backing: registry)
        #expect(writer.kernelIO == .direct(backing: id))
        #expect(registry.registered == 1)

        try d.fs.release(handle: first.handle)
        try d.fs.release(handle: writer.handle)
        #expect(registry.live == [id], "still used by the second reader")
        try d.fs.release(handle: second.handle)
        #expect(registry.live.isEmpty)

        // The writer bypassed the mounted file's page cache: the next cached open must not keep it.
        let cached = try d.fs.open(ino: big, flags: O_RDONLY)
        #expect(cached.kernelIO == .cached && !cached.keepCache)
        try d.fs.release(handle: cached.handle)
    }

    @Test func smallFilesAndInodesInCachedModeStayCached() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        let registry = Registry()
        let small = try filledFile(d, "small", size: 64 << 10)
        let reader = try d.fs.open(ino: small, flags: O_RDONLY, backing: registry)
        #expect(reader.kernelIO == .cached)
        try d.fs.release(handle: reader.handle)

        // A writer open in cached mode: a reader may not pass through beside it.
        let big = try filledFile(d, "big", size: 2 << 20)
        let writer = try d.fs.open(ino: big, flags: O_RDWR, backing: registry)
        #expect(writer.kernelIO == .cached)
        let beside = try d.fs.open(ino: big, flags: O_RDONLY, backing: registry)
        #expect(beside.kernelIO == .cached)
        try d.fs.release(handle: beside.handle)
        try d.fs.release(handle: writer.handle)
        #expect(registry.registered == 0)

        // With every open gone, the next reader passes through.
        let later = try d.fs.open(ino: big, flags: O_RDONLY, backing: registry)
        guard case .passthrough = later.kernelIO else { Issue.record("later reader: \(later.kernelIO)"); return }
        try d.fs.release(handle: later.handle)
        #expect(registry.live.isEmpty)
    }
}
