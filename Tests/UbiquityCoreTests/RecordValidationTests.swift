import Foundation
import Testing
import UbiquityFS
import UbiquityReplica
import UbiquityModel
import UbiquityStore
import UbiquityTesting
import UbiquitySync
#if canImport(Glibc)
import Glibc
#endif

/// Journal records checked at the store boundary (`JournalRecord`,
/// `ChangeSet.validate`): every bad field is refused with a reason that
/// says what is wrong; every record devices write passes.
@Suite struct RecordValidationTests {
    static let seq: UInt64 = 17
    static let fileID = "0b6f3a52-3c1e-4c1a-9a59-6f1de2d1c0aa"
    static let dirID = "7d4c1f0e-2b9a-4e8f-8c3d-5a6b7c8d9e0f"
    static let hash = ContentCopy.hash(of: Data("hello".utf8))

    /// A valid record as JSON objects, to damage one field at a time.
    static func record() -> [String: Any] {
        [
            "version": 1, "device": "5f0c2a4e-1111-4d2c-9e3b-0123456789ab", "deviceName": "laptop",
            "date": 1_700_000_000_000_000_000,
            "changes": [
                ["op": "node", "id": fileID, "kind": "file", "mode": 0o644, "uid": 1000, "gid": 1000, "size": 5,
                 "hash": hash, "rdev": 0, "mtime": 1_700_000_000_123_456_789, "ctime": 1_700_000_000_000_000_000,
                 "btime": 1_700_000_000_000_000_000, "xattrs": ["user.tag": Data("v".utf8).base64EncodedString()],
                 "base": 0] as [String: Any],
                ["op": "node", "id": dirID, "kind": "directory", "mode": 0o755, "uid": 0, "gid": 0, "size": 0,
                 "rdev": 0, "mtime": 0, "ctime": 0, "btime": 0, "xattrs": [String: Any](), "base": 3],
                ["op": "entry", "parent": "root", "name": "docs", "child": dirID],
                ["op": "entry", "parent": dirID, "name": "notes.txt", "child": fileID],
                ["op": "entry", "parent": "root", "name": "old.txt"],
                ["op": "delete", "id": "9a9a9a9a-0000-4000-8000-000000000001", "base": 12],
            ],
        ]
    }

    static func data(_ object: Any) -> Data { try! JSONSerialization.data(withJSONObject: object) }

    /// The reason `data` is refused with (nil: accepted).
    static func reason(_ data: Data) -> String? {
        switch JournalRecord(seq: seq, data: data).content {
        case .changeSet: return nil
        case .invalid(let reason): return reason
        }
    }

    /// The record with change `index` changed by `edit`.
    static func editing(_ index: Int, _ edit: (inout [String: Any]) -> Void) -> Data {
        var object = record()
        var changes = object["changes"] as! [[String: Any]]
        edit(&changes[index])
        object["changes"] = changes
        return data(object)
    }

    @Test func aValidRecordPasses() throws {
        let record = JournalRecord(seq: Self.seq, data: Self.data(Self.record()))
        let changeSet = try #require(record.changeSet, "\(record.content)")
        #expect(changeSet.changes.count == 6)
        #expect(changeSet.changes[3] == .entry(parent: Self.dirID, name: "notes.txt", child: Self.fileID))
    }

    @Test func recordsWithoutAVersionAreVersionOne() throws {
        var object = Self.record()
        object["version"] = nil
        #expect(Self.reason(Self.data(object)) == nil)
    }

    @Test func base64NamesChunkedFilesSymlinksAndDevicesPass() throws {
        let manifest = ContentCopy.hash(of: Data("manifest".utf8))
        let symlinkID = "11111111-2222-4333-8444-555555555555"
        var object = Self.record()
        object["changes"] = [
            ["op": "node", "id": Self.fileID, "kind": "file", "mode": 0o4755, "uid": 0, "gid": 0, "size": 10 << 20,
             "hash": manifest, "chunked": true, "rdev": 0, "mtime": -1_000_000_000, "ctime": 0, "btime": 0,
             "xattrs": [String: Any](), "base": 0, "conflicts": ["documents"]] as [String: Any],
            ["op": "node", "id": symlinkID, "kind": "symlink", "mode": 0o777, "uid": 0, "gid": 0, "size": 8,
             "target": "../ünï", "rdev": 0, "mtime": 0, "ctime": 0, "btime": 0, "xattrs": [String: Any](), "base": 0],
            ["op": "node", "id": "documents", "kind": "charDevice", "mode": 0o600, "uid": 0, "gid": 0, "size": 0,
             "rdev": 0x0103, "mtime": 0, "ctime": 0, "btime": 0, "xattrs": [String: Any](), "base": 0],
            ["op": "entry", "parent": "root", "name": ["base64": Data([0x66, 0xff, 0xfe]).base64EncodedString()],
             "child": Self.fileID],
            ["op": "entry", "parent": "root", "name": ["base64": Data("plain".utf8).base64EncodedString()],
             "child": symlinkID],
            ["op": "entry", "parent": "root", "name": String(repeating: "é", count: 127) + "x", "child": "documents"],
        ]
        let changeSet = try #require(JournalRecord(seq: Self.seq, data: Self.data(object)).changeSet)
        #expect(changeSet.changes[3] == .entry(parent: .root, name: FileName(bytes: [0x66, 0xff, 0xfe]), child: Self.fileID))
        #expect(changeSet.changes[4] == .entry(parent: .root, name: "plain", child: symlinkID))
    }

