import Foundation
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityLinux
#if canImport(Glibc)
import Glibc
#endif

/// Whether the store still holds what this device holds, and putting back
/// what it lost.
///
/// A store can lose blobs: a damaged disk, a folder restored from an older
/// backup, a blob cut short. A device that holds the content locally is then
/// the last copy, so before it drops one (`evict`, the cache limit) it asks
/// the store: every blob of the version present with the right size
/// (`Store.blobSize`, a `stat`; a chunked version also has its small
/// manifest read and verified). What is missing is uploaded again from the
/// local copy — after checking that copy against the version's hash, so only
/// the right bytes are ever put back. The same check runs once for every
/// file this device holds when a container is opened (`checkHeldContent`),
/// so a store restored from a backup gets back what the devices still have.
///
/// Not detected: a blob of the right size whose bytes rotted (that would take
/// reading every blob). Downloads verify every blob, so such a blob is never
/// served; the device that still holds the content can put it back when it
/// next notices (an eviction refused, a mount).
extension SyncEngine {
    /// What checking one file's content in the store found.
    public enum StoreCopyCheck: Sendable, Equatable {
        /// The store holds every blob, with the right size.
        case intact
        /// The store lacked these blobs (for people: which, and what was wrong);
        /// they were uploaded again from this device's copy.
        case repaired([String])
    }

    /// Check that the store holds version `node.hash` of file `node` and put
    /// back what it lacks from the local copy (which must be that version).
    /// With `verifyLocal`, the local copy is read and checked even when the
    /// store lacks nothing (a copy never verified). On success the copy is
    /// recorded as verified. Throws `EIO` when the local copy is not that
    /// version, `EAGAIN` when the file changed while it was read, the store's
    /// error (`EHOSTDOWN`…) when it cannot be asked.
    public func checkStoreCopy(of node: LocalNode, verifyLocal: Bool) throws -> StoreCopyCheck {
        guard let hash = node.hash else { return .intact }   // empty content: nothing to hold
        let size = node.hashSize
        var problems: [String] = []
        var manifest: ChunkManifest?
        var missingChunks = Set<Int>()
        var topMissing = false   // the single blob, or the manifest
        func describe(_ blob: String, _ stored: UInt64?, _ expected: Int) -> String {
            stored.map { "blob \(blob.prefix(12))… has \($0) bytes instead of \(expected)" } ?? "blob \(blob.prefix(12))… is missing"
        }
        if node.chunked {
            do {
                let found = try ChunkManifest.decode(try store.fetchBlob(hash))
                guard found.size == size, found.chunkSize > 0 else {
                    throw UbiquityError(EIO, "chunk manifest \(hash.prefix(12))… does not describe \(size) bytes")
                }
                manifest = found
                for (index, chunk) in found.chunks.enumerated() {
                    let count = Int(min(found.chunkSize, size - UInt64(index) * found.chunkSize))
                    let stored = try store.blobSize(chunk)
                    if stored != UInt64(count) {
                        missingChunks.insert(index)
                        problems.append(describe(chunk, stored, count))
                    }
                }
            } catch let error as UbiquityError where error.errno == EIO {
                topMissing = true
                problems.append("its chunk manifest \(hash.prefix(12))… is missing or damaged")
            }
        } else if let pack = packs.location(of: hash), let packSize = try store.blobSize(pack.hash), packSize >= pack.offset + size {
            // In a pack the store holds, long enough (its bytes are verified when read).
        } else {
            // Not packed, or its pack is lost or cut short: a blob of its own
            // must be there (put back below; downloads fall back to it).
            let stored = try store.blobSize(hash)
            if stored != size {
                topMissing = true
                problems.append(describe(hash, stored, Int(size)))
            }
        }
        if problems.isEmpty && !verifyLocal { return .intact }

        // Read the local copy: check it is this version, and upload what the store lacks.
        let reader = try CacheFileReader(path: replica.cache.path(node.ino))
        defer { reader.close() }
        func notThisVersion(_ what: String) throws -> Never {
            // A writer may have changed the file while it was read: then nothing is wrong with it.
            if !unchanged(node) { throw UbiquityError(EAGAIN, "it changed while its copy in the store was checked") }
            throw UbiquityError(EIO, "the local copy is not the version the store should hold (\(what)); it is kept")
        }
        guard UInt64(reader.size) == size else { try notThisVersion("\(reader.size) bytes instead of \(size)") }
        var uploaded = false
        if !node.chunked {
            guard let data = try reader.read(at: 0, count: reader.size), ContentCopy.hash(of: data) == hash else {
                try notThisVersion("its hash differs")
            }
            if topMissing {
                try store.putBlob(hash, data: data)
                uploaded = true
            }
        } else {
            let chunkSize = Int(manifest?.chunkSize ?? UInt64(ContentLayout.chunkSize))
            var hashes: [String] = []
            var offset = 0
            while offset < reader.size {
                let count = min(chunkSize, reader.size - offset)
                guard let data = try reader.read(at: offset, count: count) else { try notThisVersion("it shrank") }
                let chunkHash = ContentCopy.hash(of: data)
                let index = hashes.count
                if let manifest, chunkHash != manifest.chunks[index] { try notThisVersion("chunk \(index + 1) differs") }
                // Content-addressed: a chunk is put under the hash of exactly its bytes.
                let lacking = try missingChunks.contains(index) || (manifest == nil && !store.holdsBlob(chunkHash, size: count))
                if lacking {
                    try store.putBlob(chunkHash, data: data)
                    uploaded = true
                }
                hashes.append(chunkHash)
                offset += count
            }
            if manifest == nil {
                let rebuilt = try ChunkManifest(chunkSize: UInt64(chunkSize), size: size, chunks: hashes).encoded()
                guard ContentCopy.hash(of: rebuilt) == hash else { try notThisVersion("its chunks make another manifest") }
                try store.putBlob(hash, data: rebuilt)
                uploaded = true
            }
        }
        if uploaded { try store.flushBlobs() }
        guard unchanged(node) else { throw UbiquityError(EAGAIN, "it changed while its copy in the store was checked") }
        replica.record { ns in
            if ns.node(node.ino)?.verifiedHash != hash { ns.update(node.ino, local: false) { $0.verifiedHash = hash } }
        }
        try replica.persist()
        if !problems.isEmpty {
            let path = replica.read { ns in ns.path(of: node.ino) } ?? "inode \(node.ino)"
            logger.warning("the store had lost part of \(path) (\(problems.joined(separator: "; "))); uploaded again from this device")
        }
        return problems.isEmpty ? .intact : .repaired(problems)
    }

