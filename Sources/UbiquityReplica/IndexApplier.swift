import Foundation
import UbiquityModel
import UbiquityStore
import UbiquityLinux

/// Writes the operation log's records to SQLite, in the background.
///
/// `Replica` hands over each record it appended (`enqueue`, under
/// `Replica.writer`); one thread waits `gatherDelay` after the first, takes
/// everything queued and writes it in one SQLite transaction together with
/// `meta.log_applied` (the number of the last record in it), then
/// checkpoints when due and tells the replica what SQLite holds now, which
/// empties or rotates the log (`Replica.trimLog`). Many operations share a transaction:
/// a burst of creates costs a few WAL pages instead of a few per create.
///
/// While programs are changing the namespace, a batch waits for a pause in
/// those changes (`ForegroundActivity`), a second at most, or until 20,000
/// operations are queued: the log already holds them, and SQLite's copy is
/// background work that would otherwise share the CPUs with a burst of
/// metadata operations. `drain` and `stop` cut the wait short.
///
/// Once the queue has been empty for `idleRelease`, SQLite's page cache
/// and prepared statements are given back (some 2 MB: a daemon at rest is
/// part of issue #11's memory budget); the next batch reads its pages
/// again from the file, which the kernel still caches.
///
/// A write SQLite refuses (a full disk) is retried a second later; nothing
/// is lost meanwhile, the records stay in the log (and the queue). Only
/// `drain` (closing the replica) waits for the queue to empty.
///
/// Lock order: `Replica.writer` → `condition`. The thread holds no lock
/// while it writes SQLite, and takes `Replica.writer` (through `applied`)
/// only without `condition`.
final class IndexApplier: @unchecked Sendable {
    let index: Index
    /// Called with no lock held after each batch, with the number of the
    /// last record SQLite now holds: the replica trims the log.
    let applied: @Sendable (UInt64) -> Void
    let foreground: ForegroundActivity
    /// Guards the fields below.
    let condition = NSCondition()
    /// Records appended and not yet in SQLite, kept encoded (decoded by the thread).
    var queue: [OperationLog.Encoded] = []
    /// Operations in `queue`.
    var queuedOps = 0
    /// Callers of `drain` waiting: the thread writes without waiting for quiet.
    var draining = 0
    var appliedSeq: UInt64
    var stopping = false
    var failure: String?
    let finished = DispatchSemaphore(value: 0)
    /// At most this many operations per SQLite transaction.
    static let batchLimit = 20_000
    /// How long the first record of a batch waits for others (a record is
    /// committed once it is in the log; this only delays SQLite's copy).
    static let gatherDelay = 0.05
    /// How long the queue stays empty before SQLite's caches are given back.
    static let idleRelease = 2.0

    init(index: Index, appliedSeq: UInt64, foreground: ForegroundActivity, applied: @escaping @Sendable (UInt64) -> Void) {
        self.index = index
        self.appliedSeq = appliedSeq
        self.foreground = foreground
        self.applied = applied
        Thread.run(named: "ubq-index") { [self] in run() }
    }

    func enqueue(_ record: OperationLog.Encoded) {
        condition.lock()
        queue.append(record)
        queuedOps += record.opCount
        // Only the first record wakes the thread; it then gathers the others.
        if queue.count == 1 { condition.broadcast() }
        condition.unlock()
    }

    /// Number of the last record SQLite holds.
    var appliedUpTo: UInt64 {
        condition.lock()
        defer { condition.unlock() }
        return appliedSeq
    }

    /// Wait until SQLite holds every record queued so far; throws the last
    /// failure if it does not within `timeout` seconds.
    func drain(timeout: Double = 60) throws {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        draining += 1
        condition.broadcast()
        defer {
            draining -= 1
            condition.unlock()
        }
        while !queue.isEmpty {
            if !condition.wait(until: deadline) {
                throw UbiquityError(EIO, "the replica index did not take its queued changes: \(failure ?? "timed out")")
            }
        }
    }

    /// Stop the thread after the batch under way (what is still queued is in
    /// the log: the next open applies it) and wait for it.
    func stop() {
        condition.lock()
        let wasStopping = stopping
        stopping = true
        condition.broadcast()
        condition.unlock()
        if !wasStopping { finished.wait() }
    }

