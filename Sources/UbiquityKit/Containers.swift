import UbiquityLocks
import UbiquityLocator
import UbiquityProtocol
#if canImport(Glibc)
import Glibc
#endif

/// The app's ubiquity containers, declared as an Apple app's Info.plist
/// declares them (`NSUbiquitousContainers`, first one the default), and
/// where each lives on this device.
///
/// Declaring: `UbiquityContainers.declare(["com.example.notes"])` in code,
/// or an `Info.plist` beside the executable (or the main bundle's) with an
/// `NSUbiquitousContainers` dictionary, or `UBIQUITY_CONTAINERS=ID[,ID…]` in
/// the environment — first found wins. Apple's `iCloud.` prefix is dropped:
/// `iCloud.com.example.notes` is the container `com.example.notes`.
///
/// Where: a mount of the whole container (`ubiquityfs mount DIR --container
/// ID --scope all`) of this device if there is one; else the container is
/// mounted on demand at `$XDG_DATA_HOME/ubiquityfs/containers/ID` by
/// `ubiquityfs mount` (from `UBIQUITYFS_BIN` or `PATH`), on the device's
/// default store or the one that mountpoint used last.
public enum UbiquityContainers {
    static let declared = Lock<[String]?>(nil)

    /// Declare the app's containers (the first is the default one).
    public static func declare(_ identifiers: [String]) {
        declared.withLock { $0 = identifiers.map(normalized) }
    }

    /// The app's containers, as declared.
    public static var identifiers: [String] {
        if let ids = declared.withLock({ $0 }) { return ids }
        let found = fromInfoPlist() ?? fromEnvironment() ?? []
        declared.withLock { $0 = found }
        return found
    }

    static func normalized(_ id: String) -> String { id.hasPrefix("iCloud.") ? String(id.dropFirst(7)) : id }

    static func fromEnvironment() -> [String]? {
        guard let value = ProcessInfo.processInfo.environment["UBIQUITY_CONTAINERS"], !value.isEmpty else { return nil }
        return value.split(separator: ",").map { normalized($0.trimmingCharacters(in: .whitespaces)) }
    }

    static func fromInfoPlist() -> [String]? {
        var candidates: [URL] = []
        if let info = Bundle.main.url(forResource: "Info", withExtension: "plist") { candidates.append(info) }
        let executable = URL(fileURLWithPath: CommandLine.arguments.first ?? "").resolvingSymlinksInPath()
        candidates.append(executable.deletingLastPathComponent().appendingPathComponent("Info.plist"))
        for url in candidates {
            guard let data = try? Data(contentsOf: url),
                  let plist = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any],
                  let containers = plist["NSUbiquitousContainers"] as? [String: Any], !containers.isEmpty
            else { continue }
            // A dictionary has no order: the default is the first by name, as `declare` lets an app say otherwise.
            return containers.keys.sorted().map(normalized)
        }
        return nil
    }

    /// Where containers are mounted on demand.
    public static var onDemandRoot: URL { Daemons.dataHome.appendingPathComponent("containers") }

    /// The container's root on this device, mounting it if it is not (nil:
    /// no such container is declared, or it cannot be mounted).
    static func url(for identifier: String?) -> URL? {
        guard let id = identifier.map(normalized) ?? identifiers.first else { return nil }
        if let mounted = mountedRoot(id) { return mounted }
        return mountOnDemand(id)
    }

    static func mountedRoot(_ id: String) -> URL? {
        Daemons.mounts().first { $0.description.containers == [id] && $0.description.scope == .all }
            .map { URL(fileURLWithPath: $0.record.mountpoint, isDirectory: true) }
    }

    static let mounting = Lock(())

    static func mountOnDemand(_ id: String) -> URL? {
        mounting.withLock { _ -> URL? in
            if let mounted = mountedRoot(id) { return mounted }
            guard let binary = Daemons.commandLine() else { return nil }
            let dir = onDemandRoot.appendingPathComponent(id, isDirectory: true)
            try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true,
                                                     attributes: [.posixPermissions: 0o700])
            let status = run([binary, "mount", dir.path, "--container", id, "--scope", "all"])
            trace("ubiquityfs mount \(dir.path) --container \(id): status \(status)")
            guard status == 0 else { return nil }
            return mountedRoot(id) ?? dir
        }
    }
}

/// Run a program, its output to /dev/null, and wait for it: its exit
/// status (-1: it could not run). Not `Process`, whose wait on Linux needs
/// the calling thread's run loop, which an app's main thread may be blocking.
func run(_ argv: [String]) -> Int32 {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
    var cArgs = argv.map { strdup($0) } + [nil]
    defer { for arg in cArgs { free(arg) } }
    var pid = pid_t()
    guard posix_spawn(&pid, argv[0], &actions, nil, &cArgs, environ) == 0 else { return -1 }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 {
        guard errno == EINTR else { return -1 }
    }
    return (status & 0x7f) == 0 ? (status >> 8) & 0xff : -1
}

extension FileManager {
    /// The container's directory on this device (nil: the app's first
    /// declared container), mounted on demand; nil when this device has no
    /// store to mount it from. May take a moment (a mount): call it off the
    /// main thread, as on Apple platforms.
    public func url(forUbiquityContainerIdentifier containerIdentifier: String?) -> URL? {
        UbiquityContainers.url(for: containerIdentifier)
    }

    /// A token for this device's store (nil when this device has none): it
    /// changes when the store does, as Apple's changes with the iCloud account.
    public var ubiquityIdentityToken: (any NSCoding & NSCopying & NSObjectProtocol)? {
        if let store = Daemons.mounts().first?.description.store { return NSString(string: store) }
        let defaultStore = Daemons.dataHome.appendingPathComponent("store")
        return fileExists(atPath: defaultStore.path) ? NSString(string: defaultStore.path) : nil
    }

    /// Whether the item is in a ubiquity container (a mount of this device).
    public func isUbiquitousItem(at url: URL) -> Bool {
        (try? Daemons.locate(url)) != nil
    }

    /// Download the item (a folder: everything in it) in the background.
    public func startDownloadingUbiquitousItem(at url: URL) throws {
        let (record, names) = try Daemons.locate(url)
        guard fileExists(atPath: url.path) else { throw CocoaError(.fileNoSuchFile, userInfo: [NSFilePathErrorKey: url.path]) }
        Thread.detachNewThread {
            _ = try? Daemons.call(record, .download(paths: [names], recursive: true), expecting: NoResult.self)
        }
    }

    /// Remove the local copy of the item (it stays listed and downloads
    /// again when opened); refused for an item open for writing or not yet uploaded.
    public func evictUbiquitousItem(at url: URL) throws {
        try Daemons.run([url]) { .evict(paths: $0) }
    }

    /// Move a local item into a container (`flag` true, `destinationURL` in
    /// the container) or out of it (`flag` false, `url` in the container).
    public func setUbiquitous(_ flag: Bool, itemAt url: URL, destinationURL: URL) throws {
        guard flag == isUbiquitousItem(at: destinationURL) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSLocalizedDescriptionKey:
                flag ? "\(destinationURL.path) is not in a ubiquity container" : "\(destinationURL.path) is in a ubiquity container"])
        }
        try moveItem(at: url, to: destinationURL)
    }
}
