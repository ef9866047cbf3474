import Foundation
import Logging
import NIOHTTP1
import Synchronization
import UbiquityLocks
import UbiquityModel
import UbiquityStore

/// A store in an S3 bucket (AWS S3, Ceph RGW, SeaweedFS, MinIO, R2…): the
/// same layout and promises as `FolderStore`, in objects.
///
/// Keys, below the location's prefix (`docs/STORE-FORMAT.md`):
/// ```
/// ubiquityfs-store.json            marker: format and store ID
/// containers/HEXID/container.json  container configuration (HEXID: the ID's UTF-8 in hex)
/// containers/HEXID/journal/SEQ     one change set per record (SEQ: 16 digits)
/// blobs/AB/SHA256                  immutable content
/// ubiquityfs-containers.json       rewritten when a container is made or changed
/// ```
/// No key is the "folder" of another key and journal keys have a fixed
/// width, so servers that keep keys as a directory tree (SeaweedFS) list
/// and conditionally create them like any other.
///
/// Commits: a record is created with `If-None-Match: *`; the loser of a race
/// gets 412 and pulls. A create that timed out may have taken effect: a 412
/// is therefore followed by a GET, and a record with exactly our bytes is
/// ours (a record names its device and its time in nanoseconds: no other
/// commit writes the same bytes). A 409 or 500 on a conditional create (AWS's
/// ConditionalRequestConflict, Ceph's race loser) is retried, never taken as
/// success.
///
/// Reading the journal: one GET of the next key per poll (404: nothing new);
/// when a record is there, a LIST from it tells how many follow, and they are
/// fetched in parallel. The watcher (`watchJournal`) HEADs the next key, often
/// for a while after activity and less when quiet (see `S3JournalWatcher`).
public final class S3Store: Store, @unchecked Sendable {
    public static let markerName = "ubiquityfs-store.json"
    /// The format new stores are made with (2: small files may be packed;
    /// docs/STORE-FORMAT.md). A store of format 1 stays format 1 (no packs).
    static let formatVersion = 3

    struct Marker: Codable {
        var format: Int
        var storeID: String
    }

    public let client: S3Client
    public let storeID: String
    /// The format in the marker, once read (0: not yet).
    let format = Atomic<Int>(0)
    public var packsSmallContent: Bool { format.load(ordering: .relaxed) >= 2 }
    var location: S3Location { client.location }
    /// Per container: the first journal number not yet read (what the watcher looks for).
    let nextRecord = Lock<[String: UInt64]>([:])
    /// When a record was last committed or read (monotonic ns): the watcher polls often after.
    let lastActivity = Atomic<UInt64>(0)
    /// Concurrent GETs when catching up on many records.
    static let parallelFetches = 16

    /// Open the store at `location`. The bucket must exist (it is never
    /// created here).
    ///
    /// `knownStoreID`: the store this device used at this location before.
    /// Then an unanswering server or a missing marker is "unreachable for
    /// now" — never "everything was deleted" — and the store is opened all
    /// the same (`startupProblem` says why it is offline; every call checks
    /// the marker again until it is back). A different store there is
    /// refused. Without it, a prefix with no marker becomes a new store.
    public init(location: S3Location, credentials: AWSCredentials, knownStoreID: String?) throws {
        client = S3Client(location: location, credentials: credentials)
        let markerKey = location.prefix + Self.markerName
        if let knownStoreID {
            storeID = knownStoreID
            do {
                try verifyMarker()
            } catch let error as UbiquityError where error.errno == EHOSTDOWN {
                startupProblem = error.description
            }
            return
        }
        let found = try client.send(.GET, key: markerKey, expect: [404])
        if found.status == 404 {
            if found.errorCode == "NoSuchBucket" {
                throw UbiquityError(ENOENT, "bucket \(location.bucket) does not exist at \(location.endpoint.absoluteString)")
            }
            let marker = Marker(format: Self.formatVersion, storeID: UUID().uuidString.lowercased())
            let created = try client.send(.PUT, key: markerKey, headers: [("if-none-match", "*"), ("content-type", "application/json")],
                                          body: try JSONEncoder().encode(marker), expect: [412], retryStatus: Self.retryConditional)
            if created.status == 412 {
                // Another device made the store first: use theirs.
                let theirs = try client.send(.GET, key: markerKey).body
                storeID = try Self.readMarker(theirs, location)
                format.store(Self.format(of: theirs), ordering: .relaxed)
            } else {
                storeID = marker.storeID
                format.store(Self.formatVersion, ordering: .relaxed)
            }
        } else {
            storeID = try Self.readMarker(found.body, location)
            format.store(Self.format(of: found.body), ordering: .relaxed)
        }
        verified.store(true, ordering: .relaxed)
    }

