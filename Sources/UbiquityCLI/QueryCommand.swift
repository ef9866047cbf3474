import ArgumentParser
import Foundation
import UbiquityControl
import UbiquityReplica
import UbiquityStore
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
    @Option(help: "Scope: documents, data or all (repeatable; default all).") var scope: [QueryService.Scope] = []
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
        let scopes = scope.isEmpty ? [QueryService.Scope.all] : scope
        do {
            if let socket = try socketPath() {
                try remote(socket: socket, scopes: scopes)
            } else {
                guard !watch else { throw UbiquityError(EINVAL, "--watch needs a running mount of the container") }
                try local(scopes: scopes)
            }
        } catch {
            fail(error)
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
            var status: [String: Any]?
            try? ControlClient.call(socket: mount.socket, ["command": "describe"]) { status = $0 }
            // A mount that shows this container (of this store, if one was named).
            guard (status?["containers"] as? [String] ?? []).contains(container) else { continue }
            if let address = storeOptions.address, status?["store"] as? String != address.shownLocation { continue }
            return mount.socket
        }
        return nil
    }

    func remote(socket: String, scopes: [QueryService.Scope]) throws {
        var failure: String?
        var request: [String: Any] = ["command": "query", "scopes": scopes.map(\.rawValue), "predicate": predicate,
                                      "watch": watch, "throttle": throttle]
        if let sort { request["sort"] = sort }
        if mountpoint == nil, let container { request["container"] = container }
        var rows: [[String: Any]] = []
        // JSON out: result and update lines are printed exactly as the daemon wrote them.
        let passThrough: ((Data) -> Bool)? = json ? { line in
            guard line.starts(with: Data("{\"event\":\"".utf8)), !line.starts(with: Data("{\"event\":\"heartbeat".utf8)) else {
                return false
            }
            FileHandle.standardOutput.write(line + Data([0x0a]))
            return true
        } : nil
        try ControlClient.call(socket: socket, request, raw: passThrough) { line in
            if let error = line["error"] as? String { failure = error; return }
            guard let event = line["event"] as? String else { return }
            if event == "heartbeat" { return }
            if json {
                printJSON(line)
            } else if event == "result" && !watch {
                if let item = line["item"] as? [String: Any] { rows.append(item) }
            } else if event == "gatheringFinished" {
                print("-- gathering finished: \(line["count"] ?? 0) items --")
            } else if let item = line["item"] as? [String: Any] {
                print("\(event.padding(toLength: 8, withPad: " ", startingAt: 0)) \(row(item))")
            }
            fflush(nil)
        }
        if let failure { throw UbiquityError(EINVAL, failure) }
        if !json && !watch { printTable(rows) }
    }

    func local(scopes: [QueryService.Scope]) throws {
        guard let container else { throw UbiquityError(EINVAL, "give a mountpoint or --container") }
        let locations = Locations()
        let address = storeOptions.address ?? StoreAddress(url: locations.defaultStore.path)
        guard let storeID = address.knownStoreID(locations) else {
            throw UbiquityError(ENOENT, "this device has never mounted a container of \(address.description)")
        }
        let ns = try Replica.readNamespace(directory: locations.replica(storeID: storeID, container: container))
        let query = try Query(predicate: predicate, sort: sort)
        let results = QueryService.run(query, scopes: scopes, records: SyncEngine.collectItems(in: ns))
        if json {
            for (_, item) in results { printJSON(["event": "result", "item": QueryService.json(item)]) }
        } else {
            printTable(results.map { QueryService.json($0.1) })
        }
    }

    func printJSON(_ object: [String: Any]) { print(jsonLine(object)) }

    func jsonLine(_ object: [String: Any]) -> String {
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }

    func row(_ item: [String: Any]) -> String {
        let size = (item["isDirectory"] as? Bool ?? false) ? "-" : formatBytes(UInt64(item["size"] as? Int ?? 0))
        let status = "\(item["downloadingStatus"] ?? "")\((item["isUploaded"] as? Bool ?? true) ? "" : ", not uploaded")"
            + ((item["hasUnresolvedConflicts"] as? Bool ?? false) ? ", conflicts" : "")
        return "\(size.padding(toLength: 10, withPad: " ", startingAt: 0)) \(status.padding(toLength: 28, withPad: " ", startingAt: 0)) \(item["path"] ?? "")"
    }

    func printTable(_ rows: [[String: Any]]) {
        print("SIZE       STATUS                       PATH")
        for item in rows { print(row(item)) }
        print("(\(rows.count) items)")
    }
}
