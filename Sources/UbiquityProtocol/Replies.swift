/// The answer to a request: JSON lines, zero or more updates, then exactly
/// one final line, after which the daemon closes the connection.
///
/// - updates: `{"pushing":{…}}` (unmount), `{"downloading":{…}}` (download),
///   `{"event":KIND,…}` (query; the daemon writes result lines by hand, in
///   the same shape, for speed);
/// - success: `{"ok":true,"protocol":"1.0", …the command's result fields}`;
/// - failure: `{"error":MESSAGE,"code":CODE,"errno":N,"protocol":"1.0"}`.
///
/// A client reading an answer checks the final line's `protocol`
/// (`ProtocolVersion`); a line it does not know is another protocol's.
public enum Reply<Result: Codable & Sendable>: Sendable {
    case update(Update)
    case done(Result)
    case failed(ControlError)
}

/// A line before the final one.
public enum Update: Sendable, Equatable {
    case pushing(PushProgress)
    case downloading(DownloadProgress)
    case event(QueryEvent)
    /// `coordinate`: the access may begin (`{"granted":true}`).
    case granted
    /// `present`: another access to the item is coming; answer
    /// `{"relinquished":ID}` once the presenter let go (since 1.2).
    case relinquish(PresenterAsk)
    /// `present`: the access `relinquish` announced has ended (since 1.2).
    case reacquire(UInt64)
}

/// What a presenter is asked to do before another access to its item.
public struct PresenterAsk: Sendable, Equatable, Codable {
    public enum Access: String, Sendable, Codable {
        /// Save what it holds, let the reader read (`relinquishPresentedItem(toReader:)`).
        case reading
        /// Save what it holds, stop using the item until `reacquire` (`relinquishPresentedItem(toWriter:)`).
        case writing
        /// The item is about to be deleted (`accommodatePresentedItemDeletion`).
        case deleting
    }
    public var id: UInt64
    public var access: Access

    public init(id: UInt64, access: Access) {
        self.id = id
        self.access = access
    }
}

/// A `present` client's answer, on the connection after its request.
public struct PresenterAnswer: Sendable, Equatable, Codable {
    public var relinquished: UInt64
    public init(relinquished: UInt64) { self.relinquished = relinquished }
}

/// What `unmount` still has to push.
public struct PushProgress: Sendable, Equatable, Codable {
    public var itemsLeft: Int
    public var bytesLeft: UInt64

    public init(itemsLeft: Int, bytesLeft: UInt64) {
        self.itemsLeft = itemsLeft
        self.bytesLeft = bytesLeft
    }
}

/// How far `download` has come.
public struct DownloadProgress: Sendable, Equatable, Codable {
    public var items: Int
    public var totalItems: Int
    public var bytes: UInt64
    public var totalBytes: UInt64

    public init(items: Int, totalItems: Int, bytes: UInt64, totalBytes: UInt64) {
        self.items = items
        self.totalItems = totalItems
        self.bytes = bytes
        self.totalBytes = totalBytes
    }
}

/// One line of a query's answer: a result (before `gatheringFinished`), an
/// update (`added`, `changed`, `removed`, with `watch`), or a heartbeat
/// (now and then while nothing changes, to find out whether the client left).
/// `ubiquityfs query --json` prints these lines as they come.
public struct QueryEvent: Sendable, Equatable, Codable {
    public enum Kind: String, Sendable, Codable {
        case result, added, changed, removed, gatheringFinished, heartbeat
    }
    public var event: Kind
    /// The item's number for this query: the same in every event about it,
    /// whatever its path becomes (since protocol 1.1).
    public var id: UInt64?
    /// The item's attributes (result, added, changed, removed).
    public var item: [String: JSONValue]?
    /// How many results (gatheringFinished).
    public var count: Int?

    public init(_ event: Kind, id: UInt64? = nil, item: [String: JSONValue]? = nil, count: Int? = nil) {
        self.event = event
        self.id = id
        self.item = item
        self.count = count
    }
}

