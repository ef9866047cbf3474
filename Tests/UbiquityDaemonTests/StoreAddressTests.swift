import Foundation
import Testing
@testable import UbiquityDaemon
import UbiquityReplica
#if canImport(Glibc)
import Glibc
#endif

/// The known-store marker (`known-stores/HASH` in the data home) stops an
/// emptied store from being taken for a new one: failing to read or write it
/// is an error, never "no marker".
@Suite struct StoreAddressTests {
    func dataHome() -> Locations {
        var locations = Locations(environment: [:])
        locations.dataHome = FileManager.default.temporaryDirectory.appendingPathComponent("ubq-address-\(UUID().uuidString)")
        try? FileManager.default.createDirectory(at: locations.dataHome, withIntermediateDirectories: true)
        return locations
    }

    @Test func aMarkerThatCannotBeReadIsAnErrorNotNone() throws {
        let locations = dataHome()
        defer { try? FileManager.default.removeItem(at: locations.dataHome) }
        let address = StoreAddress(url: "/srv/store")
        #expect(try address.readKnownStoreID(locations) == nil)
        try address.recordStoreID("store-1", locations)
        #expect(try address.readKnownStoreID(locations) == "store-1")
        // The marker becomes unreadable (here: a folder in its place).
        let marker = address.knownStoreFile(locations)
        try FileManager.default.removeItem(at: marker)
        try FileManager.default.createDirectory(at: marker, withIntermediateDirectories: false)
        #expect(throws: (any Error).self) { try address.readKnownStoreID(locations) }
    }

    @Test func aMarkerThatCannotBeWrittenIsAnError() throws {
        let locations = dataHome()
        defer { try? FileManager.default.removeItem(at: locations.dataHome) }
        // A file where the markers' folder goes.
        #expect(FileManager.default.createFile(atPath: locations.dataHome.appendingPathComponent("known-stores").path, contents: Data()))
        let address = StoreAddress(url: "/srv/store")
        #expect(throws: (any Error).self) { try address.recordStoreID("store-1", locations) }
        let reported = address.rememberStoreID("store-1", locations)
        #expect(reported != nil)
    }
}
