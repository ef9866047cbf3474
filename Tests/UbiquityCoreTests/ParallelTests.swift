import Foundation
import Synchronization
import Testing
import CLinux
import UbiquityModel
@testable import UbiquityStore

/// `Parallel.map`: results in order, callers running at once share one
/// bounded set of helper threads, and a call made from inside another
/// call's work still finishes.
@Suite(.serialized) struct ParallelTests {
    /// Threads of this process named `name` (as `top -H` shows them).
    static func threads(named name: String) -> Int {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.filter { tid in
            (try? String(contentsOfFile: "/proc/self/task/\(tid)/comm", encoding: .utf8))?
                .trimmingCharacters(in: .whitespacesAndNewlines) == name
        }.count
    }

    @Test func resultsComeBackInOrder() {
        let items = Array(0..<500)
        let doubled = Parallel.map(items, width: 8) { item -> Int in
            if item % 50 == 0 { usleep(2_000) }   // some items finish late
            return item * 2
        }
        #expect(doubled == items.map { $0 * 2 })
    }

    @Test func callersAtOnceShareTheBoundedHelpers() {
        let peak = Atomic<Int>(0)
        let running = Atomic<Int>(0)
        let callers = 12
        let done = DispatchSemaphore(value: 0)
        for caller in 0..<callers {
            let thread = Thread {
                let results = Parallel.map(Array(0..<40), width: 16) { item -> Int in
                    let now = running.add(1, ordering: .relaxed).newValue
                    peak.max(now, ordering: .relaxed)
                    usleep(3_000)
                    running.subtract(1, ordering: .relaxed)
                    return item + caller
                }
                #expect(results == (0..<40).map { $0 + caller })
                done.signal()
            }
            thread.start()
        }
        // Sample while the callers work: never more helpers than the pool's
        // limit. (Other suites running meanwhile use the pools too, so each
        // pool's own count is checked, not the process's `ubq-io` threads;
        // and the callers use the lowered pool if the thread that started
        // them was lowered by another test: threads inherit their nice value.)
        var mostHelpers = 0
        var named = 0
        var finished = 0
        while finished < callers {
            mostHelpers = max(mostHelpers, HelperPool.foreground.threadCount, HelperPool.lowered.threadCount)
            named = max(named, Self.threads(named: "ubq-io"))
            if done.wait(timeout: .now() + .milliseconds(5)) == .success { finished += 1 }
        }
        #expect(mostHelpers > 0, "no helper thread was seen: the work ran on the callers alone")
        #expect(named > 0, "no thread named ubq-io: the helpers' name does not reach Linux")
        #expect(mostHelpers <= HelperPool.limit, "\(mostHelpers) helper threads for \(callers) callers at once")
        // Items in flight: at most the helpers and the callers themselves.
        #expect(peak.load(ordering: .relaxed) <= HelperPool.limit + callers)
    }

    @Test func aCallInsideAnotherCallsWorkFinishes() {
        let sums = Parallel.map(Array(0..<20), width: 16) { outer -> Int in
            Parallel.map(Array(0..<20), width: 16) { inner in outer * inner }.reduce(0, +)
        }
        #expect(sums == (0..<20).map { $0 * 190 })
    }

    /// Every thread `Thread.run(named:)` starts carries its name from its
    /// first instruction, however soon it runs: the thread starts a FUSE
    /// loop whose workers inherit the name, which is how `top -H` and the
    /// mount tests tell them apart. (Foundation's own `Thread.name` lost
    /// the race with `start` now and then, and the thread ran unnamed.)
    @Test func aThreadIsNamedFromItsFirstInstruction() {
        let count = 300
        let unnamed = Atomic<Int>(0)
        let done = DispatchSemaphore(value: 0)
        for _ in 0..<count {
            Thread.run(named: "ubq-test-name") {
                let comm = try? String(contentsOfFile: "/proc/self/task/\(ubq_gettid())/comm", encoding: .utf8)
                if comm?.trimmingCharacters(in: .whitespacesAndNewlines) != "ubq-test-name" {
                    unnamed.add(1, ordering: .relaxed)
                }
                done.signal()
            }
        }
        for _ in 0..<count { done.wait() }
        #expect(unnamed.load(ordering: .relaxed) == 0, "threads that ran unnamed")
    }
}
