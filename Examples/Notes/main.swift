// A terminal notes app on UbiquityKit, using the iCloud Documents API the
// way an iOS notes app does: the container's Documents folder holds one
// `.txt` file per note; an NSMetadataQuery lists them live with their sync
// status (URL resource values); a UIDocument subclass opens, edits and saves
// a note through coordinated access, reloads what other devices save, and
// reports conflicts; NSFileVersion shows and resolves them. Written for
// Swift 6 (strict concurrency).
//
//   ubiquitykit-notes [--container ID] list [--watch SECONDS]
//   ubiquitykit-notes [--container ID] show NAME
//   ubiquitykit-notes [--container ID] write NAME TEXT      (creates the note if needed)
//   ubiquitykit-notes [--container ID] edit NAME [--linger SECONDS]
//       lines read from standard input are appended to the note (unsaved until
//       the autosave or the end of input); the document's state and reloads
//       are printed as they happen; at the end the note is closed (saved)
//   ubiquitykit-notes [--container ID] conflicts NAME
//   ubiquitykit-notes [--container ID] resolve NAME (mine | VERSION)
//       mine: keep the note's current text; VERSION (from `conflicts`): make
//       that version the note's text; the other versions go, on every device
//   ubiquitykit-notes [--container ID] history NAME
//       the note's earlier versions (NSFileVersion.otherVersionsOfItem),
//       newest first, with device, date and text
//   ubiquitykit-notes [--container ID] revert NAME N
//       make earlier version N (from `history`) the note's text, on every device
//   ubiquitykit-notes [--container ID] delete NAME
import Foundation
import UbiquityKit

