import UbiquityProtocol
#if canImport(Glibc)
import Glibc
#endif

/// getxattr(2) (Glibc's module map leaves out <sys/xattr.h>).
@_silgen_name("getxattr")
func systemGetxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeMutableRawPointer?, _ size: Int) -> Int

/// The `ubiquitousItem…` URL resource values, which Foundation on Linux
/// does not have (`URLResourceValues` lacks most of them and returns nil
/// for the rest). Foundation's `URL.resourceValues(forKeys:)` cannot be
/// replaced — an extension with the same name is ambiguous on this
/// toolchain — so the smallest change to Apple code is the method's name:
///
///     let values = try url.ubiquitousResourceValues(forKeys: [.ubiquitousItemDownloadingStatusKey])
///     values.ubiquitousItemDownloadingStatus == .current
///     values.isDirectory        // every other resource value, from Foundation
///
/// The values are the item's read-only `user.ubiquity.status` attribute
/// (docs/SEMANTICS.md), read from the mount: no daemon round trip.
@dynamicMemberLookup
public struct UbiquitousResourceValues: @unchecked Sendable {
    /// Foundation's values for the keys asked (and nil for the ubiquitous ones).
    public let foundation: URLResourceValues

    public var isUbiquitousItem: Bool?
    public var ubiquitousItemDownloadingStatus: URLUbiquitousItemDownloadingStatus?
    public var ubiquitousItemIsDownloading: Bool?
    public var ubiquitousItemDownloadRequested: Bool?
    public var ubiquitousItemIsUploaded: Bool?
    public var ubiquitousItemIsUploading: Bool?
    public var ubiquitousItemHasUnresolvedConflicts: Bool?
    public var ubiquitousItemDownloadingError: NSError?
    public var ubiquitousItemUploadingError: NSError?
    public var ubiquitousItemIsExcludedFromSync: Bool?
    /// Not Apple's: the share downloaded so far (0–100), as `NSMetadataUbiquitousItemPercentDownloadedKey`.
    public var ubiquitousItemPercentDownloaded: Double?

    public subscript<Value>(dynamicMember keyPath: KeyPath<URLResourceValues, Value>) -> Value {
        foundation[keyPath: keyPath]
    }
}

/// Apple's `URLUbiquitousItemDownloadingStatus`.
public struct URLUbiquitousItemDownloadingStatus: RawRepresentable, Hashable, Sendable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    /// A placeholder: nothing local.
    public static let notDownloaded = URLUbiquitousItemDownloadingStatus(rawValue: NSMetadataUbiquitousItemDownloadingStatusNotDownloaded)
    /// A local copy, not the newest version (that one is on its way).
    public static let downloaded = URLUbiquitousItemDownloadingStatus(rawValue: NSMetadataUbiquitousItemDownloadingStatusDownloaded)
    /// The newest version is local.
    public static let current = URLUbiquitousItemDownloadingStatus(rawValue: NSMetadataUbiquitousItemDownloadingStatusCurrent)
}

extension URL {
    /// Foundation's resource values for `keys`, with the ubiquitous ones
    /// filled in (see `UbiquitousResourceValues`). Outside a mount of a
    /// container, `isUbiquitousItem` is false and the ubiquitous values nil.
    public func ubiquitousResourceValues(forKeys keys: Set<URLResourceKey>) throws -> UbiquitousResourceValues {
        let foundationKeys = keys.filter { !$0.rawValue.hasPrefix("NSURLUbiquitousItem") && $0 != .isUbiquitousItemKey }
        var values = UbiquitousResourceValues(foundation: try resourceValues(forKeys: foundationKeys))
        guard (try? Daemons.locate(self)) != nil else {
            values.isUbiquitousItem = false
            return values
        }
        values.isUbiquitousItem = true
        let status = try Self.itemStatus(path)
        values.ubiquitousItemDownloadingStatus = switch status.downloadingStatus {
        case "current": .current
        case "downloaded": .downloaded
        default: .notDownloaded
        }
        values.ubiquitousItemIsDownloading = status.isDownloading
        values.ubiquitousItemDownloadRequested = status.isDownloading || status.pinned
        values.ubiquitousItemIsUploaded = status.isUploaded
        values.ubiquitousItemIsUploading = status.isUploading
        values.ubiquitousItemHasUnresolvedConflicts = status.hasUnresolvedConflicts
        values.ubiquitousItemDownloadingError = status.downloadingError.map { Self.syncError($0, code: .ubiquitousFileUnavailable) }
        values.ubiquitousItemUploadingError = status.uploadingError.map { Self.syncError($0, code: .ubiquitousFileUbiquityServerNotAvailable) }
        values.ubiquitousItemIsExcludedFromSync = false
        values.ubiquitousItemPercentDownloaded = Double(status.percentDownloaded)
        return values
    }

    /// What the mount says of the item (`user.ubiquity.status`).
    static func itemStatus(_ path: String) throws -> ItemStatus {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = systemGetxattr(path, "user.ubiquity.status", &buffer, buffer.count)
        guard n > 0 else {
            let code = errno
            throw NSError(domain: NSCocoaErrorDomain, code: code == ENOENT ? CocoaError.fileNoSuchFile.rawValue : CocoaError.fileReadUnknown.rawValue,
                          userInfo: [NSFilePathErrorKey: path, NSUnderlyingErrorKey: NSError(domain: NSPOSIXErrorDomain, code: Int(code))])
        }
        return try JSONDecoder().decode(ItemStatus.self, from: Data(buffer[0..<n]))
    }

    static func syncError(_ message: String, code: CocoaError.Code) -> NSError {
        NSError(domain: NSCocoaErrorDomain, code: code.rawValue, userInfo: [NSLocalizedDescriptionKey: message])
    }
}
