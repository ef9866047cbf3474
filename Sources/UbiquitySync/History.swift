import Foundation
import GRDB
import Logging
import UbiquityModel

/// The container's history as this device learned it from the journal:
/// every state each node was committed in, each name it was given, and
/// each deletion. `versions --all`, `restore` and the trash read it
/// (`Versions.swift`, `Trash.swift`).
///
/// It is a cache of the journal, kept beside the replica's index
/// (`history.sqlite`, WAL): records are indexed as they are pulled or
/// committed here, and whatever the cache lacks is read from the store
/// again (`catchUp`) — after a crash between applying a record and
/// indexing it, on a replica made before the history existed, and below
/// the snapshot a new device started from, back to the retention limit.
/// Rows are states, not events: indexing a record twice changes nothing.
///
/// A file saved the way editors and `UIDocument` save (a new file renamed
/// over the old one) is a new node each time: the node that takes a name
/// from another file *succeeds* it (`succession`), and a file's history is
/// its own states and those of the files it succeeded, so its versions go
/// on across saves; the replaced nodes are not "deleted items".
///
/// `indexed` is the one range of record numbers known to be indexed
/// (`low...high`, contiguous); a record past `high + 1` is indexed all
/// the same but does not move it, so the gap is read again.
final class HistoryIndex: Sendable {
    let db: DatabaseQueue
    /// Indexing runs here, off the push and pull threads (which only hand
    /// their records over); readers wait for it (`settled`) first.
    let queue = DispatchQueue(label: "ubq-history")
    let logger: Logger

    init(directory: URL, logger: Logger) {
        self.logger = logger
        // If it cannot be opened, the history is what this run learns; the store keeps the journal.
        db = SideDatabase.open(directory.appendingPathComponent("history.sqlite").path, label: "ubiquityfs.history",
                               schema: Self.schema, whatIsLost: "history", logger: logger)
    }

    static let schema = """
        CREATE TABLE IF NOT EXISTS state(node TEXT NOT NULL, seq INTEGER NOT NULL, date INTEGER NOT NULL,
                                         device TEXT NOT NULL, kind TEXT NOT NULL, mode INTEGER NOT NULL,
                                         uid INTEGER NOT NULL, gid INTEGER NOT NULL, size INTEGER NOT NULL,
                                         hash TEXT, chunked INTEGER NOT NULL, pack TEXT, pack_offset INTEGER,
                                         target TEXT, rdev INTEGER NOT NULL, mtime INTEGER NOT NULL,
                                         ctime INTEGER NOT NULL, btime INTEGER NOT NULL, xattrs BLOB,
                                         PRIMARY KEY(node, seq)) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS deletion(node TEXT NOT NULL, seq INTEGER NOT NULL, date INTEGER NOT NULL,
                                            device TEXT NOT NULL, PRIMARY KEY(node, seq)) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS deletion_date ON deletion(date);
        CREATE TABLE IF NOT EXISTS entry(parent TEXT NOT NULL, name BLOB NOT NULL, seq INTEGER NOT NULL, child TEXT,
                                         PRIMARY KEY(parent, name, seq)) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS entry_child ON entry(child, seq);
        CREATE TABLE IF NOT EXISTS succession(node TEXT NOT NULL, previous TEXT NOT NULL, seq INTEGER NOT NULL,
                                              PRIMARY KEY(node, previous)) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS succession_previous ON succession(previous);
        CREATE TABLE IF NOT EXISTS indexed(id INTEGER PRIMARY KEY CHECK (id = 1), low INTEGER NOT NULL,
                                           high INTEGER NOT NULL);
        """

    /// One committed state of a node.
    struct StateRow: Sendable {
        var seq: UInt64
        var date: Timespec
        var deviceName: String
        var state: NodeState
    }

    struct DeletionRow: Sendable {
        var node: NodeID
        var seq: UInt64
        var date: Timespec
        var deviceName: String
    }

    /// What is indexed: every record from `low` to `high`, and every
    /// node's state as of record `low - 1` (`low` is nil while that is not
    /// known: a range opened by a record other than the first, whose
    /// earlier states `catchUpHistory` reads). Nil when nothing is.
    func indexed() -> (low: UInt64?, high: UInt64)? {
        try? db.read { db in
            try Row.fetchOne(db, sql: "SELECT low, high FROM indexed WHERE id = 1").map { row in
                let low = row["low"] as Int64
                return (low == Int64.max ? nil : UInt64(low), UInt64(bitPattern: row["high"] as Int64))
            }
        }
    }

    /// Index journal records in the background (a failure is logged: the
    /// records are read again by `catchUpHistory`).
    func enqueue(_ records: [(seq: UInt64, changeSet: ChangeSet?)], container: String) {
        guard !records.isEmpty else { return }
        queue.async { [self] in
            do {
                try index(records)
            } catch {
                logger.warning("\(container): history not indexed for now (\(UbiquityError.wrap(error).message)); read again later")
            }
        }
    }

