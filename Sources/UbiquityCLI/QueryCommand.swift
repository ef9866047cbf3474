import ArgumentParser
import Foundation
import UbiquityControl
import UbiquityDaemon
import UbiquityProtocol
import UbiquityReplica
import UbiquityModel
import UbiquitySync

/// `ubiquityfs query`: NSMetadataQuery for the command line.
struct QueryCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "query",
        abstract: "List items matching a predicate, with their sync status; --watch follows changes.",
        discussion: """
            Predicates are NSPredicate-style: name LIKE[c] '*.md' AND size > 1000, \
            downloadingStatus == 'notDownloaded', modificationDate > DATE("2026-01-01"), \
            NSMetadataItemFSNameKey BEGINSWITH 'IMG' … Attributes: \(Query.attributeNames.joined(separator: ", ")).
            Without a mountpoint, --container queries that container (all of it, or --scope) through a \
            mount that shows it if one runs, else reads this device's replica (read-only; no --watch). \
            Through a mount, paths are absolute (the mountpoint and the path below it); with --container \
            and no mountpoint, from the container's root. A drive shows Documents scopes only.
            """)

    @Argument(help: "A ubiquityfs mountpoint (default: the mount of --container, or the only mount).") var mountpoint: String?
    @Option(help: "Container ID.") var container: String?
    @OptionGroup var storeOptions: StoreOptions
    @Option(help: "Scope: documents, data or all (repeatable; default all).") var scope: [Scope] = []
    @Option(help: "Predicate (default: every item).") var predicate = "TRUEPREDICATE"
    @Option(parsing: .unconditional, help: "Sort keys, comma-separated; a leading - sorts descending (e.g. name,-size).")
    var sort: String?
    @Flag(help: "One JSON object per line.") var json = false
    @Flag(help: "Keep running: results, a gathering-finished marker, then updates as they happen.") var watch = false
    @Option(help: "Seconds between update batches with --watch.") var throttle: Double = 1

    func validate() throws {
        do { _ = try Query(predicate: predicate, sort: sort) } catch { throw ValidationError("\(error)") }
        guard throttle > 0, throttle <= 3600 else { throw ValidationError("--throttle must be between 0 and 3600 seconds") }
    }

    func run() throws {
        let scopes = scope.isEmpty ? [Scope.all] : scope
        if let socket = try socketPath() {
            try remote(socket: socket, scopes: scopes)
        } else {
            guard !watch else { throw UbiquityError(EINVAL, "--watch needs a running mount of the container") }
            try local(scopes: scopes)
        }
    }

    /// The control socket to ask, or nil to read the replica directly.
    /// Only this device's mounts are asked (`MountLocator.daemon`).
    func socketPath() throws -> String? {
        if let mountpoint { return try MountLocator.daemon(of: resolvedPath(mountpoint)).socket }
        let mounts = MountLocator.mounts().compactMap { try? MountLocator.daemon(of: $0) }
        guard let container else {
            guard mounts.count == 1 else {
                throw UbiquityError(EINVAL, mounts.isEmpty ? "no ubiquityfs mount of this device: give --container ID to read a replica"
                                                           : "several mounts: name one, or give --container")
            }
            return mounts[0].socket
        }
        for mount in mounts {
            // A mount that shows this container (of this store, if one was named).
            guard let shown = try? ControlClient.call(socket: mount.socket, ControlRequest(.describe), expecting: MountDescription.self),
                  shown.containers.contains(container) else { continue }
            if let address = storeOptions.address, shown.store != address.shownLocation { continue }
            return mount.socket
        }
        return nil
    }

    func remote(socket: String, scopes: [Scope]) throws {
        let request = ControlRequest(.query(QueryParameters(predicate: predicate, sort: sort, scopes: scopes,
                                                            container: mountpoint == nil ? container : nil,
                                                            watch: watch, throttle: throttle)))
        var rows: [[String: JSONValue]] = []
        // JSON out: the daemon's hand-written item lines are printed as they
        // come (without decoding 100,000 of them), the others as decoded.
        let passThrough: ((Data) -> Bool)? = json ? { line in
            guard line.starts(with: Data("{\"event\":\"".utf8)), !line.starts(with: Data("{\"event\":\"heartbeat".utf8)) else {
                return false
            }
            FileHandle.standardOutput.write(line + Data([0x0a]))
            return true
        } : nil
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        _ = try ControlClient.call(socket: socket, request, expecting: QueryFinished.self, rawLine: passThrough, onUpdate: { update in
            guard case .event(let event) = update, event.event != .heartbeat else { return }
            if json {
                if let line = try? encoder.encode(event) { FileHandle.standardOutput.write(line + Data([0x0a])) }
            } else if event.event == .result && !watch {
                if let item = event.item { rows.append(item) }
            } else if event.event == .gatheringFinished {
                print("-- gathering finished: \(event.count ?? 0) items --")
            } else if let item = event.item {
                print("\(event.event.rawValue.padding(toLength: 8, withPad: " ", startingAt: 0)) \(row(item))")
            }
            fflush(nil)
        })
        if !json && !watch { printTable(rows) }
    }

    func local(scopes: [Scope]) throws {
        guard let container else { throw UbiquityError(EINVAL, "give a mountpoint or --container") }
        let locations = Locations()
        let address = storeOptions.address ?? StoreAddress(url: locations.defaultStore.path)
        guard let storeID = try address.readKnownStoreID(locations) else {
            throw UbiquityError(ENOENT, "this device has never mounted a container of \(address.description)")
        }
        let ns = try Replica.readNamespace(directory: locations.replica(storeID: storeID, container: container))
        let query = try Query(predicate: predicate, sort: sort)
        let results = QueryService.run(query, scopes: scopes, namespace: ns)
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            for (_, item) in results {
                print(String(decoding: try encoder.encode(QueryEvent(.result, item: QueryService.json(item))), as: UTF8.self))
            }
        } else {
            printTable(results.map { QueryService.json($0.1) })
        }
    }

    func row(_ item: [String: JSONValue]) -> String {
        let size = item["isDirectory"]?.bool ?? false ? "-" : formatBytes(UInt64(item["size"]?.number ?? 0))
        let status = "\(item["downloadingStatus"]?.string ?? "")\(item["isUploaded"]?.bool ?? true ? "" : ", not uploaded")"
            + (item["hasUnresolvedConflicts"]?.bool ?? false ? ", conflicts" : "")
        return "\(size.padding(toLength: 10, withPad: " ", startingAt: 0)) \(status.padding(toLength: 28, withPad: " ", startingAt: 0)) \(item["path"]?.string ?? "")"
    }

    func printTable(_ rows: [[String: JSONValue]]) {
        print("SIZE       STATUS                       PATH")
        for item in rows { print(row(item)) }
        print("(\(rows.count) items)")
    }
}

extension Scope: ExpressibleByArgument {}
