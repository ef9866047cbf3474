import Foundation

/// A parsed and compiled metadata query: a predicate and an optional sort order.
///
///     let query = try Query(predicate: "name LIKE[c] '*.md' AND size > 1000", sort: "-size,name")
///     let hits = query.results(items)   // = query.sorted(items.filter(query.matches))
///
/// The language (NSPredicate as `NSMetadataQuery` uses it):
/// - comparisons `ATTRIBUTE OP VALUE` with `==` `=` `!=` `<>` `<` `<=` `=<` `>` `>=` `=>`,
///   `LIKE` (`*` any run, `?` one character; a backslash makes the next pattern character
///   literal, so a literal star is written `'a\\*'`; a string `==`/`!=` with `*` or `?` is
///   the same match, as in Spotlight), `BEGINSWITH`, `ENDSWITH`, `CONTAINS`, `MATCHES` (a
///   whole-string ICU regular expression), `IN {v, …}`, `BETWEEN {low, high}`; `[c]`, `[d]`, `[cd]` after
///   the operator fold case / diacritics (strings only). `VALUE OP ATTRIBUTE` is accepted
///   for `==` `!=` `<` `<=` `>` `>=`.
/// - `AND`/`&&`, `OR`/`||`, `NOT`/`!`, parentheses; NOT binds tighter than AND, AND than OR.
///   `TRUEPREDICATE`, `FALSEPREDICATE`. Keywords are case-insensitive, and so are attribute names.
/// - values: `'…'` or `"…"` with `\\` `\'` `\"` `\n` `\t` `\r` `\0` `\uXXXX` `\u{X…}`;
///   numbers (`-1.5`, `1e6`); `YES`/`NO`/`TRUE`/`FALSE` (booleans also take 1 and 0);
///   `nil`/`NULL`; dates `DATE("2026-01-02")`, `DATE("2026-01-02T03:04:05Z")`,
///   `CAST("…ISO 8601…", "NSDate")`, `CAST(seconds since 1970, "NSDate")`;
///   `NSMetadataUbiquitousItemDownloadingStatusCurrent` / `…Downloaded` / `…NotDownloaded`.
/// - attributes: `Query.attributeNames` and their iCloud / Spotlight aliases (`canonicalName`),
///   and the key paths `path.pathComponents` and `@count` of a collection.
///   Each has a type (string, number, bool, date) checked against operator and value when parsing.
/// - collections (`contentTypeTree`, `path.pathComponents`): `ANY`/`SOME`, `ALL`, `NONE`
///   before the attribute; without one, a comparison holds if it holds for some element
///   (Spotlight), `!=` being the negation of `==`. `value IN collection` is `ANY collection == value`.
public struct Query: Sendable {
    /// One key of the sort order.
    public struct SortKey: Sendable, Hashable {
        /// The short attribute name.
        public var attribute: String
        public var ascending: Bool

        public init(attribute: String, ascending: Bool = true) {
            self.attribute = attribute
            self.ascending = ascending
        }
    }

    /// The predicate as given.
    public let predicate: String
    /// The sort keys, in order; ties are broken by path.
    public let sortKeys: [SortKey]

    let tree: Predicate
    private let matcher: ItemMatcher

    /// Parse, type-check and compile. `sort` is `KEY[,KEY…]`, a leading `-` on a
    /// key sorting descending; keys accept the same names and aliases as predicates.
    public init(predicate: String, sort: String? = nil) throws(QueryError) {
        self.predicate = predicate
        tree = try Parser.parse(predicate)
        matcher = Compiler.compile(tree)
        sortKeys = try sort.map(Self.parseSort) ?? []
    }

    /// The short names of the attributes the predicate reads: an item
    /// holding only these is enough for `matches`.
    public var predicateAttributes: Set<String> {
        func collect(_ p: Predicate, into names: inout Set<String>) {
            switch p {
            case .constant: break
            case .not(let inner): collect(inner, into: &names)
            case .and(let operands), .or(let operands):
                for operand in operands { collect(operand, into: &names) }
            case .comparison(let c): names.insert(c.attribute.name)
            }
        }
        var names = Set<String>()
        collect(tree, into: &names)
        return names
    }

    /// The predicate as a test of any subject: `access` gives, for each short
    /// attribute name the predicate reads (`predicateAttributes`), a function
    /// reading that attribute's value from a subject (nil or `.null`: no value),
    /// asked once per name, here. A subject tests as the `MetadataItem` holding
    /// those values would test with `matches`:
    ///
    ///     let test = query.matcher { name in name == "size" ? { .number(Double($0.size)) } : { _ in nil } }
    public func matcher<Subject>(reading access: (_ attribute: String) -> @Sendable (Subject) -> MetadataValue?)
        -> @Sendable (Subject) -> Bool {
        Compiler.compile(tree, reading: access)
    }

