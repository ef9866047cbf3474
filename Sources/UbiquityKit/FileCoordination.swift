import UbiquityLocks
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
    let cancelled = Lock(false)
    /// Told how the download of placeholders read goes (UIDocument's `progress`).
    var downloadProgress: (@Sendable (DownloadProgress) -> Void)?

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
        access(reads: [], readOptions: [], writes: [(url, options)], error: outError) { writer(url) }
    }

    open func coordinate(readingItemAt readingURL: URL, options readingOptions: ReadingOptions = [],
                         writingItemAt writingURL: URL, options writingOptions: WritingOptions = [],
                         error outError: NSErrorPointer, byAccessor readerWriter: (URL, URL) -> Void) {
        access(reads: [readingURL], readOptions: readingOptions, writes: [(writingURL, writingOptions)], error: outError) {
            readerWriter(readingURL, writingURL)
        }
    }

    open func coordinate(writingItemAt url1: URL, options options1: WritingOptions = [],
                         writingItemAt url2: URL, options options2: WritingOptions = [],
                         error outError: NSErrorPointer, byAccessor writer: (URL, URL) -> Void) {
        access(reads: [], readOptions: [], writes: [(url1, options1), (url2, options2)], error: outError) { writer(url1, url2) }
    }

    /// Several items at once, then `batchAccessor` (which may coordinate each as it goes).
    open func prepare(forReadingItemsAt readingURLs: [URL], options readingOptions: ReadingOptions = [],
                      writingItemsAt writingURLs: [URL], options writingOptions: WritingOptions = [],
                      error outError: NSErrorPointer, byAccessor batchAccessor: (@escaping () -> Void) -> Void) {
        access(reads: readingURLs, readOptions: readingOptions, writes: writingURLs.map { ($0, writingOptions) }, error: outError) {
            batchAccessor({})
        }
    }

    /// What a coordinated write tells the presenters of the item in this
    /// process (other processes' presenters learn it from the item's events).
    open func item(at oldURL: URL, didMoveTo newURL: URL) {
        for presenter in FilePresenters.presenting(oldURL, except: presenter) {
            FilePresenters.deliver(presenter) { $0.presentedItemDidMove(to: newURL) }
        }
    }

    /// Ask the presenters to let go (this process's here, other processes'
    /// through the daemon), hold the items, run `body`, let go, give the
    /// presenters their items back. Errors go to `outError` (Apple's way).
    func access(reads: [URL], readOptions: ReadingOptions, writes: [(URL, WritingOptions)], error outError: NSErrorPointer,
                _ body: () -> Void) {
        struct Items { var record: MountRecord; var reads: [[String]] = []; var writes: [[String]] = []; var deletes: [[String]] = [] }
        var byMount: [String: Items] = [:]
        func add(_ url: URL, _ put: (inout Items, [String]) -> Void) {
            guard let (record, names) = try? Daemons.locate(url.deletingLastPathComponent()) else { return }
            put(&byMount[record.mountpoint, default: Items(record: record)], names + [url.lastPathComponent])
        }
        for url in reads { add(url) { $0.reads.append($1) } }
        for (url, options) in writes {
            add(url) { items, names in
                if options.contains(.forDeleting) { items.deletes.append(names) } else { items.writes.append(names) }
            }
        }
        // This process's presenters first (the daemon asks the others').
        var asks: [FilePresenters.Ask] = []
        for url in reads { asks += FilePresenters.presenting(url, except: presenter).map { ($0, .reading, !readOptions.contains(.withoutChanges)) } }
        for (url, options) in writes {
            asks += FilePresenters.presenting(url, except: presenter).map { ($0, options.contains(.forDeleting) ? .deleting : .writing, true) }
        }
        let reacquirers = FilePresenters.relinquish(asks)
        defer { FilePresenters.reacquire(reacquirers) }
        // One connection per mount, in a fixed order (two coordinators never wait for each other crosswise).
        var held: [Int32] = []
        defer {
            for fd in held {
                shutdown(fd, Int32(SHUT_RDWR))   // the daemon lets go; the reading thread ends
                close(fd)
            }
        }
        for (_, items) in byMount.sorted(by: { $0.key < $1.key }) {
            if cancelled.withLock({ $0 }) { return fail(outError, CocoaError(.userCancelled)) }
            // Metadata only: nothing is downloaded, but a writer still waits for the reader.
            let metadataOnly = readOptions.contains(.immediatelyAvailableMetadataOnly)
            do {
                held.append(try Self.grant(items.record, .coordinate(reads: items.reads, writes: items.writes, deletes: items.deletes,
                                                                     metadataOnly: metadataOnly), progress: downloadProgress))
            } catch {
                return fail(outError, error)
            }
        }
        body()
    }

    func fail(_ outError: NSErrorPointer, _ error: any Error) {
        outError?.pointee = error as NSError
    }

    /// Ask the daemon for the items; return the connection once granted
    /// (closing it lets go).
    static func grant(_ record: MountRecord, _ command: Command, progress: (@Sendable (DownloadProgress) -> Void)?) throws -> Int32 {
        let result = Lock<Int32?>(nil)
        let granted = DispatchSemaphore(value: 0)
        let failure = Lock<(any Error)?>(nil)
        Thread.detachNewThread {
            var connection: Int32 = -1
            do {
                _ = try Daemons.call(record, command, expecting: NoResult.self, connected: { connection = $0 }) { update in
                    switch update {
                    case .granted:
                        // Keep the connection: its reading thread ends when it is shut down.
                        result.withLock { $0 = dup(connection) }
                        granted.signal()
                    case .downloading(let done):
                        progress?(done)
                    default:
                        break
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
///
/// A presenter of an item in a mount is also known to the daemon (a
/// `present` connection, `Link`): other processes' coordinated accesses
/// and the sync's writes of pulled versions ask it to let go first.
enum FilePresenters {
    struct Watched: @unchecked Sendable {   // the presenter is only handed to its own queue
        var presenter: any NSFilePresenter
        var url: URL
        var folderWatch: Int32
        var selfWatch: Int32
        var link: Link?
    }
    struct State {
        var fd: Int32 = -1
        var watched: [Watched] = []
        var cookies: [UInt32: String] = [:]
    }
    static let state = Lock(State())
    /// Longest a coordinated access waits for one of this process's presenters to let go.
    static let timeout = 10.0

    static func all() -> [any NSFilePresenter] { state.withLock { $0.watched.map(\.presenter) } }

    /// This process's presenters of `url`, of what is inside it, or of a
    /// folder holding it — other than `except` (the coordinator's own).
    static func presenting(_ url: URL, except: (any NSFilePresenter)? = nil) -> [any NSFilePresenter] {
        let path = url.standardizedFileURL.path
        return state.withLock { s in
            s.watched.filter { watched in
                let presented = watched.url.standardizedFileURL.path
                return (presented == path || presented.hasPrefix(path + "/") || path.hasPrefix(presented + "/"))
                    && watched.presenter !== except
            }.map(\.presenter)
        }
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
                              selfWatch: inotify_add_watch(fd, url.path, mask | UInt32(IN_DELETE_SELF)),
                              link: Link.open(presenter, url))
        let start = state.withLock { s -> Bool in
            s.watched.append(watched)
            return s.watched.count == 1
        }
        if start { Thread.detachNewThread { readEvents() } }
    }

    static func remove(_ presenter: any NSFilePresenter) {
        let id = ObjectIdentifier(presenter)
        let gone = state.withLock { s -> [Watched] in
            let gone = s.watched.filter { ObjectIdentifier($0.presenter) == id }
            s.watched.removeAll { ObjectIdentifier($0.presenter) == id }
            return gone
        }
        for watched in gone { watched.link?.close() }
    }

    /// Run `body` with the presenter on its queue (at once when already on it).
    static func deliver(_ presenter: any NSFilePresenter, _ body: @escaping @Sendable (any NSFilePresenter) -> Void) {
        let box = UncheckedBox(presenter)
        if OperationQueue.current === presenter.presentedItemOperationQueue {
            body(presenter)
            return
        }
        presenter.presentedItemOperationQueue.addOperation { body(box.value) }
    }

    /// A presenter to ask, for which access, and whether it saves first.
    typealias Ask = (presenter: any NSFilePresenter, access: PresenterAsk.Access, save: Bool)
    typealias Reacquirer = (presenter: any NSFilePresenter, reacquire: () -> Void)

    /// Ask `presenter` to let go for `access` on its queue — save first
    /// (`savePresentedItemChanges`), then `relinquishPresentedItem(toReader:)`
    /// or `(toWriter:)`; for a deletion `accommodatePresentedItemDeletion`
    /// — and call `done` with what gives the item back, once it let go.
    static func relinquish(_ presenter: any NSFilePresenter, _ access: PresenterAsk.Access, save: Bool,
                           done: @escaping @Sendable (UncheckedBox<(() -> Void)?>) -> Void) {
        deliver(presenter) { presenter in
            let box = UncheckedBox(presenter)
            let letGo: @Sendable () -> Void = {
                switch access {
                case .deleting: box.value.accommodatePresentedItemDeletion { _ in done(UncheckedBox(nil)) }
                case .reading: box.value.relinquishPresentedItem(toReader: { done(UncheckedBox($0)) })
                case .writing: box.value.relinquishPresentedItem(toWriter: { done(UncheckedBox($0)) })
                }
            }
            guard save && access != .deleting else { return letGo() }
            presenter.savePresentedItemChanges { _ in deliver(box.value) { _ in letGo() } }
        }
    }

    /// Ask these presenters of this process, wait until each let go (at most
    /// `timeout`); what gives their items back.
    static func relinquish(_ asks: [Ask]) -> [Reacquirer] {
        guard !asks.isEmpty else { return [] }
        let answers = Lock<[Int: UncheckedBox<(() -> Void)?>]>([:])
        let answered = DispatchSemaphore(value: 0)
        for (index, ask) in asks.enumerated() {
            relinquish(ask.presenter, ask.access, save: ask.save) { reacquirer in
                answers.withLock { $0[index] = reacquirer }
                answered.signal()
            }
        }
        let deadline = DispatchTime.now() + timeout
        for _ in asks where answered.wait(timeout: deadline) == .success {}
        let got = answers.withLock { $0 }
        return asks.indices.compactMap { index in
            guard let reacquire = got[index]?.value else { return nil }
            return (asks[index].presenter, reacquire)
        }
    }

    static func reacquire(_ reacquirers: [Reacquirer]) {
        for (presenter, reacquire) in reacquirers {
            let box = UncheckedBox(reacquire)
            deliver(presenter) { _ in box.value() }
        }
    }

    /// A presenter as the daemon knows it: the `present` connection, whose
    /// asks are answered once the presenter let go.
    final class Link: @unchecked Sendable {
        let fd = Lock<Int32>(-1)
        let closed = Lock(false)
        let reacquirers = Lock<[UInt64: UncheckedBox<() -> Void>]>([:])

        /// Present `url` to its mount's daemon (nil outside a mount).
        static func open(_ presenter: any NSFilePresenter, _ url: URL) -> Link? {
            guard let (record, names) = try? Daemons.locate(url.deletingLastPathComponent()) else { return nil }
            let link = Link()
            let box = UncheckedBox(presenter)
            let known = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                defer { known.signal() }
                do {
                    _ = try Daemons.call(record, .present(path: names + [url.lastPathComponent]), expecting: NoResult.self,
                                         connected: { fd in
                                             link.fd.withLock { $0 = fd }
                                             if link.closed.withLock({ $0 }) { shutdown(fd, Int32(SHUT_RDWR)) }
                                         }) { update in
                        if case .granted = update { known.signal() } else { link.handle(update, box.value) }
                    }
                } catch {
                    if !link.closed.withLock({ $0 }) { trace("presenting \(url.path): \(error)") }
                }
            }
            // Accesses that begin after addFilePresenter returns ask this presenter.
            _ = known.wait(timeout: .now() + 5)
            return link
        }

        func handle(_ update: Update, _ presenter: any NSFilePresenter) {
            switch update {
            case .relinquish(let ask):
                trace("relinquish \(ask.access.rawValue) #\(ask.id)")
                FilePresenters.relinquish(presenter, ask.access, save: true) { [self] reacquirer in
                    if let reacquire = reacquirer.value {
                        let box = UncheckedBox(reacquire)
                        reacquirers.withLock { $0[ask.id] = box }
                    }
                    answer(ask.id)
                }
            case .reacquire(let id):
                if let box = reacquirers.withLock({ $0.removeValue(forKey: id) }) {
                    deliver(presenter) { _ in box.value() }
                }
            default:
                break
            }
        }

        func answer(_ id: UInt64) {
            guard var line = try? JSONEncoder().encode(PresenterAnswer(relinquished: id)) else { return }
            line.append(0x0a)
            fd.withLock { fd in
                guard fd >= 0 else { return }
                _ = line.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
        }

        /// Stop presenting: the daemon forgets the presenter.
        func close() {
            closed.withLock { $0 = true }
            fd.withLock { fd in if fd >= 0 { shutdown(fd, Int32(SHUT_RDWR)) } }
        }
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
