@_exported import Foundation   // so that these shadow Foundation's classes of the same names in expressions too

/// `NSPredicate(format:)` and `NSSortDescriptor(key:ascending:)`, which
/// swift-corelibs-foundation marks unavailable. These classes are
/// UbiquityKit's own, in a module of their own so that UbiquityKit can
/// re-export each by name (`@_exported import class`): a scoped import wins
/// over Foundation's whole-module one, so in a file that imports UbiquityKit
/// the names find these, also where the file imports Foundation too (a class
/// declared in UbiquityKit itself would be ambiguous there), and Apple's code
/// compiles as it is. They are what `NSMetadataQuery` takes; the format is handed to the
/// daemon's query language (docs/SEMANTICS.md, "Metadata query"), which reads
/// Apple's syntax: comparisons (`==`, `!=`, `<`, `>`, `<=`, `>=`, `LIKE`,
/// `BEGINSWITH`, `ENDSWITH`, `CONTAINS`, `MATCHES`, `IN`, `BETWEEN`, with
/// `[c]`/`[d]`), `AND`/`OR`/`NOT`, `ANY`/`ALL`, `TRUEPREDICATE`, and the
/// metadata keys (`kMDItemFSName`, `NSMetadataItemFSNameKey`, …).
///
/// Format arguments: `%K` a key, `%@` a value (a string is quoted, a number
/// or `NSNumber` written as a number, a `Bool` as `TRUE`/`FALSE`, a `Date` as
/// `CAST("…", "NSDate")`, an array as `{…}`), `%d` `%i` `%ld` `%lu` `%u`
/// integers, `%f` `%lf` a double, `%%` a percent sign. Inside quotes nothing
/// is replaced, as with Apple's parser.
open class NSPredicate: NSObject, @unchecked Sendable {
    /// The predicate in the query language, arguments in place.
    public let predicateFormat: String

    public init(format predicateFormat: String, argumentArray arguments: [Any]?) {
        self.predicateFormat = Self.substitute(predicateFormat, arguments ?? [])
        super.init()
    }

    /// Apple's takes `CVarArg...`; on Linux `NSNumber`, arrays and dates are
    /// not `CVarArg`, so any value is taken.
    public convenience init(format predicateFormat: String, _ args: Any...) {
        self.init(format: predicateFormat, argumentArray: args)
    }

    public init(value: Bool) {
        predicateFormat = value ? "TRUEPREDICATE" : "FALSEPREDICATE"
        super.init()
    }

    open override var description: String { predicateFormat }

    open override func isEqual(_ object: Any?) -> Bool {
        (object as? NSPredicate)?.predicateFormat == predicateFormat
    }

    open override var hash: Int { predicateFormat.hashValue }

    static func substitute(_ format: String, _ arguments: [Any]) -> String {
        var out = ""
        var next = 0
        func argument() -> Any? {
            defer { next += 1 }
            return next < arguments.count ? arguments[next] : nil
        }
        var quote: Character?
        var chars = Array(format)
        var i = 0
        while i < chars.count {
            let c = chars[i]
            if let q = quote {
                out.append(c)
                if c == "\\", i + 1 < chars.count { out.append(chars[i + 1]); i += 2; continue }
                if c == q { quote = nil }
                i += 1
                continue
            }
            if c == "'" || c == "\"" { quote = c; out.append(c); i += 1; continue }
            guard c == "%", i + 1 < chars.count else { out.append(c); i += 1; continue }
            // A conversion: flags and length modifiers, then its letter.
            var j = i + 1
            while j < chars.count, "lhqzjt".contains(chars[j]) { j += 1 }
            guard j < chars.count else { out.append(c); i += 1; continue }
            switch chars[j] {
            case "%": out.append("%")
            case "K": out += (argument()).map { "\($0)" } ?? ""
            case "@": out += literal(argument())
            case "d", "i", "u", "D", "U", "x", "o": out += (argument()).map(integerText) ?? "0"
            case "f", "g", "e", "F": out += (argument()).map(doubleText) ?? "0"
            default: out.append(contentsOf: chars[i...j])
            }
            i = j + 1
        }
        chars = []
        return out
    }

    static func integerText(_ value: Any) -> String {
        switch value {
        case let n as any BinaryInteger: return String(describing: n)
        case let n as NSNumber: return n.stringValue
        case let d as Double: return String(Int64(d))
        default: return "\(value)"
        }
    }

    static func doubleText(_ value: Any) -> String {
        switch value {
        case let d as Double: return String(d)
        case let f as Float: return String(Double(f))
        case let n as NSNumber: return String(n.doubleValue)
        case let n as any BinaryInteger: return String(describing: n)
        default: return "\(value)"
        }
    }

    static func literal(_ value: Any?) -> String {
        switch value {
        case nil: return "nil"
        case let s as String: return quoted(s)
        case let s as NSString: return quoted(String(describing: s))
        case let s as Substring: return quoted(String(s))
        case let b as Bool: return b ? "TRUE" : "FALSE"
        case let n as NSNumber where String(cString: n.objCType) == "c": return n.boolValue ? "TRUE" : "FALSE"
        case let n as NSNumber: return n.stringValue
        case let n as any BinaryInteger: return String(describing: n)
        case let d as Double: return String(d)
        case let f as Float: return String(Double(f))
        case let date as Date: return "CAST(\(quoted(ISO8601DateFormatter().string(from: date))), \"NSDate\")"
        case let url as URL: return quoted(url.isFileURL ? url.path : url.absoluteString)
        case let array as [Any]: return "{" + array.map { literal($0) }.joined(separator: ", ") + "}"
        case let some?: return quoted("\(some)")
        }
    }

    package static func quoted(_ s: String) -> String {
        "\"" + s.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
    }
}

/// `AND`, `OR` and `NOT` of predicates.
open class NSCompoundPredicate: NSPredicate, @unchecked Sendable {
    public init(andPredicateWithSubpredicates subpredicates: [NSPredicate]) {
        super.init(format: subpredicates.isEmpty ? "TRUEPREDICATE" : subpredicates.map { "(\($0.predicateFormat))" }.joined(separator: " AND "),
                   argumentArray: nil)
    }

    public init(orPredicateWithSubpredicates subpredicates: [NSPredicate]) {
        super.init(format: subpredicates.isEmpty ? "FALSEPREDICATE" : subpredicates.map { "(\($0.predicateFormat))" }.joined(separator: " OR "),
                   argumentArray: nil)
    }

    public init(notPredicateWithSubpredicate predicate: NSPredicate) {
        super.init(format: "NOT (\(predicate.predicateFormat))", argumentArray: nil)
    }
}

/// A sort key of a metadata query (`NSMetadataQuery.sortDescriptors`).
open class NSSortDescriptor: NSObject, @unchecked Sendable {
    public let key: String?
    public let ascending: Bool

    public init(key: String?, ascending: Bool) {
        self.key = key
        self.ascending = ascending
        super.init()
    }

    open var reversedSortDescriptor: NSSortDescriptor { NSSortDescriptor(key: key, ascending: !ascending) }

    /// The daemon's spelling: `KEY`, or `-KEY` descending.
    package var queryKey: String? { key.map { (ascending ? "" : "-") + $0 } }
}
