import ArgumentParser
import Foundation
import UbiquityFUSE
import UbiquityLocator
import UbiquityProtocol
import UbiquityReplica
import UbiquityModel
#if canImport(Glibc)
import Glibc
#endif

/// A one-line progress bar on a terminal, plain lines otherwise.
struct ProgressLine {
    let tty = isatty(STDERR_FILENO) != 0
    var last = ""

    mutating func show(done: UInt64, total: UInt64, items: Int, totalItems: Int) {
        let fraction = total > 0 ? Double(done) / Double(total) : 1
        let width = 30
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
        let text = "[\(bar)] \(Int(fraction * 100))%  \(items)/\(totalItems) files  \(formatBytes(done))/\(formatBytes(total))"
        guard text != last else { return }
        last = text
        FileHandle.standardError.write(Data(((tty ? "\r\u{1b}[K" : "") + text + (tty ? "" : "\n")).utf8))
    }

    func finish() { if tty && !last.isEmpty { FileHandle.standardError.write(Data("\n".utf8)) } }
}

struct Download: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Download items so they are available on this device.")
    @Argument(help: "Files or folders inside a mount.") var paths: [String]
    @Flag(name: .shortAndLong, help: "Download everything inside folders.") var recursive = false

    func run() throws {
        var bar = ProgressLine()
        defer { bar.finish() }
        try MountLocator.run(paths: paths, onUpdate: { update in
            guard case .downloading(let p) = update else { return }
            bar.show(done: p.bytes, total: p.totalBytes, items: p.items, totalItems: p.totalItems)
        }) { .download(paths: $0, recursive: recursive) }
    }
}

struct Evict: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Remove the local copy of items; they stay listed and download again when opened.",
        discussion: """
            Refused for items open for writing or with changes not yet pushed, and for items the store does not \
            hold (missing or cut-short blobs): those are uploaded again from this device's copy, and a second \
            evict then goes through. Folders: everything inside.
            """)
    @Argument(help: "Files or folders inside a mount.") var paths: [String]
    func run() throws {
        try MountLocator.run(paths: paths) { .evict(paths: $0) }
    }
}

struct Pin: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Keep items on this device (a pinned folder keeps what arrives in it later).")
    @Argument(help: "Files or folders inside a mount.") var paths: [String]
    func run() throws {
        try MountLocator.run(paths: paths) { .pin(paths: $0) }
    }
}

struct Unpin: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Stop keeping items on this device.")
    @Argument(help: "Files or folders inside a mount.") var paths: [String]
    func run() throws {
        try MountLocator.run(paths: paths) { .unpin(paths: $0) }
    }
}

struct Versions: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the current version of a file and its unresolved conflict versions; with --all, its history.",
        discussion: "--all also lists every content the file was pushed with that the retention period keeps (30 days unless the container sets another; each one that was current at some moment within it), oldest first, whatever names the file had: `ubiquityfs restore PATH --version ID` brings one back.")
    @Argument(help: "A file inside a mount.") var path: String
    @Flag(help: "Also list the file's history.") var all = false
    @Flag(help: "Print JSON.") var json = false
    func run() throws {
        let (mountpoint, components) = try MountLocator.locate(path)
        let daemon = try MountLocator.daemon(of: mountpoint)
        let list = try ControlClient.call(socket: daemon.socket, ControlRequest(.versions(path: components, all: all)),
                                          expecting: ItemVersions.self)
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            print(String(decoding: try encoder.encode(list), as: UTF8.self))
            return
        }
        print("VERSION  DEVICE            MODIFIED              SIZE        PATH")
        for version in list.versions {
            let label = version.label.padding(toLength: 8, withPad: " ", startingAt: 0)
            let device = version.device.padding(toLength: 17, withPad: " ", startingAt: 0)
            let modified = version.modified.padding(toLength: 21, withPad: " ", startingAt: 0)
            let size = formatBytes(version.size).padding(toLength: 11, withPad: " ", startingAt: 0)
            print("\(label) \(device) \(modified) \(size) \(version.path)")
        }
        guard let history = list.history else { return }
        print("\nHISTORY (oldest first)")
        print("ID        DEVICE            COMMITTED             MODIFIED              SIZE")
        for entry in history {
            let id = String(entry.id).padding(toLength: 9, withPad: " ", startingAt: 0)
            let device = entry.device.padding(toLength: 17, withPad: " ", startingAt: 0)
            let committed = entry.committed.padding(toLength: 21, withPad: " ", startingAt: 0)
            let modified = entry.modified.padding(toLength: 21, withPad: " ", startingAt: 0)
            print("\(id) \(device) \(committed) \(modified) \(formatBytes(entry.size))\(entry.current ? "  (current)" : "")")
        }
    }
}

