import Foundation

/// Journal records at the store boundary: written by the device that
/// commits them, decoded and checked by every device that reads them.
///
/// docs/STORE-FORMAT.md is the specification; this file is its one reader
/// and writer, shared by every store (folder, in-memory, S3 later).
///
/// A store is written by other machines, other versions, other programs —
/// or by anyone with write access to a shared folder. Nothing in a record
/// reaches a replica unchecked: `JournalRecord(seq:data:)` decodes the bytes
/// and checks every field (`ChangeSet.validate(seq:)`), alone and against
/// the others of its record. The verdict depends on the bytes only, so every
/// device reading a record reaches the same one. A record that fails carries
/// the reason instead of a change set, and the puller quarantines it
/// (`SyncEngine.pull`): it is never applied, not even in part, and sync
/// goes on after it. What depends on the replica (a parent that must be a
/// known folder) is checked when the record is applied
/// (`ChangeApplier.problem`).
///
/// The writer runs the same checks (`encodedRecord`): a device never
/// commits a record the others would refuse.
public enum RecordFormat {
    /// The newest version of the record format this code reads and writes.
    /// A record is written as version 1 unless it needs 2 (`ChangeSet.requiredVersion`:
    /// a node whose content is in a pack), so devices that read only
    /// version 1 keep reading every record they can.
    public static let version = 2
    /// The versions this code reads.
    public static let readableVersions = 1...2
    /// Longest record (bytes) a reader accepts: it is read whole into memory.
    public static let maxRecordBytes = 256 << 20
    /// Largest content size (1 PiB): far beyond any device's disk, and well
    /// within `off_t` and the integers other languages' JSON parsers read exactly.
    public static let maxContentSize: UInt64 = 1 << 50
    public static let maxNameBytes = 255
    /// Longest symlink target, as Linux's `PATH_MAX` - 1.
    public static let maxTargetBytes = 4095
    public static let maxXattrNameBytes = 255
    /// Largest extended attribute value, as Linux's `XATTR_SIZE_MAX`.
    public static let maxXattrValueBytes = 65536
    public static let maxIDBytes = 64
    public static let maxDeviceNameBytes = 255
    /// Permission bits, set-uid, set-gid and sticky: a mode carries no file type.
    public static let permissionBits: UInt32 = 0o7777

    /// A node, device or store ID: 1 to 64 ASCII letters, digits, `-`, `_`
    /// or `.`, not `.` or `..` (devices write lower-case UUIDs, and `root` /
    /// `documents`; a store ID names a folder in each device's data home).
    public static func isValidID(_ id: String) -> Bool {
        let bytes = id.utf8
        return !bytes.isEmpty && bytes.count <= maxIDBytes && id != "." && id != ".." && bytes.allSatisfy { b in
            (0x30...0x39).contains(b) || (0x41...0x5a).contains(b) || (0x61...0x7a).contains(b)
                || b == 0x2d || b == 0x5f || b == 0x2e
        }
    }

    /// Why `name` cannot be a directory entry, or nil if it can.
    public static func problem(name: FileName) -> String? {
        if name.isEmpty { return "is empty" }
        if name.bytes == [0x2e] { return "is '.'" }
        if name.bytes == [0x2e, 0x2e] { return "is '..'" }
        if name.bytes.contains(0x2f) { return "contains '/'" }
        if name.bytes.contains(0) { return "contains NUL" }
        if name.count > maxNameBytes { return "is \(name.count) bytes (at most \(maxNameBytes))" }
        return nil
    }

    /// Why `name` cannot be a device's name, or nil (1 to 255 bytes, no
    /// control characters: it is shown to people).
    public static func problem(deviceName name: String) -> String? {
        if name.isEmpty { return "is empty" }
        if name.utf8.count > maxDeviceNameBytes { return "is \(name.utf8.count) bytes (at most \(maxDeviceNameBytes))" }
        if name.unicodeScalars.contains(where: isControl) { return "contains a control character" }
        return nil
    }

    static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7f...0x9f).contains(scalar.value)
    }

    /// `text` safe to show in a terminal and a log line: control characters
    /// escaped, at most `limit` characters.
    public static func printable(_ text: String, limit: Int = 400) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            if out.unicodeScalars.count >= limit {
                out += "…"
                break
            }
            if isControl(scalar) {
                out += "\\u{\(String(scalar.value, radix: 16))}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// A value from a record, quoted for a reason (escaped, shortened).
    public static func quoted(_ text: String) -> String { "\"\(printable(text, limit: 40))\"" }
}

/// One journal record as a store holds it: the change set, or why the
/// bytes are not a valid one (the puller quarantines it).
public struct JournalRecord: Sendable {
    public enum Content: Sendable {
        case changeSet(ChangeSet)
        case invalid(reason: String)
    }

    public var seq: UInt64
    public var content: Content

    public init(seq: UInt64, content: Content) {
        self.seq = seq
        self.content = content
    }

    /// Decode and check the bytes of record `seq`. Never throws: a record
    /// that is not a valid change set is `.invalid` with the reason.
    public init(seq: UInt64, data: Data) {
        self.seq = seq
        do {
            content = .changeSet(try ChangeSet.decodeRecord(data, seq: seq))
        } catch {
            content = .invalid(reason: RecordFormat.printable(UbiquityError.wrap(error).message))
        }
    }

