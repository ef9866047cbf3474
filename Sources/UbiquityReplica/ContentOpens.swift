import Foundation
import UbiquityModel
import UbiquityLinux

/// Who has a file's content open: the counts every mount of the replica
/// shares on the node (`LocalNode.opening`, `openCount`, `openWriters`),
/// changed only here, and the check that makes an open safe against the
/// content changing under it.
///
/// The protocol, from the mount's side (`FileSystem.openContent`):
/// 1. `beginOpening`: an open is under way. Eviction refuses meanwhile, so
///    the content cannot vanish between looking at the node and counting.
/// 2. The cache file is opened outside the namespace lock.
/// 3. `countOpen(epoch:)` counts it — in the same critical section that checks
///    the content is still the one the descriptor opened (local, of the
///    epoch read in step 1: every eviction, download and newer version moves
///    it). If it moved, nothing is counted and the open looks again at
///    once; it can only lose to a change that moved the content forward
///    (a download installed, a newer version), never twice to the same one.
/// 4. `endOpening`; at release, `countClose`. The last writer to leave
///    acknowledges what was written (`acknowledgeWrites`).
///
/// Readers of the counts: eviction (not while open or opening), the push
/// (not while a writer has it open), item status (`isUploading`).
extension Namespace {
    public mutating func beginOpening(_ ino: UInt64) {
        updateRuntime(ino) { $0.opening += 1 }
    }

    public mutating func endOpening(_ ino: UInt64) {
        updateRuntime(ino) { $0.opening -= 1 }
    }

    /// The node of `ino` if an open of its content may be counted: with
    /// `epoch`, only while the content is still local and of that epoch.
    public func openable(_ ino: UInt64, epoch: UInt32?) -> LocalNode? {
        guard let node = node(ino) else { return nil }
        if let epoch, !node.hasContent || node.contentEpoch != epoch { return nil }
        return node
    }

    /// Count an open of `ino` (a reader, or a writer).
    public mutating func countOpen(_ ino: UInt64, writable: Bool) {
        updateRuntime(ino) {
            $0.openCount += 1
            $0.lastAccess = AccessClock.now()
            if writable { $0.openWriters += 1 }
        }
    }

    /// A writer that is not an open (a truncation by path) begins.
    public mutating func countWriter(_ ino: UInt64) {
        updateRuntime(ino) { $0.openWriters += 1 }
    }

    /// A writer is gone. The last one acknowledges what was written: no
    /// descriptor can write more, every `close` has returned.
    public mutating func writerLeft(_ ino: UInt64) {
        updateRuntime(ino) {
            $0.openWriters -= 1
            $0.lastContentChange = MonotonicClock.now()
        }
        if node(ino)?.openWriters == 0 { acknowledgeWrites(ino) }
    }

    /// An open of `ino` is released.
    public mutating func countClose(_ ino: UInt64, writable: Bool) {
        updateRuntime(ino) { $0.openCount -= 1 }
        if writable { writerLeft(ino) }
    }
}
