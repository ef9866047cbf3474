/// The requests a client sends on a control socket: one JSON object on one
/// line, `{"protocol":"1.0","command":NAME, …the command's fields}`.
///
/// The store's daemon socket (`daemon-KEY.sock`) serves `ping` and `mount`;
/// each mount's socket (`HASH.sock`) serves the others. Paths name items by
/// their names below the mountpoint (`["Notes","a.txt"]`).
public struct ControlRequest: Sendable, Equatable {
    public var version: ProtocolVersion
    public var command: Command

    public init(_ command: Command, version: ProtocolVersion = .current) {
        self.command = command
        self.version = version
    }
}

/// A command and its parameters. Each answers, on success, with the result
/// type named here (the fields of its final `{"ok":true,…}` line).
public enum Command: Sendable, Equatable {
    /// Is a daemon serving this store? → `DaemonInfo`
    case ping
    /// Add a mountpoint to the store's daemon. → `MountReady`
    case mount(MountParameters)
    /// The mount's sync status. → `MountStatus`
    case status
    /// The mount's containers and store, without counting items. → `MountDescription`
    case describe
    /// Download placeholders (folders: with `recursive`), with `downloading` lines. → `NoResult`
    case download(paths: [[String]], recursive: Bool)
    /// Drop local copies. → `Evicted`
    case evict(paths: [[String]])
    /// Keep items on this device. → `ItemCount`
    case pin(paths: [[String]])
    /// Stop keeping items on this device. → `ItemCount`
    case unpin(paths: [[String]])
    /// An item's current version and its conflict versions; with `all`
    /// (since 1.3), also its history. → `ItemVersions`
    case versions(path: [String], all: Bool = false)
    /// Restore version `version` (a `history` id) of the file at `path`, as
    /// its current content or, with `to`, as a new file there (since 1.3). → `RestoredItem`
    case restore(path: [String], version: UInt64, to: [String]?)
    /// Write the content of version `version` of the file at `path` into a
    /// new file at `destination`, an absolute path outside every mount
    /// (`NSFileVersion.url`; since 1.3). → `NoResult`
    case fetchVersion(path: [String], version: UInt64, destination: String)
    /// Recently Deleted of the containers the mount shows (since 1.3). → `TrashListing`
    case trash
    /// Bring back a deleted item: `item` is its path below the mountpoint
    /// as `trash` lists it, or its ID (since 1.3). → `RestoredItem`
    case restoreDeleted(item: String)
    /// Remove everything in Recently Deleted for good (since 1.3). → `ItemCount`
    case emptyTrash
    /// Resolve the conflicts of items. → `NoResult`
    case resolve(paths: [[String]], keep: ConflictKeep)
    /// A metadata query, with `event` lines. → `QueryFinished`
    case query(QueryParameters)
    /// Coordinated access (`NSFileCoordinator`): wait until the items may be
    /// read (shared) and written (exclusive), get `granted`, keep the
    /// connection open while accessing; closing it ends the access (since 1.1).
    /// `deletes` (since 1.2) are the written items the access deletes: their
    /// presenters are asked to accommodate the deletion, not to relinquish.
    /// `metadataOnly` (since 1.2): placeholders read are not downloaded.
    case coordinate(reads: [[String]], writes: [[String]], deletes: [[String]] = [], metadataOnly: Bool = false)
    /// Present an item (`NSFilePresenter`): the connection stays open;
    /// `granted` says the daemon knows the presenter; it sends `relinquish` before another process's or the sync's
    /// coordinated access to it, the client answers `{"relinquished":ID}` on
    /// the same connection, and `reacquire` follows when the access ends.
    /// Closing the connection ends the presenting (since 1.2).
    case present(path: [String])
    /// Record the file `copy` as an unresolved conflict version of the file
    /// at `path` (`UIDocument` saving beside another device's version; since 1.1).
    case recordConflict(path: [String], copy: [String])
    /// Push everything, with `pushing` lines, then unmount. → `NoResult`
    case unmount

    /// The command's name on the wire.
    public var name: String {
        switch self {
        case .ping: "ping"
        case .mount: "mount"
        case .status: "status"
        case .describe: "describe"
        case .download: "download"
        case .evict: "evict"
        case .pin: "pin"
        case .unpin: "unpin"
        case .versions: "versions"
        case .restore: "restore"
        case .fetchVersion: "fetchVersion"
        case .trash: "trash"
        case .restoreDeleted: "restoreDeleted"
        case .emptyTrash: "emptyTrash"
        case .resolve: "resolve"
        case .query: "query"
        case .coordinate: "coordinate"
        case .present: "present"
        case .recordConflict: "recordConflict"
        case .unmount: "unmount"
        }
    }
}

/// What part of a container a mount or a query shows.
public enum Scope: String, Sendable, Codable, CaseIterable {
    case documents, data, all
}

