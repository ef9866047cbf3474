import UbiquityLocator
import UbiquityProtocol

/// The versions of a file, as `NSFileVersion` gives them: the current one,
/// and the unresolved conflict versions the sync engine keeps (each a
/// conflicted copy beside the file, `NAME (conflicted copy DEVICE DATE)`).
/// Resolving removes the copies on every device (`ubiquityfs resolve`).
/// Older versions than the conflicts (history) are not kept yet: issue 39.
open class NSFileVersion: NSObject, @unchecked Sendable {
    /// Where this version's content is (the file itself, or its conflicted copy).
    open var url: URL
    open var localizedName: String?
    open var localizedNameOfSavingComputer: String?
    open var modificationDate: Date?
    open var isConflict: Bool
    /// The file this version belongs to.
    let item: URL
    let label: String

    init(item: URL, mountpoint: String, version: ItemVersion) {
        self.item = item
        label = version.label
        url = URL(fileURLWithPath: mountpoint + version.path)
        localizedName = url.lastPathComponent
        localizedNameOfSavingComputer = version.device
        modificationDate = ISO8601DateFormatter().date(from: version.modified)
        isConflict = version.label != "current"
        super.init()
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

    static func versions(of url: URL) -> [NSFileVersion] {
        guard let (record, names) = try? Daemons.locate(url),
              let list = try? Daemons.call(record, .versions(path: names), expecting: ItemVersions.self) else { return [] }
        return list.versions.map { NSFileVersion(item: url, mountpoint: record.mountpoint, version: $0) }
    }

    open class func currentVersionOfItem(at url: URL) -> NSFileVersion? {
        versions(of: url).first { !$0.isConflict }
    }

    /// The other versions of the file: its unresolved conflict versions.
    open class func otherVersionsOfItem(at url: URL) -> [NSFileVersion]? {
        versions(of: url).filter(\.isConflict)
    }

    open class func unresolvedConflictVersionsOfItem(at url: URL) -> [NSFileVersion]? {
        versions(of: url).filter(\.isConflict)
    }

    /// Make this version the file's content (it is pushed like an edit).
    open func replaceItem(at url: URL, options: NSFileVersion.ReplacingOptions = []) throws -> URL {
        guard isConflict else { return url }
        let (record, names) = try Daemons.locate(url)
        guard let number = Int(label) else { return url }
        _ = try Daemons.call(record, .resolve(paths: [names], keep: .version(number)), expecting: NoResult.self)
        return url
    }

    /// Remove every version but the current one (the conflicted copies).
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
