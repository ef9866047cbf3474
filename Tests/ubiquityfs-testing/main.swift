// `ubiquityfs` with fault injection, for the mount tests (Tests/mount): the
// same command, whose daemon wraps its store in a `FaultyStore` when
// `UBIQUITYFS_FAULTS` says so. Built with the tests, never installed.
//
// UBIQUITYFS_FAULTS=fetch-delay=SECONDS makes every blob fetch slow,
// journal-delay=SECONDS every journal read (comma-separated).
// UBIQUITYFS_TEST_BOOT_ID=ID is the machine's boot identity (a simulated
// power cut then counts as a restart of the machine: Replica.openedAfterSystemCrash).
import Foundation
import UbiquityCLI
import UbiquityDaemon
import UbiquityReplica
import UbiquityModel
import UbiquityTesting

if let boot = ProcessInfo.processInfo.environment["UBIQUITYFS_TEST_BOOT_ID"], !boot.isEmpty {
    Replica.bootIdentity.withLock { $0 = { boot } }
}

if let spec = ProcessInfo.processInfo.environment["UBIQUITYFS_FAULTS"], !spec.isEmpty {
    var fetchDelay: Double?
    var journalDelay: Double?
    for item in spec.split(separator: ",") {
        let parts = item.split(separator: "=", maxSplits: 1).map(String.init)
        guard parts.count == 2, let seconds = Double(parts[1]), seconds >= 0 else {
            FileHandle.standardError.write(Data("ubiquityfs-testing: UBIQUITYFS_FAULTS: cannot read \(item)\n".utf8))
            exit(64)
        }
        switch parts[0] {
        case "fetch-delay": fetchDelay = seconds
        case "journal-delay": journalDelay = seconds
        default:
            FileHandle.standardError.write(Data("ubiquityfs-testing: UBIQUITYFS_FAULTS: no fault called \(parts[0])\n".utf8))
            exit(64)
        }
    }
    let (fetch, journal) = (fetchDelay, journalDelay)
    Daemon.wrapSyncStore.withLock { wrap in
        wrap = { store in
            let faulty = FaultyStore(store)
            if let fetch { faulty.slowFetches(by: fetch) }
            if let journal { faulty.slowJournalReads(by: journal) }
            return faulty
        }
    }
}
UbiquityCommand.main()