    /// Every record a device writes passes: the encoder's own check, and the
    /// reader's, agree (names not UTF-8 included).
    @Test func whatAChangeSetEncodesDecodesBack() throws {
        let changeSet = ChangeSet(device: "a-device", deviceName: "a", changes: [
            .node(NodeState(id: Self.fileID, kind: .file, mode: 0o600, uid: 1, gid: 2, size: 5, hash: Self.hash,
                            target: nil, rdev: 0, mtime: .now(), ctime: .now(), btime: .now(),
                            xattrs: ["user.x": Data([0, 1, 2])], base: 4)),
            .entry(parent: .root, name: FileName(bytes: [0x80, 0x61]), child: Self.fileID),
            .deleteNode(id: Self.dirID, base: 16),
        ])
        let data = try changeSet.encodedRecord(seq: Self.seq)
        let decoded = try #require(JournalRecord(seq: Self.seq, data: data).changeSet)
        #expect(decoded.changes == changeSet.changes)
        #expect(decoded.version == 1, "a record naming no pack is version 1 (every reader reads it)")
    }

    @Test func theWriterRefusesWhatReadersWouldRefuse() throws {
        let bad = ChangeSet(device: "d", deviceName: "d", changes: [.entry(parent: .root, name: "a/b", child: nil)])
        let error = try #require(throws: UbiquityError.self) { try bad.encodedRecord(seq: 1) }
        #expect(error.errno == EBADMSG)
        #expect(error.message.contains("entry name contains '/'"))
        let store = InMemoryStore()
        try store.createContainer(ContainerConfig(id: "com.example.a", displayName: "A"))
        #expect(throws: UbiquityError.self) { try store.commit(container: "com.example.a", seq: 1, changeSet: bad) }
        #expect(store.journalLength == 0, "nothing was committed")
    }

    // MARK: - Names

    @Test(arguments: [
        ("a/b", "entry name contains '/'"),
        ("", "entry name is empty"),
        (".", "entry name is '.'"),
        ("..", "entry name is '..'"),
        ("a\u{0}b", "entry name contains NUL"),
        (String(repeating: "n", count: 256), "entry name is 256 bytes (at most 255)"),
        (String(repeating: "é", count: 128), "entry name is 256 bytes (at most 255)"),
    ])
    func badNames(name: String, expected: String) {
        let reason = Self.reason(Self.editing(2) { $0["name"] = name })
        #expect(reason?.hasPrefix(expected) == true, "\(reason ?? "accepted")")
    }

    @Test func badBase64Names() {
        let slash = Self.reason(Self.editing(2) { $0["name"] = ["base64": Data("x/y".utf8).base64EncodedString()] })
        #expect(slash?.hasPrefix("entry name contains '/'") == true, "\(slash ?? "accepted")")
        let long = Self.reason(Self.editing(2) { $0["name"] = ["base64": Data(repeating: 0xff, count: 256).base64EncodedString()] })
        #expect(long?.hasPrefix("entry name is 256 bytes") == true, "\(long ?? "accepted")")
        let garbage = Self.reason(Self.editing(2) { $0["name"] = ["base64": "%%%"] })
        #expect(garbage?.contains("not valid base64") == true, "\(garbage ?? "accepted")")
        let number = Self.reason(Self.editing(2) { $0["name"] = 5 })
        #expect(number?.contains("name is neither a string nor") == true, "\(number ?? "accepted")")
    }

    // MARK: - Node fields

    /// A JSON value written as text (parameters must be Sendable).
    static func json(_ text: String) -> Any {
        try! JSONSerialization.jsonObject(with: Data(text.utf8), options: .fragmentsAllowed)
    }

