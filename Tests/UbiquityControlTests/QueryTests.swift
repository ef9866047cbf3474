import Foundation
import Testing
@testable import UbiquityControl

private func item(_ values: [String: MetadataValue]) -> MetadataItem {
    MetadataItem(values: values)
}

private func matches(_ predicate: String, _ values: [String: MetadataValue],
                     sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
    do {
        return try Query(predicate: predicate).matches(item(values))
    } catch {
        Issue.record("\(predicate): \(error)", sourceLocation: sourceLocation)
        return false
    }
}

@Suite struct SemanticsTests {
    @Test func predicateAttributesAreWhatThePredicateReads() throws {
        let query = try Query(predicate: "NOT (kMDItemFSName LIKE '*.md' OR size > 3) AND isDownloading == NO AND TRUEPREDICATE",
                              sort: "-modificationDate")
        #expect(query.predicateAttributes == ["name", "size", "isDownloading"])
        #expect(try Query(predicate: "TRUEPREDICATE").predicateAttributes.isEmpty)
    }

    @Test func stringOperators() {
        let file: [String: MetadataValue] = ["name": .string("Résumé Final.MD")]
        #expect(matches("name == 'Résumé Final.MD'", file))
        #expect(!matches("name == 'résumé final.md'", file))
        #expect(matches("name ==[c] 'résumé final.md'", file))
        #expect(!matches("name ==[c] 'resume final.md'", file))
        #expect(matches("name ==[cd] 'resume final.md'", file))
        #expect(matches("name ==[d] 'Resume Final.MD'", file))
        #expect(!matches("name ==[d] 'resume final.md'", file))
        #expect(matches("name LIKE '*.MD'", file))
        #expect(!matches("name LIKE '*.md'", file))
        #expect(matches("name LIKE[c] '*.md'", file))
        #expect(matches("name LIKE 'R?sum? *'", file))
        #expect(matches("name LIKE[cd] 'resume*final*'", file))
        #expect(!matches("name LIKE 'Résumé'", file))  // anchored at both ends
        #expect(!matches("name LIKE 'Final*'", file))
        #expect(matches("name LIKE '*'", file))
        #expect(matches("name LIKE '**Final**'", file))
        #expect(matches("name BEGINSWITH 'Rés'", file))
        #expect(matches("name BEGINSWITH[cd] 'RES'", file))
        #expect(matches("name ENDSWITH '.MD'", file))
        #expect(matches("name ENDSWITH[c] '.md'", file))
        #expect(matches("name CONTAINS 'umé F'", file))
        #expect(matches("name CONTAINS[cd] 'UME F'", file))
        #expect(!matches("name CONTAINS 'xyz'", file))
        #expect(matches("name IN {'a', 'Résumé Final.MD'}", file))
        #expect(matches("name IN[cd] {'a', 'RESUME FINAL.md'}", file))
        #expect(!matches("name IN {'a', 'b'}", file))
        #expect(matches("name < 'S'", file))
        #expect(matches("name > 'Q'", file))
        #expect(matches("name BETWEEN {'R', 'S'}", file))
        #expect(matches("name >[c] 'r'", file))
        #expect(!matches("name > 'r'", file))  // 'R' < 'r'
    }

    @Test func likeWildcardsAndEscapes() {
        func like(_ pattern: String, _ name: String) -> Bool {
            matches("name LIKE \(Literal.quote(pattern))", ["name": .string(name)])
        }
        #expect(like("a?c", "abc"))
        #expect(!like("a?c", "ac"))
        #expect(!like("a?c", "abbc"))
        #expect(like("a*c", "ac"))
        #expect(like("a*c", "abbbc"))
        #expect(like("*a*a*", "banana"))
        #expect(!like("*a*a*a*a*", "banana"))
        #expect(like("*ana", "banana"))
        #expect(like("?", "é"))  // one character, two bytes
        #expect(like("?", "e\u{301}"))  // one character, two scalars
        #expect(like("??", "\r\n!"))
        #expect(!like("???", "\r\n!"))
        #expect(like("a\\*", "a*"))
        #expect(!like("a\\*", "ab"))
        #expect(like("a\\?", "a?"))
        #expect(like("a\\\\b", "a\\b"))
        #expect(like("", ""))
        #expect(!like("", "a"))
        #expect(like("*", ""))
        #expect(like("日*", "日本.txt"))
        #expect(like("K*", "\u{212A}elvin"))  // KELVIN SIGN is canonically "K"
    }