    /// Wait until what was handed to `enqueue` is indexed.
    func settled() { queue.sync {} }

    /// Index journal records (any order; invalid ones count as indexed:
    /// they hold nothing). When no range is recorded yet, the first of them
    /// opens it.
    func index(_ records: [(seq: UInt64, changeSet: ChangeSet?)]) throws {
        guard !records.isEmpty else { return }
        try db.write { db in
            for record in records.sorted(by: { $0.seq < $1.seq }) {
                if let set = record.changeSet {
                    try Self.insert(set.changes, seq: record.seq, date: set.date, deviceName: set.deviceName, db)
                }
                try Self.extend(with: record.seq, db)
            }
        }
    }

    /// Index the state a snapshot describes at record `seq` (each node at
    /// the record that made its state), and start the range there (states
    /// as of `seq` known, records from `seq + 1` on indexed as they come).
    func indexSnapshot(_ parts: [SnapshotPart], seq: UInt64, date: Timespec) throws {
        try indexSnapshotStates(parts, seq: seq, date: date)
        try db.write { db in
            try db.execute(sql: "INSERT OR REPLACE INTO indexed(id, low, high) VALUES (1, ?, ?)",
                           arguments: [Int64(seq + 1), Int64(seq)])
        }
    }

    /// The states and names a snapshot describes, without touching the range.
    func indexSnapshotStates(_ parts: [SnapshotPart], seq: UInt64, date: Timespec) throws {
        try db.write { db in
            for part in parts {
                for change in part.changeSet.changes {
                    switch change {
                    case .node(let state):
                        let version = state.base > 0 ? state.base : seq
                        try Self.insertState(state, seq: version, date: date,
                                             deviceName: part.authors[state.id] ?? part.changeSet.deviceName, db)
                    case .entry(let parent, let name, let child?):
                        try Self.insertEntryRow(parent, Data(name.bytes), child, seq: seq, db)
                    default:
                        break
                    }
                }
            }
        }
    }

    /// Every state as of record `seq - 1` is known now, and every record
    /// from `seq` on.
    func lowered(to seq: UInt64) throws {
        try db.write { db in
            try db.execute(sql: "UPDATE indexed SET low = min(low, ?) WHERE id = 1", arguments: [Int64(seq)])
        }
    }

    private static func extend(with seq: UInt64, _ db: Database) throws {
        if let row = try Row.fetchOne(db, sql: "SELECT low, high FROM indexed WHERE id = 1") {
            let high = UInt64(bitPattern: row["high"] as Int64)
            if seq == high + 1 { try db.execute(sql: "UPDATE indexed SET high = ? WHERE id = 1", arguments: [Int64(seq)]) }
        } else {
            try db.execute(sql: "INSERT INTO indexed(id, low, high) VALUES (1, ?, ?)",
                           arguments: [seq == 1 ? 1 : Int64.max, Int64(seq)])
        }
    }

    private static func insert(_ changes: [Change], seq: UInt64, date: Timespec, deviceName: String, _ db: Database) throws {
        for change in changes {
            switch change {
            case .node(let state):
                try insertState(state, seq: seq, date: date, deviceName: deviceName, db)
            case .entry(let parent, let name, let child):
                try insertEntry(parent, name, child, seq: seq, db)
            case .deleteNode(let id, _):
                try db.cachedStatement(sql: "INSERT OR REPLACE INTO deletion(node, seq, date, device) VALUES (?, ?, ?, ?)")
                    .execute(arguments: [id, Int64(seq), date.nanoseconds, deviceName])
            }
        }
    }

    private static func insertState(_ state: NodeState, seq: UInt64, date: Timespec, deviceName: String, _ db: Database) throws {
        let xattrs: Data? = state.xattrs.isEmpty ? nil : try JSONEncoder().encode(state.xattrs)
        let arguments: [(any DatabaseValueConvertible)?] = [
            state.id, Int64(seq), date.nanoseconds, deviceName, state.kind.rawValue, Int64(state.mode), Int64(state.uid),
            Int64(state.gid), Int64(bitPattern: state.size), state.hash, (state.chunked ?? false) ? 1 : 0, state.pack?.hash,
            state.pack.map { Int64(bitPattern: $0.offset) }, state.target, Int64(bitPattern: state.rdev),
            state.mtime.nanoseconds, state.ctime.nanoseconds, state.btime.nanoseconds, xattrs]
        try db.cachedStatement(sql: """
            INSERT OR REPLACE INTO state(node, seq, date, device, kind, mode, uid, gid, size, hash, chunked, pack, pack_offset,
                                         target, rdev, mtime, ctime, btime, xattrs)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """).execute(arguments: StatementArguments(arguments))
    }