    @Test(arguments: [
        ("size", "-5", "changes[0].size: -5 is negative"),
        ("size", "1.5", "changes[0].size: 1.5 is not an integer"),
        ("size", "1e30", "changes[0].size: 1e+30 is too large"),
        ("size", "-1e30", "changes[0].size: -1e+30 is negative"),
        ("size", "\"5\"", "changes[0].size is not an integer"),
        ("size", "2251799813685248", "size 2251799813685248 is larger than 1125899906842624"),
        ("size", "18446744073709551615", "size 18446744073709551615 is larger than 1125899906842624"),
        ("mode", "33188", "mode 100644 has bits beyond the permissions"),
        ("mode", "16877", "mode 40755 has bits beyond the permissions"),
        ("mode", "-1", "changes[0].mode: -1 is negative"),
        ("uid", "4294967295", "owner 4294967295:1000 is not valid"),
        ("gid", "4294967296", "changes[0].gid: 4294967296 is too large"),
        ("hash", "\"xyz\"", "hash \"xyz\" is not 64 lower-case hex digits"),
        ("hash", "\"\(hash.uppercased())\"", "is not 64 lower-case hex digits"),
        ("hash", "\"\(hash.dropLast())\"", "is not 64 lower-case hex digits"),
        ("kind", "\"bogus\"", "changes[0].kind: unknown kind \"bogus\""),
        ("id", "\"\"", "ID is not well-formed"),
        ("id", "\"../etc\"", "ID is not well-formed"),
        ("id", "\"a\\nb\"", "ID is not well-formed"),
        ("id", "\"\(String(repeating: "a", count: 65))\"", "ID is not well-formed"),
        ("id", "\"root\"", "the root must be a directory, not a file"),
        ("base", "17", "base 17 is not an earlier record"),
        ("rdev", "5", "a file has no device number"),
        ("target", "\"x\"", "a file has no symlink target"),
        ("mtime", "1.5", "changes[0].mtime"),
        ("mtime", "1e300", "changes[0].mtime"),
        ("xattrs", #"{"security.selinux": "eA=="}"#, "\"security.selinux\" is not in the user.* namespace"),
        ("xattrs", #"{"user.ubiquity.status": "eA=="}"#, "user.ubiquity.* is reserved"),
        ("xattrs", "{\"user.big\": \"\(Data(count: 65537).base64EncodedString())\"}", "is 65537 bytes (at most 65536)"),
        ("xattrs", #"{"user.x": "not base64!"}"#, "changes[0].xattrs"),
        ("conflicts", #"["ok-id", "bad id"]"#, "conflict version \"bad id\" is not a well-formed ID"),
        ("chunked", "\"yes\"", "changes[0].chunked is not true or false"),
    ])
    func badFileNodeFields(key: String, value: String, expected: String) {
        let reason = Self.reason(Self.editing(0) { $0[key] = Self.json(value) })
        #expect(reason?.contains(expected) == true, "\(key)=\(value.prefix(80)): \(reason ?? "accepted")")
    }

    @Test func fieldsThatMustBeThere() {
        for key in ["id", "kind", "mode", "uid", "gid", "size", "rdev", "mtime", "ctime", "btime", "xattrs", "base"] {
            let reason = Self.reason(Self.editing(0) { $0[key] = nil })
            #expect(reason?.contains("missing field changes[0].\(key)") == true, "\(key): \(reason ?? "accepted")")
        }
        let null = Self.reason(Self.editing(0) { $0["size"] = NSNull() })
        #expect(null?.contains("changes[0].size is null") == true, "\(null ?? "accepted")")
    }

    @Test func contentRulesByKind() {
        func node(_ fields: [String: Any]) -> String? {
            Self.reason(Self.editing(1) { change in for (k, v) in fields { change[k] = v } })
        }
        #expect(node(["size": 4096])?.contains("a directory has size 0, not 4096") == true)
        #expect(node(["hash": Self.hash])?.contains("a directory has no content hash") == true)
        #expect(node(["chunked": true])?.contains("a directory has no content hash") == true)
        #expect(node(["kind": "symlink", "mode": 0o777])?.contains("a symlink needs a target") == true)
        #expect(node(["kind": "symlink", "target": ""])?.contains("symlink target is 0 bytes") == true)
        #expect(node(["kind": "symlink", "target": "abc", "size": 4])?.contains("size 4 is not the target's length 3") == true)
        #expect(node(["kind": "symlink", "target": String(repeating: "t", count: 4096), "size": 4096])?
            .contains("symlink target is 4096 bytes") == true)
        #expect(node(["kind": "symlink", "target": "a\u{0}b", "size": 3])?.contains("symlink target contains NUL") == true)
        #expect(node(["kind": "fifo", "rdev": 1])?.contains("a fifo has no device number") == true)
        #expect(node(["kind": "socket", "target": "x"])?.contains("a socket has no symlink target") == true)
        let file = Self.reason(Self.editing(0) { $0["hash"] = nil })
        #expect(file?.contains("size 5 with no content hash") == true, "\(file ?? "accepted")")
        let chunked = Self.reason(Self.editing(0) { $0["hash"] = nil; $0["size"] = 0; $0["chunked"] = true })
        #expect(chunked?.contains("chunked with no manifest hash") == true, "\(chunked ?? "accepted")")
    }

    // MARK: - Entries and deletions

    @Test(arguments: [
        (2, "parent", "\"../x\"", "entry parent \"../x\" is not a well-formed ID"),
        (2, "parent", "7", "changes[2].parent is not a string"),
        (2, "child", "\"has space\"", "entry child \"has space\" is not a well-formed ID"),
        (2, "child", "\"root\"", "entry names the root as a child"),
        (3, "child", "\"\(dirID)\"", "entry puts node \(dirID) inside itself"),
        (5, "id", "\"root\"", "deletes the root"),
        (5, "id", "\"\"", "deleted node ID \"\" is not well-formed"),
        (5, "base", "0", "deletion base 0 is not an earlier record"),
        (5, "base", "17", "deletion base 17 is not an earlier record"),
        (5, "base", "-1", "changes[5].base: -1 is negative"),
        (4, "op", "\"rename\"", "changes[4].op: unknown change \"rename\""),
    ])
    func badEntriesAndDeletions(index: Int, key: String, value: String, expected: String) {
        let reason = Self.reason(Self.editing(index) { $0[key] = Self.json(value) })
        #expect(reason?.contains(expected) == true, "\(key)=\(value): \(reason ?? "accepted")")
    }

    @Test func contradictionsWithinARecord() {
        var object = Self.record()
        var changes = object["changes"] as! [[String: Any]]
        changes.append(changes[0])
        object["changes"] = changes
        #expect(Self.reason(Self.data(object))?.contains("node \(Self.fileID) is described twice") == true)

        changes = Self.record()["changes"] as! [[String: Any]]
        changes.append(["op": "entry", "parent": "root", "name": "docs"])
        object["changes"] = changes
        #expect(Self.reason(Self.data(object))?.contains("is set twice") == true)

        changes = Self.record()["changes"] as! [[String: Any]]
        changes.append(["op": "delete", "id": Self.fileID, "base": 3])
        object["changes"] = changes
        #expect(Self.reason(Self.data(object))?.contains("node \(Self.fileID) is both described and deleted") == true)
    }

    // MARK: - Packs (record version 2)

    @Test func packLocationsAreChecked() throws {
        let pack = ContentCopy.hash(of: Data("a pack".utf8))
        func withPack(_ location: Any?, version: Int = 2, _ edit: (inout [String: Any]) -> Void = { _ in }) -> String? {
            var object = Self.record()
            object["version"] = version
            var changes = object["changes"] as! [[String: Any]]
            changes[0]["pack"] = location
            edit(&changes[0])
            object["changes"] = changes
            return Self.reason(Self.data(object))
        }
        #expect(withPack(["hash": pack, "offset": 100]) == nil)
        let decoded = try #require(JournalRecord(seq: Self.seq, data: {
            var object = Self.record()
            object["version"] = 2
            var changes = object["changes"] as! [[String: Any]]
            changes[0]["pack"] = ["hash": pack, "offset": 100]
            object["changes"] = changes
            return Self.data(object)
        }()).changeSet)
        guard case .node(let state) = decoded.changes[0] else { Issue.record("not a node"); return }
        #expect(state.pack == PackLocation(hash: pack, offset: 100))
        // A version 1 record cannot name packs (a version-1 reader would read the content as a blob).
        #expect(withPack(["hash": pack, "offset": 100], version: 1)?.contains("record version 1 cannot name packs") == true)
        #expect(withPack(["hash": "ABC", "offset": 0])?.contains("pack \"ABC\" is not 64 lower-case hex digits") == true)
        #expect(withPack(["hash": pack, "offset": -1])?.contains("offset: -1 is negative") == true)
        #expect(withPack(["hash": pack])?.contains("missing field") == true)
        #expect(withPack(["hash": pack, "offset": UInt64(PackLayout.maxPackSize) - 4])?.contains("lie beyond the largest pack") == true)
        #expect(withPack(["hash": pack, "offset": UInt64.max])?.contains("lie beyond the largest pack") == true)
        #expect(withPack(["hash": pack, "offset": 0]) { $0["chunked"] = true }?.contains("only a file's unchunked content can be in a pack") == true)
        #expect(withPack(["hash": pack, "offset": 0]) { $0["size"] = 1 << 20 }?.contains("cannot be in a pack") == true)
        #expect(withPack(["hash": pack, "offset": 0]) { $0["size"] = 0; $0["hash"] = nil }?.contains("only a file's unchunked content") == true)
        #expect(withPack("somewhere")?.contains("pack") == true)
    }

