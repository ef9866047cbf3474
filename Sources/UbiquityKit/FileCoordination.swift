import Synchronization
import UbiquityLocator
import UbiquityProtocol
#if canImport(Glibc)
import Glibc
#endif

/// Where an Apple API writes its error (`&error` of a `var error: NSError?`);
/// Foundation on Linux has no such type.
public typealias NSErrorPointer = UnsafeMutablePointer<NSError?>?

/// Coordinated reads and writes, as `NSFileCoordinator` gives them, across
/// processes: the device's daemon is the coordinator (its `coordinate`
/// command). Readers of an item share it, a writer has it alone, first come
/// first served; an access to a folder excludes conflicting accesses inside
/// it; a reader of a placeholder gets the content downloaded first. The
/// access lasts while the accessor runs: the daemon holds it for as long as
/// the connection that asked is open, so a process that dies lets go.
///
/// Items outside a mount of this device (nothing to coordinate with) are
/// accessed at once, as on Apple platforms for local files. Programs that
/// do not coordinate (vim, cp) are not held back, as on Apple platforms.
open class NSFileCoordinator: NSObject, @unchecked Sendable {
    public struct ReadingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let withoutChanges = ReadingOptions(rawValue: 1 << 0)
        public static let resolvesSymbolicLink = ReadingOptions(rawValue: 1 << 1)
        public static let immediatelyAvailableMetadataOnly = ReadingOptions(rawValue: 1 << 2)
        public static let forUploading = ReadingOptions(rawValue: 1 << 3)
    }

    public struct WritingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let forDeleting = WritingOptions(rawValue: 1 << 0)
        public static let forMoving = WritingOptions(rawValue: 1 << 1)
        public static let forMerging = WritingOptions(rawValue: 1 << 2)
        public static let forReplacing = WritingOptions(rawValue: 1 << 3)
        public static let contentIndependentMetadataOnly = WritingOptions(rawValue: 1 << 4)
    }

    let presenter: (any NSFilePresenter)?
    let cancelled = Mutex(false)

    public init(filePresenter: (any NSFilePresenter)? = nil) {
        presenter = filePresenter
        super.init()
    }

    /// Give up waiting: accesses not granted yet fail with `NSUserCancelledError`.
    open func cancel() { cancelled.withLock { $0 = true } }

    open func coordinate(readingItemAt url: URL, options: ReadingOptions = [], error outError: NSErrorPointer,
                         byAccessor reader: (URL) -> Void) {
        access(reads: [url], readOptions: options, writes: [], error: outError) { reader(url) }
    }

    open func coordinate(writingItemAt url: URL, options: WritingOptions = [], error outError: NSErrorPointer,
                         byAccessor writer: (URL) -> Void) {
        access(reads: [], readOptions: [], writes: [url], error: outError) { writer(url) }
    }

    open func coordinate(readingItemAt readingURL: URL, options readingOptions: ReadingOptions = [],
                         writingItemAt writingURL: URL, options writingOptions: WritingOptions = [],
                         error outError: NSErrorPointer, byAccessor readerWriter: (URL, URL) -> Void) {
        access(reads: [readingURL], readOptions: readingOptions, writes: [writingURL], error: outError) {
            readerWriter(readingURL, writingURL)
        }
    }

    open func coordinate(writingItemAt url1: URL, options options1: WritingOptions = [],
                         writingItemAt url2: URL, options options2: WritingOptions = [],
                         error outError: NSErrorPointer, byAccessor writer: (URL, URL) -> Void) {
        access(reads: [], readOptions: [], writes: [url1, url2], error: outError) { writer(url1, url2) }
    }

    /// Several items at once, then `batchAccessor` (which may coordinate each as it goes).
    open func prepare(forReadingItemsAt readingURLs: [URL], options readingOptions: ReadingOptions = [],
                      writingItemsAt writingURLs: [URL], options writingOptions: WritingOptions = [],
                      error outError: NSErrorPointer, byAccessor batchAccessor: (@escaping () -> Void) -> Void) {
        access(reads: readingURLs, readOptions: readingOptions, writes: writingURLs, error: outError) {
            batchAccessor({})
        }
    }

    /// What a coordinated write tells the presenters of the item in this
    /// process (other processes' presenters learn it from the item's events).
    open func item(at oldURL: URL, didMoveTo newURL: URL) {
        for presenter in FilePresenters.presenting(oldURL) where presenter !== self.presenter {
            FilePresenters.deliver(presenter) { $0.presentedItemDidMove(to: newURL) }
        }
    }

    /// Hold the items, run `body`, let go. Errors go to `outError` (Apple's way).
    func access(reads: [URL], readOptions: ReadingOptions, writes: [URL], error outError: NSErrorPointer, _ body: () -> Void) {
        var byMount: [String: (MountRecord, [[String]], [[String]])] = [:]
        for (url, writing) in reads.map({ ($0, false) }) + writes.map({ ($0, true) }) {
            guard let (record, names) = try? Daemons.locate(url.deletingLastPathComponent()) else { continue }
            let item = names + [url.lastPathComponent]
            var entry = byMount[record.mountpoint] ?? (record, [], [])
            if writing { entry.2.append(item) } else { entry.1.append(item) }
            byMount[record.mountpoint] = entry
        }
        // One connection per mount, in a fixed order (two coordinators never wait for each other crosswise).
        var held: [Int32] = []
        defer {
            for fd in held {
                shutdown(fd, Int32(SHUT_RDWR))   // the daemon lets go; the reading thread ends
                close(fd)
            }
        }
        for (_, (record, readNames, writeNames)) in byMount.sorted(by: { $0.key < $1.key }) {
            if cancelled.withLock({ $0 }) { return fail(outError, CocoaError(.userCancelled)) }
            let reads = readOptions.contains(.immediatelyAvailableMetadataOnly) ? [] : readNames
            let metadataReads = readOptions.contains(.immediatelyAvailableMetadataOnly) ? readNames : []
            do {
                let fd = try Self.grant(record, reads: reads + metadataReads, writes: writeNames)
                held.append(fd)
            } catch {
                return fail(outError, error)
            }
        }
        // Before a write, the presenters of this process save what they hold (other processes' are not asked yet).
        for url in writes {
            for presenter in FilePresenters.presenting(url) where presenter !== self.presenter {
                FilePresenters.deliver(presenter, wait: true) { $0.savePresentedItemChanges { _ in } }
            }
        }
        body()
    }

    func fail(_ outError: NSErrorPointer, _ error: any Error) {
        outError?.pointee = error as NSError
    }

    /// Ask the daemon for the items; return the connection once granted
    /// (closing it lets go).
    static func grant(_ record: MountRecord, reads: [[String]], writes: [[String]]) throws -> Int32 {
        let result = Mutex<Int32?>(nil)
        let granted = DispatchSemaphore(value: 0)
        let failure = Mutex<(any Error)?>(nil)
        Thread.detachNewThread {
            var connection: Int32 = -1
            do {
                _ = try Daemons.call(record, .coordinate(reads: reads, writes: writes), expecting: NoResult.self,
                                     connected: { connection = $0 }) { update in
                    if case .granted = update {
                        // Keep the connection: its reading thread ends when it is shut down.
                        result.withLock { $0 = dup(connection) }
                        granted.signal()
                    }
                }
            } catch {
                if result.withLock({ $0 }) == nil {
                    failure.withLock { $0 = error }
                    granted.signal()
                }
            }
        }
        granted.wait()
        if let error = failure.withLock({ $0 }) { throw error }
        return result.withLock { $0 }!
    }

    // MARK: Presenters

    open class func addFilePresenter(_ filePresenter: any NSFilePresenter) { FilePresenters.add(filePresenter) }
    open class func removeFilePresenter(_ filePresenter: any NSFilePresenter) { FilePresenters.remove(filePresenter) }
    open class var filePresenters: [any NSFilePresenter] { FilePresenters.all() }
}

