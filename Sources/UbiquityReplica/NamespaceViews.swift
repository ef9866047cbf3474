import UbiquityModel

/// Read-only views of a namespace's `NodeStore`, shaped like the
/// dictionaries they replace (`[UInt64: LocalNode]`,
/// `[UInt64: [FileName: DirEntry]]`, `[NodeID: UInt64]`): a subscript, a
/// count, and iteration as `(key:, value:)` pairs, in no particular order.
/// A view holds the store as it was: a namespace changed meanwhile copies
/// what it changes (so keep views short-lived, like a dictionary held
/// across a change). Values are made when read (`NodeStore.node(slot:)`).

/// Every node by inode number (`Namespace.nodes`).
public struct NodeTable: Sequence, Sendable {
    let store: NodeStore

    public subscript(ino: UInt64) -> LocalNode? { store.node(ino) }
    /// The fields of node `ino` a scan over many items reads, without making the node.
    public func summary(_ ino: UInt64) -> NodeSummary? { store.slot(of: ino).map { store.summary(slot: $0) } }
    public var count: Int { store.count }
    public var isEmpty: Bool { store.count == 0 }
    /// The inode numbers, without reading the nodes.
    public var keys: [UInt64] {
        var out: [UInt64] = []
        out.reserveCapacity(store.count)
        store.forEachSlot { out.append(store.ino(atSlot: $0)) }
        return out
    }
    public var values: LazyMapSequence<NodeTable, LocalNode> { lazy.map(\.value) }

    public struct Iterator: IteratorProtocol {
        let store: NodeStore
        var slot = 0
        public mutating func next() -> (key: UInt64, value: LocalNode)? {
            while slot < store.slotEnd {
                defer { slot += 1 }
                let ino = store.ino(atSlot: slot)
                if ino != 0 { return (ino, store.node(slot: slot)) }
            }
            return nil
        }
    }

    public func makeIterator() -> Iterator { Iterator(store: store) }
    public var underestimatedCount: Int { store.count }
}

/// What a scan over many items reads of a node (`NodeTable.summary`): the
/// same values as the node's fields of these names.
public struct NodeSummary: Sendable, Equatable {
    public let kind: NodeKind
    public let size: UInt64
    public let btime: Timespec
    public let mtime: Timespec
    public let pinned: Bool
}

/// Every directory's entries by the directory's inode number (`Namespace.children`).
public struct DirectoryTable: Sequence, Sendable {
    let store: NodeStore

    public subscript(dir: UInt64) -> Directory? { store.dirs[dir] }
    public var count: Int { store.dirs.count }
    public var keys: Dictionary<UInt64, Directory>.Keys { store.dirs.keys }
    public var values: Dictionary<UInt64, Directory>.Values { store.dirs.values }
    public func makeIterator() -> Dictionary<UInt64, Directory>.Iterator { store.dirs.makeIterator() }
}

/// The inode number of each node ID (`Namespace.inoByID`).
public struct IDTable: Sequence, Sendable {
    let store: NodeStore

    public subscript(id: NodeID) -> UInt64? { store.ino(forID: StoredID(id)) }
    public var count: Int { store.idCount + store.idExceptions.count }
    public func makeIterator() -> IndexingIterator<[(key: NodeID, value: UInt64)]> { store.idMappings().makeIterator() }
}