    public var changeSet: ChangeSet? {
        if case .changeSet(let changeSet) = content { return changeSet }
        return nil
    }
}

extension ChangeSet {
    /// The bytes of journal record `seq`: this change set, checked as every
    /// reader will check it (a device never commits what others would refuse).
    public func encodedRecord(seq: UInt64) throws -> Data {
        var record = self
        record.version = requiredVersion   // 1 unless it names packs
        do {
            try record.validate(seq: seq)
        } catch let error as UbiquityError {
            throw UbiquityError(EBADMSG, "this device's change set would be refused by every reader: \(error.message)")
        }
        // Sorted keys: the same change set is always the same bytes (an S3
        // commit whose answer was lost recognises its record by them).
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let data = try encoder.encode(record)
        guard data.count <= RecordFormat.maxRecordBytes else {
            throw UbiquityError(EFBIG, "change set of \(data.count) bytes is larger than a record may be (\(RecordFormat.maxRecordBytes))")
        }
        return data
    }

    /// Decode journal record `seq` and check every field; `EBADMSG` with the
    /// reason if it is not a valid change set.
    public static func decodeRecord(_ data: Data, seq: UInt64) throws -> ChangeSet {
        guard data.count <= RecordFormat.maxRecordBytes else {
            throw UbiquityError(EBADMSG, "record is \(data.count) bytes (at most \(RecordFormat.maxRecordBytes))")
        }
        let changeSet: ChangeSet
        do {
            changeSet = try JSONDecoder().decode(ChangeSet.self, from: data)
        } catch let error as DecodingError {
            throw UbiquityError(EBADMSG, Self.describe(error))
        }
        try changeSet.validate(seq: seq)
        return changeSet
    }

    /// Check every field of this change set as record `seq` (each alone and
    /// against the others of the record); `EBADMSG` naming the first problem.
    public func validate(seq: UInt64) throws {
        func fail(_ reason: String) -> UbiquityError { UbiquityError(EBADMSG, reason) }
        guard RecordFormat.readableVersions.contains(version) else { throw fail("record version \(version) is not supported") }
        if version < requiredVersion { throw fail("record version \(version) cannot name packs (version 2 can)") }
        guard RecordFormat.isValidID(device) else { throw fail("device ID \(RecordFormat.quoted(device)) is not well-formed") }
        if let problem = RecordFormat.problem(deviceName: deviceName) { throw fail("device name \(problem)") }
        var described = Set<NodeID>()
        var entryKeys = Set<EntryRef>()
        var deleted = Set<NodeID>()
        for (index, change) in changes.enumerated() {
            let at = " (change \(index + 1))"
            switch change {
            case .node(let state):
                if let problem = state.problem(seq: seq) { throw fail(problem + at) }
                guard described.insert(state.id).inserted else { throw fail("node \(state.id) is described twice\(at)") }
            case .entry(let parent, let name, let child):
                if let problem = RecordFormat.problem(name: name) { throw fail("entry name \(problem)\(at)") }
                guard RecordFormat.isValidID(parent) else { throw fail("entry parent \(RecordFormat.quoted(parent)) is not a well-formed ID\(at)") }
                if let child {
                    guard RecordFormat.isValidID(child) else { throw fail("entry child \(RecordFormat.quoted(child)) is not a well-formed ID\(at)") }
                    guard child != .root else { throw fail("entry names the root as a child\(at)") }
                    guard child != parent else { throw fail("entry puts node \(child) inside itself\(at)") }
                }
                guard entryKeys.insert(EntryRef(parent: parent, name: name)).inserted else {
                    throw fail("entry \(RecordFormat.quoted(name.description)) in \(parent) is set twice\(at)")
                }
            case .deleteNode(let id, let base):
                guard RecordFormat.isValidID(id) else { throw fail("deleted node ID \(RecordFormat.quoted(id)) is not well-formed\(at)") }
                guard id != .root else { throw fail("deletes the root\(at)") }
                guard base > 0, base < seq else { throw fail("deletion base \(base) is not an earlier record\(at)") }
                guard deleted.insert(id).inserted else { throw fail("node \(id) is deleted twice\(at)") }
            }
        }
        if let both = described.intersection(deleted).first { throw fail("node \(both) is both described and deleted") }
    }

    private struct EntryRef: Hashable {
        var parent: NodeID
        var name: FileName
    }

    /// A decoding error as a reason: where in the record, and what.
    static func describe(_ error: DecodingError) -> String {
        func path(_ keys: [any CodingKey]) -> String {
            var out = ""
            for key in keys {
                if let index = key.intValue { out += "[\(index)]" } else { out += (out.isEmpty ? "" : ".") + key.stringValue }
            }
            return out
        }
        func at(_ keys: [any CodingKey]) -> String { keys.isEmpty ? "" : "\(path(keys)): " }
        switch error {
        case .dataCorrupted(let context):
            if context.codingPath.isEmpty {
                return "not valid JSON (\(context.underlyingError.map { "\($0)" } ?? context.debugDescription))"
            }
            return at(context.codingPath) + context.debugDescription
        case .keyNotFound(let key, let context):
            return "missing field \(path(context.codingPath + [key]))"
        case .typeMismatch(let type, let context):
            return context.codingPath.isEmpty ? "not a JSON object" : "\(path(context.codingPath)) is not \(Self.typeName(type))"
        case .valueNotFound(let type, let context):
            return "\(path(context.codingPath)) is null, not \(Self.typeName(type))"
        @unknown default:
            return "\(error)"
        }
    }