    /// Why the store could not be reached when it was opened (nil: it could).
    public private(set) var startupProblem: String?
    /// Whether the marker was seen with this store's ID since opening.
    let verified = Atomic<Bool>(false)

    /// Check, once, that the marker is there and names this store.
    func verifyMarker() throws {
        if verified.load(ordering: .relaxed) { return }
        let response = try client.send(.GET, key: location.prefix + Self.markerName, expect: [404])
        if response.errorCode == "NoSuchBucket" {
            throw UbiquityError(store: .unreachable, "store \(location) is not reachable: bucket \(location.bucket) does not exist")
        }
        guard response.status == 200 else {
            throw UbiquityError(store: .unreachable, "store \(location) has no \(Self.markerName): it is not reachable (emptied or replaced?)")
        }
        guard try Self.readMarker(response.body, location) == storeID else {
            throw UbiquityError(EINVAL, "\(location) now holds a different store than the one this device used there; refusing to mix them")
        }
        format.store(Self.format(of: response.body), ordering: .relaxed)
        verified.store(true, ordering: .relaxed)
    }

    /// The format a marker (already read by `readMarker`) says.
    static func format(of data: Data) -> Int { (try? JSONDecoder().decode(Marker.self, from: data))?.format ?? 0 }

    static func readMarker(_ data: Data, _ location: S3Location) throws -> String {
        guard let marker = try? JSONDecoder().decode(Marker.self, from: data), RecordFormat.isValidID(marker.storeID) else {
            throw UbiquityError(EINVAL, "store marker \(location)/\(markerName) is damaged; refusing to use it as a store")
        }
        guard marker.format <= formatVersion else {
            throw UbiquityError(store: .unsupported, "store \(location) has format \(marker.format); this ubiquityfs reads format \(formatVersion) — upgrade it")
        }
        return marker.storeID
    }

    /// A conditional create is retried on 409 (AWS: a concurrent conditional
    /// write) and on 500 (Ceph's race loser) as well as the usual transient
    /// statuses: the retry gets 412 or succeeds, never a false success.
    static func retryConditional(_ response: S3Client.Response) -> Bool {
        S3Client.isTransient(response) || response.status == 409
    }

