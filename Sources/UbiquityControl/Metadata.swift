/// The metadata query language: NSPredicate-style predicates over item
/// metadata, modelled on what `NSMetadataQuery` accepts for iCloud items.
///
/// Pure Swift, no I/O. A `Query` is parsed and type-checked once, compiled to
/// a tree of closures, and then evaluated against `MetadataItem`s.

/// One value of an item's metadata.
public enum MetadataValue: Sendable, Hashable {
    case string(String)
    case number(Double)
    case bool(Bool)
    /// Seconds since 1970-01-01T00:00:00Z.
    case date(Double)
    /// A collection attribute's values (`contentTypeTree`), in order.
    case list([MetadataValue])
    case null
}

/// The metadata of one item, keyed by short attribute names (`Query.attributeNames`).
/// A missing key is the same as `.null`.
public struct MetadataItem: Sendable, Hashable {
    public var values: [String: MetadataValue]

    public init(values: [String: MetadataValue] = [:]) {
        self.values = values
    }

    public subscript(attribute: String) -> MetadataValue {
        get { values[attribute] ?? .null }
        set { values[attribute] = newValue }
    }
}

/// The type of an attribute, which decides the operators and literals it accepts.
enum AttributeType: String, Sendable, Equatable {
    case string, number, bool, date

    var article: String {
        switch self {
        case .string: "a string"
        case .number: "a number"
        case .bool: "a boolean"
        case .date: "a date"
        }
    }
}

/// A known attribute: its short name, its type (for a collection, its
/// elements' type), and a key path that derives another value from it.
struct Attribute: Sendable, Equatable {
    var name: String
    var type: AttributeType
    /// Whether the value is a collection (`contentTypeTree`, `path.pathComponents`):
    /// the attribute `ANY`, `ALL` and `NONE` apply to.
    var isCollection = false
    /// The key path after the name, applied in order.
    var keyPath: [KeyPathStep] = []

    /// One step of a key path.
    enum KeyPathStep: String, Sendable, Equatable, CaseIterable {
        /// A path's components, as NSString's `pathComponents` gives them:
        /// "/a/b" is ["/", "a", "b"]. Only on `path`.
        case pathComponents
        /// The number of elements of a collection.
        case count = "@count"
    }

    /// As written in a canonical predicate.
    var spelled: String { ([name] + keyPath.map(\.rawValue)).joined(separator: ".") }

    /// The attribute with one more step of key path, or nil if the step does not apply.
    func appending(_ step: KeyPathStep) -> Attribute? {
        var derived = self
        derived.keyPath.append(step)
        switch step {
        case .pathComponents:
            guard name == "path", keyPath.isEmpty else { return nil }
            derived.isCollection = true
        case .count:
            guard isCollection else { return nil }
            derived.type = .number
            derived.isCollection = false
        }
        return derived
    }
}

enum Attributes {
    /// The short attribute names with their types, in documentation order.
    static let all: [Attribute] = [
        Attribute(name: "name", type: .string),
        Attribute(name: "displayName", type: .string),
        Attribute(name: "path", type: .string),
        Attribute(name: "url", type: .string),
        Attribute(name: "size", type: .number),
        Attribute(name: "contentType", type: .string),
        Attribute(name: "contentTypeTree", type: .string, isCollection: true),
        Attribute(name: "mimeType", type: .string),
        Attribute(name: "isDirectory", type: .bool),
        Attribute(name: "creationDate", type: .date),
        Attribute(name: "modificationDate", type: .date),
        Attribute(name: "downloadingStatus", type: .string),
        Attribute(name: "isDownloading", type: .bool),
        Attribute(name: "percentDownloaded", type: .number),
        Attribute(name: "isUploaded", type: .bool),
        Attribute(name: "isUploading", type: .bool),
        Attribute(name: "percentUploaded", type: .number),
        Attribute(name: "hasUnresolvedConflicts", type: .bool),
        Attribute(name: "downloadingError", type: .string),
        Attribute(name: "uploadingError", type: .string),
        Attribute(name: "pinned", type: .bool),
    ]

