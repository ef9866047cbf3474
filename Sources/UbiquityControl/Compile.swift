import Foundation

typealias ItemMatcher = @Sendable (MetadataItem) -> Bool
/// A test of one value: an attribute's, a key path's, or one element of a
/// collection's; nil is no value.
typealias ValueTest = @Sendable (MetadataValue?) -> Bool

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
///
/// Collections (`contentTypeTree`, `path.pathComponents`): the comparison is
/// made on each element. `ANY` holds when it holds for some element, `ALL` for
/// every element (so for none of an empty collection), `NONE` for no element.
/// Without a quantifier a collection compares as Spotlight compares
/// multi-valued attributes: as `ANY`, except that `!=` stays the negation of
/// `==` (`NONE … ==`), and `== nil` / `!= nil` ask whether there is a collection
/// at all. A missing collection has no elements.
///
/// The tree is generic over what it tests: a `MetadataItem` (its values
/// looked up by name), or any subject for which the caller gives, per
/// attribute name, a function reading that attribute's value (chosen once,
/// here, so an item is tested without a dictionary of its values). Every
/// test of a value is the same code whichever the subject.
enum Compiler {
    static func compile(_ predicate: Predicate) -> ItemMatcher {
        compile(predicate) { key in { $0.values[key] } }
    }

    static func compile<Subject>(_ predicate: Predicate,
                                 reading access: (String) -> @Sendable (Subject) -> MetadataValue?) -> @Sendable (Subject) -> Bool {
        switch predicate {
        case .constant(let value):
            return { _ in value }
        case .not(let inner):
            let inner = compile(inner, reading: access)
            return { !inner($0) }
        case .and(let operands):
            let operands = operands.map { compile($0, reading: access) }
            if operands.count == 2 {
                let first = operands[0], second = operands[1]
                return { first($0) && second($0) }
            }
            return { item in operands.allSatisfy { $0(item) } }
        case .or(let operands):
            let operands = operands.map { compile($0, reading: access) }
            if operands.count == 2 {
                let first = operands[0], second = operands[1]
                return { first($0) || second($0) }
            }
            return { item in operands.contains { $0(item) } }
        case .comparison(let comparison):
            return compile(comparison, reading: access)
        }
    }

    static func compile<Subject>(_ c: Comparison,
                                 reading access: (String) -> @Sendable (Subject) -> MetadataValue?) -> @Sendable (Subject) -> Bool {
        let read = access(c.attribute.name)
        let test = c.attribute.isCollection ? collectionTest(c) : valueTest(c)
        guard let derive = derivation(c.attribute.keyPath) else {
            return { test(read($0)) }
        }
        return { test(derive(read($0))) }
    }

    // MARK: Key paths and collections

    /// The value a key path derives from its attribute's, or nil for no key path.
    static func derivation(_ steps: [Attribute.KeyPathStep]) -> (@Sendable (MetadataValue?) -> MetadataValue?)? {
        switch steps {
        case []:
            return nil
        case [.pathComponents, .count]:
            // The depth filter of the iCloud samples, counted without building the list.
            return { value in
                guard case .string(let path)? = value else { return nil }
                return .number(Double(pathComponentCount(path)))
            }
        default:
            return { value in steps.reduce(value) { value, step in apply(step, to: value) } }
        }
    }

    private static func apply(_ step: Attribute.KeyPathStep, to value: MetadataValue?) -> MetadataValue? {
        switch (step, value) {
        case (.pathComponents, .string(let path)?):
            return .list(pathComponents(path).map(MetadataValue.string))
        case (.count, .list(let elements)?):
            return .number(Double(elements.count))
        default:
            return nil
        }
    }

    /// NSString's `pathComponents`: the components between slashes, with a
    /// leading "/" as a component of its own ("/a/b" is "/", "a", "b").
    static func pathComponents(_ path: String) -> [String] {
        (path.hasPrefix("/") ? ["/"] : []) + path.split(separator: "/").map(String.init)
    }

    static func pathComponentCount(_ path: String) -> Int {
        var count = 0
        var inComponent = false
        for byte in path.utf8 {
            if byte == UInt8(ascii: "/") {
                inComponent = false
            } else if !inComponent {
                inComponent = true
                count += 1
            }
        }
        return count + (path.utf8.first == UInt8(ascii: "/") ? 1 : 0)
    }

