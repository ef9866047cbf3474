@_exported import Foundation
// Foundation on Linux declares these three with the initialisers Apple's code
// calls marked unavailable: UbiquityKit's own, re-exported by name, take
// precedence in its users' files (see UbiquityPredicates/Predicate.swift).
@_exported import class UbiquityPredicates.NSPredicate
@_exported import class UbiquityPredicates.NSCompoundPredicate
@_exported import class UbiquityPredicates.NSSortDescriptor
import UbiquityLocks
import UbiquityLocator
import UbiquityProtocol
#if canImport(Glibc)
import Glibc
#endif

/// How UbiquityKit reaches this device's daemons: the device's mounts come
/// from the mount table and the data home's mount records
/// (`UbiquityLocator`), and each mount's daemon answers on its control
/// socket (`UbiquityProtocol`, docs/PROTOCOL.md). Nothing here links
/// libfuse, SQLite or the daemon.
/// `UBIQUITYKIT_TRACE=1`: what UbiquityKit asks and hears, on stderr.
let tracing = ProcessInfo.processInfo.environment["UBIQUITYKIT_TRACE"] != nil
func trace(_ text: @autoclosure () -> String) {
    if tracing { FileHandle.standardError.write(Data("UbiquityKit: \(text())\n".utf8)) }
}

enum Daemons {
    static var dataHome: URL { LocatorPaths.dataHome() }

    /// What a mount shows, asked once per daemon (its pid) and mountpoint.
    struct Shown: Sendable {
        var record: MountRecord
        var description: MountDescription
    }
    static let described = Lock<[String: Shown]>([:])

    /// This device's live mounts and what each shows.
    static func mounts() -> [Shown] {
        MountRecord.all(dataHome: dataHome).compactMap { record in
            if let known = described.withLock({ $0[record.mountpoint] }), known.record == record { return known }
            guard let description = try? call(record, .describe, expecting: MountDescription.self) else { return nil }
            let shown = Shown(record: record, description: description)
            described.withLock { $0[record.mountpoint] = shown }
            return shown
        }
    }

    /// The mount holding `url` (deepest first), and the names below its root.
    static func locate(_ url: URL) throws -> (MountRecord, [String]) {
        let path = url.standardizedFileURL.resolvingSymlinksInPath().path
        for record in MountRecord.all(dataHome: dataHome).sorted(by: { $0.mountpoint.count > $1.mountpoint.count }) {
            if path == record.mountpoint { return (record, []) }
            if path.hasPrefix(record.mountpoint + "/") {
                return (record, path.dropFirst(record.mountpoint.count + 1).split(separator: "/").map(String.init))
            }
        }
        throw CocoaError(.fileNoSuchFile, userInfo: [NSFilePathErrorKey: path,
            NSLocalizedDescriptionKey: "\(path) is not in a mount of a ubiquity container on this device"])
    }

    static func call<Result: Codable & Sendable>(_ record: MountRecord, _ command: Command, expecting: Result.Type,
                                                  connected: (Int32) -> Void = { _ in },
                                                  onUpdate: (Update) -> Void = { _ in }) throws -> Result {
        do {
            return try ControlClient.call(socket: record.socket, ControlRequest(command), expecting: expecting,
                                          connected: connected, onUpdate: onUpdate)
        } catch let error as ControlError {
            throw error.cocoa(record.mountpoint)
        }
    }

    /// Run `command` on the daemon of the mount holding each URL (one request per mount).
    static func run(_ urls: [URL], _ command: ([[String]]) -> Command) throws {
        var byMount: [String: (MountRecord, [[String]])] = [:]
        for url in urls {
            let (record, names) = try locate(url)
            byMount[record.mountpoint, default: (record, [])].1.append(names)
        }
        for (_, (record, paths)) in byMount.sorted(by: { $0.key < $1.key }) {
            _ = try call(record, command(paths), expecting: NoResult.self)
        }
    }

    /// The `ubiquityfs` command (for mounting on demand): `UBIQUITYFS_BIN`, else `PATH`.
    static func commandLine() -> String? {
        let environment = ProcessInfo.processInfo.environment
        if let bin = environment["UBIQUITYFS_BIN"], access(bin, X_OK) == 0 { return bin }
        for dir in (environment["PATH"] ?? "/usr/local/bin:/usr/bin").split(separator: ":") {
            let candidate = "\(dir)/ubiquityfs"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }
}

extension ControlError {
    /// The Cocoa error an Apple API would give: the daemon's errno as a POSIX
    /// error beneath, its message as the description.
    func cocoa(_ mountpoint: String) -> NSError {
        let underlying = NSError(domain: NSPOSIXErrorDomain, code: Int(errno ?? EIO))
        let code: CocoaError.Code = switch errno {
        case ENOENT: .fileNoSuchFile
        case EACCES, EPERM: .fileReadNoPermission
        default: .fileReadUnknown
        }
        return NSError(domain: NSCocoaErrorDomain, code: code.rawValue, userInfo: [
            NSLocalizedDescriptionKey: "\(mountpoint): \(message)",
            NSUnderlyingErrorKey: underlying,
        ])
    }
}
