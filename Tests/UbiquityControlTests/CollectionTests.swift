import Testing
@testable import UbiquityControl

/// Collection attributes (`contentTypeTree`, `path.pathComponents`), the
/// quantifiers `ANY`/`SOME`, `ALL`, `NONE`, and `value IN attribute`, with
/// NSPredicate's and Spotlight's semantics.

private func tree(_ uti: String) -> MetadataValue {
    .list(UniformTypes.tree(of: uti).map(MetadataValue.string))
}

private let jpeg: [String: MetadataValue] = ["name": .string("photo.jpg"), "path": .string("/mnt/c/Documents/photo.jpg"),
                                             "contentTypeTree": tree("public.jpeg")]
private let text: [String: MetadataValue] = ["name": .string("todo.txt"), "path": .string("/mnt/c/Documents/notes/todo.txt"),
                                             "contentTypeTree": tree("public.plain-text")]
private let markdown: [String: MetadataValue] = ["name": .string("README.md"), "path": .string("/mnt/c/README.md"),
                                                 "contentTypeTree": tree("net.daringfireball.markdown")]
private let folder: [String: MetadataValue] = ["name": .string("notes"), "path": .string("/mnt/c/Documents/notes"),
                                               "contentTypeTree": tree("public.folder")]
private let empty: [String: MetadataValue] = ["contentTypeTree": .list([])]
private let missing: [String: MetadataValue] = [:]

private func matches(_ predicate: String, _ values: [String: MetadataValue],
                     sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
    do {
        return try Query(predicate: predicate).matches(MetadataItem(values: values))
    } catch {
        Issue.record("\(predicate): \(error)", sourceLocation: sourceLocation)
        return false
    }
}

/// The items of the fixtures a predicate selects, by name.
private func selected(_ predicate: String, sourceLocation: SourceLocation = #_sourceLocation) -> [String] {
    [("jpeg", jpeg), ("text", text), ("markdown", markdown), ("folder", folder), ("empty", empty), ("missing", missing)]
        .filter { matches(predicate, $0.1, sourceLocation: sourceLocation) }.map(\.0)
}

private func queryError(_ text: String, sort: String? = nil) -> QueryError? {
    do {
        _ = try Query(predicate: text, sort: sort)
        return nil
    } catch {
        return error
    }
}

@Suite struct CollectionTests {
    // MARK: The content type tree

    @Test func aComparisonOnTheTreeHoldsIfItHoldsForSomeTypeAsInSpotlight() {
        for spelling in ["NSMetadataItemContentTypeTreeKey", "kMDItemContentTypeTree", "contentTypeTree", "CONTENTTYPETREE"] {
            #expect(selected("\(spelling) == 'public.image'") == ["jpeg"], "\(spelling)")
        }
        #expect(selected("contentTypeTree == 'public.text'") == ["text", "markdown"])
        #expect(selected("contentTypeTree == 'public.content'") == ["jpeg", "text", "markdown"])
        #expect(selected("contentTypeTree == 'public.item'") == ["jpeg", "text", "markdown", "folder"])
        #expect(selected("contentTypeTree == 'public.directory'") == ["folder"])
        #expect(selected("contentTypeTree ==[c] 'PUBLIC.IMAGE'") == ["jpeg"])
        #expect(selected("contentTypeTree == 'public.*text'") == ["text", "markdown"])  // a wildcard ==
        #expect(selected("contentTypeTree BEGINSWITH 'net.'") == ["markdown"])
        #expect(selected("contentTypeTree IN {'public.folder', 'public.jpeg'}") == ["jpeg", "folder"])
        #expect(selected("contentTypeTree MATCHES 'public\\\\.(plain-)?text'") == ["text", "markdown"])
    }

    @Test func notEqualIsTheNegationOfEqualOnACollection() {
        // What `!=` means to a user: not an image. (`ANY … !=` is another question, below.)
        #expect(selected("contentTypeTree != 'public.image'") == ["text", "markdown", "folder", "empty", "missing"])
        #expect(selected("contentTypeTree != 'public.*'") == ["empty", "missing"])
        for predicate in ["contentTypeTree == 'public.text'", "contentTypeTree == 'public.*age'"] {
            let negated = predicate.replacingOccurrences(of: "==", with: "!=")
            #expect(selected(negated) == selected("NOT \(predicate)"), "\(predicate)")
        }
    }

