import Foundation
import Testing
@testable import UbiquityControl

/// The fast paths must give exactly the answers of the slow, obvious ones.
@Suite struct FastPathTests {
    static let optionSets: [ComparisonOptions] = [.caseInsensitive, .diacriticInsensitive, [.caseInsensitive, .diacriticInsensitive]]

    /// Random text mixing ASCII, Latin letters (ß, İ, ŉ, ſ, ǅ …), CR LF, a few
    /// combining marks and other scripts.
    static func randomStrings(count: Int, seed: UInt64) -> [String] {
        var rng = SeededRandom(seed: seed)
        let extra: [Unicode.Scalar] = ["\u{301}", "\u{308}", "\u{212A}", "\u{3A3}", "\u{3C2}", "\u{65E5}", "\u{1F600}", "\r", "\n", "*", "?"]
        return (0..<count).map { _ in
            var s = String.UnicodeScalarView()
            for _ in 0..<Int.random(in: 0...8, using: &rng) {
                switch Int.random(in: 0..<10, using: &rng) {
                case 0..<4: s.append(Unicode.Scalar(UInt8.random(in: 0x41...0x7A, using: &rng)))
                case 4..<8: s.append(Unicode.Scalar(UInt32.random(in: 0xC0..<0x250, using: &rng))!)
                case 8: s.append(Unicode.Scalar(UInt32.random(in: 0x20..<0x250, using: &rng))!)
                default: s.append(extra.randomElement(using: &rng)!)
                }
            }
            return String(s)
        }
    }

    @Test func latinFoldTableMatchesFoundation() {
        let strings = (0..<StringFolder.latinLimit).map { String(Unicode.Scalar($0)!) }
            + Self.randomStrings(count: 3_000, seed: 1)
            + ["Straße", "İstanbul", "ǅemal", "ŉ", "ſ", "ÀÉÎÕÜ àéîõü", "e\u{301}", "ÆØÅ æøå", "Ĳssel"]
        for options in Self.optionSets {
            let folder = StringFolder(options: options)
            for s in strings {
                let fast = Array(folder.fold(s).unicodeScalars)
                let reference = Array(folder.foundationFold(s).unicodeScalars)
                #expect(fast == reference, "\(options.rawValue) \(Array(s.unicodeScalars))")
            }
        }
    }

    @Test func latinScalarsAreCharactersOfTheirOwn() {
        // No two scalars below U+0250 are canonically equivalent …
        let characters = Set((0..<StringFolder.latinLimit).map { Character(Unicode.Scalar($0)!) })
        #expect(characters.count == Int(StringFolder.latinLimit))
        // … and none joins a neighbour into one character, except CR LF.
        let neighbours: [Unicode.Scalar] = ["a", "\n", "é", "ß", " ", "\u{AD}"]
        for value in 0..<StringFolder.latinLimit where value != 0x0D {
            let scalar = Unicode.Scalar(value)!
            for other in neighbours {
                var before = String.UnicodeScalarView(), after = String.UnicodeScalarView()
                before.append(other)
                before.append(scalar)
                after.append(scalar)
                after.append(other)
                #expect(String(before).count == 2, "\(value)")
                #expect(String(after).count == 2, "\(value)")
            }
        }
    }

    @Test func wildcardPatternMatchesTheModel() {
        var rng = SeededRandom(seed: 2)
        let subjects = Self.randomStrings(count: 400, seed: 3)
        for subject in subjects {
            for _ in 0..<5 {
                // A pattern from the subject: some characters become ? or *, some change case.
                var pattern = ""
                for c in subject {
                    switch Int.random(in: 0..<10, using: &rng) {
                    case 0: pattern += "?"
                    case 1: pattern += "*"
                    case 2: pattern += c.uppercased()
                    case 3: continue
                    default:
                        if c == "*" || c == "?" || c == "\\" { pattern += "\\" }
                        pattern.append(c)
                    }
                }
                for options in [[]] + Self.optionSets {
                    let folder = StringFolder(options: options)
                    let expected = Model.like(Array(folder.foundationFold(subject)), Array(folder.foundationFold(pattern)))
                    let actual = WildcardPattern(like: pattern, options: options).matches(subject)
                    #expect(actual == expected, "\(Array(subject.unicodeScalars)) LIKE[\(options.rawValue)] \(Array(pattern.unicodeScalars))")
                }
            }
        }
    }

    @Test func sortStringsOrderIsSwiftOrder() {
        let strings = Self.randomStrings(count: 2_000, seed: 4)
            + ["é", "e\u{301}", "f", "E", "\u{212A}", "K", "k", "", "ǅ", "Ǆ", "日本", "😀", "a\u{308}\u{301}", "a\u{301}\u{308}"]
        let keys = SortStrings(strings)
        let order = keys.order().map { strings[Int($0)] }
        #expect(order == strings.sorted())
        // Equal strings (canonically) share a rank, different ones do not.
        let ranks = keys.denseRanks(for: strings.indices.map(Int32.init), count: strings.count)
        for _ in 0..<5_000 {
            let i = Int.random(in: 0..<strings.count), j = Int.random(in: 0..<strings.count)
            #expect((ranks[i] == ranks[j]) == (strings[i] == strings[j]))
            #expect((ranks[i] < ranks[j]) == (strings[i] < strings[j]))
        }
        #expect(ranks[strings.firstIndex(of: "é")!] == ranks[strings.firstIndex(of: "e\u{301}")!])
    }

    @Test func iso8601AgreesWithFoundation() {
        let formatter = ISO8601DateFormatter()
        var rng = SeededRandom(seed: 5)
        for _ in 0..<2_000 {
            let seconds = Double(Int64.random(in: -2_000_000_000...4_000_000_000, using: &rng))
            let text = formatter.string(from: Date(timeIntervalSince1970: seconds))
            #expect(ISO8601.parse(text) == seconds, "\(text)")
            #expect(Literal.iso8601(seconds) == text)
        }
        #expect(ISO8601.parse("2026-01-02") == 1_767_312_000)
        #expect(ISO8601.parse("2026-01-02T24:00:00Z") == 1_767_398_400)
        for bad in ["2026-1-02", "2026-01-02T", "2026-01-02T10", "2026-01-02T10:00Z ", "2025-02-29", "2026-01-02T10:60",
                    "2026-01-02T10:00:00+2", "2026-01-02x", "", "20260102", "2026-01-02T10:00:00.Z"] {
            #expect(ISO8601.parse(bad) == nil, "\(bad)")
        }
    }
}
