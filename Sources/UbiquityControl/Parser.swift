/// Recursive-descent parser with type checking; recursion is bounded by
/// `maximumDepth` (AND/OR chains are loops, not recursion).
///
///     predicate  := or
///     or         := and (("OR" | "||") and)*
///     and        := not (("AND" | "&&") not)*
///     not        := ("NOT" | "!") not | primary
///     primary    := "(" predicate ")" | "TRUEPREDICATE" | "FALSEPREDICATE" | comparison
///     attribute  := name ("." "pathComponents")? ("." "@count")?  (one token; pathComponents
///                                                                 only on path, @count on collections)
///     comparison := quantifier? attribute operator modifier? operand   (a quantifier needs a collection)
///                 | value ("==" | "!=" | "<" | "<=" | ">" | ">=") modifier? attribute
///                 | value "IN" modifier? attribute                 (a collection, or a string: CONTAINS)
///     quantifier := "ANY" | "SOME" | "ALL" | "NONE"
///     operand    := value | "{" (value ("," value)*)? "}"        (aggregates after IN / BETWEEN)
///     value      := string | number | YES | NO | TRUE | FALSE | NIL | NULL | constant
///                 | CAST(string | number, "NSDate") | DATE(string | number)
///     constant   := NSMetadataUbiquitousItemDownloadingStatus(Current | Downloaded | NotDownloaded)
struct Parser {
    /// How deeply parentheses and NOTs may nest: the parser recurses once per
    /// level, and so does everything that walks the tree. A client of the
    /// daemon sends any text it likes; none may exhaust a thread's stack.
    static let maximumDepth = 100

    private var tokens: [Token]
    private var position = 0
    /// Parentheses and NOTs open at the current token.
    private var depth = 0

    private static let reservedWords: Set<String> = [
        "AND", "OR", "NOT", "TRUEPREDICATE", "FALSEPREDICATE", "LIKE", "BEGINSWITH", "ENDSWITH",
        "CONTAINS", "IN", "BETWEEN", "MATCHES", "ANY", "ALL", "SOME", "NONE",
        "YES", "NO", "TRUE", "FALSE", "NIL", "NULL", "CAST", "DATE",
    ]

    private static let keywordOperators: [String: ComparisonOperator] = [
        "LIKE": .like, "BEGINSWITH": .beginsWith, "ENDSWITH": .endsWith,
        "CONTAINS": .contains, "IN": .in, "BETWEEN": .between, "MATCHES": .matches,
    ]

    private static let symbolOperators: [String: ComparisonOperator] = [
        "==": .equal, "=": .equal, "!=": .notEqual, "<>": .notEqual,
        "<": .less, "<=": .lessOrEqual, "=<": .lessOrEqual,
        ">": .greater, ">=": .greaterOrEqual, "=>": .greaterOrEqual,
    ]

    static func parse(_ text: String) throws(QueryError) -> Predicate {
        var parser = Parser(tokens: try Lexer.tokenize(text))
        if parser.current.kind == .end {
            throw QueryError(.syntax, "empty predicate (TRUEPREDICATE matches everything)", column: 1)
        }
        let predicate = try parser.parseOr()
        let token = parser.current
        if token.kind != .end {
            if token.kind == .symbol(")") {
                throw QueryError(.syntax, "unbalanced ')' (no matching '(')", column: token.column)
            }
            throw QueryError(.syntax, "expected AND, OR or the end of the predicate, found \(token.quoted)", column: token.column)
        }
        return predicate
    }

    private init(tokens: [Token]) {
        self.tokens = tokens
    }

    // MARK: Tokens

    private var current: Token { tokens[position] }

    private mutating func advance() -> Token {
        let token = tokens[position]
        if position < tokens.count - 1 { position += 1 }
        return token
    }

    /// The column to report for a token: the end of input is reported right
    /// after the last token, whatever whitespace follows.
    private func column(of token: Token) -> Int {
        guard token.kind == .end else { return token.column }
        return tokens.count > 1 ? tokens[tokens.count - 2].endColumn : 1
    }

