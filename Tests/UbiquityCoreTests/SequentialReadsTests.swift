import Foundation
import Testing
@testable import UbiquityFS

/// What a reader of local content has the daemon ask the disk for ahead of
/// it (`SequentialReads`): a run, even out of order, asks; jumping about never.
@Suite struct SequentialReadsTests {
    @Test func aRunAsksAheadAndARandomReaderNever() {
        let piece = 512 << 10
        var run = SequentialReads()
        var asked: [Range<Int64>] = []
        // The kernel's read-ahead, two requests at a time out of order.
        for pair in stride(from: 0, to: 64, by: 2) {
            for i in [pair + 1, pair] {
                if let r = run.read(offset: Int64(i * piece), size: piece) { asked.append(r) }
            }
        }
        #expect(!asked.isEmpty)
        // Ranges follow one another, reach (within a step) 8 MiB past what was read, never asked twice.
        for (a, b) in zip(asked, asked.dropFirst()) { #expect(a.upperBound == b.lowerBound) }
        #expect((asked.last?.upperBound ?? 0) > Int64(64 * piece) + SequentialReads.ahead - SequentialReads.step)
        #expect(asked.allSatisfy { $0.count >= SequentialReads.step })

        // Random 512 KiB reads over 16 GiB: some fall close to the one before, none makes a run.
        var random = SequentialReads()
        var state: UInt64 = 7
        var askedAtRandom = 0
        for _ in 0..<100_000 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            if random.read(offset: Int64(state >> 30) & ~4095, size: piece) != nil { askedAtRandom += 1 }
        }
        #expect(askedAtRandom == 0)
    }
}