    @Test func valueInTheTreeIsMembership() {
        #expect(selected("'public.image' IN NSMetadataItemContentTypeTreeKey") == ["jpeg"])
        #expect(selected("'public.text' IN contentTypeTree") == ["text", "markdown"])
        #expect(selected("'PUBLIC.TEXT' IN[c] contentTypeTree") == ["text", "markdown"])
        #expect(selected("'public' IN contentTypeTree") == [])  // whole elements, not substrings
        #expect(selected("NOT 'public.content' IN contentTypeTree") == ["folder", "empty", "missing"])
    }

    // MARK: Quantifiers

    @Test func anyAndSomeHoldForSomeElement() {
        #expect(selected("ANY NSMetadataItemContentTypeTreeKey == 'public.text'") == ["text", "markdown"])
        #expect(selected("SOME contentTypeTree == 'public.text'") == ["text", "markdown"])
        #expect(selected("any contentTypeTree == 'public.text'") == ["text", "markdown"])
        // NSPredicate: some element differs, which is nearly every item.
        #expect(selected("ANY contentTypeTree != 'public.image'") == ["jpeg", "text", "markdown", "folder"])
        #expect(selected("ANY contentTypeTree IN {'public.movie', 'public.image'}") == ["jpeg"])
        #expect(selected("ANY contentTypeTree LIKE[c] '*FOLDER'") == ["folder"])
        #expect(selected("ANY contentTypeTree == nil") == [])  // no element is nil
    }

    @Test func allHoldsForEveryElementAndForAnEmptyCollection() {
        #expect(selected("ALL contentTypeTree BEGINSWITH 'public.'") == ["jpeg", "text", "folder", "empty", "missing"])
        #expect(selected("ALL contentTypeTree != 'public.content'") == ["folder", "empty", "missing"])
        #expect(selected("ALL contentTypeTree == 'public.jpeg'") == ["empty", "missing"])
        #expect(selected("ALL contentTypeTree IN {'public.folder', 'public.directory', 'public.item'}") == ["folder", "empty", "missing"])
    }

    @Test func noneIsNotAny() {
        #expect(selected("NONE contentTypeTree == 'public.content'") == ["folder", "empty", "missing"])
        #expect(selected("NONE contentTypeTree BEGINSWITH 'net.'") == ["jpeg", "text", "folder", "empty", "missing"])
        for condition in ["== 'public.text'", "BEGINSWITH 'public.i'", "IN {'public.png', 'public.folder'}", "!= 'public.item'"] {
            #expect(selected("NONE contentTypeTree \(condition)") == selected("NOT ANY contentTypeTree \(condition)"), "\(condition)")
        }
    }

    @Test func nilAsksWhetherThereIsACollection() {
        #expect(selected("contentTypeTree == nil") == ["missing"])
        #expect(selected("contentTypeTree != nil") == ["jpeg", "text", "markdown", "folder", "empty"])
    }

    @Test func countOfACollection() {
        #expect(selected("contentTypeTree.@count == 5") == ["jpeg", "text"])
        #expect(selected("NSMetadataItemContentTypeTreeKey.@count == 6") == ["markdown"])
        #expect(selected("contentTypeTree.@count == 0") == ["empty"])
        #expect(selected("contentTypeTree.@count == nil") == ["missing"])
    }

    // MARK: Path components

    @Test func pathComponentsAreACollection() {
        #expect(selected("ANY path.pathComponents == 'notes'") == ["text", "folder"])
        #expect(selected("'Documents' IN NSMetadataItemPathKey.pathComponents") == ["jpeg", "text", "folder"])
        #expect(selected("path.pathComponents == 'Documents'") == ["jpeg", "text", "folder"])
        #expect(selected("path.pathComponents == '/'") == ["jpeg", "text", "markdown", "folder"])  // the root is a component
        #expect(selected("NONE path.pathComponents == 'Documents'") == ["markdown", "empty", "missing"])
        #expect(selected("ALL path.pathComponents MATCHES '/|[A-Za-z]+'") == ["folder", "empty", "missing"])  // no dotted name
        #expect(selected("ANY path.pathComponents ENDSWITH '.txt'") == ["text"])
        #expect(Compiler.pathComponents("/a//b") == ["/", "a", "b"])
        #expect(Compiler.pathComponents("a/b") == ["a", "b"])
        #expect(Compiler.pathComponents("/") == ["/"])
        for path in ["/a//b", "a/b", "/", "", "/mnt/c/Documents/notes/todo.txt", "//x/"] {
            #expect(Compiler.pathComponentCount(path) == Compiler.pathComponents(path).count, "\(path)")
        }
    }