/// A JSON scalar: a query item's attribute value (dates are ISO 8601 strings).
public enum JSONValue: Sendable, Hashable, Codable {
    case string(String)
    case number(Double)
    case bool(Bool)
    /// A collection attribute (`contentTypeTree`).
    case array([JSONValue])
    case null

    public init(from decoder: any Decoder) throws {
        // Most attributes are strings: tried first.
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let elements = try? c.decode([JSONValue].self) { self = .array(elements) }
        else { self = .number(try c.decode(Double.self)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .string(let s): try c.encode(s)
        case .number(let n): if n == n.rounded() && abs(n) < 1e15 { try c.encode(Int64(n)) } else { try c.encode(n) }
        case .bool(let b): try c.encode(b)
        case .array(let elements): try c.encode(elements)
        case .null: try c.encodeNil()
        }
    }

    public var string: String? { if case .string(let s) = self { s } else { nil } }
    public var number: Double? { if case .number(let n) = self { n } else { nil } }
    public var bool: Bool? { if case .bool(let b) = self { b } else { nil } }
}

// MARK: - Results (the fields of the final line)

/// A command whose success carries nothing but itself.
public struct NoResult: Sendable, Equatable, Codable {
    public init() {}
}

/// `ping`: the daemon serving the store.
public struct DaemonInfo: Sendable, Equatable, Codable {
    public var pid: Int32
    public init(pid: Int32) { self.pid = pid }
}

/// `mount`: the mount is ready.
public struct MountReady: Sendable, Equatable, Codable {
    public var pid: Int32
    /// The daemon's log file.
    public var log: String
    /// Containers the store did not have and this mount created.
    public var created: [String]

    public init(pid: Int32, log: String, created: [String]) {
        self.pid = pid
        self.log = log
        self.created = created
    }
}

/// `describe`: what a mount shows, without counting items.
public struct MountDescription: Sendable, Equatable, Codable {
    public var containers: [String]
    /// The store as `status` names it.
    public var store: String
    public var dataHome: String
    /// The scope a container's mount shows; nil for the drive (since protocol 1.1).
    public var scope: Scope?

    public init(containers: [String], store: String, dataHome: String, scope: Scope? = nil) {
        self.containers = containers
        self.store = store
        self.dataHome = dataHome
        self.scope = scope
    }
}

/// `evict`: how many files lost their local copy.
public struct Evicted: Sendable, Equatable, Codable {
    public var evicted: Int
    public init(evicted: Int) { self.evicted = evicted }
}

/// `pin`, `unpin`: how many items were named.
public struct ItemCount: Sendable, Equatable, Codable {
    public var items: Int
    public init(items: Int) { self.items = items }
}

/// `versions`: the current version first, then each unresolved conflict
/// version; with `all`, the file's history, oldest first.
public struct ItemVersions: Sendable, Equatable, Codable {
    public var versions: [ItemVersion]
    public var history: [HistoryEntry]?
    public init(versions: [ItemVersion], history: [HistoryEntry]? = nil) {
        self.versions = versions
        self.history = history
    }
}

/// A content a file was committed with, kept for the retention period.
public struct HistoryEntry: Sendable, Equatable, Codable {
    /// What `restore --version` takes.
    public var id: UInt64
    /// ISO 8601, UTC: when it was committed, and the file's modification time.
    public var committed: String
    public var modified: String
    public var size: UInt64
    public var device: String
    public var current: Bool

    public init(id: UInt64, committed: String, modified: String, size: UInt64, device: String, current: Bool) {
        self.id = id
        self.committed = committed
        self.modified = modified
        self.size = size
        self.device = device
        self.current = current
    }
}

/// `restore`, `restoreDeleted`: where the restored item is (absolute).
public struct RestoredItem: Sendable, Equatable, Codable {
    public var path: String
    public init(path: String) { self.path = path }
}

/// `trash`: Recently Deleted, newest first.
public struct TrashListing: Sendable, Equatable, Codable {
    public var items: [TrashEntry]
    /// Days deleted items are kept.
    public var retentionDays: Int
    public init(items: [TrashEntry], retentionDays: Int) {
        self.items = items
        self.retentionDays = retentionDays
    }
}

public struct TrashEntry: Sendable, Equatable, Codable {
    public var id: String
    /// Where it was: absolute, below the mountpoint.
    public var path: String
    /// "file", "directory", "symlink", …
    public var kind: String
    public var size: UInt64
    /// Items deleted with a folder.
    public var items: Int
    /// ISO 8601, UTC.
    public var deleted: String
    public var device: String

