import Foundation
import Testing
import UbiquityFS
@testable import UbiquityReplica
import UbiquityModel
import UbiquityTesting
#if canImport(Glibc)
import Glibc
#endif

/// Journaled `fsync` (`JournaledContent`): a small change is made durable
/// by the operation log alone, and played back onto the cache file after a
/// crash of the machine lost what the cache file had not written back.
@Suite struct JournaledFsyncTests {
    func create(_ device: TestDevice, _ name: String) throws -> (ino: UInt64, handle: UInt64) {
        let (entry, opened) = try device.fs.create(parent: Namespace.rootIno, name: FileName(name), mode: 0o644,
                                                    flags: O_RDWR, caller: .root)
        return (entry.ino, opened.handle)
    }

    func write(_ device: TestDevice, _ handle: UInt64, at offset: Int64, _ text: String) throws {
        let bytes = Array(text.utf8)
        let n = try bytes.withUnsafeBytes { try device.fs.write(handle: handle, offset: offset, bytes: $0.baseAddress!, count: $0.count) }
        #expect(n == bytes.count)
    }

    func cacheFile(_ device: TestDevice, _ ino: UInt64) -> String { device.replica.cache.path(ino) }

    func contents(_ path: String) -> String? {
        (try? Data(contentsOf: URL(fileURLWithPath: path))).map { String(decoding: $0, as: UTF8.self) }
    }

    /// What a power cut does to a cache file whose writes never reached the disk.
    func loseUnsyncedWrites(_ path: String, keeping prefix: Int? = nil) {
        if let prefix { _ = truncate(path, off_t(prefix)) } else { unlink(path) }
    }

