import Foundation
import Testing
@testable import UbiquityReplica
import UbiquityModel
import UbiquityStore

/// The namespace's resident form (`NodeStore`): whatever a node, an entry
/// or an ID mapping holds reads back exactly as it was written, checked
/// against plain dictionaries over random values and random sequences of
/// changes (names shared between entries and nodes, names compacted,
/// indexes grown and shrunk, IDs that are and are not UUIDs).
@Suite struct NodeStoreTests {
    struct Random: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    /// Every field of a node, as text (xattrs sorted).
    static func describe(_ n: LocalNode) -> String {
        var copy = n
        let xattrs = n.xattrs.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value.base64EncodedString())" }
        copy.xattrs = [:]
        return "\(copy) id=\(n.id) hash=\(n.hash ?? "-") verified=\(n.verifiedHash ?? "-") xattrs=\(xattrs)"
    }

    /// What the store gives back for `n`: the same node, except that
    /// `lastContentChange` is kept only while there is content to push.
    static func expected(_ n: LocalNode) -> String {
        var n = n
        if !n.hasUnpushedContent { n.lastContentChange = 0 }
        return describe(n)
    }

    static func pick<T>(_ values: [T], _ r: inout Random) -> T { values[Int(r.next() % UInt64(values.count))] }

    static let hashes: [String?] = [nil, String(repeating: "ab", count: 32), ContentCopy.hash(of: Data("x".utf8)),
                                     "abc", String(repeating: "AB", count: 32), ""]
    static let times: [Timespec] = [Timespec(sec: 1_700_000_000, nsec: 5), Timespec(sec: 0, nsec: 0),
                                    Timespec(sec: -5, nsec: 999_999_999), Timespec(sec: Int64.max, nsec: 1),
                                    Timespec(sec: 1, nsec: 2_000_000_000), Timespec(sec: 1_800_000_000, nsec: 123_456_789)]
    static let counters: [UInt64] = [0, 1, 7, 0xFF, 0x100, 0xFFFF, 0x1_0000, 0xFFFF_FFFF, 0x1_0000_0000, 1 << 48, UInt64.max]

    static func randomNode(ino: UInt64, _ r: inout Random) -> LocalNode {
        let ids: [NodeID] = [.next(), .next(), .random(), "root", "documents", NodeID.random().uppercased(),
                             NodeID.next().uppercased(), "an-id", "", Self.foreignSeriesID]
        let kind = pick([NodeKind.file, .file, .directory, .symlink, .fifo, .charDevice], &r)
        var n = LocalNode(ino: ino, id: pick(ids, &r), kind: kind, mode: pick([0o100644, 0o40755, 0o777, 0x1_2345], &r),
                          uid: pick([0, 1000, UInt32.max], &r), gid: pick([0, 100, 70000], &r),
                          size: pick(counters, &r), rdev: pick([0, 0, 0x0803], &r),
                          target: kind == .symlink ? pick(["t", "../x/y"], &r) : nil, time: pick(times, &r))
        n.hash = pick(hashes, &r)
        n.hashSize = pick([n.size, n.size, 0, 42], &r)
        n.chunked = r.next() & 1 == 0
        n.mtime = pick(times, &r)
        n.ctime = pick([n.mtime, n.mtime, pick(times, &r)], &r)
        n.btime = pick(times, &r)
        n.atime = pick([n.btime, n.mtime, n.ctime, pick(times, &r)], &r)
        if r.next() % 4 == 0 { n.xattrs = ["user.a": Data([1, 2]), "user.b": Data()] }
        n.hasContent = r.next() & 1 == 0
        n.contentGeneration = pick(counters, &r)
        n.pushedGeneration = pick([n.contentGeneration, n.contentGeneration, 0, pick(counters, &r)], &r)
        n.version = pick(counters, &r)
        n.change = pick(counters, &r)
        n.pushed = pick([n.change, n.change, 0, pick(counters, &r)], &r)
        n.nlink = UInt32(truncatingIfNeeded: pick(counters, &r))
        n.unlinked = r.next() & 1 == 0
        n.lastParent = pick([0, 1, 2, 1 << 50], &r)
        n.lastName = pick(["", "name", "ü", FileName(bytes: [0xff, 0xfe])], &r)
        if r.next() % 4 == 0 { n.conflicts = [.random(), "x"] }
        n.pinned = r.next() & 1 == 0
        n.author = pick(["", "device-a", "device-b"], &r)
        n.verifiedHash = pick([nil, n.hash, pick(hashes, &r)], &r)
        n.unacknowledgedWrites = r.next() & 1 == 0
        n.lookups = pick(counters, &r)
        n.openCount = pick([0, 0, 1, -1, Int32.max], &r)
        n.openWriters = pick([0, 0, 2], &r)
        n.opening = pick([0, 0, 1], &r)
        n.lastContentChange = pick(counters, &r)
        n.lastAccess = UInt32(truncatingIfNeeded: pick(counters, &r))
        n.contentEpoch = UInt32(truncatingIfNeeded: pick(counters, &r))
        return n
    }

    /// An ID of version 8 made elsewhere (another series).
    static let foreignSeriesID: NodeID = "0123abcd-4567-8def-9abc-0000000000ff"

    /// `NodeID.next()`: UUIDs of version 8 of one series, counted up.
    @Test func madeIDsAreOneSeriesCounted() throws {
        let made = (0..<1_000).map { _ in NodeID.next() }
        #expect(Set(made).count == made.count)
        let words = try made.map { try #require(Hex.uuid($0)) }
        for (high, low) in words {
            #expect((high >> 12) & 0xF == 8)
            #expect(low >> 62 == 0b10)
            #expect(high == words[0].0 && low >> 48 == words[0].1 >> 48)
        }
        // Counted up (other tests make IDs at the same time, so not one by one).
        for i in 1..<words.count { #expect(words[i].1 & NodeID.seriesCountMask > words[i - 1].1 & NodeID.seriesCountMask) }
    }

    /// Past 65,535 series an ID of version 8 is kept whole, and reads back
    /// the same; so does an ID of a series once its node is rewritten.
    @Test func idsPastTheLastSeriesNumberReadBack() {
        let store = NodeStore()
        var ids: [UInt64: NodeID] = [:]
        for ino in UInt64(1)...70_000 {
            let id = NodeID.uuid(0x1234_5678_0000_8000 | ino << 16, 0x8000_0000_0000_0001)
            ids[ino] = id
            store.set(LocalNode(ino: ino, id: id, kind: .file, mode: 0o100644, uid: 0, gid: 0, time: .now()))
            store.setIno(ino, forID: StoredID(id))
        }
        #expect(store.idSeries.values.count == Int(UInt16.max))
        #expect(store.wideIDs.count == 70_000 - Int(UInt16.max))
        for (ino, id) in ids {
            #expect(store.node(ino)?.id == id)
            #expect(store.ino(forID: StoredID(id)) == ino)
        }
        // A node whose ID changes from wide to a known series and back.
        var n = store.node(69_999)!
        n.id = ids[1]!
        store.setIno(nil, forID: StoredID(ids[1]!))
        store.set(n)
        #expect(store.wideIDs[UInt32(store.slot(of: 69_999)!)] == nil)
        #expect(store.node(69_999)?.id == ids[1])
        n.id = .random()
        store.set(n)
        store.setIno(69_999, forID: StoredID(n.id))
        #expect(store.node(69_999)?.id == n.id)
        #expect(store.ino(forID: StoredID(n.id)) == 69_999)
    }

    @Test func everyNodeReadsBackAsWritten() {
        var r = Random(state: 1)
        let store = NodeStore()
        var model: [UInt64: LocalNode] = [:]
        for round in 0..<20_000 {
            let ino = 1 + r.next() % 3_000
            if round % 7 == 6 {
                store.remove(ino)
                model[ino] = nil
            } else {
                let n = Self.randomNode(ino: ino, &r)
                store.set(n)
                model[ino] = n
            }
        }
        #expect(store.count == model.count)
        for (ino, n) in model { #expect(store.node(ino).map(Self.describe) == Self.expected(n)) }
        // A scan's summary of a node: the same values as the node's fields.
        let table = Namespace(store: store).nodes
        for (ino, n) in model {
            #expect(table.summary(ino) == NodeSummary(kind: n.kind, size: n.size, btime: n.btime, mtime: n.mtime, pinned: n.pinned))
        }
        #expect(table.summary(999_999) == nil)
        var seen = 0
        for (ino, n) in Namespace(store: store).nodes {
            seen += 1
            #expect(Self.describe(n) == model[ino].map(Self.expected))
        }
        #expect(seen == model.count)
    }

    /// Entries, last names that share their entry's bytes, and the ID map,
    /// under random changes, against dictionaries.
    @Test func entriesNamesAndIDsMatchDictionaries() {
        var r = Random(state: 2)
        let store = NodeStore()
        var nodes: [UInt64: LocalNode] = [:]
        var dirs: [UInt64: [FileName: DirEntry]] = [:]
        var ids: [NodeID: UInt64] = [:]
        let idPool: [NodeID] = (0..<40).map { $0 % 5 == 0 ? "id-\($0)" : $0 % 2 == 0 ? NodeID.random() : NodeID.next() }
        func randomName() -> FileName {
            let base = Self.pick(["a", "file-", String(repeating: "long-name-", count: 20), "ü"], &r)
            return FileName(base + String(r.next() % 60))
        }
        var cookie: UInt64 = 3
        for round in 0..<40_000 {
            let ino = 1 + r.next() % 120
            let dir = 1 + r.next() % 6
            switch r.next() % 10 {
            case 0, 1:
                // A node (re)written: its last name is often the name of an entry naming it.
                var n = Self.randomNode(ino: ino, &r)
                n.id = Self.pick(idPool, &r)
                if let (parent, name) = dirs.lazy.flatMap({ d in d.value.lazy.map { (d.key, $0.key, $0.value.ino) } })
                    .first(where: { $0.2 == ino }).map({ ($0.0, $0.1) }), r.next() & 1 == 0 {
                    n.lastParent = parent
                    n.lastName = name
                }
                store.set(n)
                nodes[ino] = n
            case 2:
                store.remove(ino)
                nodes[ino] = nil
            case 3, 4, 5:
                let name = randomName()
                cookie += 1
                store.setEntry(dir, name, DirEntry(ino: ino, cookie: cookie))
                dirs[dir, default: [:]][name] = DirEntry(ino: ino, cookie: cookie)
                // Linking sets the node's last name, as `Namespace.linkEntry` does.
                if var n = nodes[ino] {
                    n.lastParent = dir
                    n.lastName = name
                    store.set(n)
                    nodes[ino] = n
                }
            case 6, 7:
                let name = dirs[dir].flatMap { $0.isEmpty ? nil : Array($0.keys)[Int(r.next() % UInt64($0.count))] } ?? randomName()
                let removed = store.removeEntry(dir, name)
                #expect(removed?.ino == dirs[dir]?[name]?.ino)
                dirs[dir]?[name] = nil
            case 8:
                if round % 50 == 0 {
                    store.setDirectory(dir, r.next() & 1 == 0 ? nil : Directory())
                    dirs[dir] = store.dirs[dir] == nil ? nil : [:]
                }
            default:
                let id = Self.pick(idPool, &r)
                let target: UInt64? = r.next() % 3 == 0 ? nil : ino
                store.setIno(target, forID: StoredID(id))
                ids[id] = target
            }
            if round % 997 == 0 || round == 39_999 {
                for (ino, n) in nodes { #expect(store.node(ino).map(Self.describe) == Self.expected(n), "node \(ino) round \(round)") }
                for (dir, entries) in dirs {
                    let table = store.dirs[dir]
                    #expect(table?.count ?? 0 == entries.count)
                    for (name, entry) in entries {
                        #expect(table?[name]?.ino == entry.ino && table?[name]?.cookie == entry.cookie)
                    }
                    let listed = Dictionary(uniqueKeysWithValues: (table ?? Directory()).map { ($0.key, $0.value.ino) })
                    #expect(listed == entries.mapValues(\.ino))
                }
                for id in idPool { #expect(store.ino(forID: StoredID(id)) == ids[id], "id \(id) round \(round)") }
                let listed = Dictionary(uniqueKeysWithValues: store.idMappings().map { ($0.key, $0.value) })
                #expect(listed == ids.compactMapValues { $0 })
            }
        }
    }

    /// Inode numbers are given out in order and never again: a mount where
    /// files come and go (a clone, then `rm -rf` of the one before) has live
    /// numbers spread over many times its table. Finding a node, or finding
    /// that a new number is not there yet (once per new node), still looks at
    /// a few buckets only.
    @Test func lookupsAndRemovalsStayShortAfterFilesCameAndWent() {
        let store = NodeStore()
        var next: UInt64 = 2
        var previous: [UInt64] = []
        var worst = 0.0
        var worstRemoval = 0.0
        /// Buckets looked at to find `ino` or that it is not there.
        func cost(_ ino: UInt64) -> Int {
            var b = NodeStore.home(ofIno: ino, store.inoBuckets.count)
            var looked = 1
            while store.inoBuckets[b] != 0, store.ino(atSlot: Int(store.inoBuckets[b] - 1)) != ino {
                looked += 1
                b = (b + 1) % store.inoBuckets.count
            }
            return looked
        }
        /// Buckets from `ino`'s to the end of its cluster: what removing it walks (moving later members back).
        func clusterAfter(_ ino: UInt64) -> Int {
            var b = NodeStore.home(ofIno: ino, store.inoBuckets.count)
            var walked = 0
            while store.inoBuckets[b] != 0 {
                walked += 1
                b = (b + 1) % store.inoBuckets.count
            }
            return walked
        }
        for _ in 0..<40 {
            var round: [UInt64] = []
            for _ in 0..<3_000 {
                store.set(LocalNode(ino: next, id: .random(), kind: .file, mode: 0o100644, uid: 0, gid: 0, time: .now()))
                round.append(next)
                next += 1
            }
            let live = previous + round
            let total = live.reduce(0) { $0 + cost($1) } + (next..<(next + 1_000)).reduce(0) { $0 + cost($1) }
            worst = max(worst, Double(total) / Double(live.count + 1_000))
            worstRemoval = max(worstRemoval, Double(previous.reduce(0) { $0 + clusterAfter($1) }) / Double(max(1, previous.count)))
            for ino in previous { store.remove(ino) }
            previous = round
        }
        #expect(store.count == 3_000)
        for ino in previous { #expect(store.node(ino)?.ino == ino) }
        // Load at most 0.8: a few buckets on average for a random placement.
        #expect(worst < 10, "\(worst) buckets per lookup on average")
        // About 1/(1 - load)² for a random placement; with the number modulo
        // the capacity, consecutive numbers made clusters of thousands.
        #expect(worstRemoval < 100, "\(worstRemoval) buckets per removal on average")
    }

    /// A copy of a namespace does not see changes made to the original, nor the other way round.
    @Test func copiesAreIndependent() {
        var a = Namespace()
        let dir = a.createNode(kind: .directory, mode: 0o755, uid: 0, gid: 0)
        let file = a.createNode(kind: .file, mode: 0o644, uid: 0, gid: 0)
        a.linkEntry(dir, "f", file)
        var b = a
        let view = a.nodes
        b.update(file) { $0.size = 9 }
        b.unlinkEntry(dir, "f")
        #expect(a.node(file)?.size == 0)
        #expect(a.lookup(dir, "f") == file)
        #expect(view[file]?.size == 0)
        #expect(b.node(file)?.size == 9)
        #expect(b.lookup(dir, "f") == nil)
        #expect(b.node(file)?.lastName == "f")
        a.update(file) { $0.mode = 0o600 }
        #expect(b.node(file)?.mode == 0o644)
    }

    /// A push round's nodes (`Namespace.smallest`): the smallest inode
    /// numbers of the backlog, in order, whatever order the set gives them
    /// in; fewer values than asked for gives them all.
    @Test func theSmallestAreTheFirstOfTheSortedValues() {
        var rng = Random(state: 7)
        for round in 0..<40 {
            let n = Int(rng.next() % 20_000)
            var values = Set<UInt64>()
            let spread: UInt64 = round % 3 == 0 ? 50_000 : 1 << 48
            while values.count < n { values.insert(1 + rng.next() % spread) }
            for count in [1, 7, 4000] {
                #expect(Namespace.smallest(count, of: values) == Array(values.sorted().prefix(count)), "round \(round), \(count) of \(n)")
            }
        }
        #expect(Namespace.smallest(0, of: [3, 1, 2]) == [])
        #expect(Namespace.smallest(5, of: [3, 1, 2]) == [1, 2, 3])
    }
}

extension Namespace {
    init(store: NodeStore) {
        self.init()
        self.store = store
    }
}
