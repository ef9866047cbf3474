import Foundation
import Testing
import UbiquityControl
@testable import UbiquityDaemon
import UbiquityProtocol
import UbiquityReplica
import UbiquityModel
import UbiquitySync

/// The query's fast path (the predicate compiled against a scan's views of
/// the namespace, whole records built for matches only) against the general
/// one (every record built, every attribute put in a `MetadataItem`, the
/// predicate evaluated on that): the same items, over varied items,
/// predicates, scopes and mounts.
@Suite struct QueryServiceTests {
    /// A namespace of varied items: Documents and data, deep and shallow,
    /// long and non-ASCII names, placeholders, pinned folders, conflicts,
    /// pushed and unpushed items.
    static func namespace(seed: UInt64) -> Namespace {
        var rng = Random(state: seed)
        var ns = Namespace()
        let root = ns.createNode(ino: Namespace.rootIno, kind: .directory, mode: 0o755, uid: 0, gid: 0)
        let stems = ["f0012", "f001234", "report", "Photo", "notes", "été", "a*b", "a_very_long_file_name_over_fifteen_bytes",
                     "Documents", "sub", "x?y", "日本語"]
        let extensions = ["", ".txt", ".md", ".jpg", ".PDF", ".swift", ".tar.gz"]
        var directories = [root]
        func add(_ parent: UInt64, _ name: String, directory: Bool) -> UInt64 {
            let time = Timespec(sec: 1_690_000_000 + Int64(rng.next() % 100_000_000), nsec: Int64(rng.next() % 1_000_000_000))
            let ino = ns.createNode(kind: directory ? .directory : .file, mode: directory ? 0o755 : 0o644, uid: 0, gid: 0, time: time)
            ns.linkEntry(parent, FileName(name), ino)
            let roll = rng.next() % 16
            ns.update(ino) { node in
                if !directory { node.size = [0, 7, 11, 100, 4096, 1 << 20][Int(rng.next() % 6)] }
                node.mtime = Timespec(sec: time.sec + Int64(rng.next() % 1_000_000), nsec: 0)
                if roll == 0 { node.pinned = true }
                if roll == 1 { node.conflicts = ["conflict-\(ino)"] }
                if roll == 2, !directory { node.hasContent = false }
            }
            if roll >= 8 { ns.updateRuntime(ino) { $0.pushed = $0.change } }
            if directory { directories.append(ino) }
            return ino
        }
        let documents = add(root, "Documents", directory: true)
        directories.append(documents)
        _ = add(root, "DocumentsX", directory: true)
        _ = add(documents, "Documents", directory: true)
        for index in 0..<600 {
            let parent = directories[Int(rng.next() % UInt64(directories.count))]
            let name = stems[Int(rng.next() % UInt64(stems.count))] + (index % 3 == 0 ? "\(index)" : "")
                + extensions[Int(rng.next() % UInt64(extensions.count))]
            guard ns.lookup(parent, FileName(name)) == nil else { continue }
            _ = add(parent, name, directory: rng.next() % 5 == 0)
        }
        return ns
    }

