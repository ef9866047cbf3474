import Foundation
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// Small files pushed together go into pack blobs (docs/STORE-FORMAT.md, "Packs").
@Suite struct PackTests {
    /// A folder store in a temporary folder, and its blob files.
    final class Folder {
        let root: URL
        let store: FolderStore
        init() throws {
            root = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-packs-\(UUID().uuidString)")
            store = try FolderStore(root: root, create: true, initializeEmpty: true)
        }
        func blobPath(_ hash: String) -> String { root.appendingPathComponent("blobs/\(hash.prefix(2))/\(hash)").path }
        /// Every blob file in the store.
        var blobs: [String] {
            let dir = root.appendingPathComponent("blobs").path
            return ((try? FileManager.default.subpathsOfDirectory(atPath: dir)) ?? []).filter { $0.count == 67 }.map { String($0.suffix(64)) }
        }
        func cleanUp() { try? FileManager.default.removeItem(at: root) }
    }

    /// The node records of the journal, by node ID.
    static func nodeStates(_ store: any Store) throws -> [NodeState] {
        try store.journal(container: TestDevice.container, after: 0, limit: 10_000).flatMap { record -> [NodeState] in
            (record.changeSet?.changes ?? []).compactMap { if case .node(let s) = $0 { s } else { nil } }
        }
    }