public struct MountParameters: Sendable, Equatable {
    /// Absolute.
    public var mountpoint: String
    /// nil: the drive view.
    public var container: String?
    public var scope: Scope
    public var fuseOptions: [String]
    /// The device name the mount was given (refused if the daemon runs under another).
    public var deviceName: String?
    /// The mount asked for a shared store (refused if the daemon's is private).
    public var sharedStore: Bool

    public init(mountpoint: String, container: String? = nil, scope: Scope = .all, fuseOptions: [String] = [],
                deviceName: String? = nil, sharedStore: Bool = false) {
        self.mountpoint = mountpoint
        self.container = container
        self.scope = scope
        self.fuseOptions = fuseOptions
        self.deviceName = deviceName
        self.sharedStore = sharedStore
    }
}

public struct QueryParameters: Sendable, Equatable {
    /// NSPredicate-style (`UbiquityControl.Query`).
    public var predicate: String
    /// Sort keys, comma-separated; a leading `-` sorts descending.
    public var sort: String?
    public var scopes: [Scope]
    /// Query this container of the mount (all of it, in its own paths)
    /// instead of what the mount shows.
    public var container: String?
    /// Keep answering: the results, `gatheringFinished`, then updates.
    public var watch: Bool
    /// Seconds between update batches with `watch` (clamped to 0.05…3600).
    public var throttle: Double

    public init(predicate: String = "TRUEPREDICATE", sort: String? = nil, scopes: [Scope] = [.all],
                container: String? = nil, watch: Bool = false, throttle: Double = 1) {
        self.predicate = predicate
        self.sort = sort
        self.scopes = scopes
        self.container = container
        self.watch = watch
        self.throttle = throttle
    }
}

/// Which version `resolve` keeps: `"current"`, `"both"`, or a conflict
/// version's number (`"2"`) as `versions` lists them.
public enum ConflictKeep: Sendable, Equatable, Codable, CustomStringConvertible {
    case current
    case both
    case version(Int)

    public init?(_ text: String) {
        switch text {
        case "current": self = .current
        case "both": self = .both
        default:
            guard let number = Int(text) else { return nil }
            self = .version(number)
        }
    }

    public var description: String {
        switch self {
        case .current: "current"
        case .both: "both"
        case .version(let number): String(number)
        }
    }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let keep = ConflictKeep(text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath,
                                                    debugDescription: "takes current, both, or a version number"))
        }
        self = keep
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}

/// The request is of another protocol major, or has no version: its other
/// fields are not read (another major may mean them otherwise). The daemon
/// answers `ControlError.protocolMismatch`.
public struct UnsupportedProtocol: Error, Sendable {
    /// nil: the request had no version.
    public var requested: ProtocolVersion?
}

/// A command name this version does not know (a newer minor's, or a typo).
public struct UnknownCommand: Error, Sendable {
    public var name: String
}