    /// iCloud / Spotlight spellings and the short names they stand for.
    static let aliases: [String: String] = [
        "NSMetadataItemFSNameKey": "name",
        "kMDItemFSName": "name",
        "NSMetadataItemDisplayNameKey": "displayName",
        "kMDItemDisplayName": "displayName",
        "NSMetadataItemURLKey": "url",
        "kMDItemURL": "url",
        "NSMetadataItemPathKey": "path",
        "kMDItemPath": "path",
        "NSMetadataItemFSSizeKey": "size",
        "kMDItemFSSize": "size",
        "NSMetadataItemContentTypeKey": "contentType",
        "kMDItemContentType": "contentType",
        "NSMetadataItemContentTypeTreeKey": "contentTypeTree",
        "kMDItemContentTypeTree": "contentTypeTree",
        "NSMetadataItemFSCreationDateKey": "creationDate",
        "kMDItemFSCreationDate": "creationDate",
        "NSMetadataItemFSContentChangeDateKey": "modificationDate",
        "kMDItemFSContentChangeDate": "modificationDate",
        "NSMetadataUbiquitousItemDownloadingStatusKey": "downloadingStatus",
        "NSMetadataUbiquitousItemIsDownloadingKey": "isDownloading",
        "NSMetadataUbiquitousItemPercentDownloadedKey": "percentDownloaded",
        "NSMetadataUbiquitousItemIsUploadedKey": "isUploaded",
        "NSMetadataUbiquitousItemIsUploadingKey": "isUploading",
        "NSMetadataUbiquitousItemPercentUploadedKey": "percentUploaded",
        "NSMetadataUbiquitousItemHasUnresolvedConflictsKey": "hasUnresolvedConflicts",
        "NSMetadataUbiquitousItemDownloadingErrorKey": "downloadingError",
        "NSMetadataUbiquitousItemUploadingErrorKey": "uploadingError",
    ]

    /// Apple's constant names that may stand where a value does (exact spelling).
    static let constants: [String: Literal] = [
        "NSMetadataUbiquitousItemDownloadingStatusCurrent": .string("current"),
        "NSMetadataUbiquitousItemDownloadingStatusDownloaded": .string("downloaded"),
        "NSMetadataUbiquitousItemDownloadingStatusNotDownloaded": .string("notDownloaded"),
    ]

    /// Every accepted spelling, lower-cased, to its attribute.
    private static let byLowercasedName: [String: Attribute] = {
        var table: [String: Attribute] = [:]
        for attribute in all { table[attribute.name.lowercased()] = attribute }
        let byName = Dictionary(uniqueKeysWithValues: all.map { ($0.name, $0) })
        for (alias, short) in aliases { table[alias.lowercased()] = byName[short]! }
        return table
    }()

    /// The attribute a name or alias stands for (case-insensitive), followed by
    /// a key path the query knows (`path.pathComponents`, `….@count` on a
    /// collection), or nil.
    static func lookup(_ name: String) -> Attribute? {
        var parts = name.split(separator: ".", omittingEmptySubsequences: false)
        guard var attribute = byLowercasedName[parts.removeFirst().lowercased()] else { return nil }
        for part in parts {
            let lowercased = part.lowercased()
            guard let step = Attribute.KeyPathStep.allCases.first(where: { $0.rawValue.lowercased() == lowercased }),
                  let derived = attribute.appending(step)
            else { return nil }
            attribute = derived
        }
        return attribute
    }

    /// The collection attributes and key paths, as messages name them.
    static let collectionsDescription = "contentTypeTree and path.pathComponents"
}

extension Query {
    /// The short attribute names, the keys of `MetadataItem.values`.
    public static let attributeNames: [String] = Attributes.all.map(\.name)

    /// The short name for a short name or an iCloud-style alias
    /// (`NSMetadataItemFSNameKey`, `kMDItemFSName`, …), matched case-insensitively;
    /// nil if the name is unknown.
    public static func canonicalName(_ name: String) -> String? {
        Attributes.lookup(name)?.name
    }
}