    public init(id: String, path: String, kind: String, size: UInt64, items: Int, deleted: String, device: String) {
        self.id = id
        self.path = path
        self.kind = kind
        self.size = size
        self.items = items
        self.deleted = deleted
        self.device = device
    }
}

public struct ItemVersion: Sendable, Equatable, Codable {
    /// "current", or the number `resolve --keep` takes.
    public var label: String
    public var path: String
    public var device: String
    public var size: UInt64
    /// ISO 8601, UTC.
    public var modified: String

    public init(label: String, path: String, device: String, size: UInt64, modified: String) {
        self.label = label
        self.path = path
        self.device = device
        self.size = size
        self.modified = modified
    }
}

/// `query`: the number of results (without `watch`; a watch answers until the client leaves).
public struct QueryFinished: Sendable, Equatable, Codable {
    public var count: Int
    public init(count: Int) { self.count = count }
}

// MARK: - Coding

extension Reply: Codable {
    enum Key: String, CodingKey { case ok, error, `protocol` }

    /// Reads the final line's version; throws `protocolMismatch` when it is
    /// missing or of another major.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Key.self)
        guard c.contains(.ok) || c.contains(.error) else {
            self = .update(try Update(from: decoder))
            return
        }
        let version = try? c.decodeIfPresent(ProtocolVersion.self, forKey: .protocol)
        guard let version, version.canTalk(to: .current) else {
            throw ControlError.protocolMismatch(client: .current, daemon: version)
        }
        self = c.contains(.error) ? .failed(try ControlError(from: decoder)) : .done(try Result(from: decoder))
    }

    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .update(let update):
            try update.encode(to: encoder)
        case .done(let result):
            try result.encode(to: encoder)
            var c = encoder.container(keyedBy: Key.self)
            try c.encode(true, forKey: .ok)
            try c.encode(ProtocolVersion.current, forKey: .protocol)
        case .failed(let error):
            try error.encode(to: encoder)
            var c = encoder.container(keyedBy: Key.self)
            try c.encode(ProtocolVersion.current, forKey: .protocol)
        }
    }
}

extension Update: Codable {
    enum Key: String, CodingKey { case pushing, downloading, event, granted, relinquish, reacquire }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Key.self)
        if c.contains(.pushing) { self = .pushing(try c.decode(PushProgress.self, forKey: .pushing)) }
        else if c.contains(.downloading) { self = .downloading(try c.decode(DownloadProgress.self, forKey: .downloading)) }
        else if c.contains(.event) { self = .event(try QueryEvent(from: decoder)) }
        else if c.contains(.granted) { self = .granted }
        else if c.contains(.relinquish) { self = .relinquish(try c.decode(PresenterAsk.self, forKey: .relinquish)) }
        else if c.contains(.reacquire) { self = .reacquire(try c.decode(UInt64.self, forKey: .reacquire)) }
        else {
            throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "a line of no kind this protocol knows"))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .pushing(let progress):
            var c = encoder.container(keyedBy: Key.self)
            try c.encode(progress, forKey: .pushing)
        case .downloading(let progress):
            var c = encoder.container(keyedBy: Key.self)
            try c.encode(progress, forKey: .downloading)
        case .event(let event):
            try event.encode(to: encoder)
        case .granted:
            var c = encoder.container(keyedBy: Key.self)
            try c.encode(true, forKey: .granted)
        case .relinquish(let ask):
            var c = encoder.container(keyedBy: Key.self)
            try c.encode(ask, forKey: .relinquish)
        case .reacquire(let id):
            var c = encoder.container(keyedBy: Key.self)
            try c.encode(id, forKey: .reacquire)
        }
    }
}