    private func keyword(_ token: Token) -> String? {
        guard case .identifier(let name) = token.kind else { return nil }
        let upper = name.uppercased()
        return Self.reservedWords.contains(upper) ? upper : nil
    }

    private func isKeyword(_ token: Token, _ words: String...) -> Bool {
        guard let word = keyword(token) else { return false }
        return words.contains(word)
    }

    private func isSymbol(_ token: Token, _ symbols: String...) -> Bool {
        guard case .symbol(let s) = token.kind else { return false }
        return symbols.contains(s)
    }

    private mutating func expectSymbol(_ symbol: String, _ message: @autoclosure () -> String) throws(QueryError) -> Token {
        guard isSymbol(current, symbol) else {
            throw QueryError(.syntax, "\(message()), found \(current.quoted)", column: column(of: current))
        }
        return advance()
    }

    // MARK: Boolean structure

    private mutating func parseOr() throws(QueryError) -> Predicate {
        var operands = [try parseAnd()]
        while isKeyword(current, "OR") || isSymbol(current, "||") {
            _ = advance()
            operands.append(try parseAnd())
        }
        return operands.count == 1 ? operands[0] : .or(operands)
    }

    private mutating func parseAnd() throws(QueryError) -> Predicate {
        var operands = [try parseNot()]
        while isKeyword(current, "AND") || isSymbol(current, "&&") {
            _ = advance()
            operands.append(try parseNot())
        }
        return operands.count == 1 ? operands[0] : .and(operands)
    }

    /// NOTs are counted in a loop (no recursion), each one a level of depth.
    private mutating func parseNot() throws(QueryError) -> Predicate {
        var negations = 0
        while isKeyword(current, "NOT") || isSymbol(current, "!") {
            try enter(advance())
            negations += 1
        }
        var predicate = try parsePrimary()
        for _ in 0..<negations { predicate = .not(predicate) }
        depth -= negations
        return predicate
    }

    private mutating func parsePrimary() throws(QueryError) -> Predicate {
        let token = current
        if isSymbol(token, "(") {
            try enter(advance())
            let inner = try parseOr()
            _ = try expectSymbol(")", "expected ')' to close the '(' at column \(token.column)")
            depth -= 1
            return inner
        }
        if isKeyword(token, "TRUEPREDICATE") {
            _ = advance()
            return .constant(true)
        }
        if isKeyword(token, "FALSEPREDICATE") {
            _ = advance()
            return .constant(false)
        }
        return .comparison(try parseComparison())
    }

    /// One more level of parentheses or NOT, at `token`; refused past `maximumDepth`.
    private mutating func enter(_ token: Token) throws(QueryError) {
        depth += 1
        if depth > Self.maximumDepth {
            throw QueryError(.syntax, "the predicate nests more than \(Self.maximumDepth) levels of parentheses and NOT",
                             column: token.column)
        }
    }

    // MARK: Comparisons

    private mutating func parseComparison() throws(QueryError) -> Comparison {
        let first = current
        if let quantifier = quantifier(first) {
            _ = advance()
            let nameToken = current
            guard case .identifier(let name) = nameToken.kind, keyword(nameToken) == nil, Attributes.constants[name] == nil else {
                throw QueryError(.syntax, "expected a collection attribute after \(first.quoted), found \(nameToken.quoted)",
                                 column: column(of: nameToken))
            }
            _ = advance()
            guard let attribute = Attributes.lookup(name) else {
                throw QueryError(.name, "unknown attribute '\(name)'", column: nameToken.column)
            }
            guard attribute.isCollection else {
                throw QueryError(.type, "\(first.quoted) needs a collection (\(Attributes.collectionsDescription)), "
                                 + "but '\(attribute.spelled)' is \(attribute.type.article)", column: first.column)
            }
            var comparison = try parseRest(of: attribute, named: nameToken)
            comparison.quantifier = quantifier
            return comparison
        }
        if case .identifier(let name) = first.kind, keyword(first) == nil, Attributes.constants[name] == nil {
            _ = advance()
            guard let attribute = Attributes.lookup(name) else {
                throw QueryError(.name, "unknown attribute '\(name)'", column: first.column)
            }
            return try parseRest(of: attribute, named: first)
        }
        if startsValue(first) {
            return try parseReversed()
        }
        let what = first.kind == .end ? "expected a comparison after \(previousQuoted)" : "expected an attribute name, found \(first.quoted)"
        throw QueryError(.syntax, what, column: column(of: first))
    }