    // MARK: Parsing

    @Test func canonicalFormKeepsQuantifiersAndParsesToTheSameTree() throws {
        let cases = [
            ("SOME NSMetadataItemContentTypeTreeKey ==[c] 'x'", "ANY contentTypeTree ==[c] \"x\""),
            ("all contentTypeTree beginswith 'public.'", "ALL contentTypeTree BEGINSWITH \"public.\""),
            ("NONE kMDItemPath.pathComponents IN {'a', 'b'}", "NONE path.pathComponents IN {\"a\", \"b\"}"),
            ("'public.image' IN NSMetadataItemContentTypeTreeKey", "ANY contentTypeTree == \"public.image\""),
            ("'ell' IN[c] name", "name CONTAINS[c] \"ell\""),
            ("contentTypeTree != 'public.image'", "contentTypeTree != \"public.image\""),
            ("contentTypeTree.@count > 2", "contentTypeTree.@count > 2"),
            ("NOT ANY path.pathComponents == 'tmp'", "NOT ANY path.pathComponents == \"tmp\""),
        ]
        for (text, canonical) in cases {
            let query = try Query(predicate: text)
            #expect(query.normalizedPredicate == canonical, "\(text)")
            #expect(try Query(predicate: query.normalizedPredicate).tree == query.tree, "\(text)")
        }
        #expect(try Query(predicate: "ANY path.pathComponents == 'a' OR contentTypeTree == 'b'").predicateAttributes
                == ["path", "contentTypeTree"])
    }

    @Test func valueInAStringIsContainsAsInNSPredicate() {
        #expect(matches("'do.t' IN name", text))  // todo.txt
        #expect(!matches("'DO.T' IN name", text))
        #expect(matches("'DO.T' IN[c] name", text))
        #expect(!matches("'z' IN name", text))
    }

    @Test(arguments: [
        // (predicate, column, kind, part of the message)
        ("ANY name == 'a'", 1, QueryError.Kind.type, "'ANY' needs a collection (contentTypeTree and path.pathComponents), but 'name' is a string"),
        ("ALL size > 3", 1, .type, "'ALL' needs a collection"),
        ("NONE path == 'a'", 1, .type, "but 'path' is a string"),
        ("ANY path.pathComponents.@count == 3", 1, .type, "but 'path.pathComponents.@count' is a number"),
        ("SOME contentTypeTree.@count == 3", 1, .type, "'SOME' needs a collection"),
        ("ANY ANY contentTypeTree == 'a'", 5, .syntax, "expected a collection attribute after 'ANY', found 'ANY'"),
        ("ANY 'a' == contentTypeTree", 5, .syntax, "expected a collection attribute after 'ANY', found ''a''"),
        ("ANY", 4, .syntax, "expected a collection attribute after 'ANY', found end of input"),
        ("ANY foo == 1", 5, .name, "unknown attribute 'foo'"),
        ("ANY contentTypeTree", 20, .syntax, "expected a comparison operator after 'contentTypeTree'"),
        ("ANY contentTypeTree > 5", 23, .type, "'contentTypeTree' is a string and cannot be compared with a number"),
        ("contentTypeTree == YES", 20, .type, "'contentTypeTree' is a string"),
        ("contentTypeTree.@count == 'a'", 27, .type, "is a number"),
        ("'a' IN size", 5, .type, "IN needs a collection or a string on its right, but 'size' is a number"),
        ("nil IN contentTypeTree", 1, .type, "nil cannot be IN a collection or a string"),
        ("'a' IN {'a'}", 8, .syntax, "a comparison needs an attribute on one side"),
        ("name.@count == 1", 1, .name, "unknown attribute 'name.@count'"),
        ("contentTypeTree.pathComponents == 'a'", 1, .name, "unknown attribute"),
        ("path.pathComponents.pathComponents == 'a'", 1, .name, "unknown attribute"),
    ])
    func errors(_ text: String, _ column: Int, _ kind: QueryError.Kind, _ message: String) {
        guard let error = queryError(text) else {
            Issue.record("\(text) parsed")
            return
        }
        #expect(error.column == column, "\(text): \(error)")
        #expect(error.kind == kind, "\(text): \(error)")
        #expect(error.message.contains(message), "\(text): \(error)")
    }

    @Test func collectionsAreNotSortKeys() {
        #expect(queryError("TRUEPREDICATE", sort: "name,NSMetadataItemContentTypeTreeKey")
                == QueryError(.type, "'contentTypeTree' is a collection and cannot be a sort key", column: 6))
        #expect(queryError("TRUEPREDICATE", sort: "path.pathComponents")?.kind == .name)
    }

    @Test func hostileQuantifiersAreErrorsOrWorkWithoutCrashing() throws {
        // A long run of quantifiers is one error, not a recursion.
        #expect(queryError(String(repeating: "ANY ", count: 50_000) + "contentTypeTree == 'a'")?.column == 5)
        // Many quantified comparisons: a flat chain.
        let chain = (0..<5_000).map { "ANY contentTypeTree == 'public.t\($0)'" }.joined(separator: " OR ")
        #expect(!(try Query(predicate: chain).matches(MetadataItem(values: text))))
        // NOT before a quantifier counts toward the depth limit, as any NOT does.
        let deep = String(repeating: "NOT ", count: Parser.maximumDepth + 1) + "ANY contentTypeTree == 'a'"
        #expect(queryError(deep)?.message.contains("nests more than") == true)
        let allowed = String(repeating: "NOT ", count: Parser.maximumDepth) + "ANY contentTypeTree == 'public.text'"
        #expect(try Query(predicate: allowed).matches(MetadataItem(values: text)))  // an even number of NOTs
    }

    // MARK: Against a model

    /// Random quantified comparisons on random collections, against the
    /// semantics written out plainly: a quantifier over the scalar model of
    /// the element comparison; no quantifier is ANY, except `!=` (NONE `==`).
    @Test func generatedQuantifiedComparisonsAgreeWithTheModel() throws {
        var rng = SeededRandom(seed: 2026)
        let pool = ["public.text", "public.plain-text", "Public.Text", "public.image", "net.daringfireball.markdown",
                    "café", "cafe\u{301}", "CAFÉ", "a*b", ""]
        let collections: [[String]?] = (0..<300).map { index in
            index % 25 == 0 ? nil : (0..<Int.random(in: 0...4, using: &rng)).map { _ in pool.randomElement(using: &rng)! }
        }
        let items = collections.map { list in
            MetadataItem(values: list.map { ["contentTypeTree": .list($0.map(MetadataValue.string))] } ?? [:])
        }
        let operators = ["==", "!=", "BEGINSWITH", "ENDSWITH", "CONTAINS", "LIKE", "<", ">=", "IN"]
        let modifiers = ["", "[c]", "[d]", "[cd]"]
        for _ in 0..<400 {
            let quantifier = ["", "ANY ", "SOME ", "ALL ", "NONE "].randomElement(using: &rng)!
            let op = operators.randomElement(using: &rng)!
            let modifier = modifiers.randomElement(using: &rng)!
            let (ci, di) = (modifier.contains("c"), modifier.contains("d"))
            let literals = (0..<(op == "IN" ? 2 : 1)).map { _ in pool.randomElement(using: &rng)! }
            let operand = op == "IN" ? "{" + literals.map(Literal.quote).joined(separator: ", ") + "}" : Literal.quote(literals[0])
            let text = "\(quantifier)contentTypeTree \(op)\(modifier) \(operand)"
            let query = try Query(predicate: text)
            for (list, item) in zip(collections, items) {
                func element(_ op: String, _ value: String) -> Bool {
                    Model.compare(.string(value), .string, op, ci, di, literals.map(ModelValue.string))
                }
                let elements = list ?? []
                let expected = switch quantifier {
                case "ALL ": elements.allSatisfy { element(op, $0) }
                case "NONE ": !elements.contains { element(op, $0) }
                case "": op == "!=" ? !elements.contains { element("==", $0) } : elements.contains { element(op, $0) }
                default: elements.contains { element(op, $0) }
                }
                #expect(query.matches(item) == expected, "\(text) on \(String(describing: list))")
            }
        }
    }
}
