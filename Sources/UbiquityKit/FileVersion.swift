import Foundation
import UbiquityLocks
import UbiquityLocator
import UbiquityProtocol

/// The versions of a file, as `NSFileVersion` gives them: the current one;
/// the unresolved conflict versions the sync engine keeps (each a
/// conflicted copy beside the file, `NAME (conflicted copy DEVICE DATE)`),
/// which resolving removes on every device (`ubiquityfs resolve`); and the
/// earlier versions of its history (`ubiquityfs versions --all`), kept by
/// the store for the container's retention period, whose `url` is a copy
/// of that content fetched into this user's cache when first asked for.
open class NSFileVersion: NSObject, @unchecked Sendable {
    /// Where this version's content is: the file itself, its conflicted
    /// copy, or (an earlier version) a read-only copy in the cache.
    open var url: URL {
        guard let historyID else { return location }
        if let fetched = fetchedCopy.withLock({ $0 }) { return fetched }
        let copy = Self.cacheFolder().appendingPathComponent("\(historyID)-\(UUID().uuidString.prefix(8))-\(item.lastPathComponent)")
        do {
            let (record, names) = try Daemons.locate(item)
            _ = try Daemons.call(record, .fetchVersion(path: names, version: historyID, destination: copy.path), expecting: NoResult.self)
            chmod(copy.path, 0o400)
            fetchedCopy.withLock { $0 = copy }
            return copy
        } catch {
            // Not fetched (the daemon or the store is unreachable): the file itself.
            return location
        }
    }
    open var localizedName: String?
    open var localizedNameOfSavingComputer: String?
    open var modificationDate: Date?
    open var isConflict: Bool
    /// The file this version belongs to.
    let item: URL
    let label: String
    /// The file itself or its conflicted copy.
    let location: URL
    /// An earlier version: its ID in the history.
    let historyID: UInt64?
    let fetchedCopy = Lock<URL?>(nil)

    init(item: URL, mountpoint: String, version: ItemVersion) {
        self.item = item
        label = version.label
        location = URL(fileURLWithPath: mountpoint + version.path)
        historyID = nil
        localizedName = location.lastPathComponent
        localizedNameOfSavingComputer = version.device
        modificationDate = ISO8601DateFormatter().date(from: version.modified)
        isConflict = version.label != "current"
        super.init()
    }

    init(item: URL, earlier entry: HistoryEntry) {
        self.item = item
        label = "history \(entry.id)"
        location = item
        historyID = entry.id
        localizedName = item.lastPathComponent
        localizedNameOfSavingComputer = entry.device
        modificationDate = ISO8601DateFormatter().date(from: entry.modified)
        isConflict = false
        super.init()
    }

    /// `$XDG_CACHE_HOME/ubiquitykit/versions` (`~/.cache/…`), private to this user.
    static func cacheFolder() -> URL {
        let environment = ProcessInfo.processInfo.environment
        let base = environment["XDG_CACHE_HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil }
            ?? (environment["HOME"] ?? NSTemporaryDirectory()) + "/.cache"
        let folder = URL(fileURLWithPath: base).appendingPathComponent("ubiquitykit/versions")
        try? FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true,
                                                 attributes: [.posixPermissions: 0o700])
        return folder
    }

    /// A resolved conflict version no longer counts as a conflict. Setting
    /// it true resolves the file's conflicts keeping its current version:
    /// the conflicted copies go, on every device (the daemon resolves a
    /// file's conflicts together; Apple keeps a resolved version among the
    /// other versions until `removeOtherVersionsOfItem`).
    open var isResolved: Bool = false {
        didSet {
            guard isResolved, !oldValue, isConflict,
                  Self.unresolvedConflictVersionsOfItem(at: item)?.contains(where: { $0.url == url }) == true else { return }
            do {
                let (record, names) = try Daemons.locate(item)
                _ = try Daemons.call(record, .resolve(paths: [names], keep: .current), expecting: NoResult.self)
            } catch {
                isResolved = false
            }
        }
    }

    /// The current version, the conflict versions, then (`history`) the
    /// earlier versions, newest first.
    static func versions(of url: URL, history: Bool = false) -> [NSFileVersion] {
        guard let (record, names) = try? Daemons.locate(url),
              let list = try? Daemons.call(record, .versions(path: names, all: history), expecting: ItemVersions.self) else { return [] }
        let earlier = (list.history ?? []).filter { !$0.current }.reversed()
            .map { NSFileVersion(item: url, earlier: $0) }
        return list.versions.map { NSFileVersion(item: url, mountpoint: record.mountpoint, version: $0) } + earlier
    }

    open class func currentVersionOfItem(at url: URL) -> NSFileVersion? {
        versions(of: url).first { !$0.isConflict }
    }

    /// Every version but the current one: the unresolved conflict
    /// versions, then the earlier versions of its history, newest first.
    open class func otherVersionsOfItem(at url: URL) -> [NSFileVersion]? {
        versions(of: url, history: true).filter { $0.isConflict || $0.historyID != nil }
    }

    open class func unresolvedConflictVersionsOfItem(at url: URL) -> [NSFileVersion]? {
        versions(of: url).filter(\.isConflict)
    }

    /// Make this version the file's content (it is pushed like an edit; an
    /// earlier version replaced this way stays in the history).
    open func replaceItem(at url: URL, options: NSFileVersion.ReplacingOptions = []) throws -> URL {
        let (record, names) = try Daemons.locate(url)
        if let historyID {
            _ = try Daemons.call(record, .restore(path: names, version: historyID, to: nil), expecting: RestoredItem.self)
            return url
        }
        guard isConflict, let number = Int(label) else { return url }
        _ = try Daemons.call(record, .resolve(paths: [names], keep: .version(number)), expecting: NoResult.self)
        return url
    }

    /// Remove every version but the current one: the conflicted copies. The
    /// earlier versions of its history stay for the retention period (the
    /// store's collector removes them then), as on a server-side history.
    open class func removeOtherVersionsOfItem(at url: URL) throws {
        guard otherVersionsOfItem(at: url)?.isEmpty == false else { return }
        let (record, names) = try Daemons.locate(url)
        _ = try Daemons.call(record, .resolve(paths: [names], keep: .current), expecting: NoResult.self)
    }

    public struct ReplacingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let byMoving = ReplacingOptions(rawValue: 1)
    }
}
