/// The one error of the query language: what is wrong and where.
public struct QueryError: Error, CustomStringConvertible, Sendable, Equatable {
    public enum Kind: String, Sendable, Equatable {
        /// The text does not follow the grammar (or a literal is malformed).
        case syntax
        /// Operator, attribute and value do not fit together (`size > 'big'`).
        case type
        /// An attribute or sort key that does not exist.
        case name
    }

    public var kind: Kind
    public var message: String
    /// 1-based column (in characters) in the predicate, or in the sort string
    /// for errors from the sort specification.
    public var column: Int

    public init(_ kind: Kind, _ message: String, column: Int) {
        self.kind = kind
        self.message = message
        self.column = column
    }

    public var description: String {
        let what = switch kind {
        case .syntax: "syntax error"
        case .type: "type error"
        case .name: "name error"
        }
        return "\(what) at column \(column): \(message)"
    }
}
