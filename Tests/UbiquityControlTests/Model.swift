import Foundation
@testable import UbiquityControl

/// Deterministic random numbers (SplitMix64), so failures reproduce.
struct SeededRandom: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The test's own predicate tree and evaluator: the model the module is checked against.
indirect enum ModelPredicate {
    case constant(Bool)
    case not(ModelPredicate)
    case and(ModelPredicate, ModelPredicate)
    case or(ModelPredicate, ModelPredicate)
    case compare(attribute: String, op: String, caseInsensitive: Bool, diacriticInsensitive: Bool, values: [ModelValue])
}

enum ModelValue {
    case string(String), number(Double), bool(Bool), date(Double), null
}

enum ModelType { case string, number, bool, date }

let modelTypes: [String: ModelType] = [
    "name": .string, "path": .string, "size": .number, "contentType": .string, "isDirectory": .bool,
    "creationDate": .date, "modificationDate": .date, "downloadingStatus": .string, "isDownloading": .bool,
    "percentDownloaded": .number, "isUploaded": .bool, "isUploading": .bool, "percentUploaded": .number,
    "hasUnresolvedConflicts": .bool, "downloadingError": .string, "uploadingError": .string, "pinned": .bool,
]

let modelAliases: [String: [String]] = [
    "name": ["NSMetadataItemFSNameKey", "kMDItemFSName"],
    "path": ["NSMetadataItemPathKey", "kMDItemPath"],
    "size": ["NSMetadataItemFSSizeKey", "kMDItemFSSize"],
    "contentType": ["NSMetadataItemContentTypeKey", "kMDItemContentType"],
    "creationDate": ["NSMetadataItemFSCreationDateKey", "kMDItemFSCreationDate"],
    "modificationDate": ["NSMetadataItemFSContentChangeDateKey", "kMDItemFSContentChangeDate"],
    "downloadingStatus": ["NSMetadataUbiquitousItemDownloadingStatusKey"],
    "isDownloading": ["NSMetadataUbiquitousItemIsDownloadingKey"],
    "percentDownloaded": ["NSMetadataUbiquitousItemPercentDownloadedKey"],
    "isUploaded": ["NSMetadataUbiquitousItemIsUploadedKey"],
    "isUploading": ["NSMetadataUbiquitousItemIsUploadingKey"],
    "percentUploaded": ["NSMetadataUbiquitousItemPercentUploadedKey"],
    "hasUnresolvedConflicts": ["NSMetadataUbiquitousItemHasUnresolvedConflictsKey"],
    "downloadingError": ["NSMetadataUbiquitousItemDownloadingErrorKey"],
    "uploadingError": ["NSMetadataUbiquitousItemUploadingErrorKey"],
]

// MARK: Evaluation

enum Model {
    static func evaluate(_ p: ModelPredicate, _ item: MetadataItem) -> Bool {
        switch p {
        case .constant(let b): return b
        case .not(let inner): return !evaluate(inner, item)
        case .and(let l, let r): return evaluate(l, item) && evaluate(r, item)
        case .or(let l, let r): return evaluate(l, item) || evaluate(r, item)
        case let .compare(attribute, op, ci, di, values):
            return compare(item.values[attribute], modelTypes[attribute]!, op, ci, di, values)
        }
    }

    static func fold(_ s: String, _ ci: Bool, _ di: Bool) -> String {
        var options: String.CompareOptions = []
        if ci { options.insert(.caseInsensitive) }
        if di { options.insert(.diacriticInsensitive) }
        return options.isEmpty ? s : s.folding(options: options, locale: nil)
    }

    /// Plain recursive glob over characters: `*`, `?`, `\` escapes.
    static func like(_ s: [Character], _ p: [Character]) -> Bool {
        guard let first = p.first else { return s.isEmpty }
        if first == "*" {
            return (0...s.count).contains { like(Array(s[$0...]), Array(p.dropFirst())) }
        }
        guard let c = s.first else { return false }
        if first == "?" { return like(Array(s.dropFirst()), Array(p.dropFirst())) }
        var literal = first
        var rest = p.dropFirst()
        if first == "\\", let escaped = rest.first {
            literal = escaped
            rest = rest.dropFirst()
        }
        return c == literal && like(Array(s.dropFirst()), Array(rest))
    }