    /// `node`'s content is still the same (no writer, same generation, epoch and version).
    func unchanged(_ node: LocalNode) -> Bool {
        replica.read { ns in
            guard let now = ns.node(node.ino) else { return false }
            return now.hasContent && now.openWriters == 0 && now.contentGeneration == node.contentGeneration
                && now.contentEpoch == node.contentEpoch && now.hash == node.hash
        }
    }

    /// Check every file this device holds, unchanged since it was pushed or
    /// downloaded, against the store, and put back what the store lost (see
    /// the type's notes). Runs once when the container is opened, on its own
    /// low-priority thread; a store that cannot be reached ends the round
    /// (the next mount checks again).
    public func checkHeldContent() {
        LinuxCalls.lowerThreadPriority()
        let files = replica.read { ns in
            ns.nodes.values.filter { Self.isSettledLocalCopy($0) }.map(\.ino).sorted()
        }
        var repaired = 0
        var failed = 0
        for ino in files {
            if stopped.withLock({ $0 }) { return }
            guard let node = replica.read({ ns in ns.node(ino) }), Self.isSettledLocalCopy(node) else { continue }
            do {
                if case .repaired = try checkStoreCopy(of: node, verifyLocal: false) { repaired += 1 }
            } catch let error as UbiquityError where error.errno == EHOSTDOWN {
                logger.info("the store is not reachable: the check of local copies waits for the next mount")
                return
            } catch {
                failed += 1
                let path = replica.read { ns in ns.path(of: ino) } ?? "inode \(ino)"
                logger.warning("checking the store's copy of \(path): \(UbiquityError.wrap(error))")
            }
        }
        logger.info("checked the store's copies of \(files.count) local files: \(repaired) put back, \(failed) could not be checked")
    }

    /// A local copy of a version the store should hold: pushed or downloaded,
    /// and not written since.
    static func isSettledLocalCopy(_ node: LocalNode) -> Bool {
        node.kind == .file && node.hasContent && !node.unlinked && node.hash != nil
            && !node.hasUnpushedContent && !node.unacknowledgedWrites
    }
}

/// A cache file read chunk by chunk (`pread`, retrying `EINTR`).
struct CacheFileReader {
    let fd: Int32
    let size: Int

    init(path: String) throws {
        fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw UbiquityError.posix("open \(path)") }
        var st = stat()
        guard fstat(fd, &st) == 0 else {
            let error = UbiquityError.posix("stat \(path)")
            Glibc.close(fd)
            throw error
        }
        size = Int(st.st_size)
    }

    func close() { Glibc.close(fd) }

    /// Exactly `count` bytes at `offset`, or nil if the file is shorter now.
    func read(at offset: Int, count: Int) throws -> Data? {
        var data = Data(count: count)
        var done = 0
        try data.withUnsafeMutableBytes { raw in
            while done < count {
                let n = try syscallRetrying("read cache file") {
                    pread(fd, raw.baseAddress! + done, count - done, off_t(offset + done))
                }
                if n == 0 { break }
                done += n
            }
        }
        return done == count ? data : nil
    }

    /// The content hash the push would give this file (one blob up to a
    /// chunk, else the hash of its chunk manifest), or nil if it changed size
    /// while read.
    func contentHash() throws -> String? {
        let chunkSize = ContentLayout.chunkSize
        if size <= chunkSize { return try read(at: 0, count: size).map(ContentCopy.hash(of:)) }
        var chunks: [String] = []
        var offset = 0
        while offset < size {
            let count = min(chunkSize, size - offset)
            guard let data = try read(at: offset, count: count) else { return nil }
            chunks.append(ContentCopy.hash(of: data))
            offset += count
        }
        return ContentCopy.hash(of: try ChunkManifest(chunkSize: UInt64(chunkSize), size: UInt64(size), chunks: chunks).encoded())
    }
}