    /// Whether the item satisfies the predicate.
    public func matches(_ item: MetadataItem) -> Bool {
        matcher(item)
    }

    /// The items that match, in sort order.
    public func results(_ items: [MetadataItem]) -> [MetadataItem] {
        sorted(items.filter(matcher))
    }

    /// The predicate in canonical form: short names, `==`-style operators, upper-case
    /// keywords, parentheses around compound operands; it parses to the same query.
    public var normalizedPredicate: String {
        tree.description
    }

    // MARK: Sorting

    static func parseSort(_ text: String) throws(QueryError) -> [SortKey] {
        var keys: [SortKey] = []
        var column = 1
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            defer { column += part.count + 1 }
            let leading = part.prefix { $0.isWhitespace }.count
            var name = part.drop { $0.isWhitespace }
            while let last = name.last, last.isWhitespace { name = name.dropLast() }
            let keyColumn = column + leading
            var ascending = true
            var nameColumn = keyColumn
            if name.first == "-" || name.first == "+" {
                ascending = name.first == "+"
                name = name.dropFirst()
                nameColumn += 1
            }
            guard !name.isEmpty else {
                throw QueryError(.syntax, "expected a sort key", column: nameColumn)
            }
            guard let attribute = Attributes.lookup(String(name)), attribute.keyPath.isEmpty else {
                throw QueryError(.name, "unknown sort key '\(name)'", column: nameColumn)
            }
            guard !attribute.isCollection else {
                throw QueryError(.type, "'\(attribute.name)' is a collection and cannot be a sort key", column: nameColumn)
            }
            keys.append(SortKey(attribute: attribute.name, ascending: ascending))
        }
        return keys
    }

    /// The items in sort order: each key in turn, missing values first when
    /// ascending (last when descending), then by path, then in their given order.
    /// Strings compare by Unicode order (case-sensitive), booleans NO before YES.
    public func sorted(_ items: [MetadataItem]) -> [MetadataItem] {
        sortOrder(items).map { items[$0] }
    }

    /// The positions of `items` in sort order (`sorted`'s order).
    public func sortOrder(_ items: [MetadataItem]) -> [Int] {
        let count = items.count
        guard count > 1 else { return Array(0..<count) }
        // Each key becomes a dense rank per item (one specialised sort per key),
        // so the main sort compares small integers only.
        let width = sortKeys.count
        var table = [Int32](repeating: 0, count: count * width)
        for (column, key) in sortKeys.enumerated() {
            let ranks = Ranking.ranks(items, attribute: Attributes.lookup(key.attribute)!)
            for row in 0..<count {
                table[row * width + column] = key.ascending ? ranks[row] : -ranks[row]
            }
        }
        var order: [Int]
        if width == 1 {
            // One key: sort (rank, index) packed into integers.
            var packed = table.enumerated().map { index, rank in
                UInt64(UInt32(bitPattern: rank) ^ 0x8000_0000) << 32 | UInt64(index)
            }
            packed.sort()
            order = packed.map { Int($0 & 0xFFFF_FFFF) }
        } else {
            order = table.withUnsafeBufferPointer { table in
                Array(0..<count).sorted { a, b in
                    var i = a * width, j = b * width
                    for _ in 0..<width {
                        if table[i] != table[j] { return table[i] < table[j] }
                        i += 1
                        j += 1
                    }
                    return a < b
                }
            }
        }
        // Runs of equal keys are ordered by path: the paths of the items in such
        // runs are ranked together, then each run is sorted by those ranks.
        var runs: [Range<Int>] = []
        table.withUnsafeBufferPointer { table in
            func sameKeys(_ a: Int, _ b: Int) -> Bool {
                for column in 0..<width where table[a * width + column] != table[b * width + column] { return false }
                return true
            }
            var start = 0
            while start < count {
                var end = start + 1
                while end < count && sameKeys(order[start], order[end]) { end += 1 }
                if end - start > 1 { runs.append(start..<end) }
                start = end
            }
        }
        if !runs.isEmpty {
            var members: [Int32] = [], paths = SortStrings()
            for run in runs {
                for index in order[run] {
                    if case .string(let path)? = items[index].values["path"] {
                        members.append(Int32(index))
                        paths.append(path)
                    }
                }
            }
            let pathRanks = paths.denseRanks(for: members, count: count)
            for run in runs {
                order[run].sort { a, b in
                    pathRanks[a] != pathRanks[b] ? pathRanks[a] < pathRanks[b] : a < b
                }
            }
        }
        return order
    }
}