    /// A container's "folder": its ID in hexadecimal, so that listing the
    /// containers never crosses a key with a character that sorts before "/"
    /// (SeaweedFS keeps keys as a directory tree and can skip those).
    func containerPrefix(_ id: String) -> String {
        location.prefix + "containers/" + id.utf8.map { String(format: "%02x", $0) }.joined() + "/"
    }
    static func containerID(hex: String) -> String? {
        guard hex.count % 2 == 0, !hex.isEmpty else { return nil }
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            guard let byte = UInt8(hex[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        return String(bytes: bytes, encoding: .utf8)
    }
    func containerKey(_ id: String) -> String { containerPrefix(id) + "container.json" }
    func journalPrefix(_ container: String) -> String { containerPrefix(container) + "journal/" }
    func journalKey(_ container: String, _ seq: UInt64) -> String { journalPrefix(container) + Self.seqName(seq) }
    static func seqName(_ seq: UInt64) -> String {
        let digits = String(seq)
        return String(repeating: "0", count: max(0, 16 - digits.count)) + digits
    }
    func blobKey(_ hash: String) -> String { location.prefix + "blobs/\(hash.prefix(2))/\(hash)" }

    public var locationDescription: String { location.description }

    /// Whether the store answers and still holds its marker.
    public var isReachable: Bool {
        guard let response = try? client.send(.GET, key: location.prefix + Self.markerName, expect: [404]),
              response.status == 200, (try? Self.readMarker(response.body, location)) == storeID else { return false }
        return true
    }

    // MARK: Containers

    public func containerConfig(_ container: String) throws -> ContainerConfig? {
        try verifyMarker()
        let response = try client.send(.GET, key: containerKey(container), expect: [404])
        guard response.status != 404 else { return nil }
        return try ContainerConfig.decodeStored(response.body, id: container, at: "\(location)/\(containerKey(container).dropFirst(location.prefix.count))")
    }

    public func createContainer(_ config: ContainerConfig) throws {
        try config.validate()
        try verifyMarker()
        let response = try client.send(.PUT, key: containerKey(config.id), headers: [("if-none-match", "*"), ("content-type", "application/json")],
                                       body: try config.encodedForStore(), expect: [412], retryStatus: Self.retryConditional)
        if response.status == 412 { throw UbiquityError(EEXIST, "container \(config.id) already exists") }
        try noteContainersChanged()
    }

    public func updateContainer(_ config: ContainerConfig) throws {
        try config.validate()
        guard try containerConfig(config.id) != nil else { throw UbiquityError(ENOENT, "no container \(config.id)") }
        _ = try client.send(.PUT, key: containerKey(config.id), headers: [("content-type", "application/json")], body: try config.encodedForStore())
        try noteContainersChanged()
    }

    /// `ubiquityfs-containers.json` changes (a new ETag) whenever a container
    /// is created or changed here: daemons HEAD it each poll and LIST the
    /// containers only when it changed (or every few minutes, for changes
    /// made by other tools).
    static let containersChangedName = "ubiquityfs-containers.json"
    let containersETag = Lock<String?>(nil)

    func noteContainersChanged() throws {
        let body = Data("{\"changed\": \"\(UUID().uuidString.lowercased())\"}".utf8)
        _ = try client.send(.PUT, key: location.prefix + Self.containersChangedName, headers: [("content-type", "application/json")], body: body)
    }

    public func containersMayHaveChanged() -> Bool {
        guard let response = try? client.send(.HEAD, key: location.prefix + Self.containersChangedName, expect: [404], attempts: 1) else {
            return true
        }
        let tag = response.status == 404 ? "absent" : response.headers.first(name: "etag") ?? UUID().uuidString
        return containersETag.withLock { known in
            defer { known = tag }
            return known != tag
        }
    }

    public func containers() throws -> ContainerListing {
        try verifyMarker()
        var listing = ContainerListing(configs: [])
        for folder in try listFolders(under: location.prefix + "containers/") {
            guard let id = Self.containerID(hex: folder) else {
                listing.damaged.append((folder, "not a container folder (its name is not a hexadecimal container ID)"))
                continue
            }
            do {
                if let config = try containerConfig(id) { listing.configs.append(config) }
            } catch let error as UbiquityError where error.errno == EHOSTDOWN || error.errno == EACCES {
                throw error
            } catch {
                listing.damaged.append((id, "\(UbiquityError.wrap(error))"))
            }
        }
        return listing
    }

    // MARK: Journal

    public func commit(container: String, seq: UInt64, changeSet: ChangeSet) throws -> Bool {
        try verifyMarker()
        let won = try createExclusively(journalKey(container, seq), try changeSet.encodedRecord(seq: seq))
        if won { noteJournal(container, next: seq + 1) }
        return won
    }

    /// Create `key` holding `data` unless it exists (`If-None-Match: *`):
    /// true when this call made it. A key found taken is read back: it may be
    /// this very request's, whose first try took effect but whose answer was
    /// lost (records are written with sorted keys, so it holds exactly `data`).
    func createExclusively(_ key: String, _ data: Data) throws -> Bool {
        let response = try client.send(.PUT, key: key, headers: [("if-none-match", "*"), ("content-type", "application/json")],
                                       body: data, expect: [412], retryStatus: Self.retryConditional)
        if response.status != 412 { return true }
        let existing = try client.send(.GET, key: key, expect: [404])
        return existing.status == 200 && existing.body == data
    }

    public func journal(container: String, after seq: UInt64, limit: Int) throws -> [JournalRecord] {
        guard limit > 0 else { return [] }
        try verifyMarker()
        guard let first = try readRecord(container: container, seq: seq + 1) else {
            noteJournal(container, next: seq + 1, activity: false)
            return []
        }
        var records = [first]
        if limit > 1 {
            // More may follow: list them, then fetch them in parallel.
            let listed = try listKeys(after: journalKey(container, seq + 1), prefix: journalPrefix(container), max: limit - 1)
            var expected = seq + 2
            var numbers: [UInt64] = []
            for key in listed {
                guard let number = UInt64(key.split(separator: "/").last ?? ""), number == expected,
                      key == journalKey(container, number) else { break }
                numbers.append(number)
                expected += 1
            }
            let fetched = Parallel.map(numbers, width: Self.parallelFetches) { number in
                Result { try self.readRecord(container: container, seq: number) }
            }
            for result in fetched {
                guard let record = try result.get() else { break }   // deleted meanwhile: stop at the gap
                records.append(record)
            }
        }
        noteJournal(container, next: records.last!.seq + 1, activity: true)
        return records
    }

    /// Record `seq`, or nil at the end of the journal. A record that is there
    /// but not a valid change set is `.invalid` (quarantined by the reader);
    /// one that cannot be read now throws, and is read again later.
    func readRecord(container: String, seq: UInt64) throws -> JournalRecord? {
        let response: S3Client.Response
        do {
            response = try client.send(.GET, key: journalKey(container, seq), expect: [404], maxBody: RecordFormat.maxRecordBytes)
        } catch let error as UbiquityError where error.errno == EFBIG {
            return JournalRecord(seq: seq, content: .invalid(reason: "record is larger than \(RecordFormat.maxRecordBytes) bytes"))
        }
        if response.status == 404 { return nil }
        return JournalRecord(seq: seq, data: response.body)
    }

    // MARK: Snapshots

    func snapshotPrefix(_ container: String) -> String { containerPrefix(container) + "snapshots/" }

    public func snapshots(container: String) throws -> [UInt64] {
        try verifyMarker()
        let prefix = snapshotPrefix(container)
        return try listKeys(after: prefix, prefix: prefix, max: 100_000).compactMap { key -> UInt64? in
            let name = key.dropFirst(prefix.count)
            guard name.utf8.count == 16, let seq = UInt64(name), seq > 0 else { return nil }
            return seq
        }.sorted()
    }

    public func snapshot(container: String, seq: UInt64) throws -> SnapshotRecord? {
        try verifyMarker()
        let response = try client.send(.GET, key: snapshotPrefix(container) + Self.seqName(seq), expect: [404], maxBody: 1 << 20)
        if response.status == 404 { return nil }
        return try SnapshotRecord.decode(response.body, seq: seq)
    }

    public func publishSnapshot(container: String, _ snapshot: SnapshotRecord) throws -> Bool {
        try verifyMarker()
        return try createExclusively(snapshotPrefix(container) + Self.seqName(snapshot.seq), try snapshot.encoded())
    }

    func noteJournal(_ container: String, next: UInt64, activity: Bool = true) {
        nextRecord.withLock { known in known[container] = max(known[container] ?? 0, next) }
        if activity { lastActivity.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed) }
    }

    // MARK: Blobs

    public func blobSize(_ hash: String) throws -> UInt64? {
        try verifyMarker()
        let response = try client.send(.HEAD, key: blobKey(hash), expect: [404])
        guard response.status != 404 else { return nil }
        guard let size = response.headers.first(name: "content-length").flatMap(UInt64.init) else {
            throw UbiquityError(EIO, "store \(location) did not say the size of blob \(hash)")
        }
        return size
    }

    public func putBlob(_ hash: String, data: Data) throws {
        precondition(ContentHash.isValid(hash))
        try verifyMarker()
        // Content-addressed: writing the same bytes again is harmless, and
        // replaces a copy that was cut short or damaged.
        _ = try client.send(.PUT, key: blobKey(hash), headers: [("content-type", "application/octet-stream")], body: data)
    }

    /// Requests in flight when pushing: loopback and LAN servers, and AWS,
    /// all keep up with this many from one client.
    public var uploadConcurrency: Int { 16 }
    /// Chunks of one download in flight (8 × 4 MiB ahead of the reader).
    public var downloadConcurrency: Int { 8 }

    /// A blob under 1 MiB is put without asking first: a HEAD costs a round
    /// trip too, and putting the same bytes again is harmless. A larger one
    /// held already is put again only when it was last written more than
    /// `BlobLifetime.refreshAge` ago: that keeps it alive for the collector
    /// (S3 has no cheap way to touch an object).
    public func needsUpload(_ hash: String, size: Int) throws -> Bool {
        guard size >= 1 << 20 else { return true }
        try verifyMarker()
        let response = try client.send(.HEAD, key: blobKey(hash), expect: [404])
        guard response.status != 404,
              response.headers.first(name: "content-length").flatMap(UInt64.init) == UInt64(size) else { return true }
        let modified = response.headers.first(name: "last-modified").flatMap(Self.httpDate) ?? .distantPast
        return -modified.timeIntervalSinceNow > BlobLifetime.refreshAge
    }

    /// An HTTP date (`Tue, 15 Nov 1994 08:12:31 GMT`).
    static func httpDate(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        return formatter.date(from: text)
    }

    // MARK: Collecting

    /// Alive when written within `BlobLifetime.refreshAge` (S3 cannot touch an object).
    public func keepAlive(_ hash: String) throws -> Bool {
        try verifyMarker()
        let response = try client.send(.HEAD, key: blobKey(hash), expect: [404])
        guard response.status != 404, let modified = response.headers.first(name: "last-modified").flatMap(Self.httpDate) else { return false }
        return -modified.timeIntervalSinceNow < BlobLifetime.refreshAge
    }

    public func listBlobs() throws -> [StoredBlob] {
        try verifyMarker()
        let prefix = location.prefix + "blobs/"
        var out: [StoredBlob] = []
        var token: String?
        let iso = ISO8601DateFormatter()
        iso.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let isoWhole = ISO8601DateFormatter()
        repeat {
            var query = [("list-type", "2"), ("prefix", prefix), ("max-keys", "1000")]
            if let token { query.append(("continuation-token", token)) }
            let page = try client.send(.GET, key: nil, query: query)
            for entry in Self.xmlValues("Contents", in: page.body) {
                let fragment = Data(entry.utf8)
                guard let key = Self.xmlValues("Key", in: fragment).first, key.hasPrefix(prefix),
                      let hash = key.split(separator: "/").last.map(String.init), ContentHash.isValid(hash),
                      let size = Self.xmlValues("Size", in: fragment).first.flatMap(UInt64.init),
                      let modifiedText = Self.xmlValues("LastModified", in: fragment).first,
                      let modified = iso.date(from: modifiedText) ?? isoWhole.date(from: modifiedText) else { continue }
                out.append(StoredBlob(hash: hash, size: size, modified: modified))
            }
            token = S3Client.Response.xmlValue("IsTruncated", in: page.body) == "true"
                ? S3Client.Response.xmlValue("NextContinuationToken", in: page.body) : nil
        } while token != nil
        return out
    }

    /// A HEAD, then the DELETE: S3 has no conditional delete every server
    /// supports, so a device putting the blob again between the two loses
    /// it (it is put back by that device's check of what it holds).
    public func removeBlob(_ hash: String, unchangedSince: Date) throws -> Bool {
        precondition(ContentHash.isValid(hash))
        try verifyMarker()
        let response = try client.send(.HEAD, key: blobKey(hash), expect: [404])
        guard response.status != 404 else { return false }
        guard let modified = response.headers.first(name: "last-modified").flatMap(Self.httpDate), modified < unchangedSince else { return false }
        _ = try client.send(.DELETE, key: blobKey(hash), expect: [404])
        return true
    }

    var collectorStateKey: String { location.prefix + "gc/state.json" }

    public func collectorState() throws -> Data? {
        try verifyMarker()
        let response = try client.send(.GET, key: collectorStateKey, expect: [404])
        return response.status == 404 ? nil : response.body
    }

    public func setCollectorState(_ data: Data) throws {
        try verifyMarker()
        _ = try client.send(.PUT, key: collectorStateKey, headers: [("content-type", "application/json")], body: data)
    }

    public var compactsJournal: Bool { format.load(ordering: .relaxed) >= 3 }

    func journalBaseKey(_ container: String) -> String { containerPrefix(container) + "journal-base" }

    public func journalBase(container: String) throws -> UInt64 {
        try verifyMarker()
        let response = try client.send(.GET, key: journalBaseKey(container), expect: [404], maxBody: 4096)
        if response.status == 404 { return 0 }
        return try JournalBaseFormat.decode(response.body, at: "\(location)/\(journalBaseKey(container).dropFirst(location.prefix.count))")
    }

    public func setJournalBase(container: String, _ base: UInt64) throws {
        try verifyMarker()
        _ = try client.send(.PUT, key: journalBaseKey(container), headers: [("content-type", "application/json")], body: try JournalBaseFormat.encode(base))
    }

    public func removeRecord(container: String, seq: UInt64) throws {
        try verifyMarker()
        _ = try client.send(.DELETE, key: journalKey(container, seq), expect: [404])
    }

    public func removeSnapshot(container: String, seq: UInt64) throws {
        try verifyMarker()
        _ = try client.send(.DELETE, key: snapshotPrefix(container) + Self.seqName(seq), expect: [404])
    }

    /// An S3 PUT is durable when it is answered: nothing to flush.
    public func flushBlobs() throws {}

    public func fetchBlob(_ hash: String) throws -> Data {
        try verifyMarker()
        let response = try client.send(.GET, key: blobKey(hash), expect: [404])
        guard response.status != 404 else { throw UbiquityError(store: .damaged, "blob \(hash) missing from the store") }
        guard ContentCopy.hash(of: response.body) == hash else {
            throw UbiquityError(store: .damaged, "blob \(hash) in the store is damaged (its content does not match its name)")
        }
        return response.body
    }

    /// Written into the file as it arrives and hashed on the way (`BodyToFile`):
    /// no 4 MiB buffer per chunk, one copy instead of three.
    public func copyBlob(_ hash: String, size: Int, into fd: Int32, at offset: UInt64) throws {
        try verifyMarker()
        let sink = S3Client.FileSink(fd: fd, offset: offset, count: size)
        // A body of another size is refused by the sink: EIO naming the blob's key.
        let response = try client.send(.GET, key: blobKey(hash), expect: [404], into: sink)
        guard response.status != 404 else { throw UbiquityError(store: .damaged, "blob \(hash) missing from the store") }
        guard let written = response.written, written.count == size else {
            throw UbiquityError(store: .damaged, "blob \(hash) has the wrong size (\(response.written?.count ?? 0) bytes, not \(size))")
        }
        guard written.hash == hash else {
            throw UbiquityError(store: .damaged, "blob \(hash) in the store is damaged (its content does not match its name)")
        }
    }

    /// One ranged GET (`Range: bytes=a-b`); the caller verifies what it holds.
    public func fetchBlobRange(_ hash: String, offset: UInt64, count: Int) throws -> Data {
        try verifyMarker()
        guard count > 0 else { return Data() }
        let last = offset + UInt64(count) - 1
        let response = try client.send(.GET, key: blobKey(hash), headers: [("range", "bytes=\(offset)-\(last)")], expect: [404, 416])
        guard response.status != 404 else { throw UbiquityError(store: .damaged, "pack \(hash) missing from the store") }
        var body = response.body
        if response.status == 200 {
            // A server that ignores Range sends the whole object.
            guard UInt64(body.count) > last else {
                throw UbiquityError(store: .damaged, "pack \(hash) in the store ends before bytes \(offset) to \(last + 1) (cut short or damaged)")
            }
            body = body.subdata(in: Int(offset)..<Int(offset) + count)
        }
        guard response.status != 416, body.count == count else {
            throw UbiquityError(store: .damaged, "pack \(hash) in the store ends before bytes \(offset) to \(last + 1) (cut short or damaged)")
        }
        return body
    }

    public func watchJournal(container: String) -> (any JournalWatcher)? {
        S3JournalWatcher(store: self, container: container)
    }

    // MARK: Listing

    /// Up to `max` keys under `prefix` after `startAfter`, in order.
    func listKeys(after startAfter: String, prefix: String, max: Int) throws -> [String] {
        var keys: [String] = []
        var token: String?
        repeat {
            var query = [("list-type", "2"), ("prefix", prefix), ("max-keys", String(min(1000, max - keys.count)))]
            if let token { query.append(("continuation-token", token)) } else { query.append(("start-after", startAfter)) }
            let page = try client.send(.GET, key: nil, query: query)
            keys += Self.xmlValues("Key", in: page.body)
            token = S3Client.Response.xmlValue("IsTruncated", in: page.body) == "true"
                ? S3Client.Response.xmlValue("NextContinuationToken", in: page.body) : nil
        } while token != nil && keys.count < max
        return Array(keys.prefix(max))
    }

    /// The "folder" names directly under `prefix` (LIST with a delimiter).
    func listFolders(under prefix: String) throws -> [String] {
        var names: [String] = []
        var token: String?
        repeat {
            var query = [("list-type", "2"), ("prefix", prefix), ("delimiter", "/")]
            if let token { query.append(("continuation-token", token)) }
            let page = try client.send(.GET, key: nil, query: query)
            for common in Self.xmlValues("Prefix", in: page.body) where common.hasPrefix(prefix) && common.count > prefix.count {
                names.append(String(common.dropFirst(prefix.count).dropLast(common.hasSuffix("/") ? 1 : 0)))
            }
            token = S3Client.Response.xmlValue("IsTruncated", in: page.body) == "true"
                ? S3Client.Response.xmlValue("NextContinuationToken", in: page.body) : nil
        } while token != nil
        return names
    }

    /// Every value of `<tag>…</tag>` in an XML body, entity-decoded.
    static func xmlValues(_ tag: String, in body: Data) -> [String] {
        guard let text = String(data: body, encoding: .utf8) else { return [] }
        var values: [String] = []
        var rest = text[...]
        while let open = rest.range(of: "<\(tag)>"), let close = rest.range(of: "</\(tag)>", range: open.upperBound..<rest.endIndex) {
            values.append(unescapeXML(String(rest[open.upperBound..<close.lowerBound])))
            rest = rest[close.upperBound...]
        }
        return values
    }

    static func unescapeXML(_ text: String) -> String {
        guard text.contains("&") else { return text }
        return text.replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
            .replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&apos;", with: "'")
            .replacingOccurrences(of: "&amp;", with: "&")
    }
}

/// Polls for the next journal record with HEAD requests, S3 having no
/// notifications: every 100 ms for 30 s after this device committed or read
/// a record (a conversation is going on), then twice per poll interval
/// (`mount --poll-interval`, 1 s by default: about 5.2 million HEADs a month
/// per idle container; see docs/DESIGN.md for what that costs). `wait`
/// returns true as soon as the record exists (or the store fails to
/// answer), false at its timeout when every HEAD said "not there".
final class S3JournalWatcher: JournalWatcher, @unchecked Sendable {
    let store: S3Store
    let container: String
    let closed = Atomic<Bool>(false)
    static let busyInterval = 0.1
    static let busyWindowNanoseconds: UInt64 = 30_000_000_000

    init(store: S3Store, container: String) {
        self.store = store
        self.container = container
    }

    func wait(timeout: Double) -> Bool {
        let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(max(0, timeout) * 1e9)
        while !closed.load(ordering: .relaxed) {
            let now = DispatchTime.now().uptimeNanoseconds
            guard now < deadline else { return false }
            guard let next = store.nextRecord.withLock({ $0[container] }) else { return true }   // nothing read yet: let the puller read
            guard let response = try? store.client.send(.HEAD, key: store.journalKey(container, next), expect: [404], attempts: 1),
                  response.status == 404 else {
                return true   // there, or the store did not answer: the puller finds out which
            }
            let busy = now - min(now, store.lastActivity.load(ordering: .relaxed)) < Self.busyWindowNanoseconds
            let interval = busy ? Self.busyInterval : max(Self.busyInterval, timeout / 2)
            let remaining = Double(deadline - min(deadline, DispatchTime.now().uptimeNanoseconds)) / 1e9
            Thread.sleep(forTimeInterval: min(interval, remaining))
        }
        return true
    }

    func close() { closed.store(true, ordering: .relaxed) }
}
