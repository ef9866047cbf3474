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

/// Two devices, one store: concurrent changes resolve without losing data,
/// and both devices converge to the same tree.
@Suite struct ConflictTests {
    let store = InMemoryStore()

    func pair() throws -> (TestDevice, TestDevice) {
        (try TestDevice(store: store, name: "laptop"), try TestDevice(store: store, name: "desktop"))
    }

    /// Push everything from both, then pull everything on both (twice: the
    /// second round carries what the first one's resolutions pushed).
    func sync(_ devices: TestDevice...) throws {
        for _ in 0..<3 {
            for d in devices { try d.engine.drain(progress: { _, _ in }) }
            for d in devices { try d.engine.pull() }
        }
    }

    /// `first` commits what it has, then both sync.
    func sync(first: TestDevice, then other: TestDevice) throws {
        try first.engine.drain(progress: { _, _ in })
        try sync(other, first)
    }

    func contents(_ d: TestDevice) throws -> [String] {
        try d.tree().values.filter { $0.hasPrefix("file") }.sorted()
    }

    @Test func bothEditedKeepsBothVersions() throws {
        let (a, b) = try pair()
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("notes.txt", "base")
        try sync(a, b)
        try a.write("notes.txt", "laptop edit")
        try b.write("notes.txt", "desktop edit")
        try a.engine.drain(progress: { _, _ in })   // laptop commits first: keeps the name
        try sync(b, a)
        #expect(try a.tree() == b.tree())
        #expect(try a.read("notes.txt") == "laptop edit")
        let names = try a.list("")
        #expect(names.count == 2)
        let copy = try #require(names.first { $0.hasPrefix("notes (conflicted copy desktop ") && $0.hasSuffix(").txt") })
        #expect(try a.read(copy) == "desktop edit")
        let originalIno = try a.resolve("notes.txt")
        let original = a.replica.read { ns in ns.node(originalIno)! }
        #expect(original.conflicts.count == 1)
    }

    @Test func editedHereDeletedThereKeepsTheEdit() throws {
        let (a, b) = try pair()
        defer { a.cleanUp(); b.cleanUp() }
        try a.mkdir("dir")
        try a.write("dir/f.txt", "v1")
        try sync(a, b)
        try a.fs.unlink(parent: try a.resolve("dir"), name: "f.txt")
        try a.fs.rmdir(parent: Namespace.rootIno, name: "dir")
        try b.write("dir/f.txt", "edited")
        try a.engine.drain(progress: { _, _ in })
        try sync(b, a)
        #expect(try a.tree() == b.tree())
        #expect(try a.read("dir/f.txt") == "edited")
    }

    @Test func deletedHereEditedThereBringsItBack() throws {
        let (a, b) = try pair()
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("f.txt", "v1")
        try sync(a, b)
        try b.write("f.txt", "edited")
        try b.engine.drain(progress: { _, _ in })
        try a.fs.unlink(parent: Namespace.rootIno, name: "f.txt")   // not pushed yet
        try sync(a, b)
        #expect(try a.tree() == b.tree())
        #expect(try b.read("f.txt") == "edited")
    }

    @Test func bothCreatedTheSameNameKeepsBoth() throws {
        let (a, b) = try pair()
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("todo.md", "from laptop")
        try b.write("todo.md", "from desktop")
        try a.engine.drain(progress: { _, _ in })
        try sync(b, a)
        #expect(try a.tree() == b.tree())
        #expect(try contents(a) == ["file 644 from desktop", "file 644 from laptop"])
        #expect(try a.read("todo.md") == "from laptop")
    }

    @Test func moveIntoAFolderDeletedElsewhereKeepsTheFolder() throws {
        let (a, b) = try pair()
        defer { a.cleanUp(); b.cleanUp() }
        try a.mkdir("box")
        try a.write("loose.txt", "keep me")
        try sync(a, b)
        try a.fs.rmdir(parent: Namespace.rootIno, name: "box")
        try b.fs.rename(parent: Namespace.rootIno, name: "loose.txt", newParent: try b.resolve("box"), newName: "loose.txt", flags: [])
        try a.engine.drain(progress: { _, _ in })
        try sync(b, a)
        #expect(try a.tree() == b.tree())
        #expect(try a.read("box/loose.txt") == "keep me")
    }

