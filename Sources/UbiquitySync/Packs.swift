import Foundation
import GRDB
import Logging
import Synchronization
import UbiquityLocks
import UbiquityReplica
import UbiquityModel
import UbiquityStore

/// Packing small files: a push round puts the content of many small files
/// (each under `PackLayout.memberLimit`) into a few *pack* blobs instead of
/// one blob each, and the node records say where each file's bytes are
/// (`NodeState.pack`). A pack is an ordinary blob (content-addressed, at most
/// one chunk), so storing, flushing, checking and losing one is what it is
/// for any blob; a member is read with one ranged read and verified against
/// the node's own content hash. docs/STORE-FORMAT.md has the format,
/// docs/DESIGN.md the request costs.
///
/// Where a content hash is packed is a property of the content, not of a
/// node: this device keeps it by content hash (`PackIndex`), learned from
/// its own pushes and from every record and snapshot it reads. A push of a
/// node whose content has a known location names it again (a record always
/// says where the content is); a download looks it up, and falls back to a
/// blob of the content's own hash (which `checkStoreCopy` puts back if a
/// pack is lost).

/// Content hash → pack locations, persisted next to the replica's index
/// (`packs.sqlite`, WAL): written before the replica records a node that
/// needs it, so a node with packed content never lacks its location (a
/// crash in between leaves an extra row, which is harmless: rows are claims
/// about content, whatever node has it).
///
/// A hash may have several locations: every record that names one adds it.
/// A location is only a claim (a hostile or damaged record can name a
/// wrong one for content another node has): a reader tries them in turn,
/// each verified against the content hash, best first — the ones this
/// device stored itself (`own`), then the most recently learned — and a
/// wrong one costs a failed read, never wrong bytes. Only `own` locations
/// are reused to skip an upload.
final class PackIndex: Sendable {
    let db: DatabaseQueue
    /// Whether SQLite was used since its caches were last given back.
    private let cachesUsed = Atomic(false)

    init(directory: URL, logger: Logger) {
        // If it cannot be opened, packed content is found only through what
        // this run learns; downloads fall back to blobs of the content's own hash.
        db = SideDatabase.open(directory.appendingPathComponent("packs.sqlite").path, label: "ubiquityfs.packs",
                               schema: Self.schema, whatIsLost: "pack locations", logger: logger)
    }

    static let schema = """
        CREATE TABLE IF NOT EXISTS packed(hash TEXT NOT NULL, pack TEXT NOT NULL, offset INTEGER NOT NULL,
                                          own INTEGER NOT NULL, seen INTEGER NOT NULL,
                                          PRIMARY KEY(hash, pack, offset)) WITHOUT ROWID
        """
    static let best = "SELECT pack, offset FROM packed WHERE hash = ? ORDER BY own DESC, seen DESC"
    static let bestOne = best + " LIMIT 1"
    static let ownOne = "SELECT pack, offset FROM packed WHERE hash = ? AND own = 1 ORDER BY seen DESC LIMIT 1"

    static func location(_ row: Row) -> PackLocation {
        PackLocation(hash: row["pack"], offset: UInt64(bitPattern: row["offset"] as Int64))
    }

    /// Give back SQLite's page cache and prepared statements, if it was used
    /// since the last time; whether it was.
    func releaseMemoryIfUsed() -> Bool {
        guard cachesUsed.exchange(false, ordering: .relaxed) else { return false }
        db.releaseMemory()
        return true
    }

    // Lookups run each SELECT in autocommit (`inDatabase`), not in a `read`
    // transaction (DESIGN, "Packing small files"): a row is a claim checked
    // when used, so no two lookups need one snapshot.

    /// The best location of content `hash` (see the type), or with `ownOnly`
    /// one this device stored itself.
    func location(of hash: String, ownOnly: Bool = false) -> PackLocation? {
        // Asked once per pushed file: a prepared statement, not SQL compiled each time.
        cachesUsed.store(true, ordering: .relaxed)
        return try? db.inDatabase { db in
            try Row.fetchOne(db.cachedStatement(sql: ownOnly ? Self.ownOne : Self.bestOne), arguments: [hash]).map(Self.location)
        }
    }