    @Test func numbersDatesBooleans() {
        let values: [String: MetadataValue] = [
            "size": .number(1500), "isDirectory": .bool(false), "pinned": .number(1),
            "creationDate": .date(1_767_323_045.75),  // 2026-01-02T03:04:05.75Z
        ]
        #expect(matches("size == 1500", values))
        #expect(matches("size = 1500.0", values))
        #expect(matches("size > 1000 AND size < 2000", values))
        #expect(matches("size >= 1500 && size <= 1500", values))
        #expect(!matches("size != 1500", values))
        #expect(matches("size IN {1, 1500}", values))
        #expect(matches("size BETWEEN {1500, 1e9}", values))
        #expect(!matches("size BETWEEN {-5, -1}", values))
        #expect(matches("-1 < size", values))
        #expect(matches("isDirectory == NO", values))
        #expect(matches("isDirectory == 0", values))
        #expect(matches("isDirectory IN {NO}", values))
        #expect(matches("NOT isDirectory == YES", values))
        #expect(matches("pinned == YES", values))
        #expect(matches("creationDate == DATE('2026-01-02T03:04:05Z')", values))  // whole seconds
        #expect(matches("creationDate == CAST(1767323045, 'NSDate')", values))
        #expect(matches("creationDate == CAST(1767323045.2, 'NSDate')", values))
        #expect(!matches("creationDate > DATE('2026-01-02T03:04:05Z')", values))
        #expect(matches("creationDate >= DATE('2026-01-02')", values))
        #expect(matches("creationDate < DATE('2026-01-03')", values))
        #expect(matches("creationDate BETWEEN {DATE('2026-01-01'), DATE('2026-01-31')}", values))
        #expect(matches("creationDate IN {DATE('2026-01-02T03:04:05Z')}", values))
        #expect(matches("creationDate == DATE('2026-01-02T04:04:05+01:00')", values))
    }

    @Test func nullSemantics() {
        let empty: [String: MetadataValue] = ["size": .null, "name": .string("a")]
        #expect(matches("size == nil", empty))
        #expect(matches("modificationDate == nil", empty))  // missing
        #expect(!matches("size != nil", empty))
        #expect(matches("name != nil", empty))
        #expect(!matches("name == nil", empty))
        #expect(!matches("size > 5", empty))
        #expect(!matches("size < 5", empty))
        #expect(!matches("size == 5", empty))
        #expect(matches("size != 5", empty))  // != is always the negation of ==
        #expect(!matches("size IN {5}", empty))
        #expect(!matches("isDirectory == NO", empty))
        #expect(matches("isDirectory != NO", empty))
        #expect(!matches("path LIKE '*'", empty))
        #expect(!matches("name > nil", empty))
        #expect(!matches("name LIKE nil", empty))
        #expect(!matches("size < nil", empty))
        // A value of the wrong type is no value for comparisons, but not nil.
        let wrong: [String: MetadataValue] = ["size": .string("big"), "name": .number(3)]
        #expect(!matches("size > 0", wrong))
        #expect(!matches("size == nil", wrong))
        #expect(!matches("name LIKE '*'", wrong))
        #expect(matches("name != 'x'", wrong))
    }

    @Test func equalityWithWildcardsMatchesAsLike() {
        let file: [String: MetadataValue] = ["name": .string("Notes.TXT")]
        #expect(matches("NSMetadataItemFSNameKey == '*'", file))
        #expect(matches("NSMetadataItemFSNameKey == '*'", ["name": .string("")]))
        #expect(!matches("NSMetadataItemFSNameKey == '*'", [:]))
        #expect(matches("name == 'Notes.*'", file))
        #expect(!matches("name == '*.txt'", file))
        #expect(matches("name ==[c] '*.txt'", file))
        #expect(matches("name == 'N?tes.TXT'", file))
        #expect(!matches("name == 'N?tes'", file))
        #expect(matches("name != '*.txt'", file))
        #expect(!matches("name != '*.TXT'", file))
        #expect(matches("name == \(Literal.quote("Notes\\*"))", ["name": .string("Notes*")]))
        #expect(!matches("name == \(Literal.quote("Notes\\*"))", file))
    }

