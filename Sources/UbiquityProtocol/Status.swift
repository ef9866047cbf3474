/// `status`: one mount's sync status — counts per container and scope,
/// transfers, reachability, errors. `ubiquityfs status --json` prints it.
public struct MountStatus: Sendable, Equatable, Codable {
    public enum View: String, Sendable, Codable { case drive, container }

    public var pid: Int32
    public var mountpoint: String
    public var view: View
    /// The container shown (the drive: its own container).
    public var container: String
    /// A container view's scope (nil for the drive).
    public var scope: Scope?
    /// Where the store is (`Store.locationDescription`).
    public var store: String
    public var dataHome: String
    public var storeReachable: Bool
    /// The last round trip to an S3 store.
    public var storeLatencyMs: Double?
    public var containers: [ContainerStatus]
    // Totals over `containers`.
    public var items: Int
    public var documentsItems: Int
    public var dataItems: Int
    public var pendingItems: Int
    public var pendingBytes: UInt64
    public var downloadingItems: Int
    public var downloadingBytes: UInt64
    public var cachedBytes: UInt64
    public var cacheLimitBytes: UInt64?
    /// ISO 8601; nil: never synced.
    public var lastSync: String?
    public var failingUploads: [FailingUpload]
    public var quarantinedRecords: [QuarantinedRecordStatus]
    /// The last 20, oldest first.
    public var recentErrors: [RecentError]

    public init(pid: Int32, mountpoint: String, view: View, container: String, scope: Scope?, store: String, dataHome: String,
                storeReachable: Bool, storeLatencyMs: Double?, containers: [ContainerStatus], cacheLimitBytes: UInt64?,
                lastSync: String?, failingUploads: [FailingUpload], quarantinedRecords: [QuarantinedRecordStatus],
                recentErrors: [RecentError]) {
        self.pid = pid
        self.mountpoint = mountpoint
        self.view = view
        self.container = container
        self.scope = scope
        self.store = store
        self.dataHome = dataHome
        self.storeReachable = storeReachable
        self.storeLatencyMs = storeLatencyMs
        self.containers = containers
        items = containers.map(\.items).reduce(0, +)
        documentsItems = containers.map(\.documentsItems).reduce(0, +)
        dataItems = containers.map(\.dataItems).reduce(0, +)
        pendingItems = containers.map(\.pendingItems).reduce(0, +)
        pendingBytes = containers.map(\.pendingBytes).reduce(0, +)
        downloadingItems = containers.map(\.downloadingItems).reduce(0, +)
        downloadingBytes = containers.map(\.downloadingBytes).reduce(0, +)
        cachedBytes = containers.map(\.cachedBytes).reduce(0, +)
        self.cacheLimitBytes = cacheLimitBytes
        self.lastSync = lastSync
        self.failingUploads = failingUploads
        self.quarantinedRecords = quarantinedRecords
        self.recentErrors = recentErrors
    }
}

public struct ContainerStatus: Sendable, Equatable, Codable {
    public var id: String
    /// Where the drive shows it: "/" (its own container) or the folder's name; nil in a container view.
    public var folder: String?
    public var items: Int
    public var documentsItems: Int
    public var dataItems: Int
    public var pendingItems: Int
    public var pendingBytes: UInt64
    public var downloadingItems: Int
    public var downloadingBytes: UInt64
    public var cachedBytes: UInt64

    public init(id: String, folder: String?, items: Int, documentsItems: Int, dataItems: Int, pendingItems: Int,
                pendingBytes: UInt64, downloadingItems: Int, downloadingBytes: UInt64, cachedBytes: UInt64) {
        self.id = id
        self.folder = folder
        self.items = items
        self.documentsItems = documentsItems
        self.dataItems = dataItems
        self.pendingItems = pendingItems
        self.pendingBytes = pendingBytes
        self.downloadingItems = downloadingItems
        self.downloadingBytes = downloadingBytes
        self.cachedBytes = cachedBytes
    }
}

/// A file the store refuses, retried with back-off.
public struct FailingUpload: Sendable, Equatable, Codable {
    public var container: String
    public var path: String
    public var attempts: Int
    public var error: String

    public init(container: String, path: String, attempts: Int, error: String) {
        self.container = container
        self.path = path
        self.attempts = attempts
        self.error = error
    }
}

/// A journal record skipped because it failed validation.
public struct QuarantinedRecordStatus: Sendable, Equatable, Codable {
    public var container: String
    public var seq: UInt64
    public var reason: String
    /// ISO 8601.
    public var date: String

    public init(container: String, seq: UInt64, reason: String, date: String) {
        self.container = container
        self.seq = seq
        self.reason = reason
        self.date = date
    }
}

public struct RecentError: Sendable, Equatable, Codable {
    /// ISO 8601.
    public var date: String
    /// "CONTAINER: what went wrong".
    public var message: String

    public init(date: String, message: String) {
        self.date = date
        self.message = message
    }
}

/// The per-item sync state (`NSMetadataUbiquitousItem…` keys): what the
/// read-only `user.ubiquity.status` attribute holds as JSON (UbiquityKit's
/// URL resource values read it), and what `status` and queries report.
public struct ItemStatus: Sendable, Codable {
    /// `notDownloaded` (a placeholder), `downloaded` (local, a newer version
    /// is being fetched) or `current`.
    public var downloadingStatus: String
    public var isDownloading: Bool
    public var percentDownloaded: Int
    public var isUploaded: Bool
    public var isUploading: Bool
    public var hasUnresolvedConflicts: Bool
    public var conflicts: Int
    public var downloadingError: String?
    public var uploadingError: String?
    public var pinned: Bool

    public init(downloadingStatus: String, isDownloading: Bool, percentDownloaded: Int, isUploaded: Bool, isUploading: Bool,
                hasUnresolvedConflicts: Bool, conflicts: Int, downloadingError: String?, uploadingError: String?, pinned: Bool) {
        self.downloadingStatus = downloadingStatus
        self.isDownloading = isDownloading
        self.percentDownloaded = percentDownloaded
        self.isUploaded = isUploaded
        self.isUploading = isUploading
        self.hasUnresolvedConflicts = hasUnresolvedConflicts
        self.conflicts = conflicts
        self.downloadingError = downloadingError
        self.uploadingError = uploadingError
        self.pinned = pinned
    }
}