    static func typeName(_ type: Any.Type) -> String {
        switch type {
        case is String.Type: return "a string"
        case is Bool.Type: return "true or false"
        case is Int.Type, is Int64.Type, is UInt64.Type, is UInt32.Type: return "an integer"
        case is [Any].Type, is [Change].Type, is [NodeID].Type: return "an array"
        default: return "a JSON object"
        }
    }
}

extension NodeState {
    /// Why this node state is not valid in record `seq`, or nil.
    func problem(seq: UInt64) -> String? {
        let node = "node \(RecordFormat.isValidID(id) ? id : RecordFormat.quoted(id))"
        guard RecordFormat.isValidID(id) else { return "\(node): ID is not well-formed" }
        if id == .root && kind != .directory { return "\(node): the root must be a directory, not a \(kind.rawValue)" }
        guard mode & ~RecordFormat.permissionBits == 0 else {
            return "\(node): mode \(String(mode, radix: 8)) has bits beyond the permissions (0o7777): a mode carries no file type"
        }
        guard uid != UInt32.max, gid != UInt32.max else { return "\(node): owner \(uid):\(gid) is not valid (-1 means none)" }
        guard size <= RecordFormat.maxContentSize else { return "\(node): size \(size) is larger than \(RecordFormat.maxContentSize)" }
        guard base < seq else { return "\(node): base \(base) is not an earlier record" }
        if let hash, !ContentHash.isValid(hash) {
            return "\(node): hash \(RecordFormat.quoted(hash)) is not 64 lower-case hex digits"
        }
        if rdev != 0 && kind != .charDevice && kind != .blockDevice { return "\(node): a \(kind.rawValue) has no device number" }
        switch kind {
        case .file:
            if hash == nil && size != 0 { return "\(node): size \(size) with no content hash" }
            if chunked == true && hash == nil { return "\(node): chunked with no manifest hash" }
            if target != nil { return "\(node): a file has no symlink target" }
        case .symlink:
            guard let target else { return "\(node): a symlink needs a target" }
            let bytes = target.utf8.count
            if bytes == 0 || bytes > RecordFormat.maxTargetBytes {
                return "\(node): symlink target is \(bytes) bytes (1 to \(RecordFormat.maxTargetBytes))"
            }
            if target.utf8.contains(0) { return "\(node): symlink target contains NUL" }
            if size != UInt64(bytes) { return "\(node): size \(size) is not the target's length \(bytes)" }
        case .directory, .fifo, .socket, .charDevice, .blockDevice:
            if size != 0 { return "\(node): a \(kind.rawValue) has size 0, not \(size)" }
            if target != nil { return "\(node): a \(kind.rawValue) has no symlink target" }
        }
        if kind != .file && (hash != nil || chunked == true) { return "\(node): a \(kind.rawValue) has no content hash" }
        for (name, value) in xattrs {
            let shown = RecordFormat.quoted(name)
            guard name.hasPrefix("user."), !name.hasPrefix("user.ubiquity.") else {
                return "\(node): extended attribute \(shown) is not in the user.* namespace (user.ubiquity.* is reserved)"
            }
            guard name.utf8.count <= RecordFormat.maxXattrNameBytes, !name.utf8.contains(0) else {
                return "\(node): extended attribute \(shown) is longer than \(RecordFormat.maxXattrNameBytes) bytes or contains NUL"
            }
            guard value.count <= RecordFormat.maxXattrValueBytes else {
                return "\(node): extended attribute \(shown) is \(value.count) bytes (at most \(RecordFormat.maxXattrValueBytes))"
            }
        }
        if let pack {
            guard kind == .file, hash != nil, chunked != true else { return "\(node): only a file's unchunked content can be in a pack" }
            guard ContentHash.isValid(pack.hash) else {
                return "\(node): pack \(RecordFormat.quoted(pack.hash)) is not 64 lower-case hex digits"
            }
            guard size > 0, size < UInt64(PackLayout.memberLimit) else {
                return "\(node): size \(size) cannot be in a pack (1 to \(PackLayout.memberLimit - 1) bytes)"
            }
            guard pack.offset <= UInt64(PackLayout.maxPackSize) - size else {
                return "\(node): bytes \(pack.offset) to \(pack.offset &+ size) lie beyond the largest pack (\(PackLayout.maxPackSize) bytes)"
            }
        }
        for copy in conflicts ?? [] where !RecordFormat.isValidID(copy) {
            return "\(node): conflict version \(RecordFormat.quoted(copy)) is not a well-formed ID"
        }
        return nil
    }
}