    struct Random {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    static let predicates = [
        "TRUEPREDICATE",
        "name LIKE[c] 'f0012*' AND size > 10",
        "NSMetadataItemFSNameKey == '*'",
        "NSMetadataItemFSNameKey == 'notes.md'",
        "name == '*.md' OR name ENDSWITH[c] '.pdf'",
        "name LIKE 'a\\\\*b*'",
        "name IN {'notes.md', 'Documents', 'sub'}",
        "name MATCHES '[a-z]+[0-9]*\\\\.txt'",
        "displayName CONTAINS[cd] 'e'",
        "path BEGINSWITH '/mnt/c/Documents/'",
        "NSMetadataItemPathKey BEGINSWITH '/mnt/c/sub'",
        "path ENDSWITH 'Documents'",
        "path.pathComponents.@count == 4",
        "NSMetadataItemPathKey.pathComponents.@count >= 6",
        "ANY path.pathComponents == 'sub'",
        "ALL path.pathComponents != 'Documents'",
        "NONE path.pathComponents BEGINSWITH 'a'",
        "SOME NSMetadataItemPathKey.pathComponents LIKE[c] 'photo*'",
        "contentTypeTree == 'public.image'",
        "ANY contentTypeTree == 'public.text'",
        "'public.data' IN contentTypeTree",
        "contentTypeTree.@count > 3",
        "NSMetadataItemContentTypeKey == 'public.folder'",
        "NSMetadataItemContentTypeTreeKey == 'public.item'",
        "mimeType BEGINSWITH 'image/'",
        "NSMetadataItemURLKey ENDSWITH '/'",
        "url CONTAINS 'Documents/sub'",
        "size IN {0, 7, 100}",
        "size BETWEEN {10, 5000}",
        "isDirectory == YES",
        "modificationDate > DATE(\"2026-01-01\")",
        "creationDate < CAST(1700000000, \"NSDate\")",
        "NSMetadataUbiquitousItemDownloadingStatusKey == NSMetadataUbiquitousItemDownloadingStatusCurrent",
        "downloadingStatus == NSMetadataUbiquitousItemDownloadingStatusNotDownloaded",
        "NSMetadataUbiquitousItemIsUploadedKey == NO",
        "isUploaded == YES AND pinned == YES",
        "hasUnresolvedConflicts == YES OR percentDownloaded < 100",
        "isUploading == YES",
        "percentUploaded == 100 AND NOT isDirectory == YES",
        "isDownloading == NO AND downloadingError == nil",
        "uploadingError != nil",
        "NOT (name BEGINSWITH 'f') AND (size > 0 OR isDirectory == YES) AND path CONTAINS 'sub'",
    ]

    /// Mounts: every scope below a mountpoint, a Documents mount (whose root
    /// is the Documents folder), the data scope, and no rewrite at all.
    struct Mount: Sendable {
        var scopes: [Scope]
        var rewrite: @Sendable (String) -> String
    }

    static let mounts: [Mount] = {
        let below: @Sendable (String) -> String = { path in "/mnt/c" + path }
        let documents: @Sendable (String) -> String = { path in "/mnt/c" + path.dropFirst("/Documents".count) }
        let same: @Sendable (String) -> String = { path in path }
        return [Mount(scopes: [.all], rewrite: below), Mount(scopes: [.documents], rewrite: documents),
                Mount(scopes: [.data], rewrite: below), Mount(scopes: [.documents, .data], rewrite: same)]
    }()

    @Test(arguments: [false, true])
    func theFastPathFindsWhatTheGeneralPathFinds(storeReachable: Bool) throws {
        let ns = Self.namespace(seed: 11)
        var sync = SyncStatus()
        sync.storeReachable = storeReachable
        if !storeReachable { sync.lastError = "store unreachable" }
        let records = SyncEngine.collectItems(in: ns, sync: sync)
        #expect(records.count > 500)
        var nonTrivial = 0
        for mount in Self.mounts {
            for text in Self.predicates {
                let query = try Query(predicate: text, sort: "-name,size")
                // General: every record in scope, shown, as a whole item.
                let expected = records.filter { QueryService.inScopes($0.path, mount.scopes) }.compactMap { record -> String? in
                    var shown = record
                    shown.path = mount.rewrite(record.path)
                    return query.matches(QueryService.item(shown)) ? "\(record.ino) \(record.path)" : nil
                }
                // Fast: the predicate on the scan's views.
                let matcher = QueryService.Matcher(query)
                let found = QueryService.matching(matcher, scopes: mount.scopes, show: mount.rewrite) { status, show, keep in
                    SyncEngine.scanItems(in: ns, sync: sync, status: status, showDirectory: show, keep)
                }
                #expect(Set(found.map { "\($0.ino) \($0.path)" }) == Set(expected), "\(text) in \(mount.scopes)")
                #expect(found.count == expected.count, "\(text) in \(mount.scopes)")
                if !expected.isEmpty && expected.count < records.count / 2 { nonTrivial += 1 }
                // The watch's test of a record agrees too.
                let byRecords = records.filter { record in
                    var shown = record
                    shown.path = mount.rewrite(record.path)
                    return QueryService.inScopes(record.path, mount.scopes) && matcher.records(shown)
                }
                #expect(byRecords.count == expected.count, "\(text) in \(mount.scopes): records")
                // A match's whole record is the one a full scan builds.
                let byKey = Dictionary(records.map { ("\($0.ino) \($0.path)", $0) }, uniquingKeysWith: { a, _ in a })
                for record in found {
                    guard let full = byKey["\(record.ino) \(record.path)"] else { continue }
                    #expect(QueryService.item(record) == QueryService.item(full), "\(text): \(record.path)")
                }
            }
        }
        #expect(nonTrivial > 60)
    }