    static func compare(_ raw: MetadataValue?, _ type: ModelType, _ op: String, _ ci: Bool, _ di: Bool,
                        _ values: [ModelValue]) -> Bool {
        let isNull: Bool
        switch raw {
        case nil, .null?: isNull = true
        default: isNull = false
        }
        if values.count == 1, case .null = values[0], op != "IN", op != "BETWEEN" {
            switch op {
            case "==": return isNull
            case "!=": return !isNull
            default: return false
            }
        }
        if op == "!=" { return !compare(raw, type, "==", ci, di, values) }

        switch type {
        case .string:
            guard case .string(let s)? = raw else { return false }
            let v = fold(s, ci, di)
            let lits = values.map { if case .string(let l) = $0 { fold(l, ci, di) } else { "" } }
            switch op {
            case "==":
                // Spotlight: `==` with `*` or `?` is a wildcard match.
                if lits[0].contains(where: { $0 == "*" || $0 == "?" }) { return like(Array(v), Array(lits[0])) }
                return v == lits[0]
            case "<": return v < lits[0]
            case "<=": return v <= lits[0]
            case ">": return v > lits[0]
            case ">=": return v >= lits[0]
            case "IN": return lits.contains(v)
            case "BETWEEN": return lits[0] <= v && v <= lits[1]
            case "LIKE": return like(Array(v), Array(lits[0]))
            case "BEGINSWITH": return Array(v).starts(with: Array(lits[0]))
            case "ENDSWITH": return Array(v).reversed().starts(with: Array(lits[0]).reversed())
            case "CONTAINS":
                let hay = Array(v), needle = Array(lits[0])
                if needle.isEmpty { return true }
                if needle.count > hay.count { return false }
                return (0...(hay.count - needle.count)).contains { Array(hay[$0..<($0 + needle.count)]) == needle }
            default: fatalError(op)
            }
        case .number, .date:
            let v: Double
            switch (type, raw) {
            case (.number, .number(let n)?): v = n
            case (.date, .date(let d)?), (.date, .number(let d)?): v = d.rounded(.down)
            default: return false
            }
            let lits = values.map { value -> Double in
                switch value {
                case .number(let n): n
                case .date(let d): d.rounded(.down)
                default: .nan
                }
            }
            switch op {
            case "==": return v == lits[0]
            case "<": return v < lits[0]
            case "<=": return v <= lits[0]
            case ">": return v > lits[0]
            case ">=": return v >= lits[0]
            case "IN": return lits.contains(v)
            case "BETWEEN": return lits[0] <= v && v <= lits[1]
            default: fatalError(op)
            }
        case .bool:
            let v: Bool
            switch raw {
            case .bool(let b)?: v = b
            case .number(let n)?: v = n != 0
            default: return false
            }
            let lits = values.map { if case .bool(let b) = $0 { b } else { false } }
            switch op {
            case "==": return v == lits[0]
            case "IN": return lits.contains(v)
            default: fatalError(op)
            }
        }
    }
}

// MARK: Generated items

enum Generated {
    static let stems = ["report", "Résumé", "notes", "IMG_", "café", "data", "Ärger", "x", "README", "naïve",
                        "Photo", "photo", "ÉCOLE", "draft*", "q?a", "Zoë", "backup", "a\\b", "Straße", "日本"]
    static let extensions = [".md", ".txt", ".JPG", ".jpg", ".pdf", "", ".tar.gz", ".MD"]
    static let folders = ["Documents", "Photos", "Ärchive", "Work/Projects", "tmp"]
    static let contentTypes = ["public.plain-text", "public.jpeg", "com.adobe.pdf", "public.folder", "net.daringfireball.markdown"]
    static let statuses = ["current", "downloaded", "notDownloaded"]
    static let baseDate = 1_700_000_000.0

    static func items(count: Int, seed: UInt64) -> [MetadataItem] {
        var rng = SeededRandom(seed: seed)
        return (0..<count).map { index in item(index, &rng) }
    }

