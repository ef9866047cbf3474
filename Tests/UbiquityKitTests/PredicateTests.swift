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
}
