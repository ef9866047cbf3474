import Foundation
import UbiquityLocks
import Testing
import UbiquityS3
import UbiquityModel
import UbiquityStore
import UbiquityTesting
#if canImport(Glibc)
import Glibc
#endif

/// One store test suite for every `Store`: the in-memory store (the
/// reference the core tests run on), the folder store, and each S3
/// server that `Tests/run-all.sh` started (`UBIQUITYFS_TEST_S3_SERVERS`: a
/// comma-separated list of the `server.json` files `Tests/servers/s3servers.py`
/// writes). Each test gets a fresh store (a temporary folder, a fresh prefix).
enum StoreKind: CustomTestStringConvertible, Sendable {
    case memory
    case folder
    case s3(name: String, server: S3TestServer)

    var testDescription: String {
        switch self {
        case .memory: "memory"
        case .folder: "folder"
        case .s3(let name, _): name
        }
    }

    static var all: [StoreKind] { [.memory, .folder] + S3TestServer.configured.map { .s3(name: $0.kind, server: $0) } }
}

/// A server from `Tests/servers/s3servers.py` (its JSON).
struct S3TestServer: Decodable, Sendable {
    var kind: String
    var endpoint: String
    var region: String
    var bucket: String
    var access_key: String
    var secret_key: String

    static let configured: [S3TestServer] = {
        guard let list = ProcessInfo.processInfo.environment["UBIQUITYFS_TEST_S3_SERVERS"], !list.isEmpty else { return [] }
        return list.split(separator: ",").map { path in
            guard let data = FileManager.default.contents(atPath: String(path)),
                  let server = try? JSONDecoder().decode(S3TestServer.self, from: data) else {
                fatalError("UBIQUITYFS_TEST_S3_SERVERS names \(path), which is not a server.json")
            }
            return server
        }
    }()

    var credentials: AWSCredentials { AWSCredentials(accessKeyID: access_key, secretAccessKey: secret_key, source: "test") }

    func location(prefix: String) throws -> S3Location {
        try S3Location(url: "s3://\(bucket)/\(prefix)", endpoint: endpoint, region: region)
    }
}

/// A fresh store of one kind, and raw access to what it holds.
struct StoreUnderTest {
    let kind: StoreKind
    let store: any Store
    let folder: URL?
    let prefix: String

    init(_ kind: StoreKind) throws {
        self.kind = kind
        prefix = "conformance-\(UUID().uuidString.lowercased())"
        switch kind {
        case .memory:
            folder = nil
            store = InMemoryStore()
        case .folder:
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent(prefix)
            folder = dir
            store = try FolderStore(root: dir, create: true, initializeEmpty: true)
        case .s3(_, let server):
            folder = nil
            store = try S3Store(location: try server.location(prefix: prefix), credentials: server.credentials, knownStoreID: nil)
        }
    }

    /// Another client of the same store (a second device).
    func reopen() throws -> any Store {
        switch kind {
        case .memory: return store   // one store in memory: every "device" shares it
        case .folder: return try FolderStore(root: folder!, create: false, initializeEmpty: false)
        case .s3(_, let server):
            return try S3Store(location: try server.location(prefix: prefix), credentials: server.credentials, knownStoreID: store.storeID)
        }
    }

    /// Write raw bytes at a store-relative key (damage, hostile records).
    /// False when the store cannot hold those bytes there (the in-memory
    /// store keeps configurations as values): the test then skips that part.
    @discardableResult
    func writeRaw(_ key: String, _ data: Data) throws -> Bool {
        switch kind {
        case .memory:
            return (store as! InMemoryStore).writeRaw(key, data)
        case .folder:
            let url = folder!.appendingPathComponent(key)
            try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try data.write(to: url)
        case .s3:
            let s3 = store as! S3Store
            _ = try s3.client.send(.PUT, key: s3.client.location.prefix + key, body: data)
        }
        return true
    }

    /// The key of journal record `seq` of `container`, relative to the store.
    func journalKey(_ container: String, _ seq: UInt64) -> String {
        let number = String(repeating: "0", count: 16 - String(seq).count) + String(seq)
        switch kind {
        case .memory, .folder: return "containers/\(container)/journal/\(number)"
        case .s3: return "containers/\(container.utf8.map { String(format: "%02x", $0) }.joined())/journal/\(number)"
        }
    }

    /// The key of snapshot record `seq` of `container`, relative to the store.
    func snapshotKey(_ container: String, _ seq: UInt64) -> String {
        journalKey(container, seq).replacingOccurrences(of: "/journal/", with: "/snapshots/")
    }