    static func item(_ index: Int, _ rng: inout SeededRandom) -> MetadataItem {
        var v: [String: MetadataValue] = [:]
        let name = stems.randomElement(using: &rng)! + (Bool.random(using: &rng) ? String(Int.random(in: 0..<100, using: &rng)) : "")
            + extensions.randomElement(using: &rng)!
        if Int.random(in: 0..<20, using: &rng) != 0 { v["name"] = .string(name) }
        v["path"] = .string("/" + folders.randomElement(using: &rng)! + "/" + name + (index % 7 == 0 ? "" : "~\(index)"))
        switch Int.random(in: 0..<20, using: &rng) {
        case 0: break
        case 1: v["size"] = .null
        case 2: v["size"] = .string("big")  // wrong type: no value
        case 3: v["size"] = .number(Double(Int.random(in: 0..<100, using: &rng)) + 0.5)
        default: v["size"] = .number(Double(Int.random(in: 0..<10_000, using: &rng)))
        }
        if Int.random(in: 0..<10, using: &rng) != 0 { v["contentType"] = .string(contentTypes.randomElement(using: &rng)!) }
        v["isDirectory"] = .bool(Int.random(in: 0..<5, using: &rng) == 0)
        for key in ["isDownloading", "isUploaded", "isUploading", "hasUnresolvedConflicts", "pinned"] {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0: break
            case 1: v[key] = .number(Double(Int.random(in: 0...1, using: &rng)))
            default: v[key] = .bool(Bool.random(using: &rng))
            }
        }
        for key in ["creationDate", "modificationDate"] {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0: break
            case 1: v[key] = .date(baseDate + Double(Int.random(in: 0..<1_000, using: &rng)))  // whole seconds
            default: v[key] = .date(baseDate + Double.random(in: 0..<10_000_000, using: &rng))
            }
        }
        for key in ["percentDownloaded", "percentUploaded"] where Bool.random(using: &rng) {
            v[key] = .number(Double(Int.random(in: 0...4, using: &rng) * 25))
        }
        if Int.random(in: 0..<4, using: &rng) != 0 { v["downloadingStatus"] = .string(statuses.randomElement(using: &rng)!) }
        if Int.random(in: 0..<8, using: &rng) == 0 { v["downloadingError"] = .string("The network connection was lost.") }
        if Int.random(in: 0..<8, using: &rng) == 0 { v["uploadingError"] = .string("Quota exceeded") }
        return MetadataItem(values: v)
    }
}

// MARK: Generated predicates and their text

