import Testing
@testable import UbiquityControl

/// Parse a predicate to its tree, failing the test on errors.
private func tree(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) -> Predicate? {
    do {
        return try Query(predicate: text).tree
    } catch {
        Issue.record("\(text): \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

private func attribute(_ name: String) -> Attribute {
    Attributes.lookup(name)!
}

private func cmp(_ name: String, _ op: ComparisonOperator, _ values: Literal..., options: ComparisonOptions = []) -> Predicate {
    .comparison(Comparison(attribute: attribute(name), op: op, options: options, values: values))
}

private func parseError(_ text: String) -> QueryError? {
    do {
        _ = try Query(predicate: text)
        return nil
    } catch {
        return error
    }
}

@Suite struct ParserTests {
    // MARK: Operators

    @Test(arguments: [
        ("name == 'a'", cmp("name", .equal, .string("a"))),
        ("name = 'a'", cmp("name", .equal, .string("a"))),
        ("name != 'a'", cmp("name", .notEqual, .string("a"))),
        ("name <> 'a'", cmp("name", .notEqual, .string("a"))),
        ("size < 10", cmp("size", .less, .number(10))),
        ("size <= 10", cmp("size", .lessOrEqual, .number(10))),
        ("size =< 10", cmp("size", .lessOrEqual, .number(10))),
        ("size > 10", cmp("size", .greater, .number(10))),
        ("size >= 10", cmp("size", .greaterOrEqual, .number(10))),
        ("size => 10", cmp("size", .greaterOrEqual, .number(10))),
        ("size>10", cmp("size", .greater, .number(10))),
        ("name LIKE '*.md'", cmp("name", .like, .string("*.md"))),
        ("name like '*.md'", cmp("name", .like, .string("*.md"))),
        ("name BEGINSWITH 'a'", cmp("name", .beginsWith, .string("a"))),
        ("name beginsWith 'a'", cmp("name", .beginsWith, .string("a"))),
        ("name ENDSWITH 'a'", cmp("name", .endsWith, .string("a"))),
        ("name CONTAINS 'a'", cmp("name", .contains, .string("a"))),
        ("size IN {1, 2, 3}", cmp("size", .in, .number(1), .number(2), .number(3))),
        ("name in {'a', \"b\"}", cmp("name", .in, .string("a"), .string("b"))),
        ("name IN {}", cmp("name", .in)),
        ("size BETWEEN {1, 5}", cmp("size", .between, .number(1), .number(5))),
        ("5 < size", cmp("size", .greater, .number(5))),
        ("5 >= size", cmp("size", .lessOrEqual, .number(5))),
        ("'a' == name", cmp("name", .equal, .string("a"))),
    ])
    func operators(_ text: String, _ expected: Predicate) {
        #expect(tree(text) == expected, "\(text)")
    }

    @Test(arguments: [
        ("name LIKE[c] '*.md'", ComparisonOptions.caseInsensitive),
        ("name LIKE[d] '*.md'", .diacriticInsensitive),
        ("name LIKE[cd] '*.md'", [.caseInsensitive, .diacriticInsensitive]),
        ("name LIKE[dc] '*.md'", [.caseInsensitive, .diacriticInsensitive]),
        ("name LIKE [C] '*.md'", .caseInsensitive),
    ] as [(String, ComparisonOptions)])
    func modifiers(_ text: String, _ options: ComparisonOptions) {
        #expect(tree(text) == cmp("name", .like, .string("*.md"), options: options))
    }

    @Test func modifiersOnEveryStringOperator() {
        for op in ["==", "!=", "<", "<=", ">", ">=", "LIKE", "BEGINSWITH", "ENDSWITH", "CONTAINS"] {
            guard case .comparison(let c)? = tree("path \(op)[cd] 'x'") else {
                Issue.record("\(op)")
                continue
            }
            #expect(c.options == [.caseInsensitive, .diacriticInsensitive])
        }
        guard case .comparison(let c)? = tree("name IN[c] {'A'}") else { return }
        #expect(c.options == .caseInsensitive)
    }

    // MARK: Literals

    @Test(arguments: [
        ("name == 'it''s'", nil as Literal?),  // not an escape: two strings, an error
        ("name == 'it\\'s'", .string("it's")),
        ("name == \"say \\\"hi\\\"\"", .string("say \"hi\"")),
        ("name == 'a\\\\b'", .string("a\\b")),
        ("name == 'line\\nnext\\ttab\\r'", .string("line\nnext\ttab\r")),
        ("name == '\\u00e9\\u{1F600}'", .string("é😀")),
        ("name == ''", .string("")),
        ("name == 'café ☕️'", .string("café ☕️")),
        ("size == 42", .number(42)),
        ("size == -42", .number(-42)),
        ("size == 4.25", .number(4.25)),
        ("size == -0.5", .number(-0.5)),
        ("size == 1e3", .number(1000)),
        ("size == 2.5E-1", .number(0.25)),
        ("isDirectory == YES", .bool(true)),
        ("isDirectory == yes", .bool(true)),
        ("isDirectory == TRUE", .bool(true)),
        ("isDirectory == NO", .bool(false)),
        ("isDirectory == false", .bool(false)),
        ("isDirectory == 1", .bool(true)),
        ("isDirectory == 0", .bool(false)),
        ("name == nil", .null),
        ("name == NULL", .null),
        ("size == Nil", .null),
        ("creationDate == CAST(\"2026-01-02T03:04:05Z\", \"NSDate\")", .date(1_767_323_045)),
        ("creationDate == CAST('2026-01-02T03:04:05Z', 'NSDate')", .date(1_767_323_045)),
        ("creationDate == CAST(1700000000, \"NSDate\")", .date(1_700_000_000)),
        ("creationDate == cast(1700000000.5, \"NSDate\")", .date(1_700_000_000.5)),
        ("creationDate == DATE(\"2026-01-02\")", .date(1_767_312_000)),
        ("creationDate == DATE(\"2026-01-02T10:00:00Z\")", .date(1_767_348_000)),
        ("creationDate == DATE('2026-01-02T10:00:00+02:00')", .date(1_767_340_800)),
        ("creationDate == DATE('2026-01-02T10:00:00-0130')", .date(1_767_353_400)),
        ("creationDate == DATE('2026-01-02T10:00')", .date(1_767_348_000)),
        ("creationDate == DATE('2026-01-02 10:00:00.5Z')", .date(1_767_348_000.5)),
        ("creationDate == DATE('1969-12-31T23:59:59Z')", .date(-1)),
        ("creationDate == DATE('2024-02-29')", .date(1_709_164_800)),
        ("creationDate == date(0)", .date(0)),
    ])
    func literals(_ text: String, _ expected: Literal?) {
        guard let expected else {
            #expect(parseError(text) != nil)
            return
        }
        guard case .comparison(let c)? = tree(text) else { return }
        #expect(c.value == expected, "\(text)")
    }

    @Test func dateLiteralsAgreeWithTheirSecondsForm() throws {
        let a = try Query(predicate: "modificationDate < DATE('2023-11-14T22:13:20Z')").tree
        let b = try Query(predicate: "modificationDate < CAST(1700000000, 'NSDate')").tree
        #expect(a == b)
    }

    // MARK: Names and aliases

    @Test func aliasesMapToShortNames() throws {
        let pairs: [(String, String)] = [
            ("NSMetadataItemFSNameKey", "name"), ("kMDItemFSName", "name"),
            ("NSMetadataItemPathKey", "path"), ("kMDItemPath", "path"),
            ("NSMetadataItemFSSizeKey", "size"), ("kMDItemFSSize", "size"),
            ("NSMetadataItemContentTypeKey", "contentType"), ("kMDItemContentType", "contentType"),
            ("NSMetadataItemFSCreationDateKey", "creationDate"), ("kMDItemFSCreationDate", "creationDate"),
            ("NSMetadataItemFSContentChangeDateKey", "modificationDate"), ("kMDItemFSContentChangeDate", "modificationDate"),
            ("NSMetadataUbiquitousItemDownloadingStatusKey", "downloadingStatus"),
            ("NSMetadataUbiquitousItemIsDownloadingKey", "isDownloading"),
            ("NSMetadataUbiquitousItemPercentDownloadedKey", "percentDownloaded"),
            ("NSMetadataUbiquitousItemIsUploadedKey", "isUploaded"),
            ("NSMetadataUbiquitousItemIsUploadingKey", "isUploading"),
            ("NSMetadataUbiquitousItemPercentUploadedKey", "percentUploaded"),
            ("NSMetadataUbiquitousItemHasUnresolvedConflictsKey", "hasUnresolvedConflicts"),
            ("NSMetadataUbiquitousItemDownloadingErrorKey", "downloadingError"),
            ("NSMetadataUbiquitousItemUploadingErrorKey", "uploadingError"),
            ("NSMetadataItemContentTypeTreeKey", "contentTypeTree"),
            ("kMDItemContentTypeTree", "contentTypeTree"),
        ]
        for (alias, short) in pairs {
            #expect(Query.canonicalName(alias) == short)
            let value = switch Attributes.lookup(short)!.type {
            case .string: "'x'"
            case .number: "1"
            case .bool: "YES"
            case .date: "DATE('2026-01-01')"
            }
            #expect(try Query(predicate: "\(alias) == \(value)").tree == Query(predicate: "\(short) == \(value)").tree)
        }
        for name in Query.attributeNames {
            #expect(Query.canonicalName(name) == name)
        }
        #expect(Query.attributeNames.count == 21)
        #expect(Query.attributeNames.contains("pinned"))
        #expect(Query.canonicalName("kmditemfsname") == "name")
        #expect(Query.canonicalName("NAME") == "name")
        #expect(Query.canonicalName("foo") == nil)
        #expect(Query.canonicalName("") == nil)
    }

    // MARK: Boolean structure

    @Test func precedenceNotOverAndOverOr() {
        let a = cmp("name", .equal, .string("a"))
        let b = cmp("size", .greater, .number(1))
        let c = cmp("isDirectory", .equal, .bool(true))
        #expect(tree("name == 'a' OR size > 1 AND isDirectory == YES") == .or([a, .and([b, c])]))
        #expect(tree("name == 'a' AND size > 1 OR isDirectory == YES") == .or([.and([a, b]), c]))
        #expect(tree("(name == 'a' OR size > 1) AND isDirectory == YES") == .and([.or([a, b]), c]))
        #expect(tree("NOT name == 'a' AND size > 1") == .and([.not(a), b]))
        #expect(tree("NOT (name == 'a' AND size > 1)") == .not(.and([a, b])))
        #expect(tree("!name == 'a' || size > 1 && isDirectory == YES") == .or([.not(a), .and([b, c])]))
        #expect(tree("not not name == 'a'") == .not(.not(a)))
        #expect(tree("name == 'a' and size > 1 or isDirectory == YES") == .or([.and([a, b]), c]))
        #expect(tree("name == 'a' OR size > 1 OR isDirectory == YES") == .or([a, b, c]))
        #expect(tree("name == 'a' AND size > 1 AND isDirectory == YES") == .and([a, b, c]))
        #expect(tree("((((name == 'a'))))") == a)
        #expect(tree("  name=='a'  ") == a)
        #expect(tree("TRUEPREDICATE") == .constant(true))
        #expect(tree("falsepredicate OR TRUEPREDICATE") == .or([.constant(false), .constant(true)]))
        #expect(tree("NOT TRUEPREDICATE") == .not(.constant(true)))
    }

    /// Nesting is bounded (the parser and everything walking the tree recurse
    /// once per level); chains are not, and cost no depth.
    @Test func nestingIsBoundedAndChainsAreFlat() throws {
        let limit = Parser.maximumDepth
        let deepest = String(repeating: "(", count: limit) + "size > 1" + String(repeating: ")", count: limit)
        #expect(tree(deepest) == cmp("size", .greater, .number(1)))
        for text in [String(repeating: "(", count: limit + 1) + "size > 1" + String(repeating: ")", count: limit + 1),
                     String(repeating: "(", count: 15_000) + "TRUEPREDICATE" + String(repeating: ")", count: 15_000),
                     String(repeating: "(", count: 200_000),
                     String(repeating: "NOT ", count: limit + 1) + "TRUEPREDICATE",
                     String(repeating: "!(", count: 60) + "TRUEPREDICATE" + String(repeating: ")", count: 60)] {
            let error = try #require(parseError(text))
            #expect(error.kind == .syntax)
            #expect(error.message.contains("nests more than \(limit) levels"), "\(error)")
        }
        #expect(tree(String(repeating: "NOT ", count: limit) + "TRUEPREDICATE") != nil)
        // 50,000 operands in one chain: one flat node, matched without recursion.
        let chain = Array(repeating: "size > 1", count: 50_000).joined(separator: " AND ") + " OR name == 'x'"
        let query = try Query(predicate: chain)
        guard case .or(let operands) = query.tree, case .and(let conjuncts) = operands[0] else {
            Issue.record("expected OR of an AND chain")
            return
        }
        #expect(conjuncts.count == 50_000)
        #expect(query.matches(MetadataItem(values: ["size": .number(2), "name": .string("y")])))
        #expect(!query.matches(MetadataItem(values: ["size": .number(0), "name": .string("y")])))
        #expect(try Query(predicate: query.normalizedPredicate).tree == query.tree)
    }

    @Test func canonicalFormParsesToTheSameTree() throws {
        let inputs = [
            "name LIKE[cd] '*.md' AND (size > 1000 OR NOT isDirectory == YES)",
            "creationDate >= DATE('2026-01-02T03:04:05Z') && modificationDate < CAST(1700000000.25, 'NSDate')",
            "path IN {'a\"b', 'c\\\\d', 'e\\nf'} || size BETWEEN {-1.5, 1e6}",
            "5 < size OR name == nil OR TRUEPREDICATE",
            "kMDItemFSName ENDSWITH[c] '.JPG' AND NOT (pinned = NO AND isUploaded == 1)",
        ]
        for input in inputs {
            let query = try Query(predicate: input)
            let again = try Query(predicate: query.normalizedPredicate)
            #expect(again.tree == query.tree, "\(input) → \(query.normalizedPredicate)")
        }
        #expect(try Query(predicate: "kMDItemFSSize>=10 and not isDirectory=yes").normalizedPredicate
            == "size >= 10 AND NOT isDirectory == YES")
    }

    // MARK: Errors

    @Test(arguments: [
        // (predicate, column, kind, part of the message)
        ("name ==", 8, QueryError.Kind.syntax, "expected a value after '=='"),
        ("name ==   ", 8, .syntax, "expected a value after '=='"),
        ("size > 'big'", 8, .type, "'size' is a number and cannot be compared with a string"),
        ("(name == 'a'", 13, .syntax, "expected ')' to close the '(' at column 1"),
        ("((name == 'a') OR size > 1", 27, .syntax, "expected ')' to close the '(' at column 1"),
        ("name == 'a')", 12, .syntax, "unbalanced ')'"),
        ("foo == 1", 1, .name, "unknown attribute 'foo'"),
        ("name == 'a' AND bar == 1", 17, .name, "unknown attribute 'bar'"),
        ("name == 'é' AND foo == 1", 17, .name, "unknown attribute 'foo'"),
        ("name == 'e\u{301}' AND foo == 1", 17, .name, "unknown attribute 'foo'"),
        ("name == 'abc", 9, .syntax, "unterminated string"),
        ("name == \"abc\\\"", 9, .syntax, "unterminated string"),
        ("name == 'a\\qb'", 11, .syntax, "unknown escape sequence '\\q'"),
        ("name == '\\u12'", 10, .syntax, "\\u needs four hex digits"),
        ("name LIKE 5", 11, .type, "'name' is a string and cannot be compared with a number"),
        ("size LIKE '5'", 6, .type, "LIKE needs a string attribute, but 'size' is a number"),
        ("creationDate CONTAINS 'x'", 14, .type, "CONTAINS needs a string attribute"),
        ("size ==[c] 5", 8, .type, "'[c]' applies to string attributes"),
        ("name ==[x] 'a'", 8, .syntax, "unknown modifier 'x'"),
        ("name ==[] 'a'", 8, .syntax, "empty modifier"),
        ("name ==[c 'a'", 10, .syntax, "expected ']'"),
        ("isDirectory < YES", 13, .type, "cannot be ordered"),
        ("isDirectory BETWEEN {NO, YES}", 13, .type, "cannot be ordered"),
        ("isDirectory == 2", 16, .type, "'isDirectory' is a boolean and cannot be compared with a number"),
        ("isDirectory == 'yes'", 16, .type, "(use YES or NO)"),
        ("creationDate > 5", 16, .type, "'creationDate' is a date and cannot be compared with a number"),
        ("creationDate > '2026-01-01'", 16, .type, "write dates as DATE("),
        ("creationDate > DATE(\"2026-13-01\")", 21, .syntax, "invalid date \"2026-13-01\""),
        ("creationDate > DATE(\"2026-02-30\")", 21, .syntax, "invalid date"),
        ("creationDate > DATE(\"yesterday\")", 21, .syntax, "invalid date"),
        ("creationDate > DATE(YES)", 21, .syntax, "expected a date string or a number of seconds after '('"),
        ("creationDate > DATE('2026-01-01'", 33, .syntax, "expected ')' to close the DATE at column 16"),
        ("creationDate == CAST(5, \"NSString\")", 25, .syntax, "CAST supports only \"NSDate\""),
        ("creationDate == CAST(5)", 23, .syntax, "expected ',' and a type name in CAST"),
        ("creationDate == CAST 5", 22, .syntax, "expected '(' after CAST"),
        ("size > NOW", 8, .syntax, "expected a value after '>', found 'NOW'"),
        ("name == foo", 9, .syntax, "(quote strings: 'foo')"),
        ("name == size", 9, .syntax, "comparing two attributes is not supported"),
        ("'a' == 'b'", 8, .syntax, "a comparison needs an attribute on one side"),
        ("'a' LIKE name", 5, .syntax, "LIKE needs the attribute on its left"),
        ("5 < 'x'", 5, .syntax, "a comparison needs an attribute"),
        ("5 < bogus", 5, .name, "unknown attribute 'bogus'"),
        ("5 <", 4, .syntax, "expected an attribute name after '<'"),
        ("size > 1.5.3", 8, .syntax, "malformed number"),
        ("size > 10kb", 8, .syntax, "malformed number"),
        ("size > 1e999", 8, .syntax, "out of range"),
        ("size > - 1", 8, .syntax, "unexpected character '-'"),
        ("name # 'x'", 6, .syntax, "unexpected character '#'"),
        ("name 'x'", 6, .syntax, "expected a comparison operator after 'name', found ''x''"),
        ("name", 5, .syntax, "expected a comparison operator after 'name', found end of input"),
        ("name MATCHES '(x'", 14, .syntax, "invalid regular expression '(x'"),
        ("size MATCHES '1'", 6, .type, "MATCHES needs a string attribute"),
        ("name == 'a' AND", 16, .syntax, "expected a comparison after 'AND'"),
        ("name == 'a' OR OR size > 1", 16, .syntax, "expected an attribute name, found 'OR'"),
        ("NOT", 4, .syntax, "expected a comparison after 'NOT'"),
        ("name == 'a' name == 'b'", 13, .syntax, "expected AND, OR or the end of the predicate, found 'name'"),
        ("()", 2, .syntax, "expected an attribute name, found ')'"),
        ("", 1, .syntax, "empty predicate"),
        ("   ", 1, .syntax, "empty predicate"),
        ("name IN 'a'", 9, .syntax, "expected an aggregate like {1, 2} after 'IN'"),
        ("name IN {'a', }", 15, .syntax, "expected a value after ','"),
        ("name IN {'a' 'b'}", 14, .syntax, "expected ',' or '}' in the aggregate that starts at column 9"),
        ("name IN {'a'", 13, .syntax, "expected ',' or '}'"),
        ("name IN {'a', nil}", 15, .type, "nil cannot be in an aggregate"),
        ("size IN {1, 'two'}", 13, .type, "cannot be compared with a string"),
        ("size BETWEEN {1}", 14, .syntax, "BETWEEN needs exactly two values"),
        ("size BETWEEN {1, 2, 3}", 14, .syntax, "BETWEEN needs exactly two values"),
        ("size == {1}", 9, .syntax, "expected a value after '=='"),
        ("name LIKE[c]", 13, .syntax, "expected a value after '[c]'"),
    ])
    func errors(_ text: String, _ column: Int, _ kind: QueryError.Kind, _ message: String) {
        guard let error = parseError(text) else {
            Issue.record("\(text) parsed without error")
            return
        }
        #expect(error.column == column, "\(text): \(error)")
        #expect(error.kind == kind, "\(text): \(error)")
        #expect(error.message.contains(message), "\(text): \(error)")
    }

    @Test func errorDescription() {
        #expect(parseError("name ==")?.description == "syntax error at column 8: expected a value after '=='")
        #expect(parseError("size > 'big'")?.description
            == "type error at column 8: 'size' is a number and cannot be compared with a string")
        #expect(parseError("foo == 1")?.description == "name error at column 1: unknown attribute 'foo'")
    }

    @Test func sortSpecifications() throws {
        #expect(try Query(predicate: "TRUEPREDICATE", sort: "name").sortKeys == [.init(attribute: "name")])
        #expect(try Query(predicate: "TRUEPREDICATE", sort: "-size, kMDItemFSName ,+creationDate").sortKeys == [
            .init(attribute: "size", ascending: false),
            .init(attribute: "name"),
            .init(attribute: "creationDate"),
        ])
        #expect(try Query(predicate: "TRUEPREDICATE").sortKeys == [])

        func sortError(_ sort: String) -> QueryError? {
            do {
                _ = try Query(predicate: "TRUEPREDICATE", sort: sort)
                return nil
            } catch {
                return error
            }
        }
        #expect(sortError("name,-foo") == QueryError(.name, "unknown sort key 'foo'", column: 7))
        #expect(sortError("name, bar") == QueryError(.name, "unknown sort key 'bar'", column: 7))
        #expect(sortError("name,,size")?.column == 6)
        #expect(sortError("-")?.column == 2)
        #expect(sortError("")?.kind == .syntax)
    }
}
