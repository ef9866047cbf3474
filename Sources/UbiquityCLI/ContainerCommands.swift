import ArgumentParser
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import UbiquityDaemon
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquitySync
import Logging

/// `ubiquityfs container create|list|show|set`: container configuration,
/// kept in the store so every device agrees (iCloud's
/// `NSUbiquitousContainerName`, `…IsDocumentScopePublic`, `…SupportedFolderLevels`).
struct Container: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create, list, show and change containers of a store.",
        subcommands: [ContainerCreate.self, ContainerList.self, ContainerShow.self, ContainerSet.self])
}

struct StoreOption: ParsableArguments {
    @OptionGroup var location: StoreOptions
    @Flag(help: "When the store is new, make it shared by the group of its folder (as `mount --shared-store`).")
    var sharedStore = false

    func open() throws -> any Store {
        guard let address = location.address else {
            return try FolderStore(root: Locations().defaultStore, create: true, initializeEmpty: true, shared: sharedStore)
        }
        if address.isS3 {
            let locations = Locations()
            let store = try address.openS3(knownStoreID: address.readKnownStoreID(locations))
            if let problem = store.startupProblem { throw UbiquityError(EHOSTDOWN, problem) }
            try address.recordStoreID(store.storeID, locations)
            return store
        }
        return try FolderStore(root: URL(fileURLWithPath: address.url), create: false, initializeEmpty: true, shared: sharedStore)
    }
}

extension ContainerConfig.FolderLevels: ExpressibleByArgument {}

func printContainer(_ c: ContainerConfig) {
    print("\(c.id)")
    print("  name:           \(c.displayName)")
    print("  documents:      \(c.documentScopePublic ? "public (shown in the drive view)" : "private")")
    print("  folder levels:  \(c.supportedFolderLevels.rawValue)")
    print("  retention:      \(c.retentionDays ?? ContainerConfig.defaultRetentionDays) days (earlier versions and Recently Deleted)")
}

struct ContainerCreate: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "create", abstract: "Create a container.")
    @Argument(help: "Container ID, reverse-DNS style (com.example.notes).") var id: String
    @Option(help: "Display name (the folder name in the drive view).") var name: String?
    @Flag(help: "Make the Documents scope public (shown in the drive view).") var `public` = false
    @Option(help: "Folder levels allowed in Documents: none, one or any.") var folderLevels: ContainerConfig.FolderLevels = .any
    @Option(help: "Days earlier versions and deleted items are kept (default 30).") var retentionDays: Int?
    @OptionGroup var storeOption: StoreOption

    func run() throws {
        let config = ContainerConfig(id: id, displayName: name ?? id, documentScopePublic: `public`,
                                     supportedFolderLevels: folderLevels, retentionDays: retentionDays)
        try storeOption.open().createContainer(config)
        printContainer(config)
    }
}

struct ContainerList: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "List the containers of a store.")
    @OptionGroup var storeOption: StoreOption
    @Flag(help: "Print JSON (one object per line).") var json = false

    func run() throws {
        let listing = try storeOption.open().containers()
        if !json && !listing.configs.isEmpty { print("ID\tNAME\tDOCUMENTS\tFOLDER LEVELS") }
        for c in listing.configs {
            if json {
                print(String(decoding: try JSONEncoder().encode(c), as: UTF8.self))
            } else {
                print("\(c.id)\t\(c.displayName)\t\(c.documentScopePublic ? "public" : "private")\t\(c.supportedFolderLevels.rawValue)")
            }
        }
        // The others are listed; a damaged one is an error, named on stderr.
        if !listing.damaged.isEmpty {
            fflush(nil)
            for (id, problem) in listing.damaged {
                FileHandle.standardError.write(Data("ubiquityfs: container \(id): \(problem)\n".utf8))
            }
            throw ExitCode.failure
        }
    }
}

struct ContainerShow: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "show", abstract: "Show a container's configuration.")
    @Argument(help: "Container ID.") var id: String
    @OptionGroup var storeOption: StoreOption

    func run() throws {
        guard let c = try storeOption.open().containerConfig(id) else { throw UbiquityError(ENOENT, "no container \(id)") }
        printContainer(c)
    }
}

struct ContainerSet: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "set", abstract: "Change a container's configuration.")
    @Argument(help: "Container ID.") var id: String
    @Option(help: "Display name.") var name: String?
    @Option(help: "Documents scope public: true or false.") var `public`: Bool?
    @Option(help: "Folder levels allowed in Documents: none, one or any.") var folderLevels: ContainerConfig.FolderLevels?
    @Option(help: "Days earlier versions and deleted items are kept.") var retentionDays: Int?
    @OptionGroup var storeOption: StoreOption

    func run() throws {
        let store = try storeOption.open()
        guard var c = try store.containerConfig(id) else { throw UbiquityError(ENOENT, "no container \(id)") }
        if let name { c.displayName = name }
        if let p = `public` { c.documentScopePublic = p }
        if let folderLevels { c.supportedFolderLevels = folderLevels }
        if let retentionDays { c.retentionDays = retentionDays }
        try store.updateContainer(c)
        printContainer(c)
    }
}

/// `ubiquityfs gc`: one run of the store's collector (`Collector`), which
/// the daemon also runs about once a day.
struct CollectGarbage: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gc",
        abstract: "Remove from the store the content and journal records no container's retention period needs.",
        discussion: """
            A blob goes only when it was unneeded and unchanged for the grace period in two runs at least that far \
            apart: the first marks it, a later one removes it (devices at work keep the blobs they rely on alive). \
            Journal records older than the retention period plus the grace period go up to the newest snapshot \
            among them, which becomes the journal's base: a device away for longer rejoins from it, keeping its \
            own work. \
            Every device's daemon runs this about once a day; run it by hand to reclaim room sooner (twice, the \
            grace period apart). --as-of measures the retention periods from another date (to see or test what a \
            later run removes); the blobs it removes are gone from then on.
            """)
    @OptionGroup var storeOption: StoreOption
    @Option(help: "Hours a blob must stay unneeded and unchanged, and between marking and removing (default 48).")
    var graceHours: Double = Collector.defaultGrace / 3600
    @Option(help: "Measure retention periods as of this date (ISO 8601, e.g. 2027-01-31T00:00:00Z).")
    var asOf: String?
    @Flag(help: "Print JSON.") var json = false

    func run() throws {
        var now = Date()
        if let asOf {
            guard let date = ISO8601DateFormatter().date(from: asOf) else { throw ValidationError("--as-of takes an ISO 8601 date and time, like 2027-01-31T00:00:00Z") }
            now = date
        }
        guard graceHours >= 0 else { throw ValidationError("--grace-hours must be 0 or more") }
        let collector = Collector(store: try storeOption.open(), logger: Logger(label: "ubiquityfs.gc"))
        let report = try collector.run(now: now, grace: graceHours * 3600)
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            print(String(decoding: try encoder.encode(report), as: UTF8.self))
            return
        }
        print("blobs: \(report.blobs) (\(formatBytes(report.bytes))), needed: \(report.needed)")
        print("removed: \(report.removed) (\(formatBytes(report.removedBytes))), marked for a later run: \(report.marked)")
        print("journal records removed: \(report.recordsRemoved), snapshots removed: \(report.snapshotsRemoved)")
    }
}