/// A line on standard output, at once (a pipe would hold `print`'s lines back).
func say(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

/// One note: its text, as UTF-8.
final class NoteDocument: UIDocument, @unchecked Sendable {
    var text = ""

    override func contents(forType typeName: String) throws -> Any { Data(text.utf8) }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {
        text = String(decoding: contents as? Data ?? Data(), as: UTF8.self)
    }
}

struct Failure: Error, CustomStringConvertible {
    var description: String
}

/// The notes folder: the Documents folder of the app's (first) container on this device.
func notesFolder(_ container: String?) throws -> URL {
    guard let root = FileManager.default.url(forUbiquityContainerIdentifier: container) else {
        throw Failure(description: "no ubiquity container on this device (is a store set up? see `ubiquityfs mount`)")
    }
    let folder = root.appendingPathComponent("Documents")
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    return folder
}

func noteURL(_ folder: URL, _ name: String) -> URL {
    folder.appendingPathComponent(name.hasSuffix(".txt") ? name : name + ".txt")
}

/// "☁" not downloaded, "↓" downloading, "✓" current; "↑" not uploaded yet; "⚠" conflicts.
func statusMark(_ url: URL) -> String {
    guard let values = try? url.ubiquitousResourceValues(forKeys: [.ubiquitousItemDownloadingStatusKey,
                                                                   .ubiquitousItemIsUploadedKey,
                                                                   .ubiquitousItemHasUnresolvedConflictsKey]) else { return "?" }
    var mark = values.ubiquitousItemIsDownloading == true ? "↓"
        : values.ubiquitousItemDownloadingStatus == .current ? "✓" : "☁"
    if values.ubiquitousItemIsUploaded == false { mark += "↑" }
    if values.ubiquitousItemHasUnresolvedConflicts == true { mark += "⚠" }
    return mark
}

/// The notes, live: each update prints the whole list.
func list(_ folder: URL, watch seconds: Double?) async {
    let query = NSMetadataQuery()
    query.searchScopes = [NSMetadataQueryUbiquitousDocumentsScope]
    query.predicate = NSPredicate(format: "%K LIKE '*.txt'", NSMetadataItemFSNameKey)
    query.sortDescriptors = [NSSortDescriptor(key: NSMetadataItemFSNameKey, ascending: true)]
    let deadline = Date().addingTimeInterval(seconds ?? 0)
    for await items in query.resultUpdates {
        say("notes: \(items.count)")
        for item in items {
            guard let url = item.value(forAttribute: NSMetadataItemURLKey) as? URL else { continue }
            let size = (item.value(forAttribute: NSMetadataItemFSSizeKey) as? NSNumber)?.intValue ?? 0
            say("  \(statusMark(url)) \(url.deletingPathExtension().lastPathComponent) (\(size) bytes)")
        }
        say("--")
        if seconds == nil || Date() >= deadline { break }
    }
    query.stop()
}

/// Open a note (or create it), on the main queue's terms: returns once open.
@MainActor
func open(_ url: URL, creating: Bool) async throws -> NoteDocument {
    let document = NoteDocument(fileURL: url)
    let exists = FileManager.default.fileExists(atPath: url.path)
    if !exists && !creating { throw Failure(description: "no note \(url.deletingPathExtension().lastPathComponent)") }
    let ok = await withCheckedContinuation { (done: CheckedContinuation<Bool, Never>) in
        if exists {
            document.open { done.resume(returning: $0) }
        } else {
            document.save(to: url, for: .forCreating) { done.resume(returning: $0) }
        }
    }
    guard ok else { throw Failure(description: "cannot open \(url.lastPathComponent)") }
    return document
}

@MainActor
func close(_ document: NoteDocument) async -> Bool {
    await withCheckedContinuation { (done: CheckedContinuation<Bool, Never>) in
        document.close { done.resume(returning: $0) }
    }
}

func describe(_ state: UIDocument.State) -> String {
    if state == .normal { return "normal" }
    var names: [String] = []
    if state.contains(.closed) { names.append("closed") }
    if state.contains(.inConflict) { names.append("inConflict") }
    if state.contains(.savingError) { names.append("savingError") }
    if state.contains(.editingDisabled) { names.append("editingDisabled") }
    if state.contains(.progressAvailable) { names.append("progressAvailable") }
    return names.joined(separator: ",")
}

/// Append standard input's lines to the note, printing what happens to it meanwhile.
@MainActor
func edit(_ url: URL, linger: Double) async throws {
    let document = try await open(url, creating: true)
    say("opened: \(document.text)")
    say("state: \(describe(document.documentState))")
    let observer = NotificationCenter.default.addObserver(forName: UIDocument.stateChangedNotification, object: document,
                                                          queue: .main) { _ in
        MainActor.assumeIsolated {
            say("state: \(describe(document.documentState)) text: \(document.text)")
        }
    }
    defer { NotificationCenter.default.removeObserver(observer) }
    let lines = AsyncStream<String> { continuation in
        Thread.detachNewThread {
            while let line = readLine() { continuation.yield(line) }
            continuation.finish()
        }
    }
    for await line in lines {
        document.text += (document.text.isEmpty || document.text.hasSuffix("\n") ? "" : "\n") + line
        document.updateChangeCount(.done)
        say("edited")
    }
    try await Task.sleep(nanoseconds: UInt64(linger * 1e9))
    let saved = await close(document)
    say(saved ? "closed" : "close failed")
}

/// The note's other versions (unresolved conflicts), numbered for `resolve`.
func conflicts(_ url: URL) {
    let current = NSFileVersion.currentVersionOfItem(at: url)
    say("current: \(current?.localizedNameOfSavingComputer ?? "?") \((try? String(contentsOf: url, encoding: .utf8)) ?? "")")
    let versions = NSFileVersion.unresolvedConflictVersionsOfItem(at: url) ?? []
    say("conflicts: \(versions.count)")
    for (index, version) in versions.enumerated() {
        let text = (try? String(contentsOf: version.url, encoding: .utf8)) ?? "?"
        let date = version.modificationDate.map { ISO8601DateFormatter().string(from: $0) } ?? "?"
        say("  \(index + 1): from \(version.localizedNameOfSavingComputer ?? "?") at \(date): \(text)")
    }
}

func resolve(_ url: URL, keep: String) throws {
    let versions = NSFileVersion.unresolvedConflictVersionsOfItem(at: url) ?? []
    guard !versions.isEmpty else { return say("no conflicts") }
    if keep != "mine" {
        guard let number = Int(keep), versions.indices.contains(number - 1) else {
            throw Failure(description: "resolve takes mine or a version number from `conflicts` (1–\(versions.count))")
        }
        _ = try versions[number - 1].replaceItem(at: url)
    }
    // Apple's way: mark the conflicts resolved, then remove the other versions.
    for version in versions { version.isResolved = true }
    try NSFileVersion.removeOtherVersionsOfItem(at: url)
    say("resolved")
}

/// The note's earlier versions, newest first, numbered for `revert`.
func earlierVersions(_ url: URL) -> [NSFileVersion] {
    (NSFileVersion.otherVersionsOfItem(at: url) ?? []).filter { !$0.isConflict }
}

func history(_ url: URL) {
    let versions = earlierVersions(url)
    say("earlier versions: \(versions.count)")
    for (index, version) in versions.enumerated() {
        let text = (try? String(contentsOf: version.url, encoding: .utf8)) ?? "?"
        let date = version.modificationDate.map { ISO8601DateFormatter().string(from: $0) } ?? "?"
        say("  \(index + 1): from \(version.localizedNameOfSavingComputer ?? "?") at \(date): \(text)")
    }
}

func revert(_ url: URL, to number: String) throws {
    let versions = earlierVersions(url)
    guard let number = Int(number), versions.indices.contains(number - 1) else {
        throw Failure(description: "revert takes a version number from `history` (1–\(versions.count))")
    }
    _ = try versions[number - 1].replaceItem(at: url)
    say("reverted")
}

/// A coordinated deletion: presenters of the note (its open documents) are told first.
func delete(_ url: URL) throws {
    var coordinationError: NSError?
    var failure: (any Error)?
    NSFileCoordinator(filePresenter: nil).coordinate(writingItemAt: url, options: .forDeleting, error: &coordinationError) { url in
        do { try FileManager.default.removeItem(at: url) } catch { failure = error }
    }
    if let error = failure ?? coordinationError { throw error }
    say("deleted")
}

/// The command line: the container, the options, the command and its operands.
struct CommandLineArguments {
    var container: String?
    var watch: Double?
    var linger: Double = 0
    var words: [String] = []

    init(_ arguments: [String]) {
        var rest = arguments[...]
        while let first = rest.first {
            rest = rest.dropFirst()
            switch first {
            case "--container": container = rest.popFirst()
            case "--watch": watch = rest.popFirst().flatMap(Double.init)
            case "--linger": linger = rest.popFirst().flatMap(Double.init) ?? 0
            default: words.append(first)
            }
        }
    }
}

let command = CommandLineArguments(Array(CommandLine.arguments.dropFirst()))
// What an app's Info.plist (NSUbiquitousContainers) declares; else UBIQUITY_CONTAINERS or the Info.plist beside the program.
if let container = command.container { UbiquityContainers.declare([container]) }

Task { @MainActor in
    do {
        let folder = try notesFolder(nil)
        let words = command.words
        switch (words.first, words.count) {
        case ("list", 1):
            await list(folder, watch: command.watch)
        case ("show", 2):
            let document = try await open(noteURL(folder, words[1]), creating: false)
            say("state: \(describe(document.documentState))")
            say(document.text)
            _ = await close(document)
        case ("write", 3):
            let document = try await open(noteURL(folder, words[1]), creating: true)
            document.text = words[2]
            document.updateChangeCount(.done)
            say(await close(document) ? "saved" : "save failed")
        case ("edit", 2):
            try await edit(noteURL(folder, words[1]), linger: command.linger)
        case ("conflicts", 2):
            conflicts(noteURL(folder, words[1]))
        case ("resolve", 3):
            try resolve(noteURL(folder, words[1]), keep: words[2])
        case ("history", 2):
            history(noteURL(folder, words[1]))
        case ("revert", 3):
            try revert(noteURL(folder, words[1]), to: words[2])
        case ("delete", 2):
            try delete(noteURL(folder, words[1]))
        default:
            say("usage: ubiquitykit-notes [--container ID] list [--watch S] | show NAME | write NAME TEXT | edit NAME [--linger S] | conflicts NAME | resolve NAME (mine|VERSION) | history NAME | revert NAME N | delete NAME")
            exit(64)
        }
        exit(0)
    } catch {
        say("error: \(error)")
        exit(1)
    }
}
dispatchMain()
