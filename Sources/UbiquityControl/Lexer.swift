/// Tokens of the predicate language, each with its 1-based column.
struct Token: Equatable {
    enum Kind: Equatable {
        /// An attribute name, keyword, or function name.
        case identifier(String)
        case string(String)
        case number(Double)
        /// Punctuation and symbolic operators: `==` `=` `!=` `<>` `<` `<=` `=<`
        /// `>` `>=` `=>` `&&` `||` `!` `(` `)` `{` `}` `,`.
        case symbol(String)
        /// A comparison modifier such as `[cd]`: the letters inside the brackets.
        case modifier(String)
        case end
    }

    var kind: Kind
    var column: Int
    /// The column just after the token.
    var endColumn: Int
    /// The token as written, for messages.
    var text: String

    /// How the token is named in messages.
    var quoted: String {
        kind == .end ? "end of input" : "'\(text)'"
    }
}

/// Splits a predicate into tokens. Columns count characters (grapheme clusters).
struct Lexer {
    private let chars: [Character]
    private var index = 0

    init(_ text: String) {
        chars = Array(text)
    }

    static func tokenize(_ text: String) throws(QueryError) -> [Token] {
        var lexer = Lexer(text)
        var tokens: [Token] = []
        while true {
            let token = try lexer.next()
            tokens.append(token)
            if token.kind == .end { return tokens }
        }
    }

    private func peek(_ offset: Int = 0) -> Character? {
        index + offset < chars.count ? chars[index + offset] : nil
    }

    private func text(from start: Int) -> String {
        String(chars[start..<index])
    }

    private func token(_ kind: Token.Kind, from start: Int) -> Token {
        Token(kind: kind, column: start + 1, endColumn: index + 1, text: text(from: start))
    }

    mutating func next() throws(QueryError) -> Token {
        while let c = peek(), c.isWhitespace { index += 1 }
        let start = index
        guard let c = peek() else {
            return Token(kind: .end, column: index + 1, endColumn: index + 1, text: "")
        }
        if c == "'" || c == "\"" {
            return try string(quote: c)
        }
        if c.isASCII, c.isNumber || (c == "-" && (peek(1)?.isASCII ?? false) && (peek(1)?.isNumber ?? false)) {
            return try number()
        }
        if isIdentifierStart(c) {
            // Key paths are one identifier: `NSMetadataItemPathKey.pathComponents.@count`.
            while let d = peek() {
                if isIdentifierStart(d) || (d.isASCII && d.isNumber) {
                    index += 1
                } else if d == ".", let e = peek(1), isIdentifierStart(e) || e == "@" {
                    index += 2
                } else {
                    break
                }
            }
            return token(.identifier(text(from: start)), from: start)
        }
        if c == "[" {
            index += 1
            while let d = peek(), d.isLetter { index += 1 }
            guard peek() == "]" else {
                throw QueryError(.syntax, "expected ']' to close the modifier that starts at column \(start + 1)", column: index + 1)
            }
            let letters = String(chars[(start + 1)..<index])
            index += 1
            return token(.modifier(letters), from: start)
        }
        for symbol in ["==", "!=", "<>", "<=", "=<", ">=", "=>", "&&", "||", "=", "<", ">", "!", "(", ")", "{", "}", ","] {
            let symbolChars = Array(symbol)
            if index + symbolChars.count <= chars.count, Array(chars[index..<(index + symbolChars.count)]) == symbolChars {
                index += symbolChars.count
                return token(.symbol(symbol), from: start)
            }
        }
        throw QueryError(.syntax, "unexpected character '\(c)'", column: start + 1)
    }

    private func isIdentifierStart(_ c: Character) -> Bool {
        c == "_" || c == "$" || c.isLetter
    }

    private mutating func number() throws(QueryError) -> Token {
        let start = index
        if peek() == "-" { index += 1 }
        func digits() { while let d = peek(), d.isASCII, d.isNumber { index += 1 } }
        digits()
        if peek() == ".", let d = peek(1), d.isASCII, d.isNumber {
            index += 1
            digits()
        }
        if peek() == "e" || peek() == "E" {
            var offset = 1
            if peek(1) == "+" || peek(1) == "-" { offset = 2 }
            if let d = peek(offset), d.isASCII, d.isNumber {
                index += offset
                digits()
            }
        }
        if let d = peek(), isIdentifierStart(d) || d == "." {
            throw QueryError(.syntax, "malformed number '\(text(from: start))\(d)'", column: start + 1)
        }
        guard let value = Double(text(from: start)) else {
            throw QueryError(.syntax, "malformed number '\(text(from: start))'", column: start + 1)
        }
        guard value.isFinite else {
            throw QueryError(.syntax, "number '\(text(from: start))' is out of range", column: start + 1)
        }
        return token(.number(value), from: start)
    }

    private mutating func string(quote: Character) throws(QueryError) -> Token {
        let start = index
        index += 1
        var value = ""
        while true {
            guard let c = peek() else {
                throw QueryError(.syntax, "unterminated string (missing closing \(quote))", column: start + 1)
            }
            index += 1
            if c == quote { break }
            if c != "\\" {
                value.append(c)
                continue
            }
            let escapeColumn = index
            guard let e = peek() else {
                throw QueryError(.syntax, "unterminated string (missing closing \(quote))", column: start + 1)
            }
            index += 1
            switch e {
            case "\\", "'", "\"": value.append(e)
            case "n": value.append("\n")
            case "t": value.append("\t")
            case "r": value.append("\r")
            case "0": value.append("\0")
            case "u":
                value.unicodeScalars.append(try unicodeEscape(column: escapeColumn))
            default:
                throw QueryError(.syntax, "unknown escape sequence '\\\(e)' in string", column: escapeColumn)
            }
        }
        return token(.string(value), from: start)
    }

    /// After `\u`: four hex digits or `{1-8 hex digits}`.
    private mutating func unicodeEscape(column: Int) throws(QueryError) -> Unicode.Scalar {
        var hex = ""
        if peek() == "{" {
            index += 1
            while let d = peek(), d.isHexDigit, hex.count < 8 {
                hex.append(d)
                index += 1
            }
            guard peek() == "}" else {
                throw QueryError(.syntax, "malformed \\u{…} escape in string", column: column)
            }
            index += 1
        } else {
            while hex.count < 4, let d = peek(), d.isHexDigit {
                hex.append(d)
                index += 1
            }
            guard hex.count == 4 else {
                throw QueryError(.syntax, "\\u needs four hex digits or {…}", column: column)
            }
        }
        guard !hex.isEmpty, let code = UInt32(hex, radix: 16), let scalar = Unicode.Scalar(code) else {
            throw QueryError(.syntax, "invalid Unicode scalar \\u\(hex) in string", column: column)
        }
        return scalar
    }
}
