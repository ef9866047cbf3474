import Foundation
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityModel
import UbiquityTesting
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// The drive's routing without a kernel: folder names, inode and handle
/// numbers per container, the root listing across pages, the refusals.
@Suite struct DriveTests {
    /// A home device and two app containers, one named like an item of the home.
    func makeDrive() throws -> (DriveFileSystem, TestDevice, TestDevice, TestDevice) {
        let home = try TestDevice(store: InMemoryStore(), name: "home")
        let notes = try TestDevice(store: InMemoryStore(), name: "notes")
        let other = try TestDevice(store: InMemoryStore(), name: "other")
        for i in 0..<7 { try home.write("file\(i).txt", "h\(i)") }
        try home.mkdir("Photos")
        let slots = ["com.a.notes": 7, "com.b.notes": 3, "com.c.photos": 3]   // a clash: the last gets a free slot
        let drive = DriveFileSystem(home: home.fs, slotFor: { slots[$0] ?? 0 })
        let views = ["com.a.notes": notes.fs, "com.b.notes": other.fs, "com.c.photos": other.fs]
        let changed = drive.update(folders: [("com.b.notes", "Notes"), ("com.a.notes", "Notes"), ("com.c.photos", "Photos")],
                                   fileSystem: { views[$0] })
        #expect(Set(changed) == ["Notes", "Notes (com.b.notes)", "Photos (com.c.photos)"])
        return (drive, home, notes, other)
    }

    @Test func foldersAreNamedByDisplayNameAndClashesTakeTheID() throws {
        let (drive, home, notes, other) = try makeDrive()
        defer { [home, notes, other].forEach { $0.cleanUp() } }
        #expect(drive.currentFolders().map(\.name) == ["Notes", "Notes (com.b.notes)", "Photos (com.c.photos)"])
        // The user's own "Photos" keeps its name and its inode from the home container.
        let photos = try drive.lookup(parent: 1, name: "Photos")
        #expect(photos.ino == (try home.resolve("Photos")))
        // A folder is its container's root, numbered in its own slot.
        let folder = try drive.lookup(parent: 1, name: "Notes")
        #expect(folder.ino >> 48 == 7 && folder.ino & 0xffff_ffff_ffff == 1)
        #expect(Set([3, 7, 8]) == Set(drive.currentFolders().map(\.slot)))
        try notes.write("inside.md", "n")
        let inside = try drive.lookup(parent: folder.ino, name: "inside.md")
        #expect(inside.ino >> 48 == folder.ino >> 48)
        let opened = try drive.open(ino: inside.ino, flags: O_RDONLY)
        #expect(opened.handle >> 48 == folder.ino >> 48)
        guard case .fileRange(let fd, _, _, _) = try drive.read(handle: opened.handle, offset: 0, size: 10) else {
            Issue.record("expected a file range")
            return
        }
        var byte: UInt8 = 0
        #expect(pread(fd, &byte, 1, 0) == 1 && byte == UInt8(ascii: "n"))
        try drive.release(handle: opened.handle)
        // Hidden folders keep their numbers valid for the kernel but leave the root.
        let gone = drive.update(folders: [("com.a.notes", "Notes")], fileSystem: { _ in nil })
        #expect(Set(gone) == ["Notes (com.b.notes)", "Photos (com.c.photos)"])
        #expect(throws: UbiquityError.self) { try drive.lookup(parent: 1, name: "Photos (com.c.photos)") }
        #expect(try drive.getattr(ino: inside.ino).size == 1)
    }

    @Test func theRootListsHomeEntriesThenFoldersAcrossPages() throws {
        let (drive, home, notes, other) = try makeDrive()
        defer { [home, notes, other].forEach { $0.cleanUp() } }
        let handle = try drive.opendir(ino: 1)
        var names: [String] = []
        var offset: Int64 = 0
        while true {
            let page = try drive.page(handle: handle, offset: offset, limit: 3)
            if page.isEmpty { break }
            names += page.map(\.name.description)
            offset = page.last!.nextOffset
        }
        drive.releasedir(handle: handle)
        #expect(names == [".", ".."] + (0..<7).map { "file\($0).txt" } + ["Photos", "Notes", "Notes (com.b.notes)", "Photos (com.c.photos)"])
        #expect(try drive.getattr(ino: 1).nlink == (try home.fs.getattr(ino: 1).nlink) + 3)
    }

    @Test func containerFoldersBehaveLikeMountPoints() throws {
        let (drive, home, notes, other) = try makeDrive()
        defer { [home, notes, other].forEach { $0.cleanUp() } }
        let folder = try drive.lookup(parent: 1, name: "Notes").ino
        func errno(_ body: () throws -> Void) -> Int32? {
            do { try body() } catch let error as UbiquityError { return error.errno } catch { return nil }
            return nil
        }
        #expect(errno { try drive.rmdir(parent: 1, name: "Notes") } == EBUSY)
        #expect(errno { try drive.rename(parent: 1, name: "Notes", newParent: 1, newName: "X", flags: []) } == EBUSY)
        #expect(errno { _ = try drive.mkdir(parent: 1, name: "Notes", mode: 0o755, caller: .root) } == EEXIST)
        #expect(errno { try drive.rename(parent: 1, name: "file0.txt", newParent: folder, newName: "f", flags: []) } == EXDEV)
        let file = try drive.lookup(parent: 1, name: "file1.txt").ino
        #expect(errno { _ = try drive.link(ino: file, newParent: folder, newName: "f") } == EXDEV)
        // Within one container everything works as usual.
        _ = try drive.mkdir(parent: folder, name: "sub", mode: 0o755, caller: .root)
        #expect(try notes.list("") == ["sub"])
    }

    /// Two devices that each make a container's Documents folder before they
    /// sync end with one folder holding both devices' files.
    @Test func documentsMadeOnTwoDevicesIsOneFolder() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        let owner = Caller(uid: 0, gid: 0, pid: 0)
        _ = try a.fs.wellKnownDirectory("Documents", id: "documents", owner: owner)
        _ = try b.fs.wellKnownDirectory("Documents", id: "documents", owner: owner)
        try a.write("Documents/from-a.txt", "a")
        try b.write("Documents/from-b.txt", "b")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.pull()
        try b.engine.drain(progress: { _, _ in })
        try a.engine.pull()
        #expect(try a.list("") == ["Documents"])
        #expect(try a.list("Documents") == ["from-a.txt", "from-b.txt"])
        #expect(try b.tree() == a.tree())
    }
}

/// Content types from shared-mime-info's globs, matched case-insensitively.
@Suite struct ContentTypeTests {
    @Test func namesSuffixesAndPatterns() {
        let types = ContentTypes.shared
        #expect(types.type(ofFileNamed: "notes.MD") == "text/markdown")
        #expect(types.type(ofFileNamed: "backup.tar.gz") == "application/x-compressed-tar")
        #expect(types.type(ofFileNamed: "Makefile") == "text/x-makefile")
        #expect(types.type(ofFileNamed: "README") == "text/x-readme")
        #expect(types.type(ofFileNamed: "libz.so.1") == "application/x-sharedlib")
        #expect(types.type(ofFileNamed: "f000123") == "application/octet-stream")
    }
}