    /// `ANY`, `SOME` (the same), `ALL`, `NONE`.
    private func quantifier(_ token: Token) -> Quantifier? {
        switch keyword(token) {
        case "ANY", "SOME": .any
        case "ALL": .all
        case "NONE": .noElement
        default: nil
        }
    }

    private var previousQuoted: String {
        position > 0 ? tokens[position - 1].quoted : "the start"
    }

    /// `attribute OP …` after the attribute.
    private mutating func parseRest(of attribute: Attribute, named nameToken: Token) throws(QueryError) -> Comparison {
        let opToken = current
        guard let op = try comparisonOperator(opToken) else {
            throw QueryError(.syntax, "expected a comparison operator after \(nameToken.quoted), found \(opToken.quoted)",
                             column: column(of: opToken))
        }
        _ = advance()
        let (options, modifierToken) = try parseModifier()
        try checkOperator(op, opToken: opToken, on: attribute, options: options, modifierToken: modifierToken)

        let afterOperator = modifierToken ?? opToken
        var values: [Literal]
        if op == .in || op == .between {
            let open = current
            guard isSymbol(open, "{") else {
                throw QueryError(.syntax, "expected an aggregate like {1, 2} after \(afterOperator.quoted), found \(open.quoted)",
                                 column: column(of: open))
            }
            values = []
            _ = advance()
            if !isSymbol(current, "}") {
                while true {
                    let valueToken = current
                    let value = try parseValue(after: values.isEmpty ? open : tokens[position - 1])
                    if value == .null {
                        throw QueryError(.type, "nil cannot be in an aggregate", column: valueToken.column)
                    }
                    values.append(try check(value, at: valueToken, for: attribute))
                    if isSymbol(current, ",") {
                        _ = advance()
                        continue
                    }
                    _ = try expectSymbol("}", "expected ',' or '}' in the aggregate that starts at column \(open.column)")
                    break
                }
            } else {
                _ = advance()
            }
            if op == .between && values.count != 2 {
                throw QueryError(.syntax, "BETWEEN needs exactly two values {low, high}", column: open.column)
            }
        } else {
            let valueToken = current
            let value = try parseValue(after: afterOperator)
            values = [try check(value, at: valueToken, for: attribute)]
            if op == .matches, case .string(let pattern) = value, RegularExpression.make(pattern, options: options) == nil {
                throw QueryError(.syntax, "invalid regular expression \(valueToken.text)", column: valueToken.column)
            }
        }
        return Comparison(attribute: attribute, op: op, options: options, values: values)
    }

