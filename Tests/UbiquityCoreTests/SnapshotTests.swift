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

/// A new device starts from a snapshot instead of replaying the journal,
/// and ends with exactly the tree of the devices that replayed it.
@Suite struct SnapshotTests {
    /// A history of `rounds` commits by `a` (and a conflict with `c`):
    /// folders, renames, moves, deletions, links, symlinks, xattrs, modes.
    static func makeHistory(_ a: TestDevice, _ c: TestDevice, rounds: Int) throws {
        try a.mkdir("docs")
        try a.mkdir("docs/deep")
        try a.engine.drain(progress: { _, _ in })
        for round in 0..<rounds {
            try a.write("docs/r\(round % 7).txt", "round \(round)")
            switch round % 6 {
            case 0: try a.mkdir("docs/deep/d\(round)")
            case 1: try a.fs.rename(parent: try a.resolve("docs"), name: FileName("r\(round % 7).txt"),
                                    newParent: try a.resolve("docs/deep"), newName: FileName("moved\(round)"), flags: [])
            case 2: _ = try a.fs.symlink(target: "../r\(round).txt", parent: try a.resolve("docs/deep"), name: FileName("s\(round)"), caller: .root)
            case 3: try a.fs.setxattr(ino: try a.resolve("docs/r\(round % 7).txt"), name: "user.round", value: Data("\(round)".utf8), flags: 0)
            case 4: _ = try a.fs.link(ino: try a.resolve("docs/r\(round % 7).txt"), newParent: try a.resolve("docs/deep"), newName: FileName("h\(round)"))
            default: try a.fs.unlink(parent: try a.resolve("docs"), name: FileName("r\(round % 7).txt"))
            }
            try a.engine.drain(progress: { _, _ in })
        }
        // A conflict: both edit one file; the copy is kept and recorded.
        try c.engine.pull()
        try a.write("docs/both.txt", "base")
        try a.engine.drain(progress: { _, _ in })
        try c.engine.pull()
        try a.write("docs/both.txt", "from a")
        try c.write("docs/both.txt", "from c")
        try a.engine.drain(progress: { _, _ in })
        try c.engine.drain(progress: { _, _ in })
        try a.engine.pull()
        _ = try a.fs.setattr(ino: try a.resolve("docs"), changes: AttributeChanges(mode: 0o750), handle: nil)
        try a.engine.drain(progress: { _, _ in })
    }

    /// Replace records 1…`upTo` with bytes nobody can read: only a device
    /// that starts from a snapshot of `upTo` or later still gets it right.
    static func damageJournal(_ store: InMemoryStore, upTo: UInt64) {
        for seq in 1...upTo {
            store.overwriteRecord(container: TestDevice.container, seq: seq, data: Data("lost".utf8))
        }
    }

    static func nlinks(_ d: TestDevice) throws -> [String: UInt32] {
        var out: [String: UInt32] = [:]
        for path in try d.tree().keys { out[path] = try d.fs.getattr(ino: try d.resolve(path)).nlink }
        return out
    }

    @Test func aNewDeviceStartsFromTheSnapshotAndMatches() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a", snapshotInterval: 10)
        let c = try TestDevice(store: store, name: "c", snapshotInterval: 0)
        defer { a.cleanUp(); c.cleanUp() }
        try Self.makeHistory(a, c, rounds: 30)
        try c.engine.pull()
        #expect(try c.tree() == a.tree(), "the two writers agree before anything else is checked")

        a.engine.writeSnapshotIfDue()
        let snapshots = try store.snapshots(container: TestDevice.container)
        let head = store.journalHead(container: TestDevice.container)
        #expect(snapshots == [head], "a device holding the store's state wrote one at the head")
        // Every record up to the snapshot is gone: replaying could not rebuild this tree.
        Self.damageJournal(store, upTo: head)

