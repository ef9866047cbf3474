import Foundation   // as in an app's file: Foundation's NSPredicate and NSSortDescriptor must not make these ambiguous
import Testing
import UbiquityKit

/// Apple's format strings become the daemon's query language with the
/// arguments in place; the metadata keys keep Apple's values.
@Suite struct PredicateTests {
    @Test func keysAndValuesAreSubstituted() {
        #expect(NSPredicate(format: "%K LIKE %@", NSMetadataItemFSNameKey, "*.txt").predicateFormat
                == #"kMDItemFSName LIKE "*.txt""#)
        #expect(NSPredicate(format: "%K like 'savefile.txt'", NSMetadataItemFSNameKey).predicateFormat
                == "kMDItemFSName like 'savefile.txt'")
        #expect(NSPredicate(format: "%K BEGINSWITH %@", NSMetadataItemPathKey, "/home/me/Cloud/Documents").predicateFormat
                == #"kMDItemPath BEGINSWITH "/home/me/Cloud/Documents""#)
        #expect(NSPredicate(format: "%K > %d AND %K == %@", NSMetadataItemFSSizeKey, 1000,
                            NSMetadataUbiquitousItemIsUploadedKey, NSNumber(value: true)).predicateFormat
                == "kMDItemFSSize > 1000 AND NSMetadataUbiquitousItemIsUploadedKey == TRUE")
        #expect(NSPredicate(format: "%K == %@", NSMetadataUbiquitousItemDownloadingStatusKey,
                            NSMetadataUbiquitousItemDownloadingStatusCurrent).predicateFormat
                == #"NSMetadataUbiquitousItemDownloadingStatusKey == "NSMetadataUbiquitousItemDownloadingStatusCurrent""#)
    }

    @Test func quotesAndPercentSignsAreKept() {
        #expect(NSPredicate(format: "name == '%@ 100%%'").predicateFormat == "name == '%@ 100%%'")
        #expect(NSPredicate(format: "size > 5 %% 2").predicateFormat == "size > 5 % 2")
        #expect(NSPredicate(format: "name == %@", #"say "hi" \ bye"#).predicateFormat == #"name == "say \"hi\" \\ bye""#)
        #expect(NSPredicate(format: "name IN %@", ["a", "b"]).predicateFormat == #"name IN {"a", "b"}"#)
    }

    @Test func valuesCompoundsAndSorts() {
        #expect(NSPredicate(value: true).predicateFormat == "TRUEPREDICATE")
        let both = NSCompoundPredicate(andPredicateWithSubpredicates: [NSPredicate(format: "size > 1"), NSPredicate(value: true)])
        #expect(both.predicateFormat == "(size > 1) AND (TRUEPREDICATE)")
        #expect(NSSortDescriptor(key: NSMetadataItemFSSizeKey, ascending: false).reversedSortDescriptor.ascending)
        #expect(NSMetadataItemURLKey == "kMDItemURL" && NSMetadataItemFSNameKey == "kMDItemFSName")
        #expect(NSNotification.Name.NSMetadataQueryDidUpdate.rawValue == "NSMetadataQueryDidUpdateNotification")
    }

    /// The names in type position, in a file that imports Foundation too (the
    /// seeds' `ItemQuery` declares `predicate: NSPredicate?` and
    /// `sortDescriptors: [NSSortDescriptor]`): they are UbiquityKit's.
    @Test func typeNamesAreUbiquityKitsBesideFoundation() {
        let predicate: NSPredicate? = NSPredicate(value: false)
        let compound: NSCompoundPredicate = NSCompoundPredicate(notPredicateWithSubpredicate: predicate!)
        let sorts: [NSSortDescriptor] = [NSSortDescriptor(key: NSMetadataItemFSNameKey, ascending: true)]
        let query = NSMetadataQuery()
        query.predicate = compound
        query.sortDescriptors = sorts
        #expect(query.predicate?.predicateFormat == "NOT (FALSEPREDICATE)")
        #expect(query.sortDescriptors.first?.key == "kMDItemFSName")
        query.predicate = NSPredicate(format: "%K LIKE '*.txt'", NSMetadataItemFSNameKey)   // Foundation's is unavailable
        #expect(query.predicate?.predicateFormat == "kMDItemFSName LIKE '*.txt'")
    }
}