    private func run() {
        defer { finished.signal() }
        // Background work, like pushing: the programs using the mount come first.
        LinuxCalls.lowerThreadPriority()
        var reported: String?
        var cachesHeld = false
        while true {
            condition.lock()
            while queue.isEmpty && !stopping {
                guard cachesHeld else {
                    condition.wait()
                    continue
                }
                if !condition.wait(until: Date(timeIntervalSinceNow: Self.idleRelease)) && queue.isEmpty && !stopping {
                    condition.unlock()
                    index.releaseMemory()
                    LinuxCalls.releaseFreeMemory()
                    cachesHeld = false
                    condition.lock()
                }
            }
            // Let a burst gather: one transaction per `gatherDelay`, not per record.
            let deadline = Date().addingTimeInterval(Self.gatherDelay)
            while !stopping && condition.wait(until: deadline) {}
            // Then for a pause in the namespace changes (bounded, see above).
            let latest = MonotonicClock.now() + ForegroundActivity.longestDeferral
            while !stopping && draining == 0 && queuedOps < Self.batchLimit {
                let wait = foreground.untilQuiet(changesOnly: true)
                let now = MonotonicClock.now()
                guard wait > 0, now < latest else { break }
                _ = condition.wait(until: Date(timeIntervalSinceNow: Double(min(wait, latest - now)) / 1e9))
            }
            if stopping {
                condition.unlock()
                return
            }
            var count = 0
            var taken = 0
            for record in queue {
                if taken > 0 && count + record.opCount > Self.batchLimit { break }
                count += record.opCount
                taken += 1
            }
            let batch = Array(queue.prefix(taken))
            condition.unlock()

            let last = batch.last!.seq
            do {
                var ops: [IndexOp] = []
                ops.reserveCapacity(count + 1)
                for record in batch { ops.append(contentsOf: try record.decoded()) }
                ops = IndexOp.lastPerRow(ops)
                ops.append(.meta(key: "log_applied", value: String(last)))
                try index.write(ops)
                condition.lock()
                queue.removeFirst(taken)
                queuedOps -= count
                appliedSeq = last
                failure = nil
                condition.broadcast()
                condition.unlock()
                reported = nil
                cachesHeld = true
                index.checkpointIfDue()
                applied(last)
            } catch {
                let message = UbiquityError.wrap(error).message
                condition.lock()
                failure = message
                condition.broadcast()
                _ = condition.wait(until: Date().addingTimeInterval(1))
                condition.unlock()
                if reported != message {
                    reported = message
                    FileHandle.standardError.write(Data("ubiquityfs: the replica index is behind its operation log (retrying): \(message)\n".utf8))
                }
            }
        }
    }
}

extension IndexOp {
    /// The row an operation sets or deletes, whole: of several operations
    /// on one row, the last decides what the row holds.
    enum Row: Hashable {
        case node(UInt64)
        case entry(UInt64, FileName)
        case pendingEntry(UInt64, FileName)
        case meta(String)
        case quarantine(UInt64)
        case content(UInt64)
    }

    var row: Row {
        switch self {
        case .node(let n): .node(n.ino)
        case .removeNode(let ino): .node(ino)
        case .entry(let parent, let name, _), .removeEntry(let parent, let name): .entry(parent, name)
        case .pendingEntry(let parent, let name, _, _), .clearPendingEntry(let parent, let name): .pendingEntry(parent, name)
        case .meta(let key, _): .meta(key)
        case .quarantine(let record): .quarantine(record.seq)
        case .journaledContent(let c): .content(c.ino)
        case .contentOnDisk(let ino): .content(ino)
        }
    }

    /// `ops` without those a later one in the list overrides (every
    /// operation replaces or deletes its whole row), in their order: a
    /// file created, written and renamed in one batch costs SQLite one
    /// node write, not three.
    static func lastPerRow(_ ops: [IndexOp]) -> [IndexOp] {
        var seen = Set<Row>(minimumCapacity: ops.count)
        var kept: [IndexOp] = []
        kept.reserveCapacity(ops.count)
        for op in ops.reversed() where seen.insert(op.row).inserted { kept.append(op) }
        return kept.reversed()
    }
}