    @Test func aChangeSetNamingAPackIsWrittenAsVersionTwoOthersAsVersionOne() throws {
        let state = NodeState(id: Self.fileID, kind: .file, mode: 0o644, uid: 1, gid: 1, size: 5, hash: Self.hash, target: nil, rdev: 0,
                              mtime: Timespec(sec: 1, nsec: 0), ctime: Timespec(sec: 1, nsec: 0), btime: Timespec(sec: 1, nsec: 0),
                              xattrs: [:], base: 0)
        var packed = state
        packed.pack = PackLocation(hash: ContentCopy.hash(of: Data("p".utf8)), offset: 7)
        let plain = try ChangeSet(device: "d", deviceName: "d", changes: [.node(state)]).encodedRecord(seq: 1)
        #expect(JournalRecord(seq: 1, data: plain).changeSet?.version == 1)
        var changeSet = ChangeSet(device: "d", deviceName: "d", changes: [.node(state)])
        changeSet.changes = [.node(packed)]   // changed after it was made: the writer still picks version 2
        let data = try changeSet.encodedRecord(seq: 1)
        let read = try #require(JournalRecord(seq: 1, data: data).changeSet)
        #expect(read.version == 2)
        #expect(read.changes == [.node(packed)])
    }

    // MARK: - The record as a whole

