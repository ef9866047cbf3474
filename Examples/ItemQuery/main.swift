// The guide's "How to retrieve a file list from the iCloud Document directory"
// (fatbobman, "In-Depth Guide to iCloud Documents"), as a command-line program.
// The seed's code is kept as written, with `import UbiquityKit` added; where
// it differs, a comment says why.
//
//   ubiquitykit-item-query [CONTAINER-ID]    (or UBIQUITY_CONTAINERS=ID)
//
// It prints the Documents scope's items (name, directory, placeholder,
// downloading, uploaded) after gathering and after every change.
import UbiquityKit

class ItemQuery {
    let query = NSMetadataQuery()
    let queue: OperationQueue
    init(queue: OperationQueue = .main) {
        self.queue = queue
    }
    func searchMetadataItems(
        predicate: NSPredicate? = nil,
        sortDescriptors: [NSSortDescriptor] = [],
        scopes: [Any] = [NSMetadataQueryUbiquitousDocumentsScope]
    ) -> AsyncStream<[MetadataItemWrapper]> {
        query.searchScopes = scopes
        query.sortDescriptors = sortDescriptors
        // Get iCloud Ubiquity Container URL
        if let containerURL = FileManager.default.url(forUbiquityContainerIdentifier: nil)?.appendingPathComponent("Documents") {
            // Build a path to the Documents directory
            let documentsPath = containerURL.path
            // Create predicates using dynamic paths
            let defaultPredicate = NSPredicate(format: "%K BEGINSWITH %@", NSMetadataItemPathKey, documentsPath)
            query.predicate = predicate ?? defaultPredicate
        } else {
            // If the path cannot be obtained, a suitable default behavior can be selected
            query.predicate = predicate ?? NSPredicate(value: true)
        }
        return AsyncStream { continuation in
            NotificationCenter.default.addObserver(
                forName: .NSMetadataQueryDidFinishGathering,
                object: query,
                queue: queue
            ) { _ in
                let result = self.query.results.compactMap { item -> MetadataItemWrapper? in
                    guard let metadataItem = item as? NSMetadataItem else {
                        return nil
                    }
                    return MetadataItemWrapper(metadataItem: metadataItem)
                }
                continuation.yield(result)
            }
            NotificationCenter.default.addObserver(
                forName: .NSMetadataQueryDidUpdate,
                object: query,
                queue: queue
            ) { _ in
                let result = self.query.results.compactMap { item -> MetadataItemWrapper? in
                    guard let metadataItem = item as? NSMetadataItem else {
                        return nil
                    }
                    return MetadataItemWrapper(metadataItem: metadataItem)
                }
                continuation.yield(result)
            }
            query.start()
            continuation.onTermination = { @Sendable _ in
                self.query.stop()
                NotificationCenter.default.removeObserver(self, name: .NSMetadataQueryDidFinishGathering, object: self.query)
                NotificationCenter.default.removeObserver(self, name: .NSMetadataQueryDidUpdate, object: self.query)
            }
        }
    }
}

struct MetadataItemWrapper: Sendable {
    let fileName: String?
    let fileSize: Int?
    let contentType: String?
    let isPlaceholder: Bool
    let isDownloading: Bool
    let downloadAmount: Double?
    let isDirectory: Bool
    let isUploaded: Bool
    init(metadataItem: NSMetadataItem) {
        fileName = metadataItem.value(forAttribute: NSMetadataItemFSNameKey) as? String
        fileSize = metadataItem.value(forAttribute: NSMetadataItemFSSizeKey) as? Int
        contentType = metadataItem.value(forAttribute: NSMetadataItemContentTypeKey) as? String
        // Is it a placeholder file
        isPlaceholder = metadataItem.value(forAttribute: NSMetadataUbiquitousItemDownloadingStatusKey) as? Bool ?? false
        // download amout
        downloadAmount = metadataItem.value(forAttribute: NSMetadataUbiquitousItemPercentDownloadedKey) as? Double
        // Is downloading
        let downloadStatus = metadataItem.value(forAttribute: NSMetadataUbiquitousItemIsDownloadingKey) as? String
        isDownloading = downloadStatus == NSMetadataUbiquitousItemDownloadingStatusCurrent
        // Check if it is a directory
        if let contentType = metadataItem.value(forAttribute: NSMetadataItemContentTypeKey) as? String {
            isDirectory = (contentType == "public.folder")
        } else {
            isDirectory = false
        }
        // Check whether the file has been uploaded successfully or saved in the cloud
        let uploaded = metadataItem.value(forAttribute: NSMetadataUbiquitousItemIsUploadedKey) as? Bool ?? false
        let uploading = metadataItem.value(forAttribute: NSMetadataUbiquitousItemIsUploadingKey) as? Bool ?? true
        isUploaded = uploaded && !uploading
    }
}

// Linux: no app delegate or view; the container comes from the command line.
if CommandLine.arguments.count > 1 { UbiquityContainers.declare([CommandLine.arguments[1]]) }
setvbuf(stdout, nil, _IOLBF, 0)

Task {
    let query = ItemQuery()
    // The guide throttles with swift-async-algorithms' `.throttle(for: .seconds(1), latest: true)`;
    // left out here to keep the example's dependencies to UbiquityKit alone.
    for await items in query.searchMetadataItems() {
        print("--- \(items.count) items")
        items.forEach {
            print($0.fileName ?? "", $0.isDirectory, $0.fileSize ?? -1, $0.isUploaded)
        }
    }
}
// Linux: a command-line program runs the main queue itself (an app's run loop does on Apple platforms).
dispatchMain()