    func cleanUp() {
        if let folder { try? FileManager.default.removeItem(at: folder) }
    }
}

func changeSet(_ device: String, _ n: Int = 0) -> ChangeSet {
    ChangeSet(device: device, deviceName: "dev-\(n)", changes: [])
}

@Suite(.serialized) struct StoreConformanceTests {
    @Test(arguments: StoreKind.all) func theMarkerNamesOneStore(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        #expect(RecordFormat.isValidID(s.store.storeID))
        #expect(try s.reopen().storeID == s.store.storeID)
        #expect(s.store.isReachable)
    }

    @Test(arguments: StoreKind.all) func containersAreCreatedOnceAndListed(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        // IDs with characters that sort before "/" ('.', '-'), and one that is a prefix of another.
        let ids = ["com.a", "com.a.b", "com.a-b", "a_b", "com.ab"]
        for id in ids { try s.store.createContainer(ContainerConfig(id: id, displayName: "Name \(id)")) }
        #expect(throws: UbiquityError.self) { try s.store.createContainer(ContainerConfig(id: "com.a", displayName: "again")) }
        do {
            try s.store.createContainer(ContainerConfig(id: "com.a", displayName: "again"))
        } catch let error as UbiquityError {
            #expect(error.errno == EEXIST)
        }
        let listing = try s.reopen().containers()
        #expect(listing.configs.map(\.id).sorted() == ids.sorted())
        #expect(listing.damaged.isEmpty)
        #expect(try s.store.containerConfig("com.a.b")?.displayName == "Name com.a.b")
        #expect(try s.store.containerConfig("com.missing") == nil)
        var changed = try #require(try s.store.containerConfig("com.a"))
        changed.documentScopePublic = true
        try s.store.updateContainer(changed)
        #expect(try s.reopen().containerConfig("com.a")?.documentScopePublic == true)
    }

    @Test(arguments: StoreKind.all) func aDamagedContainerConfigIsListedAsDamaged(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        try s.store.createContainer(ContainerConfig(id: "com.good", displayName: "Good"))
        try s.store.createContainer(ContainerConfig(id: "com.bad", displayName: "Bad"))
        let badKey = s.journalKey("com.bad", 1).replacingOccurrences(of: "journal/0000000000000001", with: "container.json")
        // (The in-memory store holds configurations as values: nothing to damage.)
        guard try s.writeRaw(badKey, Data("{not json".utf8)) else { return }
        let listing = try s.store.containers()
        #expect(listing.configs.map(\.id) == ["com.good"])
        #expect(listing.damaged.map(\.id) == ["com.bad"])
    }