    @Test func appleConstantsAndBooleanLiterals() {
        let current: [String: MetadataValue] = ["downloadingStatus": .string("current"), "isUploaded": .bool(false)]
        #expect(matches("NSMetadataUbiquitousItemDownloadingStatusKey == NSMetadataUbiquitousItemDownloadingStatusCurrent", current))
        #expect(!matches("NSMetadataUbiquitousItemDownloadingStatusKey == NSMetadataUbiquitousItemDownloadingStatusDownloaded", current))
        #expect(matches("NSMetadataUbiquitousItemDownloadingStatusKey == NSMetadataUbiquitousItemDownloadingStatusNotDownloaded",
                        ["downloadingStatus": .string("notDownloaded")]))
        #expect(matches("NSMetadataUbiquitousItemDownloadingStatusCurrent == NSMetadataUbiquitousItemDownloadingStatusKey", current))
        #expect(matches("NSMetadataUbiquitousItemDownloadingStatusKey IN {NSMetadataUbiquitousItemDownloadingStatusCurrent, 'x'}", current))
        #expect(matches("NSMetadataUbiquitousItemIsUploadedKey == NO", current))
        #expect(!matches("NSMetadataUbiquitousItemIsUploadedKey == YES", current))
        #expect(matches("NSMetadataUbiquitousItemIsUploadedKey == FALSE", current))
        #expect(matches("NSMetadataUbiquitousItemIsUploadedKey != TRUE", current))
        #expect(throws: QueryError.self) { try Query(predicate: "size == NSMetadataUbiquitousItemDownloadingStatusCurrent") }
    }

    @Test func pathComponentsCountAsNSStringCountsThem() throws {
        let deep: [String: MetadataValue] = ["path": .string("/mnt/c/Documents/a.txt")]
        #expect(matches("NSMetadataItemPathKey.pathComponents.@count == 5", deep))
        #expect(!matches("NSMetadataItemPathKey.pathComponents.@count == 4", deep))
        #expect(matches("path.pathComponents.@count > 4 AND path.pathComponents.@count <= 5", deep))
        #expect(matches("kMDItemPath.PATHCOMPONENTS.@COUNT IN {1, 5}", deep))
        #expect(matches("path.pathComponents.@count == 1", ["path": .string("/")]))
        #expect(matches("path.pathComponents.@count == 3", ["path": .string("/a/b")]))
        #expect(matches("path.pathComponents.@count == 2", ["path": .string("a/b")]))
        #expect(!matches("path.pathComponents.@count > 0", [:]))
        #expect(matches("path.pathComponents.@count == nil", [:]))
        let query = try Query(predicate: "NSMetadataItemPathKey.pathComponents.@count == 4")
        #expect(query.predicateAttributes == ["path"])
        #expect(query.normalizedPredicate == "path.pathComponents.@count == 4")
        #expect(throws: QueryError.self) { try Query(predicate: "path.pathComponents.@count == 'x'") }
        #expect(throws: QueryError.self) { try Query(predicate: "name.pathComponents.@count == 1") }
        #expect(throws: QueryError.self) { try Query(predicate: "path.length == 1") }
        #expect(throws: QueryError.self) { try Query(predicate: "TRUEPREDICATE", sort: "path.pathComponents.@count") }
    }

    @Test func matchesIsAWholeStringRegularExpression() {
        let file: [String: MetadataValue] = ["name": .string("IMG_0042.JPG")]
        #expect(matches("name MATCHES 'IMG_[0-9]{4}\\\\.JPG'", file))
        #expect(!matches("name MATCHES 'IMG_[0-9]{3}'", file))  // a prefix is not the whole string
        #expect(!matches("name MATCHES '[0-9]+'", file))
        #expect(matches("name MATCHES 'a|IMG.*'", file))  // whole string, not the leftmost alternative's match
        #expect(!matches("name MATCHES 'img_.*'", file))
        #expect(matches("name MATCHES[c] 'img_.*\\\\.jpg'", file))
        #expect(matches("name MATCHES[d] 'resume'", ["name": .string("résumé")]))
        #expect(!matches("name MATCHES 'resume'", ["name": .string("résumé")]))
        #expect(!matches("name MATCHES '.*'", [:]))
        #expect(matches("NOT name MATCHES 'x.*'", file))
        #expect(matches("name MATCHES '(?x) IMG _ 0042 \\\\. JPG'", file))
    }

    @Test func constants() {
        #expect(matches("TRUEPREDICATE", [:]))
        #expect(!matches("FALSEPREDICATE", [:]))
        #expect(matches("FALSEPREDICATE OR TRUEPREDICATE AND NOT FALSEPREDICATE", [:]))
    }

    @Test func resultsFilterThenSort() throws {
        let items = [
            item(["name": .string("b"), "path": .string("/b"), "size": .number(2)]),
            item(["name": .string("a"), "path": .string("/a"), "size": .number(3)]),
            item(["name": .string("c"), "path": .string("/c"), "size": .number(1)]),
        ]
        let query = try Query(predicate: "size >= 2", sort: "name")
        #expect(query.results(items).map { $0["name"] } == [.string("a"), .string("b")])
        #expect(query.predicate == "size >= 2")
    }
}

