/// Canonical text of a parsed predicate; parsing it again gives the same tree.
extension Predicate: CustomStringConvertible {
    var description: String {
        switch self {
        case .constant(let value): value ? "TRUEPREDICATE" : "FALSEPREDICATE"
        case .not(let inner): "NOT \(inner.operandDescription)"
        case .and(let operands): operands.map(\.operandDescription).joined(separator: " AND ")
        case .or(let operands): operands.map(\.operandDescription).joined(separator: " OR ")
        case .comparison(let c): c.description
        }
    }

    /// Compound operands in parentheses.
    private var operandDescription: String {
        switch self {
        case .and, .or: "(\(description))"
        default: description
        }
    }
}

extension Comparison: CustomStringConvertible {
    var description: String {
        var modifier = ""
        if !options.isEmpty {
            modifier = "["
            if options.contains(.caseInsensitive) { modifier += "c" }
            if options.contains(.diacriticInsensitive) { modifier += "d" }
            modifier += "]"
        }
        let right = op == .in || op == .between
            ? "{" + values.map(\.description).joined(separator: ", ") + "}"
            : value.description
        let quantified = quantifier.map { "\($0.rawValue) " } ?? ""
        return "\(quantified)\(attribute.spelled) \(op.rawValue)\(modifier) \(right)"
    }
}

extension Literal: CustomStringConvertible {
    var description: String {
        switch self {
        case .string(let s): Self.quote(s)
        case .number(let n): Self.number(n)
        case .bool(let b): b ? "YES" : "NO"
        case .null: "nil"
        case .date(let seconds):
            if let iso = Self.iso8601(seconds) { "DATE(\"\(iso)\")" } else { "CAST(\(Self.number(seconds)), \"NSDate\")" }
        }
    }

    static func number(_ n: Double) -> String {
        if n == n.rounded(), abs(n) < 1e15 { return String(Int64(n)) }
        return "\(n)"
    }

    static func quote(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            case "\r": out += "\\r"
            case "\0": out += "\\0"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    out += "\\u{\(String(scalar.value, radix: 16))}"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }

    /// `YYYY-MM-DDTHH:MM:SSZ` for whole seconds in years 0…9999.
    static func iso8601(_ seconds: Double) -> String? {
        guard seconds == seconds.rounded(), seconds >= -62_167_219_200, seconds < 253_402_300_800 else { return nil }
        let total = Int64(seconds)
        let days = Int(total >= 0 ? total / 86_400 : (total - 86_399) / 86_400)
        let secondOfDay = Int(total - Int64(days) * 86_400)
        // Civil from days (H. Hinnant).
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let mp = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        func pad(_ value: Int, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(year, 4))-\(pad(month, 2))-\(pad(day, 2))T\(pad(secondOfDay / 3600, 2)):\(pad(secondOfDay / 60 % 60, 2)):\(pad(secondOfDay % 60, 2))Z"
    }
}
