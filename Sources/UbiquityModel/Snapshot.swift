import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Snapshots: a container's whole state at one journal record, so that a
/// new device reads its current tree instead of replaying every record
/// since the container was made (a year of small commits is tens of
/// thousands of records: as many GETs on S3).
///
/// A snapshot is a small *snapshot record* in the container
/// (`snapshots/SEQ`, created exclusively like a journal record) naming
/// *parts*: blobs, content-addressed and verified like file content, each
/// a `SnapshotPart` — a change set that describes nodes and the entries
/// naming them, parents before children, so parts apply one after another.
/// In a part, a node's `base` is its version (the record that last changed
/// it), and `authors` says which device made each file's content.
///
/// Snapshots are an optimisation only: the journal is never cut, a device
/// that cannot use a snapshot (damaged, missing part, other version)
/// replays the journal as before, and a device writes a snapshot only when
/// its replica holds exactly the store's state at that record (caught up,
/// nothing of its own left to push). The format is in docs/STORE-FORMAT.md.
public struct SnapshotRecord: Codable, Sendable, Equatable {
    public static let formatVersion = 1
    /// The most parts a snapshot may name (each at most one chunk): 8 GiB of
    /// description, far beyond the largest container a device can hold.
    public static let maxParts = 2048

    public var version: Int
    /// The journal record whose state this is (every record up to it applied).
    public var seq: UInt64
    public var device: String
    public var deviceName: String
    public var date: Timespec
    /// Nodes described, the root included.
    public var nodes: Int
    /// SHA-256 of each part blob, in the order they apply.
    public var parts: [String]

    public init(seq: UInt64, device: String, deviceName: String, date: Timespec = .now(), nodes: Int, parts: [String]) {
        self.version = Self.formatVersion
        self.seq = seq
        self.device = device
        self.deviceName = deviceName
        self.date = date
        self.nodes = nodes
        self.parts = parts
    }

    /// The bytes stored: sorted keys, so the same snapshot is the same bytes.
    public func encoded() throws -> Data {
        try validate(seq: seq)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return try encoder.encode(self)
    }

    /// Decode snapshot record `seq` (its key's number) and check it; `EBADMSG` with the reason.
    public static func decode(_ data: Data, seq: UInt64) throws -> SnapshotRecord {
        guard data.count <= 1 << 20 else { throw UbiquityError(EBADMSG, "snapshot record \(seq) is \(data.count) bytes (at most 1 MiB)") }
        let record: SnapshotRecord
        do {
            record = try JSONDecoder().decode(SnapshotRecord.self, from: data)
        } catch let error as DecodingError {
            throw UbiquityError(EBADMSG, "snapshot record \(seq): \(ChangeSet.describe(error))")
        }
        try record.validate(seq: seq)
        return record
    }

    func validate(seq expected: UInt64) throws {
        func fail(_ reason: String) -> UbiquityError { UbiquityError(EBADMSG, "snapshot record \(expected): \(reason)") }
        guard version == Self.formatVersion else { throw fail("version \(version) is not supported (this ubiquityfs reads version \(Self.formatVersion))") }
        guard seq == expected, seq > 0 else { throw fail("it says it is of record \(seq)") }
        guard RecordFormat.isValidID(device) else { throw fail("device ID \(RecordFormat.quoted(device)) is not well-formed") }
        if let problem = RecordFormat.problem(deviceName: deviceName) { throw fail("device name \(problem)") }
        guard nodes > 0 else { throw fail("it describes \(nodes) nodes") }
        guard !parts.isEmpty, parts.count <= Self.maxParts else { throw fail("it has \(parts.count) parts (1 to \(Self.maxParts))") }
        guard parts.allSatisfy(ContentHash.isValid) else { throw fail("a part is not named by a SHA-256") }
    }
}

/// One part of a snapshot: nodes and the entries that name them.
public struct SnapshotPart: Codable, Sendable {
    /// Nodes (with `base` = their version) and entries, as a change set of
    /// the device that wrote the snapshot.
    public var changeSet: ChangeSet
    /// The device name that made each file's current content, by node ID.
    public var authors: [NodeID: String]

    public init(changeSet: ChangeSet, authors: [NodeID: String]) {
        self.changeSet = changeSet
        self.authors = authors
    }

    public func encoded() throws -> Data {
        var part = self
        part.changeSet.version = changeSet.requiredVersion   // 2 when it names packs
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return try encoder.encode(part)
    }

    /// Decode and check part `index` of the snapshot of record `seq`: every
    /// field as a journal record's (`ChangeSet.validate`), no deletion, no
    /// version after `seq`.
    public static func decode(_ data: Data, index: Int, seq: UInt64) throws -> SnapshotPart {
        func fail(_ reason: String) -> UbiquityError { UbiquityError(EBADMSG, "part \(index + 1) of snapshot \(seq): \(reason)") }
        let part: SnapshotPart
        do {
            part = try JSONDecoder().decode(SnapshotPart.self, from: data)
            try part.changeSet.validate(seq: seq + 1)
        } catch let error as DecodingError {
            throw fail(ChangeSet.describe(error))
        } catch {
            throw fail(UbiquityError.wrap(error).message)
        }
        for change in part.changeSet.changes {
            if case .deleteNode = change { throw fail("it deletes a node") }
        }
        for (id, name) in part.authors {
            guard RecordFormat.isValidID(id) else { throw fail("author of \(RecordFormat.quoted(id)), not a well-formed ID") }
            if let problem = RecordFormat.problem(deviceName: name) { throw fail("author name \(problem)") }
        }
        return part
    }
}