@Suite struct ModelTests {
    /// A few hundred generated predicates over 2,000 generated items, each
    /// checked against the test's own evaluation of the same tree.
    @Test func generatedPredicatesAgreeWithTheModel() throws {
        let items = Generated.items(count: 2_000, seed: 7)
        var generator = PredicateGenerator(seed: 42, items: items)
        var nonTrivial = 0
        for _ in 0..<400 {
            let (model, text) = generator.predicate()
            let query: Query
            do {
                query = try Query(predicate: text)
            } catch {
                Issue.record("\(text): \(error)")
                continue
            }
            var mismatches: [MetadataItem] = []
            var count = 0
            for item in items {
                let expected = Model.evaluate(model, item)
                if expected { count += 1 }
                if query.matches(item) != expected { mismatches.append(item) }
            }
            if count > 0 && count < items.count { nonTrivial += 1 }
            #expect(mismatches.isEmpty, "\(text): \(mismatches.count) mismatches, first \(mismatches.first.map { "\($0.values)" } ?? "")")
            // The canonical form means the same.
            let again = try Query(predicate: query.normalizedPredicate)
            #expect(again.tree == query.tree, "\(text) → \(query.normalizedPredicate)")
        }
        // The generator should produce mostly predicates that split the items.
        #expect(nonTrivial > 150)
    }

    @Test func generatedComparisonsAgreeWithTheModel() throws {
        // Single comparisons, many of them, to cover each operator and type densely.
        let items = Generated.items(count: 2_000, seed: 11)
        var generator = PredicateGenerator(seed: 99, items: items)
        for _ in 0..<300 {
            let (model, text) = generator.comparison()
            let query = try Query(predicate: text)
            let mismatches = items.filter { query.matches($0) != Model.evaluate(model, $0) }
            #expect(mismatches.isEmpty, "\(text): \(mismatches.count) mismatches, first \(mismatches.first.map { "\($0.values)" } ?? "")")
        }
    }
}

@Suite struct SortTests {
    static func modelSorted(_ items: [MetadataItem], _ keys: [(String, Bool)]) -> [MetadataItem] {
        func rank(_ v: MetadataValue?, _ type: ModelType) -> (Int, Double, String) {
            switch (type, v) {
            case (.string, .string(let s)?): (1, 0, s)
            case (.number, .number(let n)?): (1, n, "")
            case (.date, .date(let d)?), (.date, .number(let d)?): (1, d, "")
            case (.bool, .bool(let b)?): (1, b ? 1 : 0, "")
            case (.bool, .number(let n)?): (1, n != 0 ? 1 : 0, "")
            default: (0, 0, "")
            }
        }
        func less(_ a: (Int, Double, String), _ b: (Int, Double, String)) -> Bool {
            if a.0 != b.0 { return a.0 < b.0 }
            if a.1 != b.1 { return a.1 < b.1 }
            return a.2 < b.2
        }
        let all = keys + [("path", true)]
        return items.enumerated().sorted { x, y in
            for (key, ascending) in all {
                let a = rank(x.element.values[key], modelTypes[key]!), b = rank(y.element.values[key], modelTypes[key]!)
                if less(a, b) { return ascending }
                if less(b, a) { return !ascending }
            }
            return x.offset < y.offset
        }.map(\.element)
    }