    @Test(arguments: StoreKind.all) func theJournalIsReadInOrderFromAnyPoint(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        try s.store.createContainer(ContainerConfig(id: "com.j", displayName: "J"))
        #expect(try s.store.journal(container: "com.j", after: 0, limit: 10).isEmpty)
        for seq in 1...300 { #expect(try s.store.commit(container: "com.j", seq: UInt64(seq), changeSet: changeSet("d", seq))) }
        let other = try s.reopen()
        let all = try other.journal(container: "com.j", after: 0, limit: 1000)
        #expect(all.map(\.seq) == Array(1...300).map(UInt64.init))
        #expect(all.allSatisfy { $0.changeSet?.deviceName == "dev-\($0.seq)" })
        let some = try other.journal(container: "com.j", after: 250, limit: 20)
        #expect(some.map(\.seq) == Array(251...270).map(UInt64.init))
        #expect(try other.journal(container: "com.j", after: 300, limit: 10).isEmpty)
        #expect(try other.journal(container: "com.j", after: 299, limit: 10).map(\.seq) == [300])
    }

    /// The collector's side of compaction: the base reads 0 until set, then
    /// what was set (by any client); records and snapshots are removed
    /// (removing one that is gone is no error); a damaged base is an error
    /// naming it, never 0.
    @Test(arguments: StoreKind.all) func theJournalBaseIsSetAndRecordsRemoved(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        try s.store.createContainer(ContainerConfig(id: "com.base", displayName: "Base"))
        #expect(s.store.compactsJournal)
        #expect(try s.store.journalBase(container: "com.base") == 0)
        for seq in 1...5 { #expect(try s.store.commit(container: "com.base", seq: UInt64(seq), changeSet: changeSet("d", seq))) }
        let part = ContentCopy.hash(of: Data("part".utf8))
        #expect(try s.store.publishSnapshot(container: "com.base", SnapshotRecord(seq: 2, device: "a", deviceName: "a", nodes: 1, parts: [part])))
        #expect(try s.store.publishSnapshot(container: "com.base", SnapshotRecord(seq: 3, device: "a", deviceName: "a", nodes: 1, parts: [part])))
        try s.store.setJournalBase(container: "com.base", 3)
        #expect(try s.reopen().journalBase(container: "com.base") == 3)
        for seq: UInt64 in [1, 2, 3, 3] { try s.store.removeRecord(container: "com.base", seq: seq) }
        try s.store.removeSnapshot(container: "com.base", seq: 2)
        try s.store.removeSnapshot(container: "com.base", seq: 2)
        let other = try s.reopen()
        #expect(try other.journal(container: "com.base", after: 0, limit: 10).isEmpty)
        #expect(try other.journal(container: "com.base", after: 3, limit: 10).map(\.seq) == [4, 5])
        #expect(try other.snapshots(container: "com.base") == [3])
        // A removed number can be taken again: this is why committers read the base after creating a record.
        #expect(try other.commit(container: "com.base", seq: 2, changeSet: changeSet("late")))
        let base = s.journalKey("com.base", 1).replacingOccurrences(of: "/journal/0000000000000001", with: "/journal-base")
        try s.writeRaw(base, Data("{\"base\": ".utf8))
        do {
            _ = try other.journalBase(container: "com.base")
            Issue.record("a damaged base was read")
        } catch let error as UbiquityError {
            #expect(error.errno == EBADMSG)
            #expect(error.message.contains("journal-base"))
        }
    }

    @Test(arguments: StoreKind.all) func aTakenNumberIsRefused(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        try s.store.createContainer(ContainerConfig(id: "com.c", displayName: "C"))
        #expect(try s.store.commit(container: "com.c", seq: 1, changeSet: changeSet("a")))
        #expect(try !s.reopen().commit(container: "com.c", seq: 1, changeSet: changeSet("b")))
        #expect(try s.store.journal(container: "com.c", after: 0, limit: 5).first?.changeSet?.device == "a")
    }

    /// Eight devices race for each of ten numbers: exactly one wins each.
    @Test(arguments: StoreKind.all) func exactlyOneDeviceWinsARace(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        try s.store.createContainer(ContainerConfig(id: "com.race", displayName: "Race"))
        let devices = try (0..<8).map { _ in try s.reopen() }
        for seq in 1...10 {
            let winners = Lock<[Int]>([])
            let failures = Lock<[String]>([])
            DispatchQueue.concurrentPerform(iterations: devices.count) { i in
                do {
                    if try devices[i].commit(container: "com.race", seq: UInt64(seq), changeSet: changeSet("device-\(i)")) {
                        winners.withLock { $0.append(i) }
                    }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            }
            #expect(failures.withLock { $0 } == [])
            let won = winners.withLock { $0 }
            #expect(won.count == 1, "seq \(seq): winners \(won)")
            let stored = try s.store.journal(container: "com.race", after: UInt64(seq - 1), limit: 1)
            #expect(stored.first?.changeSet?.device == won.first.map { "device-\($0)" })
        }
    }

    @Test(arguments: StoreKind.all) func aRecordThatIsNotAChangeSetIsInvalidNotAnError(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        try s.store.createContainer(ContainerConfig(id: "com.bad", displayName: "Bad"))
        #expect(try s.store.commit(container: "com.bad", seq: 1, changeSet: changeSet("a")))
        try s.writeRaw(s.journalKey("com.bad", 2), Data("{\"version\": 1, \"dev".utf8))
        #expect(try s.store.commit(container: "com.bad", seq: 3, changeSet: changeSet("a")))
        let records = try s.store.journal(container: "com.bad", after: 0, limit: 10)
        #expect(records.map(\.seq) == [1, 2, 3])
        #expect(records[1].changeSet == nil)
        if case .invalid = records[1].content {} else { Issue.record("record 2 should be invalid") }
        #expect(try !s.store.commit(container: "com.bad", seq: 2, changeSet: changeSet("b")))
    }

    @Test(arguments: StoreKind.all) func snapshotsArePublishedOnceListedAndChecked(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        try s.store.createContainer(ContainerConfig(id: "com.snap-shot.x", displayName: "Snap"))
        #expect(try s.store.snapshots(container: "com.snap-shot.x") == [])
        #expect(try s.store.snapshot(container: "com.snap-shot.x", seq: 5) == nil)
        let part = ContentCopy.hash(of: Data("part".utf8))
        let first = SnapshotRecord(seq: 1000, device: "a", deviceName: "dev-a", nodes: 3, parts: [part])
        #expect(try s.store.publishSnapshot(container: "com.snap-shot.x", first))
        // One per record: a second device's snapshot of the same record is refused.
        let other = SnapshotRecord(seq: 1000, device: "b", deviceName: "dev-b", nodes: 3, parts: [part])
        #expect(try !s.reopen().publishSnapshot(container: "com.snap-shot.x", other))
        #expect(try s.store.publishSnapshot(container: "com.snap-shot.x",
                                            SnapshotRecord(seq: 20, device: "a", deviceName: "dev-a", nodes: 1, parts: [part])))
        #expect(try s.reopen().snapshots(container: "com.snap-shot.x") == [20, 1000])
        #expect(try s.reopen().snapshot(container: "com.snap-shot.x", seq: 1000) == first)
        // Damaged, or of another record than its key: an error naming it, never a snapshot.
        try s.writeRaw(s.snapshotKey("com.snap-shot.x", 30), Data("{\"version\": 1, \"seq".utf8))
        try s.writeRaw(s.snapshotKey("com.snap-shot.x", 40), try first.encoded())
        #expect(try s.store.snapshots(container: "com.snap-shot.x") == [20, 30, 40, 1000])
        for seq: UInt64 in [30, 40] {
            do {
                _ = try s.store.snapshot(container: "com.snap-shot.x", seq: seq)
                Issue.record("damaged snapshot \(seq) was read")
            } catch let error as UbiquityError {
                #expect(error.errno == EBADMSG)
                #expect(error.message.contains("snapshot record \(seq)"))
            }
        }
    }

    @Test(arguments: StoreKind.all) func blobsAreVerifiedWhenRead(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        let data = Data((0..<100_000).map { UInt8(truncatingIfNeeded: $0 * 7) })
        let hash = ContentCopy.hash(of: data)
        #expect(try s.store.blobSize(hash) == nil)
        try s.store.putBlob(hash, data: data)
        try s.store.putBlob(hash, data: data)   // again: harmless
        try s.store.flushBlobs()
        #expect(try s.store.blobSize(hash) == 100_000)
        #expect(try s.reopen().fetchBlob(hash) == data)
        // Damaged in the store: an error, never data.
        try s.writeRaw("blobs/\(hash.prefix(2))/\(hash)", Data("not the content".utf8))
        #expect(throws: UbiquityError.self) { try s.store.fetchBlob(hash) }
        // Put again: the damaged copy is replaced.
        try s.store.putBlob(hash, data: data)
        #expect(try s.store.fetchBlob(hash) == data)
        let missing = ContentCopy.hash(of: Data("missing".utf8))
        do {
            _ = try s.store.fetchBlob(missing)
            Issue.record("a missing blob was read")
        } catch let error as UbiquityError {
            #expect(error.errno == EIO)
            #expect(error.store == .damaged && error.fileOperationErrno == EIO)
        }
    }

    /// `copyBlob` puts the verified blob at an offset of a file; a blob of
    /// the wrong size or content, or a missing one, is `EIO` (whatever bytes
    /// it left are never called verified).
    @Test(arguments: StoreKind.all) func blobsAreCopiedIntoAFileVerified(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        let data = Data((0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) })
        let hash = ContentCopy.hash(of: data)
        try s.store.putBlob(hash, data: data)
        try s.store.flushBlobs()
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-copy-\(UUID().uuidString)").path
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        #expect(fd >= 0)
        defer { close(fd); unlink(path) }
        let offset: UInt64 = 4 << 20
        try s.store.copyBlob(hash, size: data.count, into: fd, at: offset)
        var back = Data(count: data.count)
        let got = back.withUnsafeMutableBytes { pread(fd, $0.baseAddress!, data.count, off_t(offset)) }
        #expect(got == data.count && back == data)

        func expectEIO(_ body: () throws -> Void) {
            do {
                try body()
                Issue.record("a bad blob was copied as good")
            } catch let error as UbiquityError {
                #expect(error.errno == EIO)
                #expect(error.store == .damaged, "\(error)")
            } catch {
                Issue.record("unexpected \(error)")
            }
        }
        // A blob longer than expected writes nothing past the range it was given.
        expectEIO { try s.store.copyBlob(hash, size: data.count - 1, into: fd, at: 0) }
        var past: UInt8 = 0xaa
        #expect(pread(fd, &past, 1, off_t(data.count - 1)) == 1 && past == 0)
        var damaged = data
        damaged[150_000] ^= 0xff
        try s.writeRaw("blobs/\(hash.prefix(2))/\(hash)", damaged)
        expectEIO { try s.store.copyBlob(hash, size: data.count, into: fd, at: 0) }
        expectEIO { try s.store.copyBlob(ContentCopy.hash(of: Data("missing".utf8)), size: 7, into: fd, at: 0) }
    }

