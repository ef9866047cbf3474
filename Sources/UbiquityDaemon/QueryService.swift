import Foundation
import UbiquityControl
import UbiquityProtocol
import UbiquityReplica
import UbiquityStore
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

    /// A time as seconds since 1970. The fraction is capped just below 1: a
    /// Double near 1.6e9 steps in 2^-22 s, and x.999999999 must not round up
    /// into the next second (dates compare by whole seconds).
    static func seconds(_ t: Timespec) -> Double {
        Double(t.sec) + min(Double(t.nsec) / 1e9, 0.999_999)
    }

    /// Builds an item's attributes: every one, or those a predicate reads (a
    /// query first tests its predicate on what it reads, then builds whole
    /// items for the matches). The choice is made once per query: looking the
    /// names up per item and key cost more than the predicate over 100,000 items.
    struct MetadataBuilder: Sendable {
        typealias Part = (keys: Set<String>, add: @Sendable (ItemRecord, inout [String: MetadataValue]) -> Void)
        private let parts: [Part]

        static let everything = MetadataBuilder(only: nil)

        /// Whether an item built here holds its path (or URL).
        let readsPath: Bool

        init(only: Set<String>?) {
            parts = Self.allParts.filter { part in only.map { !$0.isDisjoint(with: part.keys) } ?? true }
            readsPath = only.map { !$0.isDisjoint(with: ["path", "url"]) } ?? true
        }

        func item(_ r: ItemRecord) -> MetadataItem {
            var values: [String: MetadataValue] = [:]
            values.reserveCapacity(parts.count + 2)
            for part in parts { part.add(r, &values) }
            return MetadataItem(values: values)
        }

        private static let allParts: [Part] = [
            (["name"], { r, v in v["name"] = .string(r.name) }),
            (["displayName"], { r, v in v["displayName"] = .string(r.name) }),
            (["path"], { r, v in v["path"] = .string(r.path) }),
            (["url"], { r, v in v["url"] = .string(URL(fileURLWithPath: r.path, isDirectory: r.isDirectory).absoluteString) }),
            (["size"], { r, v in v["size"] = .number(Double(r.size)) }),
            (["contentType", "contentTypeTree", "mimeType"], { r, v in
                let mime = r.isDirectory ? "inode/directory" : ContentTypes.shared.type(ofFileNamed: r.name)
                let uti = UniformTypes.identifier(forMIMEType: mime)
                v["mimeType"] = .string(mime)
                v["contentType"] = .string(uti)
                v["contentTypeTree"] = .list(UniformTypes.tree(of: uti).map(MetadataValue.string))
            }),
            (["isDirectory"], { r, v in v["isDirectory"] = .bool(r.isDirectory) }),
            (["creationDate"], { r, v in v["creationDate"] = .date(seconds(r.created)) }),
            (["modificationDate"], { r, v in v["modificationDate"] = .date(seconds(r.modified)) }),
            (["downloadingStatus"], { r, v in v["downloadingStatus"] = .string(r.status.downloadingStatus) }),
            (["isDownloading"], { r, v in v["isDownloading"] = .bool(r.status.isDownloading) }),
            (["percentDownloaded"], { r, v in v["percentDownloaded"] = .number(Double(r.status.percentDownloaded)) }),
            (["isUploaded"], { r, v in v["isUploaded"] = .bool(r.status.isUploaded) }),
            (["isUploading"], { r, v in v["isUploading"] = .bool(r.status.isUploading) }),
            (["percentUploaded"], { r, v in v["percentUploaded"] = .number(r.status.isUploaded ? 100 : 0) }),
            (["hasUnresolvedConflicts"], { r, v in v["hasUnresolvedConflicts"] = .bool(r.status.hasUnresolvedConflicts) }),
            (["pinned"], { r, v in v["pinned"] = .bool(r.status.pinned) }),
            (["downloadingError"], { r, v in v["downloadingError"] = r.status.downloadingError.map(MetadataValue.string) ?? .null }),
            (["uploadingError"], { r, v in v["uploadingError"] = r.status.uploadingError.map(MetadataValue.string) ?? .null }),
        ]
    }

    /// The matching items, sorted, keyed by inode (for watch diffs).
    /// `shownPath` gives the path the mount shows for a record (by default
    /// its path): asked before the predicate only if the predicate reads
    /// paths, otherwise only for the matches (most queries match few items).
    package static func run(_ query: Query, scopes: [Scope], records: [ItemRecord],
                            shownPath: ((ItemRecord) -> String)? = nil) -> [(UInt64, MetadataItem)] {
        let filter = MetadataBuilder(only: query.predicateAttributes)
        let pathFirst = filter.readsPath
        var byItem: [MetadataItem: UInt64] = [:]
        var matching: [MetadataItem] = []
        for var record in records where inScopes(record.path, scopes) {
            if pathFirst, let shownPath { record.path = shownPath(record) }
            guard query.matches(filter.item(record)) else { continue }
            if !pathFirst, let shownPath { record.path = shownPath(record) }
            let item = MetadataBuilder.everything.item(record)
            matching.append(item)
            byItem[item] = record.ino
        }
        return query.sorted(matching).map { (byItem[$0] ?? 0, $0) }
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

    /// `{"event":"…","item":{…}}` with the item's keys sorted: a
    /// `QueryEvent` line, written by hand (JSONEncoder would spend seconds
    /// on 100,000 results).
    static func eventLine(_ event: QueryEvent.Kind, _ item: MetadataItem) -> String {
        var out = "{\"event\":\"\(event.rawValue)\",\"item\":{"
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
            let lines = results[start..<min(results.count, start + 1000)].map { eventLine(.result, $0.1) }
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
        let filter = MetadataBuilder(only: query.predicateAttributes)
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
                    if old != item { events.append(eventLine(old == nil ? .added : .changed, item)) }
                    current[key] = item
                } else if let old {
                    events.append(eventLine(.removed, old))
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
                        if updated[record.ino] == nil, query.matches(filter.item(record)) {
                            updated[record.ino] = MetadataBuilder.everything.item(record)
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

    /// `run` over the items of several sources as one list: keys unique
    /// across sources (the source's key in the top bits), paths as the mount
    /// shows them.
    static func run(_ query: Query, sources: [QuerySource]) -> [(UInt64, MetadataItem)] {
        var records: [ItemRecord] = []
        var rewrites: [UInt64: (String) -> String] = [:]
        for source in sources {
            rewrites[source.key] = source.rewrite
            for var record in source.engine.items() where inScopes(record.path, source.scopes) {
                record.ino = source.key << 48 | record.ino
                records.append(record)
            }
        }
        return run(query, scopes: [.all], records: records, shownPath: { record in
            rewrites[record.ino >> 48].map { $0(record.path) } ?? record.path
        })
    }
}

/// Items a query sees: one container's engine, the scopes of it shown, and
/// how its paths (from the container's root) read below the mountpoint.
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
