import Foundation
import Testing
@testable import UbiquityFS
@testable import UbiquityReplica
import UbiquityModel
@testable import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// The event script as a model: random remote changes to folders a kernel
/// holds; performing the script's steps on the before tree, as the kernel
/// would, must be possible at every step (a create finds its name free, a
/// removal or rename finds its node there) and must end at the after tree.
/// The same scripts run on real mounts in Tests/mount/test_events.py.
@Suite struct KernelEventScriptTests {
    /// The visible tree: (parent, name) → node, for every folder reachable from the root.
    static func tree(_ ns: Namespace) -> [KernelKey: UInt64] {
        var out: [KernelKey: UInt64] = [:]
        var folders: [UInt64] = [Namespace.rootIno]
        while let dir = folders.popLast() {
            for (name, entry) in ns.entries(of: dir) {
                out[KernelKey(parent: dir, name: name)] = entry.ino
                if ns.node(entry.ino)?.kind == .directory { folders.append(entry.ino) }
            }
        }
        return out
    }

    @Test(arguments: 1...150) func performingTheStepsLeadsFromBeforeToAfter(seed: Int) throws {
        var r = PartitionModelTests.Random(state: UInt64(seed))
        var ns = Namespace()
        _ = ns.createNode(ino: Namespace.rootIno, id: .root, kind: .directory, mode: 0o755, uid: 0, gid: 0)
        var folders: [UInt64] = [Namespace.rootIno]
        var files: [UInt64] = []
        for i in 0..<12 {
            let dir = folders[r.next(folders.count)]
            let isFolder = r.next(3) == 0
            let ino = ns.createNode(kind: isFolder ? .directory : .file, mode: isFolder ? 0o755 : 0o644, uid: 0, gid: 0)
            ns.linkEntry(dir, FileName("n\(i)"), ino)
            if isFolder { folders.append(ino) } else { files.append(ino) }
        }
        // The kernel holds every folder (a recursive watch looked at them all).
        for dir in folders { ns.updateRuntime(dir) { $0.lookups = 1 } }
        let before = Self.tree(ns)

        ns.entryHistory = EntryHistory()
        var edited: [UInt64: Bool] = [:]
        for step in 0..<(1 + r.next(8)) {
            let live = Self.tree(ns).filter { _ in true }
            let keys = Array(live.keys).sorted { ($0.parent, $0.name) < ($1.parent, $1.name) }
            switch r.next(6) {
            case 0:   // create a file or folder
                let dirs = folders.filter { ns.node($0)?.unlinked == false || $0 == Namespace.rootIno }
                let dir = dirs[r.next(dirs.count)]
                let name = FileName("new\(seed)-\(step)")
                if ns.lookup(dir, name) == nil {
                    let isFolder = r.next(2) == 0
                    let ino = ns.createNode(kind: isFolder ? .directory : .file, mode: 0o644, uid: 0, gid: 0, local: false)
                    ns.linkEntry(dir, name, ino, local: false)
                }
            case 1, 2:   // rename or move (onto a free name, or over a file)
                guard !keys.isEmpty else { break }
                let key = r.pick(keys)
                guard let ino = live[key] else { break }
                let dirs = folders.filter { d in ns.node(d)?.unlinked == false || d == Namespace.rootIno }
                let target = dirs[r.next(dirs.count)]
                if ns.node(ino)?.kind == .directory && (target == ino || Self.isInside(target, ino, ns)) { break }
                let name = r.next(3) == 0 ? keys[r.next(keys.count)].name : FileName("moved\(seed)-\(step)")
                if let occupant = ns.lookup(target, name) {
                    guard occupant != ino, ns.node(occupant)?.kind != .directory, ns.node(ino)?.kind != .directory else { break }
                    ns.unlinkEntry(target, name, local: false)
                }
                ns.unlinkEntry(key.parent, key.name, local: false)
                ns.linkEntry(target, name, ino, local: false)
            case 3:   // delete a file, or an empty folder
                guard !keys.isEmpty else { break }
                let key = r.pick(keys)
                guard let ino = live[key] else { break }
                if ns.node(ino)?.kind == .directory && !ns.entries(of: ino).isEmpty { break }
                ns.unlinkEntry(key.parent, key.name, local: false)
            case 4:   // swap two files' names
                let pair = keys.filter { live[$0].flatMap { ns.node($0) }?.kind == .file }
                guard pair.count >= 2 else { break }
                let (x, y) = (pair[0], pair[1])
                let (a, b) = (live[x]!, live[y]!)
                ns.unlinkEntry(x.parent, x.name, local: false)
                ns.unlinkEntry(y.parent, y.name, local: false)
                ns.linkEntry(x.parent, x.name, b, local: false)
                ns.linkEntry(y.parent, y.name, a, local: false)
            default:   // content edited
                if !files.isEmpty, case let file = r.pick(files), ns.node(file)?.unlinked == false { edited[file] = true }
            }
        }
        var changes = ReplicaChanges()
        changes.history = ns.entryHistory!
        changes.edited = edited
        ns.entryHistory = nil
        let after = Self.tree(ns)
        let view = KernelView(root: Namespace.rootIno, hidden: nil, prefix: [], kernelIno: { $0 })
        let script = KernelEventScript.build(changes, in: ns, view: view)

        // Perform it on the kernel's (before) tree.
        var kernel = before.mapValues { Holding.node(ino: $0, mode: 0) }
        func holds(_ key: KernelKey?) -> Bool {
            guard let key else { return true }
            if let h = kernel[key], case .node = h { return true }
            return false
        }
        for step in script.steps {
            switch step.action {
            case .create(let place, _, _, _, _, _):
                #expect(!holds(place.key), "seed \(seed): create over a present name \(place.key!.name.description)")
            case .remove(let place, _):
                #expect(holds(place.key), "seed \(seed): remove of an absent name \(place.key!.name.description)")
            case .rename(let from, let to):
                #expect(holds(from.key), "seed \(seed): rename of an absent name \(from.key!.name.description)")
                // A rename replaces only what leaves the tree (a move is never told as a deletion).
                if let key = to.key, case .node(let victim, _)? = kernel[key] {
                    let elsewhere = kernel.contains { other in
                        if other.key != key, case .node(let ino, _) = other.value { return ino == victim }
                        return false
                    }
                    #expect(!after.values.contains(victim) || elsewhere, "seed \(seed): a rename drops \(victim), which stays")
                }
            case .modify(let place, _), .attrib(let place):
                #expect(holds(place.key), "seed \(seed): edit of an absent name")
            }
            for (key, holding) in step.updates { kernel[key] = holding }
        }
        var end: [KernelKey: UInt64] = [:]
        for (key, holding) in kernel { if case .node(let ino, _) = holding { end[key] = ino } }
        #expect(end == after, "seed \(seed): the steps end at \(end.count) names, the tree has \(after.count)")
        // Every edit of a file that stays is told.
        for (ino, _) in edited where after.values.contains(ino) && before.values.contains(ino) {
            let names = Set(after.filter { $0.value == ino }.keys)
            #expect(script.steps.contains { step in
                if case .modify(let place, _) = step.action, let key = place.key { return names.contains(key) }
                return false
            }, "seed \(seed): no modify step for edited node \(ino)")
        }
    }

    static func isInside(_ dir: UInt64, _ ancestor: UInt64, _ ns: Namespace) -> Bool {
        var current: UInt64? = dir
        while let c = current {
            if c == ancestor { return true }
            current = ns.directoryParent[c]
        }
        return false
    }
}