    @Test func scopesByDirectoryAreScopesByPath() {
        let names = ["Documents", "DocumentsX", "Data", "x", "Documents2"]
        let directories = ["", "/Documents", "/Documents/Documents", "/DocumentsX", "/Data", "/Documents/a/b", "/x/Documents"]
        let scopeSets: [[Scope]] = [[.all], [.documents], [.data], [.documents, .data], [.data, .all]]
        for directory in directories {
            for name in names {
                for scopes in scopeSets {
                    #expect(QueryService.inScopes(directory: directory, name: FileName(name), scopes)
                            == QueryService.inScopes(directory + "/" + name, scopes), "\(directory)/\(name) \(scopes)")
                }
            }
        }
    }

    /// `status`'s counts, made from the listings alone, are the items and
    /// the scopes of every item's path (`inScopes`), over varied trees (a
    /// Documents folder with a Documents folder inside, `DocumentsX`, files
    /// named Documents elsewhere, hard links counted once per name).
    @Test(arguments: [UInt64(1), 2, 3])
    func statusCountsAreTheScopesOfEveryItem(seed: UInt64) {
        var ns = Self.namespace(seed: seed)
        let file = ns.children[Namespace.rootIno]!.values.first { ns.kind(of: $0.ino) == .file }!.ino
        ns.linkEntry(ns.lookup(Namespace.rootIno, FileName("Documents"))!, FileName("hard link"), file)
        let records = SyncEngine.collectItems(in: ns)
        let counts = QueryService.countItems(in: ns)
        #expect(counts.items == records.count)
        #expect(counts.documents == records.filter { QueryService.inScopes($0.path, [.documents]) }.count)
        #expect(counts.data == records.filter { QueryService.inScopes($0.path, [.data]) }.count)
        #expect(counts.documents > 50 && counts.data > 50)
    }

    @Test func anItemsValuesAreWhatTheQueryLanguageNames() {
        var status = ItemStatus.unread
        status.downloadingStatus = "notDownloaded"
        status.percentDownloaded = 0
        status.isUploaded = false
        let record = ItemRecord(ino: 9, path: "/mnt/c/Documents/photo 1.jpg", name: "photo 1.jpg", isDirectory: false, size: 2048,
                                created: Timespec(sec: 1_700_000_000, nsec: 500), modified: Timespec(sec: 1_700_000_100, nsec: 0),
                                status: status)
        let item = QueryService.item(record)
        #expect(item["name"] == .string("photo 1.jpg"))
        #expect(item["displayName"] == .string("photo 1.jpg"))
        #expect(item["path"] == .string("/mnt/c/Documents/photo 1.jpg"))
        #expect(item["url"] == .string("file:///mnt/c/Documents/photo%201.jpg"))
        #expect(item["size"] == .number(2048))
        #expect(item["mimeType"] == .string("image/jpeg"))
        #expect(item["contentType"] == .string("public.jpeg"))
        #expect(item["isDirectory"] == .bool(false))
        #expect(item["modificationDate"] == .date(1_700_000_100))
        #expect(item["downloadingStatus"] == .string("notDownloaded"))
        #expect(item["percentDownloaded"] == .number(0))
        #expect(item["isUploaded"] == .bool(false))
        #expect(item["percentUploaded"] == .number(0))
        #expect(item["uploadingError"] == .null)
        #expect(Set(item.values.keys) == Set(Query.attributeNames))
        if case .list(let tree) = item["contentTypeTree"] {
            #expect(tree.contains(.string("public.image")))
        } else {
            Issue.record("no contentTypeTree")
        }
    }
}