    /// Move beats delete: a folder moved out of a folder that the other
    /// device deletes survives whole, with what it held, at its new place —
    /// whichever device commits first.
    @Test(arguments: [true, false])
    func aSubtreeMovedOutOfAFolderDeletedElsewhereSurvivesWhole(moverCommitsFirst: Bool) throws {
        let (a, b) = try pair()
        defer { a.cleanUp(); b.cleanUp() }
        try a.mkdir("P")
        try a.mkdir("P/Q")
        try a.mkdir("P/Q/S")
        try a.write("P/Q/deep.txt", "deep")
        try a.write("P/Q/S/deeper.txt", "deeper")
        try a.write("P/other.txt", "deleted with P")
        try a.mkdir("R")
        try sync(a, b)
        // a moves P/Q to R/Q; b deletes P and everything in it.
        try a.fs.rename(parent: try a.resolve("P"), name: "Q", newParent: try a.resolve("R"), newName: "Q", flags: [])
        let s = try b.resolve("P/Q/S"), q = try b.resolve("P/Q"), p = try b.resolve("P")
        try b.fs.unlink(parent: s, name: "deeper.txt")
        try b.fs.rmdir(parent: q, name: "S")
        try b.fs.unlink(parent: q, name: "deep.txt")
        try b.fs.rmdir(parent: p, name: "Q")
        try b.fs.unlink(parent: p, name: "other.txt")
        try b.fs.rmdir(parent: Namespace.rootIno, name: "P")
        try sync(first: moverCommitsFirst ? a : b, then: moverCommitsFirst ? b : a)
        #expect(try a.tree() == b.tree())
        #expect(try b.read("R/Q/deep.txt") == "deep")
        #expect(try b.read("R/Q/S/deeper.txt") == "deeper")
        #expect(try b.list("").sorted() == ["R"])
    }

    /// A file renamed on one device and deleted on the other stays, under
    /// its new name, whichever commits first.
    @Test(arguments: [true, false])
    func aFileRenamedHereDeletedThereStays(moverCommitsFirst: Bool) throws {
        let (a, b) = try pair()
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("draft.txt", "keep")
        try sync(a, b)
        try a.fs.rename(parent: Namespace.rootIno, name: "draft.txt", newParent: Namespace.rootIno, newName: "final.txt", flags: [])
        try b.fs.unlink(parent: Namespace.rootIno, name: "draft.txt")
        try sync(first: moverCommitsFirst ? a : b, then: moverCommitsFirst ? b : a)
        #expect(try a.tree() == b.tree())
        #expect(try b.list("") == ["final.txt"])
        #expect(try b.read("final.txt") == "keep")
    }

    /// A commit whose reply was lost (it is in the store, the device does
    /// not know): the device reads its own record back as its own work —
    /// the file it wrote and then deleted stays deleted, and a file it
    /// wrote keeps its content without a conflicted copy of itself.
    @Test func aCommitWhoseReplyWasLostIsReadBackAsOwnWork() throws {
        let faulty = FaultyStore(store)
        let a = try TestDevice(store: faulty, name: "laptop"), b = try TestDevice(store: store, name: "desktop")
        defer { a.cleanUp(); b.cleanUp() }
        try a.write("gone.txt", "v1")
        try a.write("kept.txt", "v1")
        try a.engine.drain(progress: { _, _ in })
        try a.write("gone.txt", "v2, then deleted")
        try a.fs.unlink(parent: Namespace.rootIno, name: "gone.txt")
        try a.write("kept.txt", "v2")
        faulty.loseCommitReplies.withLock { $0 = true }
        #expect(throws: UbiquityError.self) { try a.engine.drain(progress: { _, _ in }) }
        faulty.loseCommitReplies.withLock { $0 = false }
        try sync(a, b)
        #expect(try a.tree() == b.tree())
        #expect(try a.list("") == ["kept.txt"])
        #expect(try b.read("kept.txt") == "v2")
    }