    /// A device of boot "boot-1" does `before` (then commits), its replica is
    /// closed as by a crash and opened again under `boot` for `after`.
    func reopened(as boot: String, before: (TestDevice) throws -> Void, after: (TestDevice) throws -> Void) throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a", boot: "boot-1")
        defer { a.cleanUp() }
        try before(a)
        try a.replica.persist()
        a.replica.releaseLock()
        let again = try TestDevice(store: store, name: "a", directory: a.directory, boot: boot)
        defer { again.replica.releaseLock() }
        try after(again)
    }

    /// New files written, fsynced (journaled), written again; then the cache
    /// files lose what they had not written back.
    func journaledFsyncsThenLostWrites(_ a: TestDevice) throws {
        // A new file: written, fsynced, then rewritten in part and fsynced again.
        let new = try create(a, "new.txt")
        try write(a, new.handle, at: 0, "hello, world")
        try a.fs.fsync(handle: new.handle, dataOnly: false)
        try write(a, new.handle, at: 7, "WORLD and more")
        try a.fs.fsync(handle: new.handle, dataOnly: true)
        try write(a, new.handle, at: 0, "never synced")
        // A log appended to and fdatasynced, cut short on the way.
        let log = try create(a, "log.txt")
        try write(a, log.handle, at: 0, "line 1\nline 2\n")
        _ = try a.fs.setattr(ino: log.ino, changes: AttributeChanges(size: 7), handle: log.handle)
        try write(a, log.handle, at: 7, "line 2b\n")
        try a.fs.fsync(handle: log.handle, dataOnly: true)
        try a.replica.persist()
        loseUnsyncedWrites(cacheFile(a, new.ino), keeping: 3)
        loseUnsyncedWrites(cacheFile(a, log.ino))
    }

    @Test func trackedRangesStaySortedDisjointAndNotTouching() {
        var tracker = ContentTracker(generation: 0, epoch: 0, smallestSize: 0)
        tracker.add(0..<10)
        tracker.add(10..<20)      // appended: grows the last
        tracker.add(30..<40)      // after a gap
        tracker.add(5..<8)        // inside the first
        tracker.add(25..<31)      // before the last, touching it
        tracker.add(50..<50)      // empty
        #expect(tracker.ranges == [0..<20, 25..<40])
        tracker.add(15..<26)      // joins both
        #expect(tracker.ranges == [0..<40])
        tracker.cut(to: 12)
        #expect(tracker.ranges == [0..<12] && tracker.smallestSize == 0)
    }

    @Test func aJournaledFsyncIsPlayedBackAfterTheMachineWentDown() throws {
        try reopened(as: "boot-2", before: journaledFsyncsThenLostWrites) { (again: TestDevice) throws in
            #expect(again.replica.playedJournaledFiles == 2)
            #expect(try again.read("new.txt") == "hello, WORLD and more")
            #expect(try again.read("log.txt") == "line 1\nline 2b\n")
            #expect(try again.fs.getattr(ino: try again.resolve("log.txt")).size == 15)
        }
    }

    @Test func afterTheDaemonsDeathTheCacheFilesAreTakenAsTheyAre() throws {
        // The same boot: the kernel kept every write (here, what the "cut" left is what it kept).
        try reopened(as: "boot-1", before: journaledFsyncsThenLostWrites) { (again: TestDevice) throws in
            #expect(again.replica.playedJournaledFiles == 0)
            #expect(contents(cacheFile(again, try again.resolve("new.txt"))) == "nev")
        }
    }

    @Test func aCacheFileSyncedLaterEndsWhatTheJournalSaysOfIt() throws {
        try reopened(as: "boot-2", before: { (a: TestDevice) throws in
            let file = try create(a, "f.bin")
            try write(a, file.handle, at: 0, "small change")
            try a.fs.fsync(handle: file.handle, dataOnly: false)
            // Past what is journaled: the cache file itself is synced.
            try write(a, file.handle, at: 0, String(repeating: "x", count: JournaledContent.largest + 1))
            try a.fs.fsync(handle: file.handle, dataOnly: false)
            // (What the disk holds after the cut: the synced file, here changed so a playback would show.)
            try Data("the synced file".utf8).write(to: URL(fileURLWithPath: cacheFile(a, file.ino)))
        }, after: { (again: TestDevice) throws in
            #expect(again.replica.playedJournaledFiles == 0)
            #expect(contents(cacheFile(again, try again.resolve("f.bin"))) == "the synced file")
        })
    }

    /// Closing the replica empties the log: the files its records name are
    /// synced first — one by one, or past a few (`syncfsFrom`) by one
    /// `syncfs` where it reaches the disk (this replica is on the test
    /// machine's disk; FUSE, where the power-cut tests run, does not pass
    /// `syncfs` on).
    @Test(arguments: [1, Replica.syncfsFrom * 3])
    func journaledRecordsLeaveTheLogOnlyWithTheirFilesSynced(files: Int) throws {
        #expect(Replica.syncfsReachesTheDisk(filesystemType: 0xEF53))        // ext4
        #expect(!Replica.syncfsReachesTheDisk(filesystemType: 0x6573_5546))  // FUSE
        #expect(!Replica.syncfsReachesTheDisk(filesystemType: 0x6969))       // NFS
        try reopened(as: "boot-2", before: { (a: TestDevice) throws in
            for i in 0..<files {
                let file = try create(a, "f\(i).txt")
                try write(a, file.handle, at: 0, "kept \(i)")
                try a.fs.fsync(handle: file.handle, dataOnly: false)
            }
            #expect(a.replica.holdsJournaledContent(upTo: .max))
            try a.replica.commitAndCheckpoint()
            #expect(!a.replica.holdsJournaledContent(upTo: .max))
        }, after: { (again: TestDevice) throws in
            #expect(again.replica.playedJournaledFiles == 0, "no record is left to play")
            for i in 0..<files { #expect(try again.read("f\(i).txt") == "kept \(i)") }
        })
    }

    @Test func aVersionPushedAfterTheRecordIsNotOverwritten() throws {
        try reopened(as: "boot-2", before: { (a: TestDevice) throws in
            let file = try create(a, "f.txt")
            try write(a, file.handle, at: 0, "journaled")
            try a.fs.fsync(handle: file.handle, dataOnly: false)
            try a.fs.release(handle: file.handle)
            try a.engine.drain(progress: { _, _ in })   // pushed: the store holds it now
        }, after: { (again: TestDevice) throws in
            #expect(again.replica.playedJournaledFiles == 0)
            #expect(try again.read("f.txt") == "journaled")
        })
    }
}