    /// A pack is a blob; a member is read with a range and verified against
    /// its own content hash; a damaged, short or missing pack is `EIO` naming it.
    @Test(arguments: StoreKind.all) func packRangesAreReadAndVerified(kind: StoreKind) throws {
        let s = try StoreUnderTest(kind)
        defer { s.cleanUp() }
        let members = (0..<20).map { i in Data("member \(i) ".utf8) + Data(repeating: UInt8(i), count: 1000 + 37 * i) }
        var pack = Data()
        var locations: [(PackLocation, String, UInt64)] = []
        let placeholder = PackLocation(hash: String(repeating: "0", count: 64), offset: 0)
        for member in members {
            locations.append((PackLocation(hash: placeholder.hash, offset: UInt64(pack.count)), ContentCopy.hash(of: member), UInt64(member.count)))
            pack.append(member)
        }
        let packHash = ContentCopy.hash(of: pack)
        locations = locations.map { (PackLocation(hash: packHash, offset: $0.0.offset), $0.1, $0.2) }
        try s.store.putBlob(packHash, data: pack)
        try s.store.flushBlobs()
        let reader = try s.reopen()
        for (index, (location, hash, size)) in locations.enumerated() {
            #expect(try reader.fetchPacked(location, contentHash: hash, size: size) == members[index])
        }
        #expect(try reader.fetchBlobRange(packHash, offset: 5, count: 10) == pack.subdata(in: 5..<15))
        func expectEIO(naming name: String, _ body: () throws -> Data) {
            do {
                _ = try body()
                Issue.record("read what it should have refused")
            } catch let error as UbiquityError {
                #expect(error.errno == EIO)
                #expect(error.store == .damaged, "\(error)")
                #expect(error.message.contains(name), "\(error.message)")
            } catch {
                Issue.record("\(error)")
            }
        }
        // The wrong content hash for a range: refused, never served.
        let (first, _, firstSize) = locations[0]
        expectEIO(naming: packHash) { try reader.fetchPacked(first, contentHash: locations[1].1, size: firstSize) }
        // Beyond the end of the pack.
        let beyond = PackLocation(hash: packHash, offset: UInt64(pack.count) - 10)
        expectEIO(naming: packHash) { try reader.fetchPacked(beyond, contentHash: locations[0].1, size: 100) }
        // Damaged in the store: the member's bytes no longer match.
        var damaged = pack
        damaged[Int(locations[3].0.offset) + 1] ^= 0x55
        try s.writeRaw("blobs/\(packHash.prefix(2))/\(packHash)", damaged)
        expectEIO(naming: packHash) { try reader.fetchPacked(locations[3].0, contentHash: locations[3].1, size: locations[3].2) }
        // Cut short: the last member is gone.
        try s.writeRaw("blobs/\(packHash.prefix(2))/\(packHash)", pack.prefix(Int(locations[19].0.offset) + 3))
        expectEIO(naming: packHash) { try reader.fetchPacked(locations[19].0, contentHash: locations[19].1, size: locations[19].2) }
        // Missing: like a missing blob.
        let missing = PackLocation(hash: ContentCopy.hash(of: Data("no such pack".utf8)), offset: 0)
        expectEIO(naming: missing.hash) { try reader.fetchPacked(missing, contentHash: locations[0].1, size: locations[0].2) }
    }
}

