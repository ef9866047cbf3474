// The whole module, not `import class`: a scoped import of these classes here would
// cancel Daemons.swift's re-export of them for UbiquityKit's users.
import UbiquityPredicates
import UbiquityLocks
import UbiquityLocator
import UbiquityProtocol
#if canImport(Glibc)
import Glibc
#endif

// MARK: - Apple's constants (their values are Apple's)

public let NSMetadataItemFSNameKey = "kMDItemFSName"
public let NSMetadataItemDisplayNameKey = "kMDItemDisplayName"
public let NSMetadataItemURLKey = "kMDItemURL"
public let NSMetadataItemPathKey = "kMDItemPath"
public let NSMetadataItemFSSizeKey = "kMDItemFSSize"
public let NSMetadataItemFSCreationDateKey = "kMDItemFSCreationDate"
public let NSMetadataItemFSContentChangeDateKey = "kMDItemFSContentChangeDate"
public let NSMetadataItemContentTypeKey = "kMDItemContentType"
public let NSMetadataItemContentTypeTreeKey = "kMDItemContentTypeTree"
public let NSMetadataItemIsUbiquitousKey = "NSMetadataItemIsUbiquitousKey"
public let NSMetadataUbiquitousItemDownloadingStatusKey = "NSMetadataUbiquitousItemDownloadingStatusKey"
public let NSMetadataUbiquitousItemIsDownloadingKey = "NSMetadataUbiquitousItemIsDownloadingKey"
public let NSMetadataUbiquitousItemPercentDownloadedKey = "NSMetadataUbiquitousItemPercentDownloadedKey"
public let NSMetadataUbiquitousItemIsUploadedKey = "NSMetadataUbiquitousItemIsUploadedKey"
public let NSMetadataUbiquitousItemIsUploadingKey = "NSMetadataUbiquitousItemIsUploadingKey"
public let NSMetadataUbiquitousItemPercentUploadedKey = "NSMetadataUbiquitousItemPercentUploadedKey"
public let NSMetadataUbiquitousItemHasUnresolvedConflictsKey = "NSMetadataUbiquitousItemHasUnresolvedConflictsKey"
public let NSMetadataUbiquitousItemDownloadingErrorKey = "NSMetadataUbiquitousItemDownloadingErrorKey"
public let NSMetadataUbiquitousItemUploadingErrorKey = "NSMetadataUbiquitousItemUploadingErrorKey"
public let NSMetadataUbiquitousItemIsDownloadRequestedKey = "NSMetadataUbiquitousItemDownloadRequestedKey"
public let NSMetadataUbiquitousItemContainerDisplayNameKey = "NSMetadataUbiquitousItemContainerDisplayNameKey"

public let NSMetadataUbiquitousItemDownloadingStatusCurrent = "NSMetadataUbiquitousItemDownloadingStatusCurrent"
public let NSMetadataUbiquitousItemDownloadingStatusDownloaded = "NSMetadataUbiquitousItemDownloadingStatusDownloaded"
public let NSMetadataUbiquitousItemDownloadingStatusNotDownloaded = "NSMetadataUbiquitousItemDownloadingStatusNotDownloaded"

public let NSMetadataQueryUbiquitousDocumentsScope = "NSMetadataQueryUbiquitousDocumentsScope"
public let NSMetadataQueryUbiquitousDataScope = "NSMetadataQueryUbiquitousDataScope"

public let NSMetadataQueryUpdateAddedItemsKey = "kMDQueryUpdateAddedItems"
public let NSMetadataQueryUpdateChangedItemsKey = "kMDQueryUpdateChangedItems"
public let NSMetadataQueryUpdateRemovedItemsKey = "kMDQueryUpdateRemovedItems"

extension NSNotification.Name {
    public static let NSMetadataQueryDidStartGathering = NSNotification.Name("NSMetadataQueryDidStartGatheringNotification")
    public static let NSMetadataQueryGatheringProgress = NSNotification.Name("NSMetadataQueryGatheringProgressNotification")
    public static let NSMetadataQueryDidFinishGathering = NSNotification.Name("NSMetadataQueryDidFinishGatheringNotification")
    public static let NSMetadataQueryDidUpdate = NSNotification.Name("NSMetadataQueryDidUpdateNotification")
}