    @Test func badRecords() {
        func with(_ key: String, _ value: Any?) -> String? {
            var object = Self.record()
            object[key] = value
            return Self.reason(Self.data(object))
        }
        #expect(with("version", 3)?.contains("record version 3 is not supported (this ubiquityfs reads versions 1 to 2)") == true)
        #expect(with("version", 2) == nil, "version 2 reads (it may name packs)")
        #expect(with("version", "1")?.contains("version is not an integer") == true)
        #expect(with("changes", nil)?.contains("missing field changes") == true)
        #expect(with("changes", "none")?.contains("changes is not an array") == true)
        #expect(with("device", "")?.contains("device ID \"\" is not well-formed") == true)
        #expect(with("device", "a/b")?.contains("device ID \"a/b\" is not well-formed") == true)
        #expect(with("deviceName", "")?.contains("device name is empty") == true)
        #expect(with("deviceName", "evil\u{1b}[2J")?.contains("device name contains a control character") == true)
        #expect(with("deviceName", String(repeating: "d", count: 256))?.contains("device name is 256 bytes") == true)
        #expect(with("date", "yesterday")?.contains("date is not an integer") == true)
    }

    @Test(arguments: ["", "{", "garbage", "{\"version\":1,\"device\":\"d\",\"deviceName\":\"d\",\"date\":0,\"changes\":[{\"op\":\"entry\",",
                      "\u{1}\u{2}\u{3}"])
    func notJSON(text: String) {
        let reason = Self.reason(Data(text.utf8))
        #expect(reason?.hasPrefix("not valid JSON") == true, "\(text.debugDescription): \(reason ?? "accepted")")
    }

    @Test func aTruncatedValidRecordIsRefused() {
        let data = Self.data(Self.record())
        for cut in [1, data.count / 2, data.count - 1] {
            #expect(Self.reason(data.prefix(cut)) != nil, "cut at \(cut)")
        }
        #expect(Self.reason(Self.data([1, 2])) == "not a JSON object")
    }

    @Test func reasonsArePrintable() throws {
        let reason = try #require(Self.reason(Self.editing(4) { $0["op"] = "x\u{1b}[31m\u{7}" + String(repeating: "y", count: 1000) }))
        #expect(!reason.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7f }, "\(reason.debugDescription)")
        #expect(reason.count < 500)
    }