    @Test(arguments: [
        ("name", [("name", true)]),
        ("-size", [("size", false)]),
        ("isDirectory,-size,name", [("isDirectory", true), ("size", false), ("name", true)]),
        ("-kMDItemFSContentChangeDate", [("modificationDate", false)]),
        ("contentType, -pinned, creationDate", [("contentType", true), ("pinned", false), ("creationDate", true)]),
        ("-downloadingStatus,-name", [("downloadingStatus", false), ("name", false)]),
    ])
    func sortingMatchesTheModel(_ sort: String, _ keys: [(String, Bool)]) throws {
        let items = Generated.items(count: 2_000, seed: 3)
        let query = try Query(predicate: "TRUEPREDICATE", sort: sort)
        let sorted = query.sorted(items)
        let expected = Self.modelSorted(items, keys)
        #expect(sorted == expected)
    }

    @Test func missingValuesFirstAscendingLastDescendingAndPathBreaksTies() throws {
        let items = [
            item(["path": .string("/c"), "size": .number(1)]),
            item(["path": .string("/b")]),
            item(["path": .string("/a"), "size": .number(1)]),
            item(["path": .string("/d"), "size": .number(5)]),
        ]
        let ascending = try Query(predicate: "TRUEPREDICATE", sort: "size").sorted(items)
        #expect(ascending.map { $0["path"] } == ["/b", "/a", "/c", "/d"].map(MetadataValue.string))
        let descending = try Query(predicate: "TRUEPREDICATE", sort: "-size").sorted(items)
        #expect(descending.map { $0["path"] } == ["/d", "/a", "/c", "/b"].map(MetadataValue.string))
        let byPath = try Query(predicate: "TRUEPREDICATE").sorted(items)
        #expect(byPath.map { $0["path"] } == ["/a", "/b", "/c", "/d"].map(MetadataValue.string))
    }

    /// 100,000 items are filtered and sorted (no timing assertion; see the report for timings).
    @Test func hundredThousandItems() throws {
        let items = Generated.items(count: 100_000, seed: 5)
        let query = try Query(
            predicate: "(name LIKE[cd] '*e*' OR kMDItemFSSize > 5000) AND NOT isDirectory == YES AND modificationDate != nil",
            sort: "-size,name")
        let results = query.results(items)
        let expected = items.filter { item in
            let name: String? = if case .string(let s)? = item.values["name"] { s } else { nil }
            let size: Double? = if case .number(let n)? = item.values["size"] { n } else { nil }
            let nameHasE = name.map { $0.folding(options: [.caseInsensitive, .diacriticInsensitive], locale: nil).contains("e") } ?? false
            let isDirectory = item.values["isDirectory"] == .bool(true)
            let hasDate = item.values["modificationDate"].map { $0 != .null } ?? false
            return (nameHasE || (size ?? -1) > 5000) && !isDirectory && hasDate
        }
        #expect(results.count == expected.count)
        #expect(results.count > 10_000)
        let sizes = results.map { item -> Double in
            if case .number(let n)? = item.values["size"] { return n }
            return -.infinity
        }
        #expect(zip(sizes, sizes.dropFirst()).allSatisfy { $0 >= $1 })
        #expect(Set(results.map { $0["path"] }) == Set(expected.map { $0["path"] }))
    }
}

@Suite struct MatcherTests {
    /// A predicate compiled for another subject (here an item's position,
    /// its values read through functions chosen per attribute) answers as
    /// `matches` does on the item, and asks only for the attributes it reads.
    @Test func aMatcherOverAnotherSubjectAgreesWithMatches() throws {
        let items = Generated.items(count: 1_000, seed: 5)
        var generator = PredicateGenerator(seed: 77, items: items)
        for round in 0..<300 {
            let (_, text) = round.isMultiple(of: 2) ? generator.predicate() : generator.comparison()
            let query = try Query(predicate: text)
            var asked = Set<String>()
            let test = query.matcher { (name: String) -> @Sendable (Int) -> MetadataValue? in
                asked.insert(name)
                return { items[$0].values[name] }
            }
            #expect(asked.isSubset(of: query.predicateAttributes), "\(text): asked \(asked)")
            let mismatches = items.indices.filter { test($0) != query.matches(items[$0]) }
            #expect(mismatches.isEmpty, "\(text): \(mismatches.count) mismatches")
        }
    }
}
