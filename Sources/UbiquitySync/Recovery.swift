import Foundation
import UbiquityReplica
import UbiquityModel
import UbiquityLinux

/// Crash recovery never replaces a good version with a torn write.
///
/// A file of the store's (`version > 0`) carries a persistent mark from the
/// moment it is opened for writing — and again from the first write after a
/// `close` or `fsync` — until its writes are acknowledged (`close`, `fsync`,
/// the last writer gone): `LocalNode.unacknowledgedWrites`. If the daemon dies
/// (`kill -9`, a crash, power) while it is set, the cache file may hold a
/// half-written rewrite (the 95 MB prefix of a 200 MB write). At the next
/// start, before pulling or serving, each marked file is split like a
/// conflict:
///
/// - the inode that was being written keeps its content and becomes a new
///   file, `NAME (recovered copy DEVICE YYYY-MM-DD HHMMSS).EXT` beside the
///   first name of the original, pushed like any new file;
/// - the name(s) get the last good version back — the version the store
///   has (`hash`), as a placeholder under a new inode number, downloaded
///   when opened — with the copy recorded as a conflict version of it
///   (`versions` and `resolve` work on it).
///
/// Not split: a file whose content is the good version after all (opened for
/// writing, nothing written), a file never pushed (no good version to protect:
/// it is kept under its name and pushed — new files are never marked), and
/// unlinked files (their deletion is pushed). What `close`/`fsync`
/// acknowledged before the crash is in the recovered copy (with the
/// unacknowledged writes made after it): the name holds what the store held.
///
/// The mark is written to the operation log before the first write, but not
/// synced (that would cost a disk flush per write session): a daemon that
/// dies leaves it in the page cache, but a power cut may keep the file's new
/// bytes and lose the mark. So when the machine went down while the replica
/// was open (`Replica.openedAfterSystemCrash`), every local copy the index
/// calls the store's version is hashed first, and one that is not that
/// version is marked and split like the others.
extension SyncEngine {
    /// Split every file the daemon was writing when it died (see above).
    /// Call once, after opening the replica and before pulling, pushing or
    /// serving it. Returns the inodes of the recovered copies.
    @discardableResult
    public func recoverInterruptedWrites(date: Date = Date()) throws -> [UInt64] {
        if replica.openedAfterSystemCrash {
            try replaceLostCacheFiles()
            try markCopiesThatAreNotTheStoresVersion()
        }
        let marked = replica.read { ns in ns.nodes.values.filter(\.unacknowledgedWrites).map(\.ino).sorted() }
        guard !marked.isEmpty else { return [] }
        var copies: [UInt64] = []
        var refresh: [UInt64] = []
        for ino in marked {
            guard let node = replica.read({ ns in ns.node(ino) }) else { continue }
            let torn = node.kind == .file && node.hasContent && !node.unlinked && node.version > 0
                && FileManager.default.fileExists(atPath: replica.cache.path(ino)) && !localCopyIsGoodVersion(node)
            let result = replica.record { ns -> (copy: UInt64, good: UInt64, name: FileName)? in
                let places = ns.entriesNaming(ino)
                guard torn, let first = places.first else {
                    ns.update(ino, local: false) { $0.unacknowledgedWrites = false }
                    return nil
                }
                // The inode that was being written becomes a new node (content and all).
                let copyID = NodeID.next()
                ns.rekey(ino, to: copyID)
                ns.update(ino, local: false) { n in
                    n.unacknowledgedWrites = false
                    n.conflicts = []
                    n.author = device.name
                }
                // The node's ID gets the last good version back, under a new inode.
                let good = ns.createNode(id: node.id, kind: .file, mode: node.mode, uid: node.uid, gid: node.gid,
                                         time: node.mtime, local: false)
                ns.update(good, local: true) { n in
                    n.atime = node.atime; n.ctime = node.ctime; n.btime = node.btime
                    n.xattrs = node.xattrs
                    n.hash = node.hash; n.hashSize = node.hashSize; n.chunked = node.chunked; n.size = node.hashSize
                    n.hasContent = false
                    n.version = node.version
                    n.pinned = node.pinned
                    n.author = node.author
                    n.conflicts = node.conflicts + [copyID]
                }
                ns.rebasePendingEntries(from: ino, to: good)
                for place in places {
                    ns.unlinkEntry(place.parent, place.name, local: false)
                    ns.linkEntry(place.parent, place.name, good, local: false)
                }
                let name = ChangeApplier.copyName(first.name, label: "recovered copy", deviceName: device.name,
                                                  date: date, in: first.parent, ns: ns)
                ns.linkEntry(first.parent, name, ino, local: true)
                return (ino, good, name)
            }
            guard let result else { continue }
            copies.append(result.copy)
            let path = replica.read { ns in ns.path(of: result.good) } ?? "inode \(result.good)"
            logger.warning("\(path) was being written when the daemon stopped: the last good version keeps the name, what was written is kept beside it as '\(result.name)'")
            if replica.read({ ns in ns.isPinned(result.good) }) { refresh.append(result.good) }
        }
        try replica.persist()
        for ino in refresh { startDownload(ino: ino, background: true) }
        return copies
    }

