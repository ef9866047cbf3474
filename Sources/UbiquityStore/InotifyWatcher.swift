import Foundation
#if canImport(Glibc)
import Glibc
import UbiquityModel
#endif

/// Watches a folder store's journal directory with inotify, so a commit by
/// another device on this machine (or on a filesystem that reports remote
/// changes) wakes the puller at once. Polling still runs as the fallback:
/// network filesystems do not report other machines' writes.
final class InotifyWatcher: JournalWatcher {
    let fd: Int32

    init?(directory: String) {
        let fd = inotify_init1(Int32(IN_CLOEXEC) | Int32(IN_NONBLOCK))
        guard fd >= 0 else { return nil }
        let mask = UInt32(IN_CREATE) | UInt32(IN_MOVED_TO) | UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF)
        guard inotify_add_watch(fd, directory, mask) >= 0 else {
            Glibc.close(fd)
            return nil
        }
        self.fd = fd
    }

    /// Always "may have changed": another machine's commit on a network
    /// filesystem raises no event, so every timeout is a poll.
    func wait(timeout: Double) -> Bool {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ready = poll(&pfd, 1, Int32(max(0, timeout * 1000)))
        guard ready > 0 else { return true }
        // Drain the queue: one pull handles every event seen so far.
        var buffer = [UInt8](repeating: 0, count: 4096)
        while read(fd, &buffer, buffer.count) > 0 {}
        return true
    }

    func close() { Glibc.close(fd) }
}

extension FolderStore {
    public func watchJournal(container: String) -> (any JournalWatcher)? {
        let directory = containerDir(container).appendingPathComponent("journal").path
        return InotifyWatcher(directory: directory)
    }
}
