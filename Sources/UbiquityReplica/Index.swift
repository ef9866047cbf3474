import Foundation
import GRDB
import UbiquityLocks
import UbiquityModel

/// The replica's persistent index: one SQLite database (GRDB, WAL,
/// `synchronous=NORMAL`) holding every node, entry and pending change.
///
/// The index is written only by `IndexApplier`, which copies the replica's
/// operation log into it in the background (see `OperationLog`: a change is
/// committed when its log record is written), and by the replay of that log
/// when a replica opens; it is read once, at mount, to rebuild the in-memory
/// `Namespace`.
///
/// SQLite's automatic checkpoint is off: `IndexApplier` calls
/// `checkpointIfDue()` between its transactions instead.
final class Index: Sendable {
    let db: DatabaseQueue
    /// Transactions and operations written since the last checkpoint.
    let sinceCheckpoint = Lock<(transactions: Int, ops: Int)>((0, 0))

    init(path: String, readOnly: Bool = false) throws {
        var config = Configuration()
        config.label = "ubiquityfs.index"
        config.readonly = readOnly
        // A daemon that just stopped may still be closing the database.
        config.busyMode = .timeout(10)
        if !readOnly {
            config.prepareDatabase { db in
                try db.execute(sql: "PRAGMA journal_mode=WAL")
                try db.execute(sql: "PRAGMA synchronous=NORMAL")
                try db.execute(sql: "PRAGMA wal_autocheckpoint=0")
            }
        }
        do {
            db = try DatabaseQueue(path: path, configuration: config)
            if !readOnly { try migrator.migrate(db) }
        } catch {
            throw UbiquityError(EIO, "cannot open the replica index \(path): \(error)")
        }
    }

    /// An in-memory copy of `other` (for reading an index together with
    /// the operation log records it lacks, without writing the file).
    init(copyOf other: Index) throws {
        do {
            db = try DatabaseQueue()
            try other.db.backup(to: db)
            try migrator.migrate(db)
        } catch {
            throw UbiquityError(EIO, "cannot read the replica index: \(error)")
        }
    }

    /// Give back SQLite's page cache and prepared statements.
    func releaseMemory() { db.releaseMemory() }

    /// Number of the last operation log record the index holds (0: none).
    func logApplied() throws -> UInt64 {
        do {
            return try db.read { db in
                try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'log_applied'").flatMap { UInt64($0) } ?? 0
            }
        } catch {
            throw UbiquityError(EIO, "cannot read the replica index: \(error)")
        }
    }