/// Dense ranks of one attribute's values: 0 for no value, 1… in ascending order,
/// equal values sharing a rank.
private enum Ranking {
    static func ranks(_ items: [MetadataItem], attribute: Attribute) -> [Int32] {
        let key = attribute.name
        switch attribute.type {
        case .string:
            var indices: [Int32] = [], strings = SortStrings()
            for (index, item) in items.enumerated() {
                if case .string(let s)? = item.values[key] {
                    indices.append(Int32(index))
                    strings.append(s)
                }
            }
            return strings.denseRanks(for: indices, count: items.count)
        case .number, .date:
            var present: [(Double, Int32)] = []
            present.reserveCapacity(items.count)
            for (index, item) in items.enumerated() {
                switch item.values[key] {
                case .number(let n)? where attribute.type == .number: present.append((n, Int32(index)))
                case .date(let d)? where attribute.type == .date, .number(let d)? where attribute.type == .date:
                    present.append((d, Int32(index)))
                default: break
                }
            }
            return dense(&present, count: items.count)
        case .bool:
            return items.map { item in
                switch item.values[key] {
                case .bool(let b)?: b ? 2 : 1
                case .number(let n)?: n != 0 ? 2 : 1
                default: 0
                }
            }
        }
    }

    private static func dense<T: Comparable>(_ present: inout [(T, Int32)], count: Int) -> [Int32] {
        present.sort { $0.0 < $1.0 }
        var ranks = [Int32](repeating: 0, count: count)
        var rank: Int32 = 0
        for (position, (value, index)) in present.enumerated() {
            if position == 0 || present[position - 1].0 < value { rank += 1 }
            ranks[Int(index)] = rank
        }
        return ranks
    }
}

/// Strings laid out as the UTF-8 of their NFC forms in one buffer, so they sort
/// by plain byte comparison without reference counting. The byte order of NFC
/// UTF-8 is Swift's `String` order (Unicode scalars of the NFC forms), and two
/// strings have the same bytes exactly when they are equal as `String`s.
struct SortStrings {
    private var bytes: [UInt8] = []
    private var starts: [Int] = [0]

    init() {}

    init(_ strings: [String]) {
        for string in strings { append(string) }
    }

    var count: Int { starts.count - 1 }

    mutating func append(_ string: String) {
        var string = string
        let isNFC = string.withUTF8 { utf8 in
            // Scalars below U+0300 are all NFC (UTF-8 lead bytes from 0xCC start U+0300).
            guard utf8.allSatisfy({ $0 < 0xCC }) else { return false }
            bytes.append(contentsOf: utf8)
            return true
        }
        if !isNFC {
            bytes.append(contentsOf: string.precomposedStringWithCanonicalMapping.utf8)
        }
        starts.append(bytes.count)
    }

    /// Positions 0..<count in ascending order of their strings (stable).
    func order() -> [Int32] {
        var positions = (0..<Int32(count)).map { $0 }
        bytes.withUnsafeBufferPointer { bytes in
            starts.withUnsafeBufferPointer { starts in
                positions.sort { Self.compare(bytes, starts, Int($0), Int($1)) < 0 }
            }
        }
        return positions
    }

    /// Dense ranks (1…, equal strings sharing one) stored at `indices[position]`
    /// of an array of `count` zeros.
    func denseRanks(for indices: [Int32], count: Int) -> [Int32] {
        var ranks = [Int32](repeating: 0, count: count)
        let positions = order()
        bytes.withUnsafeBufferPointer { bytes in
            starts.withUnsafeBufferPointer { starts in
                var rank: Int32 = 0
                var previous = -1
                for position in positions.lazy.map(Int.init) {
                    if previous < 0 || Self.compare(bytes, starts, previous, position) != 0 { rank += 1 }
                    ranks[Int(indices[position])] = rank
                    previous = position
                }
            }
        }
        return ranks
    }

    @inline(__always)
    private static func compare(_ bytes: UnsafeBufferPointer<UInt8>, _ starts: UnsafeBufferPointer<Int>, _ i: Int, _ j: Int) -> Int {
        let a = starts[i], b = starts[j]
        let lengthA = starts[i + 1] - a, lengthB = starts[j + 1] - b
        let common = min(lengthA, lengthB)
        if common > 0, let base = bytes.baseAddress {
            let order = memcmp(base + a, base + b, common)
            if order != 0 { return Int(order) }
        }
        return lengthA - lengthB
    }
}
