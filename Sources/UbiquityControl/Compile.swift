import Foundation

typealias ItemMatcher = @Sendable (MetadataItem) -> Bool

/// Turns a checked predicate into a tree of closures; literals are folded,
/// patterns compiled and sets built once, here.
///
/// Semantics of missing values: an item whose value is missing, `.null`, or of
/// another type than the attribute's is "no value". `== nil` is true only for a
/// missing or `.null` value, `!= nil` is its negation; `!=` is always the negation
/// of `==`; every other comparison with no value, or with a `nil` literal, is false.
/// Dates compare at whole-second resolution (both sides rounded down).
/// A string `==` whose literal holds `*` or `?` is a wildcard match, as LIKE
/// (Spotlight's rule; `NSMetadataItemFSNameKey == '*'` matches every item).
enum Compiler {
    static func compile(_ predicate: Predicate) -> ItemMatcher {
        switch predicate {
        case .constant(let value):
            return { _ in value }
        case .not(let inner):
            let inner = compile(inner)
            return { !inner($0) }
        case .and(let operands):
            let operands = operands.map(compile)
            return { item in operands.allSatisfy { $0(item) } }
        case .or(let operands):
            let operands = operands.map(compile)
            return { item in operands.contains { $0(item) } }
        case .comparison(let comparison):
            return compile(comparison)
        }
    }

    static func compile(_ c: Comparison) -> ItemMatcher {
        if let keyPath = c.attribute.keyPath {
            // The derived value, compared as an attribute of its own.
            var plain = c
            plain.attribute = Attribute(name: c.attribute.spelled, type: c.attribute.type)
            let inner = compile(plain)
            let source = c.attribute.name, derived = plain.attribute.name
            return { item in
                guard case .string(let s)? = item.values[source] else { return inner(MetadataItem()) }
                switch keyPath {
                case .pathComponentsCount:
                    let count = s.split(separator: "/").count + (s.hasPrefix("/") ? 1 : 0)
                    return inner(MetadataItem(values: [derived: .number(Double(count))]))
                }
            }
        }
        let key = c.attribute.name
        if c.values.count == 1, c.value == .null {
            switch c.op {
            case .equal: return { isNull($0.values[key]) }
            case .notEqual: return { !isNull($0.values[key]) }
            default: return { _ in false }
            }
        }
        switch c.attribute.type {
        case .string:
            return compileString(c)
        case .number:
            let values = c.values.map { if case .number(let n) = $0 { n } else { Double.nan } }
            return ordered(c.op, values) { item -> Double? in
                if case .number(let n)? = item.values[key] { return n }
                return nil
            }
        case .date:
            let values = c.values.map { if case .date(let d) = $0 { d.rounded(.down) } else { Double.nan } }
            return ordered(c.op, values) { item -> Double? in
                switch item.values[key] {
                case .date(let d)?, .number(let d)?: d.rounded(.down)
                default: nil
                }
            }
        case .bool:
            let values = c.values.map { if case .bool(let b) = $0 { b } else { false } }
            let extract: @Sendable (MetadataItem) -> Bool? = { item in
                switch item.values[key] {
                case .bool(let b)?: b
                case .number(let n)?: n != 0
                default: nil
                }
            }
            switch c.op {
            case .equal:
                let value = values[0]
                return { extract($0) == value }
            case .notEqual:
                let value = values[0]
                return { extract($0) != value }
            default:  // IN
                let hasTrue = values.contains(true), hasFalse = values.contains(false)
                return { item in
                    guard let b = extract(item) else { return false }
                    return b ? hasTrue : hasFalse
                }
            }
        }
    }

    @inline(__always)
    private static func isNull(_ value: MetadataValue?) -> Bool {
        switch value {
        case nil, .null?: true
        default: false
        }
    }