    /// Every location of content `hash`, best first (at most 8).
    func allLocations(of hash: String) -> [PackLocation] {
        cachesUsed.store(true, ordering: .relaxed)
        return (try? db.inDatabase { db in try Row.fetchAll(db.cachedStatement(sql: Self.best + " LIMIT 8"), arguments: [hash]).map(Self.location) }) ?? []
    }

    func locations(of hashes: some Sequence<String>) -> [String: PackLocation] {
        let wanted = Set(hashes)
        cachesUsed.store(true, ordering: .relaxed)
        return (try? db.inDatabase { db -> [String: PackLocation] in
            var out: [String: PackLocation] = [:]
            let statement = try db.cachedStatement(sql: Self.bestOne)
            for hash in wanted {
                if let row = try Row.fetchOne(statement, arguments: [hash]) { out[hash] = Self.location(row) }
            }
            return out
        }) ?? [:]
    }

    /// Record where content is (one transaction): `own` for packs this
    /// device stored, otherwise locations read in records and snapshots.
    func record(_ locations: [String: PackLocation], own: Bool) throws {
        guard !locations.isEmpty else { return }
        let now = Int64(Date().timeIntervalSince1970 * 1e6)
        cachesUsed.store(true, ordering: .relaxed)
        try db.write { db in
            let statement = try db.cachedStatement(sql: """
                INSERT INTO packed(hash, pack, offset, own, seen) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT(hash, pack, offset) DO UPDATE SET seen = excluded.seen, own = max(own, excluded.own)
                """)
            for (hash, location) in locations {
                try statement.execute(arguments: [hash, location.hash, Int64(bitPattern: location.offset), own ? 1 : 0, now])
            }
        }
    }

    /// The locations named by the nodes of `changes`.
    static func locations(in changes: [Change]) -> [String: PackLocation] {
        var out: [String: PackLocation] = [:]
        for change in changes {
            if case .node(let state) = change, let hash = state.hash, let pack = state.pack { out[hash] = pack }
        }
        return out
    }
}

/// Collects the small files of one push round into packs and uploads each
/// pack when it is full (on the thread that filled it), so memory stays at
/// about one pack per upload thread. Identical content goes in once.
final class PackWriter: Sendable {
    struct Open {
        var data = Data()
        var members: [(hash: String, offset: UInt64)] = []
    }

    struct State {
        var open = Open()
        /// Every content hash added, and where it ended (nil: not yet sealed,
        /// or a pack of one member, stored as a blob of its own).
        var outcome: [String: Result<PackLocation?, UbiquityError>?] = [:]
        var packs = 0
    }

    let store: any Store
    let state = Lock(State())

    init(store: any Store) { self.store = store }

    /// Add content `hash` (the caller hashed exactly `data`, under `PackLayout.memberLimit`).
    func add(_ hash: String, _ data: Data) {
        let full = state.withLock { s -> Open? in
            if s.outcome[hash] != nil { return nil }   // already in (an identical file)
            s.outcome[hash] = .some(nil)
            var sealed: Open?
            if s.open.data.count + data.count > PackLayout.maxPackSize {
                sealed = s.open
                s.open = Open()
            }
            s.open.members.append((hash, UInt64(s.open.data.count)))
            s.open.data.append(data)
            return sealed
        }
        if let full { upload(full) }
    }

    /// Upload the last pack; then where each content hash added is: a
    /// location, nil (a blob of its own), or why its pack could not be stored.
    func finish() -> [String: Result<PackLocation?, UbiquityError>] {
        let last = state.withLock { s -> Open in
            defer { s.open = Open() }
            return s.open
        }
        if !last.members.isEmpty { upload(last) }
        return state.withLock { s in s.outcome.compactMapValues { $0 } }
    }

    /// Packs stored by this writer.
    var packCount: Int { state.withLock { $0.packs } }

