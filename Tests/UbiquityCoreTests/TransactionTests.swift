import Foundation
import Testing
import UbiquityFS
@testable import UbiquityReplica
import UbiquityModel
import UbiquityTesting
#if canImport(Glibc)
import Glibc
#endif

/// Replica transactions: a change the index does not record is taken back
/// whole, in memory and in the index (what a full disk relies on).
@Suite struct TransactionTests {
    /// Everything a namespace holds, in a stable order (dictionaries sorted),
    /// including what it has logged for the index.
    static func fingerprint(_ ns: Namespace) -> String {
        var lines: [String] = []
        for (ino, node) in ns.nodes.sorted(by: { $0.key < $1.key }) {
            var n = node
            let xattrs = n.xattrs.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value.base64EncodedString())" }
            n.xattrs = [:]
            lines.append("node \(ino) \(n) xattrs \(xattrs)")
        }
        for (dir, table) in ns.children.sorted(by: { $0.key < $1.key }) {
            let entries = table.map { "\($0.key)=\($0.value.ino)/\($0.value.cookie)" }.sorted()
            lines.append("dir \(dir) \(entries)")
        }
        lines.append("ids \(ns.inoByID.map { "\($0.key)=\($0.value)" }.sorted())")
        lines.append("parents \(ns.directoryParent.map { "\($0.key)=\($0.value)" }.sorted())")
        lines.append("pending \(ns.pendingEntries.map { "\($0.key.parent)/\($0.key.name)=\($0.value.change)" }.sorted())")
        lines.append("bases \(ns.pendingEntries.map { "\($0.key.parent)/\($0.key.name)=\($0.value.base)" }.sorted())")
        lines.append("unpushed \(ns.unpushed.sorted()) dirty \(ns.dirtyRows.sorted())")
        lines.append("counters \(ns.nextIno) \(ns.nextCookie) \(ns.changeCounter) \(ns.appliedSeq)")
        lines.append("log \(ns.log.map { "\($0)" })")
        return lines.joined(separator: "\n")
    }

    /// A device with files, folders, a hard link, an xattr, pending entries
    /// and a write not yet committed (a dirty row in the log).
    func populated() throws -> TestDevice {
        let d = try TestDevice(store: InMemoryStore())
        try d.mkdir("dir")
        try d.mkdir("dir/sub")
        try d.write("dir/a.txt", "a")
        try d.write("b.txt", "b")
        try d.fs.setxattr(ino: try d.resolve("b.txt"), name: "user.tag", value: Data("v".utf8), flags: 0)
        _ = try d.fs.link(ino: try d.resolve("b.txt"), newParent: try d.resolve("dir"), newName: "b-link")
        let handle = try d.fs.open(ino: try d.resolve("dir/a.txt"), flags: O_WRONLY).handle
        _ = try Array("more".utf8).withUnsafeBytes { try d.fs.write(handle: handle, offset: 1, bytes: $0.baseAddress!, count: 4) }
        try d.fs.release(handle: try d.fs.open(ino: try d.resolve("b.txt"), flags: O_RDONLY).handle)
        // `handle` stays open: its write is in memory only, waiting for close.
        return d
    }

    struct Refused: Error {}

    @Test func aRefusedTransactionLeavesNamespaceAndIndexAsTheyWere() throws {
        let d = try populated()
        defer { d.cleanUp() }
        let root = Namespace.rootIno
        let dir = try d.resolve("dir")
        let sub = try d.resolve("dir/sub")
        let a = try d.resolve("dir/a.txt")
        let b = try d.resolve("b.txt")
        let before = d.replica.read { Self.fingerprint($0) }
        let indexBefore = Self.fingerprint(try Replica.readNamespace(directory: d.directory))
        #expect(throws: Refused.self) {
            try d.replica.transaction(.mayUseReserve) { ns in
                // New items, a directory inside a new directory.
                let made = ns.createNode(kind: .directory, mode: 0o755, uid: 0, gid: 0)
                ns.linkEntry(root, "made", made)
                let inner = ns.createNode(kind: .file, mode: 0o644, uid: 0, gid: 0)
                ns.linkEntry(made, "inner", inner)
                // A move, a removal that drops the node, a replaced name.
                ns.unlinkEntry(dir, "sub")
                ns.linkEntry(made, "sub", sub)
                ns.unlinkEntry(dir, "a.txt")
                ns.updateRuntime(a) { $0.lookups = 0 }
                ns.updateRuntime(a) { $0.openCount = 0; $0.openWriters = 0 }
                ns.dropIfUnreferenced(a)
                ns.unlinkEntry(root, "b.txt")
                ns.linkEntry(root, "b.txt", inner)
                // Metadata, content, identity, bookkeeping.
                ns.update(b) { $0.mode = 0o600; $0.xattrs["user.tag"] = nil }
                ns.contentChanged(b, size: 99, time: .now(), monotonic: 1)
                ns.rekey(b, to: "rekeyed")
                ns.entryPushed(EntryKey(parent: dir, name: "b-link"), change: .max)
                ns.setAppliedSeq(42)
                // The unlinked directory goes too.
                ns.unlinkEntry(made, "sub")
                ns.updateRuntime(sub) { $0.lookups = 0 }
                ns.dropIfUnreferenced(sub)
                throw Refused()
            }
        }
        #expect(d.replica.read { Self.fingerprint($0) } == before)
        #expect(Self.fingerprint(try Replica.readNamespace(directory: d.directory)) == indexBefore)
        // The replica goes on as if nothing happened, and the pending write commits at close.
        try d.mkdir("after")
        #expect(try d.list("").sorted() == ["after", "b.txt", "dir"])
        #expect(try d.read("dir/a.txt") == "amore")
        #expect(try d.read("b.txt") == "b")
    }

    @Test func aFailedOperationIsNotPushed() throws {
        let store = InMemoryStore()
        let d = try TestDevice(store: store)
        defer { d.cleanUp() }
        try d.mkdir("kept")
        #expect(throws: UbiquityError.self) { try d.mkdir("kept") }   // EEXIST: refused inside the transaction
        #expect(throws: Refused.self) {
            try d.replica.transaction(.mayUseReserve) { ns in
                let ino = ns.createNode(kind: .directory, mode: 0o755, uid: 0, gid: 0)
                ns.linkEntry(Namespace.rootIno, "refused", ino)
                throw Refused()
            }
        }
        try d.engine.drain(progress: { _, _ in })
        let other = try TestDevice(store: store, name: "other")
        defer { other.cleanUp() }
        try other.engine.pull()
        #expect(try other.list("") == ["kept"])
    }
}
