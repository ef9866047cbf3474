// The book's Listing 18-1, "Monitoring iCloud" (Erica Sadun, The iOS 5
// Developer's Cookbook, "Metadata Queries and the Cloud"), in Swift, as a
// command-line program: start and stop monitoring a ubiquitous folder scope,
// telling an informal delegate the file names whenever the contents change.
// Where it differs from the seed (Objective-C, iOS 5), a comment says why.
//
//   ubiquitykit-folder-monitor [CONTAINER-ID] [documents|data|both] [SECONDS]
//
// Prints "Contents changed …" and the names after every update; stops
// monitoring after SECONDS (default: never) and says so.
import UbiquityKit

protocol FolderMonitorDelegate: AnyObject {
    func folderContentsHaveChanged(_ names: [String])
}

final class FolderMonitor {
    var query: NSMetadataQuery?
    weak var delegate: FolderMonitorDelegate?
    var observer: NSObjectProtocol?
    let scopes: [Any]

    init(scopes: [Any]) { self.scopes = scopes }

    func startMonitoringUbiquitousDocumentsFolder() {
        // Remove any existing query – stored in local instance variable
        if let query { query.stop() }
        // Search for all file names
        let query = NSMetadataQuery()
        self.query = query
        query.predicate = NSPredicate(format: "NSMetadataItemFSNameKey == '*'")
        // The seed searches the Documents scope; the command line picks (an empty array: both).
        query.searchScopes = scopes
        // Subscribe to query updates
        observer = NotificationCenter.default.addObserver(forName: .NSMetadataQueryDidUpdate, object: nil, queue: .main) { [unowned self] _ in
            print("Contents changed in ubiquitous documents folder")   // NSLog in the seed
            // disable the query while iterating through its results
            query.disableUpdates()
            var array: [String] = []
            for case let item as NSMetadataItem in query.results {
                array.append(item.value(forAttribute: NSMetadataItemFSNameKey) as! String)
            }
            query.enableUpdates()
            // use an informal delegate callback with file names (Swift: a protocol, no selector)
            delegate?.folderContentsHaveChanged(array)
        }
        query.start()
    }

    func stopMonitoringUbiquitousDocumentsFolder() {
        if let observer { NotificationCenter.default.removeObserver(observer) }
        query?.stop()
        query = nil
    }
}

final class Printer: FolderMonitorDelegate {
    func folderContentsHaveChanged(_ names: [String]) { print("names=[\(names.sorted().joined(separator: ","))]") }
}

let arguments = CommandLine.arguments
if arguments.count > 1 { UbiquityContainers.declare([arguments[1]]) }
let scopes: [Any] = switch arguments.count > 2 ? arguments[2] : "documents" {
case "data": [NSMetadataQueryUbiquitousDataScope]
case "both": []
default: [NSMetadataQueryUbiquitousDocumentsScope]
}
setvbuf(stdout, nil, _IOLBF, 0)
let printer = Printer()
let monitor = FolderMonitor(scopes: scopes)
monitor.delegate = printer
monitor.startMonitoringUbiquitousDocumentsFolder()
if arguments.count > 3, let seconds = Double(arguments[3]) {
    DispatchQueue.main.asyncAfter(deadline: .now() + seconds) {
        monitor.stopMonitoringUbiquitousDocumentsFolder()
        print("stopped")
    }
}
dispatchMain()
