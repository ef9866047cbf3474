import Crypto
import Foundation
import UbiquityLocks
import Testing
import UbiquityModel
@testable import UbiquityStore

/// Chunks hashed two at a time (`HashPairs`, `CHashLanes`): every digest is
/// SHA-256's, whatever the two lengths, and workers whose reads overlap are
/// paired; one alone is not kept waiting.
@Suite struct HashPairsTests {
    static func sha256(_ bytes: [UInt8]) -> String {
        ContentCopy.hex(SHA256.hash(data: bytes))
    }

    @Test func twoLanesGiveSHA256OfEachMessageWhateverTheLengths() throws {
        var generator = SystemRandomNumberGenerator()
        let big = (0..<(4 << 20) + 77).map { _ in UInt8.random(in: 0...255, using: &generator) }
        // Around the block (64) and padding (55, 56) boundaries, and chunks.
        let lengths = [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000, 4096, 256 << 10, (4 << 20) + 77]
        for first in lengths {
            for second in lengths {
                let a = Array(big[0..<first])
                let b = Array(big[(big.count - second)...])
                let (x, y) = a.withUnsafeBytes { a in b.withUnsafeBytes { b in HashPairs.two(a, b) } }
                #expect(x == Self.sha256(a), "first of \(first), \(second)")
                #expect(y == Self.sha256(b), "second of \(first), \(second)")
            }
        }
    }

    @Test func chunksReadAtTheSameTimeAreHashedInPairs() throws {
        // Patient enough that a busy machine's scheduling cannot split a pair.
        let pairs = HashPairs(patience: 60)
        let chunks = (0..<8).map { i in (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* (i + 3)) } }
        // Every worker says it is reading before any hashes, as overlapping reads do.
        for _ in chunks { pairs.expect() }
        let digests = Lock<[Int: String]>([:])
        let finished = DispatchGroup()
        for (i, chunk) in chunks.enumerated() {
            finished.enter()
            Thread.detachNewThread {
                let digest = chunk.withUnsafeBytes { pairs.digest(of: $0) }
                digests.withLock { $0[i] = digest }
                finished.leave()
            }
        }
        finished.wait()
        for (i, chunk) in chunks.enumerated() {
            #expect(digests.withLock { $0[i] } == Self.sha256(chunk))
        }
        let counts = pairs.counts
        #expect(counts.paired + counts.alone == chunks.count)
        if HashPairs.lanesAvailable {
            #expect(counts.paired == chunks.count, "a worker hashed alone although another was still to come")
        }
    }

    @Test func aChunkAloneIsNotKeptWaiting() throws {
        let pairs = HashPairs()
        let chunk = [UInt8](repeating: 7, count: 1 << 20)
        // Nobody else reading: hashed at once.
        pairs.expect()
        let started = Date()
        #expect(chunk.withUnsafeBytes { pairs.digest(of: $0) } == Self.sha256(chunk))
        // Another said it reads, then its read failed: the waiting one goes on.
        pairs.expect()
        pairs.expect()
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.005) { pairs.cancel() }
        #expect(chunk.withUnsafeBytes { pairs.digest(of: $0) } == Self.sha256(chunk))
        // A partner that never comes: hashed alone after the patience.
        pairs.expect()
        pairs.expect()
        #expect(chunk.withUnsafeBytes { pairs.digest(of: $0) } == Self.sha256(chunk))
        pairs.cancel()
        #expect(Date().timeIntervalSince(started) < 10 * pairs.patience + 1)
        #expect(pairs.counts.paired == 0)
        #expect(pairs.counts.alone == 3)
    }
}
