/// The parsed, type-checked form of a predicate.
///
/// `AND` and `OR` chains are flat lists (two or more operands), so the tree is
/// only as deep as the predicate's parentheses and `NOT`s, which the parser
/// bounds (`Parser.maximumDepth`): a long chain costs no depth, and nothing
/// that walks the tree recurses more than that.
indirect enum Predicate: Equatable, Sendable {
    case constant(Bool)
    case not(Predicate)
    case and([Predicate])
    case or([Predicate])
    case comparison(Comparison)
}

/// A literal value. Dates are seconds since 1970.
enum Literal: Equatable, Hashable, Sendable {
    case string(String)
    case number(Double)
    case bool(Bool)
    case date(Double)
    case null

    /// The attribute type this literal fits, nil for `nil`.
    var type: AttributeType? {
        switch self {
        case .string: .string
        case .number: .number
        case .bool: .bool
        case .date: .date
        case .null: nil
        }
    }
}

enum ComparisonOperator: String, Equatable, Sendable, CaseIterable {
    case equal = "=="
    case notEqual = "!="
    case less = "<"
    case lessOrEqual = "<="
    case greater = ">"
    case greaterOrEqual = ">="
    case like = "LIKE"
    case beginsWith = "BEGINSWITH"
    case endsWith = "ENDSWITH"
    case contains = "CONTAINS"
    case matches = "MATCHES"
    case `in` = "IN"
    case between = "BETWEEN"

    /// `<`, `<=`, `>`, `>=` (and BETWEEN, which is two of them).
    var isOrdering: Bool {
        switch self {
        case .less, .lessOrEqual, .greater, .greaterOrEqual, .between: true
        default: false
        }
    }

    /// The operators that only make sense on strings.
    var isStringOnly: Bool {
        switch self {
        case .like, .beginsWith, .endsWith, .contains, .matches: true
        default: false
        }
    }

    /// The operator with its operands swapped (`5 < size` is `size > 5`).
    var swapped: ComparisonOperator? {
        switch self {
        case .equal, .notEqual: self
        case .less: .greater
        case .lessOrEqual: .greaterOrEqual
        case .greater: .less
        case .greaterOrEqual: .lessOrEqual
        default: nil
        }
    }
}

/// `[c]`, `[d]`, `[cd]`.
struct ComparisonOptions: OptionSet, Equatable, Hashable, Sendable {
    let rawValue: UInt8
    static let caseInsensitive = ComparisonOptions(rawValue: 1)
    static let diacriticInsensitive = ComparisonOptions(rawValue: 2)
}

/// `ANY`/`SOME`, `ALL`, `NONE` before a collection attribute (NSPredicate's
/// aggregate modifiers): the comparison holds for some element, every element
/// (true for an empty collection), or no element.
enum Quantifier: String, Equatable, Sendable {
    case any = "ANY"
    case all = "ALL"
    case noElement = "NONE"
}

/// `attribute OP value`, or `attribute IN {…}` / `attribute BETWEEN {low, high}`;
/// on a collection attribute, with a quantifier or without (then as Spotlight
/// compares multi-valued attributes: `ANY`, but `!=` is `NONE … ==`).
struct Comparison: Equatable, Sendable {
    var attribute: Attribute
    var op: ComparisonOperator
    var options: ComparisonOptions = []
    /// One value for scalar operators, the aggregate's values for IN and BETWEEN.
    var values: [Literal]
    /// Written before the attribute; only on collections.
    var quantifier: Quantifier? = nil

    var value: Literal { values[0] }
}