extension ControlRequest: Codable {
    enum Key: String, CodingKey {
        case `protocol`, command
        case mountpoint, container, scope, fuseOptions, deviceName, sharedStore
        case paths, path, recursive, keep, reads, writes, deletes, metadataOnly, copy
        case all, version, to, item, destination
        case predicate, sort, scopes, watch, throttle
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Key.self)
        guard c.contains(.protocol) else { throw UnsupportedProtocol(requested: nil) }
        version = try c.decode(ProtocolVersion.self, forKey: .protocol)
        guard version.canTalk(to: .current) else { throw UnsupportedProtocol(requested: version) }
        let name = try c.decode(String.self, forKey: .command)
        switch name {
        case "ping": command = .ping
        case "mount":
            command = .mount(MountParameters(
                mountpoint: try c.decode(String.self, forKey: .mountpoint),
                container: try c.decodeIfPresent(String.self, forKey: .container),
                scope: try c.decodeIfPresent(Scope.self, forKey: .scope) ?? .all,
                fuseOptions: try c.decodeIfPresent([String].self, forKey: .fuseOptions) ?? [],
                deviceName: try c.decodeIfPresent(String.self, forKey: .deviceName),
                sharedStore: try c.decodeIfPresent(Bool.self, forKey: .sharedStore) ?? false))
        case "status": command = .status
        case "describe": command = .describe
        case "download":
            command = .download(paths: try c.decode([[String]].self, forKey: .paths),
                                recursive: try c.decodeIfPresent(Bool.self, forKey: .recursive) ?? false)
        case "evict": command = .evict(paths: try c.decode([[String]].self, forKey: .paths))
        case "pin": command = .pin(paths: try c.decode([[String]].self, forKey: .paths))
        case "unpin": command = .unpin(paths: try c.decode([[String]].self, forKey: .paths))
        case "versions":
            command = .versions(path: try c.decode([String].self, forKey: .path),
                                all: try c.decodeIfPresent(Bool.self, forKey: .all) ?? false)
        case "restore":
            command = .restore(path: try c.decode([String].self, forKey: .path), version: try c.decode(UInt64.self, forKey: .version),
                               to: try c.decodeIfPresent([String].self, forKey: .to))
        case "fetchVersion":
            command = .fetchVersion(path: try c.decode([String].self, forKey: .path), version: try c.decode(UInt64.self, forKey: .version),
                                    destination: try c.decode(String.self, forKey: .destination))
        case "trash": command = .trash
        case "restoreDeleted": command = .restoreDeleted(item: try c.decode(String.self, forKey: .item))
        case "emptyTrash": command = .emptyTrash
        case "resolve":
            command = .resolve(paths: try c.decode([[String]].self, forKey: .paths),
                               keep: try c.decode(ConflictKeep.self, forKey: .keep))
        case "query":
            command = .query(QueryParameters(
                predicate: try c.decodeIfPresent(String.self, forKey: .predicate) ?? "TRUEPREDICATE",
                sort: try c.decodeIfPresent(String.self, forKey: .sort),
                scopes: try c.decodeIfPresent([Scope].self, forKey: .scopes) ?? [.all],
                container: try c.decodeIfPresent(String.self, forKey: .container),
                watch: try c.decodeIfPresent(Bool.self, forKey: .watch) ?? false,
                throttle: try c.decodeIfPresent(Double.self, forKey: .throttle) ?? 1))
        case "coordinate":
            command = .coordinate(reads: try c.decodeIfPresent([[String]].self, forKey: .reads) ?? [],
                                  writes: try c.decodeIfPresent([[String]].self, forKey: .writes) ?? [],
                                  deletes: try c.decodeIfPresent([[String]].self, forKey: .deletes) ?? [],
                                  metadataOnly: try c.decodeIfPresent(Bool.self, forKey: .metadataOnly) ?? false)
        case "present": command = .present(path: try c.decode([String].self, forKey: .path))
        case "recordConflict":
            command = .recordConflict(path: try c.decode([String].self, forKey: .path), copy: try c.decode([String].self, forKey: .copy))
        case "unmount": command = .unmount
        default: throw UnknownCommand(name: name)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Key.self)
        try c.encode(version, forKey: .protocol)
        try c.encode(command.name, forKey: .command)
        switch command {
        case .ping, .status, .describe, .unmount, .trash, .emptyTrash:
            break
        case .mount(let m):
            try c.encode(m.mountpoint, forKey: .mountpoint)
            try c.encodeIfPresent(m.container, forKey: .container)
            try c.encode(m.scope, forKey: .scope)
            try c.encode(m.fuseOptions, forKey: .fuseOptions)
            try c.encodeIfPresent(m.deviceName, forKey: .deviceName)
            try c.encode(m.sharedStore, forKey: .sharedStore)
        case .download(let paths, let recursive):
            try c.encode(paths, forKey: .paths)
            try c.encode(recursive, forKey: .recursive)
        case .evict(let paths), .pin(let paths), .unpin(let paths):
            try c.encode(paths, forKey: .paths)
        case .versions(let path, let all):
            try c.encode(path, forKey: .path)
            if all { try c.encode(true, forKey: .all) }
        case .restore(let path, let version, let to):
            try c.encode(path, forKey: .path)
            try c.encode(version, forKey: .version)
            try c.encodeIfPresent(to, forKey: .to)
        case .restoreDeleted(let item):
            try c.encode(item, forKey: .item)
        case .fetchVersion(let path, let version, let destination):
            try c.encode(path, forKey: .path)
            try c.encode(version, forKey: .version)
            try c.encode(destination, forKey: .destination)
        case .resolve(let paths, let keep):
            try c.encode(paths, forKey: .paths)
            try c.encode(keep, forKey: .keep)
        case .query(let q):
            try c.encode(q.predicate, forKey: .predicate)
            try c.encodeIfPresent(q.sort, forKey: .sort)
            try c.encode(q.scopes, forKey: .scopes)
            try c.encodeIfPresent(q.container, forKey: .container)
            try c.encode(q.watch, forKey: .watch)
            try c.encode(q.throttle, forKey: .throttle)
        case .coordinate(let reads, let writes, let deletes, let metadataOnly):
            try c.encode(reads, forKey: .reads)
            try c.encode(writes, forKey: .writes)
            if !deletes.isEmpty { try c.encode(deletes, forKey: .deletes) }
            if metadataOnly { try c.encode(true, forKey: .metadataOnly) }
        case .present(let path):
            try c.encode(path, forKey: .path)
        case .recordConflict(let path, let copy):
            try c.encode(path, forKey: .path)
            try c.encode(copy, forKey: .copy)
        }
    }
}