    /// `value OP attribute`, turned around to `attribute OP' value`;
    /// `value IN collection` is `ANY collection == value`, and `value IN string`
    /// is `string CONTAINS value` (NSPredicate's reading of IN with a string).
    private mutating func parseReversed() throws(QueryError) -> Comparison {
        let valueToken = current
        let value = try parseValue(after: valueToken)
        let opToken = current
        guard let op = try comparisonOperator(opToken) else {
            throw QueryError(.syntax, "expected a comparison operator after the value, found \(opToken.quoted)", column: column(of: opToken))
        }
        guard op.swapped != nil || op == .in else {
            throw QueryError(.syntax, "\(op.rawValue) needs the attribute on its left", column: opToken.column)
        }
        _ = advance()
        let (options, modifierToken) = try parseModifier()
        let nameToken = current
        guard case .identifier(let name) = nameToken.kind, keyword(nameToken) == nil else {
            if startsValue(nameToken) || isSymbol(nameToken, "{") {
                throw QueryError(.syntax, "a comparison needs an attribute on one side", column: nameToken.column)
            }
            throw QueryError(.syntax, "expected an attribute name after \((modifierToken ?? opToken).quoted), found \(nameToken.quoted)",
                             column: column(of: nameToken))
        }
        _ = advance()
        guard let attribute = Attributes.lookup(name) else {
            throw QueryError(.name, "unknown attribute '\(name)'", column: nameToken.column)
        }
        let swapped: ComparisonOperator
        var quantifier: Quantifier?
        if let reversed = op.swapped {
            swapped = reversed
        } else if value == .null {  // IN
            throw QueryError(.type, "nil cannot be IN a collection or a string", column: valueToken.column)
        } else if attribute.isCollection {
            (swapped, quantifier) = (.equal, .any)
        } else if attribute.type == .string {
            swapped = .contains
        } else {
            throw QueryError(.type, "IN needs a collection or a string on its right, but '\(attribute.spelled)' is \(attribute.type.article)",
                             column: opToken.column)
        }
        try checkOperator(swapped, opToken: opToken, on: attribute, options: options, modifierToken: modifierToken)
        let checked = try check(value, at: valueToken, for: attribute)
        return Comparison(attribute: attribute, op: swapped, options: options, values: [checked], quantifier: quantifier)
    }

    private func comparisonOperator(_ token: Token) throws(QueryError) -> ComparisonOperator? {
        switch token.kind {
        case .symbol(let s):
            return Self.symbolOperators[s]
        case .identifier:
            if let word = keyword(token) {
                return Self.keywordOperators[word]
            }
            return nil
        default:
            return nil
        }
    }

    private mutating func parseModifier() throws(QueryError) -> (ComparisonOptions, Token?) {
        guard case .modifier(let letters) = current.kind else { return ([], nil) }
        let token = advance()
        var options: ComparisonOptions = []
        if letters.isEmpty {
            throw QueryError(.syntax, "empty modifier (use [c], [d] or [cd])", column: token.column)
        }
        for letter in letters {
            switch letter {
            case "c", "C": options.insert(.caseInsensitive)
            case "d", "D": options.insert(.diacriticInsensitive)
            default:
                throw QueryError(.syntax, "unknown modifier '\(letter)' (use [c], [d] or [cd])", column: token.column)
            }
        }
        return (options, token)
    }

    /// Whether the operator fits the attribute's type.
    private func checkOperator(_ op: ComparisonOperator, opToken: Token, on attribute: Attribute,
                               options: ComparisonOptions, modifierToken: Token?) throws(QueryError) {
        if op.isStringOnly && attribute.type != .string {
            throw QueryError(.type, "\(op.rawValue) needs a string attribute, but '\(attribute.spelled)' is \(attribute.type.article)",
                             column: opToken.column)
        }
        if op.isOrdering && attribute.type == .bool {
            throw QueryError(.type, "'\(attribute.spelled)' is a boolean and cannot be ordered with \(opToken.quoted)",
                             column: opToken.column)
        }
        if let modifierToken, attribute.type != .string {
            throw QueryError(.type, "\(modifierToken.quoted) applies to string attributes, but '\(attribute.spelled)' is \(attribute.type.article)",
                             column: modifierToken.column)
        }
    }

    /// Whether the literal fits the attribute; booleans also accept 0 and 1.
    private func check(_ value: Literal, at token: Token, for attribute: Attribute) throws(QueryError) -> Literal {
        guard let type = value.type, type != attribute.type else { return value }
        if attribute.type == .bool, case .number(let n) = value, n == 0 || n == 1 {
            return .bool(n == 1)
        }
        var message = "'\(attribute.spelled)' is \(attribute.type.article) and cannot be compared with \(type.article)"
        switch attribute.type {
        case .date: message += " (write dates as DATE(\"2026-01-02\") or CAST(\"2026-01-02T03:04:05Z\", \"NSDate\"))"
        case .bool: message += " (use YES or NO)"
        case .string: message += " (quote strings: 'text')"
        case .number: break
        }
        throw QueryError(.type, message, column: token.column)
    }