/// What only the S3 store has to get right.
@Suite(.serialized) struct S3StoreTests {
    static var servers: [S3TestServer] { S3TestServer.configured }

    /// A commit whose answer was lost (the record is there with our very
    /// bytes) is a win, not a lost race.
    @Test(arguments: servers) func aCommitWhoseAnswerWasLostIsOurs(server: S3TestServer) throws {
        let prefix = "lost-\(UUID().uuidString.lowercased())"
        let store = try S3Store(location: try server.location(prefix: prefix), credentials: server.credentials, knownStoreID: nil)
        try store.createContainer(ContainerConfig(id: "com.l", displayName: "L"))
        let mine = changeSet("me-device")
        let key = store.client.location.prefix + "containers/" + "com.l".utf8.map { String(format: "%02x", $0) }.joined()
            + "/journal/0000000000000001"
        _ = try store.client.send(.PUT, key: key, body: try mine.encodedRecord(seq: 1))
        #expect(try store.commit(container: "com.l", seq: 1, changeSet: mine))
        #expect(try !store.commit(container: "com.l", seq: 1, changeSet: changeSet("someone-else")))
    }

    /// A prefix this device knew, now without its marker: unreachable, never a new empty store.
    @Test(arguments: servers) func aKnownStoreWithoutItsMarkerIsUnreachable(server: S3TestServer) throws {
        let prefix = "gone-\(UUID().uuidString.lowercased())"
        let store = try S3Store(location: try server.location(prefix: prefix), credentials: server.credentials,
                                knownStoreID: "0f0f0f0f-0000-4000-8000-000000000000")
        #expect(store.startupProblem != nil)
        #expect(!store.isReachable)
        do {
            _ = try store.journal(container: "com.x", after: 0, limit: 1)
            Issue.record("an unreachable store answered")
        } catch let error as UbiquityError {
            #expect(error.errno == EHOSTDOWN)
            #expect(error.store == .unreachable && error.fileOperationErrno == EIO)
        }
    }

