import Foundation
import UbiquityModel
import UbiquityStore

/// How the core talks to the sync engine without depending on it.
public protocol SyncHooks: Sendable {
    /// Something changed locally that will need pushing.
    func localChangeRecorded()
    /// Start streaming the content of placeholder `ino`; returns the path of
    /// the file receiving it (to open for reading).
    func startDownload(ino: UInt64, background: Bool, keep: Bool) -> String
    /// A reader opened placeholder `ino` at version `version` (its hash)
    /// to stream it, or closed it.
    func beginStream(ino: UInt64, version: String?)
    func endStream(ino: UInt64, version: String?)
    /// Wait until bytes `from..<upTo` of version `version` of `ino` are
    /// downloaded and verified, or throw `EIO`; the chunks of a short range
    /// are fetched before any other. The parts held in memory for streaming
    /// readers are returned, pinned (none: all in the file being downloaded).
    /// `beforeWaiting` runs once, before the first wait.
    func waitToRead(ino: UInt64, version: String?, from: UInt64, upTo: UInt64, beforeWaiting: () -> Void) throws -> [PinnedBytes]
    /// Download all of `ino` and wait for it, or throw `EIO`.
    func download(ino: UInt64, beforeWaiting: () -> Void) throws
    /// The value of a read-only `user.ubiquity.*` status attribute, or nil.
    func statusAttribute(ino: UInt64, name: String) -> Data?
}
