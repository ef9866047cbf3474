import Foundation
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

/// Placeholders that stream: a read at any offset waits for its own chunk
/// (fetched first), and a download resumes from an out-of-order partial file
/// by re-verifying every chunk in it.
@Suite struct DownloadTests {
    static let chunk = ContentLayout.chunkSize
    /// 20 chunks, each different, the last one short.
    static let data = Data((0..<(19 * chunk + 12345)).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ $0 >> 11 &+ ($0 >> 22) &* 77) })

    /// A writes `Self.data` as "big"; B (on `storeForB`) pulls it as a placeholder.
    func placeholderOnB(_ store: any Store, _ storeForB: any Store) throws -> (TestDevice, TestDevice, UInt64) {
        let a = try TestDevice(store: store, name: "a")
        let handle = try a.fs.create(parent: Namespace.rootIno, name: "big", mode: 0o644, flags: O_WRONLY, caller: .root).1.handle
        let written = try Self.data.withUnsafeBytes { raw in
            try a.fs.write(handle: handle, offset: 0, bytes: raw.baseAddress!, count: raw.count)
        }
        #expect(written == Self.data.count)
        try a.fs.flush(handle: handle)
        try a.fs.release(handle: handle)
        try a.engine.drain(progress: { _, _ in })
        let b = try TestDevice(store: storeForB, name: "b")
        try b.engine.pull()
        let ino = try b.resolve("big")
        #expect(b.replica.read { $0.node(ino)!.isPlaceholder })
        return (a, b, ino)
    }

    func read(_ device: TestDevice, _ handle: UInt64, at offset: Int, count: Int) throws -> Data {
        TestDevice.bytes(of: try device.fs.read(handle: handle, offset: Int64(offset), size: count))
    }

    @Test func aReadAtTheEndIsServedBeforeTheRest() throws {
        let store = InMemoryStore()
        let slow = FaultyStore(store)
        let (a, b, ino) = try placeholderOnB(store, slow)
        defer { a.cleanUp(); b.cleanUp() }
        slow.slowFetches(by: 0.3)
        let handle = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        defer { try? b.fs.release(handle: handle) }
        let start = Date()
        let tail = try read(b, handle, at: Self.data.count - 4096, count: 4096)
        let tailTime = Date().timeIntervalSince(start)
        #expect(tail == Self.data.suffix(4096))
        let middle = try read(b, handle, at: 6 * Self.chunk + 99, count: 70_000)
        let middleTime = Date().timeIntervalSince(start) - tailTime
        #expect(middle == Self.data.subdata(in: (6 * Self.chunk + 99)..<(6 * Self.chunk + 70_099)))
        // The manifest and the last chunk (0.6 s), then one chunk; in order, 4
        // fetches at a time (Store.downloadConcurrency), the tail would come
        // after the manifest and five rounds of fetches: 1.8 s.
        #expect(tailTime < 1.2, "the last 4 KiB after \(tailTime) s")
        #expect(middleTime < 0.9, "the middle after \(middleTime) s more")
        #expect(b.replica.read { $0.node(ino)!.isPlaceholder }, "downloaded whole already: nothing measured")
        try b.engine.download(ino: ino)
        #expect(try read(b, handle, at: 0, count: Self.data.count) == Self.data)
    }

    /// What a read says the kernel may drop (`ReadReply`'s `passed`).
    func passed(_ device: TestDevice, _ handle: UInt64, at offset: Int, count: Int) throws -> Range<Int64>? {
        switch try device.fs.read(handle: handle, offset: Int64(offset), size: count) {
        case .fileRange(_, _, _, let passed), .memory(_, let passed), .bytes(_, let passed): return passed
        }
    }

    /// A reader streaming a placeholder lets the kernel drop the pages it
    /// passed: from where its run began, 8 MiB at a time, 16 MiB behind it,
    /// whatever order the read-ahead's requests come in. A reader that jumps
    /// about drops nothing, and nor does one of a file opened with its
    /// content here (only a download puts the same bytes in two caches).
    @Test func theKernelMayDropWhatAStreamingReaderPassed() throws {
        let store = InMemoryStore()
        let (a, b, ino) = try placeholderOnB(store, store)
        defer { a.cleanUp(); b.cleanUp() }
        let streaming = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        let jumping = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        defer { try? b.fs.release(handle: streaming); try? b.fs.release(handle: jumping) }
        let mib = 1 << 20
        for offset in [40 * mib, 3 * mib, 70 * mib, 20 * mib + 4096, 60 * mib, 0, 30 * mib] {
            #expect(try passed(b, jumping, at: offset, count: 128 << 10) == nil, "a jump to \(offset) dropped pages")
        }
        // 128 KiB reads from the start, each pair answered the wrong way round.
        let piece = 128 << 10
        var dropped: [Range<Int64>] = []
        for pair in stride(from: 0, to: Self.data.count, by: 2 * piece) {
            for offset in [pair + piece, pair] where offset < Self.data.count {
                if let range = try passed(b, streaming, at: offset, count: min(piece, Self.data.count - offset)) {
                    dropped.append(range)
                }
            }
        }
        #expect(dropped.first?.lowerBound == 0)
        #expect(zip(dropped, dropped.dropFirst()).allSatisfy { $0.upperBound == $1.lowerBound }, "\(dropped)")
        #expect(dropped.allSatisfy { $0.count % (8 << 20) == 0 }, "\(dropped)")
        let lag = Int64(Self.data.count) - (dropped.last?.upperBound ?? 0)
        #expect(lag >= 16 << 20 && lag < 24 << 20, "\(lag) bytes kept behind the reader")
        #expect(try read(b, streaming, at: 0, count: Self.data.count) == Self.data)

        try b.engine.download(ino: ino)
        #expect(!b.replica.read { $0.node(ino)!.isPlaceholder })
        let local = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        defer { try? b.fs.release(handle: local) }
        for offset in stride(from: 0, to: Self.data.count, by: piece) {
            #expect(try passed(b, local, at: offset, count: piece) == nil, "a read of local content dropped pages")
        }
    }

    @Test func aResumedDownloadReverifiesEveryChunkOfAnOutOfOrderPartialFile() throws {
        let store = InMemoryStore()
        let (a, b, ino) = try placeholderOnB(store, store)
        defer { a.cleanUp(); b.cleanUp() }
        let node = b.replica.read { $0.node(ino)! }
        let partial = b.replica.cache.path(ino) + "." + String(node.hash!.prefix(16)) + ".part"
        let hashes = stride(from: 0, to: Self.data.count, by: Self.chunk).map {
            ContentCopy.hash(of: Self.data.subdata(in: $0..<min(Self.data.count, $0 + Self.chunk)))
        }
        // As a crash leaves it: chunks 19 (the last) and 4 in, chunk 6 torn, holes elsewhere.
        mkdir((partial as NSString).deletingLastPathComponent, 0o700)
        let fd = open(partial, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        #expect(fd >= 0)
        func put(_ data: Data, at offset: Int) {
            _ = data.withUnsafeBytes { pwrite(fd, $0.baseAddress!, $0.count, off_t(offset)) }
        }
        put(Self.data.subdata(in: 19 * Self.chunk..<Self.data.count), at: 19 * Self.chunk)
        put(Self.data.subdata(in: 4 * Self.chunk..<5 * Self.chunk), at: 4 * Self.chunk)
        put(Self.data.subdata(in: 6 * Self.chunk..<(6 * Self.chunk + 1000)), at: 6 * Self.chunk)
        close(fd)
        // The store lost chunk 4: only the partial file has it (so it must be used from
        // there); chunk 6's blob is there (the torn copy must not count).
        store.loseBlob(hashes[4])
        try b.engine.download(ino: ino)
        #expect(!b.replica.read { $0.node(ino)!.isPlaceholder })
        let handle = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        defer { try? b.fs.release(handle: handle) }
        #expect(try read(b, handle, at: 0, count: Self.data.count) == Self.data)
    }

    /// A and B on a folder store (cheap to fetch from again), B with a
    /// placeholder of `Self.data`, and the path of B's partial file for it.
    /// B reaches the store through `faulty`, which injects no fault until asked.
    struct OnFolderStore {
        let a: TestDevice, b: TestDevice, ino: UInt64, partial: String, root: URL
        let faulty: FaultyStore

        init(_ tests: DownloadTests) throws {
            root = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-folder-\(UUID().uuidString)")
            let store = try FolderStore(root: root, create: true, initializeEmpty: true)
            faulty = FaultyStore(store)
            let (a, b, ino) = try tests.placeholderOnB(store, faulty)
            let hash = b.replica.read { $0.node(ino)!.hash! }
            (self.a, self.b, self.ino) = (a, b, ino)
            partial = b.replica.cache.path(ino) + "." + String(hash.prefix(16)) + ".part"
        }

        /// Open B's placeholder for reading and read its first MiB (right): a stream.
        func openReadingFirstMiB() throws -> UInt64 {
            let reader = try b.fs.open(ino: ino, flags: O_RDONLY).handle
            #expect(TestDevice.bytes(of: try b.fs.read(handle: reader, offset: 0, size: 1 << 20)) == DownloadTests.data.prefix(1 << 20))
            return reader
        }

        func cleanUp() {
            a.cleanUp()
            b.cleanUp()
            try? FileManager.default.removeItem(at: root)
        }
    }

    /// B's copy, once local, is `Self.data`.
    func expectLocalCopy(_ b: TestDevice, _ ino: UInt64) throws {
        #expect(!b.replica.read { $0.node(ino)!.isPlaceholder })
        let local = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        defer { try? b.fs.release(handle: local) }
        #expect(try read(b, local, at: 0, count: Self.data.count) == Self.data)
    }

    /// Bytes of `path` the filesystem has allocated (0 for none, or no file).
    func allocated(_ path: String) -> Int {
        var st = stat()
        return stat(path, &st) == 0 ? Int(st.st_blocks) * 512 : 0
    }

    /// Wait (up to 30 s) until `ino` on `device` is downloaded.
    func waitDownloaded(_ device: TestDevice, _ ino: UInt64) -> Bool {
        for _ in 0..<3000 {
            if device.replica.read({ !$0.node(ino)!.isPlaceholder }) { return true }
            usleep(10_000)
        }
        return false
    }

    /// On a folder store, a reader streaming a placeholder is served from
    /// chunks the download holds in memory, verified: nothing is written to
    /// the cache while it reads, reads across chunks and jumps back get the
    /// right bytes, and once it closes the file is downloaded in the
    /// background.
    @Test func aStreamIsServedFromMemoryAndTheFileDownloadedAfterIt() throws {
        let setup = try OnFolderStore(self)
        defer { setup.cleanUp() }
        let (b, ino, partial) = (setup.b, setup.ino, setup.partial)
        let handle = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        var fromMemory = 0, reads = 0, mostWritten = 0
        var got = Data()
        let piece = 128 << 10
        for offset in stride(from: 0, to: Self.data.count, by: piece) {
            let reply = try b.fs.read(handle: handle, offset: Int64(offset), size: piece)
            if case .memory = reply { fromMemory += 1 }
            reads += 1
            got.append(TestDevice.bytes(of: reply))
            mostWritten = max(mostWritten, allocated(partial))
        }
        #expect(got == Self.data)
        #expect(fromMemory == reads, "\(reads - fromMemory) of \(reads) reads not served from memory")
        #expect(mostWritten == 0, "\(mostWritten) bytes written to the cache during the stream")
        // Across a chunk boundary, and back to chunks let go of (fetched again).
        let boundary = 7 * Self.chunk - 5000
        #expect(try read(b, handle, at: boundary, count: 10_000) == Self.data.subdata(in: boundary..<(boundary + 10_000)))
        #expect(try read(b, handle, at: 123, count: 4096) == Self.data.subdata(in: 123..<(123 + 4096)))
        #expect(b.replica.read { $0.node(ino)!.isPlaceholder })
        try b.fs.release(handle: handle)
        #expect(waitDownloaded(b, ino), "not downloaded after the stream closed")
        try expectLocalCopy(b, ino)
    }

    /// A stream that stops reading (a paused player) does not keep the
    /// download waiting: after 2 s it goes on and the file is downloaded,
    /// the descriptor still open, which then reads the rest from the cache.
    @Test func aPausedStreamLetsItsDownloadFinish() throws {
        let setup = try OnFolderStore(self)
        defer { setup.cleanUp() }
        let (b, ino) = (setup.b, setup.ino)
        let reader = try setup.openReadingFirstMiB()
        defer { try? b.fs.release(handle: reader) }
        #expect(waitDownloaded(b, ino), "not downloaded while the stream paused")
        var rest = Data()
        for offset in stride(from: 1 << 20, to: Self.data.count, by: 1 << 20) {
            rest.append(try read(b, reader, at: offset, count: 1 << 20))
        }
        #expect(rest == Self.data.suffix(from: 1 << 20))
    }

    /// A file opened for writing while another reader streams it is
    /// downloaded whole first: what the stream held is written, what it let
    /// go of fetched again.
    @Test func aWriterOfAStreamedPlaceholderGetsAllOfIt() throws {
        let setup = try OnFolderStore(self)
        defer { setup.cleanUp() }
        let (b, ino) = (setup.b, setup.ino)
        let reader = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        defer { try? b.fs.release(handle: reader) }
        for offset in stride(from: 0, to: 10 * Self.chunk, by: 1 << 20) {
            #expect(try read(b, reader, at: offset, count: 1 << 20) == Self.data.subdata(in: offset..<(offset + (1 << 20))))
        }
        let writer = try b.fs.open(ino: ino, flags: O_RDWR).handle
        try b.fs.release(handle: writer)
        try expectLocalCopy(b, ino)
    }

    /// A writer that opens a file evicted while a reader streams it gets all
    /// of it: what it waits for overrides the eviction.
    @Test func aWriterOfAStreamedPlaceholderEvictedMeanwhileGetsAllOfIt() throws {
        let setup = try OnFolderStore(self)
        defer { setup.cleanUp() }
        let (b, ino) = (setup.b, setup.ino)
        let reader = try setup.openReadingFirstMiB()
        defer { try? b.fs.release(handle: reader) }
        #expect(try b.engine.evict(ino: ino) == false)
        let writer = try b.fs.open(ino: ino, flags: O_RDWR).handle
        try b.fs.release(handle: writer)
        try expectLocalCopy(b, ino)
    }

    /// Evicting a placeholder stops its download, and its partial file
    /// goes: at once when nobody reads it (its reader closed: the download
    /// went on in the background), else when the last reader closes, the
    /// file never downloaded meanwhile, however long the reader pauses.
    @Test func evictingAPlaceholderStopsItsDownload() throws {
        let setup = try OnFolderStore(self)
        defer { setup.cleanUp() }
        let (b, ino, partial) = (setup.b, setup.ino, setup.partial)
        var reader = try setup.openReadingFirstMiB()
        try b.fs.release(handle: reader)
        #expect(try b.engine.evict(ino: ino) == false)
        #expect(b.engine.downloadSummary().items == 0)
        usleep(500_000)
        #expect(access(partial, F_OK) != 0, "the partial file is still there")
        #expect(b.replica.read { $0.node(ino)!.isPlaceholder })
        // Evicted while a reader streams it: it reads on, and the download stops when it closes.
        reader = try setup.openReadingFirstMiB()
        #expect(try b.engine.evict(ino: ino) == false)
        // A pause longer than `idleStream` does not let the evicted file download.
        usleep(2_500_000)
        #expect(b.replica.read { $0.node(ino)!.isPlaceholder })
        let far = 12 * Self.chunk
        #expect(try read(b, reader, at: far, count: 1 << 20) == Self.data.subdata(in: far..<(far + (1 << 20))))
        #expect(b.engine.downloadSummary().items == 1)
        try b.fs.release(handle: reader)
        #expect(b.engine.downloadSummary().items == 0)
        usleep(500_000)
        #expect(access(partial, F_OK) != 0, "the partial file is still there")
        #expect(b.replica.read { $0.node(ino)!.isPlaceholder })
        // It downloads again when asked.
        try b.engine.download(ino: ino)
        try expectLocalCopy(b, ino)
    }

    /// The store fails while a stream holds chunks: the reader gets `EIO`
    /// for what it has not been served, never other bytes, and what it was
    /// served stays right; once the store is back, a new reader gets the
    /// whole file and it is downloaded.
    @Test func aStoreFailingUnderAStreamServesNothingElse() throws {
        let setup = try OnFolderStore(self)
        defer { setup.cleanUp() }
        let (b, ino) = (setup.b, setup.ino)
        var reader = try setup.openReadingFirstMiB()
        setup.faulty.fail([.fetchBlob])
        let far = 15 * Self.chunk
        #expect(throws: UbiquityError.self) { try read(b, reader, at: far, count: 4096) }
        try b.fs.release(handle: reader)
        #expect(b.replica.read { $0.node(ino)!.isPlaceholder })
        #expect(b.engine.downloadSummary().items == 0, "a failed download still counts as under way")
        setup.faulty.fail([])
        reader = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        #expect(try read(b, reader, at: far, count: 4096) == Self.data.subdata(in: far..<(far + 4096)))
        #expect(try read(b, reader, at: 0, count: Self.data.count) == Self.data)
        try b.fs.release(handle: reader)
        #expect(waitDownloaded(b, ino), "not downloaded once the store was back")
        try expectLocalCopy(b, ino)
    }

    /// A chunk damaged in the store is never served to a stream, nor held:
    /// its reader gets `EIO`, and the file stays a placeholder.
    @Test func aDamagedChunkIsNotServedToAStream() throws {
        let setup = try OnFolderStore(self)
        defer { setup.cleanUp() }
        let (b, ino) = (setup.b, setup.ino)
        let manifest = try ChunkManifest.decode(try setup.faulty.fetchBlob(b.replica.read { $0.node(ino)!.hash! }))
        let damaged = manifest.chunks[9]
        let path = setup.root.appendingPathComponent("blobs/\(damaged.prefix(2))/\(damaged)").path
        let fd = open(path, O_WRONLY)
        #expect(fd >= 0, "no blob file at \(path)")
        #expect(pwrite(fd, "not the blob", 12, 1000) == 12)
        close(fd)
        let reader = try b.fs.open(ino: ino, flags: O_RDONLY).handle
        defer { try? b.fs.release(handle: reader) }
        // Chunk 9 is beyond the read-ahead of a reader of the first MiB (6 chunks).
        #expect(try read(b, reader, at: 0, count: 1 << 20) == Self.data.prefix(1 << 20))
        let error = #expect(throws: UbiquityError.self) { try read(b, reader, at: 9 * Self.chunk, count: 4096) }
        #expect(error?.errno == EIO)
        #expect(b.replica.read { $0.node(ino)!.isPlaceholder })
    }
}