// The Objective-C spellings that older Swift (and the seeds) use.
public let NSMetadataQueryDidStartGatheringNotification = NSNotification.Name.NSMetadataQueryDidStartGathering
public let NSMetadataQueryGatheringProgressNotification = NSNotification.Name.NSMetadataQueryGatheringProgress
public let NSMetadataQueryDidFinishGatheringNotification = NSNotification.Name.NSMetadataQueryDidFinishGathering
public let NSMetadataQueryDidUpdateNotification = NSNotification.Name.NSMetadataQueryDidUpdate

// MARK: - NSMetadataItem

/// One item a query found: its attributes as Apple types. The same object
/// stands for the same item across a query's updates (a rename changes its
/// path and name, not the object).
open class NSMetadataItem: NSObject, @unchecked Sendable {
    let state: Lock<[String: JSONValue]>

    init(values: [String: JSONValue]) {
        state = Lock(values)
        super.init()
    }

    /// Apple's key → the daemon's attribute, and how its value is typed.
    enum Kind { case string, url, number, bool, date, strings, status, error, constant(Bool) }
    static let attributes: [String: (name: String, kind: Kind)] = [
        NSMetadataItemFSNameKey: ("name", .string),
        NSMetadataItemDisplayNameKey: ("displayName", .string),
        NSMetadataItemURLKey: ("url", .url),
        NSMetadataItemPathKey: ("path", .string),
        NSMetadataItemFSSizeKey: ("size", .number),
        NSMetadataItemFSCreationDateKey: ("creationDate", .date),
        NSMetadataItemFSContentChangeDateKey: ("modificationDate", .date),
        NSMetadataItemContentTypeKey: ("contentType", .string),
        NSMetadataItemContentTypeTreeKey: ("contentTypeTree", .strings),
        NSMetadataItemIsUbiquitousKey: ("", .constant(true)),
        NSMetadataUbiquitousItemDownloadingStatusKey: ("downloadingStatus", .status),
        NSMetadataUbiquitousItemIsDownloadingKey: ("isDownloading", .bool),
        NSMetadataUbiquitousItemPercentDownloadedKey: ("percentDownloaded", .number),
        NSMetadataUbiquitousItemIsUploadedKey: ("isUploaded", .bool),
        NSMetadataUbiquitousItemIsUploadingKey: ("isUploading", .bool),
        NSMetadataUbiquitousItemPercentUploadedKey: ("percentUploaded", .number),
        NSMetadataUbiquitousItemHasUnresolvedConflictsKey: ("hasUnresolvedConflicts", .bool),
        NSMetadataUbiquitousItemDownloadingErrorKey: ("downloadingError", .error),
        NSMetadataUbiquitousItemUploadingErrorKey: ("uploadingError", .error),
        NSMetadataUbiquitousItemIsDownloadRequestedKey: ("isDownloading", .bool),
    ]

    /// The keys this item has a value for.
    open var attributes: [String] {
        let values = state.withLock { $0 }
        return Self.attributes.filter { key, attribute in
            if case .constant = attribute.kind { return true }
            return values[attribute.name].map { $0 != .null } ?? false
        }.keys.sorted()
    }

    /// The value of `key` typed as on Apple platforms: `String`, `URL`,
    /// `NSNumber` (sizes, percentages, flags), `Date`, `[String]`, `NSError`;
    /// nil for a key it has no value for.
    open func value(forAttribute key: String) -> Any? {
        guard let (name, kind) = Self.attributes[key] else { return nil }
        if case .constant(let flag) = kind { return NSNumber(value: flag) }
        guard let value = state.withLock({ $0[name] }) else { return nil }
        switch (kind, value) {
        case (.string, .string(let s)): return s
        case (.url, .string(let s)): return URL(string: s)
        case (.number, .number(let n)): return n == n.rounded() && abs(n) < 1e15 ? NSNumber(value: Int64(n)) : NSNumber(value: n)
        case (.bool, .bool(let b)): return NSNumber(value: b)
        case (.date, .string(let s)): return ISO8601DateFormatter().date(from: s)
        case (.strings, .array(let items)): return items.compactMap { if case .string(let s) = $0 { return s }; return nil }
        case (.status, .string(let s)):
            switch s {
            case "current": return NSMetadataUbiquitousItemDownloadingStatusCurrent
            case "downloaded": return NSMetadataUbiquitousItemDownloadingStatusDownloaded
            default: return NSMetadataUbiquitousItemDownloadingStatusNotDownloaded
            }
        case (.error, .string(let message)):
            return NSError(domain: NSCocoaErrorDomain, code: CocoaError.Code.ubiquitousFileUnavailable.rawValue,
                           userInfo: [NSLocalizedDescriptionKey: message])
        default: return nil
        }
    }

