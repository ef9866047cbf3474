// Apple's "Searching for iCloud Documents" (the Simple Text Editor tutorial's
// STEMasterViewController), in Swift, as a command-line program: a query for
// the text documents of the Documents scope, started at launch and left
// running; the list is rebuilt on every notification. Where it differs from
// the seed (Objective-C, a table view), a comment says why.
//
//   ubiquitykit-document-list [CONTAINER-ID] [EXTENSION]
//
// Prints the document list after gathering and after each update, and each
// update's added, changed and removed items.
import UbiquityKit

let STEDocFilenameExtension = CommandLine.arguments.count > 2 ? CommandLine.arguments[2] : "txt"

final class STEMasterViewController: NSObject {
    var documents: [URL] = []
    var _query: NSMetadataQuery?
    var observers: [NSObjectProtocol] = []

    func textDocumentQuery() -> NSMetadataQuery {
        let aQuery = NSMetadataQuery()
        // Search the Documents subdirectory only.
        aQuery.searchScopes = [NSMetadataQueryUbiquitousDocumentsScope]
        // Add a predicate for finding the documents.
        let filePattern = "*.\(STEDocFilenameExtension)"
        aQuery.predicate = NSPredicate(format: "%K LIKE %@", NSMetadataItemFSNameKey, filePattern)
        return aQuery
    }

    func setupAndStartQuery() {
        // Create the query object if it does not exist.
        if _query == nil {
            _query = textDocumentQuery()
        }
        // Register for the metadata query notifications. (Linux has no
        // Objective-C selectors: the block-based observer does the same.)
        for name in [NSNotification.Name.NSMetadataQueryDidFinishGathering, .NSMetadataQueryDidUpdate] {
            observers.append(NotificationCenter.default.addObserver(forName: name, object: nil, queue: .main) { [unowned self] note in
                processFiles(note)
            })
        }
        // Start the query and let it run.
        _query!.start()
    }

    func processFiles(_ aNotification: Notification) {
        var discoveredFiles: [URL] = []
        // Always disable updates while processing results.
        _query!.disableUpdates()
        // The query reports all files found, every time.
        let queryResults = _query!.results
        for case let result as NSMetadataItem in queryResults {
            let fileURL = result.value(forAttribute: NSMetadataItemURLKey) as! URL
            // Don't include hidden files.
            let aBool = try? fileURL.resourceValues(forKeys: [.isHiddenKey]).isHidden
            if let aBool, !aBool {
                discoveredFiles.append(fileURL)
            }
        }
        // Update the list of documents.
        documents.removeAll()
        documents.append(contentsOf: discoveredFiles)
        // (A table view's reloadData: printed instead.)
        report(aNotification)
        // Reenable query updates.
        _query!.enableUpdates()
    }

    func report(_ note: Notification) {
        func names(_ key: String) -> String {
            ((note.userInfo?[key] as? [NSMetadataItem]) ?? []).map { $0.value(forAttribute: NSMetadataItemFSNameKey) as? String ?? "?" }
                .sorted().joined(separator: ",")
        }
        if note.name == .NSMetadataQueryDidUpdate {
            print("update added=[\(names(NSMetadataQueryUpdateAddedItemsKey))] changed=[\(names(NSMetadataQueryUpdateChangedItemsKey))] removed=[\(names(NSMetadataQueryUpdateRemovedItemsKey))]")
        }
        print("documents=[\(documents.map(\.lastPathComponent).joined(separator: ","))]")
    }
}

// Linux: no app delegate; the container comes from the command line (or UBIQUITY_CONTAINERS).
if CommandLine.arguments.count > 1 { UbiquityContainers.declare([CommandLine.arguments[1]]) }
setvbuf(stdout, nil, _IOLBF, 0)
let controller = STEMasterViewController()
controller.setupAndStartQuery()   // the seed's awakeFromNib
dispatchMain()