    @Test func manySmallFilesMakeFewStoreObjectsAndReadBackOnAnotherDevice() throws {
        let folder = try Folder()
        defer { folder.cleanUp() }
        let a = try TestDevice(store: folder.store, name: "a")
        let b = try TestDevice(store: folder.store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        try a.mkdir("small")
        var expected: [String: String] = [:]
        for i in 0..<300 {
            let text = "file \(i) " + String(repeating: "x", count: 3000 + i)
            try a.write("small/f\(i)", text)
            expected["small/f\(i)"] = text
        }
        try a.write("small/same1", "identical content")
        try a.write("small/same2", "identical content")
        try a.engine.drain(progress: { _, _ in })
        // 300 files of about 3 KiB: one pack (under a chunk), not 300 blobs.
        let blobs = folder.blobs
        #expect(blobs.count <= 3, "\(blobs.count) blobs for 302 files")
        let states = try Self.nodeStates(folder.store).filter { $0.kind == .file }
        #expect(states.count == 302)
        #expect(states.allSatisfy { $0.pack != nil }, "every small file names its pack")
        let sameHash = ContentCopy.hash(of: Data("identical content".utf8))
        let same = states.filter { $0.hash == sameHash }
        #expect(same.count == 2 && same[0].pack == same[1].pack, "identical content is packed once")
        // The records that name packs are version 2.
        #expect(try folder.store.journal(container: TestDevice.container, after: 0, limit: 100).contains { $0.changeSet?.version == 2 })

        try b.engine.pull()
        for (path, text) in expected { #expect(try b.read(path) == text) }
        #expect(try b.read("small/same2") == "identical content")
    }

    @Test func aDamagedPackRangeIsRefusedNeverServed() throws {
        let folder = try Folder()
        defer { folder.cleanUp() }
        let a = try TestDevice(store: folder.store, name: "a")
        let b = try TestDevice(store: folder.store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        for i in 0..<10 { try a.write("f\(i)", "content of file number \(i)") }
        try a.engine.drain(progress: { _, _ in })
        let states = try Self.nodeStates(folder.store).filter { $0.kind == .file }
        let packs = Set(states.compactMap { $0.pack?.hash })
        #expect(packs.count == 1)
        let pack = try #require(packs.first)
        // Flip one byte inside the range of the file f3 (a rewrite of the pack file, as damage would be).
        let f3 = try #require(states.first { $0.hash == ContentCopy.hash(of: Data("content of file number 3".utf8)) })
        var bytes = try Data(contentsOf: URL(fileURLWithPath: folder.blobPath(pack)))
        let at = Int(f3.pack!.offset) + 2
        bytes[at] ^= 0xff
        try bytes.write(to: URL(fileURLWithPath: folder.blobPath(pack)))

        try b.engine.pull()
        do {
            let text = try b.read("f3")
            Issue.record("a damaged pack range was served: \(text)")
        } catch let error as UbiquityError {
            #expect(error.errno == EIO)
        }
        #expect(b.engine.currentStatus.lastError?.contains(pack) == true, "the error names the pack: \(b.engine.currentStatus.lastError ?? "none")")
        // The other members of the pack are intact and read.
        #expect(try b.read("f4") == "content of file number 4")

        // A missing pack: EIO, like a missing blob.
        try FileManager.default.removeItem(atPath: folder.blobPath(pack))
        #expect(throws: UbiquityError.self) { _ = try b.read("f5") }
    }

    @Test func aLostPackIsPutBackAsBlobsByTheDeviceHoldingTheContent() throws {
        let folder = try Folder()
        defer { folder.cleanUp() }
        let a = try TestDevice(store: folder.store, name: "a")
        let b = try TestDevice(store: folder.store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        for i in 0..<5 { try a.write("f\(i)", "held \(i)") }
        try a.engine.drain(progress: { _, _ in })
        let pack = try #require(Set(try Self.nodeStates(folder.store).compactMap { $0.pack?.hash }).first)
        try FileManager.default.removeItem(atPath: folder.blobPath(pack))
        // The device holding the content notices and puts it back (as blobs of their own).
        let ino = try a.resolve("f2")
        let node = try #require(a.replica.read { ns in ns.node(ino) })
        #expect(try a.engine.checkStoreCopy(of: node, verifyLocal: false) != .intact)
        try b.engine.pull()
        #expect(try b.read("f2") == "held 2")
    }

    @Test func mixedLargeAndSmallFiles() throws {
        let folder = try Folder()
        defer { folder.cleanUp() }
        let a = try TestDevice(store: folder.store, name: "a")
        let b = try TestDevice(store: folder.store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        let big = String(repeating: "0123456789abcdef", count: (1 << 20) / 16 + 10)        // > 1 MiB: a blob of its own
        let huge = String(repeating: "huge-content-", count: (5 << 20) / 13)                // > one chunk: chunked
        try a.write("big", big)
        try a.write("huge", huge)
        for i in 0..<50 { try a.write("s\(i)", "small \(i)") }
        try a.write("empty", "")
        try a.engine.drain(progress: { _, _ in })
        let states = try Self.nodeStates(folder.store)
        let bigState = try #require(states.first { $0.hash == ContentCopy.hash(of: Data(big.utf8)) })
        #expect(bigState.pack == nil)
        #expect(states.first { $0.chunked == true }?.pack == nil)
        #expect(states.filter { $0.pack != nil }.count == 50)
        // 50 small files in one pack; the big one; the huge one's 2 chunks and manifest.
        #expect(folder.blobs.count <= 6, "\(folder.blobs.count) blobs")
        try b.engine.pull()
        #expect(try b.read("big") == big)
        #expect(try b.read("huge") == huge)
        for i in 0..<50 { #expect(try b.read("s\(i)") == "small \(i)") }
        #expect(try b.read("empty") == "")
    }

    @Test func aMetadataChangeAndASnapshotStillNameThePack() throws {
        let folder = try Folder()
        defer { folder.cleanUp() }
        let a = try TestDevice(store: folder.store, name: "a", snapshotInterval: 1)
        defer { a.cleanUp() }
        for i in 0..<5 { try a.write("f\(i)", "versioned \(i)") }
        try a.engine.drain(progress: { _, _ in })
        let first = try #require(try Self.nodeStates(folder.store).first { $0.hash == ContentCopy.hash(of: Data("versioned 1".utf8)) })
        let pack = try #require(first.pack)
        // chmod: a new record of the node, content unchanged; it says where the content is again.
        _ = try a.fs.setattr(ino: try a.resolve("f1"), changes: AttributeChanges(mode: 0o600), handle: nil)
        try a.engine.drain(progress: { _, _ in })
        let again = try Self.nodeStates(folder.store).filter { $0.id == first.id }
        #expect(again.count == 2 && again.last?.pack == pack)
        // A snapshot carries the location; a device starting from it reads the files.
        #expect(try a.engine.writeSnapshot() != nil)
        let c = try TestDevice(store: folder.store, name: "c", snapshotInterval: 1)
        defer { c.cleanUp() }
        try c.engine.pull()
        for i in 0..<5 { #expect(try c.read("f\(i)") == "versioned \(i)") }
    }
}