    // MARK: Values

    private func startsValue(_ token: Token) -> Bool {
        switch token.kind {
        case .string, .number: true
        case .identifier(let name):
            isKeyword(token, "YES", "NO", "TRUE", "FALSE", "NIL", "NULL", "CAST", "DATE") || Attributes.constants[name] != nil
        default: false
        }
    }

    /// A value; `previous` names what came before it, for messages.
    private mutating func parseValue(after previous: Token) throws(QueryError) -> Literal {
        let token = current
        switch token.kind {
        case .string(let s):
            _ = advance()
            return .string(s)
        case .number(let n):
            _ = advance()
            return .number(n)
        case .identifier(let name):
            switch keyword(token) {
            case "YES", "TRUE":
                _ = advance()
                return .bool(true)
            case "NO", "FALSE":
                _ = advance()
                return .bool(false)
            case "NIL", "NULL":
                _ = advance()
                return .null
            case "CAST":
                _ = advance()
                return try parseCast(token)
            case "DATE":
                _ = advance()
                return try parseDateFunction(token)
            case nil:
                if let constant = Attributes.constants[name] {
                    _ = advance()
                    return constant
                }
                if Attributes.lookup(name) != nil {
                    throw QueryError(.syntax, "comparing two attributes is not supported; expected a value after \(previous.quoted)",
                                     column: token.column)
                }
                throw QueryError(.syntax, "expected a value after \(previous.quoted), found '\(name)' (quote strings: '\(name)')",
                                 column: token.column)
            default:
                break
            }
        default:
            break
        }
        let found = token.kind == .end ? "" : ", found \(token.quoted)"
        throw QueryError(.syntax, "expected a value after \(previous.quoted)\(found)", column: column(of: token))
    }

    /// After `CAST`: `(string | number, "NSDate")`.
    private mutating func parseCast(_ castToken: Token) throws(QueryError) -> Literal {
        let open = try expectSymbol("(", "expected '(' after CAST")
        let seconds = try parseDateArgument(after: open)
        let comma = try expectSymbol(",", "expected ',' and a type name in CAST")
        let typeToken = current
        guard case .string(let typeName) = typeToken.kind else {
            throw QueryError(.syntax, "expected the type name \"NSDate\" after \(comma.quoted)", column: column(of: typeToken))
        }
        guard typeName.lowercased() == "nsdate" else {
            throw QueryError(.syntax, "CAST supports only \"NSDate\", not \"\(typeName)\"", column: typeToken.column)
        }
        _ = advance()
        _ = try expectSymbol(")", "expected ')' to close the CAST at column \(castToken.column)")
        return .date(seconds)
    }

    /// After `DATE`: `(string | number)`.
    private mutating func parseDateFunction(_ dateToken: Token) throws(QueryError) -> Literal {
        let open = try expectSymbol("(", "expected '(' after DATE")
        let seconds = try parseDateArgument(after: open)
        _ = try expectSymbol(")", "expected ')' to close the DATE at column \(dateToken.column)")
        return .date(seconds)
    }

    /// An ISO 8601 string or a number of seconds since 1970.
    private mutating func parseDateArgument(after previous: Token) throws(QueryError) -> Double {
        let token = current
        switch token.kind {
        case .number(let n):
            _ = advance()
            return n
        case .string(let s):
            guard let seconds = ISO8601.parse(s) else {
                throw QueryError(.syntax, "invalid date \(token.text) (expected ISO 8601 such as 2026-01-02 or 2026-01-02T03:04:05Z)",
                                 column: token.column)
            }
            _ = advance()
            return seconds
        default:
            throw QueryError(.syntax, "expected a date string or a number of seconds after \(previous.quoted), found \(token.quoted)",
                             column: column(of: token))
        }
    }
}