        let b = try TestDevice(store: store, name: "b", snapshotInterval: 10)
        defer { b.cleanUp() }
        try b.engine.pull()
        #expect(b.engine.quarantinedRecords.isEmpty, "no record before the snapshot was read")
        #expect(try b.tree() == a.tree())
        #expect(try Self.nlinks(b) == Self.nlinks(a))
        let xattrFile = try a.tree().keys.sorted().first { path in
            (try? a.fs.getxattr(ino: try a.resolve(path), name: "user.round")) != nil
        }
        if let xattrFile {
            #expect(try b.fs.getxattr(ino: try b.resolve(xattrFile), name: "user.round") ==
                    a.fs.getxattr(ino: try a.resolve(xattrFile), name: "user.round"))
        } else {
            Issue.record("the history left no file with an xattr")
        }
        // The conflict survives, with who made each version.
        let versions = try b.engine.versions(ino: try b.resolve("docs/both.txt"))
        #expect(versions.count == 2)
        #expect(Set(versions.map(\.device)) == ["a", "c"])
        #expect(versions.map(\.device) == (try a.engine.versions(ino: try a.resolve("docs/both.txt"))).map(\.device))

        // Sync goes on both ways from there.
        try b.write("docs/from-b.txt", "hello from b")
        try b.engine.drain(progress: { _, _ in })
        try a.write("docs/deep/from-a.txt", "hello from a")
        try a.engine.drain(progress: { _, _ in })
        try a.engine.pull()
        try b.engine.pull()
        #expect(try a.read("docs/from-b.txt") == "hello from b")
        #expect(try b.read("docs/deep/from-a.txt") == "hello from a")
        #expect(try b.tree() == a.tree())
    }

    @Test func aDamagedSnapshotFallsBackToAnOlderOneOrTheJournal() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a", snapshotInterval: 5)
        let c = try TestDevice(store: store, name: "c", snapshotInterval: 0)
        defer { a.cleanUp(); c.cleanUp() }
        try Self.makeHistory(a, c, rounds: 12)
        try #require(try a.engine.writeSnapshot() != nil)
        let older = store.journalHead(container: TestDevice.container)
        for round in 0..<8 {
            try a.write("later\(round).txt", "later \(round)")
            try a.engine.drain(progress: { _, _ in })
        }
        try #require(try a.engine.writeSnapshot() != nil)
        let newer = store.journalHead(container: TestDevice.container)
        #expect(try store.snapshots(container: TestDevice.container) == [older, newer])
        // The newest snapshot's last part is damaged in the store.
        let record = try #require(try store.snapshot(container: TestDevice.container, seq: newer))
        store.corruptBlob(record.parts.last!, with: Data("damaged".utf8))

        // Records up to the older snapshot are gone: only it can rebuild the start.
        Self.damageJournal(store, upTo: older)
        let b = try TestDevice(store: store, name: "b")
        defer { b.cleanUp() }
        try b.engine.pull()
        #expect(b.engine.quarantinedRecords.isEmpty)
        #expect(try b.tree() == a.tree())

        // With no usable snapshot at all, the (intact) journal is replayed.
        let store2 = InMemoryStore()
        let a2 = try TestDevice(store: store2, name: "a")
        let c2 = try TestDevice(store: store2, name: "c", snapshotInterval: 0)
        defer { a2.cleanUp(); c2.cleanUp() }
        try Self.makeHistory(a2, c2, rounds: 8)
        try #require(try a2.engine.writeSnapshot() != nil)
        let only = try #require(try store2.snapshot(container: TestDevice.container, seq: store2.journalHead(container: TestDevice.container)))
        store2.loseBlob(only.parts[0])
        let b2 = try TestDevice(store: store2, name: "b")
        defer { b2.cleanUp() }
        try b2.engine.pull()
        #expect(try b2.tree() == a2.tree())
    }

    @Test func onlyAReplicaHoldingTheStoresStateWritesOne() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a", snapshotInterval: 2)
        defer { a.cleanUp() }
        for round in 0..<4 {
            try a.write("f\(round)", "\(round)")
            try a.engine.drain(progress: { _, _ in })
        }
        try a.write("pending", "not pushed yet")
        #expect(try a.engine.writeSnapshot() == nil, "a change not pushed is not the store's state")
        a.engine.writeSnapshotIfDue()
        #expect(try store.snapshots(container: TestDevice.container) == [])
        try a.engine.drain(progress: { _, _ in })
        a.engine.writeSnapshotIfDue()
        #expect(try store.snapshots(container: TestDevice.container) == [store.journalHead(container: TestDevice.container)])
        // Not due again until the journal grows by the interval.
        try a.write("f-next", "x")
        try a.engine.drain(progress: { _, _ in })
        a.engine.writeSnapshotIfDue()
        #expect(try store.snapshots(container: TestDevice.container).count == 1)
    }

    @Test func aSnapshotThatContradictsItselfIsNotUsed() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        defer { a.cleanUp() }
        try a.mkdir("x")
        try a.write("x/f", "content")
        try a.engine.drain(progress: { _, _ in })
        let head = store.journalHead(container: TestDevice.container)
        // A hostile snapshot: an entry whose folder is a file.
        let file = NodeState(id: "aaaaaaaa-0000-0000-0000-000000000001", kind: .file, mode: 0o644, uid: 0, gid: 0, size: 0,
                             hash: nil, target: nil, rdev: 0, mtime: .now(), ctime: .now(), btime: .now(), xattrs: [:], base: head)
        var other = file
        other.id = "aaaaaaaa-0000-0000-0000-000000000002"
        let part = SnapshotPart(changeSet: ChangeSet(device: "evil", deviceName: "evil", changes: [
            .node(file), .node(other), .entry(parent: .root, name: FileName("f"), child: file.id),
            .entry(parent: file.id, name: FileName("inside"), child: other.id),
        ]), authors: [:])
        let data = try part.encoded()
        try store.putBlob(ContentCopy.hash(of: data), data: data)
        #expect(try store.publishSnapshot(container: TestDevice.container,
                                          SnapshotRecord(seq: head, device: "evil", deviceName: "evil", nodes: 2, parts: [ContentCopy.hash(of: data)])))
        let b = try TestDevice(store: store, name: "b")
        defer { b.cleanUp() }
        try b.engine.pull()
        #expect(try b.tree() == a.tree())
    }
}