    var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE node(
                  ino INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, kind TEXT NOT NULL,
                  mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
                  size INTEGER NOT NULL, rdev INTEGER NOT NULL, target TEXT,
                  hash TEXT, hash_size INTEGER NOT NULL, chunked INTEGER NOT NULL,
                  atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL, btime INTEGER NOT NULL,
                  xattrs BLOB, has_content INTEGER NOT NULL,
                  content_gen INTEGER NOT NULL, pushed_gen INTEGER NOT NULL,
                  version INTEGER NOT NULL, change INTEGER NOT NULL, pushed INTEGER NOT NULL,
                  unlinked INTEGER NOT NULL, last_parent INTEGER NOT NULL, last_name BLOB NOT NULL,
                  conflicts TEXT, pinned INTEGER NOT NULL, author TEXT NOT NULL);
                CREATE TABLE entry(parent INTEGER NOT NULL, name BLOB NOT NULL, child INTEGER NOT NULL,
                  PRIMARY KEY(parent, name)) WITHOUT ROWID;
                CREATE TABLE pending_entry(parent INTEGER NOT NULL, name BLOB NOT NULL, change INTEGER NOT NULL,
                  PRIMARY KEY(parent, name)) WITHOUT ROWID;
                CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
                """)
        }
        // What a pending entry named before this device changed it (0: nothing).
        m.registerMigration("v2") { db in
            try db.execute(sql: "ALTER TABLE pending_entry ADD COLUMN base INTEGER NOT NULL DEFAULT 0")
        }
        // The hash the local copy was verified against; writes not acknowledged yet.
        m.registerMigration("v3") { db in
            try db.execute(sql: "ALTER TABLE node ADD COLUMN verified_hash TEXT")
            try db.execute(sql: "ALTER TABLE node ADD COLUMN unacknowledged INTEGER NOT NULL DEFAULT 0")
        }
        // Journal records skipped because they failed validation.
        m.registerMigration("v4") { db in
            try db.execute(sql: """
                CREATE TABLE quarantined_record(seq INTEGER PRIMARY KEY, reason TEXT NOT NULL, date REAL NOT NULL)
                """)
        }
        return m
    }

    /// Write `ops` in one transaction: all or nothing. A disk with no room
    /// for them is `ENOSPC`, any other failure `EIO`.
    func write(_ ops: [IndexOp]) throws {
        guard !ops.isEmpty else { return }
        do {
            try writeTransaction(ops)
        } catch let error as DatabaseError where error.resultCode == .SQLITE_FULL {
            throw UbiquityError(ENOSPC, "the replica's disk is full: the index cannot record the change (\(error.message ?? "SQLITE_FULL"))")
        } catch {
            throw UbiquityError(EIO, "replica index write failed: \(error)")
        }
        sinceCheckpoint.withLock { $0.transactions += 1; $0.ops += ops.count }
    }

    /// About how often SQLite's own automatic checkpoint would run (every
    /// 1,000 WAL pages): after 200 transactions or 4,000 operations.
    func checkpointIfDue() {
        let due = sinceCheckpoint.withLock { count -> Bool in
            guard count.transactions >= 200 || count.ops >= 4_000 else { return false }
            count = (0, 0)
            return true
        }
        // A checkpoint that fails (a full disk) leaves the WAL as it is; the next one catches up.
        if due { _ = try? db.writeWithoutTransaction { try $0.checkpoint(.passive) } }
    }

    /// Make every committed transaction survive a power loss: a checkpoint
    /// (SQLite syncs the WAL before copying it, and the database file
    /// after). False when a reader kept part of the WAL from being copied,
    /// or it failed: then what it holds may not be on disk yet.
    func checkpointDurably() -> Bool {
        guard let result = try? db.writeWithoutTransaction({ try $0.checkpoint(.passive) }) else { return false }
        return result.checkpointedFrameCount == result.walFrameCount
    }

    /// Move the whole WAL into the database file and empty it (a replica
    /// being closed leaves its index in one file). A failure (a full disk)
    /// leaves the WAL as it is: SQLite replays it on the next open.
    func checkpointAll() {
        _ = try? db.writeWithoutTransaction { try $0.checkpoint(.truncate) }
        sinceCheckpoint.withLock { $0 = (0, 0) }
    }

    func writeTransaction(_ ops: [IndexOp]) throws {
        try db.write { db in
            let upsert = try db.cachedStatement(sql: """
                INSERT OR REPLACE INTO node VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
                """)
            for op in ops {
                switch op {
                case .node(let n):
                    let xattrs: Data? = n.xattrs.isEmpty ? nil : try JSONEncoder().encode(n.xattrs)
                    let args: [(any DatabaseValueConvertible)?] = [
                        Int64(bitPattern: n.ino), n.id, n.kind.rawValue, Int64(n.mode), Int64(n.uid), Int64(n.gid),
                        Int64(bitPattern: n.size), Int64(bitPattern: n.rdev), n.target, n.hash, Int64(bitPattern: n.hashSize), n.chunked,
                        n.atime.nanoseconds, n.mtime.nanoseconds, n.ctime.nanoseconds, n.btime.nanoseconds,
                        xattrs, n.hasContent, Int64(bitPattern: n.contentGeneration), Int64(bitPattern: n.pushedGeneration),
                        Int64(bitPattern: n.version), Int64(bitPattern: n.change), Int64(bitPattern: n.pushed), n.unlinked,
                        Int64(bitPattern: n.lastParent), Data(n.lastName.bytes),
                        n.conflicts.isEmpty ? nil : n.conflicts.joined(separator: "\n"), n.pinned, n.author,
                        n.verifiedHash, n.unacknowledgedWrites,
                    ]
                    try upsert.execute(arguments: StatementArguments(args))
                case .removeNode(let ino):
                    try db.cachedStatement(sql: "DELETE FROM node WHERE ino = ?").execute(arguments: [Int64(bitPattern: ino)])
                case .entry(let parent, let name, let child):
                    try db.cachedStatement(sql: "INSERT OR REPLACE INTO entry VALUES (?,?,?)")
                        .execute(arguments: [Int64(bitPattern: parent), Data(name.bytes), Int64(bitPattern: child)])
                case .removeEntry(let parent, let name):
                    try db.cachedStatement(sql: "DELETE FROM entry WHERE parent = ? AND name = ?")
                        .execute(arguments: [Int64(bitPattern: parent), Data(name.bytes)])
                case .pendingEntry(let parent, let name, let change, let base):
                    try db.cachedStatement(sql: "INSERT OR REPLACE INTO pending_entry(parent, name, change, base) VALUES (?,?,?,?)")
                        .execute(arguments: [Int64(bitPattern: parent), Data(name.bytes), Int64(bitPattern: change),
                                             Int64(bitPattern: base)])
                case .clearPendingEntry(let parent, let name):
                    try db.cachedStatement(sql: "DELETE FROM pending_entry WHERE parent = ? AND name = ?")
                        .execute(arguments: [Int64(bitPattern: parent), Data(name.bytes)])
                case .meta(let key, let value):
                    try db.cachedStatement(sql: "INSERT OR REPLACE INTO meta VALUES (?,?)").execute(arguments: [key, value])
                case .quarantine(let record):
                    try db.cachedStatement(sql: "INSERT OR REPLACE INTO quarantined_record VALUES (?,?,?)")
                        .execute(arguments: [Int64(bitPattern: record.seq), record.reason, record.date.timeIntervalSince1970])
                case .journaledContent, .contentOnDisk:
                    break   // the operation log's alone (`JournaledContent`)
                }
            }
        }
    }

    /// Rebuild the in-memory namespace from the index.
    ///
    /// Nodes first, then entries (which set each linked node's last name,
    /// and count links), then the last names of nodes no entry names: a
    /// last name is held as a reference to its entry's bytes where there is
    /// one (`NodeStore`), so it is set once the entries are in.
    func load() throws -> Namespace {
        var ns = Namespace()
        let store = ns.storeForWriting()
        try db.read { db in
            let decoder = JSONDecoder()
            let rows = try Row.fetchCursor(db, sql: "SELECT * FROM node")
            while let row = try rows.next() {
                let ino = UInt64(bitPattern: row["ino"])
                guard let kind = NodeKind(rawValue: row["kind"]) else {
                    throw UbiquityError(EIO, "replica index: node \(ino) has unknown kind")
                }
                var n = LocalNode(ino: ino, id: row["id"], kind: kind, mode: UInt32(row["mode"] as Int64),
                                  uid: UInt32(row["uid"] as Int64), gid: UInt32(row["gid"] as Int64),
                                  size: UInt64(bitPattern: row["size"]), rdev: UInt64(bitPattern: row["rdev"]),
                                  target: row["target"], time: Timespec(nanoseconds: row["mtime"]))
                n.hash = row["hash"]
                n.hashSize = UInt64(bitPattern: row["hash_size"])
                n.chunked = row["chunked"]
                n.atime = Timespec(nanoseconds: row["atime"])
                n.ctime = Timespec(nanoseconds: row["ctime"])
                n.btime = Timespec(nanoseconds: row["btime"])
                if let data = row["xattrs"] as Data? { n.xattrs = try decoder.decode([String: Data].self, from: data) }
                n.hasContent = row["has_content"]
                n.contentGeneration = UInt64(bitPattern: row["content_gen"])
                n.pushedGeneration = UInt64(bitPattern: row["pushed_gen"])
                n.version = UInt64(bitPattern: row["version"])
                n.change = UInt64(bitPattern: row["change"])
                n.pushed = UInt64(bitPattern: row["pushed"])
                n.unlinked = row["unlinked"]
                n.pinned = row["pinned"]
                n.author = row["author"]
                // (A read-only open of an index not migrated yet has neither column.)
                n.verifiedHash = row["verified_hash"]
                n.unacknowledgedWrites = row["unacknowledged"] as Bool? ?? false
                n.lastParent = UInt64(bitPattern: row["last_parent"])
                if let conflicts = row["conflicts"] as String? { n.conflicts = conflicts.split(separator: "\n").map(String.init) }
                n.nlink = 0
                store.set(n)
                store.setIno(ino, forID: n.storedID)
                if n.hasUnpushedMetadata || n.hasUnpushedContent { ns.unpushed.insert(ino) }
                if kind == .directory { store.setDirectory(ino, Directory()) }
                ns.nextIno = max(ns.nextIno, ino + 1)
                ns.changeCounter = max(ns.changeCounter, n.change)
            }
            let entries = try Row.fetchCursor(db, sql: "SELECT parent, name, child FROM entry")
            while let row = try entries.next() {
                let parent = UInt64(bitPattern: row[0])
                let child = UInt64(bitPattern: row[2])
                guard store.contains(parent), var node = store.node(child) else { continue }
                let name = FileName(bytes: Array(row[1] as Data))
                store.setEntry(parent, name, DirEntry(ino: child, cookie: ns.nextCookie))
                node.lastParent = parent
                node.lastName = name
                ns.nextCookie += 1
                if node.kind == .directory {
                    store.set(node)
                    if var up = store.node(parent) {
                        up.nlink += 1
                        store.set(up)
                    }
                    ns.directoryParent[child] = parent
                } else {
                    node.nlink += 1
                    store.set(node)
                }
            }
            for dir in store.dirs.keys where store.kind(of: dir) == .directory {
                if var node = store.node(dir) {
                    node.nlink += 2
                    store.set(node)
                }
            }
            // The last names of the nodes no entry names (unlinked ones).
            let names = try Row.fetchCursor(db, sql: "SELECT ino, last_name FROM node")
            while let row = try names.next() {
                let ino = UInt64(bitPattern: row[0])
                let bytes = row[1] as Data
                guard !bytes.isEmpty, var node = store.node(ino), node.lastName.isEmpty else { continue }
                node.lastName = FileName(bytes: Array(bytes))
                store.set(node)
            }
            // `SELECT *`: a read-only open of an index not migrated yet has no `base`.
            let pending = try Row.fetchCursor(db, sql: "SELECT * FROM pending_entry")
            while let row = try pending.next() {
                let change = UInt64(bitPattern: row["change"])
                let key = EntryKey(parent: UInt64(bitPattern: row["parent"]), name: FileName(bytes: Array(row["name"] as Data)))
                ns.pendingEntries[key] = PendingEntry(change: change, base: UInt64(bitPattern: row["base"] as Int64? ?? 0))
                ns.changeCounter = max(ns.changeCounter, change)
            }
            if let next = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'next_ino'"), let n = UInt64(next) {
                ns.nextIno = max(ns.nextIno, n)
            }
            if let applied = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'applied_seq'"), let n = UInt64(applied) {
                ns.appliedSeq = n
            }
            // (A read-only open of an index not migrated yet has no such table.)
            if try db.tableExists("quarantined_record") {
                let rows = try Row.fetchCursor(db, sql: "SELECT seq, reason, date FROM quarantined_record ORDER BY seq")
                while let row = try rows.next() {
                    ns.quarantined.append(QuarantinedRecord(seq: UInt64(bitPattern: row[0]), reason: row[1],
                                                            date: Date(timeIntervalSince1970: row[2])))
                }
            }
        }
        return ns
    }
}