    @Test(arguments: servers) func wrongCredentialsAndMissingBucketsAreClearErrors(server: S3TestServer) throws {
        var wrong = server.credentials
        wrong.secretAccessKey = "not-the-secret"
        do {
            _ = try S3Store(location: try server.location(prefix: "p"), credentials: wrong, knownStoreID: nil)
            Issue.record("wrong credentials were accepted")
        } catch let error as UbiquityError {
            #expect(error.errno == EACCES)
            #expect(error.store == .refused, "\(error)")
            #expect(!error.message.contains("not-the-secret"))
        }
        do {
            let location = try S3Location(url: "s3://no-such-bucket-\(UInt32.random(in: 0...UInt32.max))/p", endpoint: server.endpoint,
                                          region: server.region)
            _ = try S3Store(location: location, credentials: server.credentials, knownStoreID: nil)
            Issue.record("a missing bucket was accepted")
        } catch let error as UbiquityError {
            #expect(error.errno == ENOENT)
        }
    }

    @Test func anUnansweringServerIsUnreachable() throws {
        // A port nothing listens on (bound, never accepting, then closed).
        let location = try S3Location(url: "s3://bucket/p", endpoint: "http://127.0.0.1:9", region: "us-east-1")
        let credentials = AWSCredentials(accessKeyID: "AKID", secretAccessKey: "secret", source: "test")
        let store = try S3Store(location: location, credentials: credentials, knownStoreID: "0f0f0f0f-0000-4000-8000-000000000000")
        #expect(store.startupProblem?.contains("not reachable") == true)
        do {
            _ = try S3Store(location: location, credentials: credentials, knownStoreID: nil)
            Issue.record("a store nobody answers for was opened as new")
        } catch let error as UbiquityError {
            #expect(error.errno == EHOSTDOWN)
            #expect(error.store == .unreachable)
        }
    }

    @Test func locationsParseAndRefuseWhatIsWrong() throws {
        let aws = try S3Location(url: "s3://my-bucket/ubiquity", endpoint: nil, region: "eu-west-1")
        #expect(aws.endpoint.absoluteString == "https://s3.eu-west-1.amazonaws.com")
        #expect(aws.addressing == .virtual)
        #expect(aws.prefix == "ubiquity/")
        #expect(aws.description == "s3://my-bucket/ubiquity")
        let local = try S3Location(url: "s3://b-1/", endpoint: "http://127.0.0.1:8333", region: nil)
        #expect(local.addressing == .path)
        #expect(local.prefix == "")
        for bad in ["s3://", "s3://UPPER/x", "s3://a/x", "s3://bucket/x//y", "http://bucket/x"] {
            #expect(throws: UbiquityError.self, "\(bad)") { try S3Location(url: bad, endpoint: nil, region: nil) }
        }
        #expect(throws: UbiquityError.self) { try S3Location(url: "s3://bucket/x", endpoint: "ftp://host", region: nil) }
        #expect(throws: UbiquityError.self) { try S3Location(url: "s3://bucket/x", endpoint: "http://host/path", region: nil) }
    }
}