    func upload(_ pack: Open) {
        let packHash = ContentCopy.hash(of: pack.data)
        var outcome: [String: Result<PackLocation?, UbiquityError>] = [:]
        do {
            // One member is a blob of its own (its pack hash is its content hash).
            try store.putBlob(packHash, data: pack.data)
            for member in pack.members {
                outcome[member.hash] = .success(pack.members.count > 1 ? PackLocation(hash: packHash, offset: member.offset) : nil)
            }
        } catch let error as UbiquityError where error.errno == EHOSTDOWN {
            for member in pack.members { outcome[member.hash] = .failure(error) }
        } catch {
            // The store refuses the pack (no room for it, too large…): each
            // member goes as a blob of its own, so what is refused is only
            // the files the store refuses, as without packing.
            for (index, member) in pack.members.enumerated() {
                let end = index + 1 < pack.members.count ? Int(pack.members[index + 1].offset) : pack.data.count
                let data = pack.data.subdata(in: Int(member.offset)..<end)
                do {
                    try store.putBlob(member.hash, data: data)
                    outcome[member.hash] = .success(nil)
                } catch {
                    outcome[member.hash] = .failure(UbiquityError.wrap(error))
                }
            }
        }
        state.withLock { s in
            if pack.members.count > 1, outcome.values.contains(where: { if case .success(.some) = $0 { true } else { false } }) { s.packs += 1 }
            for (hash, result) in outcome { s.outcome[hash] = .some(result) }
        }
    }
}

extension SyncEngine {
    /// The content `hash` of `size` bytes (one blob's worth, not chunked),
    /// verified: from its pack when this device knows one, else (or when
    /// the pack is lost or damaged) from a blob of its own hash. An error
    /// names the pack when neither has it.
    func fetchContent(_ hash: String, size: UInt64) throws -> Data {
        let locations = size > 0 && size < UInt64(PackLayout.memberLimit) ? packs.allLocations(of: hash) : []
        guard !locations.isEmpty else { return try store.fetchBlob(hash) }
        var firstError: UbiquityError?
        for location in locations {
            do {
                return try store.fetchPacked(location, contentHash: hash, size: size)
            } catch let error as UbiquityError where error.errno == EIO {
                firstError = firstError ?? error   // the next location, then a blob of its own
            }
        }
        // A blob of its own may be there (put back by a device that held
        // the content, or pushed before it was packed).
        if let data = try? store.fetchBlob(hash), UInt64(data.count) == size { return data }
        throw firstError!
    }

    /// `changes` with the pack location of every node whose content this
    /// device knows to be packed (a record always says where content is).
    func namingPacks(_ changes: [Change], known: [String: PackLocation] = [:]) -> [Change] {
        let wanted = changes.compactMap { change -> String? in
            guard case .node(let state) = change, state.pack == nil, state.chunked != true, let hash = state.hash,
                  state.size > 0, state.size < UInt64(PackLayout.memberLimit), known[hash] == nil else { return nil }
            return hash
        }
        let found = wanted.isEmpty ? known : packs.locations(of: wanted).merging(known) { $1 }
        guard !found.isEmpty else { return changes }
        return changes.map { change in
            guard case .node(var state) = change, state.pack == nil, state.chunked != true, let hash = state.hash,
                  state.size > 0, state.size < UInt64(PackLayout.memberLimit), let location = found[hash] else { return change }
            state.pack = location
            return .node(state)
        }
    }
}

/// A SQLite file beside the replica's index that only caches what the
/// store or this run can tell again (`packs.sqlite`, `history.sqlite`):
/// WAL, `synchronous=NORMAL`; if it cannot be opened, an in-memory one, and
/// the error is logged.
enum SideDatabase {
    static func open(_ path: String, label: String, schema: String, whatIsLost: String, logger: Logger) -> DatabaseQueue {
        var config = Configuration()
        config.label = label
        config.busyMode = .timeout(10)
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA journal_mode=WAL")
            try db.execute(sql: "PRAGMA synchronous=NORMAL")
        }
        do {
            let db = try DatabaseQueue(path: path, configuration: config)
            try db.write { db in try db.execute(sql: schema) }
            return db
        } catch {
            logger.error("cannot open \(path) (\(whatIsLost) kept in memory only): \(error)")
            let db = try! DatabaseQueue()
            try! db.write { db in try db.execute(sql: schema) }
            return db
        }
    }
}