    open func values(forAttributes keys: [String]) -> [String: Any]? {
        var out: [String: Any] = [:]
        for key in keys { out[key] = value(forAttribute: key) }
        return out
    }

    var path: String { state.withLock { if case .string(let s)? = $0["path"] { return s }; return "" } }
    func raw(_ name: String) -> JSONValue? { state.withLock { $0[name] } }
    func update(_ values: [String: JSONValue]) { state.withLock { $0 = values } }

    open override var description: String { "<NSMetadataItem \(path)>" }
}

// MARK: - NSMetadataQuery

/// A live query over the app's containers, as on Apple platforms: set
/// `predicate`, `searchScopes` and `sortDescriptors`, observe the
/// notifications, `start()`. Served by each container's daemon (`query
/// --watch` over its control socket), which sends the results, then what was
/// added, changed and removed; this object keeps `results` (sorted by
/// `sortDescriptors`, or in the order found) and posts
/// `NSMetadataQueryDidStartGathering`, `…GatheringProgress`,
/// `…DidFinishGathering` and `…DidUpdate` (with the added, changed and
/// removed items in its `userInfo`) on `operationQueue`, or the main queue.
/// Updates that arrive while `disableUpdates()` holds are applied and posted
/// at the matching `enableUpdates()`.
open class NSMetadataQuery: NSObject, @unchecked Sendable {
    open var predicate: NSPredicate?
    open var sortDescriptors: [NSSortDescriptor] = []
    /// `NSMetadataQueryUbiquitousDocumentsScope`, `…DataScope`, or a folder `URL`
    /// in a container; empty: both scopes of every declared container.
    open var searchScopes: [Any] = []
    /// The least time between two `DidUpdate` notifications (seconds).
    open var notificationBatchingInterval: TimeInterval = 0.1
    /// Where notifications are posted (nil: the main queue).
    open var operationQueue: OperationQueue?
    open weak var delegate: AnyObject?

    struct State {
        var started = false
        var stopped = false
        var gathering = false
        var items: [String: NSMetadataItem] = [:]     // "container#id" → item
        var order: [String] = []
        var disabled = 0
        var pending: [(kind: QueryEvent.Kind, key: String, values: [String: JSONValue])] = []
        var connections: [Int32] = []
        var gatheringLeft = 0
        var flushScheduled = false
    }
    let state = Lock(State())

    public override init() { super.init() }

    open var isStarted: Bool { state.withLock { $0.started } }
    open var isGathering: Bool { state.withLock { $0.gathering } }
    open var isStopped: Bool { state.withLock { $0.stopped } }

    open var results: [Any] { resultItems }
    var resultItems: [NSMetadataItem] { state.withLock { s in s.order.compactMap { s.items[$0] } } }
    open var resultCount: Int { state.withLock { $0.order.count } }
    open func result(at index: Int) -> Any { resultItems[index] }
    open func index(ofResult result: Any) -> Int {
        guard let item = result as? NSMetadataItem else { return NSNotFound }
        return resultItems.firstIndex { $0 === item } ?? NSNotFound
    }

    /// The daemon's scopes for `searchScopes`, and the folders a URL scope limits it to.
    func scopes() -> (scopes: [Scope], folders: [String]) {
        var scopes = Set<Scope>()
        var folders: [String] = []
        for scope in searchScopes {
            switch scope {
            case let name as String where name == NSMetadataQueryUbiquitousDocumentsScope: scopes.insert(.documents)
            case let name as String where name == NSMetadataQueryUbiquitousDataScope: scopes.insert(.data)
            case let url as URL: folders.append(url.standardizedFileURL.path)
            default: break
            }
        }
        if scopes.isEmpty || scopes.count == 2 { return ([.all], folders) }
        return (Array(scopes), folders)
    }