    /// An entry change: the name it gives (if any), and whether it passes
    /// the name from one file to another (`succession`).
    private static func insertEntry(_ parent: NodeID, _ name: FileName, _ child: NodeID?, seq: UInt64, _ db: Database) throws {
        let bytes = Data(name.bytes)
        if let child {
            if let previous = try String.fetchOne(db.cachedStatement(sql: "SELECT child FROM entry WHERE parent = ? AND name = ? AND seq < ? ORDER BY seq DESC LIMIT 1"),
                                                  arguments: [parent, bytes, Int64(seq)]),
               previous != child,
               try String.fetchOne(db.cachedStatement(sql: "SELECT kind FROM state WHERE node = ? ORDER BY seq DESC LIMIT 1"),
                                   arguments: [child]) == NodeKind.file.rawValue {
                try db.cachedStatement(sql: "INSERT OR IGNORE INTO succession(node, previous, seq) VALUES (?, ?, ?)")
                    .execute(arguments: [child, previous, Int64(seq)])
            }
        }
        try insertEntryRow(parent, bytes, child, seq: seq, db)
    }

    private static func insertEntryRow(_ parent: NodeID, _ name: Data, _ child: NodeID?, seq: UInt64, _ db: Database) throws {
        try db.cachedStatement(sql: "INSERT OR REPLACE INTO entry(parent, name, seq, child) VALUES (?, ?, ?, ?)")
            .execute(arguments: [parent, name, Int64(seq), child])
    }

    // MARK: Reading

    /// Every state of `node` this device knows, oldest first; with
    /// `lineage`, also those of the files it succeeded (their states before
    /// it took their name).
    func states(of node: NodeID, lineage: Bool = false) -> [StateRow] {
        (try? db.read { db in
            var rows = try Row.fetchAll(db, sql: "SELECT * FROM state WHERE node = ? ORDER BY seq",
                                        arguments: [node]).compactMap(Self.stateRow)
            guard lineage else { return rows }
            var frontier = [(node, UInt64.max)]
            var seen: Set<String> = [node]
            while let (current, until) = frontier.popLast(), seen.count < 10_000 {
                for row in try Row.fetchAll(db, sql: "SELECT previous, seq FROM succession WHERE node = ?", arguments: [current]) {
                    let previous: String = row["previous"]
                    let taken = min(until, UInt64(bitPattern: row["seq"] as Int64))
                    guard seen.insert(previous).inserted else { continue }
                    rows += try Row.fetchAll(db, sql: "SELECT * FROM state WHERE node = ? AND seq < ? ORDER BY seq",
                                             arguments: [previous, Int64(taken)]).compactMap(Self.stateRow)
                    frontier.append((previous, taken))
                }
            }
            return rows.sorted { $0.seq < $1.seq }
        }) ?? []
    }

    /// Whether another file took `node`'s name (a save that replaced it).
    func wasSucceeded(_ node: NodeID) -> Bool {
        let found = try? db.read { db in
            try Bool.fetchOne(db, sql: "SELECT EXISTS(SELECT 1 FROM succession WHERE previous = ?)", arguments: [node])
        }
        return (found ?? nil) ?? false
    }