/// What presents an item: told when it changes, moves or goes, by this
/// process's coordinated writes and by everyone else's changes — other
/// processes', and other devices' (which the mount raises as inotify events).
public protocol NSFilePresenter: NSObjectProtocol {
    var presentedItemURL: URL? { get }
    var presentedItemOperationQueue: OperationQueue { get }

    func presentedItemDidChange()
    func presentedItemDidMove(to newURL: URL)
    func accommodatePresentedItemDeletion(completionHandler: @escaping ((any Error)?) -> Void)
    func savePresentedItemChanges(completionHandler: @escaping ((any Error)?) -> Void)
    func relinquishPresentedItem(toWriter writer: @escaping ((() -> Void)?) -> Void)
    func relinquishPresentedItem(toReader reader: @escaping ((() -> Void)?) -> Void)
    func presentedSubitemDidAppear(at url: URL)
    func presentedSubitemDidChange(at url: URL)
}

extension NSFilePresenter {
    public func presentedItemDidChange() {}
    public func presentedItemDidMove(to newURL: URL) {}
    public func accommodatePresentedItemDeletion(completionHandler: @escaping ((any Error)?) -> Void) { completionHandler(nil) }
    public func savePresentedItemChanges(completionHandler: @escaping ((any Error)?) -> Void) { completionHandler(nil) }
    public func relinquishPresentedItem(toWriter writer: @escaping ((() -> Void)?) -> Void) { writer(nil) }
    public func relinquishPresentedItem(toReader reader: @escaping ((() -> Void)?) -> Void) { reader(nil) }
    public func presentedSubitemDidAppear(at url: URL) {}
    public func presentedSubitemDidChange(at url: URL) {}
}