    /// Start gathering (false if it was started already).
    @discardableResult
    open func start() -> Bool {
        let first = state.withLock { s -> Bool in
            guard !s.started else { return false }
            s.started = true
            s.gathering = true
            return true
        }
        guard first else { return false }
        var (scopes, folders) = self.scopes()
        var format = predicate?.predicateFormat ?? "TRUEPREDICATE"
        if !folders.isEmpty {
            let within = folders.map { "kMDItemPath BEGINSWITH \(NSPredicate.quoted($0 + "/"))" }.joined(separator: " OR ")
            format = "(\(format)) AND (\(within))"
            scopes = [.all]
        }
        let sort = sortDescriptors.compactMap(\.queryKey).joined(separator: ",")
        let parameters = QueryParameters(predicate: format, sort: sort.isEmpty ? nil : sort, scopes: scopes,
                                         container: nil, watch: true, throttle: max(0.05, notificationBatchingInterval))
        post(.NSMetadataQueryDidStartGathering)
        let containers = UbiquityContainers.identifiers
        let roots = containers.compactMap { id in UbiquityContainers.url(for: id).map { (id, $0) } }
        trace("query \(format) sort \(sort) scopes \(scopes) over \(roots.map { "\($0.0) at \($0.1.path)" })")
        state.withLock { $0.gatheringLeft = roots.count }
        if roots.isEmpty { finishGathering() }
        for (id, root) in roots {
            Thread.detachNewThread { [self] in watch(container: id, root: root, parameters) }
        }
        return true
    }

    open func stop() {
        let connections = state.withLock { s -> [Int32] in
            s.stopped = true
            s.started = false
            s.gathering = false
            defer { s.connections = [] }
            return s.connections
        }
        for fd in connections { shutdown(fd, Int32(SHUT_RDWR)) }
    }

    /// Hold `results` as they are (updates queue) until `enableUpdates`.
    open func disableUpdates() { state.withLock { $0.disabled += 1 } }

    open func enableUpdates() {
        let flush = state.withLock { s -> Bool in
            s.disabled = max(0, s.disabled - 1)
            return s.disabled == 0 && !s.pending.isEmpty
        }
        if flush { self.flush() }
    }

    // Swift 2 spellings, which the seeds use.
    @discardableResult open func startQuery() -> Bool { start() }
    open func stopQuery() { stop() }

    deinit { stop() }

    func watch(container: String, root: URL, _ parameters: QueryParameters) {
        guard let record = MountRecord.live(dataHome: Daemons.dataHome, mountpoint: root.path) else {
            finishGathering()
            return
        }
        var gathered = false
        _ = try? Daemons.call(record, .query(parameters), expecting: NoResult.self, connected: { fd in
            let stopped = state.withLock { s -> Bool in
                if !s.stopped { s.connections.append(fd) }
                return s.stopped
            }
            if stopped { shutdown(fd, Int32(SHUT_RDWR)) }
        }) { [self] update in
            guard case .event(let event) = update else { return }
            trace("\(container): \(event.event.rawValue) \(event.id.map(String.init) ?? "")")
            switch event.event {
            case .result:
                guard let id = event.id, let item = event.item else { return }
                state.withLock { s in
                    let key = "\(container)#\(id)"
                    if s.items[key] == nil { s.order.append(key) }
                    s.items[key] = NSMetadataItem(values: item)
                }
            case .gatheringFinished:
                gathered = true
                finishGathering()
            case .added, .changed, .removed:
                guard let id = event.id else { return }
                let schedule = state.withLock { s -> Bool in
                    s.pending.append((event.event, "\(container)#\(id)", event.item ?? [:]))
                    defer { s.flushScheduled = true }
                    return !s.flushScheduled
                }
                // The daemon writes a batch at once: what arrives within a moment is one update.
                if schedule { DispatchQueue.global().asyncAfter(deadline: .now() + 0.02) { [self] in flush() } }
            case .heartbeat:
                break
            }
        }
        if !gathered { finishGathering() }
    }

    func finishGathering() {
        let done = state.withLock { s -> Bool in
            s.gatheringLeft -= 1
            guard s.gatheringLeft <= 0, s.gathering else { return false }
            s.gathering = false
            sortLocked(&s)
            return true
        }
        if done {
            post(.NSMetadataQueryGatheringProgress)
            post(.NSMetadataQueryDidFinishGathering)
        }
    }