    /// The other device committed a file into a folder first; the folder
    /// removed here (not pushed yet) survives with it, on both devices and
    /// for a third device that had the folder too.
    @Test func folderRemovedHereWhileAFileArrivesInItSurvives() throws {
        let (a, b) = try pair()
        let c = try TestDevice(store: store, name: "tablet")
        defer { a.cleanUp(); b.cleanUp(); c.cleanUp() }
        try a.mkdir("d")
        try sync(a, b, c)
        try b.write("d/new.txt", "arrived")
        try b.engine.drain(progress: { _, _ in })
        // Here: a file made and moved out of the folder, then the folder removed.
        try a.write("d/tmp.txt", "moved out")
        try a.fs.rename(parent: try a.resolve("d"), name: "tmp.txt", newParent: Namespace.rootIno, newName: "out.txt", flags: [])
        try a.fs.rmdir(parent: Namespace.rootIno, name: "d")
        try c.fs.rmdir(parent: Namespace.rootIno, name: "d")
        try sync(a, c, b)
        #expect(try a.tree() == b.tree())
        #expect(try c.tree() == b.tree())
        #expect(try a.read("d/new.txt") == "arrived")
        #expect(try c.read("d/new.txt") == "arrived")
        #expect(try b.read("out.txt") == "moved out")
        // The folder was never deleted in the store (not deleted and made again).
        let folderIno = try b.resolve("d")
        let folderID = try #require(b.replica.read { ns in ns.node(folderIno)?.id })
        for record in try store.journal(container: TestDevice.container, after: 0, limit: 1000) {
            guard case .changeSet(let set) = record.content else {
                Issue.record("record \(record.seq) is invalid")
                continue
            }
            for change in set.changes {
                if case .deleteNode(let id, _) = change { #expect(id != folderID, "change set \(record.seq) deletes the folder") }
            }
        }
    }

    /// One device moves a file into a new folder and puts a new file at its
    /// old name; the other edits the file where it was. The edited file
    /// follows the move (one name, never a link nobody made), the new file
    /// keeps the old name.
    @Test func fileMovedIntoANewFolderWhileEditedThereHasOneName() throws {
        let (a, b) = try pair()
        defer { a.cleanUp(); b.cleanUp() }
        try a.mkdir("d4")
        try a.write("d4/f3", "v1")
        try sync(a, b)
        try a.mkdir("d3")
        try a.fs.rename(parent: try a.resolve("d4"), name: "f3", newParent: try a.resolve("d3"), newName: "f3", flags: [])
        try a.write("d4/f3", "new file")
        try b.write("d4/f3", "edited")
        try a.engine.drain(progress: { _, _ in })
        try sync(b, a)
        #expect(try a.tree() == b.tree())
        for (label, d) in [("a", a), ("b", b)] {
            #expect(try d.read("d4/f3") == "new file")
            let moved = try d.resolve("d3/f3")
            let node = try #require(d.replica.read { ns in ns.node(moved) })
            #expect(node.nlink == 1, "d3/f3 has \(node.nlink) links on \(label)")
            let paths = try d.list("d3").map { "d3/" + $0 } + d.list("d4").map { "d4/" + $0 }
            let edited = try paths.filter { try d.read($0) == "edited" }
            #expect(edited.count == 1, "the edit is under one name on \(label): \(paths)")
        }
    }

    @Test func crossedMovesNeverMakeACycle() throws {
        let (a, b) = try pair()
        defer { a.cleanUp(); b.cleanUp() }
        try a.mkdir("x")
        try a.mkdir("y")
        try a.write("x/in-x", "1")
        try a.write("y/in-y", "2")
        try sync(a, b)
        try a.fs.rename(parent: Namespace.rootIno, name: "x", newParent: try a.resolve("y"), newName: "x", flags: [])
        try b.fs.rename(parent: Namespace.rootIno, name: "y", newParent: try b.resolve("x"), newName: "y", flags: [])
        try a.engine.drain(progress: { _, _ in })
        try sync(b, a)
        #expect(try a.tree() == b.tree())
        #expect(try contents(a) == ["file 644 1", "file 644 2"])
    }
}

/// Random operations on two devices with random sync points: the devices
/// converge, and every content acknowledged on either device is present
/// somewhere in the final tree (a conflict never loses data).
@Suite struct TwoDeviceModelTests {
    struct Random {
        var state: UInt64
        mutating func next(_ bound: Int) -> Int {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            return Int((state >> 33) % UInt64(bound))
        }
    }