struct Restore: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Restore an earlier version of a file, or an item from Recently Deleted.",
        discussion: """
            ubiquityfs restore PATH --version ID: the version (an ID from `versions --all`) becomes the file's current             content, pushed like an edit; the replaced one stays in the history. With --to OTHER it is restored as a new             file there instead.
            ubiquityfs restore --deleted ITEM: ITEM is a path `ubiquityfs trash` lists (or an item's ID with --mount);             the item comes back at its old place on every device, a folder with everything deleted with it, under             `NAME (restored)` if the name was taken meanwhile.
            """)
    @Argument(help: "A file inside a mount (with --version).") var path: String?
    @Option(help: "The version to restore (an ID from `ubiquityfs versions --all`).") var version: UInt64?
    @Option(help: "Restore the version as a new file at this path instead.") var to: String?
    @Option(help: "A deleted item: its path as `ubiquityfs trash` lists it, or its ID (with --mount).") var deleted: String?
    @Option(help: "The mount to restore a deleted item's ID in.") var mount: String?

    func validate() throws {
        if deleted != nil {
            guard path == nil, version == nil, to == nil else {
                throw ValidationError("--deleted takes no PATH, --version or --to")
            }
        } else {
            guard path != nil, version != nil else { throw ValidationError("give PATH --version ID, or --deleted ITEM") }
            guard mount == nil else { throw ValidationError("--mount goes with --deleted") }
        }
    }

    func run() throws {
        let restored: RestoredItem
        if let deleted {
            let mountpoint: String, item: String
            if let mount {
                mountpoint = resolvedPath(mount)
                item = deleted.contains("/") ? absolutePath(deleted) : deleted
            } else if !deleted.contains("/") {
                // An ID: in the one mount there is, or say which.
                let mounts = MountLocator.mounts()
                guard mounts.count == 1 else { throw ValidationError("\(deleted) is an ID: say which mount with --mount") }
                (mountpoint, item) = (mounts[0], deleted)
            } else {
                let absolute = absolutePath(deleted)
                mountpoint = try MountLocator.locate(absolute).mountpoint
                item = absolute
            }
            let daemon = try MountLocator.daemon(of: mountpoint)
            restored = try ControlClient.call(socket: daemon.socket, ControlRequest(.restoreDeleted(item: item)),
                                              expecting: RestoredItem.self)
        } else if let path, let version {
            let (mountpoint, components) = try MountLocator.locate(path)
            var destination: [String]?
            if let to {
                let (toMount, toComponents) = try MountLocator.locate(to)
                guard toMount == mountpoint else { throw UbiquityError(EXDEV, "--to must be in the same mount as \(path)") }
                destination = toComponents
            }
            let daemon = try MountLocator.daemon(of: mountpoint)
            do {
                restored = try ControlClient.call(socket: daemon.socket,
                                                  ControlRequest(.restore(path: components, version: version, to: destination)),
                                                  expecting: RestoredItem.self)
            } catch let error as ControlError {
                throw ControlError(error.code, "\(path): \(error)", errno: error.errno)
            }
        } else {
            return
        }
        print("restored \(restored.path)")
    }
}

struct Trash: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List Recently Deleted: what was deleted on any device within the retention period.",
        discussion: "Each item with the path it had, when and on which device it was deleted; a folder counts the items deleted with it. `ubiquityfs restore --deleted PATH` brings one back; --empty removes them all for good, on every device. Also shown read-only in the mount: see docs/SEMANTICS.md.")
    @Argument(help: "The mountpoint (default: every ubiquityfs mount of this device).") var mountpoint: String?
    @Flag(help: "Remove everything in Recently Deleted for good.") var empty = false
    @Flag(help: "Print JSON (one object per mount).") var json = false

    func run() throws {
        let mountpoints = mountpoint.map { [resolvedPath($0)] } ?? MountLocator.mounts()
        if mountpoints.isEmpty { throw UbiquityError(ENOENT, "no ubiquityfs mount") }
        for path in mountpoints {
            let daemon: MountRecord
            do {
                daemon = try MountLocator.daemon(of: path)
            } catch {
                if mountpoint != nil { throw error }
                continue
            }
            if empty {
                let count = try ControlClient.call(socket: daemon.socket, ControlRequest(.emptyTrash), expecting: ItemCount.self)
                print("\(path): removed \(count.items) item\(count.items == 1 ? "" : "s") for good")
                continue
            }
            let listing = try ControlClient.call(socket: daemon.socket, ControlRequest(.trash), expecting: TrashListing.self)
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
                print(String(decoding: try encoder.encode(listing), as: UTF8.self))
                continue
            }
            if listing.items.isEmpty {
                print("\(path): Recently Deleted is empty (items are kept \(listing.retentionDays) days)")
                continue
            }
            print("DELETED               DEVICE            SIZE        PATH")
            for item in listing.items {
                let deleted = item.deleted.padding(toLength: 21, withPad: " ", startingAt: 0)
                let device = item.device.padding(toLength: 17, withPad: " ", startingAt: 0)
                let size = formatBytes(item.size).padding(toLength: 11, withPad: " ", startingAt: 0)
                let inside = item.kind == "directory" ? "/ (\(item.items) item\(item.items == 1 ? "" : "s"))" : ""
                print("\(deleted) \(device) \(size) \(item.path)\(inside)")
            }
        }
    }
}

struct Resolve: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Resolve the conflicts of an item.",
        discussion: "--keep current deletes the conflicted copies; --keep N keeps conflict version N under the item's name; --keep both keeps every version as its own file.")
    @Argument(help: "A file inside a mount.") var path: String
    @Option(help: "current, both, or a version number from `ubiquityfs versions`.") var keep: ConflictKeep
    func run() throws {
        do {
            try MountLocator.run(paths: [path]) { .resolve(paths: $0, keep: keep) }
        } catch let error as ControlError {
            throw ControlError(error.code, "\(path): \(error)", errno: error.errno)
        } catch {
            let failure = UbiquityError.wrap(error)
            throw UbiquityError(failure.errno, "\(path): \(failure)")
        }
    }
}

extension ConflictKeep: ExpressibleByArgument {
    public init?(argument: String) { self.init(argument) }
}
