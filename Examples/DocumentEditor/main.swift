// The UIDocument post's sample (a ViewController with a MyDocument subclass,
// written for Swift 2 and iOS 9), as a command-line program on UbiquityKit.
// The Swift 2 spellings become today's (NSFileManager.defaultManager() →
// FileManager.default, URLForUbiquityContainerIdentifier → url(forUbiquity…),
// saveToURL(_:forSaveOperation:) → save(to:for:)…: the smallest change a
// current compiler needs); the text view becomes standard output. The post
// does not show MyDocument: it is the usual one, a String in a document.
//
//   ubiquitykit-document-editor [CONTAINER] [--set TEXT] [--watch SECONDS]
//
// Opens Documents/savefile.txt (or creates it) as the post does; --set
// changes the text (saved when the document autosaves or closes); --watch
// prints the document's state and text as they change, then closes it.
import UbiquityKit

class MyDocument: UIDocument {
    var userText: String? = "Some Sample Text"

    override func contents(forType typeName: String) throws -> Any {
        return (userText ?? "").data(using: .utf8) ?? Data()
    }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {
        if let data = contents as? Data, data.count > 0 {
            userText = String(decoding: data, as: UTF8.self)
        }
        print("loaded: \(userText ?? "")")
    }
}

class ViewController {
    var document: MyDocument?
    var documentURL: URL?
    var ubiquityURL: URL?
    var metaDataQuery: NSMetadataQuery?
    var onReady: (() -> Void)?

    func viewDidLoad() {
        let filemgr = FileManager.default
        ubiquityURL = filemgr.url(forUbiquityContainerIdentifier: nil)
        guard ubiquityURL != nil else {
            print("Unable to access iCloud Account")
            print("Open the Settings app and enter your Apple ID into iCloud settings")
            return
        }
        ubiquityURL = ubiquityURL?.appendingPathComponent("Documents/savefile.txt")
        metaDataQuery = NSMetadataQuery()
        metaDataQuery?.predicate = NSPredicate(format: "%K like 'savefile.txt'", NSMetadataItemFSNameKey)
        metaDataQuery?.searchScopes = [NSMetadataQueryUbiquitousDocumentsScope]
        // (Linux has no selectors: the block observer calls the same method.)
        NotificationCenter.default.addObserver(forName: .NSMetadataQueryDidFinishGathering, object: metaDataQuery!, queue: .main) {
            self.metadataQueryDidFinishGathering(notification: $0)
        }
        metaDataQuery!.start()
    }

    func metadataQueryDidFinishGathering(notification: Notification) -> Void {
        let query: NSMetadataQuery = notification.object as! NSMetadataQuery
        query.disableUpdates()
        NotificationCenter.default.removeObserver(self, name: .NSMetadataQueryDidFinishGathering, object: query)
        query.stop()
        let results = query.results
        if query.resultCount == 1 {
            // (Linux has no AnyObject method lookup: the item is cast to NSMetadataItem.)
            let resultURL = (results[0] as! NSMetadataItem).value(forAttribute: NSMetadataItemURLKey) as! URL
            document = MyDocument(fileURL: resultURL)
            document?.open(completionHandler: { (success: Bool) -> Void in
                if success {
                    print("iCloud file open OK")
                    print("text: \(self.document?.userText ?? "")")   // self.textView.text = …
                    self.ubiquityURL = resultURL
                } else {
                    print("iCloud file open failed")
                }
                self.onReady?()
            })
        } else {
            document = MyDocument(fileURL: ubiquityURL!)
            document?.save(to: ubiquityURL!, for: .forCreating, completionHandler: { (success: Bool) -> Void in
                if success {
                    print("iCloud create OK")
                } else {
                    print("iCloud create failed")
                }
                self.onReady?()
            })
        }
    }
}

setvbuf(stdout, nil, _IOLBF, 0)
var arguments = Array(CommandLine.arguments.dropFirst())
if let first = arguments.first, !first.hasPrefix("--") { UbiquityContainers.declare([first]); arguments.removeFirst() }
func option(_ name: String) -> String? { arguments.firstIndex(of: name).flatMap { $0 + 1 < arguments.count ? arguments[$0 + 1] : nil } }

let controller = ViewController()
controller.onReady = {
    guard let document = controller.document else { exit(1) }
    NotificationCenter.default.addObserver(forName: UIDocument.stateChangedNotification, object: document, queue: .main) { _ in
        let state = document.documentState
        var names: [String] = []
        if state.contains(.closed) { names.append("closed") }
        if state.contains(.inConflict) { names.append("inConflict") }
        if state.contains(.savingError) { names.append("savingError") }
        if state.contains(.editingDisabled) { names.append("editingDisabled") }
        print("state=\(names.isEmpty ? "normal" : names.joined(separator: ","))")
    }
    if let text = option("--set") {
        document.userText = text
        document.updateChangeCount(.done)
        print("edited")
    }
    let seconds = Double(option("--watch") ?? "0") ?? 0
    DispatchQueue.main.asyncAfter(deadline: .now() + seconds) {
        document.close { ok in
            print(ok ? "closed" : "close failed")
            exit(ok ? 0 : 1)
        }
    }
}
controller.viewDidLoad()
dispatchMain()