    @Test(arguments: Array(UInt64(1)...120))
    func randomOperationsConverge(seed: UInt64) throws {
        // UBQ_MODEL_SEED=N runs one seed alone (to trace it with UBQ_TRACE_APPLY=1).
        if let only = ProcessInfo.processInfo.environment["UBQ_MODEL_SEED"], UInt64(only) != seed { return }
        let store = InMemoryStore()
        let devices = [try TestDevice(store: store, name: "one"), try TestDevice(store: store, name: "two")]
        defer { devices.forEach { $0.cleanUp() } }
        var rng = Random(state: seed)
        var written = Set<String>()       // every content written and acknowledged (closed)
        var deletedContent = Set<String>() // contents a device deleted or overwrote on purpose
        let names = ["a", "b", "c", "d/e", "d/f", "g/h"]
        // Ten runs of 1,000 operations, the rest of 300.
        for step in 0..<(seed <= 10 ? 1000 : 300) {
            let d = devices[rng.next(2)]
            let path = names[rng.next(names.count)]
            let op = rng.next(10)
            if ProcessInfo.processInfo.environment["UBQ_TRACE_APPLY"] != nil {
                print("OP step \(step) device \(d === devices[0] ? "one" : "two") op \(op) path \(path)")
            }
            switch op {
            case 0...4:
                let dir = path.contains("/") ? String(path.split(separator: "/")[0]) : nil
                if let dir, (try? d.resolve(dir)) == nil { try? d.mkdir(dir) }
                let text = "\(d === devices[0] ? "one" : "two")-\(step)"
                let replaced = try? d.read(path)   // overwritten on purpose, if the write succeeds
                if (try? d.write(path, text)) != nil {
                    written.insert(text)
                    if let replaced { deletedContent.insert(replaced) }
                }
            case 5:
                if let (parent, name) = try? d.split(path), let old = try? d.read(path) {
                    if (try? d.fs.unlink(parent: parent, name: name)) != nil { deletedContent.insert(old) }
                }
            case 6:
                let target = names[rng.next(names.count)]
                if let (p1, n1) = try? d.split(path), let (p2, n2) = try? d.split(target),
                   let victim = try? d.read(target), (try? d.resolve(path)) != nil, path != target {
                    if (try? d.fs.rename(parent: p1, name: n1, newParent: p2, newName: n2, flags: [])) != nil {
                        deletedContent.insert(victim)   // a rename over a file replaces it on purpose
                    }
                } else if let (p1, n1) = try? d.split(path), let (p2, n2) = try? d.split(target) {
                    _ = try? d.fs.rename(parent: p1, name: n1, newParent: p2, newName: n2, flags: [])
                }
            case 7:
                try d.engine.drain(progress: { _, _ in })
            default:
                try d.engine.pull()
            }
        }
        for _ in 0..<4 {
            for d in devices { try d.engine.drain(progress: { _, _ in }) }
            for d in devices { try d.engine.pull() }
        }
        let trees = try devices.map { try $0.tree() }
        let differing = Set(trees[0].keys).union(trees[1].keys).filter { trees[0][$0] != trees[1][$0] }
            .map { "\($0): \(trees[0][$0] ?? "-") | \(trees[1][$0] ?? "-")" }.sorted()
        let pending = devices.map { d in
            d.replica.read { ns in
                ns.unpushedNodes().map { "\(ns.path(of: $0.ino) ?? "?") meta=\($0.hasUnpushedMetadata) content=\($0.hasUnpushedContent) local=\($0.hasContent) writers=\($0.openWriters) unlinked=\($0.unlinked) v=\($0.version)" }
                    + ns.pendingEntries.keys.map { "entry \(ns.path(of: $0.parent) ?? "?")/\($0.name)" }
            }
        }
        var detail: [String] = []
        for key in Set(trees[0].keys).union(trees[1].keys) where trees[0][key] != trees[1][key] {
            for (i, d) in devices.enumerated() {
                if let ino = try? d.resolve(key) {
                    let n = d.replica.read { ns in ns.node(ino)! }
                    let elsewhere = devices[1 - i].replica.read { ns in ns.inoByID[n.id].map { ns.path(of: $0) ?? "unlinked" } ?? "unknown" }
                    detail.append("device \(i): \(key) -> \(n.id.prefix(8)) v\(n.version) (on other: \(elsewhere))")
                }
            }
        }
        #expect(differing.isEmpty, "devices converge; differing: \(differing); pending: \(pending); \(detail)")
        let present = Set(trees[0].values.compactMap { $0.hasPrefix("file") ? String($0.split(separator: " ", maxSplits: 2)[2]) : nil })
        let lost = written.subtracting(present).subtracting(deletedContent)
        #expect(lost.isEmpty, "lost: \(lost.sorted())")
        for d in devices { #expect(d.engine.quarantinedRecords.isEmpty, "every record devices write applies") }
    }
}
