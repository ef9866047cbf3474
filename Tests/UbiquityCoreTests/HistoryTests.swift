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

/// Version history and Recently Deleted, on two devices and a third that
/// joins later (its history read back from the store).
@Suite struct HistoryTests {
    let store = InMemoryStore()

    func sync(_ devices: TestDevice...) throws {
        for _ in 0..<3 {
            for d in devices { try d.engine.drain(progress: { _, _ in }) }
            for d in devices { try d.engine.pull() }
        }
    }

    func push(_ d: TestDevice) throws { try d.engine.drain(progress: { _, _ in }) }

    @Test func everyPushedVersionIsListedAndRestores() throws {
        let a = try TestDevice(store: store, name: "laptop"), b = try TestDevice(store: store, name: "desktop")
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("notes.txt", "one")
        try push(a)
        try a.write("notes.txt", "two, longer")
        try push(a)
        try sync(a, b)
        try b.write("notes.txt", "three from b")
        try sync(b, a)
        // Renamed: the versions go with the file.
        try a.fs.rename(parent: Namespace.rootIno, name: "notes.txt", newParent: Namespace.rootIno, newName: "renamed.txt", flags: [])
        try sync(a, b)

        let versions = try a.engine.history(ino: try a.resolve("renamed.txt"))
        #expect(versions.map(\.size) == [3, 11, 12])
        #expect(versions.map(\.device) == ["laptop", "laptop", "desktop"])
        #expect(versions.map(\.isCurrent) == [false, false, true])

        // Restored as the current version, on every device; the replaced one stays listed.
        try a.engine.restoreVersion(ino: try a.resolve("renamed.txt"), id: versions[0].id)
        try sync(a, b)
        #expect(try b.read("renamed.txt") == "one")
        #expect(try a.read("renamed.txt") == "one")
        let after = try b.engine.history(ino: try b.resolve("renamed.txt"))
        #expect(after.map(\.size) == [3, 11, 12, 3])
        #expect(after.last?.isCurrent == true)

        // Beside it, as a new file.
        try b.engine.restoreVersion(ino: try b.resolve("renamed.txt"), id: versions[1].id,
                                    to: (Namespace.rootIno, FileName("old.txt")))
        try sync(b, a)
        #expect(try a.read("old.txt") == "two, longer")
        #expect(try a.read("renamed.txt") == "one")
        #expect(throws: UbiquityError.self) {
            try b.engine.restoreVersion(ino: try b.resolve("renamed.txt"), id: 999_999)
        }
    }

    /// Saved the way editors save (a new file renamed over the old one):
    /// the versions go on across saves, and the replaced files are not
    /// deleted items.
    @Test func atomicSavesKeepOneHistory() throws {
        let a = try TestDevice(store: store, name: "laptop")
        defer { a.cleanUp() }
        for text in ["one", "two!", "three"] {
            try a.write(".doc.txt.tmp", text)
            try a.fs.rename(parent: Namespace.rootIno, name: ".doc.txt.tmp", newParent: Namespace.rootIno, newName: "doc.txt", flags: [])
            try push(a)
        }
        let versions = try a.engine.history(ino: try a.resolve("doc.txt"))
        #expect(versions.map(\.size) == [3, 4, 5])
        #expect(a.engine.trash().isEmpty)
        try a.engine.restoreVersion(ino: try a.resolve("doc.txt"), id: versions[0].id)
        #expect(try a.read("doc.txt") == "one")
    }

    @Test func aDeviceThatJoinsLaterReadsTheHistoryFromTheStore() throws {
        let a = try TestDevice(store: store, name: "laptop")
        defer { a.cleanUp() }
        for text in ["v1", "v2 v2", "v3 v3 v3"] {
            try a.write("f.txt", text)
            try push(a)
        }
        let c = try TestDevice(store: store, name: "tablet")
        defer { c.cleanUp() }
        try c.engine.pull()
        try c.engine.catchUpHistory()
        #expect(try c.engine.history(ino: try c.resolve("f.txt")).map(\.size) == [2, 5, 8])
    }

    @Test func aDeletedFolderIsListedAndComesBackWithWhatItHeld() throws {
        let a = try TestDevice(store: store, name: "laptop"), b = try TestDevice(store: store, name: "desktop")
        defer { a.cleanUp(); b.cleanUp() }
        try a.mkdir("Projects")
        try a.mkdir("Projects/site")
        try a.write("Projects/site/index.html", "<html>")
        try a.write("Projects/plan.txt", "plan")
        try a.write("loose.txt", "loose")
        try sync(a, b)
        // b deletes the folder the way `rm -r` does, and a file on its own.
        let site = try b.resolve("Projects/site"), projects = try b.resolve("Projects")
        try b.fs.unlink(parent: site, name: "index.html")
        try b.fs.rmdir(parent: projects, name: "site")
        try b.fs.unlink(parent: projects, name: "plan.txt")
        try b.fs.rmdir(parent: Namespace.rootIno, name: "Projects")
        try b.fs.unlink(parent: Namespace.rootIno, name: "loose.txt")
        try sync(b, a)
        #expect(try a.list("") == [])

        let listed = a.engine.trash()
        #expect(Set(listed.map(\.path)) == ["Projects", "loose.txt"])
        let folder = try #require(listed.first { $0.path == "Projects" })
        #expect(folder.items == 3 && folder.size == 10 && folder.device == "desktop" && folder.kind == .directory)

        // Something took the name meanwhile: it comes back beside it.
        try a.write("loose.txt", "new one")
        try a.engine.restoreDeleted("loose.txt")
        #expect(try a.engine.restoreDeleted("Projects") == "Projects")
        try sync(a, b)
        for d in [a, b] {
            #expect(try d.read("Projects/site/index.html") == "<html>")
            #expect(try d.read("Projects/plan.txt") == "plan")
            #expect(try d.read("loose (restored).txt") == "loose")
            #expect(try d.read("loose.txt") == "new one")
            #expect(d.engine.trash().isEmpty)
        }
        #expect(try a.tree() == b.tree())
        #expect(throws: UbiquityError.self) { try a.engine.restoreDeleted("Projects") }

        // Deleted again, then emptied for good: gone from every device's trash.
        try b.fs.unlink(parent: Namespace.rootIno, name: "loose (restored).txt")
        try sync(b, a)
        #expect(a.engine.trash().map(\.path) == ["loose (restored).txt"])
        try a.engine.emptyTrash()
        #expect(a.engine.trash().isEmpty && b.engine.trash().isEmpty)
    }

    /// A file restored alone brings its folder back, without the rest.
    @Test func aFileWhoseFolderWasDeletedBringsTheFolderBack() throws {
        let a = try TestDevice(store: store, name: "laptop")
        defer { a.cleanUp() }
        try a.mkdir("d")
        try a.write("d/keep.txt", "keep")
        try a.write("d/gone.txt", "gone")
        try push(a)
        try a.fs.unlink(parent: try a.resolve("d"), name: "gone.txt")
        try push(a)
        try a.fs.unlink(parent: try a.resolve("d"), name: "keep.txt")
        try push(a)
        try a.fs.rmdir(parent: Namespace.rootIno, name: "d")
        try push(a)
        // Deleted by one device within minutes of its folder: listed in it.
        #expect(a.engine.trash().map(\.path) == ["d"])
        #expect(a.engine.trash().first?.items == 2)
        let restored = try a.engine.restoreDeleted("d/gone.txt")
        #expect(restored == "d/gone.txt")
        #expect(try a.read("d/gone.txt") == "gone")
        #expect(try a.list("d") == ["gone.txt"])
        #expect(a.engine.trash().map(\.path) == ["d/keep.txt"])
    }
}
