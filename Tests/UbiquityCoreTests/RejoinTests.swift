import Foundation
import Logging
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityModel
import UbiquityTesting
import UbiquitySync

/// The collector compacts the journal (records older than the retention
/// period, up to a snapshot, go); a device away for longer rejoins from the
/// snapshot with its unpushed work kept, and a new device joins.
@Suite struct RejoinTests {
    typealias FakeClock = CollectorTests.FakeClock
    static let day: TimeInterval = 86_400

    /// Device B goes away with work of its own not pushed; A changes the
    /// same files and others for days; the collector removes the records B
    /// never read. B comes back: its first commit takes a removed number and
    /// is withdrawn, it rejoins from the snapshot, and both devices end with
    /// one tree in which every edit of both survives (a conflict kept as a
    /// copy, an edit over a deletion kept, renames and deletions there
    /// applied here).
    @Test func aDeviceAwayLongerThanTheRetentionPeriodRejoins() throws {
        let store = InMemoryStore()
        let clock = FakeClock(store: store)
        let a = try TestDevice(store: store, name: "laptop", snapshotInterval: 4, clock: clock.timespec, retentionDays: 1)
        let b = try TestDevice(store: store, name: "desktop", clock: clock.timespec)
        defer { a.cleanUp(); b.cleanUp() }
        for name in ["keep.txt", "both.txt", "gone-there.txt", "edited-here.txt", "renamed-there.txt"] {
            try a.write(name, "first \(name)\n")
        }
        try a.mkdir("d")
        try a.mkdir("d/e")
        try a.write("d/e/x.txt", "deep\n")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.pull()
        let behind = b.replica.read { $0.appliedSeq }

        // B, away: work of its own, never pushed while away.
        try b.write("both.txt", "desktop's both\n")
        try b.write("edited-here.txt", "desktop's edit\n")
        try b.write("new-here.txt", "made on the desktop\n")
        try b.fs.rename(parent: Namespace.rootIno, name: "keep.txt", newParent: Namespace.rootIno, newName: "kept-renamed-here.txt", flags: [])

        // A, for days.
        for day in 0..<3 {
            try a.write("both.txt", "laptop's both, day \(day)\n")
            try a.write("made-there-\(day).txt", "day \(day)\n")
            try a.engine.drain(progress: { _, _ in })
            clock.advance(Self.day)
        }
        try a.fs.unlink(parent: Namespace.rootIno, name: "gone-there.txt")
        try a.fs.unlink(parent: Namespace.rootIno, name: "edited-here.txt")
        try a.fs.rename(parent: Namespace.rootIno, name: "renamed-there.txt", newParent: try a.resolve("d"), newName: "moved.txt", flags: [])
        try a.fs.unlink(parent: try a.resolve("d/e"), name: "x.txt")
        try a.fs.rmdir(parent: try a.resolve("d"), name: "e")
        try a.engine.drain(progress: { _, _ in })
        #expect(try a.engine.writeSnapshot() != nil)
        clock.advance(3 * Self.day)
        try a.write("recent.txt", "within the period\n")
        try a.engine.drain(progress: { _, _ in })

        let report = try Collector(store: store, logger: Logger(label: "test")).run(now: clock.now, grace: 3600)
        let base = try store.journalBase(container: TestDevice.container)
        #expect(report.recordsRemoved > 0)
        #expect(base > behind, "the base (\(base)) passed what the desktop applied (\(behind))")
        #expect(try store.journal(container: TestDevice.container, after: 0, limit: 10).isEmpty)
        #expect(try store.snapshots(container: TestDevice.container).allSatisfy { $0 >= base })

        // B comes back.
        try b.engine.drain(progress: { _, _ in })
        try a.engine.pull()
        try b.engine.pull()
        #expect(try store.journal(container: TestDevice.container, after: behind, limit: 1).isEmpty,
                "the record the desktop took below the base was withdrawn")
        let tree = try a.tree()
        #expect(try b.tree() == tree)
        #expect(tree["both.txt"] == "file 644 laptop's both, day 2\n")
        #expect(tree.contains { $0.key.hasPrefix("both (conflicted copy desktop") && $0.value == "file 644 desktop's both\n" })
        #expect(tree["edited-here.txt"] == "file 644 desktop's edit\n", "an edit over a deletion there is kept")
        #expect(tree["new-here.txt"] == "file 644 made on the desktop\n")
        #expect(tree["kept-renamed-here.txt"] == "file 644 first keep.txt\n")
        #expect(tree["keep.txt"] == nil)
        #expect(tree["gone-there.txt"] == nil)
        #expect(tree["renamed-there.txt"] == nil)
        #expect(tree["d/moved.txt"] == "file 644 first renamed-there.txt\n")
        #expect(tree["d/e"] == nil)
        #expect(tree["recent.txt"] == "file 644 within the period\n")
        for day in 0..<3 { #expect(tree["made-there-\(day).txt"] == "file 644 day \(day)\n") }
    }

    /// A new device joins a compacted journal from the base's snapshot,
    /// whether it reads snapshots when it starts or not; versions within
    /// the period still list and restore.
    @Test(arguments: [SyncEngine.defaultSnapshotInterval, 0])
    func aNewDeviceJoinsACompactedJournal(snapshotInterval: UInt64) throws {
        let store = InMemoryStore()
        let clock = FakeClock(store: store)
        let a = try TestDevice(store: store, name: "laptop", snapshotInterval: 3, clock: clock.timespec, retentionDays: 1)
        defer { a.cleanUp() }
        for round in 0..<8 {
            try a.write("f\(round % 3).txt", "round \(round)\n")
            try a.engine.drain(progress: { _, _ in })
            try a.engine.pull()
            a.engine.writeSnapshotIfDue()
        }
        clock.advance(3 * Self.day)
        try a.write("f0.txt", "recent\n")
        try a.engine.drain(progress: { _, _ in })
        let report = try Collector(store: store, logger: Logger(label: "test")).run(now: clock.now, grace: 3600)
        #expect(report.recordsRemoved > 0)
        let c = try TestDevice(store: store, name: "new", snapshotInterval: snapshotInterval, clock: clock.timespec)
        defer { c.cleanUp() }
        try c.engine.pull()
        #expect(try c.tree() == (try a.tree()))
        // The version current when the period began, and the recent one.
        try c.engine.catchUpHistory()
        let versions = try c.engine.history(ino: try c.resolve("f0.txt"))
        #expect(versions.count >= 2)
    }

    /// A record at or below the base found when reading the base after a
    /// commit is withdrawn; one above it stands.
    @Test func aCommitBelowTheBaseIsWithdrawn() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "laptop")
        defer { a.cleanUp() }
        try a.write("one.txt", "1\n")
        try a.engine.drain(progress: { _, _ in })
        let head = a.replica.read { $0.appliedSeq }
        try store.setJournalBase(container: TestDevice.container, head + 1)
        // No snapshot of the base: the device cannot rejoin, says why, and keeps its work.
        try a.write("two.txt", "2\n")
        #expect(throws: UbiquityError.self) { try a.engine.drain(progress: { _, _ in }) }
        #expect(try store.journal(container: TestDevice.container, after: head, limit: 1).isEmpty)
        #expect(try a.read("two.txt") == "2\n")
        #expect(a.replica.read { !$0.unpushed.isEmpty })
    }
}
