import UbiquityModel

/// What a pull changed, limited to what the kernel may have cached (nodes
/// and directories it holds references to): the entries to invalidate and
/// the inodes whose attributes (and, if their content changed, pages) to drop.
public struct ReplicaChanges: Sendable {
    public var entries: [(parent: UInt64, name: FileName)] = []
    public var nodes: [UInt64: Bool] = [:]   // ino → content changed
    /// Files whose local content was replaced by a newer remote version.
    public var refresh: [UInt64] = []
    /// Nodes gone for good (deleted elsewhere, unknown to the kernel): their
    /// cache files are removed once the pull is recorded.
    public var dropped: [UInt64] = []
    public var count = 0                      // every change applied, cached or not
    /// What every entry the pull changed named before (whether the kernel
    /// cached it or not), and every node whose state another device
    /// changed (ino → its content changed): what the kernels are shown as
    /// events (`KernelEventScript`).
    public var history = EntryHistory()
    public var edited: [UInt64: Bool] = [:]

    public var isEmpty: Bool { count == 0 }

    public init() {}

    package mutating func entry(_ parent: UInt64, _ name: FileName, in ns: Namespace) {
        count += 1
        if parent == Namespace.rootIno || (ns.node(parent)?.lookups ?? 0) > 0 { entries.append((parent, name)) }
    }

    package mutating func node(_ ino: UInt64, contentChanged: Bool, in ns: Namespace) {
        count += 1
        if ino == Namespace.rootIno || (ns.node(ino)?.lookups ?? 0) > 0 {
            nodes[ino] = (nodes[ino] ?? false) || contentChanged
        }
    }

    public mutating func merge(_ other: ReplicaChanges) {
        entries += other.entries
        nodes.merge(other.nodes) { $0 || $1 }
        refresh += other.refresh
        dropped += other.dropped
        count += other.count
        history.merge(other.history)
        edited.merge(other.edited) { $0 || $1 }
    }
}