    /// The state `node` had just before record `seq`.
    func state(of node: NodeID, before seq: UInt64) -> StateRow? {
        try? db.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM state WHERE node = ? AND seq < ? ORDER BY seq DESC LIMIT 1",
                             arguments: [node, Int64(seq)]).flatMap(Self.stateRow)
        }
    }

    private static func stateRow(_ row: Row) -> StateRow? {
        guard let kind = NodeKind(rawValue: row["kind"]) else { return nil }
        let xattrs = (row["xattrs"] as Data?).flatMap { try? JSONDecoder().decode([String: Data].self, from: $0) } ?? [:]
        let pack = (row["pack"] as String?).map { PackLocation(hash: $0, offset: UInt64(bitPattern: row["pack_offset"] as Int64? ?? 0)) }
        var state = NodeState(id: row["node"], kind: kind, mode: UInt32(row["mode"] as Int64), uid: UInt32(row["uid"] as Int64),
                              gid: UInt32(row["gid"] as Int64), size: UInt64(bitPattern: row["size"] as Int64), hash: row["hash"],
                              target: row["target"], rdev: UInt64(bitPattern: row["rdev"] as Int64),
                              mtime: Timespec(nanoseconds: row["mtime"]), ctime: Timespec(nanoseconds: row["ctime"]),
                              btime: Timespec(nanoseconds: row["btime"]), xattrs: xattrs, base: 0)
        state.chunked = (row["chunked"] as Int64) != 0 ? true : nil
        state.pack = pack
        return StateRow(seq: UInt64(bitPattern: row["seq"] as Int64), date: Timespec(nanoseconds: row["date"]),
                        deviceName: row["device"], state: state)
    }

    /// Where `node` was named last before record `seq` (a hard-linked file:
    /// one of its names).
    func place(of node: NodeID, before seq: UInt64) -> (parent: NodeID, name: FileName)? {
        try? db.read { db in
            try Row.fetchOne(db, sql: "SELECT parent, name FROM entry WHERE child = ? AND seq < ? ORDER BY seq DESC LIMIT 1",
                             arguments: [node, Int64(seq)]).map { row in
                (row["parent"] as String, FileName(bytes: Array(row["name"] as Data)))
            }
        }
    }

    /// Deletions committed at `since` or later, newest first.
    func deletions(since: Timespec) -> [DeletionRow] {
        (try? db.read { db in
            try Row.fetchAll(db, sql: "SELECT node, seq, date, device FROM deletion WHERE date >= ? ORDER BY seq DESC",
                             arguments: [since.nanoseconds]).map { row in
                DeletionRow(node: row["node"], seq: UInt64(bitPattern: row["seq"] as Int64),
                            date: Timespec(nanoseconds: row["date"]), deviceName: row["device"])
            }
        }) ?? []
    }

    /// The latest deletion of `node`.
    func deletion(of node: NodeID) -> DeletionRow? {
        try? db.read { db in
            try Row.fetchOne(db, sql: "SELECT node, seq, date, device FROM deletion WHERE node = ? ORDER BY seq DESC LIMIT 1",
                             arguments: [node]).map { row in
                DeletionRow(node: row["node"], seq: UInt64(bitPattern: row["seq"] as Int64),
                            date: Timespec(nanoseconds: row["date"]), deviceName: row["device"])
            }
        }
    }
}

extension SyncEngine {
    /// Index records just applied or committed (a failure is logged: the
    /// records are read again by `catchUpHistory`).
    func indexHistory(_ records: [(seq: UInt64, changeSet: ChangeSet?)]) {
        history.enqueue(records, container: container)
    }

    /// How long earlier versions and deleted items are kept, from the
    /// container's configuration (the default when it cannot be read).
    func retention() -> TimeInterval {
        ((try? store.containerConfig(container)) ?? nil)?.retention
            ?? Double(ContainerConfig.defaultRetentionDays) * 86_400
    }

    /// Make the history hold every record this replica applied, and every
    /// state and deletion back to the retention limit: records the index
    /// lacks are read from the store again (see `HistoryIndex`). Below the
    /// range already indexed it starts from the newest snapshot at or
    /// before the limit (every node's state there), or from record 1.
    /// Runs on the check thread; cheap when nothing is missing.
    public func catchUpHistory() throws {
        history.settled()
        let applied = replica.read { $0.appliedSeq }
        guard applied > 0 else { return }
        let indexed = history.indexed()
        if let indexed, indexed.high < applied {
            try indexRecords(from: indexed.high + 1, through: applied)
        }
        let complete = indexed?.low ?? UInt64.max
        // Looking for the retention limit costs about 20 reads: once an hour.
        guard complete > 1, historyBackfilled.withLock({ $0.map { -$0.timeIntervalSinceNow > 3600 } ?? true }) else { return }
        let cutoff = Timespec(nanoseconds: clock().nanoseconds - Int64(retention() * 1e9))
        let base = store.compactsJournal ? try store.journalBase(container: container) : 0
        let limit = try JournalSearch.firstRecord(in: store, container: container, since: cutoff, after: base, below: applied + 1)
        defer { historyBackfilled.withLock { $0 = Date() } }
        guard complete > limit else { return }
        // Records up to where the index is complete (all, if it never was).
        let upTo = indexed?.low.map { $0 - 1 } ?? applied
        if let start = try store.snapshots(container: container).last(where: { $0 >= base && $0 < limit }),
           let record = try store.snapshot(container: container, seq: start) {
            try history.indexSnapshotStates(try readParts(of: record), seq: start, date: record.date)
            try indexRecords(from: start + 1, through: upTo)
            try history.lowered(to: start + 1)
        } else {
            try indexRecords(from: 1, through: upTo)
            try history.lowered(to: 1)
        }
    }

    private func indexRecords(from first: UInt64, through last: UInt64) throws {
        guard first <= last else { return }
        var after = first - 1
        while after < last {
            let records = try store.journal(container: container, after: after, limit: 256).filter { $0.seq <= last }
            guard let final = records.last else { break }
            try packs.record(records.reduce(into: [:]) { all, record in
                all.merge(PackIndex.locations(in: record.changeSet?.changes ?? [])) { $1 }
            }, own: false)
            try history.index(records.map { ($0.seq, $0.changeSet) })
            after = final.seq
        }
    }
}