struct PredicateGenerator {
    var rng: SeededRandom
    let items: [MetadataItem]
    let isoFormatter: ISO8601DateFormatter = {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime]
        return f
    }()

    init(seed: UInt64, items: [MetadataItem]) {
        rng = SeededRandom(seed: seed)
        self.items = items
    }

    mutating func chance(_ n: Int) -> Bool { Int.random(in: 0..<n, using: &rng) == 0 }
    mutating func pick<T>(_ xs: [T]) -> T { xs.randomElement(using: &rng)! }

    /// A random predicate and a text for it (varying spellings, aliases, parentheses).
    mutating func predicate(depth: Int = 0) -> (ModelPredicate, String) {
        let roll = Int.random(in: 0..<10, using: &rng)
        if depth >= 3 || roll < 4 {
            if chance(40) {
                let b = Bool.random(using: &rng)
                return (.constant(b), b ? pick(["TRUEPREDICATE", "truepredicate"]) : "FALSEPREDICATE")
            }
            return comparison()
        }
        if roll < 5 {
            let (inner, text) = predicate(depth: depth + 1)
            return (.not(inner), "\(pick(["NOT ", "not ", "!"]))(\(text))")
        }
        let (l, lt) = predicate(depth: depth + 1)
        let (r, rt) = predicate(depth: depth + 1)
        // Children are parenthesised unless precedence makes it unnecessary, to test precedence too.
        func wrap(_ p: ModelPredicate, _ t: String, under and: Bool) -> String {
            switch p {
            case .or where and: return "(\(t))"
            case .or, .and: return chance(2) ? "(\(t))" : t
            default: return chance(4) ? "(\(t))" : t
            }
        }
        if roll < 8 {
            let rightText: String
            if case .and = r { rightText = "(\(rt))" } else { rightText = wrap(r, rt, under: true) }
            return (.and(l, r), "\(wrap(l, lt, under: true)) \(pick(["AND", "and", "&&"])) \(rightText)")
        }
        let rightText: String
        if case .or = r { rightText = "(\(rt))" } else { rightText = wrap(r, rt, under: false) }
        return (.or(l, r), "\(wrap(l, lt, under: false)) \(pick(["OR", "Or", "||"])) \(rightText)")
    }

    mutating func attributeText(_ name: String) -> String {
        if chance(3), let aliases = modelAliases[name] { return pick(aliases) }
        return name
    }

    mutating func itemValue(_ key: String) -> MetadataValue? {
        for _ in 0..<20 {
            if let v = pick(items).values[key], v != .null { return v }
        }
        return nil
    }

    func quote(_ s: String) -> String {
        let q: Character = s.contains("'") ? "\"" : "'"
        var out = String(q)
        for c in s {
            if c == "\\" || c == q { out.append("\\") }
            out.append(c)
        }
        out.append(q)
        return out
    }

    /// Case and accent variations so that modifiers matter.
    mutating func vary(_ s: String) -> String {
        switch Int.random(in: 0..<5, using: &rng) {
        case 0: return s.uppercased()
        case 1: return s.lowercased()
        case 2: return s.folding(options: .diacriticInsensitive, locale: nil)
        default: return s
        }
    }

    mutating func stringLiteral(_ key: String) -> String {
        if case .string(let s)? = itemValue(key), !chance(5) { return vary(s) }
        return pick(Generated.stems + ["", "zzz", "A", "m"])
    }

    /// A piece of a real value: prefix, suffix or middle.
    mutating func fragment(_ key: String) -> String {
        guard case .string(let s)? = itemValue(key) else { return pick(Generated.stems) }
        let chars = Array(vary(s))
        if chars.isEmpty { return "" }
        let a = Int.random(in: 0..<chars.count, using: &rng)
        let b = Int.random(in: a...min(chars.count, a + 5), using: &rng)
        return String(chars[a..<b])
    }

    /// A LIKE pattern from a real value: some characters become `?`, runs become `*`.
    mutating func likePattern(_ key: String) -> String {
        guard case .string(let s)? = itemValue(key) else { return "*" }
        var out = ""
        var skipping = false
        for c in vary(s) {
            if skipping {
                if chance(3) { skipping = false } else { continue }
            }
            switch Int.random(in: 0..<12, using: &rng) {
            case 0: out += "?"
            case 1:
                out += "*"
                skipping = true
            default:
                if c == "*" || c == "?" || c == "\\" { out += "\\" }
                out.append(c)
            }
        }
        if chance(3) { out = "*" + out }
        if chance(5) { out += "x" }  // usually no match
        return out
    }

    mutating func modifier() -> (String, Bool, Bool) {
        switch Int.random(in: 0..<6, using: &rng) {
        case 0: return ("[c]", true, false)
        case 1: return ("[d]", false, true)
        case 2: return (pick(["[cd]", "[dc]"]), true, true)
        default: return ("", false, false)
        }
    }

    mutating func number(_ key: String) -> Double {
        if case .number(let n)? = itemValue(key), chance(2) { return n }
        if key.hasPrefix("percent") { return Double(Int.random(in: -1...5, using: &rng) * 25) }
        return Double(Int.random(in: -10...10_500, using: &rng)) + (chance(4) ? 0.5 : 0)
    }

    func numberText(_ n: Double) -> String {
        n == n.rounded() ? String(Int(n)) : String(n)
    }

    mutating func date(_ key: String) -> Double {
        if case .date(let d)? = itemValue(key), chance(2) { return d.rounded(.down) }
        return Generated.baseDate + Double(Int.random(in: -100_000...10_100_000, using: &rng))
    }

    mutating func dateText(_ seconds: Double) -> String {
        switch Int.random(in: 0..<4, using: &rng) {
        case 0: return "CAST(\(numberText(seconds)), \"NSDate\")"
        case 1: return "CAST(\"\(isoFormatter.string(from: Date(timeIntervalSince1970: seconds)))\", \"NSDate\")"
        default: return "DATE('\(isoFormatter.string(from: Date(timeIntervalSince1970: seconds)))')"
        }
    }

    mutating func comparison() -> (ModelPredicate, String) {
        let key = pick(Array(modelTypes.keys).sorted())
        let type = modelTypes[key]!
        let name = attributeText(key)
        func make(_ op: String, _ opText: String, _ mod: (String, Bool, Bool), _ values: [ModelValue], _ right: String)
            -> (ModelPredicate, String) {
            (.compare(attribute: key, op: op, caseInsensitive: mod.1, diacriticInsensitive: mod.2, values: values),
             "\(name) \(opText)\(mod.0) \(right)")
        }
        if chance(15) {
            let op = type == .bool ? pick(["==", "!="]) : pick(["==", "!=", "<", ">="])  // booleans are not ordered
            return make(op, op, ("", false, false), [.null], pick(["nil", "NULL"]))
        }
        let none = ("", false, false)
        switch type {
        case .string:
            let mod = modifier()
            switch Int.random(in: 0..<9, using: &rng) {
            case 0:
                let pattern = likePattern(key)
                return make("LIKE", pick(["LIKE", "like"]), mod, [.string(pattern)], quote(pattern))
            case 1:
                let f = fragment(key)
                return make("BEGINSWITH", "BEGINSWITH", mod, [.string(f)], quote(f))
            case 2:
                let f = fragment(key)
                return make("ENDSWITH", "ENDSWITH", mod, [.string(f)], quote(f))
            case 3:
                let f = fragment(key)
                return make("CONTAINS", "CONTAINS", mod, [.string(f)], quote(f))
            case 4:
                let lits = (0..<Int.random(in: 0...4, using: &rng)).map { _ in stringLiteral(key) }
                return make("IN", "IN", mod, lits.map { .string($0) }, "{" + lits.map(quote).joined(separator: ", ") + "}")
            case 5:
                var a = stringLiteral(key), b = stringLiteral(key)
                if b < a { swap(&a, &b) }
                return make("BETWEEN", "BETWEEN", mod, [.string(a), .string(b)], "{\(quote(a)), \(quote(b))}")
            default:
                let (op, opText) = pick([("==", "=="), ("==", "="), ("!=", "!="), ("!=", "<>"), ("<", "<"),
                                         ("<=", "<="), (">", ">"), (">=", ">=")])
                let s = stringLiteral(key)
                return make(op, opText, mod, [.string(s)], quote(s))
            }
        case .number, .date:
            func literal(_ g: inout PredicateGenerator) -> (ModelValue, String) {
                if type == .number {
                    let n = g.number(key)
                    return (.number(n), g.numberText(n))
                }
                let d = g.date(key)
                return (.date(d), g.dateText(d))
            }
            switch Int.random(in: 0..<6, using: &rng) {
            case 0:
                let lits = (0..<Int.random(in: 1...4, using: &rng)).map { _ in literal(&self) }
                return make("IN", "IN", none, lits.map(\.0), "{" + lits.map(\.1).joined(separator: ", ") + "}")
            case 1:
                let a = literal(&self), b = literal(&self)
                return make("BETWEEN", "BETWEEN", none, [a.0, b.0], "{\(a.1), \(b.1)}")
            default:
                let (op, opText) = pick([("==", "=="), ("==", "="), ("!=", "!="), ("<", "<"), ("<=", "<="),
                                         ("<=", "=<"), (">", ">"), (">=", ">=")])
                let lit = literal(&self)
                if chance(5), let swapped = ["==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="][op] {
                    // Value on the left: `5 > size` is `size < 5`.
                    return (.compare(attribute: key, op: op, caseInsensitive: false, diacriticInsensitive: false, values: [lit.0]),
                            "\(lit.1) \(swapped) \(name)")
                }
                return make(op, opText, none, [lit.0], lit.1)
            }
        case .bool:
            let b = Bool.random(using: &rng)
            let text = b ? pick(["YES", "TRUE", "1", "yes"]) : pick(["NO", "FALSE", "0", "false"])
            if chance(5) {
                return make("IN", "IN", none, [.bool(b)], "{\(text)}")
            }
            let (op, opText) = pick([("==", "=="), ("==", "="), ("!=", "!="), ("!=", "<>")])
            return make(op, opText, none, [.bool(b)], text)
        }
    }
}
