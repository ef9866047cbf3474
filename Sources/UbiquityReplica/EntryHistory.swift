import UbiquityModel

/// What the entries a pull changed named before it: for each (folder, name)
/// a remote change set touched, the node there before the first change
/// (nil: nothing), in the order the entries were first touched. With the
/// namespace as it is after the pull, it is the before and after of every
/// changed entry — what the mounts' kernels are shown as events
/// (`UbiquityFS.KernelEventScript`). Recorded by `Namespace.linkEntry` and
/// `unlinkEntry` while `Namespace.entryHistory` is set (only during a pull).
public struct EntryHistory: Sendable {
    /// A node as it was when an entry named it (enough to name it to a
    /// kernel once it is deleted: its inode number and type).
    public struct Earlier: Sendable, Equatable {
        public var ino: UInt64
        public var kind: NodeKind
        public var mode: UInt32
        public init(ino: UInt64, kind: NodeKind, mode: UInt32) {
            self.ino = ino
            self.kind = kind
            self.mode = mode
        }
    }

    public private(set) var order: [EntryKey] = []
    public private(set) var before: [EntryKey: Earlier?] = [:]

    public init() {}

    public var isEmpty: Bool { order.isEmpty }

    /// Record `earlier` as what `key` named, unless the key was touched already.
    public mutating func note(_ key: EntryKey, _ earlier: Earlier?) {
        guard before[key] == nil else { return }
        before[key] = .some(earlier)
        order.append(key)
    }

    /// Append a later history: what it saw first of a key this one has not seen.
    public mutating func merge(_ later: EntryHistory) {
        for key in later.order { note(key, later.before[key]!) }
    }
}
