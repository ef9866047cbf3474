import Foundation
import Testing
@testable import UbiquityReplica
#if canImport(Glibc)
import Glibc
#endif

/// Emptied cache files kept for new files (`SpareCacheFiles`): bounded,
/// found again after a restart, and never handed out twice.
@Suite struct SpareCacheFilesTests {
    @Test func sparesAreBoundedFoundAgainAndTakenOnce() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-spares-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        mkdir(root, 0o700)
        let spareDirectory = root + "/spare"
        func file(_ name: String, _ text: String) -> String {
            let path = root + "/" + name
            #expect(FileManager.default.createFile(atPath: path, contents: Data(text.utf8)))
            return path
        }
        let spares = SpareCacheFiles(directoryPath: spareDirectory, limit: 2)
        for name in ["a", "b", "c"] { spares.retire(file(name, "content of \(name)")) }
        spares.retire(root + "/missing")   // a directory or a placeholder has no cache file
        #expect(spares.count == 2)
        for name in ["a", "b", "c"] { #expect(!FileManager.default.fileExists(atPath: root + "/" + name)) }
        let kept = try FileManager.default.contentsOfDirectory(atPath: spareDirectory)
        #expect(kept.count == 2)
        for name in kept {
            #expect((try FileManager.default.attributesOfItem(atPath: spareDirectory + "/" + name))[.size] as? Int == 0)
        }

        // After a restart: the two spares again; anything else there is removed.
        #expect(FileManager.default.createFile(atPath: spareDirectory + "/stray.tmp", contents: Data("x".utf8)))
        let again = SpareCacheFiles(directoryPath: spareDirectory, limit: 2)
        #expect(again.count == 2)
        #expect(!FileManager.default.fileExists(atPath: spareDirectory + "/stray.tmp"))
        #expect(again.take(to: root + "/shard/new1"))   // its directory is made
        #expect(again.take(to: root + "/shard/new2"))
        #expect(!again.take(to: root + "/shard/new3"))
        #expect(FileManager.default.fileExists(atPath: root + "/shard/new1"))
        #expect(FileManager.default.fileExists(atPath: root + "/shard/new2"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: spareDirectory).isEmpty)
        // A name retired after a restart does not reuse one still in use.
        again.retire(file("d", "d"))
        again.retire(file("e", "e"))
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: spareDirectory)).count == 2)
    }

    /// Spares made ahead: `ahead` of them in the background, empty and
    /// distinct; taking below a quarter of that makes more.
    @Test func sparesAreMadeAheadAndToppedUp() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-spares-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        mkdir(root, 0o700)
        let spares = SpareCacheFiles(directoryPath: root + "/spare", ahead: 40)
        func waitFor(_ count: Int) -> Bool {
            for _ in 0..<500 where spares.count != count { usleep(10_000) }
            return spares.count == count
        }
        spares.fillAhead()
        #expect(waitFor(40))
        let made = try FileManager.default.contentsOfDirectory(atPath: root + "/spare")
        #expect(made.count == 40)
        for name in made { #expect((try FileManager.default.attributesOfItem(atPath: root + "/spare/" + name))[.size] as? Int == 0) }
        // Down to 10 (the quarter): the next take starts a refill back to 40.
        for index in 0..<30 { #expect(spares.take(to: root + "/taken/\(index)")) }
        #expect(spares.take(to: root + "/taken/30"))
        #expect(waitFor(40))
        #expect(try FileManager.default.contentsOfDirectory(atPath: root + "/taken").count == 31)
        // None made ahead unless asked.
        let plain = SpareCacheFiles(directoryPath: root + "/other")
        plain.fillAhead()
        usleep(50_000)
        #expect(plain.count == 0)
    }
}
