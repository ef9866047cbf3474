import CHashLanes
import Crypto
import Foundation
import UbiquityModel

/// Chunks verified two at a time, in one thread.
///
/// A stream of a large placeholder on a folder store is bound by the CPU,
/// and SHA-256 was the largest part of it (38 % of all samples on 2 CPUs).
/// One SHA-256 stream waits on the latency of each `sha256rnds2`; two
/// independent ones, interleaved (`CHashLanes`), hash 2,860–2,900 MiB/s on
/// this machine's CPU where one stream hashes 1,720–1,730 — the same bytes
/// for 60 % of the CPU.
///
/// The download workers each read one chunk, so the pairs are made here:
/// a worker about to read a chunk says so (`expect`); one whose chunk is
/// read hashes it together with a chunk already waiting, if any, and hands
/// the waiting worker its digest; if none waits but another worker is still
/// reading, it waits for that one (sleeping, not spinning) for at most
/// `patience`, and otherwise hashes alone. Where the CPU lacks the SHA
/// extensions, every chunk is hashed alone with swift-crypto.
public final class HashPairs: @unchecked Sendable {
    public static let shared = HashPairs()

    /// How long a read chunk waits for a partner still being read (a 4 MiB
    /// direct read takes 3–8 ms here).
    let patience: TimeInterval

    init(patience: TimeInterval = 0.02) {
        self.patience = patience
    }

    public static let lanesAvailable = ubq_sha256_lanes_available() == 1

    private let condition = NSCondition()
    /// Guarded by `condition`: chunks being read that will be hashed here.
    private var coming = 0
    /// The chunk waiting for a partner (its ticket and bytes).
    private var waiting: (ticket: UInt64, bytes: UnsafeRawBufferPointer)?
    /// Digests a partner computed, by ticket.
    private var done: [UInt64: String] = [:]
    private var nextTicket: UInt64 = 1
    /// Guarded by `condition`: chunks hashed in pairs and alone, since start.
    private var paired = 0
    private var alone = 0

    /// Chunks hashed in pairs and alone so far.
    public var counts: (paired: Int, alone: Int) {
        condition.lock()
        defer { condition.unlock() }
        return (paired, alone)
    }

    /// A chunk is about to be read, and then hashed with `digest`, or `cancel`led.
    public func expect() {
        condition.lock()
        coming += 1
        condition.unlock()
    }

    /// The chunk `expect`ed will not be hashed (its read failed).
    public func cancel() {
        condition.lock()
        coming -= 1
        condition.broadcast()
        condition.unlock()
    }

    /// The SHA-256 name (lower-case hex) of `bytes`, an `expect`ed chunk.
    public func digest(of bytes: UnsafeRawBufferPointer) -> String {
        condition.lock()
        coming -= 1
        guard Self.lanesAvailable else {
            alone += 1
            condition.unlock()
            return Self.alone(bytes)
        }
        if let partner = waiting {
            waiting = nil
            paired += 2
            condition.unlock()
            let (mine, theirs) = Self.two(bytes, partner.bytes)
            condition.lock()
            done[partner.ticket] = theirs
            condition.broadcast()
            condition.unlock()
            return mine
        }
        guard coming > 0 else {
            alone += 1
            condition.unlock()
            return Self.alone(bytes)
        }
        let ticket = nextTicket
        nextTicket += 1
        waiting = (ticket, bytes)
        let deadline = Date().addingTimeInterval(patience)
        while true {
            if let digest = done.removeValue(forKey: ticket) {
                condition.unlock()
                return digest
            }
            let stillWaiting = waiting?.ticket == ticket
            // Not taken yet: give up at the deadline, or when nobody else is reading.
            if stillWaiting && (coming == 0 || !condition.wait(until: deadline)) {
                if waiting?.ticket == ticket {
                    waiting = nil
                    alone += 1
                    condition.unlock()
                    return Self.alone(bytes)
                }
            } else if !stillWaiting {
                condition.wait()   // a partner is hashing it
            }
        }
    }

    static func alone(_ bytes: UnsafeRawBufferPointer) -> String {
        ContentCopy.hex(SHA256.hash(data: bytes))
    }

    /// Both digests, the two messages hashed side by side.
    static func two(_ first: UnsafeRawBufferPointer, _ second: UnsafeRawBufferPointer) -> (String, String) {
        var a = [UInt8](repeating: 0, count: 32)
        var b = [UInt8](repeating: 0, count: 32)
        let status = a.withUnsafeMutableBufferPointer { a in
            b.withUnsafeMutableBufferPointer { b in
                ubq_sha256_two(first.baseAddress, first.count, a.baseAddress, second.baseAddress, second.count, b.baseAddress)
            }
        }
        guard status == 0 else { return (alone(first), alone(second)) }
        return (ContentCopy.hex(a), ContentCopy.hex(b))
    }
}
