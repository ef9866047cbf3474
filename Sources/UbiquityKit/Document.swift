import UbiquityLocks
import UbiquityProtocol

/// `UIDocument`: a document in a ubiquity container, read and written
/// through coordinated access, that follows what happens to its file. A
/// subclass gives `contents(forType:)` and `load(fromContents:ofType:)`.
///
/// - `open` reads the file (a placeholder is downloaded first; `.progressAvailable`
///   meanwhile), `save(to:for:)` writes it (`.forCreating` refuses an existing
///   file), `close` saves unsaved changes and stops following the file.
/// - `updateChangeCount` marks unsaved changes; they are saved 5 s later
///   (`autosave`), or at `close`.
/// - The document presents its file (`NSFilePresenter`): when another
///   process or device changes it, an unmodified document reloads; a modified
///   one becomes `.inConflict` and its next save keeps both versions: the
///   file keeps the other one, this document's is written beside it as
///   `NAME (conflicted copy HOST DATE).EXT` and recorded as an unresolved
///   conflict version of the file on every device. The file's unresolved conflict
///   versions (`NSFileVersion`) also make it `.inConflict`; resolving them
///   clears it. Each change of `documentState` posts
///   `UIDocument.stateChangedNotification`.
/// - Completion handlers run on the main queue, as UIKit's do.
open class UIDocument: NSObject, NSFilePresenter, @unchecked Sendable {
    public struct State: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let normal: State = []
        public static let closed = State(rawValue: 1 << 0)
        public static let inConflict = State(rawValue: 1 << 1)
        public static let savingError = State(rawValue: 1 << 2)
        public static let editingDisabled = State(rawValue: 1 << 3)
        public static let progressAvailable = State(rawValue: 1 << 4)
    }

    public enum SaveOperation: Int, Sendable {
        case forCreating, forOverwriting
    }

    public enum ChangeKind: Int, Sendable {
        case done, undone, redone, cleared
    }

    public static let stateChangedNotification = Notification.Name("UIDocumentStateChangedNotification")

    public let fileURL: URL
    open var localizedName: String { fileURL.deletingPathExtension().lastPathComponent }
    open var fileType: String? { fileURL.pathExtension.isEmpty ? nil : fileURL.pathExtension }
    open var fileModificationDate: Date?
    open var progress: Progress?
    /// Seconds between a change and its autosave.
    open var autosaveDelay: TimeInterval = 5

    struct Status {
        var state: State = .closed
        var changes = 0
        /// The file changed elsewhere while this document had unsaved changes.
        var changedElsewhere = false
        var autosaveScheduled = false
        var saving = false
    }
    let status = Lock(Status())
    /// The document's own accesses do not ask the document to let go.
    var coordinator: NSFileCoordinator { NSFileCoordinator(filePresenter: self) }
    let queue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        return queue
    }()

    public init(fileURL url: URL) {
        fileURL = url.standardizedFileURL
        super.init()
    }

    open var documentState: State { status.withLock { $0.state } }
    open var hasUnsavedChanges: Bool { status.withLock { $0.changes != 0 } }

    // MARK: What a subclass gives

    /// The document's contents to write (`Data`; Foundation on Linux has no `FileWrapper`).
    open func contents(forType typeName: String) throws -> Any { Data() }

    /// Take the file's contents (`Data`) into the document's model.
    open func load(fromContents contents: Any, ofType typeName: String?) throws {}

    /// An error while opening, saving or reverting; the default logs it.
    open func handleError(_ error: any Error, userInteractionPermitted: Bool) {
        FileHandle.standardError.write(Data("UIDocument \(fileURL.lastPathComponent): \(error)\n".utf8))
    }

    // MARK: Opening, saving, closing

    open func open(completionHandler: ((Bool) -> Void)? = nil) {
        let box = UncheckedBox(completionHandler)
        queue.addOperation { [self] in
            if NSFileVersion.unresolvedConflictVersionsOfItem(at: fileURL)?.isEmpty == false { setState(insert: .inConflict) }
            let ok = read()
            if ok {
                setState(remove: .closed)
                NSFileCoordinator.addFilePresenter(self)
            }
            DispatchQueue.main.async { box.value?(ok) }
        }
    }

    /// Read the file under coordination into the model (a placeholder is
    /// downloaded first: `progress` and `.progressAvailable` meanwhile).
    /// False (and the error handled) if it failed.
    func read() -> Bool {
        var coordinationError: NSError?
        var failure: (any Error)?
        let coordinator = self.coordinator
        coordinator.downloadProgress = { [self] done in
            let progress = self.progress ?? Progress(totalUnitCount: Int64(done.totalBytes))
            progress.totalUnitCount = Int64(done.totalBytes)
            progress.completedUnitCount = Int64(done.bytes)
            self.progress = progress
            setState(insert: .progressAvailable)
        }
        defer {
            if documentState.contains(.progressAvailable) { setState(remove: .progressAvailable) }
        }
        coordinator.coordinate(readingItemAt: fileURL, options: [], error: &coordinationError) { url in
            do {
                let data = try Data(contentsOf: url)
                fileModificationDate = (try? FileManager.default.attributesOfItem(atPath: url.path))?[.modificationDate] as? Date
                try load(fromContents: data, ofType: fileType)
            } catch {
                failure = error
            }
        }
        if let error = failure ?? coordinationError {
            handleError(error, userInteractionPermitted: false)
            return false
        }
        return true
    }

    open func save(to url: URL, for saveOperation: SaveOperation, completionHandler: ((Bool) -> Void)? = nil) {
        let box = UncheckedBox(completionHandler)
        queue.addOperation { [self] in
            let ok = write(to: url, creating: saveOperation == .forCreating)
            if ok && saveOperation == .forCreating && url.standardizedFileURL == fileURL {
                setState(remove: .closed)
                NSFileCoordinator.addFilePresenter(self)
            }
            DispatchQueue.main.async { box.value?(ok) }
        }
    }

    func write(to url: URL, creating: Bool) -> Bool {
        let (changesAtStart, elsewhere) = status.withLock { s -> (Int, Bool) in
            s.saving = true
            return (s.changes, s.changedElsewhere && url.standardizedFileURL == fileURL)
        }
        // The file holds another device's or process's version: ours is kept
        // beside it as an unresolved conflict version, on every device.
        if elsewhere {
            defer { status.withLock { $0.saving = false } }
            return keepAsConflictVersion(changesAtStart)
        }
        defer { status.withLock { $0.saving = false } }
        var coordinationError: NSError?
        var failure: (any Error)?
        coordinator.coordinate(writingItemAt: url, options: creating ? [] : [.forReplacing], error: &coordinationError) { url in
            do {
                if creating && FileManager.default.fileExists(atPath: url.path) {
                    throw CocoaError(.fileWriteFileExists, userInfo: [NSFilePathErrorKey: url.path])
                }
                let contents = try contents(forType: fileType ?? "public.data")
                let data: Data
                switch contents {
                case let d as Data: data = d
                case let d as NSData: data = Data(referencing: d)
                default: throw CocoaError(.fileWriteUnknown, userInfo: [NSLocalizedDescriptionKey: "contents(forType:) gave no Data (Foundation on Linux has no FileWrapper)"])
                }
                try data.write(to: url, options: .atomic)
                fileModificationDate = Date()
            } catch {
                failure = error
            }
        }
        if let error = failure ?? coordinationError {
            setState(insert: .savingError)
            handleError(error, userInteractionPermitted: false)
            return false
        }
        status.withLock { $0.changes -= changesAtStart }
        setState(remove: .savingError)
        return true
    }

    open func close(completionHandler: ((Bool) -> Void)? = nil) {
        let box = UncheckedBox(completionHandler)
        queue.addOperation { [self] in
            var ok = true
            if hasUnsavedChanges { ok = write(to: fileURL, creating: false) }
            NSFileCoordinator.removeFilePresenter(self)
            setState(insert: .closed)
            DispatchQueue.main.async { box.value?(ok) }
        }
    }

    /// Read the file again (discarding unsaved changes).
    open func revert(toContentsOf url: URL, completionHandler: ((Bool) -> Void)? = nil) {
        let box = UncheckedBox(completionHandler)
        queue.addOperation { [self] in
            status.withLock { $0.changes = 0 }
            let ok = read()
            refreshConflictState()
            DispatchQueue.main.async { box.value?(ok) }
        }
    }

    // MARK: Changes and autosave

    open func updateChangeCount(_ change: ChangeKind) {
        let schedule = status.withLock { s -> Bool in
            switch change {
            case .done, .redone: s.changes += 1
            case .undone: s.changes -= 1
            case .cleared: s.changes = 0
            }
            guard s.changes != 0, !s.autosaveScheduled else { return false }
            s.autosaveScheduled = true
            return true
        }
        if schedule {
            DispatchQueue.global().asyncAfter(deadline: .now() + autosaveDelay) { [self] in
                status.withLock { $0.autosaveScheduled = false }
                autosave(completionHandler: nil)
            }
        }
    }

    open func autosave(completionHandler: ((Bool) -> Void)? = nil) {
        guard hasUnsavedChanges, !documentState.contains(.closed) else {
            let box = UncheckedBox(completionHandler)
            DispatchQueue.main.async { box.value?(true) }
            return
        }
        save(to: fileURL, for: .forOverwriting, completionHandler: completionHandler)
    }

    /// Write the document beside its file, as `NAME (conflicted copy HOST
    /// DATE).EXT`, and record it as a conflict version of the file.
    func keepAsConflictVersion(_ changesAtStart: Int) -> Bool {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "yyyy-MM-dd HHmmss"
        let stem = fileURL.deletingPathExtension().lastPathComponent
        let ext = fileURL.pathExtension.isEmpty ? "" : "." + fileURL.pathExtension
        let copy = fileURL.deletingLastPathComponent()
            .appendingPathComponent("\(stem) (conflicted copy \(ProcessInfo.processInfo.hostName) \(formatter.string(from: Date())))\(ext)")
        status.withLock { $0.saving = false }
        guard write(to: copy, creating: true) else { return false }
        status.withLock { $0.saving = true }
        do {
            let (record, names) = try Daemons.locate(fileURL)
            let (_, copyNames) = try Daemons.locate(copy)
            _ = try Daemons.call(record, .recordConflict(path: names, copy: copyNames), expecting: NoResult.self)
        } catch {
            handleError(error, userInteractionPermitted: false)
        }
        status.withLock { s in
            s.changes = max(0, s.changes - changesAtStart)
            s.changedElsewhere = false
        }
        refreshConflictState()
        return true
    }

    // MARK: State

    func setState(insert: State = [], remove: State = []) {
        let changed = status.withLock { s -> Bool in
            let before = s.state
            s.state.subtract(remove)
            s.state.formUnion(insert)
            return s.state != before
        }
        // Posted from an operation of the main queue (see NSMetadataQuery.post).
        if changed {
            OperationQueue.main.addOperation { [self] in
                NotificationCenter.default.post(name: Self.stateChangedNotification, object: self)
            }
        }
    }

    func refreshConflictState() {
        let conflicts = NSFileVersion.unresolvedConflictVersionsOfItem(at: fileURL) ?? []
        if conflicts.isEmpty { setState(remove: .inConflict) } else { setState(insert: .inConflict) }
    }

    // MARK: NSFilePresenter

    open var presentedItemURL: URL? { fileURL }
    open var presentedItemOperationQueue: OperationQueue { queue }

    /// The file changed (another process or device): reload if nothing here
    /// is unsaved, else the document is in conflict.
    open func presentedItemDidChange() {
        let saving = status.withLock { $0.saving }
        guard !saving, !documentState.contains(.closed) else { return }
        if hasUnsavedChanges {
            status.withLock { $0.changedElsewhere = true }
            setState(insert: .inConflict)
        } else {
            _ = read()
            refreshConflictState()
        }
    }

    open func accommodatePresentedItemDeletion(completionHandler: @escaping ((any Error)?) -> Void) {
        setState(insert: .closed)
        completionHandler(nil)
    }

    open func savePresentedItemChanges(completionHandler: @escaping ((any Error)?) -> Void) {
        guard hasUnsavedChanges else { return completionHandler(nil) }
        _ = write(to: fileURL, creating: false)
        completionHandler(nil)
    }
}