    @Test func aRecordTooLargeIsRefusedUnread() {
        let reason = Self.reason(Data(count: RecordFormat.maxRecordBytes + 1))
        #expect(reason?.hasPrefix("record is \(RecordFormat.maxRecordBytes + 1) bytes") == true)
    }

    // MARK: - The folder store

    @Test func theFolderStoreReturnsWhatHoldsANumberAsInvalid() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-records-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        let store = try FolderStore(root: root, create: true, initializeEmpty: true)
        let id = "com.example.a"
        try store.createContainer(ContainerConfig(id: id, displayName: "A"))
        let journal = root.appendingPathComponent("containers/\(id)/journal")
        func path(_ seq: Int) -> String { journal.appendingPathComponent(String(format: "%016d", seq)).path }
        let good = ChangeSet(device: "d", deviceName: "d", changes: [.entry(parent: .root, name: "n", child: nil)])
        #expect(try store.commit(container: id, seq: 1, changeSet: good))
        try Data("{\"broken\"".utf8).write(to: URL(fileURLWithPath: path(2)))
        #expect(symlink("/etc/hostname", path(3)) == 0)
        #expect(mkdir(path(4), 0o700) == 0)
        #expect(mkfifo(path(5), 0o600) == 0)
        #expect(symlink("nowhere", path(6)) == 0)
        let records = try store.journal(container: id, after: 0, limit: 100)
        #expect(records.map(\.seq) == [1, 2, 3, 4, 5, 6])
        #expect(records[0].changeSet?.changes == good.changes)
        let reasons = records.dropFirst().map { record -> String in
            if case .invalid(let reason) = record.content { return reason }
            return "valid"
        }
        #expect(reasons[0].hasPrefix("not valid JSON"), "\(reasons[0])")
        #expect(reasons[1] == "a symbolic link, not a file")
        #expect(reasons[2] == "not a regular file")
        #expect(reasons[3] == "not a regular file")
        #expect(reasons[4] == "a symbolic link, not a file")
        // A number taken by any of them is not committed over.
        for seq in 2...6 { #expect(try !store.commit(container: id, seq: UInt64(seq), changeSet: good)) }
        #expect(try store.commit(container: id, seq: 7, changeSet: good))
    }

