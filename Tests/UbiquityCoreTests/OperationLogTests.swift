import Foundation
import Testing
import UbiquityFS
@testable import UbiquityReplica
import UbiquityModel
import UbiquityTesting
#if canImport(Glibc)
import Glibc
#endif

/// The operation log: a change is committed when its record is written; the
/// SQLite index catches up in the background, and a replica opened after a
/// crash replays what SQLite lacked.
@Suite struct OperationLogTests {
    /// What the index keeps of a namespace (no runtime counts), in a stable order.
    static func persisted(_ ns: Namespace) -> String {
        var lines: [String] = []
        for (ino, n) in ns.nodes.sorted(by: { $0.key < $1.key }) {
            let xattrs = n.xattrs.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value.base64EncodedString())" }
            lines.append("""
                node \(ino) \(n.id) \(n.kind) \(n.mode) \(n.uid) \(n.gid) \(n.size) \(n.rdev) \(n.target ?? "-") \
                \(n.hash ?? "-") \(n.hashSize) \(n.chunked) \(n.atime) \(n.mtime) \(n.ctime) \(n.btime) \(xattrs) \
                \(n.hasContent) \(n.contentGeneration) \(n.pushedGeneration) \(n.version) \(n.change) \(n.pushed) \
                \(n.unlinked) \(n.lastParent) \(n.lastName) \(n.conflicts) \(n.pinned) \(n.author) \
                \(n.verifiedHash ?? "-") \(n.unacknowledgedWrites) \(n.nlink)
                """)
        }
        for (dir, table) in ns.children.sorted(by: { $0.key < $1.key }) {
            lines.append("dir \(dir) \(table.map { "\($0.key)=\($0.value.ino)" }.sorted())")
        }
        lines.append("pending \(ns.pendingEntries.map { "\($0.key.parent)/\($0.key.name)=\($0.value.change)" }.sorted())")
        lines.append("bases \(ns.pendingEntries.map { "\($0.key.parent)/\($0.key.name)=\($0.value.base)" }.sorted())")
        lines.append("counters \(ns.nextIno) \(ns.appliedSeq) quarantined \(ns.quarantined.map(\.seq))")
        return lines.joined(separator: "\n")
    }

    /// Folders, files with content, a rename, a removal, a hard link, a
    /// symlink, xattrs, a mode change: every kind of index operation.
    func makeChanges(_ d: TestDevice) throws {
        try d.mkdir("dir")
        try d.mkdir("dir/sub")
        try d.write("dir/a.txt", "a")
        try d.write("b.txt", "bee")
        try d.write("gone.txt", "x")
        try d.fs.setxattr(ino: try d.resolve("b.txt"), name: "user.tag", value: Data([0, 1, 2, 255]), flags: 0)
        _ = try d.fs.link(ino: try d.resolve("b.txt"), newParent: try d.resolve("dir"), newName: "b-link")
        _ = try d.fs.symlink(target: "dir/a.txt", parent: Namespace.rootIno, name: "link", caller: Caller(uid: 0, gid: 0, pid: 0))
        try d.fs.rename(parent: try d.resolve("dir"), name: "a.txt", newParent: try d.resolve("dir/sub"), newName: "moved é.txt", flags: [])
        try d.fs.unlink(parent: Namespace.rootIno, name: "gone.txt")
        _ = try d.fs.setattr(ino: try d.resolve("b.txt"), changes: AttributeChanges(mode: 0o600), handle: nil)
        d.replica.record { ns in ns.quarantine(QuarantinedRecord(seq: 7, reason: "a test")) }
        try d.replica.persist()
    }

    /// The record checksum is CRC-32 (IEEE): the standard check value, and
    /// the bit-at-a-time definition for every length and slice start (the
    /// eight-byte steps and the tail).
    @Test func theRecordChecksumIsCRC32() {
        #expect(CRC32.checksum(ArraySlice("123456789".utf8)) == 0xCBF4_3926)
        #expect(CRC32.checksum([]) == 0)
        func definition(_ bytes: ArraySlice<UInt8>) -> UInt32 {
            var crc: UInt32 = 0xFFFF_FFFF
            for byte in bytes {
                crc ^= UInt32(byte)
                for _ in 0..<8 { crc = crc & 1 != 0 ? 0xEDB8_8320 ^ (crc >> 1) : crc >> 1 }
            }
            return ~crc
        }
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<300).map { _ in UInt8.random(in: 0...255, using: &generator) }
        for start in 0..<9 {
            for end in start...bytes.count where end - start < 40 || end == bytes.count {
                #expect(CRC32.checksum(bytes[start..<end]) == definition(bytes[start..<end]), "bytes \(start)..<\(end)")
            }
        }
    }

    @Test func changesOnlyInTheLogSurviveACrash() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        try d.replica.applier.drain()
        let sqliteBefore = Self.persisted(try Index(path: d.directory.appendingPathComponent("index.sqlite").path, readOnly: true).load())
        d.replica.applier.stop()   // from here on SQLite gets nothing: only the log has the changes
        try makeChanges(d)
        let expected = d.replica.read { Self.persisted($0) }
        #expect(expected != sqliteBefore)
        // SQLite itself still has the state from before the changes...
        let sqlite = Self.persisted(try Index(path: d.directory.appendingPathComponent("index.sqlite").path, readOnly: true).load())
        #expect(sqlite == sqliteBefore)
        // ...a reader without the replica's lock sees the log too...
        #expect(Self.persisted(try Replica.readNamespace(directory: d.directory)) == expected)
        // ...and after a crash (no drain, no checkpoint) the next open replays it.
        d.replica.releaseLock()
        let reopened = try Replica(directory: d.directory, rootOwner: (0, 0))
        #expect(reopened.read { Self.persisted($0) } == expected)
        #expect(reopened.log.size == 0)
        #expect(try reopened.index.logApplied() == reopened.log.lastSeq)
        // It goes on from there: a new change, a clean close, a third open.
        try reopened.transaction(.grows) { ns in
            let ino = ns.createNode(kind: .directory, mode: 0o755, uid: 0, gid: 0)
            ns.linkEntry(Namespace.rootIno, "after", ino)
        }
        let afterwards = reopened.read { Self.persisted($0) }
        try reopened.commitAndCheckpoint()
        reopened.releaseLock()
        let third = try Replica(directory: d.directory, rootOwner: (0, 0))
        #expect(third.read { Self.persisted($0) } == afterwards)
        third.releaseLock()
    }

    /// The applier writes only the last operation on each row of a batch:
    /// SQLite ends up holding exactly what the namespace holds.
    @Test func theApplierKeepsTheLastOperationOnEachRow() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        try makeChanges(d)
        for round in 0..<5 {   // the same rows again and again
            try d.write("r.txt", "are \(round)")
            try d.fs.rename(parent: Namespace.rootIno, name: "r.txt", newParent: Namespace.rootIno, newName: "c.txt", flags: [])
            try d.fs.rename(parent: Namespace.rootIno, name: "c.txt", newParent: Namespace.rootIno, newName: "r.txt", flags: [])
        }
        try d.write("brief.txt", "here for a moment")
        try d.fs.unlink(parent: Namespace.rootIno, name: "brief.txt")
        try d.replica.persist()
        try d.replica.applier.drain()
        let sqlite = Self.persisted(try Index(path: d.directory.appendingPathComponent("index.sqlite").path, readOnly: true).load())
        #expect(sqlite == d.replica.read { Self.persisted($0) })

        let ops: [IndexOp] = [.meta(key: "a", value: "1"), .entry(parent: 1, name: "x", child: 5),
                              .meta(key: "b", value: "2"), .removeEntry(parent: 1, name: "x"), .meta(key: "a", value: "3")]
        let kept = IndexOp.lastPerRow(ops).map { "\($0)" }
        #expect(kept == ["\(ops[2])", "\(ops[3])", "\(ops[4])"])
    }

    @Test func aCutOffOrDamagedTailIsDroppedAndTheLogGoesOn() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        d.replica.applier.stop()
        try d.mkdir("kept")
        try d.write("kept/file", "content")
        try d.mkdir("last")   // one transaction: the last record
        let recordsEnd = d.replica.log.size   // (zeros follow: `OperationLog.writtenAhead`)
        d.replica.releaseLock()
        let path = d.directory.appendingPathComponent("index.log").path
        // A write cut short (a full disk, a power loss): the last record lost its end.
        #expect(truncate(path, off_t(recordsEnd - 5)) == 0)
        let first = try Replica(directory: d.directory, rootOwner: (0, 0))
        let names = first.read { ns in ns.children[Namespace.rootIno]!.keys.map(\.description).sorted() }
        #expect(names == ["kept"])
        #expect(first.read { ns in ns.children.values.contains { $0["file"] != nil } })
        first.applier.stop()
        try first.transaction(.grows) { ns in
            let ino = ns.createNode(kind: .directory, mode: 0o755, uid: 0, gid: 0)
            ns.linkEntry(Namespace.rootIno, "new", ino)
        }
        let end = first.log.size
        first.releaseLock()
        // Garbage after the last whole record: a checksum that cannot match.
        let handle = try #require(FileHandle(forWritingAtPath: path))
        handle.seek(toFileOffset: UInt64(end))
        handle.write(Data((0..<64).map { UInt8($0 * 7 % 251) }))
        handle.closeFile()
        let second = try Replica(directory: d.directory, rootOwner: (0, 0))
        let after = second.read { ns in ns.children[Namespace.rootIno]!.keys.map(\.description).sorted() }
        #expect(after == ["kept", "new"])
        second.releaseLock()
    }

    @Test func recordsRoundTripAndDamageIsDetected() throws {
        var node = LocalNode(ino: 42, id: "an-id", kind: .symlink, mode: 0o777, uid: 1000, gid: 100,
                             size: 9, rdev: 3, target: "../target", time: Timespec(sec: -5, nsec: 999_999_999))
        node.hash = "abc"; node.hashSize = 12; node.chunked = true
        node.mtime = Timespec(sec: 1_700_000_000, nsec: 1)
        node.xattrs = ["user.a": Data(), "user.b": Data([0, 255])]
        node.hasContent = false; node.contentGeneration = 4; node.pushedGeneration = 3
        node.version = 10; node.change = 11; node.pushed = 9; node.unlinked = true
        node.lastParent = 1; node.lastName = FileName(bytes: [0xff, 0x61])
        node.conflicts = ["c1", "c2"]; node.pinned = true; node.author = "device é"
        node.verifiedHash = "v"; node.unacknowledgedWrites = true
        let ops: [IndexOp] = [
            .node(node), .removeNode(5), .entry(parent: 1, name: "n", child: 42), .removeEntry(parent: 1, name: "m"),
            .pendingEntry(parent: 1, name: "p", change: 8, base: 2), .clearPendingEntry(parent: 1, name: "q"),
            .meta(key: "k", value: "v"), .quarantine(QuarantinedRecord(seq: 3, reason: "r", date: Date(timeIntervalSince1970: 12.5))),
        ]
        let bytes = OperationLog.encode(seq: 77, ops)
        let parsed = OperationLog.parse(bytes + OperationLog.encode(seq: 78, [.removeNode(1)]))
        #expect(parsed.records.map(\.seq) == [77, 78])
        #expect(parsed.end == bytes.count + OperationLog.encode(seq: 78, [.removeNode(1)]).count)
        #expect("\(parsed.records[0].ops.dropFirst())" == "\(ops.dropFirst())")
        guard case .node(let back) = parsed.records[0].ops[0] else { Issue.record("not a node"); return }
        var a = node, b = back
        (a.xattrs, b.xattrs) = ([:], [:])
        #expect("\(a)" == "\(b)")
        #expect(back.xattrs == node.xattrs)
        // Any flipped byte makes the record (and what follows) unusable.
        for i in stride(from: 0, to: bytes.count, by: 7) {
            var damaged = bytes
            damaged[i] ^= 0x40
            #expect(OperationLog.parse(damaged).records.isEmpty, "byte \(i) flipped")
        }
    }
}