    private static func compileString(_ c: Comparison) -> ItemMatcher {
        let key = c.attribute.name
        let literals = c.values.map { if case .string(let s) = $0 { s } else { "" } }
        // Spotlight's `==` on a string with `*` or `?` is a wildcard match, as LIKE.
        if c.op == .equal || c.op == .notEqual, literals[0].contains(where: { $0 == "*" || $0 == "?" }) {
            let pattern = WildcardPattern(like: literals[0], options: c.options)
            let negate = c.op == .notEqual
            return { item in
                guard case .string(let s)? = item.values[key] else { return negate }
                return pattern.matches(s) != negate
            }
        }
        if c.op == .matches {
            // Checked by the parser.
            guard let regex = RegularExpression.make(literals[0], options: c.options) else { return { _ in false } }
            let diacritics = StringFolder(options: c.options.intersection(.diacriticInsensitive))
            return { item in
                guard case .string(let s)? = item.values[key] else { return false }
                return regex.matches(diacritics.fold(s))
            }
        }
        if c.op.isStringOnly {
            let pattern = c.op == .like
                ? WildcardPattern(like: literals[0], options: c.options)
                : WildcardPattern(c.op, literal: literals[0], options: c.options)
            return { item in
                guard case .string(let s)? = item.values[key] else { return false }
                return pattern.matches(s)
            }
        }
        let folder = StringFolder(options: c.options)
        let folded = literals.map(folder.fold)
        if folder.isIdentity {
            return ordered(c.op, folded) { item -> String? in
                if case .string(let s)? = item.values[key] { return s }
                return nil
            }
        }
        return ordered(c.op, folded) { item -> String? in
            if case .string(let s)? = item.values[key] { return folder.fold(s) }
            return nil
        }
    }

    /// ==, !=, <, <=, >, >=, IN and BETWEEN on comparable values.
    private static func ordered<T: Comparable & Hashable & Sendable>(
        _ op: ComparisonOperator, _ values: [T], _ extract: @escaping @Sendable (MetadataItem) -> T?
    ) -> ItemMatcher {
        switch op {
        case .equal:
            let value = values[0]
            return { extract($0) == value }
        case .notEqual:
            let value = values[0]
            return { extract($0) != value }
        case .less:
            let value = values[0]
            return { item in extract(item).map { $0 < value } ?? false }
        case .lessOrEqual:
            let value = values[0]
            return { item in extract(item).map { $0 <= value } ?? false }
        case .greater:
            let value = values[0]
            return { item in extract(item).map { $0 > value } ?? false }
        case .greaterOrEqual:
            let value = values[0]
            return { item in extract(item).map { $0 >= value } ?? false }
        case .in:
            let set = Set(values)
            return { item in extract(item).map { set.contains($0) } ?? false }
        case .between:
            let low = values[0], high = values[1]
            return { item in extract(item).map { low <= $0 && $0 <= high } ?? false }
        case .like, .beginsWith, .endsWith, .contains, .matches:
            return { _ in false }  // rejected by the parser for non-strings
        }
    }
}

/// MATCHES: an ICU regular expression (NSRegularExpression) that must match
/// the whole string; `[c]` is its case-insensitive option, `[d]` folds the
/// subject's diacritics (not the pattern's, whose escapes must stay as written).
struct RegularExpression: @unchecked Sendable {
    // NSRegularExpression is immutable and documented as thread-safe.
    private let regex: NSRegularExpression

    /// nil if the pattern is not a valid expression.
    static func make(_ pattern: String, options: ComparisonOptions) -> RegularExpression? {
        let flags: NSRegularExpression.Options = options.contains(.caseInsensitive) ? [.caseInsensitive] : []
        // Whole-string match, not the leftmost match's length: `a|ab` matches "ab".
        guard let regex = try? NSRegularExpression(pattern: "\\A(?:" + pattern + ")\\z", options: flags) else { return nil }
        return RegularExpression(regex: regex)
    }

    func matches(_ s: String) -> Bool {
        regex.firstMatch(in: s, range: NSRange(s.startIndex..., in: s)) != nil
    }
}