    /// Apply what queued and post one `DidUpdate` (unless updates are disabled).
    func flush() {
        let (added, changed, removed) = state.withLock { s -> ([NSMetadataItem], [NSMetadataItem], [NSMetadataItem]) in
            s.flushScheduled = false
            guard s.disabled == 0, !s.gathering else { return ([], [], []) }
            var added: [NSMetadataItem] = [], changed: [NSMetadataItem] = [], removed: [NSMetadataItem] = []
            for (kind, key, values) in s.pending {
                switch kind {
                case .removed:
                    if let item = s.items.removeValue(forKey: key) {
                        s.order.removeAll { $0 == key }
                        removed.append(item)
                        added.removeAll { $0 === item }
                        changed.removeAll { $0 === item }
                    }
                default:
                    if let item = s.items[key] {
                        item.update(values)
                        if !added.contains(where: { $0 === item }) && !changed.contains(where: { $0 === item }) { changed.append(item) }
                    } else {
                        let item = NSMetadataItem(values: values)
                        s.items[key] = item
                        s.order.append(key)
                        added.append(item)
                    }
                }
            }
            s.pending = []
            sortLocked(&s)
            return (added, changed, removed)
        }
        guard !added.isEmpty || !changed.isEmpty || !removed.isEmpty else { return }
        post(.NSMetadataQueryDidUpdate, userInfo: [
            NSMetadataQueryUpdateAddedItemsKey: added,
            NSMetadataQueryUpdateChangedItemsKey: changed,
            NSMetadataQueryUpdateRemovedItemsKey: removed,
        ])
    }

    /// Order the results by `sortDescriptors` (ties: by path); unsorted, as found.
    func sortLocked(_ s: inout State) {
        let descriptors = sortDescriptors
        guard !descriptors.isEmpty else { return }
        let items = s.items
        s.order.sort { a, b in
            guard let x = items[a], let y = items[b] else { return false }
            for descriptor in descriptors {
                guard let key = descriptor.key else { continue }
                let name = NSMetadataItem.attributes[key]?.name ?? key
                let order = Self.compare(x.raw(name), y.raw(name))
                if order != .orderedSame { return descriptor.ascending ? order == .orderedAscending : order == .orderedDescending }
            }
            return x.path < y.path
        }
    }

    static func compare(_ a: JSONValue?, _ b: JSONValue?) -> ComparisonResult {
        switch (a, b) {
        case (.string(let x)?, .string(let y)?): return x.localizedStandardCompare(y)
        case (.number(let x)?, .number(let y)?): return x < y ? .orderedAscending : x > y ? .orderedDescending : .orderedSame
        case (.bool(let x)?, .bool(let y)?): return x == y ? .orderedSame : (!x ? .orderedAscending : .orderedDescending)
        case (nil, nil), (.null?, .null?): return .orderedSame
        case (nil, _), (.null?, _): return .orderedAscending
        case (_, nil), (_, .null?): return .orderedDescending
        default: return .orderedSame
        }
    }

    func post(_ name: NSNotification.Name, userInfo: [AnyHashable: Any]? = nil) {
        trace("post \(name.rawValue)")
        let queue = operationQueue
        let box = UncheckedBox(userInfo)
        let send: @Sendable () -> Void = { [self] in
            NotificationCenter.default.post(name: name, object: self, userInfo: box.value)
        }
        // Posted from an operation of the queue itself: Foundation on Linux
        // waits for an observer's queue when it is not the current one.
        (queue ?? OperationQueue.main).addOperation(send)
    }

    /// The results after gathering and after every update, as a stream (what
    /// the guide builds by hand); starts the query, stops it when the stream ends.
    public var resultUpdates: AsyncStream<[NSMetadataItem]> {
        AsyncStream { continuation in
            let center = NotificationCenter.default
            let queue = OperationQueue()
            queue.maxConcurrentOperationCount = 1
            let tokens = [NSNotification.Name.NSMetadataQueryDidFinishGathering, .NSMetadataQueryDidUpdate].map { name in
                center.addObserver(forName: name, object: self, queue: queue) { [weak self] _ in
                    if let self { continuation.yield(self.resultItems) }
                }
            }
            let box = UncheckedBox(tokens)
            continuation.onTermination = { [weak self] _ in
                for token in box.value { center.removeObserver(token) }
                self?.stop()
            }
            if operationQueue == nil { operationQueue = queue }
            start()
        }
    }
}

/// A value handed between threads whose type is not `Sendable` (a
/// notification's `userInfo`, observer tokens); used once, read-only.
struct UncheckedBox<T>: @unchecked Sendable {
    let value: T
    init(_ value: T) { self.value = value }
}
