import ArgumentParser
import Foundation
import UbiquityFUSE
import UbiquityProtocol
import UbiquityReplica
import UbiquityStore
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
        abstract: "List the current version of an item and its unresolved conflict versions.")
    @Argument(help: "A file inside a mount.") var path: String
    func run() throws {
        let (mountpoint, components) = try MountLocator.locate(path)
        let daemon = try MountLocator.daemon(of: mountpoint)
        let list = try ControlClient.call(socket: daemon.socket, ControlRequest(.versions(path: components)),
                                          expecting: ItemVersions.self)
        print("VERSION  DEVICE            MODIFIED              SIZE        PATH")
        for version in list.versions {
            let label = version.label.padding(toLength: 8, withPad: " ", startingAt: 0)
            let device = version.device.padding(toLength: 17, withPad: " ", startingAt: 0)
            let modified = version.modified.padding(toLength: 21, withPad: " ", startingAt: 0)
            let size = formatBytes(version.size).padding(toLength: 11, withPad: " ", startingAt: 0)
            print("\(label) \(device) \(modified) \(size) \(version.path)")
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