    /// The other files a store holds are checked as they are read too: a
    /// container's display name becomes a folder name on every drive, and
    /// the store ID a folder in every device's data home.
    @Test func containerConfigurationsAndTheMarkerAreChecked() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-records-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        let store = try FolderStore(root: root, create: true, initializeEmpty: true)
        for id in ["com.example.good", "com.example.slash", "com.example.nul", "com.example.other"] {
            try store.createContainer(ContainerConfig(id: id, displayName: "Fine"))
        }
        func damage(_ id: String, _ json: String) throws {
            try Data(json.utf8).write(to: root.appendingPathComponent("containers/\(id)/container.json"))
        }
        try damage("com.example.slash", #"{"id":"com.example.slash","displayName":"a/b","documentScopePublic":true,"supportedFolderLevels":"any"}"#)
        try damage("com.example.nul", #"{"id":"com.example.nul","displayName":"a\u0000b","documentScopePublic":true,"supportedFolderLevels":"any"}"#)
        try damage("com.example.other", #"{"id":"com.example.good","displayName":"Twin","documentScopePublic":true,"supportedFolderLevels":"any"}"#)
        let listing = try store.containers()
        #expect(listing.configs.map(\.id) == ["com.example.good"])
        let problems = Dictionary(uniqueKeysWithValues: listing.damaged.map { ($0.id, $0.problem) })
        #expect(problems["com.example.slash"]?.contains("invalid display name \"a/b\": it contains '/'") == true, "\(problems)")
        #expect(problems["com.example.nul"]?.contains("contains NUL") == true, "\(problems)")
        #expect(problems["com.example.other"]?.contains("its ID is \"com.example.good\"") == true, "\(problems)")
        #expect(throws: UbiquityError.self) { try store.createContainer(ContainerConfig(id: "com.example.x", displayName: "..")) }

        for storeID in ["..", "../../elsewhere", ""] {
            try Data(#"{"format":1,"storeID":"\#(storeID)"}"#.utf8).write(to: root.appendingPathComponent(FolderStore.markerName))
            let error = try #require(throws: UbiquityError.self) { _ = try FolderStore(root: root, create: false, initializeEmpty: false) }
            #expect(error.message.contains("is damaged"), "\(storeID): \(error)")
        }
    }
}

/// What a valid-looking record refers to, checked against the replica
/// before anything of it is applied (`ChangeApplier.problem`), and the
/// quarantine: recorded, persisted, skipped by the cursor and the committer.
@Suite struct QuarantineTests {
    static let container = TestDevice.container
    static let newID = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"

    /// Devices `a` and `b` on one store, `a` having pushed a folder `docs`
    /// with `docs/keep.txt`, and `keep.txt` at the root, all pulled by `b`.
    static func devices() throws -> (InMemoryStore, TestDevice, TestDevice) {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        try a.mkdir("docs")
        try a.write("docs/keep.txt", "kept")
        try a.write("keep.txt", "kept too")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.pull()
        return (store, a, b)
    }

    static func id(_ device: TestDevice, _ path: String) throws -> NodeID {
        let ino = try device.resolve(path)
        return device.replica.read { $0.node(ino)!.id }
    }

    static func fileState(_ id: NodeID, base: UInt64 = 0, kind: NodeKind = .file) -> NodeState {
        NodeState(id: id, kind: kind, mode: 0o644, uid: 0, gid: 0, size: 0, hash: nil, target: nil, rdev: 0,
                  mtime: .now(), ctime: .now(), btime: .now(), xattrs: [:], base: base)
    }

    /// Put `changes` as the next record, as a hostile client would (its own device ID).
    @discardableResult
    static func inject(_ store: InMemoryStore, _ changes: [Change]) throws -> UInt64 {
        let seq = store.journalHead(container: container) + 1
        let changeSet = ChangeSet(device: "hostile-client", deviceName: "hostile", changes: changes)
        #expect(store.putRecord(container: container, seq: seq, data: try JSONEncoder().encode(changeSet)))
        return seq
    }

    static func inject(_ store: InMemoryStore, raw: String) -> UInt64 {
        let seq = store.journalHead(container: container) + 1
        #expect(store.putRecord(container: container, seq: seq, data: Data(raw.utf8)))
        return seq
    }

    /// After a bad record, `b` still lists its tree, records the quarantine,
    /// and a change `a` makes next reaches it.
    static func expectQuarantined(_ seq: UInt64, _ reason: String, store: InMemoryStore, a: TestDevice, b: TestDevice,
                                  tree before: [String: String]) throws {
        try b.engine.pull()
        #expect(try b.tree() == before, "nothing of the record was applied")
        let quarantined = b.engine.quarantinedRecords
        #expect(quarantined.map(\.seq) == [seq])
        #expect(quarantined.first?.reason.contains(reason) == true, "\(quarantined)")
        #expect(b.replica.read { $0.appliedSeq } == seq, "the cursor moved past it")
        try a.write("after-\(seq).txt", "sync goes on")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.pull()
        #expect(try b.read("after-\(seq).txt") == "sync goes on")
    }

    @Test func anEntryInAnUnknownFolderIsQuarantinedWhole() throws {
        let (store, a, b) = try Self.devices()
        defer { a.cleanUp(); b.cleanUp() }
        let before = try b.tree()
        let seq = try Self.inject(store, [
            .node(Self.fileState(Self.newID)),
            .entry(parent: .root, name: "would-appear", child: Self.newID),
            .entry(parent: "ffffffff-0000-4000-8000-000000000000", name: "x", child: Self.newID),
        ])
        try Self.expectQuarantined(seq, "entry parent ffffffff-0000-4000-8000-000000000000 is not a known folder",
                                   store: store, a: a, b: b, tree: before)
    }

    @Test func anEntryNamingAnUnknownNodeCannotRemoveAFile() throws {
        let (store, a, b) = try Self.devices()
        defer { a.cleanUp(); b.cleanUp() }
        let before = try b.tree()
        let seq = try Self.inject(store, [.entry(parent: .root, name: "keep.txt", child: "not-a-node")])
        try Self.expectQuarantined(seq, "entry child not-a-node is not a known node", store: store, a: a, b: b, tree: before)
        #expect(try b.read("keep.txt") == "kept too")
    }

    @Test func anEntryInsideAFileIsQuarantined() throws {
        let (store, a, b) = try Self.devices()
        defer { a.cleanUp(); b.cleanUp() }
        let before = try b.tree()
        let file = try Self.id(b, "keep.txt")
        let seq = try Self.inject(store, [.node(Self.fileState(Self.newID)), .entry(parent: file, name: "x", child: Self.newID)])
        try Self.expectQuarantined(seq, "entry parent \(file) is a file, not a folder", store: store, a: a, b: b, tree: before)
    }

    @Test func aNodeChangingKindIsQuarantined() throws {
        let (store, a, b) = try Self.devices()
        defer { a.cleanUp(); b.cleanUp() }
        let before = try b.tree()
        let docs = try Self.id(b, "docs")
        let seq = try Self.inject(store, [.node(Self.fileState(docs, base: 1))])
        try Self.expectQuarantined(seq, "node \(docs) is a directory here, the record makes it a file",
                                   store: store, a: a, b: b, tree: before)
    }

    @Test func aBadRecordIsQuarantinedByEveryDeviceAndTheCommitterSkipsIt() throws {
        let (store, a, b) = try Self.devices()
        defer { a.cleanUp(); b.cleanUp() }
        let before = try b.tree()
        let seq = Self.inject(store, raw: #"{"device":"x","deviceName":"x","date":0,"changes":[{"op":"entry","parent":"root","name":"a/b"}]}"#)
        // `a` has not pulled it: its next commit takes the number, loses, pulls
        // (quarantining the record) and commits at the next free number.
        try a.write("pushed-over.txt", "x")
        try a.engine.drain(progress: { _, _ in })
        #expect(store.journalHead(container: Self.container) == seq + 1)
        #expect(a.engine.quarantinedRecords.map(\.seq) == [seq])
        #expect(a.engine.quarantinedRecords.first?.reason.hasPrefix("entry name contains '/'") == true)
        try b.engine.pull()
        #expect(b.engine.quarantinedRecords.map(\.seq) == [seq])
        var expected = before
        expected["pushed-over.txt"] = "file 644 x"
        #expect(try b.tree() == expected)
    }

    @Test func aQuarantineSurvivesARestartAndIsNotTriedAgain() throws {
        let store = InMemoryStore()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-core-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        var seq: UInt64 = 0
        do {
            let b = try TestDevice(store: store, name: "b", directory: directory)
            seq = Self.inject(store, raw: "{\"truncated\": ")
            try b.engine.pull()
            #expect(b.engine.quarantinedRecords.count == 1)
        }
        let again = try TestDevice(store: store, name: "b", directory: directory)
        let quarantined = again.engine.quarantinedRecords
        #expect(quarantined.map(\.seq) == [seq])
        #expect(quarantined.first?.reason.hasPrefix("not valid JSON") == true, "\(quarantined)")
        #expect(again.replica.read { $0.appliedSeq } == seq)
        try again.engine.pull()
        #expect(again.engine.quarantinedRecords.count == 1, "not tried (nor recorded) again")
    }

    /// Valid records that would put a folder inside itself: the applier breaks
    /// the cycle (nothing is quarantined) and every folder stays reachable.
    @Test func aCycleInOneRecordIsBroken() throws {
        let store = InMemoryStore()
        let a = try TestDevice(store: store, name: "a")
        let b = try TestDevice(store: store, name: "b")
        defer { a.cleanUp(); b.cleanUp() }
        try a.mkdir("x")
        try a.mkdir("y")
        try a.write("x/in-x", "1")
        try a.write("y/in-y", "2")
        try a.engine.drain(progress: { _, _ in })
        try b.engine.pull()
        let x = try Self.id(b, "x"), y = try Self.id(b, "y")
        try Self.inject(store, [
            .entry(parent: .root, name: "x", child: nil), .entry(parent: .root, name: "y", child: nil),
            .entry(parent: x, name: "y", child: y), .entry(parent: y, name: "x", child: x),
        ])
        try b.engine.pull()
        #expect(b.engine.quarantinedRecords.isEmpty)
        let tree = try b.tree()
        #expect(tree.keys.filter { $0.hasSuffix("in-x") }.count == 1 && tree.keys.filter { $0.hasSuffix("in-y") }.count == 1,
                "both folders reachable from the root: \(tree.keys.sorted())")
        try a.engine.pull()
        #expect(a.engine.quarantinedRecords.isEmpty)
        #expect(try a.tree() == tree)
    }

    /// Removing an entry of a folder this device no longer has, or deleting
    /// a node it never had, changes nothing and is no reason to quarantine.
    @Test func removalsOfUnknownThingsAreHarmless() throws {
        let (store, a, b) = try Self.devices()
        defer { a.cleanUp(); b.cleanUp() }
        let before = try b.tree()
        try Self.inject(store, [
            .entry(parent: "ffffffff-0000-4000-8000-000000000000", name: "x", child: nil),
            .deleteNode(id: "ffffffff-0000-4000-8000-000000000001", base: 1),
        ])
        try b.engine.pull()
        #expect(b.engine.quarantinedRecords.isEmpty)
        #expect(try b.tree() == before)
    }
}
