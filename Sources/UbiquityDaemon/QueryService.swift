import Foundation
import UbiquityControl
import UbiquityProtocol
import UbiquityReplica
import UbiquityModel
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// Runs metadata queries over a container's items: scopes, predicate, sort;
/// and `--watch`: the initial gathering, a gathering-finished marker, then
/// added/changed/removed updates whenever the replica changes, at most one
/// batch per throttle interval.
package enum QueryService {
    static func inScopes(_ path: String, _ scopes: [Scope]) -> Bool {
        let inDocuments = path == "/Documents" || path.hasPrefix("/Documents/")
        return scopes.contains { scope in
            switch scope {
            case .all: return true
            case .documents: return inDocuments && path != "/Documents"
            case .data: return !inDocuments
            }
        }
    }

    /// How many items a container has, and how many of them are in each
    /// scope (by the rule of `inScopes`: below the root's `Documents` is the
    /// documents scope; everything else but `Documents` itself is data), for
    /// `status`. Counted in place from the listings and the nodes' kinds: no
    /// name, path or summary is made per item, so `status` holds the
    /// namespace lock for a walk of the listings (a scan of every item's
    /// path and summary held it for about a second at a million items).
    static func countItems(in ns: Namespace) -> (items: Int, documents: Int, data: Int) {
        var items = 0, documents = 0, data = 0
        var stack: [(dir: UInt64, belowDocuments: Bool)] = [(Namespace.rootIno, false)]
        let documentsName = FileName("Documents")
        while let (dir, belowDocuments) = stack.popLast() {
            guard let entries = ns.children[dir] else { continue }
            let documentsIno = dir == Namespace.rootIno ? entries[documentsName]?.ino : nil
            for entry in entries.values {
                guard let kind = ns.kind(of: entry.ino) else { continue }
                items += 1
                let isDocuments = entry.ino == documentsIno
                if belowDocuments { documents += 1 } else if !isDocuments { data += 1 }
                if kind == .directory { stack.append((entry.ino, belowDocuments || isDocuments)) }
            }
        }
        return (items, documents, data)
    }

    /// A time as seconds since 1970. The fraction is capped just below 1: a
    /// Double near 1.6e9 steps in 2^-22 s, and x.999999999 must not round up
    /// into the next second (dates compare by whole seconds).
    static func seconds(_ t: Timespec) -> Double {
        Double(t.sec) + min(Double(t.nsec) / 1e9, 0.999_999)
    }

    /// Whether an item in directory `directory` (its path from the
    /// container's root, "" for the root) named `name` is in the scopes: the
    /// same answer as `inScopes(directory + "/" + name, scopes)`, without
    /// making the path.
    static func inScopes(directory: String, name: FileName, _ scopes: [Scope]) -> Bool {
        if scopes.count == 1, scopes[0] == .all { return true }
        let belowDocuments = directory == "/Documents" || directory.hasPrefix("/Documents/")
        let isDocuments = directory.isEmpty && name.bytes.elementsEqual("Documents".utf8)
        return scopes.contains { scope in
            switch scope {
            case .all: return true
            case .documents: return belowDocuments
            case .data: return !belowDocuments && !isDocuments
            }
        }
    }

    /// A query's predicate over item records (paths as shown) and over the
    /// views of a scan: one compiled test for each, reading the fields it
    /// needs directly (no dictionary of values per item). Both read through
    /// `ItemValues.reader`, as `item` does for the whole item of a match, so
    /// an item tests the same whichever way it is seen.
    struct Matcher: Sendable {
        let records: @Sendable (ItemRecord) -> Bool
        let views: @Sendable (ItemView) -> Bool
        /// Whether the predicate reads the sync status (a scan then gives it to every view).
        let readsStatus: Bool

        init(_ query: Query) {
            records = query.matcher(reading: ItemValues.reader)
            views = query.matcher(reading: ItemValues.reader)
            readsStatus = !query.predicateAttributes.isDisjoint(with: ItemValues.statusAttributes)
        }
    }

    /// Builds whole items: every attribute (the content types worked out once).
    static func itemBuilder<R: QueryFields>(_: R.Type = R.self) -> (R) -> MetadataItem {
        let readers = ItemValues.plainReaders(R.self)
        return { r in
            var values: [String: MetadataValue] = [:]
            values.reserveCapacity(readers.count + 3)
            for (key, read) in readers { values[key] = read(r) ?? .null }
            let types = ItemValues.contentTypes(r)
            values["mimeType"] = .string(types.mime)
            values["contentType"] = .string(types.uti)
            values["contentTypeTree"] = .list(UniformTypes.tree(of: types.uti).map(MetadataValue.string))
            return MetadataItem(values: values)
        }
    }

    /// The whole item of a record.
    static func item(_ record: ItemRecord) -> MetadataItem { itemBuilder(ItemRecord.self)(record) }

    /// The records (paths from the container's root) of the items of one
    /// scan that are in `scopes` and match: the predicate is tested on the
    /// scan's views, paths shown through `show` (a rewrite of a leading part
    /// of the path: see `QuerySource.rewrite`).
    static func matching(_ matcher: Matcher, scopes: [Scope], show: @escaping (String) -> String,
                         scan: (Bool, (String) -> String, (ItemView) -> Bool) -> [ItemRecord]) -> [ItemRecord] {
        let test = matcher.views
        if scopes.count == 1, scopes[0] == .all {
            return scan(matcher.readsStatus, show, test)
        }
        return scan(matcher.readsStatus, show) { view in
            inScopes(directory: view.directory, name: view.fileName, scopes) && test(view)
        }
    }

    /// The whole items of matching records, sorted, keyed by `key` (for watch diffs).
    static func sortedItems(_ query: Query, _ records: [ItemRecord], key: (ItemRecord) -> UInt64) -> [(UInt64, MetadataItem)] {
        let build = itemBuilder(ItemRecord.self)
        let items = records.map(build)
        return query.sortOrder(items).map { (key(records[$0]), items[$0]) }
    }

    /// The matching items of a namespace read without a daemon, sorted, paths
    /// from the container's root.
    package static func run(_ query: Query, scopes: [Scope], namespace: Namespace) -> [(UInt64, MetadataItem)] {
        let records = matching(Matcher(query), scopes: scopes, show: { $0 }) { status, show, keep in
            SyncEngine.scanItems(in: namespace, status: status, showDirectory: show, keep)
        }
        return sortedItems(query, records, key: \.ino)
    }
    /// An item as the protocol carries it (dates as ISO 8601 text).
    package static func json(_ item: MetadataItem) -> [String: JSONValue] {
        item.values.mapValues(jsonValue)
    }

    static func jsonValue(_ value: MetadataValue) -> JSONValue {
        switch value {
        case .string(let s): .string(s)
        case .number(let n): .number(n)
        case .bool(let b): .bool(b)
        case .date(let d): .string(isoDate(Date(timeIntervalSince1970: d)))
        case .list(let elements): .array(elements.map(jsonValue))
        case .null: .null
        }
    }

    /// `{"event":"…","id":N,"item":{…}}` with the item's keys sorted (`id`:
    /// the item's number for this query, the same across its updates): a
    /// `QueryEvent` line, written by hand (JSONEncoder would spend seconds
    /// on 100,000 results).
    static func eventLine(_ event: QueryEvent.Kind, _ item: MetadataItem, id: UInt64) -> String {
        var out = "{\"event\":\"\(event.rawValue)\",\"id\":\(id),\"item\":{"
        var first = true
        for key in item.values.keys.sorted() {
            if !first { out += "," }
            first = false
            out += jsonString(key) + ":" + jsonText(item.values[key]!)
        }
        return out + "}}"
    }

    static func jsonText(_ value: MetadataValue) -> String {
        switch value {
        case .string(let s): jsonString(s)
        case .number(let n): n == n.rounded() && abs(n) < 1e15 ? String(Int64(n)) : String(n)
        case .bool(let b): b ? "true" : "false"
        case .date(let d): "\"" + isoDate(Date(timeIntervalSince1970: d)) + "\""
        case .list(let elements): "[" + elements.map(jsonText).joined(separator: ",") + "]"
        case .null: "null"
        }
    }

    /// A JSON string literal (RFC 8259 escapes).
    static func jsonString(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let c where c.value < 0x20:
                out += "\\u" + String(repeating: "0", count: 4 - String(c.value, radix: 16).count) + String(c.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }

    /// Answer one query request on the daemon's control socket, over the
    /// items of `sources` (asked again for each watch batch: a drive's
    /// containers come and go).
    static func serve(_ parameters: QueryParameters, connection: ControlConnection, sources: () throws -> [QuerySource]) {
        let query: Query
        var watched = WatchState()
        var results: [(UInt64, MetadataItem)]
        do {
            query = try Query(predicate: parameters.predicate, sort: parameters.sort)
            let current = try sources()
            watched.mark(current)   // before reading: what changes meanwhile is looked at again
            results = run(query, sources: current)
        } catch let error as QueryError {
            connection.fail(UbiquityError(EINVAL, "\(error)"))
            return
        } catch {
            connection.fail(error)
            return
        }
        // A thousand result lines a write.
        var start = 0
        while start < results.count {
            let lines = results[start..<min(results.count, start + 1000)].map { eventLine(.result, $0.1, id: $0.0) }
            guard connection.sendRaw(Data(lines.joined(separator: "\n").utf8)) else { return }
            start += 1000
        }
        guard parameters.watch else {
            connection.finish(QueryFinished(count: results.count))
            return
        }
        guard connection.send(.event(QueryEvent(.gatheringFinished, count: results.count))) else { return }
        let throttle = min(3600, max(0.05, parameters.throttle))
        var current = Dictionary(results, uniquingKeysWith: { a, _ in a })
        results = []
        let matcher = Matcher(query)
        let build = itemBuilder(ItemRecord.self)
        func generation() -> [UInt64] { ((try? sources()) ?? []).map { $0.key &* 1_000_003 &+ $0.engine.changeGeneration } }
        var seen = generation()
        var lastBeat = Date()
        var lastBatch = Date.distantPast
        while true {
            // The change counters are cheap to read: look often, so that a
            // change after a quiet spell is reported at once; batches still
            // come at most once per throttle interval.
            Thread.sleep(forTimeInterval: min(throttle, 0.02))
            if generation() == seen {
                // Find out whether the client left, now and then.
                if Date().timeIntervalSince(lastBeat) > 5 {
                    guard connection.send(.event(QueryEvent(.heartbeat))) else { return }
                    lastBeat = Date()
                }
                continue
            }
            // At most one batch of events per throttle interval (a look that
            // found nothing to report does not count).
            let wait = throttle - Date().timeIntervalSince(lastBatch)
            if wait > 0 { Thread.sleep(forTimeInterval: wait) }
            seen = generation()
            guard let sources = try? sources() else { continue }
            // Only the items that changed, unless paths or the sources moved.
            var events: [String] = []
            func settle(_ key: UInt64, _ item: MetadataItem?) {
                let old = current[key]
                if let item {
                    if old != item { events.append(eventLine(old == nil ? .added : .changed, item, id: key)) }
                    current[key] = item
                } else if let old {
                    events.append(eventLine(.removed, old, id: key))
                    current[key] = nil
                }
            }
            if let changed = watched.changes(sources) {
                var updated: [UInt64: MetadataItem] = [:]
                for source in sources {
                    let inos = changed[source.key] ?? []
                    for var record in source.engine.items(inos) where inScopes(record.path, source.scopes) {
                        record.path = source.rewrite(record.path)
                        record.ino = source.key << 48 | record.ino
                        if updated[record.ino] == nil, matcher.records(record) {
                            updated[record.ino] = build(record)
                        }
                    }
                }
                for (key, inos) in changed { for ino in inos { settle(key << 48 | ino, updated[key << 48 | ino]) } }
            } else {
                watched.mark(sources)
                let next = Dictionary(run(query, sources: sources), uniquingKeysWith: { a, _ in a })
                for key in Set(current.keys).union(next.keys) { settle(key, next[key]) }
            }
            if !events.isEmpty {
                guard connection.sendRaw(Data(events.joined(separator: "\n").utf8)) else { return }
                lastBatch = Date()
            }
        }
    }

    /// Where a watch stands with each source: its change counters when last
    /// read, and what the sync status said (which colours every unpushed item).
    struct WatchState {
        var marks: [UInt64: (seq: UInt64, structure: UInt64, status: String)] = [:]

        static func status(_ engine: SyncEngine) -> String {
            let s = engine.currentStatus
            return "\(s.storeReachable) \(s.lastError ?? "")"
        }

        /// Remember where every source stands now (before reading all its items).
        mutating func mark(_ sources: [QuerySource]) {
            marks = [:]
            for source in sources {
                let now = source.engine.itemChanges(since: .max, structure: .max)
                marks[source.key] = (now.seq, now.structure, Self.status(source.engine))
            }
        }

        /// The inodes to look at again, per source key; nil when every item
        /// must be read again (a source came or went, a directory moved, the
        /// sync status changed, the change log wrapped).
        mutating func changes(_ sources: [QuerySource]) -> [UInt64: Set<UInt64>]? {
            guard Set(sources.map(\.key)) == Set(marks.keys) else { return nil }
            var out: [UInt64: Set<UInt64>] = [:]
            var next = marks
            for source in sources {
                guard let mark = marks[source.key], mark.status == Self.status(source.engine) else { return nil }
                let found = source.engine.itemChanges(since: mark.seq, structure: mark.structure)
                guard let inos = found.inos else { return nil }
                out[source.key] = inos
                next[source.key] = (found.seq, found.structure, mark.status)
            }
            marks = next
            return out
        }
    }

    /// The matching items of several sources as one list, sorted: keys
    /// unique across sources (the source's key in the top bits), paths as the
    /// mount shows them.
    static func run(_ query: Query, sources: [QuerySource]) -> [(UInt64, MetadataItem)] {
        let matcher = Matcher(query)
        var records: [ItemRecord] = []
        for source in sources {
            let found = matching(matcher, scopes: source.scopes, show: source.rewrite) { status, show, keep in
                source.engine.scanItems(status: status, showDirectory: show, keep)
            }
            for var record in found {
                record.path = source.rewrite(record.path)
                record.ino = source.key << 48 | record.ino
                records.append(record)
            }
        }
        return sortedItems(query, records, key: \.ino)
    }
}

/// What a query reads of an item: a record (its path as the mount shows
/// it) or a scan's view. Its readers are `@Sendable` closures generic over
/// the type, so the type itself must be shareable between threads.
protocol QueryFields: SendableMetatype {
    var name: String { get }
    /// The path as the query shows it.
    var shownPath: String { get }
    var isDirectory: Bool { get }
    var size: UInt64 { get }
    var created: Timespec { get }
    var modified: Timespec { get }
    /// The sync status (read only for the attributes of `ItemValues.statusAttributes`).
    var itemStatus: ItemStatus { get }
}

extension ItemRecord: QueryFields {
    var shownPath: String { path }
    var itemStatus: ItemStatus { status }
}

extension ItemView: QueryFields {
    /// The scan's `shownDirectory` and the name.
    var shownPath: String { shownDirectory + "/" + name }
    /// A scan asked for status when the predicate reads it (`Matcher.readsStatus`);
    /// without it, an item reads as current and uploaded (never reached).
    var itemStatus: ItemStatus {
        status ?? .unread
    }
}

/// The attributes of an item (`Query.attributeNames`) from its fields: one
/// reading function per attribute, chosen once per query (looking names up
/// per item and key cost more than the predicate over 100,000 items).
enum ItemValues {
    /// The attributes read from the sync status.
    static let statusAttributes: Set<String> = [
        "downloadingStatus", "isDownloading", "percentDownloaded", "isUploaded", "isUploading", "percentUploaded",
        "hasUnresolvedConflicts", "pinned", "downloadingError", "uploadingError",
    ]

    /// The freedesktop MIME type and the Uniform Type Identifier.
    static func contentTypes<R: QueryFields>(_ r: R) -> (mime: String, uti: String) {
        let mime = r.isDirectory ? "inode/directory" : ContentTypes.shared.type(ofFileNamed: r.name)
        return (mime, UniformTypes.identifier(forMIMEType: mime))
    }

    /// The function reading attribute `key` (a short name); nil values for an unknown name.
    static func reader<R: QueryFields>(_ key: String) -> @Sendable (R) -> MetadataValue? {
        switch key {
        case "mimeType": return { .string(contentTypes($0).mime) }
        case "contentType": return { .string(contentTypes($0).uti) }
        case "contentTypeTree": return { .list(UniformTypes.tree(of: contentTypes($0).uti).map(MetadataValue.string)) }
        default: return plainReader(key) ?? { _ in nil }  // (every name the parser accepts has one)
        }
    }

    /// Every attribute but the content types, with its reader.
    static func plainReaders<R: QueryFields>(_: R.Type) -> [(String, @Sendable (R) -> MetadataValue?)] {
        Query.attributeNames.compactMap { key in plainReader(key).map { (key, $0) } }
    }

    private static func plainReader<R: QueryFields>(_ key: String) -> (@Sendable (R) -> MetadataValue?)? {
        switch key {
        case "name", "displayName": return { .string($0.name) }
        case "path": return { .string($0.shownPath) }
        case "url": return { r in .string(URL(fileURLWithPath: r.shownPath, isDirectory: r.isDirectory).absoluteString) }
        case "size": return { .number(Double($0.size)) }
        case "isDirectory": return { .bool($0.isDirectory) }
        case "creationDate": return { .date(QueryService.seconds($0.created)) }
        case "modificationDate": return { .date(QueryService.seconds($0.modified)) }
        case "downloadingStatus": return { .string($0.itemStatus.downloadingStatus) }
        case "isDownloading": return { .bool($0.itemStatus.isDownloading) }
        case "percentDownloaded": return { .number(Double($0.itemStatus.percentDownloaded)) }
        case "isUploaded": return { .bool($0.itemStatus.isUploaded) }
        case "isUploading": return { .bool($0.itemStatus.isUploading) }
        case "percentUploaded": return { .number($0.itemStatus.isUploaded ? 100 : 0) }
        case "hasUnresolvedConflicts": return { .bool($0.itemStatus.hasUnresolvedConflicts) }
        case "pinned": return { .bool($0.itemStatus.pinned) }
        case "downloadingError": return { $0.itemStatus.downloadingError.map(MetadataValue.string) ?? .null }
        case "uploadingError": return { $0.itemStatus.uploadingError.map(MetadataValue.string) ?? .null }
        default: return nil
        }
    }
}

/// Items a query sees: one container's engine, the scopes of it shown, and
/// how its paths (from the container's root) read below the mountpoint.
/// `rewrite` replaces a leading part of a path, one that every directory
/// holding an item in `scopes` has whole (the mountpoint for "", or for a
/// Documents scope for "/Documents"), so that `rewrite(directory) + "/" + name`
/// is `rewrite(directory + "/" + name)`: a query rewrites each directory once.
struct QuerySource {
    var key: UInt64
    var engine: SyncEngine
    var scopes: [Scope]
    var rewrite: (String) -> String
}

/// ISO 8601 text of a date, UTC, to the second ("2026-11-21T10:49:02Z").
/// Written by hand: Foundation's formatter costs tens of microseconds a
/// call, which adds up to seconds over 100,000 query results.
func isoDate(_ date: Date) -> String {
    var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
    var parts = tm()
    gmtime_r(&seconds, &parts)
    func pad(_ value: Int32, _ width: Int) -> String {
        let digits = String(value)
        return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
    }
    return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
        + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2))Z"
}
