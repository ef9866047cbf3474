// The guide's file operations ("In-Depth Guide to iCloud Documents":
// CloudDocumentsHandler, FilePresenter), as a command-line program. The
// seed's code is kept as written, with `import UbiquityKit` added; main()
// is the program's own.
//
//   ubiquitykit-documents-handler write PATH TEXT [HOLD-SECONDS]
//   ubiquitykit-documents-handler read PATH [HOLD-SECONDS]
//   ubiquitykit-documents-handler monitor PATH SECONDS
//
// write: a coordinated write (HOLD: the accessor keeps the item that long,
// to show others waiting); read: a coordinated read, printing the text
// (HOLD: twice, that long apart); monitor: a file presenter, printing
// "file changed", "relinquish to writer" and the like.
import UbiquityKit

actor CloudDocumentsHandler {
    let coordinator = NSFileCoordinator()
    var filePresenters: [URL: FilePresenter] = [:]

    func write(targetURL: URL, data: Data) throws {
        var coordinationError: NSError?
        var writeError: Error?
        // Use the coordinationError variable to capture the error information of the coordinate method.
        // If an NSError pointer is not provided, errors occurring during the coordination process will not be caught and handled.
        coordinator.coordinate(writingItemAt: targetURL, options: [.forDeleting], error: &coordinationError) { url in
            do {
                try data.write(to: url, options: .atomic)
            } catch {
                writeError = error
            }
        }
        // Check outside the closure to see if an error occurred
        if let error = writeError {
            throw error
        }
        // Check if an error occurred during reconciliation
        if let coordinationError = coordinationError {
            throw coordinationError
        }
    }

    func read(url: URL) throws -> Data {
        var coordinationError: NSError?
        var readData: Data?
        var readError: Error?
        coordinator.coordinate(readingItemAt: url, options: [], error: &coordinationError) { url in
            do {
                readData = try Data(contentsOf: url)
            } catch {
                readError = error
            }
        }
        if let error = readError {
            throw error
        }
        if let coordinationError = coordinationError {
            throw coordinationError
        }
        // Make sure the data read is not empty
        guard let data = readData else {
            throw NSError(domain: "CloudDocumentsHandlerError", code: 0, userInfo: [NSLocalizedDescriptionKey: "No data was read from the file."])
        }
        return data
    }

    func startMonitoringFile(at url: URL) {
        let presenter = FilePresenter(fileURL: url)
        filePresenters[url] = presenter
    }

    func stopMonitoringFile(at url: URL) {
        if let presenter = filePresenters[url] {
            NSFileCoordinator.removeFilePresenter(presenter)
        }
        filePresenters[url] = nil
    }
}

class FilePresenter: NSObject, NSFilePresenter {
    let fileURL: URL
    var presentedItemOperationQueue: OperationQueue = .main
    init(fileURL: URL) {
        self.fileURL = fileURL
        super.init()
        // Register to monitor the specified URL
        NSFileCoordinator.addFilePresenter(self)
    }
    deinit {
        // remove monitor
        NSFileCoordinator.removeFilePresenter(self)
    }
    var presentedItemURL: URL? {
        return fileURL
    }
    func presentedItemDidChange() {
        // When files change, perform relevant operations
        // For example, reload a file or notify other components
        print("file changed")
    }
    // (Not in the seed: the other events, printed for the tests. STUBBORN=1:
    // never gives the item up, to show that a writer goes ahead after a timeout.)
    func presentedItemDidMove(to newURL: URL) { print("file moved to \(newURL.lastPathComponent)") }
    func accommodatePresentedItemDeletion(completionHandler: @escaping (Error?) -> Void) {
        print("file deleted \(Date().timeIntervalSince1970)")
        completionHandler(nil)
    }
    func savePresentedItemChanges(completionHandler: @escaping (Error?) -> Void) {
        print("save \(Date().timeIntervalSince1970)")
        completionHandler(nil)
    }
    func relinquishPresentedItem(toWriter writer: @escaping ((() -> Void)?) -> Void) {
        print("relinquish to writer \(Date().timeIntervalSince1970)")
        if ProcessInfo.processInfo.environment["STUBBORN"] == "1" { return }
        writer { print("reacquired \(Date().timeIntervalSince1970)") }
    }
    func relinquishPresentedItem(toReader reader: @escaping ((() -> Void)?) -> Void) {
        print("relinquish to reader \(Date().timeIntervalSince1970)")
        reader { print("reacquired from reader \(Date().timeIntervalSince1970)") }
    }
}

setvbuf(stdout, nil, _IOLBF, 0)
let arguments = CommandLine.arguments
guard arguments.count >= 3 else {
    print("usage: ubiquitykit-documents-handler write PATH TEXT [HOLD] | read PATH [HOLD] | monitor PATH SECONDS")
    exit(64)
}
let url = URL(fileURLWithPath: arguments[2])
let handler = CloudDocumentsHandler()
Task {
    do {
        switch arguments[1] {
        case "write" where arguments.count > 4:
            // Hold the item while writing, to show coordination across processes.
            var error: NSError?
            NSFileCoordinator().coordinate(writingItemAt: url, options: [], error: &error) { url in
                print("writing \(Date().timeIntervalSince1970)")
                Thread.sleep(forTimeInterval: Double(arguments[4]) ?? 0)
                try? Data(arguments[3].utf8).write(to: url, options: .atomic)
                print("wrote \(Date().timeIntervalSince1970)")
            }
            if let error { throw error }
        case "write":
            try await handler.write(targetURL: url, data: Data(arguments[3].utf8))
            print("wrote \(Date().timeIntervalSince1970)")
        case "read" where arguments.count > 3:
            // Hold the item while reading it twice: a coordinated reader sees one version.
            var error: NSError?
            NSFileCoordinator().coordinate(readingItemAt: url, options: [], error: &error) { url in
                print("reading \(Date().timeIntervalSince1970) \((try? String(contentsOf: url, encoding: .utf8)) ?? "?")")
                Thread.sleep(forTimeInterval: Double(arguments[3]) ?? 0)
                print("read again \(Date().timeIntervalSince1970) \((try? String(contentsOf: url, encoding: .utf8)) ?? "?")")
            }
            if let error { throw error }
        case "read":
            let data = try await handler.read(url: url)
            print("read \(Date().timeIntervalSince1970) \(String(decoding: data, as: UTF8.self))")
        case "monitor":
            await handler.startMonitoringFile(at: url)
            print("monitoring")
            try await Task.sleep(nanoseconds: UInt64((Double(arguments.count > 3 ? arguments[3] : "10") ?? 10) * 1e9))
            await handler.stopMonitoringFile(at: url)
        default:
            print("unknown command \(arguments[1])")
        }
    } catch {
        print("error: \(error)")
        exit(1)
    }
    exit(0)
}
dispatchMain()