/// This process's presenters, each watching its item's folder with inotify
/// (the mount raises events for every change, local or from another
/// device): a change of the item is `presentedItemDidChange`, a move
/// `presentedItemDidMove(to:)` (within its folder; elsewhere: deletion), a
/// deletion `accommodatePresentedItemDeletion`; a folder's presenter hears
/// of its subitems.
enum FilePresenters {
    struct Watched: @unchecked Sendable {   // the presenter is only handed to its own queue
        var presenter: any NSFilePresenter
        var url: URL
        var folderWatch: Int32
        var selfWatch: Int32
    }
    struct State {
        var fd: Int32 = -1
        var watched: [Watched] = []
        var cookies: [UInt32: String] = [:]
    }
    static let state = Mutex(State())

    static func all() -> [any NSFilePresenter] { state.withLock { $0.watched.map(\.presenter) } }

    static func presenting(_ url: URL) -> [any NSFilePresenter] {
        let path = url.standardizedFileURL.path
        return state.withLock { $0.watched.filter { $0.url.standardizedFileURL.path == path }.map(\.presenter) }
    }

    static func add(_ presenter: any NSFilePresenter) {
        guard let url = presenter.presentedItemURL?.standardizedFileURL else { return }
        let fd = state.withLock { s -> Int32 in
            if s.fd < 0 { s.fd = inotify_init1(Int32(IN_CLOEXEC)) }
            return s.fd
        }
        guard fd >= 0 else { return }
        let mask = UInt32(IN_CREATE | IN_DELETE | IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO)
        let watched = Watched(presenter: presenter, url: url,
                              folderWatch: inotify_add_watch(fd, url.deletingLastPathComponent().path, mask),
                              selfWatch: inotify_add_watch(fd, url.path, mask | UInt32(IN_DELETE_SELF)))
        let start = state.withLock { s -> Bool in
            s.watched.append(watched)
            return s.watched.count == 1
        }
        if start { Thread.detachNewThread { readEvents() } }
    }

    static func remove(_ presenter: any NSFilePresenter) {
        let id = ObjectIdentifier(presenter)
        state.withLock { s in s.watched.removeAll { ObjectIdentifier($0.presenter) == id } }
    }

    static func deliver(_ presenter: any NSFilePresenter, wait: Bool = false, _ body: @escaping @Sendable (any NSFilePresenter) -> Void) {
        let box = UncheckedBox(presenter)
        let operation = BlockOperation { body(box.value) }
        presenter.presentedItemOperationQueue.addOperation(operation)
        if wait && OperationQueue.current !== presenter.presentedItemOperationQueue { operation.waitUntilFinished() }
    }

    /// The reading thread: one per process, for as long as the process runs.
    static func readEvents() {
        let fd = state.withLock { $0.fd }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return }
            var offset = 0
            while offset + 16 <= n {
                let (wd, mask, cookie, length) = buffer.withUnsafeBytes { raw in
                    (raw.load(fromByteOffset: offset, as: Int32.self), raw.load(fromByteOffset: offset + 4, as: UInt32.self),
                     raw.load(fromByteOffset: offset + 8, as: UInt32.self), Int(raw.load(fromByteOffset: offset + 12, as: UInt32.self)))
                }
                let nameBytes = buffer[(offset + 16)..<(offset + 16 + length)].prefix { $0 != 0 }
                let name = String(decoding: nameBytes, as: UTF8.self)
                offset += 16 + length
                handle(wd: wd, mask: mask, cookie: cookie, name: name)
            }
        }
    }

    static func handle(wd: Int32, mask: UInt32, cookie: UInt32, name: String) {
        let watched = state.withLock { $0.watched }
        for item in watched where item.folderWatch == wd && !name.isEmpty {
            let presented = item.url.lastPathComponent
            let child = item.url.deletingLastPathComponent().appendingPathComponent(name)
            if name == presented {
                if mask & UInt32(IN_MOVED_FROM) != 0 {
                    state.withLock { $0.cookies[cookie] = name }
                } else if mask & UInt32(IN_DELETE) != 0 {
                    deliver(item.presenter) { $0.accommodatePresentedItemDeletion { _ in } }
                } else if mask & UInt32(IN_CLOSE_WRITE | IN_ATTRIB | IN_MOVED_TO | IN_CREATE) != 0 {
                    deliver(item.presenter) { $0.presentedItemDidChange() }
                }
            } else if mask & UInt32(IN_MOVED_TO) != 0, state.withLock({ $0.cookies.removeValue(forKey: cookie) }) == presented {
                let box = UncheckedBox(child)
                deliver(item.presenter) { $0.presentedItemDidMove(to: box.value) }
            }
        }
        for item in watched where item.selfWatch == wd && !name.isEmpty {
            let child = item.url.appendingPathComponent(name)
            let box = UncheckedBox(child)
            if mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0 {
                deliver(item.presenter) { $0.presentedSubitemDidAppear(at: box.value) }
            } else if mask & UInt32(IN_CLOSE_WRITE | IN_ATTRIB) != 0 {
                deliver(item.presenter) { $0.presentedSubitemDidChange(at: box.value) }
            }
        }
    }
}