/// Under a sustained load SQLite never holds the very last record, so the
/// log is rotated rather than emptied: it stays about two segments long,
/// and a crash at any point still replays everything SQLite lacks.
@Suite struct OperationLogRotationTests {
    func addFolders(_ replica: Replica, _ names: some Sequence<String>) throws {
        for name in names {
            try replica.transaction(.grows) { ns in
                let ino = ns.createNode(kind: .directory, mode: 0o755, uid: 0, gid: 0)
                ns.linkEntry(Namespace.rootIno, FileName(name), ino)
            }
        }
    }

    func rootNames(_ replica: Replica) -> [String] {
        replica.read { ns in ns.children[Namespace.rootIno]!.keys.map(\.description).sorted() }
    }

    /// The device's replica reopened with small log segments and no index
    /// applier: SQLite gets nothing, so it is behind on every record.
    func replicaWithoutApplier(_ d: TestDevice, segmentSize: Int) throws -> Replica {
        d.replica.releaseLock()
        let replica = try Replica(directory: d.directory, rootOwner: (0, 0), logSegmentSize: segmentSize)
        replica.applier.stop()
        return replica
    }

    /// Records are written over zeros written ahead of them: a commit changes
    /// neither the log's length nor its blocks, so its sync is a data flush.
    @Test func recordsAreWrittenOverZerosAheadAndTheLogStillReplays() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        let replica = try replicaWithoutApplier(d, segmentSize: 1 << 30)
        func length() -> Int {
            var st = stat()
            return stat(replica.log.path, &st) == 0 ? Int(st.st_size) : -1
        }
        try addFolders(replica, ["a"])
        let before = length()
        #expect(before >= replica.log.size + OperationLog.writtenAhead / 2)
        try addFolders(replica, (0..<20).map { "b\($0)" })
        #expect(length() == before, "the records went over the zeros")
        // Past what was written ahead: more zeros follow.
        try addFolders(replica, (0..<3000).map { "c\($0)" })
        #expect(length() > replica.log.size)
        replica.releaseLock()
        let again = try Replica(directory: d.directory, rootOwner: (0, 0))
        #expect(again.read { ns in ns.entries(of: Namespace.rootIno).count } == 3021)
        again.releaseLock()
    }

    @Test func aLogSQLiteIsBehindOnIsRotatedAndBothSegmentsReplay() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        let replica = try replicaWithoutApplier(d, segmentSize: 2048)
        let previousPath = replica.log.previousPath
        try addFolders(replica, (0..<20).map { "a\($0)" })
        #expect(replica.log.size >= 2048)

        // Behind: the current segment becomes the previous one.
        let firstSegmentEnd = replica.log.lastSeq
        replica.trimLog(applied: 0)
        #expect(replica.log.size == 0)
        #expect(replica.log.previousLastSeq == firstSegmentEnd)
        #expect(FileManager.default.fileExists(atPath: previousPath))

        // Still behind on the previous segment: no second rotation, the current one grows.
        try addFolders(replica, (0..<20).map { "b\($0)" })
        replica.trimLog(applied: firstSegmentEnd - 1)
        #expect(replica.log.previousLastSeq == firstSegmentEnd)
        #expect(replica.log.size >= 2048)

        // A reader without the lock, and a crash: both segments replay.
        let expected = replica.read { OperationLogTests.persisted($0) }
        #expect(OperationLogTests.persisted(try Replica.readNamespace(directory: d.directory)) == expected)
        replica.releaseLock()
        let reopened = try Replica(directory: d.directory, rootOwner: (0, 0), logSegmentSize: 2048)
        #expect(reopened.read { OperationLogTests.persisted($0) } == expected)
        #expect(rootNames(reopened).count == 40)
        #expect(!FileManager.default.fileExists(atPath: previousPath))
        #expect(reopened.log.size == 0)
        reopened.releaseLock()
    }

    @Test func thePreviousSegmentGoesOnceSQLiteHoldsItAndACaughtUpLogIsEmptied() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        let replica = try replicaWithoutApplier(d, segmentSize: 2048)
        try addFolders(replica, (0..<20).map { "a\($0)" })
        replica.trimLog(applied: 0)
        let firstSegmentEnd = try #require(replica.log.previousLastSeq)
        try addFolders(replica, ["b"])
        // SQLite holds the previous segment: it is deleted; the small current one stays.
        replica.trimLog(applied: firstSegmentEnd)
        #expect(replica.log.previousLastSeq == nil)
        #expect(!FileManager.default.fileExists(atPath: replica.log.previousPath))
        #expect(replica.log.size > 0)
        // Caught up with a full segment: emptied in place, not rotated.
        try addFolders(replica, (0..<20).map { "c\($0)" })
        replica.trimLog(applied: replica.log.lastSeq)
        #expect(replica.log.size == 0)
        #expect(replica.log.previousLastSeq == nil)
        replica.releaseLock()
    }

    /// SQLite always one record behind (a sustained load): the log is
    /// rotated again and again and never holds much more than two segments.
    @Test func aLogAlwaysOneRecordAheadStaysNearTwoSegments() throws {
        let d = try TestDevice(store: InMemoryStore())
        defer { d.cleanUp() }
        let replica = try replicaWithoutApplier(d, segmentSize: 4096)
        var largest = 0
        var rotations = 0
        for round in 0..<100 {
            try addFolders(replica, (0..<5).map { "r\(round)-\($0)" })
            let before = replica.log.previousLastSeq
            replica.trimLog(applied: replica.log.lastSeq - 1)
            if replica.log.previousLastSeq != before, replica.log.previousLastSeq != nil { rotations += 1 }
            // Records only: each segment has zeros written ahead of them.
            let previous = try OperationLog.contents(replica.log.previousPath).map { OperationLog.parse($0).end } ?? 0
            largest = max(largest, replica.log.size + previous)
        }
        #expect(replica.log.lastSeq >= 500)
        #expect(rotations >= 10)
        #expect(largest < 3 * 4096, "the log reached \(largest) bytes")
        replica.releaseLock()
    }
}