    /// A comparison on a collection: on its elements, quantified.
    private static func collectionTest(_ c: Comparison) -> ValueTest {
        var onElement = c
        let quantifier: Quantifier
        if let explicit = c.quantifier {
            quantifier = explicit
        } else if c.values == [.null], c.op == .equal || c.op == .notEqual {
            return valueTest(c)  // whether there is a collection at all
        } else if c.op == .notEqual {
            onElement.op = .equal
            quantifier = .noElement
        } else {
            quantifier = .any
        }
        let test = valueTest(onElement)
        switch quantifier {
        case .any:
            return { value in elements(value).contains { test($0) } }
        case .all:
            return { value in elements(value).allSatisfy { test($0) } }
        case .noElement:
            return { value in !elements(value).contains { test($0) } }
        }
    }

    @inline(__always)
    private static func elements(_ value: MetadataValue?) -> [MetadataValue] {
        if case .list(let elements)? = value { return elements }
        return []
    }

    // MARK: Single values

    /// The comparison as a test of one value (the attribute's type, or no value).
    private static func valueTest(_ c: Comparison) -> ValueTest {
        if c.values.count == 1, c.value == .null {
            switch c.op {
            case .equal: return { isNull($0) }
            case .notEqual: return { !isNull($0) }
            default: return { _ in false }
            }
        }
        switch c.attribute.type {
        case .string:
            return stringTest(c)
        case .number:
            let values = c.values.map { if case .number(let n) = $0 { n } else { Double.nan } }
            return ordered(c.op, values) { value -> Double? in
                if case .number(let n)? = value { return n }
                return nil
            }
        case .date:
            let values = c.values.map { if case .date(let d) = $0 { d.rounded(.down) } else { Double.nan } }
            return ordered(c.op, values) { value -> Double? in
                switch value {
                case .date(let d)?, .number(let d)?: d.rounded(.down)
                default: nil
                }
            }
        case .bool:
            let values = c.values.map { if case .bool(let b) = $0 { b } else { false } }
            let extract: @Sendable (MetadataValue?) -> Bool? = { value in
                switch value {
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
                return { value in
                    guard let b = extract(value) else { return false }
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

    private static func stringTest(_ c: Comparison) -> ValueTest {
        let literals = c.values.map { if case .string(let s) = $0 { s } else { "" } }
        // Spotlight's `==` on a string with `*` or `?` is a wildcard match, as LIKE.
        if c.op == .equal || c.op == .notEqual, literals[0].contains(where: { $0 == "*" || $0 == "?" }) {
            let pattern = WildcardPattern(like: literals[0], options: c.options)
            let negate = c.op == .notEqual
            return { value in
                guard case .string(let s)? = value else { return negate }
                return pattern.matches(s) != negate
            }
        }
        if c.op == .matches {
            // Checked by the parser.
            guard let regex = RegularExpression.make(literals[0], options: c.options) else { return { _ in false } }
            let diacritics = StringFolder(options: c.options.intersection(.diacriticInsensitive))
            return { value in
                guard case .string(let s)? = value else { return false }
                return regex.matches(diacritics.fold(s))
            }
        }
        if c.op.isStringOnly {
            let pattern = c.op == .like
                ? WildcardPattern(like: literals[0], options: c.options)
                : WildcardPattern(c.op, literal: literals[0], options: c.options)
            return { value in
                guard case .string(let s)? = value else { return false }
                return pattern.matches(s)
            }
        }
        let folder = StringFolder(options: c.options)
        let folded = literals.map(folder.fold)
        if folder.isIdentity {
            return ordered(c.op, folded) { value -> String? in
                if case .string(let s)? = value { return s }
                return nil
            }
        }
        return ordered(c.op, folded) { value -> String? in
            if case .string(let s)? = value { return folder.fold(s) }
            return nil
        }
    }

    /// ==, !=, <, <=, >, >=, IN and BETWEEN on comparable values.
    private static func ordered<T: Comparable & Hashable & Sendable>(
        _ op: ComparisonOperator, _ values: [T], _ extract: @escaping @Sendable (MetadataValue?) -> T?
    ) -> ValueTest {
        switch op {
        case .equal:
            let value = values[0]
            return { extract($0) == value }
        case .notEqual:
            let value = values[0]
            return { extract($0) != value }
        case .less:
            let value = values[0]
            return { subject in extract(subject).map { $0 < value } ?? false }
        case .lessOrEqual:
            let value = values[0]
            return { subject in extract(subject).map { $0 <= value } ?? false }
        case .greater:
            let value = values[0]
            return { subject in extract(subject).map { $0 > value } ?? false }
        case .greaterOrEqual:
            let value = values[0]
            return { subject in extract(subject).map { $0 >= value } ?? false }
        case .in:
            let set = Set(values)
            return { value in extract(value).map { set.contains($0) } ?? false }
        case .between:
            let low = values[0], high = values[1]
            return { value in extract(value).map { low <= $0 && $0 <= high } ?? false }
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