    /// After a power cut: files whose cache file never reached the disk,
    /// although the operation log that names them did (another file's
    /// `fsync` synced it; a journaled `fsync` does not sync cache folders,
    /// and nobody synced these files). A file the store never had becomes
    /// empty, as a file written and never synced does on ext4; one the store
    /// has gets the store's version back, as a placeholder.
    func replaceLostCacheFiles() throws {
        let local = replica.read { ns in
            ns.nodes.values.filter { $0.kind == .file && $0.hasContent }.map { ($0.ino, $0.version) }
        }
        var emptied = 0, refetched = 0
        for (ino, version) in local where access(replica.cache.path(ino), F_OK) != 0 && errno == ENOENT {
            if version == 0 {
                close(try replica.cache.create(ino))
                replica.record { ns in ns.contentChanged(ino, size: 0, time: nil, monotonic: MonotonicClock.now()) }
                emptied += 1
            } else {
                replica.record { ns in
                    ns.update(ino, local: false) { n in
                        n.hasContent = false
                        n.size = n.hashSize
                        n.contentGeneration = n.pushedGeneration
                        n.contentEpoch &+= 1
                    }
                }
                refetched += 1
            }
        }
        guard emptied + refetched > 0 else { return }
        try replica.persist()
        logger.warning("the machine went down before \(emptied + refetched) files' content reached the disk (never synced): \(emptied) new ones are empty, \(refetched) show the store's version again")
    }

    /// After a power cut: mark every local copy that should be the store's
    /// version but is not (see above).
    func markCopiesThatAreNotTheStoresVersion() throws {
        let started = Date()
        let clean = replica.read { ns in
            ns.nodes.values.filter {
                $0.kind == .file && $0.hasContent && !$0.unlinked && $0.version > 0
                    && !$0.hasUnpushedContent && !$0.unacknowledgedWrites
            }
        }
        var checked = 0, bytes: UInt64 = 0, differing = 0
        for node in clean {
            checked += 1
            bytes += node.hashSize
            guard !localCopyIsGoodVersion(node) else { continue }
            differing += 1
            replica.record { ns in ns.update(node.ino, local: false) { $0.unacknowledgedWrites = true } }
        }
        try replica.persist()
        try replica.makeDurable()
        try replica.checkedAfterSystemCrash()
        logger.warning("the machine went down while this replica was open: checked \(checked) local copies (\(bytes) bytes) against the store's versions in \(String(format: "%.1f", Date().timeIntervalSince(started))) s; \(differing) differed and are kept as recovered copies")
    }

    /// The local copy of `node` is its last synced version (`hash`): opened
    /// for writing, but nothing was changed.
    func localCopyIsGoodVersion(_ node: LocalNode) -> Bool {
        guard let reader = try? CacheFileReader(path: replica.cache.path(node.ino)) else { return false }
        defer { reader.close() }
        guard UInt64(reader.size) == node.hashSize else { return false }
        guard let hash = node.hash else { return reader.size == 0 }
        return (try? reader.contentHash()) == hash
    }
}
