import Foundation
import Logging
import UbiquityLocks
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

/// The store's collector on a fast clock: two weeks of edits on two
/// devices in a second.
@Suite struct CollectorTests {
    /// A wall clock the test moves, shared by the store (whose clock it
    /// keeps in step) and the devices.
    final class FakeClock: Sendable {
        let time = Lock(Date(timeIntervalSince1970: 1_800_000_000))
        let store: InMemoryStore
        init(store: InMemoryStore) {
            self.store = store
            store.clock.withLock { $0 = now }
        }
        var now: Date { time.withLock { $0 } }
        func advance(_ seconds: TimeInterval) {
            let now = time.withLock { $0 += seconds; return $0 }
            store.clock.withLock { $0 = now }
        }
        var timespec: @Sendable () -> Timespec {
            { [self] in Timespec(nanoseconds: Int64(now.timeIntervalSince1970 * 1e9)) }
        }
    }

    static let hour: TimeInterval = 3600
    static let size = 100_000

    /// Two files edited every two hours for 14 days by two devices, a 1-day
    /// retention, the collector every 6 hours with a 3-hour grace: the
    /// store holds at most the versions of the last day and a half (the
    /// period, the marking run before it and the grace), where without a
    /// collector it would hold all of them; every version the retention
    /// period keeps restores byte for byte, and the current files read. The
    /// journal keeps the records of about the same time (a snapshot every
    /// 24 records), not all 336.
    @Test func twoWeeksOfEditsStayUnderTheBound() throws {
        let store = InMemoryStore()
        let clock = FakeClock(store: store)
        let a = try TestDevice(store: store, name: "laptop", snapshotInterval: 24, clock: clock.timespec, retentionDays: 1)
        let b = try TestDevice(store: store, name: "desktop", clock: clock.timespec)
        defer { a.cleanUp(); b.cleanUp() }
        let collector = Collector(store: store, logger: Logger(label: "test"))
        var longestJournal = 0
        var written: [String: Data] = [:]   // content hash → bytes
        var edits = 0
        func edit(_ device: TestDevice, _ name: String) throws {
            // Content of its own each time (no two edits share a blob).
            edits += 1
            let stamp = "\(name) edit \(edits) \(UUID().uuidString)\n"
            let text = stamp + String(repeating: "x", count: Self.size - stamp.utf8.count)
            try device.write(name, text)
            written[ContentCopy.hash(of: Data(text.utf8))] = Data(text.utf8)
            try device.engine.drain(progress: { _, _ in })
        }
        var largest: UInt64 = 0
        var removed = 0
        for step in 0..<(14 * 12) {
            try edit(a, "a.txt")
            try b.engine.pull()
            try edit(b, "b.txt")
            try a.engine.pull()
            a.engine.writeSnapshotIfDue()
            clock.advance(2 * Self.hour)
            if step % 3 == 2 {
                removed += try collector.run(now: clock.now, grace: 3 * Self.hour).removed
            }
            largest = max(largest, store.blobBytes)
            longestJournal = max(longestJournal, store.journalLength)
        }
        // Versions within 1 day (12 per file) + the one current at its start,
        // + 6 h between runs + 3 h of grace + up to 6 h until the sweeping run:
        // 1.6 days of versions per file, with room for packs and manifests.
        let bound = UInt64(2 * Int(1.7 * 12) * Self.size)
        let everything = UInt64(2 * 14 * 12 * Self.size)
        #expect(removed > 0)
        #expect(largest <= bound, "the store grew to \(largest) bytes (bound \(bound); without collecting \(everything))")
        // 24 records a day: the period, the grace, 6 h between runs, and up to 30 records to the next snapshot.
        #expect(longestJournal <= 24 + 3 + 6 + 30, "the journal grew to \(longestJournal) records (336 committed)")

        // Every version within the period restores byte for byte, on the other device too.
        for (device, name) in [(b, "a.txt"), (a, "b.txt")] {
            try device.engine.catchUpHistory()
            let versions = try device.engine.history(ino: try device.resolve(name))
            #expect(versions.count >= 12)
            for version in versions {
                let copy = device.directory.appendingPathComponent("version-\(version.id)").path
                try device.engine.writeVersion(ino: try device.resolve(name), id: version.id, to: copy)
                let data = try Data(contentsOf: URL(fileURLWithPath: copy))
                #expect(written[ContentCopy.hash(of: data)] == data, "\(name) version \(version.id) restores as written")
            }
            #expect(Data(try device.read(name).utf8).count == Self.size)
        }
    }

    /// A blob that a record names again while the collector runs (the same
    /// content pushed anew, deduplicated, after the collector read the
    /// journals) was kept alive by the push: the sweep leaves it.
    @Test func contentPushedAgainDuringARunIsNotRemoved() throws {
        let memory = InMemoryStore()
        let store = FaultyStore(memory)
        let clock = FakeClock(store: memory)
        let a = try TestDevice(store: store, name: "laptop", clock: clock.timespec, retentionDays: 1)
        defer { a.cleanUp() }
        let collector = Collector(store: store, logger: Logger(label: "test"))
        let big = String(repeating: "x", count: 2 << 20)
        try a.write("f.txt", big)
        try a.engine.drain(progress: { _, _ in })
        try a.fs.unlink(parent: Namespace.rootIno, name: "f.txt")
        try a.engine.drain(progress: { _, _ in })
        clock.advance(3 * 86_400)
        #expect(try collector.run(now: clock.now, grace: Self.hour).marked > 0)
        // The sweeping run reads the journals, then the same content is pushed again.
        clock.advance(2 * Self.hour)
        store.beforeListingBlobs.withLock { hook in
            hook = {
                try a.write("g.txt", big)
                try a.engine.drain(progress: { _, _ in })
            }
        }
        let report = try collector.run(now: clock.now, grace: Self.hour)
        store.beforeListingBlobs.withLock { $0 = nil }
        #expect(report.removed == 0)
        let c = try TestDevice(store: store, name: "tablet", clock: clock.timespec)
        defer { c.cleanUp() }
        try c.engine.pull()
        #expect(try c.read("g.txt") == big)
    }

    /// Emptying Recently Deleted lets the collector remove the content once
    /// the marking and the grace have passed; before, a deleted file restores.
    @Test func emptiedTrashIsCollected() throws {
        let store = InMemoryStore()
        let clock = FakeClock(store: store)
        let a = try TestDevice(store: store, name: "laptop", clock: clock.timespec, retentionDays: 30)
        defer { a.cleanUp() }
        let collector = Collector(store: store, logger: Logger(label: "test"))
        try a.write("secret.txt", String(repeating: "s", count: 50_000))
        try a.engine.drain(progress: { _, _ in })
        try a.fs.unlink(parent: Namespace.rootIno, name: "secret.txt")
        try a.engine.drain(progress: { _, _ in })
        let before = store.blobBytes
        clock.advance(Self.hour)
        _ = try collector.run(now: clock.now, grace: 0.5 * Self.hour)
        clock.advance(Self.hour)
        #expect(try collector.run(now: clock.now, grace: 0.5 * Self.hour).removed == 0, "within retention: kept")
        #expect(a.engine.trash().count == 1)
        try a.engine.emptyTrash()
        clock.advance(Self.hour)
        _ = try collector.run(now: clock.now, grace: 0.5 * Self.hour)
        clock.advance(Self.hour)
        let report = try collector.run(now: clock.now, grace: 0.5 * Self.hour)
        #expect(report.removed >= 1)
        #expect(store.blobBytes < before)
    }
}
